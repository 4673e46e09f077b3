"""Evaluate one submission against one problem: the parent side of the sandbox. No torch here.

Two children per evaluation, each started fresh with `python -m`, in its own process group and
temp dir, with a scrubbed environment:
  trusted  builds the reference, draws inputs from a secret seed, keeps the expected outputs,
           judges the candidate's saved outputs and times the reference;
  child    imports the submission (compiling its load_inline code), runs the trials, times itself.
The two start side by side when the device is known in advance (a worker's slot): the child imports
while the trusted side starts and prepares, and constructs the model only when the parent says the
parameters and inputs are written. The parent owns every deadline, kills whole process groups, and
grades from the figures.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import secrets
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import artifacts, grading, kernels, static_checks
from harness.config import Settings, get_settings
from harness.problems.spec import ProblemSpec
from harness.sandbox import capabilities, limits
from harness.sandbox.process import ChildExited, ChildProcess, Deadline, describe_returncode, scrubbed_env
from harness.sandbox.protocol import (
    CandidateRequest,
    CheckTimedCommand,
    ConstructCommand,
    JudgeCommand,
    PrepareCommand,
    ProblemLoad,
    TimeCommand,
    TimeReferenceCommand,
    TimingConfig,
    WarmupCommand,
)
from harness.schema import (
    ChildError,
    ChildExit,
    DeterminismFigures,
    EvalResult,
    FlagChange,
    KernelTrace,
    Observations,
    ProblemRef,
    Provenance,
    SpeedOfLight,
    StateDictCopy,
    StaticFinding,
    TimedOutputCheck,
    TimingEnvelope,
    TimingStats,
    Tolerance,
    TrialFigures,
)
from harness.submission import InvalidSubmission, check_constructor, extract
from harness.verdicts import Phase

log = logging.getLogger("harness.runner")

_PROBE_TIMEOUT_S = 120.0
_TIMED_CHECKS = 10  # timed calls whose outputs are re-checked, chosen at random after the calls


class _Phases:
    """Seconds per phase of one evaluation on the parent's clock, into `obs.phases`: each `end(name)` closes
    the phase that began where the previous one ended (a phase that runs twice adds up)."""

    def __init__(self, obs: Observations):
        self.obs = obs
        self.last = time.monotonic()

    def end(self, name: str, at: float | None = None) -> None:
        now = time.monotonic() if at is None else at
        self.obs.phases[name] = round(self.obs.phases.get(name, 0.0) + max(0.0, now - self.last), 4)
        self.last = now


@dataclass
class EvalOptions:
    device: str = "auto"  # auto | cpu | cuda
    size: str = "auto"  # auto (default on CUDA, small on CPU where the problem has one) or a size name
    tolerance: Tolerance | None = None  # the problem's own when None
    trials: int | None = None
    timing: bool = True
    compile_baseline: str | None = None  # auto | on | off; settings' when None
    warmup: int | None = None
    timed_calls: int | None = None
    compile_timeout_s: float | None = None  # the problem's own when None
    run_timeout_s: float | None = None
    seed: int | None = None  # fixes the secret seeds, for reproducing a run
    extra_env: dict[str, str] = field(default_factory=dict)
    # The device as a worker's slot probed it: with it, the candidate's process starts beside the trusted one
    # instead of after its probe (and starts again after it, if the trusted child finds something else).
    target: Provenance | None = None


class _Protocol:
    """The order the candidate's process must speak in. Its messages are claims; one out of order (a
    second timing report, a trial after trials_done, timing never asked for) is a sign that submission
    code wrote to the channel, and ends the evaluation as a protocol violation."""

    _ONCE = {"started", "imported", "constructed", "kernels", "trials_done", "warmed", "timing_started", "timing",
             "timed_outputs", "done", "invalid", "error"}
    _NEEDS = {"imported": "started", "constructed": "imported", "invalid": "imported", "trial": "constructed",
              "output_changed": "constructed", "inputs_mutated": "constructed", "kernels": "warmup_sent",
              "trials_done": "constructed", "warmed": "warmup_sent", "timing_started": "time_sent",
              "timing": "timing_started", "timed_outputs": "timing", "done": "trials_done"}
    _BEFORE_TRIALS_DONE = {"trial", "output_changed", "inputs_mutated"}
    _KNOWN = _ONCE | set(_NEEDS) | {"flag_change"}

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.trials = 0

    def check(self, event: str, fields: dict[str, Any]) -> str | None:
        if event not in self._KNOWN:
            return f"unknown message {event!r}"
        if event in self._ONCE and event in self.seen:
            return f"a second {event!r} message"
        need = self._NEEDS.get(event)
        if need is not None and need not in self.seen:
            return f"{event!r} before {need!r}"
        if event in self._BEFORE_TRIALS_DONE and "trials_done" in self.seen:
            return f"{event!r} after 'trials_done'"
        if event == "trial":
            if fields.get("trial") != self.trials:
                return f"trial {fields.get('trial')!r} reported where trial {self.trials} was due"
            self.trials += 1
        self.seen.add(event)
        return None


class _TrustedFailed(Exception):
    pass


class _Trusted:
    """The parent's handle on the trusted child."""

    def __init__(self, proc: ChildProcess, timeout_s: float):
        self.proc = proc
        self.timeout_s = timeout_s
        self.pending: tuple[str | None, float, float] = (None, 0.0, 0.0)  # command, deadline, limit

    def call(self, command: dict[str, Any], reply: str, timeout_s: float | None = None) -> dict[str, Any]:
        self.send(command, timeout_s)
        return self.wait(reply)

    def send(self, command: dict[str, Any], timeout_s: float | None = None) -> None:
        """Send a command without waiting for its answer (`wait` collects it); its time limit starts now."""
        limit = timeout_s or self.timeout_s
        self.pending = (command.get("cmd"), time.monotonic() + limit, limit)
        self.proc.send(command)

    def wait(self, reply: str) -> dict[str, Any]:
        """The answer to the command last sent."""
        cmd, deadline, limit = self.pending
        try:
            while True:
                msg = self.proc.next_message(deadline)
                if msg.event == reply:
                    return msg.fields
                if msg.event == "failed":
                    raise _TrustedFailed(msg.fields.get("traceback") or msg.fields.get("error", "unknown failure"))
        except Deadline:
            raise _TrustedFailed(f"no answer to {cmd!r} within {limit:g} s") from None
        except ChildExited:
            code = self.proc.wait_exit(5)
            raise _TrustedFailed(
                f"the trusted process ended (code {code}) during {cmd!r}:\n{self.proc.log_tail()}"
            ) from None


