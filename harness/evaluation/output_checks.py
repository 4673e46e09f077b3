"""The checks of what the timed windows computed, driven from the parent (rounds.py): no torch.

Once a window of the candidate's closes, the parent draws a key and the candidate's process fingerprints every output
of the window under it, on the parent's clock; the trusted side fingerprints eager's outputs of the same seeds under
the same key (or eager's own process does, as the candidate's does), which is what an honest fingerprint costs and
what the candidate's must come to (windows.fingerprint_mismatches). What the candidate's took beyond that is work
its window left undone: rounds.py charges it to the window. Where the parent so draws, picked calls of the window are
handed over whole and compared element by element by the trusted side, at once or, while their bytes stay within
windows.HANDOVER_BYTES, after the timed rounds (`compare`, then `compared`), beside the candidate's trace and exit.
Figures go into the round's `TimedOutputCheck`; the hand-overs' findings into the observations' one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import grading
from harness.evaluation import windows
from harness.evaluation.eager_process import EagerProcess
from harness.evaluation.handles import Candidate, Trusted, add_trusted_seconds
from harness.evaluation.protocol import (
    CheckHandoverCommand,
    Fingerprint,
    FingerprintCommand,
    Handover,
    JudgeHandoversCommand,
    Scales,
)
from harness.schema import Observations, TimedOutputCheck, Tolerance, TrialFigures
from harness.verdicts import Phase

Fingerprints = list[list[float | None]]


class OutputChecks:
    """The fingerprints and hand-overs of one evaluation's timed windows, checked at `tolerance`; each call's outputs
    are `output_bytes`. `deadline(calls, write_bytes)` is a candidate command's time limit."""

    def __init__(self, trusted: Trusted, candidate: Candidate, obs: Observations, tolerance: Tolerance,
                 output_bytes: int, deadline: Callable[[int, int], float]):
        self.trusted, self.candidate, self.obs = trusted, candidate, obs
        self.tolerance, self.output_bytes, self.deadline = tolerance, output_bytes, deadline
        self.deferred: list[int] = []  # the timed calls handed over, read and not yet compared (numbered)
        self.comparing = False  # the trusted side is comparing them (`compared` collects its answer)

    def candidate_fingerprints(self, key: int, limit_s: float, check: TimedOutputCheck) -> Fingerprints:
        """The candidate fingerprints the outputs of the window just closed under `key` (on the parent's clock: what
        it takes beyond the trusted side's fingerprints of the same outputs is charged to the window)."""
        reply = self.candidate.request(Fingerprint(key=key), limit_s, Phase.timing)
        check.fingerprint_ms.append(round((reply.received_at - self.candidate.sent_at) * 1e3, 4))
        # The host's round trip at this moment, taken off the fingerprint's time (a loaded host wakes both late),
        # with the candidate stopped: nothing it starts after its reply delays the trusted side's wake-up.
        self.candidate.pause()
        latency_ms, _ = self.trusted.timed_call({"cmd": "ping"}, "pong")
        check.fingerprint_latency_ms.append(round(latency_ms, 4))
        return list(reply.fields["sums"])

    def trusted_fingerprints(self, key: int, check: TimedOutputCheck) -> tuple[Fingerprints, Fingerprints]:
        """The trusted side fingerprints eager's outputs of the same seeds under the same key: what an honest
        fingerprint costs (its own clock's fingerprint step) and what it must come to."""
        tol = self.tolerance
        wall_ms, done = self.trusted.timed_call(FingerprintCommand(key=key, atol=tol.atol, rtol=tol.rtol)
                                                .model_dump(mode="json"), "fingerprinted")
        add_trusted_seconds(self.obs, "fingerprint", done)
        check.reference_fingerprint_ms.append(round(wall_ms - 1e3 * float(done["seconds"].get("scales", 0.0)), 4))
        check.reference_fingerprint_own_ms.append(round(1e3 * float(done["seconds"]["fingerprint"]), 4))
        return list(done["sums"]), list(done["scales"])

    def eager_fingerprints(self, eager: EagerProcess, key: int, limit_s: float, check: TimedOutputCheck
                           ) -> tuple[Fingerprints, Fingerprints]:
        """Eager's own process `eager` fingerprints its window's outputs under `key` as the candidate does, and gives
        their scales: what it took on the parent's clock, less the host's round trip right after it (credited as the
        candidate's is), is what an honest fingerprint costs."""
        tol = self.tolerance
        assert check.handover_slack_ms is not None
        reply = eager.request(Fingerprint(key=key), limit_s)
        wall_ms = (reply.received_at - eager.sent_at) * 1e3
        scales = eager.request(Scales(atol=tol.atol, rtol=tol.rtol), limit_s).fields["scales"]
        eager.pause()
        latency_ms, _ = self.trusted.timed_call({"cmd": "ping"}, "pong")
        credit = grading.HANDOVER_LATENCY_CREDIT * check.handover_slack_ms
        check.reference_fingerprint_ms.append(round(wall_ms, 4))
        check.reference_fingerprint_own_ms.append(round(max(wall_ms - min(latency_ms, credit), 0.0), 4))
        return list(reply.fields["sums"]), list(scales)

    def handover(self, window: int, seeds: list[int], forward_seeds: list[int], picks: list[int],
                 check: TimedOutputCheck) -> None:
        """The calls `picks` of the window just closed (the parent's draw, made once it closed): the candidate hands
        their outputs over as it kept them (their time on the parent's clock is a diagnostic: the fingerprints before
        it needed every output, so nothing is left to compute, and what they took beyond the trusted side's is
        charged to the window); the trusted side judges them element by element on the same seeds."""
        calls, output_bytes, tol = len(seeds), self.output_bytes, self.tolerance
        check.expected += len(picks)
        reply = self.candidate.request(Handover(window=window, picks=picks),
                                       self.deadline(calls, len(picks) * output_bytes), Phase.timing)
        check.handover_ms.append(round((reply.received_at - self.candidate.sent_at) * 1e3, 4))
        self.candidate.pause()  # read by the trusted side as handed over, not as rewritten since
        said = reply.fields["layouts"]  # the candidate's: one per pick, or it reported fewer
        layouts = [said[k] if k < len(said) else None for k in range(len(picks))]
        # Read now, compared once the timed rounds are over (beside the candidate's trace and exit), while the bytes
        # kept for that stay within HANDOVER_BYTES; else compared now.
        defer = (len(self.deferred) + len(picks)) * output_bytes <= windows.HANDOVER_BYTES
        checked = self.trusted.call(CheckHandoverCommand(
            layouts=layouts, seeds=[seeds[j] for j in picks], forward_seeds=[forward_seeds[j] for j in picks],
            atol=tol.atol, rtol=tol.rtol, defer=defer).model_dump(mode="json"), "handover_checked")
        add_trusted_seconds(self.obs, "handover", checked)
        check.reported += sum(layout is not None for layout in layouts)
        numbers = [window * calls + j for j in picks]
        if defer:
            self.deferred += numbers
        else:
            self._record(numbers, checked["checks"])

    def _record(self, numbers: list[int], checks: list[dict[str, Any]]) -> None:
        """The judge's figures for the calls numbered `numbers` (window * calls + call), into the observations."""
        check = self.obs.timed_outputs
        assert check is not None
        for n, figures in zip(numbers, checks, strict=True):
            check.checked.append(n)
            check.calls.append(TrialFigures.model_validate({**figures, "trial": n, "inputs": "timed window"}))

    def compare(self) -> None:
        """The hand-overs read during the rounds and left to compare: the trusted side compares them from now on,
        while the candidate is traced and ends (`compared` collects its answer)."""
        if self.deferred:
            tol = self.tolerance
            self.trusted.send(JudgeHandoversCommand(atol=tol.atol, rtol=tol.rtol).model_dump(mode="json"))
            self.comparing = True

    def compared(self) -> bool:
        """The trusted side's comparison of the deferred hand-overs, recorded; False where none was under way."""
        if not self.comparing:
            return False
        judged = self.trusted.wait("handovers_checked").fields
        self.comparing = False
        add_trusted_seconds(self.obs, "handover", judged)
        numbers, self.deferred = self.deferred, []
        self._record(numbers, judged["checks"])
        return True

    def settle(self) -> None:
        """At the evaluation's end, cut short: the comparison under way is let finish (a few calls' outputs), so
        that the trusted process stays in step with its commands; its answer is not recorded."""
        if self.comparing:
            self.comparing = False
            self.trusted.wait("handovers_checked")
