"""Reduced sizes proposed from a KernelBench file's module constants (harness/problems/sizes.py)."""

from __future__ import annotations

from harness.problems.sizes import SizeSpace, describe, read_constants
from harness.problems.spec import module_constants

CONV = """
import torch
batch_size = 128
in_channels = 64
out_channels = 128
height = width = 256
depth, length = 16, 4096
kernel_size = 3
groups = 8
num_heads = 32
bias_shape = (out_channels, 1, 1)
layer_sizes = [1024, 1024, 4]
dim = 1
"""


def test_chained_and_tuple_assignments_are_constants_too():
    """KernelBench writes `height = width = 256` and `depth, height, width = 16, 32, 32`; both name sizes."""
    consts = module_constants(CONV)
    assert consts["height"] == consts["width"] == "256"
    assert (consts["depth"], consts["length"]) == ("16", "4096")
    assert [c.name for c in read_constants("a, b = f()\nc = d = 2\n")] == ["c", "d"]  # unpacking a call: unknown


def test_sizes_are_halvable_and_structure_is_not():
    space = SizeSpace(CONV)
    keys = {s.key for s in space.slots}
    assert {"batch_size", "in_channels", "out_channels", "height", "width", "depth", "length",
            "layer_sizes[0]", "layer_sizes[1]"} == keys
    # kernel_size, groups and num_heads shape the computation; dim=1 is an axis; layer_sizes[2]=4 is small;
    # bias_shape is computed from out_channels, not a size of its own.


def test_a_derived_constant_is_recomputed_from_the_new_value():
    space = SizeSpace(CONV)
    assert space.overrides({"out_channels": 32}) == {"out_channels": 32, "bias_shape": (32, 1, 1)}
    assert space.overrides({"layer_sizes[1]": 512}) == {"layer_sizes": [1024, 512, 4]}
    assert space.overrides({}) == {}
    assert describe(space.overrides({"out_channels": 32})) == "out_channels=32 bias_shape=(32,1,1)"
    assert describe({}) == "default"


def test_a_constant_read_by_an_unevaluated_expression_is_left_alone():
    """`embed = make(dim)` cannot be recomputed here, so `dim` must keep the value `embed` was built from."""
    space = SizeSpace("dim = 512\nembed = make(dim)\nbatch_size = 64\nother = 256\n")
    assert {s.key for s in space.slots} == {"batch_size", "other"}


def test_batch_is_halved_first_then_the_largest_size_down_to_a_floor():
    space = SizeSpace("batch_size = 4\nsmall = 16\nbig = 4096\n")
    choice: dict[str, int] = {}
    order = []
    while (key := space.next_halving(choice, set())) is not None:
        current = choice.get(key, next(s.value for s in space.slots if s.key == key))
        choice[key] = current // 2
        order.append(key)
    assert order[:2] == ["batch_size", "batch_size"] and choice["batch_size"] == 1
    assert order[2] == "big" and choice["small"] == 8 and choice["big"] == 8  # sizes stop at 8, a batch at 1
    assert space.next_halving({}, {"batch_size"}) == "big"  # a frozen size (its halving did not build) is skipped