def evaluate(spec: ProblemSpec, text: str, options: EvalOptions | None = None,
             settings: Settings | None = None) -> EvalResult:
    options = options or EvalOptions()
    settings = settings or get_settings()
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    tolerance = options.tolerance or spec.tolerance
    job_id = artifacts.new_job_id()
    job = artifacts.job_dir(settings, job_id)
    (job / "submission.txt").write_text(text, errors="replace")
    obs = Observations()
    provenance: Provenance | None = None
    size = options.size
    try:
        sub = extract(text)
    except InvalidSubmission as e:
        sub = None
        obs.static_error = str(e)
    sha = sub.sha256 if sub else hashlib.sha256(text.encode(errors="replace")).hexdigest()

    if sub is not None:
        obs.static_findings = [StaticFinding(rule=f.rule, line=f.line, detail=f.detail)
                               for f in static_checks.check(sub.source)]
        try:
            provenance, size = _evaluate_source(spec, sub.source, options, settings, tolerance, obs, job)
        except Exception as e:  # the harness's own failure (disk full, a bug): a verdict, never a lost job
            obs.reference_error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    if size == "auto":
        size = "default"

    g = grading.grade(obs, tolerance)
    if provenance is not None:
        provenance.started_at = started_at
        provenance.wall_s = time.monotonic() - t0
    result = EvalResult(
        verdict=g.verdict, message=g.message, log_excerpt=g.log_excerpt, flags=g.flags,
        problem=ProblemRef(id=spec.id, version=spec.version, kernelbench_id=spec.kernelbench_id, size=size,
                           source=str(spec.source_path)),
        tolerance=tolerance, speedup_vs_eager=g.speedup_vs_eager, speedup_vs_compile=g.speedup_vs_compile,
        submission_sha256=sha, observations=obs, provenance=provenance, job_dir=str(job),
    )
    (job / "result.json").write_text(result.model_dump_json(indent=2))
    return result


