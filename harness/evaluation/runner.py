"""Evaluate one submission against one problem: the parent side of the sandbox. No torch here.

Two children per evaluation, each started fresh with `python -m`, in its own process group and
temp dir, with a scrubbed environment:
  trusted  builds the reference, draws inputs from a secret seed, keeps the expected outputs, judges
           the candidate's outputs, and runs the reference's timed windows;
  child    imports the submission (compiling its load_inline code) and answers commands: construct,
           trials, timed windows, hand-overs of outputs, the kernel trace.
The submission owns the candidate's process, so every figure that ranks is the parent's: the time of a
window is the parent's clock from sending its seeds to the reply, and the outputs of timed calls are
picked after each window and judged element by element in the trusted process. `_evaluate_source` is the
whole sequence of phases and gates, top-down.
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
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness import artifacts, grading, static_checks
from harness.config import Settings, get_settings
from harness.evaluation import busy_core, eager_process, exchange_probe, gpu_sharing, starts, windows
from harness.evaluation.eager_process import EagerProcess
from harness.evaluation.handles import Candidate, CandidateStopped, Trusted, TrustedFailed, add_trusted_seconds
from harness.evaluation.options import EvalOptions
from harness.evaluation.prebuild import PROBE_TIMEOUT_S, build_inputs
from harness.evaluation.protocol import (
    EAGER_WINDOW_SEGMENT,
    Construct,
    JudgeCommand,
    LoadParameters,
    PrepareCommand,
    ProblemLoad,
    RunTrial,
    StageCommand,
    TakeCommand,
    Trace,
)
from harness.evaluation.reduced_size import SizingFailed
from harness.evaluation.rounds import RoundsPlan, TimedRounds
from harness.evaluation.warm import SpareCandidate, WarmTrusted
from harness.problems.spec import ProblemSpec
from harness.sandbox.process import ChildExited
from harness.schema import (
    DeterminismFigures,
    EvalResult,
    GpuMemoryAtFailure,
    KernelTrace,
    MemoryPlan,
    Observations,
    ProblemRef,
    Provenance,
    SpeedOfLight,
    StateDictCopy,
    StaticFinding,
    Tolerance,
    TrialFigures,
    TrivialOutput,
)
from harness.submission import InvalidSubmission, check_constructor, extract
from harness.verdicts import Phase, device_out_of_memory

log = logging.getLogger("harness.runner")

# Deadlines of the candidate's commands, from the reference's own time per call: a hang costs seconds, not the
# problem's whole run limit (which stays the ceiling). The floors leave room for lazy first-call work (CUDA
# context, cuBLAS handles, a Triton kernel's JIT) on the slowest host.
_CORRECTNESS_FLOOR_S = 30.0
_WINDOW_FLOOR_S = 10.0
_TRACE_FLOOR_S = 30.0  # CUPTI let go and the process's objects searched for Triton's compiled kernels
_HEADROOM = 50.0  # times the reference's time per call
# Writing outputs to the scratch disk is paid on top, at this pessimistic rate: a problem at its own size saves
# gigabytes of trial outputs (KernelBench's level2/19: 7 of 2.2 GB), which no headroom over its calls covers.
_SLOW_WRITE_BYTES_PER_S = 100e6


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


def evaluate(spec: ProblemSpec, text: str, options: EvalOptions | None = None,
             settings: Settings | None = None) -> EvalResult:
    options = options or EvalOptions()
    settings = settings or get_settings()
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    tolerance = options.tolerance or spec.tolerance_at(options.precision)
    pool = options.trusted_pool
    spare = pool.take_spare(starts.spare_key(spec, text, options)) if pool is not None else None
    job_id = spare.job_id if spare is not None else artifacts.new_job_id()
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
            provenance, size = _evaluate_source(spec, sub.source, options, settings, tolerance, obs, job, spare)
        except Exception as e:  # the harness's own failure (disk full, a bug): a verdict, never a lost job
            obs.reference_error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    elif spare is not None:  # started for this very text, which extracted then: not reached, but never leaked
        spare.close(keep_job=True)
    overrides: dict[str, Any] = {}
    if size == "auto":  # nothing ran (an invalid submission): no size was used
        size = "n/a"
    elif provenance is not None:
        with contextlib.suppress(SizingFailed, OSError, KeyError):  # the evaluation's error says why none was
            overrides = starts.size_overrides(spec, size, settings)

    g = grading.grade(obs, tolerance)
    if provenance is not None:
        provenance.started_at = started_at
        provenance.wall_s = time.monotonic() - t0
    result = EvalResult(
        **g.result_fields(),
        problem=ProblemRef(id=spec.id, version=spec.version, kernelbench_id=spec.kernelbench_id, size=size,
                           overrides=overrides, source=str(spec.source_path), precision=options.precision),
        tolerance=tolerance, submission_sha256=sha, observations=obs, provenance=provenance, job_dir=str(job),
    )
    (job / "result.json").write_text(result.model_dump_json(indent=2))
    return result


def _evaluate_source(spec: ProblemSpec, source: str, options: EvalOptions, settings: Settings,
                     tolerance: Tolerance, obs: Observations, job: Path,
                     spare: SpareCandidate | None = None) -> tuple[Provenance | None, str]:
    """Run both children through the phases; fill `obs`. Returns the provenance and the size actually used.

    The candidate's process starts as soon as its target (device, arch, versions: what its build dir is keyed
    by) is known: ahead of the evaluation (`spare`, see `starts.prestart`), at once when the caller gives it
    (`options.target`, a worker's probed slot), else right after the trusted child's probe. It imports while the
    trusted child prepares the problem. It constructs the model once the init arguments are written and the constructor
    check has passed, while the trusted side builds the reference and draws the parameters, and takes them while the
    trusted side goes on to the trials' inputs and outputs.
    """
    ev = _Evaluation(spec, source, options, settings, tolerance, obs, job, spare)
    with artifacts.scratch_dir(settings, spare.work if spare is not None else None) as work, ev.open(work):
        try:
            ev.start()
            ev.prepare()
            ev.candidate_imported()
            if not ev.constructor_fits():
                return ev.provenance, ev.size
            ev.construct()
            prepared = ev.prepared()
            ev.ready_eager()  # beside the trials and the judge
            ev.run_trials()
            if ev.judge() and options.timing:  # only a candidate judged correct is timed
                rounds = ev.timed_rounds(prepared)
                rounds.run()
                ev.speed_of_light(prepared)
                rounds.compare_handovers()  # beside the candidate's trace and exit
                ev.trace_kernels()
            ev.end_candidate()
            ev.handovers_judged()
        except CandidateStopped:
            pass  # why is in obs: the grade says what it means
        except (TrustedFailed, ChildExited, ValidationError, KeyError, SizingFailed) as e:
            ev.keep_trusted = False
            obs.reference_error = f"{type(e).__name__}: {e}" if not isinstance(e, TrustedFailed) else str(e)
            ev.trusted_out_of_memory(obs.reference_error)
    return ev.provenance, ev.size


class _Evaluation:
    """One evaluation's state and its phases, each a method that `_evaluate_source` calls in order."""

    def __init__(self, spec: ProblemSpec, source: str, options: EvalOptions, settings: Settings,
                 tolerance: Tolerance, obs: Observations, job: Path, spare: SpareCandidate | None = None):
        self.spec, self.source, self.options, self.settings = spec, source, options, settings
        self.tolerance, self.obs, self.job, self.spare = tolerance, obs, job, spare
        seed = options.seed if options.seed is not None else secrets.randbelow(1 << 62)
        self.param_seed, self.input_seed = seed % 100_000 + 42, (seed * 7919) % (1 << 62)
        self.draw_seed = (seed * 15485863) % (1 << 62)  # the fresh parameters'; param_seed builds the models
        # Window seeds: from the OS unless the caller fixed the evaluation's seed (reproducing a run).
        self._window_seeds = secrets.SystemRandom() if options.seed is None else \
            random.Random(seed * 104729)  # noqa: S311 - a run reproduced on purpose: its seeds are no secret
        self.trials = options.trials or settings.correctness_trials
        self.size = options.size
        self.provenance: Provenance | None = None
        self.phases = _Phases(obs)
        self.candidate: Candidate | None = None
        self.eager: EagerProcess | None = None  # eager's own process (eager_process.py), where one was started
        self.eager_commands: tuple[Construct, LoadParameters] | None = None  # what it builds its model with
        self.trusted: Trusted | None = None
        self.warm: WarmTrusted | None = None  # the trusted process as its pool keeps it, where there is a pool
        self.keep_trusted = True  # False once the trusted side failed: it serves no other evaluation
        self.run_limit = options.run_timeout_s or spec.run_timeout_s
        self.call_ms = 0.0  # the reference's time per call, once prepared
        self.output_bytes = 0  # the reference's outputs' bytes per call, once prepared
        self.forward_seeds: list[int] = []  # the trials', from the trusted side
        self.init_arg_count = 0  # the Model's init arguments, once the trusted side wrote them
        self.preparing = False  # the trusted side is still making the trials' inputs and outputs
        self.rounds: TimedRounds | None = None  # once the candidate is timed
        self.exchange_device = "cpu"  # where the exchange's segments live (the prepare decides)
        self.distributions: list[str] = []
        self.parameters_drawn: list[str] = []  # the reference's tensors drawn fresh, from the trusted side
        self.init_args: tuple[dict[str, Any], list[dict[str, Any]]] = ({}, [])  # layout, segments: for Construct
        self.trial_segments: list[dict[str, Any]] = []  # named by the first trial's command
        self.gpu_memory: gpu_sharing.DeviceMemories = gpu_sharing.nvml_device_memory

    @contextlib.contextmanager
    def open(self, work: Path):
        """The scratch layout; on the way out, whatever happened, no child or build lock outlives the evaluation."""
        self.trusted_home, self.cand_home, self.exchange = starts.scratch_layout(work)
        self.eager_home = work / "eager"  # made where eager's own process starts (`_start_eager`)
        try:
            yield self
        except BaseException:
            self.keep_trusted = False
            raise
        finally:
            if self.candidate is not None:
                self.candidate.finish()
                self.phases.end("candidate_exit")
            if self.eager is not None:
                self.eager.finish()
            self._end_trusted()
            self.phases.end("teardown")

    def _end_trusted(self) -> None:
        """The trusted process goes back to its pool, warm, if it served this evaluation to the end; else it ends.
        One still preparing (the candidate failed while it made the trials' inputs and reference outputs) is ended
        at once: that work serves this evaluation alone, whose verdict is known, and at full size it takes minutes
        (an import NameError waited 139.8 s for it). Out of step with the commands, it is never kept: the pool
        starts a fresh one for the next evaluation. One comparing the hand-overs (the evaluation cut short after
        the timed rounds) is let finish: a few calls' outputs, and the warm process stays in step."""
        if self.trusted is not None and self.preparing:
            self.keep_trusted = False
            self.trusted.proc.kill()
        if self.rounds is not None and self.keep_trusted:
            try:
                self.rounds.settle()
            except TrustedFailed:
                self.keep_trusted = False
        if self.warm is not None:
            with contextlib.suppress(OSError):
                (self.job / "trusted.log").write_bytes(self.warm.log_since_taken())
            pool = self.options.trusted_pool
            if self.keep_trusted and pool is not None:
                pool.keep(self.warm)
            else:
                self.warm.close()
        elif self.trusted is not None:
            with contextlib.suppress(ChildExited):
                self.trusted.proc.send({"cmd": "exit"})
            self.trusted.proc.wait_exit(self.settings.kill_grace_s)
            self.trusted.proc.reap()

    # --- the phases, in order ---------------------------------------------------------------------------

    def start(self) -> None:
        """The trusted child, warm from the slot's pool where it has one for this problem; else one the pool started
        ahead for it (`starts.prestart_trusted`), or one started now, and probed (with a known target, the candidate's
        process starts beside it)."""
        o = self.options
        pool = o.trusted_pool
        key = starts.trusted_key(self.spec, o, self.settings)
        self.warm = pool.take(key) if pool is not None else None
        if self.spare is not None:  # started ahead for this evaluation, with its target: it imports now
            self.candidate, self.spare.candidate.obs = self.spare.candidate, self.obs
            self.eager = self.spare.eager  # and eager's own process, where one was started beside it
            self.obs.candidate_ahead = True
            self.candidate.begin_import()
        if self.warm is not None and self.warm.probed:
            # Both sides build their model under the seed the warm reference was built with (KernelBench's rule).
            self.trusted, self.param_seed, probed = self.warm.trusted, self.warm.model_seed, self.warm.probed
            if self.candidate is None and o.target is not None and o.device in ("auto", o.target.device):
                self.candidate = self._start_candidate(o.target)
            self.phases.end("reference_start")
        else:
            if self.warm is not None:  # started ahead (starts.prestart_trusted): it builds this evaluation's Model
                self.trusted, self.warm.model_seed = self.warm.trusted, self.param_seed
                self.obs.trusted_ahead = True
            else:
                home = pool.home() if pool is not None else self.trusted_home
                log_path = home / "trusted.log" if pool is not None else self.job / "trusted.log"
                self.trusted = starts.start_trusted(self.spec, o, self.settings, home, log_path)
                if pool is not None:
                    pool.started += 1
                    self.warm = WarmTrusted(key, self.trusted, {}, self.param_seed, home, log_path,
                                            self.settings.kill_grace_s)
            if self.candidate is None and o.target is not None and o.device in ("auto", o.target.device):
                self.candidate = self._start_candidate(o.target)
            self.trusted.proc.next_message(time.monotonic() + PROBE_TIMEOUT_S)  # "ready": torch imported
            self.phases.end("reference_start")
            probed = self.trusted.call({"cmd": "probe", "device": o.device}, "probed", PROBE_TIMEOUT_S)
            self.phases.end("probe")
            if self.warm is not None:
                self.warm.probed = probed
        self.obs.trusted_warm = self.warm is not None and self.warm.evaluations > 0
        self.provenance = Provenance(started_at=datetime.now(timezone.utc), **probed)
        if self.candidate is not None and o.target is not None:
            changed = _target_changes(o.target, self.provenance)
            if changed:  # its build dir is keyed by what this device is not: start it again for this one
                log.warning("the slot's target is not what this evaluation's trusted child found (%s): the "
                            "candidate's process starts again for the device found", changed)
                self.candidate.dismissed = True
                self.candidate.finish()
                self.candidate = None

    def prepare(self) -> None:
        """The trusted side writes the init arguments, then builds the reference and writes its parameters, while the
        candidate imports and constructs; it goes on to the trials' inputs and outputs (`prepared` waits for them)."""
        assert self.trusted is not None and self.provenance is not None
        device = self.provenance.device
        self.size = self._size_for(device)
        exchange_device = self.exchange_device = self._exchange_device(device)
        self.trusted.send(PrepareCommand(
            problem=self._load(self.size), device=device, param_seed=self.param_seed, draw_seed=self.draw_seed,
            input_seed=self.input_seed,
            trials=self.trials, extra_distribution=self.spec.extra_distribution,
            fresh_parameters=self.options.fresh_parameters, fixed_parameters=self.spec.fixed_parameters,
            atol=self.tolerance.atol, rtol=self.tolerance.rtol,
            memory_budget=(self.settings.device_memory_budget_mb << 20) or None,
            memory_reserve=self.settings.device_memory_reserve_mb << 20, exchange_device=exchange_device,
            windows_staged=self._windows_staged(device),
        ).model_dump(mode="json"))
        if self.candidate is None:
            self.candidate = self._start_candidate(self.provenance)
        self._start_eager(device)
        if device == "cuda":
            self.candidate.device_memory = self._device_memory
            self.obs.memory_reserve_bytes = self.settings.device_memory_reserve_mb << 20
        self.preparing = True
        written = self.trusted.wait("init_args_written", final=False).fields
        self.init_arg_count = int(written["init_arg_count"])
        self.init_args = written["init_args"], self._relay(written, eager=True)
        self.phases.end("reference_init")

    def _start_eager(self, device: str) -> None:
        """Eager's own process (eager_process.py), where the settings ask for one on this device and the evaluation is
        timed; it imports beside the candidate (and builds its model beside the trials: `ready_eager`). Said in the
        observations either way. With staged windows it takes its windows' inputs from a window segment of its own, as
        the candidate does from the candidate's."""
        if not starts.eager_wanted(self.options, self.settings, device):
            return
        if self.eager is not None:
            return  # started ahead beside the candidate (starts.prestart)
        assert self.provenance is not None
        try:
            overrides = starts.size_overrides(self.spec, self.size, self.settings)
        except (SizingFailed, OSError, KeyError) as e:  # the sizes its source would name: eager stays where it was
            self.obs.eager_process_note = f"the sizes for eager's own source are not known: {e}"[:2000]
            return
        self.eager = starts.start_eager(self.spec, self.options, self.settings, self.provenance, self._load(self.size),
                                        self.exchange, self.eager_home, self.job, overrides)

    def _device_memory(self) -> GpuMemoryAtFailure:
        """The evaluation's GPU's memory now, whose it is (read when the candidate runs out of device memory)."""
        assert self.trusted is not None and self.candidate is not None
        own = self.trusted.processes() + (self.eager.processes() if self.eager is not None else [])
        return gpu_sharing.memory_at_failure(self.gpu_memory, own, self.candidate.processes())

    def trusted_out_of_memory(self, error: str) -> None:
        """Where the trusted side ran out of device memory beside a candidate, the GPU's memory now, whose it is: the
        candidate, paused, still holds what it held then (grading decides whose failure it was)."""
        if self.candidate is not None and self.candidate.device_memory is not None and \
                device_out_of_memory("", error) is not None:
            self.obs.gpu_memory_at_failure = self._device_memory()

    def _idle_processes(self) -> list[int]:
        """The slot's own processes that run nothing now (its pool's), which a GPU's list of processes names beside
        this evaluation's: not other work (gpu_sharing.sharing)."""
        pool = self.options.trusted_pool
        return pool.idle_processes() if pool is not None else []

    def _windows_staged(self, device: str) -> bool:
        """Whether the timed windows take their inputs from the window segment (Settings.windows_staged), which
        they can only where it lives on the evaluation's device: a CUDA evaluation exchanging through host memory
        would copy them to the device inside each window."""
        return self.settings.windows_staged(device) and self.exchange_device == device

    def _exchange_device(self, device: str) -> str:
        """Where this evaluation's trial segments live (exchange_probe.choose: device memory on CUDA only where the
        setting says so or this process's probe of this GPU passed), recorded in the observations."""
        assert self.provenance is not None
        key = (device, self.provenance.device_name, self._visible())
        where, self.obs.exchange_memory = exchange_probe.choose(self.settings.exchange_memory, device, key,
                                                                self._probe_exchange)
        return where

    def _visible(self) -> str:
        """The GPUs this evaluation's children see (CUDA_VISIBLE_DEVICES as they get it)."""
        return self.options.extra_env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))

    def _probe_exchange(self) -> str | None:
        """This process's probe of its GPU's device segments, through this evaluation's trusted process (in step:
        nothing is prepared yet) and a child confined as the candidate is; its cost a phase of its own."""
        assert self.trusted is not None
        outcome = exchange_probe.run(self.trusted, self.settings, self.cand_home.parent / "exchange_probe",
                                     self.job / "exchange_probe.log", self.options.extra_env)
        self.phases.end("exchange_probe")
        return outcome.failure

    def prepared(self) -> dict[str, Any]:
        """The trials' inputs and expected outputs, made by the trusted side while the candidate constructed."""
        assert self.trusted is not None and self.candidate is not None
        prepared = self.trusted.wait("prepared").fields
        self.preparing = False
        self._memory_plan(prepared)
        add_trusted_seconds(self.obs, "prepare", prepared)
        self.call_ms = float(prepared["call_ms"])
        self.output_bytes = int(prepared["output_bytes"])
        self.forward_seeds = list(prepared["forward_seeds"])
        self.obs.stochastic_reference = bool(prepared["stochastic"])
        self.parameters_drawn = list(prepared.get("parameters_drawn") or [])
        self.obs.state_dict = self.obs.state_dict.model_copy(update={"drawn": self.parameters_drawn}) \
            if self.obs.state_dict is not None else None
        self.distributions = list(prepared.get("distributions") or ["get_inputs"] * self.trials)
        self.obs.trials_expected = len(self.distributions)
        self.trial_segments = self._relay(prepared)  # the inputs, output and hand-over segments: the first trial's
        self.phases.end("reference_prepare")
        return prepared

    def _memory_plan(self, prepared: dict[str, Any]) -> None:
        """The trusted side's memory plan, into the observations; a problem too large for the device's memory ends
        the evaluation here, before the candidate's first trial: the harness's limit (infra_error), with the plan's
        figures, never the submission's."""
        plan = MemoryPlan.model_validate(prepared["memory_plan"])
        self.obs.memory_plan = plan
        if not plan.fits:
            if self.candidate is not None and self.candidate.device_memory is not None:
                # The plan counted what the candidate held then as taken: whose it was decides whose limit this is.
                self.obs.gpu_memory_at_failure = self._device_memory()
            raise TrustedFailed(f"the evaluation does not fit on the device: {plan.message}")

    def _planned_calls(self, calls: int) -> int:
        """Calls per timed window within the memory plan's."""
        plan = self.obs.memory_plan
        return min(calls, plan.calls_per_window) if plan is not None else calls

    def candidate_imported(self) -> None:
        assert self.candidate is not None
        self.candidate.await_imported(self.options.compile_timeout_s or self.spec.compile_timeout_s,
                                      self.settings.import_idle_timeout_s)
        self.phases.end("candidate_import")

    def constructor_fits(self) -> bool:
        """The submission's constructor can take the problem's init arguments (read from its source)."""
        n = self.init_arg_count
        try:
            check_constructor(self.source, self.spec.init_arg_names[:n] if self.spec.init_arg_names else ["arg"] * n)
            return True
        except InvalidSubmission as e:
            self.obs.static_error = str(e)
            assert self.candidate is not None
            self.candidate.dismissed = True
            return False

    def construct(self) -> None:
        """The candidate constructs its model while the trusted side builds the reference and draws and writes its
        parameters; then it takes them."""
        assert self.candidate is not None and self.trusted is not None
        layout, init_segments = self.init_args
        try:
            self.candidate.request(Construct(param_seed=self.param_seed, init_args=layout, segments=init_segments),
                                   self.run_limit, Phase.compile)
        except CandidateStopped:
            err = self.obs.candidate_error
            if err is not None and device_out_of_memory(err.exc_type, err.message) is not None:
                # Whose failure it was counts the reference's parameters (grading), written once it is built.
                with contextlib.suppress(TrustedFailed):
                    self._parameters_written()
            raise
        self.candidate.release_build.close()  # constructed: nothing more is built
        self.phases.end("candidate_construct")
        if self.options.built is not None:
            self.options.built()
        written = self._parameters_written()
        segments = self._relay(written, eager=True)
        self.phases.end("reference_parameters")
        reply = self.candidate.request(LoadParameters(state_dict=written["state_dict"], segments=segments),
                                       self.run_limit, Phase.compile)
        self.obs.state_dict = StateDictCopy.model_validate(reply.fields.get("state_dict") or {})
        self.phases.end("candidate_parameters")
        # Eager's own process builds the same model with the same parameters beside the candidate's trials and the
        # judge (`ready_eager`).
        self.eager_commands = (Construct(param_seed=self.param_seed, init_args=layout, segments=init_segments),
                               LoadParameters(state_dict=written["state_dict"], segments=segments))

    def _parameters_written(self) -> dict[str, Any]:
        """The trusted side's parameters, once written (the reference is built beside the candidate's construct),
        their bytes in the observations."""
        assert self.trusted is not None
        written = self.trusted.wait("parameters_written", final=False).fields
        self.obs.reference_parameter_bytes = int(written["parameter_bytes"])
        return written

    def run_trials(self) -> None:
        """One trial at a time (then trial 0's inputs again): the trusted side stages its inputs, the candidate runs
        it and packs its output, the trusted side copies that out and judges it. The exchange holds one trial."""
        assert self.candidate is not None and self.trusted is not None
        self.obs.outputs_changed, self.obs.inputs_mutated = [], []
        for i in [*range(self.obs.trials_expected), None]:
            staged = self.trusted.call(StageCommand(trial=i or 0).model_dump(mode="json"), "staged")
            segments, self.trial_segments = self.trial_segments, []
            f = self.candidate.request(RunTrial(trial=i, forward_seed=self.forward_seeds[i or 0],
                                                inputs=staged["layout"], segments=segments),
                                       self._limit(_CORRECTNESS_FLOOR_S, 1), Phase.correctness).fields
            name = "determinism re-run" if i is None else f"trial {i}"
            if f["output_changed"]:
                self.obs.outputs_changed.append(name)
            if f["inputs_mutated"]:
                self.obs.inputs_mutated.append(f"{name}: input(s) {f['inputs_mutated']}")
            # Taken while it is paused (until its next command): what it writes into the segments after its reply,
            # it writes over a copy already taken, or over the next trial's, which it packs anew.
            self.candidate.pause()
            taken = self.trusted.call(TakeCommand(trial=i, layout=f.get("output"), atol=self.tolerance.atol,
                                                  rtol=self.tolerance.rtol).model_dump(mode="json"), "taken")
            add_trusted_seconds(self.obs, "take", taken)
        self.phases.end("candidate_trials")

    def judge(self) -> bool:
        """The trusted side judges the saved outputs. True when the candidate has earned its timing."""
        assert self.trusted is not None and self.candidate is not None
        judged = self.trusted.call(JudgeCommand(atol=self.tolerance.atol, rtol=self.tolerance.rtol
                                                ).model_dump(mode="json"), "judged")
        add_trusted_seconds(self.obs, "judge", judged)
        self.phases.end("judge")
        self.obs.trials = [TrialFigures.model_validate({**t, "inputs": self.distributions[t["trial"]]})
                           for t in judged["trials"]]
        if judged.get("determinism") is not None:
            self.obs.determinism = DeterminismFigures.model_validate(judged["determinism"])
        self.obs.trivial_outputs = [TrivialOutput.model_validate(t) for t in judged.get("trivial") or []]
        return grading.correct_so_far(self.obs, self.tolerance)

    def timed_rounds(self, prepared: dict[str, Any]) -> TimedRounds:
        """The timed rounds (rounds.py), planned from the reference's figures and the settings: windows of about the
        device's target length, as many rounds as the options or settings ask, torch.compile timed where asked."""
        assert self.trusted is not None and self.candidate is not None and self.provenance is not None
        device = self.provenance.device
        window_ms = self.settings.window_ms_cuda if device == "cuda" else self.settings.window_ms_cpu
        io_bytes = prepared["output_bytes"] + prepared["input_bytes"]
        mode = self.options.compile_baseline or self.settings.compile_baseline
        compiled = mode == "on" or (mode == "auto" and device == "cuda")
        # On the CPU the rounds run on one core where the candidate can be held there (windows.timing_core).
        holdable = device == "cpu" and self.candidate.can_keep_to()
        core = windows.timing_core(self.settings.timing_core, device, self._visible(), held=holdable)
        held = holdable and core is not None
        plan = RoundsPlan(
            device=device, window_ms=window_ms,
            rounds=self.options.windows or (self.settings.timing_windows_cuda if device == "cuda"
                                            else self.settings.timing_windows_cpu),
            kinds=("candidate", "eager", "empty") + (("compile",) if compiled else ()),
            calls=self._planned_calls(windows.calls_per_window(prepared["call_ms"], io_bytes, device,
                                                               window_ms, prepared["window_cost_ms"])),
            most_calls=self._planned_calls(windows.most_calls(io_bytes, device)), output_bytes=prepared["output_bytes"],
            call_overhead_ms=prepared["window_cost_ms"], fixed_cost_factor=self.settings.window_fixed_cost_factor,
            tolerance=self.tolerance, idle_wait_s=self.settings.gpu_idle_wait_s, traced=self._traces(),
            staged=self._windows_staged(device), lead_in_ms=self.settings.window_lead_in_ms,
            core=core, held=held, busy_core=busy_core.busy_core(self.settings.busy_core, device, core),
            # Rounds asked for by number (options.windows) run every one, and no more.
            least_rounds=None if self.options.windows else self.settings.timing_windows_least,
            known_to=0.0 if self.options.windows else self.settings.timing_known_to,
            extra_rounds=0 if self.options.windows else (self.settings.timing_windows_extra_cuda if device == "cuda"
                                                         else self.settings.timing_windows_extra_cpu),
            rank_known_to=self.settings.timing_rank_known_to,
            warmup_rounds=self.settings.timing_warmup_rounds,
            settle_rounds=self.settings.timing_warmup_settle_rounds,
            retime=self.settings.timing_retime_sized_down)
        eager = self._eager_for_rounds()
        self.rounds = TimedRounds(plan, self.trusted, self.candidate, self.obs, eager=eager,
                                  deadline=lambda calls, write_bytes: self._limit(_WINDOW_FLOOR_S, calls, write_bytes),
                                  seeds=self._window_seeds,
                                  phase=self.phases.end, relay=self._relay_window,
                                  idle_processes=self._idle_processes)
        return self.rounds

    def ready_eager(self) -> None:
        """Eager's own process, where one was started and the memory plan leaves room for it (eager_process.fits),
        imported, built with the candidate's parameters and its first calls made in a thread of the parent's, beside
        the candidate's trials and the judge (`EagerProcess.begin_ready`); else it ends here and the trusted process
        times eager."""
        if self.eager is None:
            return
        assert self.provenance is not None and self.eager_commands is not None
        if not eager_process.fits(self.obs.memory_plan, staged=self._windows_staged(self.provenance.device)):
            self.eager.finish()
            self.eager, self.obs.eager_process_note = None, eager_process.NO_ROOM
            return
        draw = self._window_seeds
        self.eager.begin_ready(self.eager_commands, self.options.compile_timeout_s or self.spec.compile_timeout_s,
                               self.settings.import_idle_timeout_s, self.run_limit,
                               (draw.randrange(1 << 62), draw.randrange(1 << 62), draw.randrange(1 << 62)),
                               (self.tolerance.atol, self.tolerance.rtol))

    def _eager_for_rounds(self) -> EagerProcess | None:
        """Eager's own process for the timed rounds, once ready (`ready_eager`); None: the trusted process times
        eager."""
        if self.eager is None:
            self.obs.eager_process = "trusted"
            return None
        self.eager.await_ready()
        self.phases.end("eager_ready")
        self.obs.eager_process = "own"
        return self.eager

    def speed_of_light(self, prepared: dict[str, Any]) -> None:
        """On CUDA, the GPU's measured peaks beside the problem's FLOP and byte counts: the floor no time may beat."""
        assert self.trusted is not None and self.provenance is not None
        if self.provenance.device == "cuda":
            peaks = self.trusted.call({"cmd": "peaks"}, "peaks")
            variant = self.spec.size(self.size)
            # Every output element must be written: its bytes are a floor even where the problem names none.
            min_bytes = max(variant.min_bytes_at(self.options.precision) or 0, prepared["output_bytes"])
            self.obs.speed_of_light = SpeedOfLight(flops=variant.flops, min_bytes=min_bytes, **peaks)
        self.phases.end("peaks")

    def handovers_judged(self) -> None:
        """The hand-overs read during the timed rounds and left to compare, compared: the trusted side did so while
        the candidate's process was traced and ended."""
        if self.rounds is not None and self.rounds.handovers_compared():
            self.phases.end("handovers")

    def _traces(self) -> bool:
        assert self.provenance is not None
        return starts.traces_kernels(self.provenance.device, self.source, self.options)

    def trace_kernels(self) -> None:
        """After the timed rounds (one of whose windows was traced as it ran): CUPTI let go in the candidate's process,
        and the handles of the kernels its build and its own @triton.jit functions define asked for. A source that can
        launch no kernel of its own was not traced, and is marked so."""
        assert self.candidate is not None and self.provenance is not None
        if self.provenance.device != "cuda" or not self.options.kernel_trace:
            return
        if not self._traces():
            self.obs.kernels = KernelTrace(names=[], from_source=True)
            return
        reply = self.candidate.request(Trace(), self._limit(_TRACE_FLOOR_S, 1), Phase.timing)
        self.candidate.record_trace(reply.fields)
        self.phases.end("kernel_trace")

    def end_candidate(self) -> None:
        """The harness has all it asks of the candidate: its process exits on its own, and is ended."""
        assert self.candidate is not None
        self.candidate.stop()
        if self.eager is not None:  # both told first: their CUDA contexts' teardowns go on side by side
            self.eager.stop()
        self.candidate.finish()
        if self.eager is not None:
            self.eager.finish()
        self.phases.end("candidate_exit")

    # --- helpers -------------------------------------------------------------------------------------------

    def _relay(self, fields: dict[str, Any], eager: bool = False) -> list[dict[str, Any]]:
        """The exchange's segments a trusted message names (`segments`): their descriptors, sent by the trusted side
        just before it, passed on to the candidate's process, which takes them with the command that names them (the
        specs returned); with `eager`, to eager's own process too (the init arguments and the parameters, which it
        takes with the same commands). Nothing is kept here: the parent never maps trial data."""
        return self._pass_on(fields, lambda spec: (True, eager))

    def _relay_window(self, fields: dict[str, Any]) -> list[dict[str, Any]]:
        """The window segments a trusted reply names, each to its own process: eager's (EAGER_WINDOW_SEGMENT) to
        eager's own process alone, the candidate's to the candidate's alone. The candidate never maps eager's: it
        holds each round's inputs before eager's window."""
        return self._pass_on(fields, lambda spec: (spec["name"] != EAGER_WINDOW_SEGMENT,
                                                   spec["name"] == EAGER_WINDOW_SEGMENT))

    def _pass_on(self, fields: dict[str, Any], to: Callable[[dict[str, Any]], tuple[bool, bool]]
                 ) -> list[dict[str, Any]]:
        """The descriptors of the segments `fields` names, received from the trusted side and sent on as `to(spec)`
        says: (to the candidate's process, to eager's own). Their specs."""
        assert self.trusted is not None and self.candidate is not None
        specs = list(fields.get("segments") or [])
        if not specs:  # an empty message would be taken for the next command's descriptors
            return []
        fds = self.trusted.proc.receive_fds(len(specs))
        try:
            children = [self.candidate.proc, self.eager.proc.proc if self.eager is not None else None]
            for i, child in enumerate(children):
                sent = [fd for spec, fd in zip(specs, fds, strict=True) if to(spec)[i]]
                if child is not None and sent:
                    with contextlib.suppress(ChildExited):  # its end is gone: the command naming them says how
                        child.send_fds(sent)
        finally:
            for fd in fds:
                os.close(fd)
        return specs

    def _limit(self, floor_s: float, calls: int, write_bytes: int = 0) -> float:
        return command_deadline(floor_s, calls, self.call_ms, write_bytes, self.run_limit)

    def _size_for(self, device: str) -> str:
        size = starts.size_for(self.spec, self.options.size, device)
        self.spec = starts.with_size(self.spec, size, self.settings)
        return size

    def _load(self, size: str) -> ProblemLoad:
        return starts.problem_load(self.spec, size, self.options.precision)

    def _start_candidate(self, target: Provenance) -> Candidate:
        candidate = starts.start_candidate(self.spec, self.source, self.options, self.settings, target,
                                           self._load(self._size_for(target.device)), self.exchange, self.cand_home,
                                           self.job, self.obs)
        candidate.begin_import()
        return candidate


