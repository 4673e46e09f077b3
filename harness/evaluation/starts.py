"""The processes of an evaluation, started: the trusted child and the candidate's, for the evaluation now or ahead
of it into a slot's pool (warm.py), and what each was started for (its key). No torch."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any

from harness import artifacts, kernels
from harness.config import Settings
from harness.evaluation import eager_process, windows
from harness.evaluation.eager_process import EagerProcess
from harness.evaluation.handles import Candidate, Trusted
from harness.evaluation.options import EvalOptions
from harness.evaluation.prebuild import build_env, sealed_when_built
from harness.evaluation.protocol import CandidateRequest, ProblemLoad
from harness.evaluation.reduced_size import SMALL, small_variant, with_small
from harness.evaluation.warm import SpareCandidate, WarmTrusted
from harness.problems.spec import ProblemSpec
from harness.sandbox import capabilities, limits
from harness.sandbox.process import ChildProcess, scrubbed_env
from harness.schema import Observations, Provenance
from harness.submission import InvalidSubmission, extract

log = logging.getLogger("harness.runner")


def size_for(spec: ProblemSpec, size: str, device: str) -> str:
    """`auto`: the problem's small size on the CPU (every problem has one: `reduced_size`), else its default."""
    if size != "auto":
        return size
    return SMALL if device == "cpu" else "default"


def with_size(spec: ProblemSpec, size: str, settings: Settings) -> ProblemSpec:
    """The spec, with the reduced CPU size its file does not name where `size` asks for it."""
    return with_small(spec, settings) if size == SMALL else spec


def problem_load(spec: ProblemSpec, size: str, precision: str) -> ProblemLoad:
    return ProblemLoad(path=spec.source_path, overrides=spec.size(size).overrides, precision=precision)


def scratch_layout(work: Path) -> tuple[Path, Path, Path]:
    """An evaluation's scratch dirs (the trusted side's, the candidate's home, the exchange), made where missing."""
    dirs = work / "trusted", work / "candidate", work / "exchange"
    for d in dirs:
        if not d.is_dir():
            d.mkdir(mode=0o700)
    return dirs


def spare_key(spec: ProblemSpec, text: str, options: EvalOptions) -> tuple[Any, ...]:
    """What a candidate's process started ahead was made from: an evaluation with another key cannot use it."""
    target = options.target.model_dump_json(exclude={"started_at"}) if options.target is not None else None
    return (spec.id, spec.version, str(spec.source_path), hashlib.sha256(text.encode(errors="replace")).hexdigest(),
            options.device, options.size, options.precision, target, tuple(sorted(options.extra_env.items())))


def prestart(spec: ProblemSpec, text: str, options: EvalOptions, settings: Settings) -> bool:
    """Start the candidate's process of an evaluation to come, ahead, into `options.trusted_pool`: confined as its
    evaluation's would be, it imports torch and waits for `Import`, which its evaluation sends when it begins (so
    no submission code runs beside the evaluation now on the slot's GPU). Needs the slot's target; False where
    nothing was started (no pool or target, an invalid submission, its build dir in use, no sandbox uid free: the
    evaluation then starts its own as usual)."""
    pool, target = options.trusted_pool, options.target
    if pool is None or target is None or options.device not in ("auto", target.device):
        return False
    try:
        source = extract(text).source
    except InvalidSubmission:
        return False
    job_id = artifacts.new_job_id()
    job = artifacts.job_dir(settings, job_id)
    work = artifacts.new_scratch_dir(settings)
    _, cand_home, exchange = scratch_layout(work)
    try:
        # Never waiting for a build dir: the process holding it may be the one this slot evaluates next (the same
        # source twice in a row), whose lock goes only when it constructs.
        size = size_for(spec, options.size, target.device)
        sized = with_size(spec, size, settings)
        load = problem_load(sized, size, options.precision)
        candidate = start_candidate(spec, source, options, settings, target, load, exchange, cand_home,
                                     job, Observations(), wait_for_build=False)
    except Exception as e:  # its build dir in use, no sandbox uid free: the evaluation starts its own, as usual
        if not isinstance(e, BlockingIOError):
            log.warning("the next candidate's process could not start ahead: %s: %s", type(e).__name__, e)
        artifacts.remove_scratch_dir(work)
        shutil.rmtree(job, ignore_errors=True)
        return False
    spare = SpareCandidate(spare_key(spec, text, options), job_id, job, work, candidate)
    if eager_wanted(options, settings, target.device):  # eager's own process too, ahead, in the same scratch dir
        try:
            spare.eager = start_eager(sized, options, settings, target, load, exchange, work / "eager", job,
                                      size_overrides(sized, size, settings))
        except Exception as e:  # the evaluation starts its own, as usual
            log.warning("eager's process could not start ahead: %s: %s", type(e).__name__, e)
    pool.keep_spare(spare)
    return True