def _evaluate_source(spec: ProblemSpec, source: str, options: EvalOptions, settings: Settings,
                     tolerance: Tolerance, obs: Observations, job: Path) -> tuple[Provenance | None, str]:
    """Run both children; fill `obs`. Returns the provenance and the size actually used.

    The candidate's process starts as soon as its target (device, arch, versions: what its build dir is keyed
    by) is known: at once when the caller gives it (`options.target`, a worker's probed slot), else right after
    the trusted child's probe. Its interpreter, torch and the submission's import then run while the trusted
    child starts and prepares the problem; it constructs the model only once told to, after the trusted side
    has written the parameters and inputs and the constructor check has passed.
    """
    rng = secrets.SystemRandom()
    seed = options.seed if options.seed is not None else rng.randrange(1 << 62)
    param_seed, input_seed, timing_seed = seed % 100_000 + 42, (seed * 7919) % (1 << 62), (seed * 104729) % (1 << 61)
    trials = options.trials or settings.correctness_trials
    size = options.size
    provenance: Provenance | None = None
    phases = _Phases(obs)
    candidate: _Candidate | None = None
    with artifacts.scratch_dir(settings) as work:
        trusted_home = work / "trusted"
        cand_home = work / "candidate"
        exchange = work / "exchange"
        for d in (trusted_home, cand_home, exchange):
            d.mkdir(mode=0o700)

        def resolve(device: str) -> tuple[str, ProblemLoad, TimingConfig | None]:
            chosen = size if size != "auto" else ("small" if device == "cpu" and "small" in spec.sizes else "default")
            timing_cfg = None
            if options.timing:
                timing_cfg = TimingConfig(
                    warmup=options.warmup if options.warmup is not None else settings.warmup_calls,
                    calls=options.timed_calls or (settings.timed_calls_cuda if device == "cuda"
                                                  else settings.timed_calls_cpu),
                )
            return chosen, ProblemLoad(path=spec.source_path, overrides=spec.size(chosen).overrides), timing_cfg

        def start_candidate(target: Provenance) -> _Candidate:
            _size, load, timing_cfg = resolve(target.device)
            return _Candidate(spec, source, options, settings, target, load, param_seed, timing_cfg, exchange,
                              cand_home, job)

        early = options.target is not None and options.device in ("auto", options.target.device)
        trusted_env = scrubbed_env({**trusted_cache_env(settings), **options.extra_env}, trusted_home)
        proc = ChildProcess("harness.sandbox.trusted", [], cwd=trusted_home, env=trusted_env,
                            log_path=job / "trusted.log",
                            kill_grace_s=settings.kill_grace_s, jail=limits.jail(settings, untrusted=False))
        trusted = _Trusted(proc, settings.reference_timeout_s)
        try:
            if early:
                assert options.target is not None
                candidate = start_candidate(options.target)
            proc.next_message(time.monotonic() + _PROBE_TIMEOUT_S)  # "ready": torch imported
            phases.end("reference_start")
            probed = trusted.call({"cmd": "probe", "device": options.device}, "probed", _PROBE_TIMEOUT_S)
            phases.end("probe")
            provenance = Provenance(started_at=datetime.now(timezone.utc), **probed)
            device = provenance.device
            if candidate is not None and options.target is not None:
                changed = _target_changes(options.target, provenance)
                if changed:  # its build dir is keyed by what this device is not: start it again for this one
                    log.warning("the slot's target is not what this evaluation's trusted child found (%s): the "
                                "candidate's process starts again for the device found", changed)
                    candidate.close()
                    candidate = None
            size, load, timing_cfg = resolve(device)
            trusted.send(PrepareCommand(problem=load, device=device, param_seed=param_seed, input_seed=input_seed,
                                        trials=trials, extra_distribution=spec.extra_distribution,
                                        exchange_dir=exchange).model_dump(mode="json"))
            if candidate is None:
                candidate = start_candidate(provenance)
            prepared_trials: list[int | None] = []
            distributions: list[str] = []

            def prepared() -> int | None:
                """Wait for the trusted side's preparation (once); the trial count, or None when the submission's
                constructor cannot take the problem's init arguments (obs.static_error says why)."""
                if not prepared_trials:
                    answer = trusted.wait("prepared")
                    phases.end("reference_prepare")
                    distributions.extend(answer.get("distributions") or ["get_inputs"] * trials)
                    obs.trials_expected = len(distributions)
                    try:
                        check_constructor(source, spec.init_arg_names[: answer["init_arg_count"]]
                                          if spec.init_arg_names else ["arg"] * answer["init_arg_count"])
                        prepared_trials.append(len(distributions))
                    except InvalidSubmission as e:
                        obs.static_error = str(e)
                        prepared_trials.append(None)
                return prepared_trials[0]

            def judge() -> bool:
                """Judge the saved outputs; True when the candidate has earned its timing run."""
                judged = trusted.call(JudgeCommand(outputs_dir=cand_home / "outputs", atol=tolerance.atol,
                                                   rtol=tolerance.rtol).model_dump(mode="json"), "judged")
                phases.end("judge")
                obs.trials = [TrialFigures.model_validate({**t, "inputs": distributions[t["trial"]]})
                              for t in judged["trials"]]
                if judged.get("determinism") is not None:
                    obs.determinism = DeterminismFigures.model_validate(judged["determinism"])
                return timing_cfg is not None and grading.correct_so_far(obs, tolerance)

            timed_prints = candidate.drive(obs, prepared, judge, timing_seed, phases)
            if prepared() is None:  # the constructor check failed: the candidate was stopped, or ended first
                return provenance, size
            check = obs.timed_outputs
            if check is not None and check.reported == check.expected and \
                    grading.correct_so_far(obs, tolerance):
                # Which timed calls are checked is decided only now, after they all ran.
                check.checked = sorted(random.sample(range(check.expected), min(_TIMED_CHECKS, check.expected)))
                checked = trusted.call(CheckTimedCommand(
                    timing_seed=timing_seed, indices=check.checked,
                    fingerprints=[timed_prints[i] for i in check.checked], atol=tolerance.atol, rtol=tolerance.rtol,
                ).model_dump(mode="json"), "timed_checked")
                check.mismatches = list(checked["mismatches"])
                phases.end("check_timed_outputs")
            # Time the reference only for a candidate that passed and was timed: most submissions are not.
            if timing_cfg is not None and obs.candidate_timing is not None and \
                    grading.correct_so_far(obs, tolerance):
                mode = options.compile_baseline or settings.compile_baseline
                timed = trusted.call(TimeReferenceCommand(
                    timing=timing_cfg, seed=timing_seed,
                    compile_baseline=(mode == "on" or (mode == "auto" and device == "cuda")),
                ).model_dump(mode="json"), "reference_timed")
                obs.eager_timing = TimingStats.model_validate(timed["eager"])
                if obs.envelope is not None:
                    obs.envelope.loop_ms = timed.get("loop_ms")
                if timed.get("peaks"):
                    variant = spec.size(size)
                    obs.speed_of_light = SpeedOfLight(flops=variant.flops, min_bytes=variant.min_bytes,
                                                      **timed["peaks"])
                if timed.get("compile"):
                    obs.compile_timing = TimingStats.model_validate(timed["compile"])
                obs.compile_baseline_error = timed.get("compile_error")
                phases.end("reference_timing")
        except (_TrustedFailed, ChildExited, ValidationError, KeyError) as e:
            obs.reference_error = f"{type(e).__name__}: {e}" if not isinstance(e, _TrustedFailed) else str(e)
        finally:
            if candidate is not None:
                candidate.close()  # whatever happened above: no candidate process or build lock outlives this
            with contextlib.suppress(ChildExited):
                proc.send({"cmd": "exit"})
            proc.wait_exit(settings.kill_grace_s)
            proc.reap()
            phases.end("teardown")
    return provenance, size


