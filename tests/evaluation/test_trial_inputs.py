"""A trial's inputs in the processes' own hands: the extra distribution's redraw (problem_module.redistribute) and
the candidate's mutation check (child.checked_call), in process, without a sandbox."""

from __future__ import annotations

import weakref

import torch

from harness.evaluation import problem_module
from harness.evaluation.child import checked_call


def test_the_extra_distribution_redraws_each_floating_input_in_its_place():
    torch.manual_seed(0)
    x, idx = torch.rand(1000), torch.arange(4)
    kept = x.clone()
    inputs = [x, idx, 3]
    out = problem_module.redistribute(inputs)
    assert out is inputs and out[1] is idx and out[2] == 3
    assert out[0].shape == x.shape and out[0].dtype == x.dtype and out[0] is not x
    assert out[0].min() < 0 and out[0].max() > 1  # randn*2+0.5: negative and above 1, unlike rand's [0, 1)
    assert abs(float(out[0].mean()) - 0.5) < 0.3 and abs(float(out[0].std()) - 2) < 0.3
    assert torch.equal(x, kept)  # the tensor get_inputs() returned is not written


def test_the_extra_distribution_lets_each_input_go_before_its_draw(monkeypatch):
    """Held by the list alone, an input is let go before its draw is made: one input's size beside the others at most
    (level1/45's 16 GiB input held three times its size as a new list of randn * 2 + 0.5)."""
    inputs = [torch.rand(64), torch.rand(32)]
    refs = [weakref.ref(t) for t in inputs]
    alive_at_draw: list[list[bool]] = []
    real = torch.randn

    def randn(*args, **kwargs):
        alive_at_draw.append([r() is not None for r in refs])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "randn", randn)
    problem_module.redistribute(inputs)
    assert alive_at_draw == [[False, True], [False, False]]


class _Writes(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


class _Reads(torch.nn.Module):
    def forward(self, x):
        return x + 1


def test_the_mutation_check_compares_the_callers_copy_with_the_originals_it_came_from():
    """On CUDA the candidate calls forward on its clone of the segment's inputs and compares the clone with the
    segment after the call (one copy of the inputs, not two); without originals it makes its own copy first."""
    device = torch.device("cpu")
    for model, want in ((_Writes(), [0]), (_Reads(), [])):
        original = torch.rand(16)
        inputs = [original.clone()]
        _out, changed, mutated = checked_call(model, inputs, device, 0, originals=[original])
        assert mutated == want and not changed
        _out, changed, mutated = checked_call(model, [original.clone()], device, 0)
        assert mutated == want and not changed
