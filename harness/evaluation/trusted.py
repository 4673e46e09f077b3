"""The trusted side of an evaluation: `python -m harness.evaluation.trusted --channel-fd N`.

It never imports a submission. It builds the reference Model, draws the correctness inputs from a
secret seed, keeps the expected outputs (fp32 and a float64 ground truth) in its own memory, judges
the candidate's saved outputs and its handed-over timed outputs, and runs the reference's timed windows
(reference_windows.py: eager, torch.compile, and the empty window whose cost every window carries). Commands arrive as
JSON lines on stdin. What the candidate wrote is read as hostile data (`untrusted.load_outputs`): a failure to read
or compare it is a figure of the submission's, never a failure of this process.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import time
import traceback
from typing import Any

import torch

import harness
from harness.evaluation import (
    compare,
    exchange,
    exchange_probe,
    judge,
    memory_plan,
    parameters,
    problem_module,
    tensors,
    timing,
    torchflags,
    untrusted,
    windows,
)
from harness.evaluation.protocol import (
    Channel,
    CheckHandoverCommand,
    FillWindowCommand,
    FingerprintCommand,
    JudgeCommand,
    JudgeHandoversCommand,
    LeadInCommand,
    PrepareCommand,
    ReferenceWindowCommand,
    StageCommand,
    StageWindowCommand,
    TakeCommand,
)
from harness.evaluation.reference_windows import ReferenceWindows
from harness.schema import MemoryPlan

# the commands that carry a tolerance
Judging = JudgeCommand | CheckHandoverCommand | JudgeHandoversCommand | TakeCommand


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        )
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def probe(device_name: str) -> dict[str, Any]:
    device = problem_module.resolve_device(device_name)
    info: dict[str, Any] = {
        "harness_version": harness.__version__, "device": device.type, "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda, "python_version": platform.python_version(),
        "hostname": socket.gethostname(), "reference_torch_flags": torchflags.snapshot(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, compute_capability=f"{props.major}.{props.minor}",
                    driver_version=_driver_version())
    else:
        info.update(device_name=platform.processor() or platform.machine(), compute_capability=None)
    return info


# Expected outputs and float64 ground truths kept in the device's memory from the prepare to the judge, at most.
KEEP_BYTES = 8 << 30
# How the outputs that compute nothing compare (`judge.trivial_outputs`) depends on the reference alone: it is judged
# after the prepare's reply, while the candidate runs its trials, for trials whose expected outputs are kept and
# at most this large (the comparisons' float64 temporaries then stay small beside the candidate's on the device).
TRIVIAL_AHEAD_BYTES = 64 << 20


def _allocated(device: torch.device) -> int:
    """What the allocator holds for tensors now, its peak counted from here on (CUDA; 0 on the host)."""
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def host_available() -> int | None:
    """The host's available memory (MemAvailable): what the exchange's host segments (memfds are the host's memory,
    not a filesystem's) and the trusted side's host copies may take."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _model_key(cmd: PrepareCommand) -> tuple[str, str, int]:
    """What a built reference Model is kept for: the problem at its size, the device, the parameters' seed."""
    return cmd.problem.model_dump_json(), cmd.device, cmd.param_seed


class Trusted:
    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.expected: list[Any] = []  # per trial; None where it is recomputed at the judge (`recompute`)
        self.ground_truth: list[Any] = []
        self.recompute: list[bool] = []
        self._trial_seeds: tuple[int, list[int]] = (0, [])  # the trials' input seed and forward seeds
        self.model: torch.nn.Module | None = None
        self.module: Any = None
        self.distributions: list[str] = []
        self.flush: torch.Tensor | None = None
        self.init_args: list[Any] = []
        self.initial_state: dict[str, torch.Tensor] | None = None
        self._built: tuple[str, str, int] | None = None
        self._peaks: dict[str, Any] | None = None
        # The trivial outputs' figures judged ahead (`trivial_ahead`): under which tolerance, of which trials.
        self.trivial_found: dict[str, dict[int, dict[str, Any]]] = {}
        self.trivial_judged: tuple[tuple[float, float], set[int]] | None = None
        self.trivial_ahead_s = 0.0
        # Work a command leaves for after its reply (main() runs it before reading the next command).
        self.after_reply: Any = None
        # The timed rounds' reference windows and what they hold (reference_windows.py), on this side's reference.
        self.reference_windows = ReferenceWindows(self)
        self.exchange_where = "cpu"  # where this evaluation's segments live (the prepare says)
        # Hand-overs read with `defer` (a copy of each, or why there is none; seed; forward seed), until judged.
        self.handed_over: list[tuple[Any, int, int]] = []
        # How a command says something on the way to its reply (main() sets the channel's); how descriptors go to
        # the parent, before the message that names them (main() sets the fd socket's; in process, nowhere).
        self.notify: Any = lambda event, **fields: None
        # The evaluation's memory plan (`_memory_plan`), made on the prepare's first trial.
        self.plan: MemoryPlan | None = None
        self.stochastic = False  # the reference draws random numbers in forward (found on the first trial)
        self.send_fds: Any = lambda fds: None
        # The exchange's segments of this evaluation (exchange.py), by name, until `release`.
        self.segments: dict[str, exchange.Segment] = {}
        self.taken: dict[int, dict[str, Any]] = {}  # the trials' figures, as each output was taken and judged
        self.first_output: Any = None  # trial 0's output (a copy), until the determinism re-run's is taken
        self.determinism: dict[str, Any] | None = None
        self.output_count = 1  # tensors in the reference's output, once prepared

    def _load(self, cmd: PrepareCommand) -> bool:
        """The problem's module and its init arguments, loaded once per process: a warm trusted process serves
        evaluation after evaluation of one problem, size and device. True where the Model built for them is kept
        (`_build` then restores it)."""
        if self.model is not None and _model_key(cmd) == self._built:
            return True
        self.model, self._built = None, None  # another problem's, size's or device's: let go before the next is built
        self.device = problem_module.resolve_device(cmd.device)
        self.module = problem_module.load_problem(cmd.problem)
        self.init_args = list(self.module.get_init_inputs())
        return False

    def _build(self, cmd: PrepareCommand, kept: bool) -> None:
        """The reference Model on the device, built once per process (`kept`: built before, restored to the state
        it was built with), its torch.compile baseline compiled once."""
        if kept:
            assert self.model is not None and self.initial_state is not None
            self.model.load_state_dict(self.initial_state)
            return
        torch.manual_seed(cmd.param_seed)
        # At the evaluation's precision, as KernelBench casts it: floating-point parameters and buffers only.
        model = self.module.Model(*self.init_args).to(problem_module.dtype_of(cmd.problem.precision))
        state = model.state_dict()
        # A lazy module's tensors have no values to restore: such a Model is built anew for every evaluation.
        lazy = any(torch.nn.parameter.is_lazy(v) for v in state.values())
        self.initial_state = None if lazy else {k: v.detach().clone() for k, v in state.items()}
        self.model, self.reference_windows.compiled = model.to(self.device), None
        self._built = None if lazy else _model_key(cmd)
        self.flush = timing.l2_flush_buffer(self.device)

    def release(self) -> dict[str, Any]:
        """Forget the evaluation just ended (its expected outputs and ground truth), give the device memory back
        for the next one's candidate, and keep the Model, its compiled baseline and the peaks."""
        self.expected, self.ground_truth, self.distributions, self.recompute = [], [], [], []
        self.trivial_found, self.trivial_judged, self.trivial_ahead_s, self.after_reply = {}, None, 0.0, None
        self.handed_over, self.plan, self.stochastic = [], None, False
        self.reference_windows.release()
        self.taken, self.first_output, self.determinism = {}, None, None
        for seg in self.segments.values():
            seg.close()
        self.segments = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {}

    def share(self, segments: dict[str, exchange.Segment]) -> list[dict[str, Any]]:
        """Keep `segments` to this evaluation's end and send their descriptors to the parent (for the candidate);
        their specs, for the message that names them."""
        self.segments.update(segments)
        fds = [seg.shared_fd() for seg in segments.values()]
        try:
            self.send_fds(fds)
        finally:
            for fd in fds:
                os.close(fd)
        return [seg.spec(name) for name, seg in segments.items()]

    def _packed(self, name: str, obj: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """`obj` packed into a segment of its own, sealed against writes, shared: its layout and the segment's spec."""
        seg = exchange.create(exchange.packed_bytes(obj), "cpu", writable=False, written_once=True)
        layout = exchange.pack(obj, seg)
        seg.freeze()
        return layout, self.share({name: seg})

    def prepare(self, cmd: PrepareCommand) -> dict[str, Any]:
        self.release()
        timing.pin_thread(None)  # its own cores again, where the last evaluation's rounds did not give them back
        timing.keep_threads(None)  # and its own torch threads (the CPU's one-core rounds run on one)
        clock = timing.Clock(problem_module.resolve_device(cmd.device))
        kept = self._load(cmd)
        # Where this evaluation's segments live: on CUDA as the runner says (exchange_probe), else the host's memory.
        self.exchange_where = cmd.exchange_device if self.device.type == "cuda" else "cpu"
        init_args = self.init_args
        layout, specs = self._packed("init_args", list(init_args))
        # The candidate can construct its model now (on the host, most of its time), beside the reference's build and
        # the parameters drawn next: a cold level3/11 on the CPU waited 1.9 s for the build before it could begin.
        self.notify("init_args_written", init_arg_count=len(init_args), init_args=layout, segments=specs)
        clock.lap("init_args")
        self._build(cmd, kept)
        clock.lap("build")
        assert self.model is not None
        model = self.model
        # The Model as built (`_build` restores its state, buffers a forward updates too); since correct means
        # correct for any parameters, its tensors are then drawn anew for this evaluation (parameters.draw_fresh).
        drawn = parameters.draw_fresh(model, cmd.draw_seed, cmd.fixed_parameters) if cmd.fresh_parameters else []
        clock.lap("draw")
        # A tensor of its own each (not a view into a shared storage): copied once, to the CPU, or cloned there.
        state = {k: v.detach().cpu() if v.is_cuda else v.detach().clone() for k, v in model.state_dict().items()}
        layout, specs = self._packed("parameters", state)
        parameter_bytes = tensors.tensor_bytes(list(state.values()))
        del state
        # The candidate can take them now, beside the trials' expected outputs made next.
        self.notify("parameters_written", state_dict=layout, segments=specs, parameter_bytes=parameter_bytes)
        model64: torch.nn.Module | None = None  # made once the plan says where the truth is computed
        clock.lap("init_file")
        distributions = ["get_inputs"] * cmd.trials
        if cmd.extra_distribution:
            distributions.append(problem_module.EXTRA_DISTRIBUTION)
        self.distributions = distributions
        call_s: list[float] = []
        # Each forward runs right after problem_module.manual_seed(its own seed), drawn fresh and apart from the inputs'
        # seeds, and the candidate is told the same seeds: a stochastic reference (dropout) draws alike on both sides.
        forward_seeds = [secrets.randbits(62) for _ in distributions]
        stochastic = False
        self._trial_seeds = (cmd.input_seed, forward_seeds)
        output_bytes, output_shapes = 0, []
        input_room, output_room = 0, 0  # the segments' sizes: the largest trial's packed inputs and output
        with torch.no_grad():
            for i in range(len(distributions)):
                made_base = _allocated(self.device)
                on_device = self._trial_inputs(i)
                input_room = max(input_room, exchange.packed_bytes(on_device))
                problem_module.synchronize(self.device)
                made = torch.cuda.max_memory_allocated(self.device) - made_base if self.device.type == "cuda" else 0
                base = _allocated(self.device)
                t0 = time.perf_counter()
                problem_module.manual_seed(forward_seeds[i], self.device)
                expected = self.model(*on_device)
                problem_module.synchronize(self.device)
                call_s.append(time.perf_counter() - t0)
                if i == 0:
                    # Before anything more is held: the plan decides what is kept, where the truth is made, and
                    # how many calls a window holds; a problem that cannot fit is said now, with its figures.
                    plan = self._memory_plan(cmd, on_device, expected, base, len(distributions), made)
                    if not plan.fits:
                        return {"memory_plan": plan.model_dump(mode="json")}
                # Its elements alone from here on (the plan counts no more), beside the checks' forwards below.
                expected = tensors.compact(expected)
                if i == 0:
                    model64 = self._model64()
                    # The same inputs under another forward seed: does the reference draw random numbers?
                    torch.manual_seed(secrets.randbits(62))
                    stochastic = self.stochastic = not tensors.same_outputs(self.model(*on_device), expected)
                    output_shapes = [list(o.shape) for o in tensors.as_list(expected) or []
                                     if isinstance(o, torch.Tensor)]
                    output_bytes = tensors.tensor_bytes(tensors.as_list(expected) or [])
                    self.output_count = len(tensors.as_list(expected) or [])
                output_room = max(output_room, exchange.packed_bytes(expected))
                # Kept to the judge as the plan allows (within KEEP_BYTES); past that (a KernelBench file at its own
                # size: 7 trials of 3 GB outputs and their float64 truths fill an H100), recomputed there one at a time.
                # A truth made on the host is made only where an element needs it (`_lazy_truth`), at the take.
                keep = i < plan.trials_kept
                truth = None
                if keep and not self._lazy_truth():
                    problem_module.manual_seed(forward_seeds[i], self.device)
                    truth = tensors.compact(self._truth(model64, on_device))
                self.expected.append(expected if keep else None)
                self.ground_truth.append(truth if keep else None)
                self.recompute.append(not keep)
                del expected, truth, on_device
        problem_module.synchronize(self.device)
        del model64
        clock.lap("trials")
        first_inputs = problem_module.seeded_inputs(self.module, 0, self.device)
        input_bytes = sum(t.numel() * t.element_size() for t in first_inputs if isinstance(t, torch.Tensor))
        del first_inputs
        # What a window costs per call besides the call (inputs, flush, wait): windows are sized on both.
        window_cost_ms = self._window_cost_ms(plan.calls_per_window)
        if self.device.type == "cuda":  # the prepare's temporaries (float64 copies) back to the driver: the
            torch.cuda.empty_cache()  # candidate shares this GPU (level1/41 at its own size ran out beside them)
        clock.lap("calibrate")
        if plan.judge_ahead and cmd.atol is not None and cmd.rtol is not None:
            tolerance = (cmd.atol, cmd.rtol)
            self.after_reply = lambda: self.trivial_ahead(*tolerance)
        # One trial's room: its inputs (staged anew for each trial), its output, and one window's hand-overs.
        # On the host for a CUDA evaluation too where the runner says so: its inputs and outputs then cross to and
        # from the device in each process (exchange.pack, unpack, take), and no device memory is shared.
        where = self.exchange_where
        specs = self.share({
            "inputs": exchange.create(input_room, where, writable=False),
            "output": exchange.create(output_room, where),
            # One window's hand-overs: no more outputs than a window holds (the plan's calls) or picks.
            "handover": exchange.create(plan.handover_slots * output_room, where),
        })
        clock.lap("segments")
        return {
            "segments": specs,
            "seconds": clock.seconds,
            "device": self.device.type,
            "init_arg_count": len(init_args),
            "distributions": distributions,
            "output_shapes": output_shapes,
            "output_bytes": output_bytes,
            "input_bytes": input_bytes,
            # The first call pays for lazy initialisation: the fastest of the others sizes the timed windows.
            "call_ms": 1e3 * min(call_s[1:] or call_s),
            "window_cost_ms": window_cost_ms,
            "parameters_drawn": drawn,
            "forward_seeds": forward_seeds,
            "stochastic": stochastic,
            "reference_torch_flags": torchflags.snapshot(),
            "memory_plan": plan.model_dump(mode="json"),
        }

    def _memory_plan(self, cmd: PrepareCommand, inputs: list[Any], expected: Any, base: int, trials: int,
                     made: int = 0) -> MemoryPlan:
        """The plan (memory_plan.plan) from the first trial: its inputs and the peak of making them (`made`, measured
        on CUDA), the reference's output (its elements, and the storages it holds as returned) and the forward's
        peak above `base` (what was allocated before it: CUDA's allocator measures it; on the host, its output
        alone), the parameters, and the device's free memory with what this process already holds."""
        outputs = tensors.as_list(expected) or []
        described = [tensors.described(x) for x in (inputs, outputs, list(self.model.state_dict().values())
                                              if self.model is not None else [])]
        free = total = None
        work = memory_plan.tensor_bytes(described[1])
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            free += torch.cuda.memory_reserved(self.device)
            work = max(work, torch.cuda.max_memory_allocated(self.device) - base)
        io_bytes = memory_plan.tensor_bytes(described[0]) + memory_plan.tensor_bytes(described[1])
        where = self.exchange_where
        granule = 1
        if where == "cuda":
            from harness.evaluation import cuda_vmm

            granule = cuda_vmm.granularity(self.device.index or 0)
        outputs_bytes = memory_plan.tensor_bytes(described[1])
        if self.distributions[-1] == problem_module.EXTRA_DISTRIBUTION:
            # redistribute draws each floating-point input anew, one draw beside the inputs at most
            made = max(made, memory_plan.redistributed_bytes(described[0]))
        footprint = memory_plan.Footprint(
            inputs=memory_plan.tensor_bytes(described[0]), inputs_f64=memory_plan.float64_bytes(described[0]),
            outputs=memory_plan.tensor_bytes(described[1]), outputs_f64=memory_plan.float64_bytes(described[1]),
            parameters=memory_plan.tensor_bytes(described[2]), parameters_f64=memory_plan.float64_bytes(described[2]),
            forward_work=work, trials=trials, calls_wanted=windows.most_calls(io_bytes, self.device.type),
            keep_bytes=KEEP_BYTES, compare_slice=compare.COMPARE_SLICE,
            fingerprint_chunk=timing.FINGERPRINT_CHUNK_BYTES, exchange_device=where, granule=granule,
            windows_staged=cmd.windows_staged,
            picks_per_window=windows.PICKS_PER_WINDOW, device=self.device.type,
            judge_ahead=cmd.atol is not None and cmd.rtol is not None and outputs_bytes <= TRIVIAL_AHEAD_BYTES,
            outputs_held=tensors.held_bytes(outputs), inputs_made=made)
        self.plan = memory_plan.plan(footprint, free, total, cmd.memory_budget, cmd.memory_reserve,
                                     host_available())
        return self.plan

    def _model64(self) -> torch.nn.Module | None:
        """The float64 reference, where the plan computes the truth: on the device, or on the host."""
        model64 = compare.float64_copy(self.model) if self.model is not None else None
        if model64 is not None and self.plan is not None and self.plan.truth == "host":
            model64 = model64.cpu()
        return model64

    def _truth(self, model64: torch.nn.Module | None, on_device: list[Any]) -> Any:
        """The float64 truth of one call, where the plan computes it. On the host a stochastic reference draws from
        another generator than the device's: its truth would not be the reference's, so it has none (the reference
        alone judges, as where no float64 copy can be made)."""
        if model64 is None:
            return None
        if self.plan is None or self.plan.truth == "device":
            return compare.float64_forward(model64, on_device)
        if self.stochastic:
            return None
        return compare.float64_forward(model64, problem_module.to_device(on_device, torch.device("cpu")))

    def _window_cost_ms(self, calls: int) -> float:
        """What a window costs per call besides the call (inputs, flush, wait), in windows of the plan's calls: a
        window makes every call's inputs first (level1/96 at its own size: 8 GiB a call, 20 calls at once did not fit
        an H200)."""
        seeds = list(range(-20, 0))
        timing.run_window(timing.empty_call, self.module, seeds[:min(2, calls)], seeds[:min(2, calls)], self.device,
                          self.flush)
        t0 = time.perf_counter()
        for start in range(0, len(seeds), calls):
            part = seeds[start:start + calls]
            timing.run_window(timing.empty_call, self.module, part, part, self.device, self.flush)
        return (time.perf_counter() - t0) * 1e3 / len(seeds)

    def trivial_ahead(self, atol: float, rtol: float) -> None:
        """How the outputs that compute nothing compare on the kept trials of the problem's own inputs, judged while
        the candidate runs its trials (after the prepare's reply; `judge` judges the rest). A failure here is only
        logged: the judge then judges them all, as it would have."""
        t0 = time.perf_counter()
        found: dict[str, dict[int, dict[str, Any]]] = {}
        done: set[int] = set()
        try:
            tol = JudgeCommand(atol=atol, rtol=rtol)
            for i, dist in enumerate(self.distributions):
                if dist == "get_inputs" and not self.recompute[i]:
                    self._trivial(found, self.expected[i], self.ground_truth[i], tol)
                    done.add(i)
            problem_module.synchronize(self.device)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception:
            print(f"the trivial outputs judged ahead failed; the judge judges them:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
            return
        if done:  # none where every trial's expected outputs are computed again at the judge
            self.trivial_found, self.trivial_judged = found, ((atol, rtol), done)
            self.trivial_ahead_s = time.perf_counter() - t0

    def stage(self, cmd: StageCommand) -> dict[str, Any]:
        """Trial `cmd.trial`'s inputs, made again from its seed, written over the last trial's in the inputs segment:
        the candidate never sees a trial's inputs before its turn, and one trial's is all the segment holds."""
        with torch.no_grad():
            inputs = self._trial_inputs(cmd.trial)
            layout = exchange.pack(inputs, self.segments["inputs"])
            problem_module.synchronize(self.device)
        return {"layout": layout}

    def take(self, cmd: TakeCommand) -> dict[str, Any]:
        """The candidate's output of a trial, copied out of the output segment and judged now (trial 0's copy is
        kept for the determinism re-run's, which is compared with it and then let go)."""
        clock = timing.Clock(self.device)
        i = 0 if cmd.trial is None else cmd.trial
        if cmd.trial is None:
            got = self._take(cmd.layout, self.segments["output"], self.output_count)
            clock.lap("read")
            first, self.first_output = self.first_output, None
            if self._first_on_host():
                first = problem_module.to_device(first, self.device)
            self.determinism = judge.determinism(first, got, self.taken.get(0, {}), self.device,
                                                  self._compare_slice())
            clock.lap("determinism")
            return {"seconds": clock.seconds}
        exp, gt = (self.expected[i], self.ground_truth[i]) if not self.recompute[i] else (None, None)
        made = exp is None
        if made:  # before the candidate's output is read: its inputs and working memory are let go by then
            model64 = None if self._lazy_truth() else self._model64()
            exp, gt = self._trial_outputs(i, model64)
            del model64
            clock.lap("made")
        got = self._take(cmd.layout, self.segments["output"], self.output_count)
        clock.lap("read")
        self.taken[i] = self._judge_got(got, exp, gt, cmd)
        if gt is None and self._lazy_truth() and compare.outside_tolerance(self.taken[i]):
            gt = self._trial_truth(i)  # an element outside the reference's tolerance: within the truth's?
            if gt is not None:
                self.taken[i] = self._judge_got(got, exp, gt, cmd)
        if i == 0:  # where the plan says, on the host while the other trials are made and judged
            self.first_output = problem_module.to_device(got, torch.device("cpu")) if self._first_on_host() else got
        del got
        if made and i != 0 and self.distributions[i] == "get_inputs":
            # The outputs that compute nothing, while this trial's expected output is here: the judge would make it
            # again (trial 0's waits for it: its candidate output stays held for the determinism re-run).
            self._trivial_taken(i, exp, gt, cmd)
        del exp, gt
        clock.lap("judge")
        return {"seconds": clock.seconds}

    def _first_on_host(self) -> bool:
        """Whether trial 0's output waits for the determinism re-run's on the host (memory_plan: a shrink step)."""
        return self.plan is not None and self.plan.first_output == "host" and self.device.type == "cuda"

    def _lazy_truth(self) -> bool:
        """Whether the float64 truth is made only where an element needs it: where the plan makes it on the host (a
        float64 forward there costs seconds to minutes at a problem's own size: level1/19's 6 GiB took 272 s an
        evaluation with a truth for every trial, three times over). The reference alone judges an output within its
        tolerance, and the outputs that compute nothing are compared with the reference alone there."""
        return self.plan is not None and self.plan.truth == "host"

    def _trial_truth(self, i: int) -> Any:
        """Trial i's float64 truth, made again on its inputs and forward seed (on the host: `_lazy_truth`)."""
        model64 = self._model64()
        with torch.no_grad():
            inputs = self._trial_inputs(i)
            problem_module.manual_seed(self._trial_seeds[1][i], self.device)
            return tensors.compact(self._truth(model64, inputs))

    def _trivial_taken(self, i: int, exp: Any, gt: Any, cmd: TakeCommand) -> None:
        """Trial i's outputs that compute nothing, judged at its take (as `trivial_ahead` judges the kept trials'):
        the judge then uses these figures where its tolerance is the take's."""
        tol = (cmd.atol, cmd.rtol)
        if self.trivial_judged is not None and self.trivial_judged[0] != tol:
            return
        self._trivial(self.trivial_found, exp, gt, JudgeCommand(atol=cmd.atol, rtol=cmd.rtol))
        done = self.trivial_judged[1] if self.trivial_judged is not None else set()
        self.trivial_judged = (tol, {*done, i})

    def _take(self, layout: Any, seg: exchange.Segment, tensors: int) -> Any:
        """An output of the candidate's, copied out of `seg` as its layout says, or the judge's figures saying why
        there is none (each a fault of the submission's, never the judge's)."""
        if layout is None:
            return {"structure_error": judge.NO_OUTPUT}
        try:
            return exchange.take(layout, seg, tensors, self.device)
        except untrusted.UntrustedFile as e:
            return {"file_error": f"the output cannot be read as an output: {e}"}
        except untrusted.BadOutput as e:
            return {"structure_error": str(e)}

    def judge(self, cmd: JudgeCommand) -> dict[str, Any]:
        clock = timing.Clock(self.device)
        trials = []
        # Outputs that compute nothing: how they compare (judged ahead where they could be, under this tolerance).
        ahead = self.trivial_judged is not None and self.trivial_judged[0] == (cmd.atol, cmd.rtol)
        found = copy.deepcopy(self.trivial_found) if ahead else {}
        judged_ahead = self.trivial_judged[1] if ahead and self.trivial_judged is not None else set()
        model64 = self._model64() if any(self.recompute) and not self._lazy_truth() else None
        missing = {"structure_error": judge.NO_OUTPUT}
        for i, dist in enumerate(self.distributions):
            trials.append({"trial": i, **self.taken.get(i, missing)})  # judged as each was taken
            if dist == "get_inputs" and i not in judged_ahead:  # the problem's own inputs decide what the
                exp, gt = self._trial_outputs(i, model64)  # tolerance means
                self._trivial(found, exp, gt, cmd)
                del exp, gt
        clock.lap("trials")
        if judged_ahead and self.trivial_ahead_s:  # beside the candidate's trials (those judged at a take: below)
            clock.seconds["trivial_ahead"] = round(self.trivial_ahead_s, 4)
        determinism = self.determinism
        trivial = [{"kind": kind, "outputs": list(by_output.values())} for kind, by_output in found.items()]
        if self.device.type == "cuda":  # the comparisons' float64 temporaries: the candidate's windows come next
            torch.cuda.empty_cache()
        return {"trials": trials, "determinism": determinism, "trivial": trivial, "seconds": clock.seconds}

    def _trial_inputs(self, i: int) -> list[Any]:
        """Trial i's inputs from its seed (the same every time they are made), made on the device as a timed window's
        are: get_inputs() on the host is slow (level2/75's torch.rand(1024, 8192): 92 ms on a 2-core VM, each trial)."""
        problem_module.manual_seed(self._trial_seeds[0] + i, self.device)
        with self.device:
            inputs = list(self.module.get_inputs())
            if self.distributions[i] != "get_inputs":
                inputs = problem_module.redistribute(inputs)
        return problem_module.to_device(inputs, self.device)

    def _trial_outputs(self, i: int, model64: torch.nn.Module | None) -> tuple[Any, Any]:
        """Trial i's expected output and float64 ground truth: kept since the prepare, or computed again on the same
        inputs and forward seed (no truth without `model64`)."""
        if not self.recompute[i]:
            return self.expected[i], self.ground_truth[i]
        forward_seed = self._trial_seeds[1][i]
        with torch.no_grad():
            on_device = problem_module.to_device(self._trial_inputs(i), self.device)
            problem_module.manual_seed(forward_seed, self.device)
            exp = tensors.compact(self.model(*on_device))
            if model64 is None:
                return exp, None
            problem_module.manual_seed(forward_seed, self.device)
            return exp, tensors.compact(self._truth(model64, on_device))

    def _judge_got(self, got: Any, exp: Any, gt: Any, cmd: Judging) -> dict[str, Any]:
        """The candidate's output (a copy `_take` made) against the reference's: figures, whatever it holds."""
        return judge.output(got, exp, gt, self.device, cmd.atol, cmd.rtol, self._compare_slice())

    def _trivial(self, found: dict[str, dict[int, dict[str, Any]]], exp: Any, gt: Any, cmd: Judging) -> None:
        judge.trivial_outputs(found, exp, gt, self.device, cmd.atol, cmd.rtol, self._compare_slice())

    def _compare_slice(self) -> int:
        return self.plan.compare_slice if self.plan is not None else compare.COMPARE_SLICE

    def check_handover(self, cmd: CheckHandoverCommand) -> dict[str, Any]:
        """The handed-over outputs against the reference on the same seeds, element by element; with `defer`, only
        read now and compared at `judge_handovers` (beside the candidate's kernel trace and exit)."""
        # Read first: the candidate's process runs on, and a file read after the reference's computation could
        # have been written after its "handed over".
        clock = timing.Clock(self.device)
        handed = list(zip([self._take(layout, self.segments["handover"], self.output_count) for layout in cmd.layouts],
                          cmd.seeds, cmd.forward_seeds, strict=True))
        clock.lap("read")
        if cmd.defer:
            self.handed_over += handed
            return {"checks": [], "seconds": clock.seconds}
        checks = self._check_handed(handed, cmd)
        clock.lap("judge")
        return {"checks": checks, "seconds": clock.seconds}

    def judge_handovers(self, cmd: JudgeHandoversCommand) -> dict[str, Any]:
        clock = timing.Clock(self.device)
        handed, self.handed_over = self.handed_over, []
        checks = self._check_handed(handed, cmd)
        clock.lap("judge")
        return {"checks": checks, "seconds": clock.seconds}

    def _check_handed(self, handed: list[tuple[Any, int, int]], cmd: Judging) -> list[dict]:
        assert self.model is not None
        checks = []
        model64: torch.nn.Module | None = None
        with torch.no_grad():
            for data, seed, forward_seed in handed:
                inputs = problem_module.seeded_inputs(self.module, seed, self.device)
                problem_module.manual_seed(forward_seed, self.device)
                exp = tensors.compact(self.model(*inputs))
                if isinstance(data, dict):  # the hand-over could not be read: why, as the trials say it
                    checks.append(data)
                    continue
                check = self._judge_got(data, exp, None, cmd)
                # Judged as the trials are; the float64 truth is made only where an element needs it.
                if compare.outside_tolerance(check):
                    if model64 is None:  # a Module's truth value is its len() where it has one: never `or`
                        model64 = self._model64()
                    problem_module.manual_seed(forward_seed, self.device)
                    truth = tensors.compact(self._truth(model64, inputs))
                    if truth is not None:
                        check = self._judge_got(data, exp, truth, cmd)
                checks.append(check)
        return checks

    def peaks(self) -> dict[str, Any]:
        """This device's memory bandwidth and tensor-core rate, measured once per process."""
        if self._peaks is None:
            self._peaks = timing.measure_peaks(self.device) if self.device.type == "cuda" else {}
        return self._peaks


# The timed rounds' commands: nothing extra runs after them, beside the next window (the candidate's may come next).
_ROUNDS_COMMANDS = frozenset({"window", "fingerprint", "stage_window", "fill_window", "lead_in"})


def _log_memory(command: str) -> None:
    """One line in this process's log after each command on CUDA outside the timed rounds: what its allocator holds
    for tensors, what it has reserved from the device, and the peak since the last reset (what the memory plan
    predicts is checked against these)."""
    if command in _ROUNDS_COMMANDS or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    gib = 1 << 30
    print(f"[trusted] after {command}: allocated {torch.cuda.memory_allocated() / gib:.2f} GiB, reserved "
          f"{torch.cuda.memory_reserved() / gib:.2f} GiB, peak {torch.cuda.max_memory_allocated() / gib:.2f} GiB",
          file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--fd-socket", type=int, help="where the exchange's descriptors go to the parent")
    args = parser.parse_args(argv)
    chan = Channel(args.channel_fd)
    trusted = Trusted()
    trusted.notify = chan.send
    if args.fd_socket is not None:
        trusted.send_fds = exchange.FdLink(args.fd_socket).send
    reference_windows = trusted.reference_windows
    handlers = {
        "prepare": (PrepareCommand, trusted.prepare, "prepared"),
        "stage": (StageCommand, trusted.stage, "staged"),
        "take": (TakeCommand, trusted.take, "taken"),
        "judge": (JudgeCommand, trusted.judge, "judged"),
        "check_handover": (CheckHandoverCommand, trusted.check_handover, "handover_checked"),
        "judge_handovers": (JudgeHandoversCommand, trusted.judge_handovers, "handovers_checked"),
        # the timed rounds' (_ROUNDS_COMMANDS)
        "window": (ReferenceWindowCommand, reference_windows.window, "window_done"),
        "stage_window": (StageWindowCommand, reference_windows.stage_window, "window_staged"),
        "fill_window": (FillWindowCommand, reference_windows.fill_window, "window_filled"),
        "lead_in": (LeadInCommand, reference_windows.lead_in, "led_in"),
        "fingerprint": (FingerprintCommand, reference_windows.fingerprint, "fingerprinted"),
    }
    probe_segment: exchange.Segment | None = None  # the exchange probe's, from its export to its verify
    chan.send("ready")
    for line in sys.stdin:
        if not line.strip():
            continue
        raw = json.loads(line)
        name = raw.get("cmd")
        try:
            if name == "ping":  # the host's round trip now: nothing else is done
                chan.send("pong")
            elif name == "probe":
                chan.send("probed", **probe(raw.get("device", "auto")))
            elif name == "pin":  # the window thread kept to the timed rounds' core, or given back its own (None)
                threads = raw.get("threads") if raw.get("cores") is not None else None  # given back with the cores
                chan.send("pinned", cores=timing.pin_thread(raw.get("cores")), threads=timing.keep_threads(threads))
            elif name == "wait_idle":
                chan.send("idle", **reference_windows.wait_idle(float(raw.get("limit_s", 10.0))))
            elif name == "peaks":
                chan.send("peaks", **trusted.peaks())
            elif name == "release":
                chan.send("released", **trusted.release())
            elif name == "exchange_export":  # the exchange's probe (exchange_probe.py), between evaluations
                probe_segment, fields = exchange_probe.export(str(raw.get("device", "cuda")), trusted.send_fds)
                chan.send("exchange_exported", **fields)
            elif name == "exchange_verify":
                chan.send("exchange_verified", **exchange_probe.verify(probe_segment))
                probe_segment = None
            elif name == "exit":
                break
            elif name in handlers:
                model_cls, fn, reply = handlers[name]
                chan.send(reply, **fn(model_cls.model_validate(raw)))
                after, trusted.after_reply = trusted.after_reply, None
                if after is not None:  # beside the candidate's work: the next command waits in the pipe meanwhile
                    after()
                _log_memory(name)
            else:
                chan.send("failed", error=f"unknown command {name!r}")
        except Exception as e:
            chan.send("failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