def _target_changes(target: Provenance, probed: Provenance) -> str:
    """What differs between a slot's probed target and what this evaluation's trusted child found, among what the
    candidate's process was started for: its device and the inputs of its build dir's key."""
    before = {"device": target.device, **_build_inputs(target)}
    after = {"device": probed.device, **_build_inputs(probed)}
    return "; ".join(f"{k} {before[k]!r} -> {after[k]!r}" for k in before if before[k] != after[k])


def trusted_cache_env(settings: Settings) -> dict[str, str]:
    """The shared torch.compile cache for the trusted child, where candidates cannot write to it: they run as
    a sandbox uid with the data dir hidden. Otherwise (no user switch: a candidate has the worker's own uid)
    nothing, so the trusted child compiles into its own scratch home as before and never loads compiled
    code a candidate could have left."""
    p = capabilities.platform()
    if p.user_switch and p.mountns and settings.sandbox_user != "off":
        return artifacts.compile_cache_env(settings)
    return {}


def _build_inputs(target: Provenance) -> dict[str, str | None]:
    """What a build dir's key takes from its target (artifacts.build_key's keyword arguments)."""
    return {"arch": target.compute_capability or "cpu", "torch_version": target.torch_version,
            "cuda_version": target.cuda_version, "python": target.python_version}


