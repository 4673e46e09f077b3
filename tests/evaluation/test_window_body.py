"""The body of a timed window (timing.run_window), in this process: what both sides run inside their windows."""

from __future__ import annotations

import gc
import types

import torch

from harness.evaluation import timing


def _problem() -> types.ModuleType:
    module = types.ModuleType("problem")
    module.get_inputs = lambda: [torch.ones(4)]  # type: ignore[attr-defined]
    return module


def test_a_window_runs_its_calls_with_the_collector_off_and_gives_it_back_as_it_was():
    """A process that holds many objects pays for each collection a call's garbage sets off: the trusted process
    holds far more than the candidate's, so collections inside windows would slow the reference, not the
    candidate. 200,000 objects held and cycles made in every call: no collection runs inside the window, and the
    collector is on again after it (off again where it was off)."""
    held = [{"i": i} for i in range(200_000)]
    seen: list[tuple[bool, int]] = []

    def call(x: torch.Tensor) -> torch.Tensor:
        seen.append((gc.isenabled(), gc.get_stats()[0]["collections"]))
        for _ in range(2_000):  # cycles, as a forward's autograd-free graph of Python objects can leave
            a: list = []
            a.append(a)
        return x + 1

    problem = _problem()
    collections = gc.get_stats()[0]["collections"]
    timing.run_window(call, problem, [1, 2, 3], [4, 5, 6], torch.device("cpu"), None)
    assert seen == [(False, collections)] * 3
    assert gc.isenabled()
    gc.disable()
    try:
        timing.run_window(call, problem, [1], [4], torch.device("cpu"), None)
        assert not gc.isenabled()
    finally:
        gc.enable()
    del held