def eager_wanted(options: EvalOptions, settings: Settings, device: str) -> bool:
    """Whether the settings ask for eager's own process on `device` (eager_process.py), for a timed evaluation."""
    mode = settings.eager_process_cuda if device == "cuda" else settings.eager_process_cpu
    return options.timing and mode == "own"


def size_overrides(spec: ProblemSpec, size: str, settings: Settings) -> dict[str, Any]:
    """The module constants a size used set: what a result records of it, and what eager's own source names."""
    if size == SMALL:
        return small_variant(spec, settings).overrides
    return spec.sizes[size].overrides if size in spec.sizes else {}


def trusted_key(spec: ProblemSpec, options: EvalOptions, settings: Settings) -> tuple[Any, ...]:
    """What a trusted process is started and builds its Model for: a warm one serves only an evaluation of its key."""
    env = trusted_env(options, settings)
    return (spec.id, spec.version, hashlib.sha256(spec.source_path.read_bytes()).hexdigest(), spec.model_dump_json(),
            options.device, options.size, options.precision, tuple(sorted(env.items())))


def trusted_env(options: EvalOptions, settings: Settings) -> dict[str, str]:
    return {**trusted_cache_env(settings), **windows.timing_env(), **options.extra_env}


def _devices(options: EvalOptions) -> tuple[str, ...]:
    """The devices an evaluation may run on before its probe: the one probed or asked for, else either."""
    if options.target is not None:
        return (options.target.device,)
    return (options.device,) if options.device in ("cpu", "cuda") else ("cuda", "cpu")


def start_trusted(spec: ProblemSpec, options: EvalOptions, settings: Settings, home: Path,
                   log_path: Path) -> Trusted:
    """The trusted child, started: it imports torch, says "ready" and waits for its probe."""
    proc = ChildProcess("harness.evaluation.trusted", [], cwd=home,
                        env=scrubbed_env(trusted_env(options, settings), home),
                        log_path=log_path, kill_grace_s=settings.kill_grace_s,
                        # Paused before its staged windows as the candidate is (rounds.py): a freezer too, for
                        # a device that stages (either, where the device is not yet known).
                        jail=limits.jail(settings, untrusted=False,
                                         pausable=any(settings.windows_staged(d) for d in _devices(options))),
                        fd_socket=True)
    return Trusted(proc, settings.reference_timeout_s)


def prestart_trusted(spec: ProblemSpec, options: EvalOptions, settings: Settings) -> bool:
    """Start the trusted process of an evaluation to come, ahead, into `options.trusted_pool`, where none is warm or
    started for its key: it imports torch and waits, unprobed (no CUDA context, no Model), for its evaluation, which
    probes it and has it build that evaluation's Model. It never imports a submission, so nothing the evaluation
    now running does can reach it. False where nothing was started."""
    pool = options.trusted_pool
    if pool is None:
        return False
    try:
        key = trusted_key(spec, options, settings)
    except OSError:  # its problem's file unreadable: its evaluation says so
        return False
    if pool.holds(key):
        return False
    home = pool.home()
    log_path = home / "trusted.log"
    try:
        trusted = start_trusted(spec, options, settings, home, log_path)
    except Exception as e:  # the evaluation starts its own, as usual
        log.warning("the next trusted process could not start ahead: %s: %s", type(e).__name__, e)
        artifacts.remove_scratch_dir(home)
        return False
    pool.started += 1
    pool.keep_ahead(WarmTrusted(key, trusted, {}, 0, home, log_path, settings.kill_grace_s))
    return True