def _build_env(source: str, target: Provenance, settings: Settings, home: Path,
               extra_env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """The build dir for this source on this target, and the environment a build there needs."""
    key = artifacts.build_key(source, **_build_inputs(target))
    builds = artifacts.build_dir(settings, key) if settings.build_cache else home / "build"
    builds.mkdir(exist_ok=True)
    env = {"TORCH_EXTENSIONS_DIR": str(builds), "MAX_JOBS": str(max(1, (os.cpu_count() or 2)))}
    if target.compute_capability:
        env["TORCH_CUDA_ARCH_LIST"] = target.compute_capability  # build for this GPU only
    env.update(extra_env)
    return builds, env


def probe_device(device: str = "auto", settings: Settings | None = None,
                 extra_env: dict[str, str] | None = None) -> Provenance:
    """What a fresh child sees: device, GPU, torch/CUDA/Python versions. A worker asks once per slot."""
    settings = settings or get_settings()
    extra_env = extra_env or {}
    with artifacts.scratch_dir(settings) as work:
        proc = ChildProcess("harness.sandbox.trusted", [], cwd=work, env=scrubbed_env(extra_env, work),
                            log_path=work / "probe.log", kill_grace_s=settings.kill_grace_s)
        try:
            proc.next_message(time.monotonic() + _PROBE_TIMEOUT_S)
            probed = _Trusted(proc, _PROBE_TIMEOUT_S).call({"cmd": "probe", "device": device}, "probed")
            return Provenance(started_at=datetime.now(timezone.utc), **probed)
        except (Deadline, ChildExited) as e:
            raise RuntimeError(f"probing device {device!r} failed: {e}\n{proc.log_tail()}") from None
        except _TrustedFailed as e:
            raise RuntimeError(f"probing device {device!r} failed: {e}") from None
        finally:
            with contextlib.suppress(ChildExited):
                proc.send({"cmd": "exit"})
            proc.reap()


@dataclass
class PrecompileResult:
    ok: bool
    seconds: float
    log_tail: str


def precompile(text: str, target: Provenance, settings: Settings | None = None, *, timeout_s: float = 600.0,
               extra_env: dict[str, str] | None = None) -> PrecompileResult:
    """Warm the build cache for a submission on a CPU, ahead of its GPU evaluation.

    Imports the submission (which runs its load_inline builds) in a fresh child that sees no GPU,
    into the build dir its evaluation on `target` will use. The outcome decides nothing: a
    submission that needs the GPU at import fails here and simply compiles in its evaluation.
    """
    settings = settings or get_settings()
    t0 = time.monotonic()
    try:
        source = extract(text).source
    except InvalidSubmission as e:
        return PrecompileResult(False, 0.0, str(e))
    with artifacts.scratch_dir(settings) as home:
        builds, env = _build_env(source, target, settings, home, {"CUDA_VISIBLE_DEVICES": "", **(extra_env or {})})
        (home / "submission.py").write_text(source)
        finished = False
        with artifacts.exclusive_build_dir(builds):
            proc = ChildProcess("harness.sandbox.child", ["--compile-only", str(home / "submission.py")], cwd=home,
                                env=scrubbed_env(env, home), log_path=home / "precompile.log",
                                kill_grace_s=settings.kill_grace_s,
                                jail=limits.jail(settings, untrusted=True, writable=[home, builds]))
            try:
                while True:
                    msg = proc.next_message(proc.started_at + timeout_s)
                    if msg.event in ("imported", "error"):
                        finished = msg.event == "imported"
                        break
            except (Deadline, ChildExited):
                pass
            finally:
                proc.reap()
        return PrecompileResult(finished, time.monotonic() - t0, proc.log_tail(4096))


class _Candidate:
    """The candidate's process, started under its build dir's lock as soon as its target is known (its build dir
    is keyed by it), and driven once the evaluation is ready for it. `close` always ends it."""

    def __init__(self, spec: ProblemSpec, source: str, options: EvalOptions, settings: Settings, target: Provenance,
                 load: ProblemLoad, param_seed: int, timing_cfg: TimingConfig | None, exchange: Path, home: Path,
                 job: Path):
        self.settings, self.timing_cfg = settings, timing_cfg
        submission_path = home / "submission.py"
        submission_path.write_text(source)
        request = CandidateRequest(
            submission_path=submission_path, problem=load, device=target.device, param_seed=param_seed,
            exchange_dir=exchange, outputs_dir=home / "outputs", timing=timing_cfg,
        )
        request_path = home / "request.json"
        request_path.write_text(request.model_dump_json())
        self.builds, env = _build_env(source, target, settings, home, options.extra_env)
        self.compile_limit = options.compile_timeout_s or spec.compile_timeout_s
        self.run_limit = options.run_timeout_s or spec.run_timeout_s
        self.dismissed = False  # stopped by the harness before it constructed anything (invalid constructor)
        self.build_lock = contextlib.ExitStack()
        self.build_lock.enter_context(artifacts.exclusive_build_dir(self.builds))
        try:
            self.proc = ChildProcess("harness.sandbox.child", ["--request", str(request_path)], cwd=home,
                                     env=scrubbed_env(env, home), log_path=job / "candidate.log",
                                     kill_grace_s=settings.kill_grace_s,
                                     jail=limits.jail(settings, untrusted=True, writable=[home, self.builds],
                                                      readable=[exchange], visible=[spec.source_path]))
        except BaseException:
            self.build_lock.close()
            raise

    def close(self) -> None:
        """End the process (its whole group) and release the build dir. Idempotent."""
        self.proc.reap()
        self.build_lock.close()

    def drive(self, obs: Observations, prepared: Callable[[], int | None], judge: Callable[[], bool],
              timing_seed: int, phases: _Phases) -> list[Any]:
        """Speak with the candidate's process until it is done; fill `obs`. Returns the fingerprints of its timed
        calls' outputs. `prepared` is asked, when the candidate has imported, for the trial count (None: stop it)."""
        run_limit, timing_cfg = self.run_limit, self.timing_cfg
        exit_info = ChildExit(phase=Phase.compile, deadline_s=self.compile_limit)
        timed_prints: list[Any] = []
        channel_closed = False
        protocol = _Protocol()
        go_ahead_at: float | None = None
        deadline = self.proc.started_at + self.compile_limit
        try:
            while True:
                try:
                    msg = self.proc.next_message(deadline)
                except Deadline:
                    exit_info.timed_out = True
                    break
                except ChildExited:
                    channel_closed = True
                    break
                f = msg.fields
                violation = protocol.check(msg.event, f)
                if violation is not None:
                    obs.protocol_violations.append(violation)
                    break
                if msg.event == "imported":
                    obs.candidate_import_s = msg.received_at - self.proc.started_at
                    phases.end("candidate_import", msg.received_at)
                    trials = prepared()  # the trusted side's preparation and the constructor check
                    if trials is None:
                        self.dismissed = True
                        break
                    with contextlib.suppress(ChildExited):  # a vanished child shows in its exit status
                        self.proc.send(ConstructCommand(trials=trials).model_dump_json())
                    # The wait for the trusted side was the harness's, not the candidate's.
                    deadline += time.monotonic() - msg.received_at
                elif msg.event == "constructed":
                    phases.end("candidate_construct", msg.received_at)
                    self.build_lock.close()
                    obs.state_dict = StateDictCopy.model_validate(f.get("state_dict") or {})
                    exit_info.phase, exit_info.deadline_s = Phase.correctness, run_limit
                    deadline = msg.received_at + run_limit
                elif msg.event == "trials_done":
                    phases.end("candidate_trials", msg.received_at)
                    go = judge()
                    warm_seed = secrets.SystemRandom().randrange(1 << 61)  # tells nothing of the timed seed
                    with contextlib.suppress(ChildExited):  # a vanished child shows in its exit status
                        self.proc.send(WarmupCommand(seed=warm_seed).model_dump_json() if go else "exit")
                    if not go:
                        exit_info.finished = True
                        break
                    protocol.seen.add("warmup_sent")
                    deadline = time.monotonic() + run_limit
                elif msg.event == "warmed":
                    phases.end("candidate_warmup", msg.received_at)
                    go_ahead_at = time.monotonic()
                    with contextlib.suppress(ChildExited):
                        self.proc.send(TimeCommand(seed=timing_seed).model_dump_json())
                    protocol.seen.add("time_sent")
                elif msg.event == "timing_started":
                    exit_info.phase = Phase.timing
                elif msg.event == "flag_change":
                    obs.flag_changes.append(FlagChange.model_validate(f))
                elif msg.event == "timing":
                    phases.end("candidate_timing", msg.received_at)
                    obs.candidate_timing = TimingStats.model_validate(f)
                    if timing_cfg is not None and go_ahead_at is not None:
                        obs.envelope = TimingEnvelope(wall_ms=(msg.received_at - go_ahead_at) * 1e3,
                                                      calls=timing_cfg.calls, overhead_calls=min(timing_cfg.calls, 20))
                elif msg.event == "output_changed":
                    obs.outputs_changed.append("determinism re-run" if f.get("trial") is None else
                                               f"trial {f.get('trial')}")
                elif msg.event == "inputs_mutated":
                    where = "determinism re-run" if f.get("trial") is None else f"trial {f.get('trial')}"
                    obs.inputs_mutated.append(f"{where}: input(s) {f.get('inputs')}")
                elif msg.event == "kernels":
                    phases.end("candidate_kernel_trace", msg.received_at)
                    obs.kernels = KernelTrace(names=f.get("names"), error=f.get("error"))
                elif msg.event == "timed_outputs":
                    timed_prints.extend(f.get("fingerprints") or [])
                elif msg.event == "invalid":
                    obs.static_error = str(f.get("message", "ModelNew cannot be constructed"))
                    exit_info.finished = True
                    break
                elif msg.event == "error":
                    obs.candidate_error = ChildError.model_validate(f)
                    exit_info.finished = True
                    break
                elif msg.event == "done":
                    exit_info.finished = True
                    break
        except ValidationError as e:
            obs.candidate_error = ChildError(phase=exit_info.phase, exc_type="ProtocolError",
                                             message=f"malformed message from the candidate's process: {e}")
        finally:
            if exit_info.finished or channel_closed:
                # The pipe closes a moment before the process is reapable: let it end on its own.
                self.proc.wait_exit(self.settings.kill_grace_s + 10)
            self.proc.kill()
            code = self.proc.proc.returncode
            exit_info.returncode = code
            exit_info.signal = None if exit_info.finished else describe_returncode(code)
            if self.proc.killed_by_parent and not exit_info.timed_out and not exit_info.finished:
                exit_info.signal = f"{exit_info.signal or 'a signal'} from the harness (it closed its channel " \
                                   "but did not exit)"
            self.proc.reap()
            phases.end("candidate_exit")
        if self.dismissed:
            return []
        if self.proc.garbage_lines:
            obs.protocol_violations.append(f"{self.proc.garbage_lines} line(s) on the channel that are not harness "
                                           "messages")
        obs.candidate_exit = exit_info
        obs.log_tail = self.proc.log_tail()
        if obs.kernels is not None and obs.kernels.names is not None:
            obs.kernels.custom = kernels.custom_kernels(obs.kernels.names, kernels.extension_symbols(self.builds))
        if timing_cfg is not None and obs.candidate_timing is not None:
            obs.timed_outputs = TimedOutputCheck(reported=len(timed_prints), expected=timing_cfg.calls)
        return timed_prints
