"""The queue worker: claims jobs, precompiles them on the CPU, evaluates them one per slot.

    claim loop ──► compile pool (threads, `precompile`) ──► ready ──► slot threads (`evaluate`)
        ▲                                                                  │
        └─────────── heartbeat thread renews the leases of all held jobs ──┘

Every stage is a thread of this process: `precompile` and `evaluate` spawn their own children and
wait on them, so threads are enough and nothing here imports torch. The claim loop holds at most
slots + compile workers jobs (and one more per slot that starts its next candidate ahead), so the pool works
ahead of the GPUs without hoarding the queue. A slot takes the ready jobs of the problem it evaluates first, within
a bound (`ready.ReadyJobs`): its trusted process stays warm for them.
An evaluation that reports infra_error (or raises) is retried after a back-off until the job's
attempts are spent; then its infra_error result is stored. Submission failures are final.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from harness import artifacts
from harness.config import Settings
from harness.db import crud, queries
from harness.db.models import Job, JobStatus, ResultOrigin, Submission
from harness.db.session import Database
from harness.evaluation import starts
from harness.evaluation.prebuild import PrecompileResult, precompile
from harness.evaluation.runner import EvalOptions, evaluate
from harness.evaluation.warm import TrustedPool
from harness.precision import check as check_precision
from harness.problems import Registry, UnknownProblem
from harness.problems.spec import ProblemSpec
from harness.requirements import accepted
from harness.schema import EvalResult, Provenance
from harness.service.devices import Slot
from harness.service.health import gpu_health_check, low_disk, slot_is_healthy
from harness.service.outcomes import infra_result
from harness.service.ready import ReadyJobs
from harness.verdicts import Verdict

log = logging.getLogger("harness.worker")

EvaluateFn = Callable[[ProblemSpec, str, EvalOptions, Settings], EvalResult]
PrecompileFn = Callable[..., PrecompileResult]

# Verdicts after which a GPU slot checks its GPU before the next job (None: the evaluation raised).
_GPU_FAULTS = (Verdict.crashed, Verdict.timeout, Verdict.infra_error, None)

# Text that shows a submission builds native code; anything else has nothing to precompile.
_BUILD_MARKERS = ("load_inline", "cpp_extension", "load(")


def pid_runs(pid: int) -> bool:
    """Whether a process of this host has this pid. Where it cannot tell (a pid reused by another
    process, one in another pid namespace) it says True: the job then waits for its lease, as before."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def default_compile_workers(settings: Settings, slots: list[Slot]) -> int:
    if settings.compile_workers is not None:
        return settings.compile_workers
    if all(s.device == "cpu" for s in slots):
        return 0  # the CPU evaluates too: building elsewhere only takes cores from the timed runs
    return min(8, max(1, (os.cpu_count() or 2) // 2))


@dataclass
class _Held:
    claim: crud.ClaimedJob
    spec: ProblemSpec
    lost: bool = False  # the lease went to another worker: the result will be discarded
    started: bool = False  # handed to a slot
    precompiled: bool = False  # the compile pool built it for every target: its evaluation builds nothing


def _problem_of(h: _Held) -> tuple[str, int]:
    return h.spec.id, h.spec.version


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    retried: int = 0
    released: int = 0
    precompiled: int = 0
    retired_slots: list[str] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)


class Worker:
    def __init__(self, db: Database, settings: Settings, registry: Registry, slots: list[Slot], *,
                 compile_workers: int | None = None, batch: str | None = None,
                 exit_when_idle_s: float | None = None, worker_id: str | None = None,
                 evaluate_fn: EvaluateFn = evaluate, precompile_fn: PrecompileFn = precompile,
                 stop_grace_s: float = 10.0, health_check: Callable[[dict[str, str], Settings], str | None] =
                 gpu_health_check, health_pause_s: float = 5.0):
        if not slots:
            raise ValueError("a worker needs at least one slot")
        self.db = db
        self.settings = settings
        self.registry = registry
        self.slots = slots
        self.compile_workers = default_compile_workers(settings, slots) if compile_workers is None \
            else compile_workers
        self.batch = batch
        self.exit_when_idle_s = exit_when_idle_s
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.evaluate_fn = evaluate_fn
        self.precompile_fn = precompile_fn
        self.stop_grace_s = stop_grace_s
        self.health_check = health_check
        self.health_pause_s = health_pause_s
        self.stats = WorkerStats()
        self._held: dict[int, _Held] = {}
        self._lock = threading.Lock()
        self._compile_q: queue.Queue[_Held] = queue.Queue()
        # A slot prefers the ready jobs of the problem it evaluates (its trusted process stays warm for them).
        self._ready_q: ReadyJobs[_Held] = ReadyJobs(settings.ready_bypass_limit, _problem_of,
                                                    rank=lambda h: h.claim.priority)
        self._warm_for: dict[str, tuple[str, int]] = {}  # slot name -> the problem it evaluates or last evaluated
        self._stop = threading.Event()
        self._done = threading.Event()  # run() has returned: the heartbeat may end

    # ---- life cycle ----------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> WorkerStats:
        with self.db.session() as s:
            crud.register_worker(s, self.id, hostname=socket.gethostname(), pid=os.getpid(),
                                 slots=[slot.describe() for slot in self.slots], accepts=sorted(self.accepts()))
        log.info("worker %s: slots %s, %d compile workers%s", self.id, ", ".join(s.describe() for s in self.slots),
                 self.compile_workers, f", batch {self.batch}" if self.batch else "")
        threads = [threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)]
        threads += [threading.Thread(target=self._compile_loop, name=f"compile-{i}", daemon=True)
                    for i in range(self.compile_workers)]
        slot_threads = [threading.Thread(target=self._slot_loop, args=(slot,), name=f"slot-{slot.name}", daemon=True)
                        for slot in self.slots]
        for t in threads + slot_threads:
            t.start()
        try:
            self._claim_loop()
        finally:
            self._stop.set()
            self._shutdown(slot_threads)
            self._done.set()
            with contextlib.suppress(Exception), self.db.session() as s:
                crud.worker_stopped(s, self.id)
        return self.stats

    def _shutdown(self, slot_threads: list[threading.Thread]) -> None:
        """Give back what has not started; let running evaluations finish within the grace period, then
        give those back too (their children end when this process does)."""
        deadline = time.monotonic() + self.stop_grace_s
        for t in slot_threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            leftovers = list(self._held.values())
        for h in leftovers:
            self._release(h)

    def _release(self, h: _Held) -> None:
        with contextlib.suppress(Exception), self.db.session() as s:
            if crud.release_job(s, h.claim.job_id, h.claim.claim_token):
                self.stats.released += 1
                log.info("job %d released (worker stopping)", h.claim.job_id)
        self._forget(h)

    def _forget(self, h: _Held) -> None:
        with self._lock:
            self._held.pop(h.claim.job_id, None)

    # ---- claiming ------------------------------------------------------------------------------------

    def _capacity(self) -> int:
        # A slot that starts the next jobs' candidates ahead holds those jobs too.
        live = [s for s in self.slots if s.name not in self.stats.retired_slots]
        return len(live) + sum(self._ahead(s) for s in live) + self.compile_workers

    def _ahead(self, slot: Slot) -> int:
        """How many next jobs the slot starts candidates for ahead (0: none)."""
        mode = self.settings.prestart_candidates
        on = mode == "on" or (mode == "auto" and slot.device == "cuda")
        return self.settings.prestart_depth if on else 0

    def accepts(self) -> set[str]:
        """The job needs this worker's live slots meet: a CPU-only worker leaves a CUDA job for a GPU worker."""
        live = [s for s in self.slots if s.name not in self.stats.retired_slots]
        return {n for s in live for n in accepted(s.device, s.target.compute_capability if s.target else None)}

    def _claim_loop(self) -> None:
        idle_since = time.monotonic()
        next_reap = next_prune = 0.0
        while not self._stop.is_set():
            with self._lock:
                busy = len(self._held)
            if busy:
                idle_since = time.monotonic()
            if busy >= self._capacity():
                self._stop.wait(0.05)
                continue
            if time.monotonic() >= next_reap:  # at once on start: a restarted host's orphaned jobs go back now
                self._requeue_expired()
                next_reap = time.monotonic() + min(self.settings.lease_s / 4, 30.0)
            if time.monotonic() >= next_prune:
                self._prune_builds()
                next_prune = time.monotonic() + 600.0
            try:
                with self.db.session() as s:
                    claim = crud.claim_job(s, self.id, self.settings.lease_s, batch=self.batch,
                                           accepts=self.accepts())
            except Exception:
                log.exception("claiming a job failed; trying again")
                claim = None
            if claim is None:
                if busy == 0 and self.exit_when_idle_s is not None and \
                        time.monotonic() - idle_since >= self.exit_when_idle_s:
                    log.info("no job for %.0f s: exiting", self.exit_when_idle_s)
                    return
                self._stop.wait(self.settings.worker_poll_s)
                continue
            self.stats.claimed += 1
            self._admit(claim)

    def _prune_builds(self) -> None:
        if not self.settings.build_cache_max_mb:
            return
        try:
            removed = artifacts.prune_build_cache(self.settings, self.settings.build_cache_max_mb * 2**20)
        except OSError:
            log.exception("pruning the build cache failed")
            return
        if removed:
            log.info("build cache: removed %d least recently used build dirs", len(removed))

    def _admit(self, claim: crud.ClaimedJob) -> None:
        try:
            spec = self.registry.get(claim.problem_id)
        except UnknownProblem as e:
            # Another worker (with that problems folder) may know it: an infra error, retried.
            self._infra_failure(claim, f"this worker does not know the problem: {e}", None)
            return
        h = _Held(claim, spec)
        with self._lock:
            self._held[claim.job_id] = h
        log.info("job %d (submission %d, %s, attempt %d/%d) claimed", claim.job_id, claim.submission_id,
                 spec.id, claim.attempts, claim.max_attempts)
        if self.compile_workers and any(m in claim.text for m in _BUILD_MARKERS):
            self._compile_q.put(h)
        else:
            self._ready_q.put(h)

    def _lost_result(self, sub: Submission, job: Job) -> EvalResult:
        try:
            spec: ProblemSpec | None = self.registry.get(sub.problem_id)
        except UnknownProblem:
            spec = None
        return infra_result(sub, f"the evaluation was abandoned {job.attempts} times: its worker stopped "
                            f"renewing the job's lease (last: {job.worker_id}; died, hung or lost the database)", spec)

    def _requeue_expired(self) -> None:
        try:
            with self.db.session() as s:
                dead = [w.id for w in queries.running_workers_on(s, socket.gethostname())
                        if w.id != self.id and not pid_runs(w.pid)]
                if dead:
                    log.warning("workers %s of this host are gone (their processes no longer run): their jobs go "
                                "back to the queue now", dead)
                requeued, failed = crud.requeue_expired(s, self._lost_result, dead_workers=dead)
        except Exception:
            log.exception("requeueing expired jobs failed")
            return
        if requeued:
            log.warning("jobs %s requeued: their workers are gone or their leases expired", requeued)
        if failed:
            log.error("jobs %s failed for good with infra_error: out of attempts", failed)

    # ---- heartbeat -----------------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        # It beats on through shutdown: evaluations finishing in the grace period keep their leases.
        interval = self.settings.heartbeat_interval_s
        while not self._done.wait(interval):
            with self._lock:
                by_token = {h.claim.claim_token: h for h in self._held.values()}
            try:
                with self.db.session() as s:
                    still = crud.heartbeat(s, self.id, by_token, self.settings.lease_s)
            except Exception:
                log.exception("heartbeat failed; the leases run on until the next one")
                continue
            for token, h in by_token.items():
                if token not in still and not h.lost:
                    h.lost = True
                    log.warning("job %d: lease lost (expired, deleted or claimed again); its result will be "
                                "discarded", h.claim.job_id)

    # ---- compile pool --------------------------------------------------------------------------------

    def _targets(self) -> list[Provenance]:
        seen: dict[tuple[str | None, str], Provenance] = {}
        for slot in self.slots:
            if slot.target is not None:
                seen.setdefault((slot.target.compute_capability, slot.target.device), slot.target)
        return list(seen.values())

    def _compile_loop(self) -> None:
        while not self._stop.is_set():
            try:
                h = self._compile_q.get(timeout=0.2)
            except queue.Empty:
                continue
            if self._stop.is_set() or h.lost:
                self._ready_q.put(h)  # the slot loop (or shutdown) decides its fate
                continue
            built = bool(self._targets())
            for target in self._targets():
                try:
                    r = self.precompile_fn(h.claim.text, target, self.settings, timeout_s=h.spec.compile_timeout_s)
                except Exception:
                    # The outcome decides nothing: the evaluation compiles whatever is missing.
                    log.exception("precompiling job %d failed", h.claim.job_id)
                    built = False
                    continue
                built = built and r.ok
                self.stats.precompiled += 1
                log.info("job %d precompiled for %s in %.1f s (%s)", h.claim.job_id,
                         target.compute_capability or target.device, r.seconds, "ok" if r.ok else "did not build")
            h.precompiled = built
            self._ready_q.put(h)

    # ---- evaluation slots ----------------------------------------------------------------------------

    def _slot_loop(self, slot: Slot) -> None:
        # The slot's trusted process stays warm between evaluations of one problem, and the next job's candidate
        # process starts while the current job is evaluated (harness/evaluation/warm.py).
        pool = TrustedPool(self.settings)
        upcoming: list[_Held] = []  # the next jobs, oldest first, taken while the current one is evaluated
        evaluating, ending = threading.Event(), threading.Event()
        # The starter thread lives as long as this loop: a child dies with the thread that started it (the jail's
        # parent-death signal), so a spare's must outlive the evaluation during which it was started.
        starter = threading.Thread(target=self._look_ahead, args=(slot, pool, upcoming, evaluating, ending),
                                   name=f"ahead-{slot.name}", daemon=True) if self._ahead(slot) else None
        if starter is not None:
            starter.start()
        try:
            while not self._stop.is_set():
                if upcoming:
                    h = upcoming.pop(0)
                else:
                    try:
                        h = self._ready_q.get(0.2, prefer=self._warm_for.get(slot.name))
                    except queue.Empty:
                        continue
                if self._stop.is_set():
                    self._ready_q.put(h)  # left for shutdown to release
                    return
                self._warm_for[slot.name] = _problem_of(h)
                # Its trusted process, warm or not, serves the slot's next job of the problem: none started ahead.
                try:
                    key = starts.trusted_key(h.spec, self._options(slot, pool, h), self.settings)
                except OSError:  # its problem's file unreadable: the evaluation says so
                    key = ()
                pool.serves(key)
                evaluating.set()  # the next job may be claimed only now: the starter looks for it meanwhile
                try:
                    faulted = self._evaluate(slot, h, pool)
                finally:
                    evaluating.clear()
                    pool.served(key)
                if faulted:  # the GPU may be faulty: nothing of the last evaluation's is kept
                    pool.close()
                if slot.device == "cuda" and faulted and not self._gpu_recovered(slot):
                    return
        finally:
            ending.set()
            if starter is not None:
                starter.join()
            for h in upcoming:
                self._ready_q.put(h)  # for another slot, or for shutdown to release
            pool.close()

    def _look_ahead(self, slot: Slot, pool: TrustedPool, upcoming: list[_Held], evaluating: threading.Event,
                    ending: threading.Event) -> None:
        """While the slot evaluates a job and fewer than its depth (`Settings.prestart_depth`) wait started: take the
        next ready one and start its candidate's process ahead, and its trusted process where none is warm or
        serving for its problem (a mixed batch's next problem: a cold start's 4-5 s on an H200). The slot taking the
        oldest makes room again, so each evaluation of a stream has the next ones started beside it (waiting instead
        for the slot to go idle, it missed each turn shorter than its poll: in a warm stream on an H100, 1 of 7
        evaluations had its candidate started ahead)."""
        while not ending.is_set() and not self._stop.is_set():
            if len(upcoming) >= self._ahead(slot) or not evaluating.wait(0.2):
                time.sleep(0.05)
                continue
            try:
                h = self._ready_q.get(0.2, prefer=self._warm_for.get(slot.name))
            except queue.Empty:
                continue
            options = self._options(slot, pool, h)
            starts.prestart(h.spec, h.claim.text, options, self.settings)
            starts.prestart_trusted(h.spec, options, self.settings)  # where none is warm for its problem
            upcoming.append(h)

    def _options(self, slot: Slot, pool: TrustedPool | None, h: _Held) -> EvalOptions:
        return EvalOptions(device=slot.device, precision=check_precision(h.claim.precision), extra_env=slot.env,
                           target=slot.target, trusted_pool=pool)

    def _gpu_recovered(self, slot: Slot) -> bool:
        """After a fault on this GPU: a tiny kernel must run before the next job, or the slot retires."""
        healthy, problem = slot_is_healthy(slot.env, self.settings, pause_s=self.health_pause_s,
                                           check=self.health_check)
        if healthy:
            log.info("slot %s: GPU healthy after the fault", slot.name)
            return True
        with self._lock:
            self.stats.retired_slots.append(slot.name)
            left = len(self.slots) - len(self.stats.retired_slots)
        log.error("slot %s RETIRED: its GPU stays unusable after a fault (%s); %d slot(s) left", slot.name,
                  problem, left)
        if left == 0:
            log.error("no usable slot left: the worker stops and hands back its jobs")
            self.stop()
        return False

    def _evaluate(self, slot: Slot, h: _Held, pool: TrustedPool | None = None) -> bool:
        """Evaluate and store; True when the evaluation ended in a way that may have left its GPU faulty."""
        claim = h.claim
        disk = low_disk(self.settings)
        if disk is not None:  # the harness's trouble: retried later, never blamed on the submission
            try:
                self._infra_failure(claim, disk, None)
            finally:
                self._forget(h)
            return False
        # On the CPU (no compile pool) the slot builds the candidate itself: the job shows as compiling until then.
        builds_here = not h.precompiled and any(m in claim.text for m in _BUILD_MARKERS)
        try:
            with self.db.session() as s:
                ok = crud.mark_running(s, claim.job_id, claim.claim_token,
                                       JobStatus.compiling if builds_here else JobStatus.running)
        except Exception:
            log.exception("job %d: could not mark it running; its lease will expire", claim.job_id)
            self._forget(h)
            return False
        if not ok:
            log.warning("job %d is no longer ours (lease expired, deleted); skipped", claim.job_id)
            self._forget(h)
            return False
        h.started = True
        log.info("job %d evaluating on %s", claim.job_id, slot.name)
        result: EvalResult | None = None
        error = ""
        try:
            options = self._options(slot, pool, h)
            if builds_here:
                options.built = lambda: self._built(claim)
            result = self.evaluate_fn(h.spec, claim.text, options, self.settings)
        except Exception as e:
            error = f"the worker failed while evaluating: {type(e).__name__}: {e}"
            log.exception("job %d: evaluation raised", claim.job_id)
            log.debug("%s", traceback.format_exc())
        if result is not None and result.verdict != Verdict.infra_error and \
                result.verdict != Verdict.passed and (disk := low_disk(self.settings)):
            # A submission that failed while the disk filled up may have failed because of it.
            result, error = None, f"{disk} (after the evaluation, which ended {result.verdict.value})"
        try:
            if result is not None and result.verdict != Verdict.infra_error:
                self._complete(claim, result, ResultOrigin.sandbox)
            else:
                self._infra_failure(claim, result.message if result else error, result)
        finally:
            self._forget(h)
        return (result.verdict if result is not None else None) in _GPU_FAULTS

    def _built(self, claim: crud.ClaimedJob) -> None:
        """The slot has built the candidate: the job is running now (a display only: a failure here changes nothing)."""
        try:
            with self.db.session() as s:
                crud.mark_running(s, claim.job_id, claim.claim_token)
        except Exception:
            log.exception("job %d: could not mark it running after its build", claim.job_id)

    def _complete(self, claim: crud.ClaimedJob, result: EvalResult, origin: ResultOrigin) -> None:
        try:
            with self.db.session() as s:
                row = crud.complete_job(s, claim.job_id, claim.claim_token, result, origin)
        except Exception:
            log.exception("job %d: storing its result failed; the job will be requeued when its lease expires",
                          claim.job_id)
            return
        if row is None:
            log.warning("job %d: result discarded, the job is no longer ours (lease expired or deleted)",
                        claim.job_id)
            return
        self.stats.completed += 1
        self.stats.verdicts[result.verdict.value] = self.stats.verdicts.get(result.verdict.value, 0) + 1
        log.info("job %d done: %s (%s)", claim.job_id, result.verdict.value, result.message[:200])

    def _infra_failure(self, claim: crud.ClaimedJob, message: str, result: EvalResult | None) -> None:
        """Retry after a back-off while attempts remain; then store the infra_error for good."""
        if claim.attempts < claim.max_attempts:
            delay = self.settings.retry_delay_s * claim.attempts
            try:
                with self.db.session() as s:
                    retried = crud.retry_job(s, claim.job_id, claim.claim_token, message, delay)
            except Exception:
                log.exception("job %d: requeueing failed; its lease will expire", claim.job_id)
                return
            if retried:
                self.stats.retried += 1
                log.warning("job %d: infra error (attempt %d/%d), retried in %.0f s: %s", claim.job_id,
                            claim.attempts, claim.max_attempts, delay, message[:300])
            return
        if result is None:
            with self.db.session() as s:
                sub = s.get(Submission, claim.submission_id)
            if sub is None:
                return
            try:
                spec: ProblemSpec | None = self.registry.get(sub.problem_id)
            except UnknownProblem:
                spec = None
            result = infra_result(sub, f"{message} (attempt {claim.attempts} of {claim.max_attempts})", spec)
            origin = ResultOrigin.queue
        else:
            origin = ResultOrigin.sandbox
        self._complete(claim, result, origin)
