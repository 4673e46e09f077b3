"""Choosing a reduced size by building candidates (harness/evaluation/size_probe.py), in process."""

from __future__ import annotations

from pathlib import Path

from harness.evaluation.size_probe import Estimate, search, size_problem
from harness.problems.sizes import SizeSpace

GROUPED = """
batch_size = 8
channels = 64
groups = 16
height = width = 64
"""


def test_a_halving_that_breaks_the_problem_is_undone_and_that_size_left_alone():
    """channels must stay divisible by groups: 16 -> 8 fails to build, so channels stops at 16 while the
    other sizes go on shrinking."""
    space = SizeSpace(GROUPED)

    def price(overrides: dict) -> Estimate:
        values = {"batch_size": 8, "channels": 64, "height": 64, "width": 64, **overrides}
        if values["channels"] % 16:
            return Estimate(False, error="channels not divisible by groups")
        return Estimate(True, float(values["batch_size"] * values["channels"] * values["height"] * values["width"]))

    found = search(space, price, budget_s=1.0)
    assert found.choice == {"batch_size": 1, "channels": 16, "height": 8, "width": 8}
    refused = [s["try"] for s in found.steps if not s["ok"]]
    assert refused == ["channels=8", "channels=8 height=8 width=8"]  # alone, then with the sizes equal to it


def test_sizes_that_must_stay_equal_are_halved_together_when_one_alone_fails():
    space = SizeSpace("batch_size = 64\nrow = 64\n")  # the batch broadcasts against a row of its own length

    def price(overrides: dict) -> Estimate:
        values = {"batch_size": 64, "row": 64, **overrides}
        ok = values["batch_size"] == values["row"]
        return Estimate(ok, float(values["batch_size"] * values["row"]), error="" if ok else "broadcast")

    found = search(space, price, budget_s=100.0)
    assert found.choice == {"batch_size": 8, "row": 8}


RELU = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

batch_size = {batch}
dim = {dim}

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return []
"""


def test_a_large_problem_is_reduced_on_the_meta_device_and_then_measured(tmp_path: Path):
    """At its own size this problem's input is 1 GiB: it is never allocated; the reduced one is run."""
    path = tmp_path / "19_ReLU.py"
    path.write_text(RELU.format(batch=4096, dim=65536))
    sized = size_problem(path, "cpu", budget_s=0.005, time_limit_s=120)
    assert sized["ok"], sized
    assert sized["overrides"]["batch_size"] < 4096
    assert sized["steps"][0] == {**sized["steps"][0], "try": "default", "ok": True, "method": "meta"}
    assert sized["steps"][0]["cost_s"] > 0.005 and sized["forward_s"] > 0


def test_a_problem_within_budget_keeps_its_own_size(tmp_path: Path):
    path = tmp_path / "19_ReLU.py"
    path.write_text(RELU.format(batch=16, dim=256))
    sized = size_problem(path, "cpu", budget_s=0.05, time_limit_s=60)
    assert sized["ok"] and sized["overrides"] == {} and sized["size"] == "default"


def test_a_forward_of_many_small_operations_is_priced_by_running_it(tmp_path: Path):
    """Tracing thousands of operations on the meta device costs more than running them."""
    path = tmp_path / "1_Loop.py"
    path.write_text(RELU.replace("return torch.relu(x)", "for _ in range(3000):\n            x = x + 1\n"
                                 "        return x").format(batch=16, dim=64))
    sized = size_problem(path, "cpu", budget_s=1.0, time_limit_s=60)
    assert sized["ok"] and sized["steps"][0]["method"] == "measured"


FIXED_IMAGE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.rate = torch.linspace(0, 1, 4)[1].item()  # a value read at construction: no meta device here

    def forward(self, x):
        return torch.relu(x) * self.rate

batch_size = {batch}

def get_inputs():
    return [torch.randn(batch_size, {row})]  # the row length is fixed here, not a module constant

def get_init_inputs():
    return []
"""


def test_a_constructor_the_meta_device_cannot_run_is_built_for_real_and_the_size_measured(tmp_path: Path):
    path = tmp_path / "1_Fixed.py"
    path.write_text(FIXED_IMAGE.format(batch=64, row=4096))
    sized = size_problem(path, "cpu", budget_s=1e-7, time_limit_s=60)
    assert sized["ok"], sized
    assert sized["priced_on"] == "input-bound" and sized["overrides"] == {"batch_size": 1}
    assert sized["forward_s"] > 1e-7  # over budget, but batch 1 is as small as this problem gets: it runs


def test_a_problem_too_large_to_run_even_at_its_smallest_is_refused_not_run(tmp_path: Path):
    """1 << 38 floats (1 TiB) per row: the meta device prices it, nothing is allocated."""
    path = tmp_path / "1_Huge.py"
    path.write_text(FIXED_IMAGE.format(batch=4, row=1 << 38).replace(
        "torch.linspace(0, 1, 4)[1].item()", "0.5"))
    sized = size_problem(path, "cpu", budget_s=0.01, time_limit_s=60)
    assert not sized["ok"] and "over a quarter of the memory available" in sized["error"]
    assert "batch_size=1" in sized["error"]


def test_a_problem_importing_a_missing_module_says_to_install_it(tmp_path: Path):
    path = tmp_path / "48_Mamba.py"
    path.write_text("import no_such_module_here\n" + RELU.format(batch=4, dim=8))
    sized = size_problem(path, "cpu", budget_s=0.01, time_limit_s=60)
    assert not sized["ok"] and "No module named 'no_such_module_here'" in sized["error"]
    assert sized["error"].endswith("imports a module this environment lacks: install it")
