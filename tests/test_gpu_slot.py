"""The gpu tests' slot (tests/conftest.py `GpuSlot`), on the CPU: the next test's candidate process, started ahead
from its declared evaluation, is the one its evaluation takes."""

from __future__ import annotations

import types

from harness.problems import get_registry
from harness.verdicts import Verdict

from .conftest import SUBMISSIONS, GpuSlot, evaluates, planned_evaluation

SPEC = get_registry().get("level2/75")
TEXT = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()


@evaluates(lambda n: (SPEC, f"{TEXT}\n# evaluation {n}\n", {"size": "small"}))
def _planned(n):
    raise AssertionError("never run: its plan is read")


def _item(n: int, gpu: bool = True):
    return types.SimpleNamespace(function=_planned, callspec=types.SimpleNamespace(params={"n": n}),
                                 keywords={"gpu": True} if gpu else {})


def test_the_next_tests_candidate_starts_ahead_and_its_evaluation_takes_it(settings):
    slot = GpuSlot(settings, device="cpu")
    try:
        first = _evaluate(slot, _item(1))
        assert first.verdict == Verdict.passed and not first.observations.candidate_ahead, first.message
        assert not slot.start_ahead(_item(2, gpu=False))  # not a gpu test: nothing is started for it
        assert not slot.start_ahead(None)  # the last test
        assert slot.start_ahead(_item(2))
        second = _evaluate(slot, _item(2))
        assert second.verdict == Verdict.passed, second.message
        assert second.observations.candidate_ahead and second.observations.trusted_warm
    finally:
        slot.close()


def _evaluate(slot: GpuSlot, item):
    spec, text, options = planned_evaluation(item)
    return slot.evaluate(spec, text, **options)
