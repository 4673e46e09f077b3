"""The gold solutions: valid submissions for their problems (CPU), and passing the harness (gpu)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from harness.evaluation.problem_module import load_problem
from harness.evaluation.protocol import ProblemLoad
from harness.problems import get_registry
from harness.problems.spec import model_init_arg_names
from harness.submission import extract
from harness.verdicts import Verdict

from ..conftest import evaluates

ROOT = Path(__file__).parents[2] / "reference_solutions"
SPECS = get_registry().all()


FULL_SIZE = {"size": "default", "compile_baseline": "off"}


def solution(spec) -> Path:
    (path,) = ROOT.glob(f"level2_{spec.kernelbench_id.split('/')[1]}_*.py")
    return path


def tensor_core_solution(spec) -> Path:
    (path,) = (ROOT / "tensor_cores").glob(f"level2_{spec.kernelbench_id.split('/')[1]}_*.py")
    return path


def _init_signature(source: str, cls: str) -> list[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            init = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
            args = init.args.posonlyargs + init.args.args
            defaults = [ast.unparse(d) for d in init.args.defaults]
            return [a.arg for a in args] + defaults
    raise AssertionError(f"no class {cls}")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernelbench_id)
def test_solution_is_a_valid_submission_with_the_reference_constructor(spec):
    text = solution(spec).read_text()
    sub = extract(text)
    assert not sub.from_reply
    assert _init_signature(sub.source, "ModelNew") == _init_signature(spec.source(), "Model")
    assert "cuda_sources" in sub.source and "load_inline" in sub.source
    assert "allow_tf32" not in sub.source and "set_float32_matmul_precision" not in sub.source
    assert model_init_arg_names(spec.source())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernelbench_id)
def test_solution_state_dict_matches_the_reference_names_shapes_and_seeded_values(spec):
    """Imported with load_inline stubbed (no CUDA here): ModelNew must hold the reference's parameters."""
    problem = load_problem(ProblemLoad(path=spec.source_path, overrides=spec.size("small").overrides))
    init = problem.get_init_inputs()
    name = f"_gold_{spec.kernelbench_id.replace('/', '_')}"
    module_spec = importlib.util.spec_from_file_location(name, solution(spec))
    module = importlib.util.module_from_spec(module_spec)
    with mock.patch("torch.utils.cpp_extension.load_inline", return_value=mock.MagicMock()):
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    torch.manual_seed(42)
    ref = problem.Model(*init).state_dict()
    torch.manual_seed(42)
    gold = module.ModelNew(*init).state_dict()
    assert list(gold) == list(ref)
    for key in ref:
        assert gold[key].shape == ref[key].shape and gold[key].dtype == ref[key].dtype
        assert torch.equal(gold[key], ref[key]), f"{key}: seeded initialisation differs"


@pytest.mark.gpu
@pytest.mark.alone
@evaluates(lambda spec: (spec, solution(spec).read_text(), FULL_SIZE))
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernelbench_id)
def test_solution_passes_the_harness_at_full_size(spec, evaluated):
    r = evaluated
    print(f"\n[gpu] {spec.kernelbench_id} {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message + "\n" + r.log_excerpt
    assert not r.flags, r.flags
    assert r.observations.kernels is not None and r.observations.kernels.custom, r.observations.kernels  # its own


@pytest.mark.gpu
@pytest.mark.alone
@evaluates(lambda spec: (spec, tensor_core_solution(spec).read_text(), FULL_SIZE))
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kernelbench_id)
def test_tensor_core_solution_passes_at_full_size_at_fp32_error_and_1_8x_eager(spec, evaluated):
    """The 3xTF32 solutions (reference_solutions/tensor_cores/): passed unflagged at 1e-4, error against float64 at
    most twice the fp32 reference's own (precision kept, not traded), at least 1.8x eager (issue 19's targets)."""
    r = evaluated
    print(f"\n[gpu] tensor cores {spec.kernelbench_id} {r.verdict.value}: {r.message}")
    assert r.verdict == Verdict.passed, r.message + "\n" + r.log_excerpt
    assert not r.flags, r.flags
    figs = [o for t in r.observations.trials for o in t.outputs]
    cand = max(o.err_vs_fp64 or 0.0 for o in figs)
    ref = max(o.ref_err_vs_fp64 or 0.0 for o in figs)
    assert ref > 0 and cand <= 2 * ref, (cand, ref)
    assert r.speedup_vs_eager is not None and r.speedup_vs_eager >= 1.8, r.speedup_vs_eager
