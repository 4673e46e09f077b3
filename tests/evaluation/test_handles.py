"""The parent's handle on the candidate's process, with a fake process: what it records the moment the candidate
reports an error."""

from __future__ import annotations

import contextlib
import time

import pytest

from harness.evaluation import gpu_sharing
from harness.evaluation.handles import Candidate, CandidateStopped
from harness.evaluation.protocol import RunTrial
from harness.grading import grade
from harness.sandbox.process import Message
from harness.schema import MemoryPlan, Observations, Tolerance
from harness.verdicts import Phase, Verdict

GIB = 1 << 30
TRUSTED, CANDIDATE = [100], [200]


class FakeProcess:
    """The candidate's process as the handle drives it: it answers the next command with `error`, and its memory on
    the GPU is `held` until the parent's 'exit' (as child.run keeps it)."""

    def __init__(self, error: dict[str, str], held: int, gpu: dict[str, int]):
        self.error, self.held, self.gpu = error, held, gpu
        self.sent: list[str] = []

    def resume(self) -> None:
        pass

    def send(self, text: str) -> None:
        self.sent.append(text)
        if text == "exit":
            self.gpu["free"] += self.held
            self.held = 0

    def next_message(self, deadline: float) -> Message:
        return Message("error", {"phase": "correctness", **self.error}, time.monotonic())

    def processes(self) -> list[int]:
        return CANDIDATE


def _run_trial(proc: FakeProcess, gpu: dict[str, int]) -> Observations:
    obs = Observations()
    candidate = Candidate(proc, obs, builds=None, release_build=contextlib.ExitStack(), kill_grace_s=1.0)  # type: ignore[arg-type]

    def memories() -> list[gpu_sharing.DeviceMemory]:
        return [gpu_sharing.DeviceMemory(total=80 * GIB, free=gpu["free"],
                                         used={100: gpu["trusted"], **({200: proc.held} if proc.held else {})})]

    candidate.device_memory = lambda: gpu_sharing.memory_at_failure(memories, TRUSTED, candidate.processes())
    with pytest.raises(CandidateStopped):
        candidate.request(RunTrial(trial=0, forward_seed=1, inputs={}), 5.0, Phase.correctness)
    assert proc.sent[-1] == "exit"  # after NVML was read: the process let go of its memory only then
    return obs


OOM = {"exc_type": "OutOfMemoryError",
       "message": "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
                  "1.77 GiB is free. Including non-PyTorch memory, this process has 12.69 GiB memory in use."}
PLAN = MemoryPlan(fits=True, message="fits", budget_bytes=70 * GIB, total_bytes=80 * GIB, reserve_bytes=2 * GIB,
                  phases_bytes={"candidate_trials": 22 * GIB, "trusted_prepare": 40 * GIB})


def test_a_candidates_out_of_memory_error_records_the_gpus_memory_while_it_still_holds_its_own():
    gpu = {"free": 2 * GIB, "trusted": 64 * GIB}
    obs = _run_trial(FakeProcess(OOM, held=13 * GIB, gpu=gpu), gpu)
    seen = obs.gpu_memory_at_failure
    assert seen is not None and seen.unknown is None
    assert (seen.candidate_bytes, seen.trusted_bytes, seen.free_bytes) == (13 * GIB, 64 * GIB, 2 * GIB)
    obs.memory_plan = PLAN
    assert grade(obs, Tolerance(atol=1e-4, rtol=1e-4)).verdict == Verdict.infra_error


def test_a_genuine_out_of_memory_far_beyond_its_share_stays_the_submissions():
    """The honest twin: a submission that allocated 60 GiB of the device against its 24 GiB share."""
    gpu = {"free": 1 * GIB, "trusted": 15 * GIB}
    error = {"exc_type": "OutOfMemoryError",
             "message": "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.18 GiB of "
                        "which 1.00 GiB is free. Including non-PyTorch memory, this process has 60.00 GiB memory "
                        "in use."}
    obs = _run_trial(FakeProcess(error, held=60 * GIB, gpu=gpu), gpu)
    assert obs.gpu_memory_at_failure is not None and obs.gpu_memory_at_failure.candidate_bytes == 60 * GIB
    obs.memory_plan = PLAN
    g = grade(obs, Tolerance(atol=1e-4, rtol=1e-4))
    assert g.verdict == Verdict.runtime_error and "OutOfMemoryError" in g.message


def test_an_error_that_is_not_out_of_memory_reads_nothing_from_nvml():
    gpu = {"free": 2 * GIB, "trusted": 64 * GIB}
    obs = _run_trial(FakeProcess({"exc_type": "IndexError", "message": "index 7 is out of bounds"}, held=GIB, gpu=gpu),
                     gpu)
    assert obs.candidate_error is not None and obs.gpu_memory_at_failure is None