def trusted_cache_env(settings: Settings) -> dict[str, str]:
    """The shared torch.compile cache for the trusted child, where candidates cannot write to it: they run as
    a sandbox uid with the data dir hidden. Otherwise (no user switch: a candidate has the worker's own uid)
    nothing, so the trusted child compiles into its own scratch home as before and never loads compiled
    code a candidate could have left."""
    p = capabilities.platform()
    if p.user_switch and p.mountns and settings.sandbox_user != "off":
        return artifacts.compile_cache_env(settings)
    return {}


def traces_kernels(device: str, source: str, options: EvalOptions) -> bool:
    """Whether a timed window of the candidate's is traced: on CUDA, unless the options say no or the source can launch
    no kernel of its own (it builds nothing and imports only torch: `kernels.launches_only_library_kernels`)."""
    return device == "cuda" and options.kernel_trace and not kernels.launches_only_library_kernels(source)


def start_candidate(spec: ProblemSpec, source: str, options: EvalOptions, settings: Settings, target: Provenance,
                     load: ProblemLoad, exchange: Path, home: Path, job: Path, obs: Observations,
                     wait_for_build: bool = True, log_name: str = "candidate.log", shared_build: bool = True
                     ) -> Candidate:
    """The candidate's process, started under its build dir's lock (its build dir is keyed by the target). It imports
    torch, then waits for the parent's `Import` (`Candidate.begin_import`). With `wait_for_build` False, a build dir
    another process holds is BlockingIOError at once. With `shared_build` False its build dir is its home's, shared
    with no other process."""
    submission_path = home / "submission.py"
    submission_path.write_text(source)
    request = CandidateRequest(submission_path=submission_path, problem=load, device=target.device,
                               kernel_trace=traces_kernels(target.device, source, options))
    request_path = home / "request.json"
    request_path.write_text(request.model_dump_json())
    builds, env = build_env(source, target, settings, home, options.extra_env, shared=shared_build)
    build_lock = contextlib.ExitStack()
    build_lock.enter_context(artifacts.exclusive_build_dir(builds, wait=wait_for_build))
    try:
        # Sealed when the lock goes: once ModelNew is constructed (nothing more is built), or at the process's end.
        build_lock.enter_context(sealed_when_built(builds, settings))
        proc = ChildProcess("harness.evaluation.child", ["--request", str(request_path)], cwd=home,
                            env=scrubbed_env(env, home), log_path=job / log_name,
                            kill_grace_s=settings.kill_grace_s,
                            jail=limits.jail(settings, untrusted=True, writable=[home, builds],
                                             readable=[exchange], visible=[spec.source_path]), fd_socket=True)
    except BaseException:
        build_lock.close()
        raise
    return Candidate(proc, obs, builds, build_lock, settings.kill_grace_s, source)


def start_eager(spec: ProblemSpec, options: EvalOptions, settings: Settings, target: Provenance, load: ProblemLoad,
                exchange: Path, home: Path, job: Path, overrides: dict[str, Any]) -> EagerProcess:
    """Eager's own process (eager_process.py), started as the candidate's is, untraced, with observations of its own;
    it imports at once. Its build dir is its home's: every evaluation of a problem at a size has the same eager source,
    and a shared build dir's lock, held until the process constructs its model (after its evaluation's judge), made the
    next evaluation's eager process, started ahead for a worker's next job, wait on the one before it, and the worker
    with it."""
    source = eager_process.eager_source(spec.source(), overrides)
    home.mkdir(mode=0o700, exist_ok=True)
    proc = start_candidate(spec, source, dataclasses.replace(options, kernel_trace=False), settings, target, load,
                           exchange, home, job, Observations(), log_name="eager.log", shared_build=False)
    proc.begin_import()
    return EagerProcess(proc)
