"""What a slot keeps warm between its evaluations: the trusted process, and the next candidate's. No torch here.

Starting the trusted side costs seconds an evaluation (its interpreter and torch, the probe, the reference
Model, torch.compile's baseline, the device's peaks), and none of it depends on the submission. The trusted
process never imports a submission, so nothing a candidate does can reach it, and keeping it changes no
verdict: every evaluation still draws its own secret seeds and fresh reference parameters (the Model's state
as built is restored first), and the candidate's process is new each time. What must not outlive an
evaluation (its expected outputs) is released before the next.

`TrustedPool` holds one such process per problem, size and device, up to `warm_trusted_per_slot` (the least
recently used is ended beyond): a batch that mixes problems finds each warm again. Only one serves at a time (a
slot evaluates one thing at a time); one waiting holds its CUDA context and its Model, not the last evaluation's
outputs, so the device's memory stays the candidate's to use. A process that failed, timed out or was left
mid-command is never kept.

It also holds spare candidate processes (`SpareCandidate`): the next evaluation's, started ahead while the current
one runs, confined as its own evaluation's would be. Each imports torch and waits: the submission is imported only
when its evaluation begins (`Import`), so no submission code runs beside another's timed windows. At most
`Settings.prestart_depth` + 1 wait at once (the current evaluation's, taken when it begins, and the next ones'); an
older one is ended.

And trusted processes started ahead (`keep_ahead`): the next evaluation's, for a problem none is warm for, started
while the current one runs. One imports torch and waits, unprobed: no CUDA context, no Model, until its evaluation
takes it and probes it. A pool made with `keep_warm=False` ends each trusted process when its evaluation ends,
for runs whose problems do not come again (selfcheck): none then holds its Model on the GPU for nothing.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import artifacts
from harness.config import Settings
from harness.evaluation.eager_process import EagerProcess
from harness.evaluation.handles import Candidate, Trusted, TrustedFailed
from harness.sandbox.process import ChildExited

log = logging.getLogger("harness.runner")

RELEASE_TIMEOUT_S = 60.0


@dataclass
class WarmTrusted:
    """One trusted process and what it was started and built with."""

    key: tuple[Any, ...]
    trusted: Trusted
    probed: dict[str, Any]  # its probe's reply: the evaluation's provenance
    model_seed: int  # the seed its reference Model was built under; the candidate's ModelNew is built under it too
    home: Path  # its working dir, which outlives any one evaluation
    log_path: Path
    kill_grace_s: float
    evaluations: int = 0
    _log_offset: int = field(default=0, repr=False)

    def log_since_taken(self) -> bytes:
        """What the process logged since this evaluation took it (its own job's trusted.log)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read()
        except OSError:
            return b""

    def mark_log(self) -> None:
        with contextlib.suppress(OSError):
            self._log_offset = self.log_path.stat().st_size

    def close(self) -> None:
        proc = self.trusted.proc
        with contextlib.suppress(ChildExited, OSError):
            proc.send({"cmd": "exit"})
        proc.wait_exit(self.kill_grace_s)
        proc.reap()
        artifacts.remove_scratch_dir(self.home)


@dataclass
class SpareCandidate:
    """A candidate's process started ahead of its evaluation, with that evaluation's job and scratch dirs."""

    key: tuple[Any, ...]  # what its request and confinement were made from (starts.spare_key)
    job_id: str
    job: Path
    work: Path  # its evaluation's scratch dir (trusted/, candidate/, exchange/ inside; eager/ where it has one)
    candidate: Candidate
    eager: EagerProcess | None = None  # eager's own process, started beside it (starts.prestart)

    def close(self, keep_job: bool = False) -> None:
        """Its evaluation will not run (or stops before its candidate does anything): end the process, and remove
        what was made for it (its job dir too, unless the evaluation writes its result there)."""
        self.candidate.stop()
        self.candidate.finish()
        if self.eager is not None:
            self.eager.finish()
        artifacts.remove_scratch_dir(self.work)
        if not keep_job:
            shutil.rmtree(self.job, ignore_errors=True)


class TrustedPool:
    """Warm trusted processes (one per key, at most `warm_trusted_per_slot`) and `max_spares` spare candidates, for
    the evaluations of one slot, one after another. The warm processes are the evaluating thread's alone; spares
    may be added from another (a worker's starter thread), so their list is locked."""

    def __init__(self, settings: Settings, keep_warm: bool = True):
        self.settings = settings
        self.keep_warm = keep_warm  # False: a trusted process ends with its evaluation (`keep`)
        self.kept: OrderedDict[tuple[Any, ...], WarmTrusted] = OrderedDict()  # least recently used first
        self.ahead: OrderedDict[tuple[Any, ...], WarmTrusted] = OrderedDict()  # started ahead, unprobed; oldest first
        self.serving: set[tuple[Any, ...]] = set()  # the keys of the evaluations a slot runs now (`serves`)
        self.spares: list[SpareCandidate] = []  # oldest first
        self.max_spares = settings.prestart_depth + 1
        self._spares_lock = threading.Lock()  # the spares and the trusted processes started ahead
        self.started = 0  # trusted processes started for this pool's evaluations
        self.reused = 0  # evaluations that found one warm

    def home(self) -> Path:
        """A working dir for a trusted process that may outlive its first evaluation."""
        return artifacts.new_scratch_dir(self.settings, prefix="kh-trusted-")

    def take(self, key: tuple[Any, ...]) -> WarmTrusted | None:
        """The warm process for `key`, now the caller's, else one started ahead for it (unprobed: its `probed` is
        empty); None where there is neither (or it has ended)."""
        warm = self.kept.pop(key, None)
        if warm is None:
            with self._spares_lock:
                warm = self.ahead.pop(key, None)
        if warm is None:
            return None
        if warm.trusted.proc.proc.poll() is not None:
            warm.close()
            return None
        if warm.evaluations:
            self.reused += 1
        warm.mark_log()
        return warm

    def holds(self, key: tuple[Any, ...]) -> bool:
        """Whether a trusted process for `key` waits here (warm, or started ahead) or serves an evaluation now (the
        slot's next job of the same problem finds it warm once that evaluation ends)."""
        with self._spares_lock:
            return key in self.kept or key in self.ahead or key in self.serving

    def serves(self, key: tuple[Any, ...]) -> None:
        """A slot is about to evaluate `key`, before its look-ahead may run: its trusted process (warm, or started by
        the evaluation) serves the slot's next job of that problem, so none is started ahead for it."""
        with self._spares_lock:
            self.serving.add(key)

    def served(self, key: tuple[Any, ...]) -> None:
        """That evaluation is over (its process kept warm, or ended)."""
        with self._spares_lock:
            self.serving.discard(key)

    def keep_ahead(self, warm: WarmTrusted) -> None:
        """A trusted process started for an evaluation to come (`starts.prestart_trusted`): it waits, unprobed, for
        `take`. At most `max_spares` wait; an older one, or one for the same key, is ended."""
        with self._spares_lock:
            old = [o for o in [self.ahead.pop(warm.key, None)] if o is not None]
            self.ahead[warm.key] = warm
            while len(self.ahead) > self.max_spares:
                old.append(self.ahead.popitem(last=False)[1])
        for o in old:
            o.close()

    def keep(self, warm: WarmTrusted) -> None:
        """Give the process back after an evaluation it served to the end: released, it waits for the next of its
        key (the least recently used of the others is ended where they are too many); ended where the pool keeps
        none warm."""
        if (other := self.kept.pop(warm.key, None)) is not None:
            other.close()
        if not warm.trusted.in_sync or not self.keep_warm:
            warm.close()
            return
        try:
            warm.trusted.call({"cmd": "release"}, "released", RELEASE_TIMEOUT_S)
        except (TrustedFailed, ChildExited) as e:
            log.warning("the warm trusted process could not release its evaluation; it is ended: %s", e)
            warm.close()
            return
        warm.evaluations += 1
        self.kept[warm.key] = warm
        while len(self.kept) > max(1, self.settings.warm_trusted_per_slot):
            self.kept.popitem(last=False)[1].close()

    def idle_processes(self) -> list[int]:
        """The pool's processes that run nothing now: its warm trusted processes between evaluations, those started
        ahead, and its spare candidates, whose submissions are not imported yet (host PIDs)."""
        with self._spares_lock:
            spares, ahead = list(self.spares), list(self.ahead.values())
        pids = [p for warm in list(self.kept.values()) + ahead for p in warm.trusted.processes()]
        return pids + [p for spare in spares for p in spare.candidate.processes()]

    def take_spare(self, key: tuple[Any, ...]) -> SpareCandidate | None:
        """The spare candidate started for `key`, now the caller's; None where there is none, or it has ended. The
        others wait on (the next evaluation's)."""
        with self._spares_lock:  # a worker's slot starts the next spare from another thread
            spare = next((s for s in self.spares if s.key == key), None)
            if spare is not None:
                self.spares.remove(spare)
        if spare is None:
            return None
        if spare.candidate.proc.proc.poll() is not None:
            spare.close()
            return None
        return spare

    def keep_spare(self, spare: SpareCandidate) -> None:
        with self._spares_lock:
            self.spares.append(spare)
            old = self.spares[:-self.max_spares]
            del self.spares[:-self.max_spares]
        for s in old:
            s.close()

    def close(self) -> None:
        """End the warm processes and the spare candidates, if any (a GPU fault, a worker stopping)."""
        while self.kept:
            self.kept.popitem()[1].close()
        with self._spares_lock:
            spares, self.spares = self.spares, []
            ahead, self.ahead = list(self.ahead.values()), OrderedDict()
        for warm in ahead:
            warm.close()
        for s in spares:
            s.close()