@dataclass(frozen=True)
class PhaseLimit:
    """A time limit as it applies to one phase of an evaluation: what `problems show` lists."""

    phase: str
    seconds: float  # the limit, or its floor where it grows with the reference's time
    rule: str


def phase_limits(spec: ProblemSpec, settings: Settings, options: EvalOptions | None = None) -> list[PhaseLimit]:
    """The limits an evaluation of `spec` runs under, per phase (the problem's run limit only caps the per-command
    ones: a correctness command hits its own, 30 s on a fast reference, long before 300 s)."""
    o = options or EvalOptions()
    run = o.run_timeout_s or spec.run_timeout_s
    grows = f"or {_HEADROOM:g}x the reference's time for its calls where more, at most {run:g} s (the run limit)"
    return [
        PhaseLimit("compile", o.compile_timeout_s or spec.compile_timeout_s,
                   f"import and construct ModelNew (load_inline builds); and {settings.import_idle_timeout_s:g} s "
                   "with no compiler running"),
        PhaseLimit("correctness", _CORRECTNESS_FLOOR_S, f"all trials' calls in one command, {grows}"),
        PhaseLimit("timing", _WINDOW_FLOOR_S, f"each timed window, {grows}"),
        PhaseLimit("kernel trace", _TRACE_FLOOR_S, f"the profiled call naming the kernels, {grows}"),
        PhaseLimit("reference", settings.reference_timeout_s, "each command of the trusted side (the harness's; an "
                   "overrun is infra_error)"),
    ]


def command_deadline(floor_s: float, calls: int, call_ms: float, write_bytes: int, run_limit_s: float) -> float:
    """A candidate command's deadline: generous headroom over the reference's time for its calls, and the time to
    write the outputs it saves at a slow disk's rate, above a floor, under the problem's run limit."""
    need = _HEADROOM * calls * call_ms / 1e3 + write_bytes / _SLOW_WRITE_BYTES_PER_S
    return min(run_limit_s, max(floor_s, need))


def _target_changes(target: Provenance, probed: Provenance) -> str:
    """What differs between a slot's probed target and what this evaluation's trusted child found, among what the
    candidate's process was started for: its device and the inputs of its build dir's key."""
    before = {"device": target.device, **build_inputs(target)}
    after = {"device": probed.device, **build_inputs(probed)}
    return "; ".join(f"{k} {before[k]!r} -> {after[k]!r}" for k in before if before[k] != after[k])

