"""Eager's windows in a process of their own: the reference, submitted as the candidate's submission is. No torch.

The trusted process that judges holds what the candidate's does not: a float64 copy of the model, the trials' truths,
the harness's own modules, millions of Python objects; it is started, confined and woken in its own way. On an H200
the same launch-bound forward of level 3 ran 2-7% slower in it than in the candidate's process, in the CUDA events as
on the parent's clock, in every row (docs/kernelbench.md). A process of eager's own is started as the candidate's is
(the same child code, jail, pause and wake, pinned and held the same way), runs `aa_submission`'s source (the
reference, unchanged, as `ModelNew`), takes the parameters the candidate takes, and runs eager's windows and the
empty window; so the two processes differ only in what the submission itself does. The trusted side still judges,
stages, waits out other work before each window and times torch.compile's baseline.

Its process runs only the problem's reference code and the harness's, in a jail of its own that the candidate's cannot
see; paused outside its turns as the candidate is, and timed with the candidate paused. Anything it fails at is the
harness's failure (`TrustedFailed`), never the submission's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from harness.evaluation.handles import Candidate, CandidateStopped, TrustedFailed
from harness.evaluation.protocol import CandidateCommand, Fingerprint, Scales, Window
from harness.sandbox.process import Message
from harness.schema import MemoryPlan, Observations
from harness.verdicts import Phase

# Where a memory plan's figures leave no room for a second copy of the candidate's timed-window share, eager's windows
# stay in the trusted process, and the observations say why.
NO_ROOM = "no room on the device for a process of eager's own (the memory plan's figures)"


def fits(plan: MemoryPlan | None, staged: bool = False) -> bool:
    """Whether the memory plan leaves room beside both sides' peaks for eager's own process: a second copy of the
    candidate's timed-window share (the model, one window's inputs and outputs, were its kernels the reference's),
    with `staged` windows the window segment of its own that its inputs are written into, and a reserve of its own
    (its context, workspaces). Where no device budget is known (the host), it fits."""
    if plan is None or plan.budget_bytes is None:
        return True
    segment = plan.calls_per_window * plan.input_bytes if staged else 0
    return plan.needs_bytes + plan.phases_bytes.get("candidate_windows", 0) + segment + plan.reserve_bytes <= \
        plan.budget_bytes


def aa_submission(source: str, overrides: dict[str, Any]) -> str:
    """The reference as a submission: the file unchanged, then the sizes it runs at (a reference that reads
    a module constant in `Model` sees the same values the problem's inputs were made with), then `ModelNew`
    as a subclass that adds nothing (a rename would break `super(Model, self)` calls)."""
    sized = "".join(f"{name} = {value!r}\n" for name, value in overrides.items())
    header = "\n\n# A/A self-check: the sizes this evaluation runs at\n" if sized else "\n\n"
    return f"{source.rstrip()}{header}{sized}\n\nclass ModelNew(Model):\n    pass\n"


def eager_source(source: str, overrides: dict[str, Any]) -> str:
    """What eager's own process imports: `aa_submission`, marked as the harness's (its build dir is keyed by its
    text, so an A/A candidate of the same reference never waits on this one's)."""
    return "# eager's own process: the reference, timed as a submission is\n" + aa_submission(source, overrides)


class EagerProcess:
    """Eager's own process, driven as the candidate's is; its failures raise TrustedFailed with what it said."""

    def __init__(self, proc: Candidate):
        self.proc = proc
        self.obs: Observations = proc.obs  # its own, never the evaluation's
        self._readying: threading.Thread | None = None
        self._ready_error: BaseException | None = None

    def begin_ready(self, commands: Sequence[CandidateCommand], import_limit_s: float, idle_limit_s: float,
                    limit_s: float, warm_seeds: tuple[int, int, int], tolerance: tuple[float, float]) -> None:
        """Made ready in a thread of the parent's, beside the candidate's trials and the judge (nothing of either is
        timed): its import awaited, `commands` (its model built, then given the candidate's parameters), then one
        untimed window of one call on inputs of its own making, fingerprinted and scaled, so that its first timed
        window and fingerprint find their kernels loaded and its libraries' handles made, as the candidate's trials
        leave the candidate's; then paused. `await_ready` waits for it, and raises what it failed with. On an H100 the
        build alone took 0.55-0.72 s of each warm level2/75 evaluation when it came after the judge
        (docs/kernelbench.md)."""
        seed, forward_seed, key = warm_seeds
        atol, rtol = tolerance

        def ready() -> None:
            try:
                self.imported(import_limit_s, idle_limit_s)
                for command in commands:
                    self.request(command, limit_s, Phase.compile)
                self.request(Window(seeds=[seed], forward_seeds=[forward_seed]), limit_s)
                self.request(Fingerprint(key=key), limit_s)
                self.request(Scales(atol=atol, rtol=rtol), limit_s)
                self.pause()
            except BaseException as e:  # raised again in the evaluation's thread (await_ready)
                self._ready_error = e

        self._readying = threading.Thread(target=ready, name="eager-ready", daemon=True)
        self._readying.start()

    def await_ready(self) -> None:
        """Wait for `begin_ready`'s thread; raise what it failed with (TrustedFailed: the harness's)."""
        if self._readying is not None:
            self._readying.join()
            self._readying = None
        if self._ready_error is not None:
            raise self._ready_error

    def request(self, command: CandidateCommand, limit_s: float, phase: Phase = Phase.timing,
                clock_from_resume: bool = False) -> Message:
        try:
            return self.proc.request(command, limit_s, phase, clock_from_resume)
        except CandidateStopped:
            raise TrustedFailed(self.failure(command.cmd)) from None

    @property
    def sent_at(self) -> float:
        return self.proc.sent_at

    def imported(self, limit_s: float, idle_limit_s: float) -> None:
        try:
            self.proc.await_imported(limit_s, idle_limit_s)
        except CandidateStopped:
            raise TrustedFailed(self.failure("import")) from None

    def failure(self, command: str) -> str:
        """The harness's own failure, said with what eager's process said of it."""
        o, e = self.obs, self.proc.exit
        said = f"{o.candidate_error.exc_type}: {o.candidate_error.message}" if o.candidate_error is not None else \
            "; ".join(o.protocol_violations) or o.static_error or o.pause_error or \
            ("no reply within its limit" if e.timed_out else "its process ended")
        return f"eager's own process failed at {command!r}: {said[:2000]}"

    def pause(self) -> None:
        try:
            self.proc.pause()
        except CandidateStopped:
            raise TrustedFailed(self.failure("pause")) from None

    def processes(self) -> list[int]:
        return self.proc.processes()

    def keep_to(self, cores: list[int] | None) -> bool:
        return self.proc.keep_to(cores)

    def stop(self) -> None:
        """Told to exit (its CUDA context's teardown goes on beside the candidate's; `finish` waits). One still being
        made ready is killed instead: the readying thread's commands and `exit` must not share its channel."""
        if self.proc.ended:
            return
        if self._readying is not None and self._readying.is_alive():
            self.proc.proc.kill()
            self._readying.join(timeout=30)
        else:
            self.proc.stop()

    def finish(self) -> None:
        """Told to exit and ended (idempotent)."""
        if not self.proc.ended:
            self.stop()
            self.proc.finish()
