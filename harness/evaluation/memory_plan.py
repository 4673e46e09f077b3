"""Whether an evaluation fits on the device's memory, said before its first trial. No torch, no GPU: arithmetic on
the byte counts the trusted side saw on the first trial (inputs, outputs, parameters, the reference's own working
memory) and the device's free memory.

Both processes share one GPU, and each keeps what its caching allocator once held: the peak of the trusted side's
phases (prepare, the windows' calibration, the trials' stage and take, judge, timed windows) and the peak of the
candidate's (trials, timed windows) add up, with the exchange's segments (inputs, output, one window's hand-over
slots) beside them from the prepare's end to the evaluation's: on the device where they are device memory, else on
the host, whose available memory bounds them and the trusted side's host copies. Work the trusted side does after a
reply, while the candidate runs its trials (the outputs that compute nothing, judged ahead), counts beside the
candidate's trials and the trusted side's own trial work. A trial kept is counted by its outputs' elements (the
trusted side keeps copies of them), a timed window's calls by the storages their outputs hold as returned (a 0-dim
mean can hold all it was reduced from). Where they do not fit, the harness first shrinks what it
keeps itself, in this order:

  0. the outputs that compute nothing are judged at the judge (the candidate idle), not ahead beside its trials;
  1. trials kept from the prepare to the judge (their expected outputs and float64 truths), down to none: each is
     then made again at the judge, one trial on the device at a time;
  2. the float64 truth: computed on the host, only for an output outside the reference's tolerance, and compared
     on the device a slice at a time (the widest slice that fits, once the rest is chosen), instead of computed and
     held whole on the device for every trial;
  3. trial 0's output, which waits for the determinism re-run's while the other trials are made and judged: kept on
     the host instead of the device;
  4. calls per timed window (each call's inputs and kept outputs are held until the window's fingerprint), down
     to one.

Only then is a problem too large, with its figures: what it needs, what the device has, what was already shrunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from harness.precision import DTYPE_BYTES
from harness.schema import MemoryPlan

GIB = 1 << 30
_FLOATING = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
# The fewest elements compared at once where the truth is computed on the host: the comparison's float64 temporaries
# (about fourteen a slice) come to 112 MiB beside the outputs. The plan takes the largest slice, up to the device's
# (Footprint.compare_slice), that still fits: at level1/39's size 1M-element slices took 9 s a trial's take, about
# 8,000 slices of some sixty kernels each.
SMALL_COMPARE_SLICE = 1 << 20
# Bytes per element a comparison works in: about fourteen float64 temporaries a slice (compare.COMPARE_SLICE).
COMPARE_BYTES_PER_ELEMENT = 14 * 8


def tensor_bytes(tensors: Sequence[tuple[int, str]]) -> int:
    """Bytes of tensors given as (elements, dtype name)."""
    return sum(n * DTYPE_BYTES.get(dtype, 8) for n, dtype in tensors)


def float64_bytes(tensors: Sequence[tuple[int, str]]) -> int:
    """Bytes of the same tensors once the float64 truth casts them (compare.to_float64: floating-point ones only)."""
    return sum(n * (8 if dtype in _FLOATING else DTYPE_BYTES.get(dtype, 8)) for n, dtype in tensors)


def redistributed_bytes(inputs: Sequence[tuple[int, str]]) -> int:
    """The most held while the extra distribution redraws one call's inputs (problem_module.redistribute, in place,
    one input at a time): the inputs and the draw of the largest floating-point one beside them (the input it
    replaces is let go first, unless get_inputs() keeps it elsewhere)."""
    draws = [tensor_bytes([(n, dtype)]) for n, dtype in inputs if dtype in _FLOATING]
    return tensor_bytes(inputs) + max(draws, default=0)


@dataclass(frozen=True)
class Footprint:
    """One call of the problem, as the trusted side saw it on the first trial. Bytes throughout."""

    inputs: int
    inputs_f64: int
    outputs: int
    outputs_f64: int
    parameters: int
    parameters_f64: int
    # The reference forward's peak above its inputs (its output included): measured on CUDA (the allocator's
    # peak); on the host, where nothing measures it, its output alone.
    forward_work: int
    trials: int  # correctness trials, the extra distribution's included
    calls_wanted: int  # calls per timed window before the plan (windows.most_calls)
    keep_bytes: int  # the expected outputs and truths kept from the prepare at most (trusted.KEEP_BYTES)
    compare_slice: int  # elements compared at once with the truth on the device (compare.COMPARE_SLICE)
    fingerprint_chunk: int  # a fingerprint's slice of a window's outputs in float64 (timing.FINGERPRINT_CHUNK_BYTES)
    # The exchange (exchange.py): where its segments live ("cuda": device memory; "cpu": the host's), a segment's
    # allocation unit there (the VMM granularity on CUDA), and the most outputs one window hands over.
    exchange_device: str = "cpu"
    windows_staged: bool = False  # a window's inputs go through the window segment (staged)
    granule: int = 1
    picks_per_window: int = 2
    device: str = "cuda"  # the evaluation's device: on "cpu" the device's memory is the host's
    judge_ahead: bool = False  # the outputs that compute nothing are to be judged after the prepare's reply
    # The storages the reference's outputs hold as its forward returns them, where larger than their elements:
    # smooth_l1_loss's 0-dim mean keeps the storage of the unreduced loss it was made from (4 GiB at level1/96's
    # size). A timed window keeps its calls' outputs as returned; the trusted side keeps only copies of their
    # elements (tensors.compact). 0: the outputs' own bytes.
    outputs_held: int = 0
    # The peak of making one trial's inputs (get_inputs' temporaries, the extra distribution's redraw beside the
    # inputs it replaces), measured on CUDA. 0: the inputs' own bytes.
    inputs_made: int = 0

    @property
    def held(self) -> int:
        """What one call's outputs hold as returned."""
        return max(self.outputs, self.outputs_held)

    @property
    def made(self) -> int:
        """The peak of making one call's inputs."""
        return max(self.inputs, self.inputs_made)

    @property
    def f64_ratio(self) -> float:
        """How much larger the float64 truth's tensors are than the reference's: its forward's working memory grows
        alike (the same operations on wider elements)."""
        return (self.inputs_f64 + self.outputs_f64) / max(self.inputs + self.outputs, 1)


@dataclass(frozen=True)
class Choice:
    trials_kept: int
    truth: str  # "device" | "host"
    calls: int
    judge_ahead: bool = False
    first_on_host: bool = False  # trial 0's output waits for the determinism re-run's on the host
    compare_slice: int = 0  # elements compared at once; 0: the device's with the truth there, else the smallest


def _room(n: int, granule: int) -> int:
    return max(granule, -(-n // granule) * granule) if granule > 1 else n


def handover_slots(fp: Footprint, c: Choice) -> int:
    """Outputs one window hands over at most: no more than it picks, no more than it holds."""
    return max(1, min(fp.picks_per_window, c.calls))


def staged(fp: Footprint) -> bool:
    """Whether the timed windows take their inputs from the window segment (rounds.RoundsPlan.staged)."""
    return fp.windows_staged


def window_segment(fp: Footprint, c: Choice) -> int:
    """Where windows are staged, the segment of a window's inputs, the trusted side's: made at the first timed window
    (after its trial work is let go), and counted with its windows' phase; the candidate's windows then make none."""
    return _room(c.calls * fp.inputs, fp.granule) if staged(fp) else 0


def segments(fp: Footprint, c: Choice) -> int:
    """The exchange's segments for the trials and windows: one trial's inputs, its output, one window's hand-overs."""
    return (_room(fp.inputs, fp.granule) + _room(fp.outputs, fp.granule)
            + _room(handover_slots(fp, c) * fp.outputs, fp.granule))


def fingerprint(fp: Footprint, c: Choice) -> int:
    """A fingerprint's temporaries, each at most 8 bytes an element of a slice of the window's outputs: the slice,
    its signs (2 bytes an element) and their product, counted as three float64 copies of it (timing.fingerprints)."""
    return 3 * min(fp.fingerprint_chunk, c.calls * fp.outputs_f64)


def compare_slice(fp: Footprint, c: Choice) -> int:
    """Elements compared at once: the choice's, else the device's where the truth is there and the smallest where
    it is not."""
    return c.compare_slice or (fp.compare_slice if c.truth == "device" else SMALL_COMPARE_SLICE)


def trusted_phases(fp: Footprint, c: Choice) -> dict[str, int]:
    """The trusted side's peak bytes on the device in each of its phases."""
    on_device = c.truth == "device"
    f64_work = int(fp.forward_work * fp.f64_ratio) if on_device else 0
    truth_forward = (fp.inputs_f64 + f64_work) if on_device else 0
    model64 = fp.parameters_f64 if on_device else 0
    # Copies of the outputs' elements: what a trial keeps (tensors.compact), not the storages the forward returned.
    kept = c.trials_kept * (fp.outputs + (fp.outputs_f64 if on_device else 0))
    slice_elems = compare_slice(fp, c)
    # A window holds every call's inputs and output as returned, and the last call's working memory beyond it.
    beyond_output = max(fp.forward_work - fp.held, 0)
    temps = min(slice_elems, max(fp.outputs_f64 // 8, 1)) * COMPARE_BYTES_PER_ELEMENT
    # The truth's copy of its elements, made beside the storage its forward returned, where that is larger.
    truth_copy = fp.outputs_f64 if on_device and fp.outputs_held > fp.outputs else 0
    # A trial: its inputs made; then the inputs, the expected output (its copy made within the forward's work) held
    # while the stochastic check's forward and the truth's run.
    trial = model64 + max(fp.made, fp.inputs + max(fp.forward_work + fp.outputs,
                                                   fp.outputs + truth_forward + truth_copy))
    # A judged trial: the expected output, its truth, the candidate's output read, and the comparison's slice (the
    # outputs that compute nothing are made and compared after the candidate's is let go).
    compare = fp.outputs + (fp.outputs_f64 if on_device else 0) + fp.outputs + temps
    recompute = trial if c.trials_kept < fp.trials else 0
    # Trial 0's output (the candidate's, copied out) is held from its take to the determinism re-run's.
    first = 0 if c.first_on_host else fp.outputs
    return {
        "prepare": fp.parameters + kept + trial,
        # Each trial: its inputs made and staged; a trial not kept made again, then the candidate's output copied out
        # and judged (trusted.take, in that order); trial 0's output held beside them.
        "trials": fp.parameters + kept + first + max(fp.made, recompute, compare),
        # After the prepare's reply, beside the candidate's trials: each kept trial's outputs that compute nothing,
        # one at a time, compared with its kept output and truth.
        "ahead": fp.parameters + kept + fp.outputs + temps if c.judge_ahead else 0,
        "calibration": fp.parameters + (c.calls - 1) * fp.inputs + fp.made,
        "judge": fp.parameters + kept + max(trial if c.trials_kept < fp.trials else 0, compare),
        # The kept trials stay until the evaluation's end (Trusted.release).
        # A round's inputs staged (its own copy) and, where staged, the window segment they are written into.
        "windows": fp.parameters + kept + c.calls * (fp.inputs + fp.held) + beyond_output + fingerprint(fp, c)
        + window_segment(fp, c),
    }


def candidate_phases(fp: Footprint, c: Choice, budget: int | None) -> dict[str, int]:
    """The candidate's peak bytes on the device, were its kernels the reference's: a trial (one copy of its inputs:
    on CUDA its own, cloned off the segment and compared with it after the call; on the host, where the segment is
    mapped copy-on-write, the copy that comparison keeps; then its output and the output's snapshot; before it, the
    allocator's poison block of four inputs' size or a quarter of the free memory, which the trial's tensors then
    reuse) and a timed window."""
    poison = 4 * fp.inputs if budget is None else min(4 * fp.inputs, budget // 4)
    beyond_output = max(fp.forward_work - fp.held, 0)
    return {
        "trials": fp.parameters + max(poison, fp.inputs + fp.forward_work + fp.outputs),
        "windows": fp.parameters + c.calls * ((0 if staged(fp) else fp.inputs) + fp.held) + beyond_output
        + fingerprint(fp, c),
    }


def needs(fp: Footprint, c: Choice, budget: int | None, reserve: int) -> tuple[int, dict[str, int]]:
    """Both sides' peaks, the segments on the device and the reserve: what the choice needs at once. The work judged
    ahead runs beside the candidate's trials and the trusted side's own trial work: it counts on top of them."""
    trusted, candidate = trusted_phases(fp, c), candidate_phases(fp, c, budget)
    phases = {f"trusted_{k}": v for k, v in trusted.items()} | {f"candidate_{k}": v for k, v in candidate.items()}
    on_device = segments(fp, c) if fp.exchange_device == "cuda" or fp.device == "cpu" else 0
    phases["segments"] = segments(fp, c)
    at_trials = trusted["trials"] + trusted["ahead"]
    phases["trusted_at_trials"] = at_trials
    trusted_peak = max(at_trials, *(v for k, v in trusted.items() if k not in ("trials", "ahead")))
    return trusted_peak + max(candidate.values()) + on_device + reserve, phases


def host_needs(fp: Footprint, c: Choice) -> int:
    """The host memory a CUDA evaluation takes beside the device's: the exchange's segments where they are the host's,
    and the trusted side's host copies (a trial's inputs written through it, an output read back); trial 0's output
    where it waits on the host. On a CPU evaluation the device's memory is the host's: `needs` counts it all."""
    first = fp.outputs if c.first_on_host and fp.device != "cpu" else 0
    if fp.device == "cpu" or fp.exchange_device == "cuda":
        return first
    return segments(fp, c) + fp.inputs + fp.outputs + first


def _kept_at_most(fp: Footprint) -> int:
    """The trials kept before any shrinking: as many as fit KEEP_BYTES (their expected outputs and truths)."""
    per_trial = fp.outputs + fp.outputs_f64
    return min(fp.trials, fp.keep_bytes // per_trial) if per_trial else fp.trials


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def plan(fp: Footprint, free: int | None, total: int | None, budget_setting: int | None,
         reserve: int, host_available: int | None = None) -> MemoryPlan:
    """The evaluation's memory plan. `free` is the device memory this evaluation may use (the device's free memory and
    what the trusted process already holds), `total` the device's; `budget_setting` caps it (a GPU shared with other
    work, a test); `reserve` is kept spare for what is not counted (the candidate's CUDA context, library workspaces,
    the allocator's rounding). `host_available` is the host's available memory (MemAvailable), which bounds the
    exchange's host segments and copies with a tenth to spare. Where neither gives a device budget (the host), the
    device side fits and says its figures."""
    budgets = [b for b in (free, budget_setting) if b is not None]
    budget = min(budgets) if budgets else None
    choice = Choice(trials_kept=_kept_at_most(fp), truth="device", calls=max(1, fp.calls_wanted),
                    judge_ahead=fp.judge_ahead)
    shrunk: list[str] = []

    def host_fits(c: Choice) -> bool:
        return host_available is None or host_needs(fp, c) * 1.1 <= host_available

    def fits(c: Choice) -> bool:
        return (budget is None or needs(fp, c, budget, reserve)[0] <= budget) and host_fits(c)

    if not fits(choice) and choice.judge_ahead:
        choice = replace(choice, judge_ahead=False)
        shrunk.append("the outputs that compute nothing judged at the judge, the candidate idle, instead of beside "
                      "its trials")
    if not fits(choice) and choice.trials_kept:
        start = choice.trials_kept
        while choice.trials_kept and not fits(choice):
            choice = replace(choice, trials_kept=choice.trials_kept - 1)
        shrunk.append(f"trials kept from the prepare to the judge {start} -> {choice.trials_kept} "
                      "(the others made again at the judge, one at a time)")
    if not fits(choice):
        choice = replace(choice, truth="host")
        shrunk.append("float64 truth computed on the host where an output is outside the reference's tolerance, "
                      "and compared on the device in slices of the elements, instead of whole on the device for every "
                      "trial")
    if not fits(choice) and fp.device != "cpu":
        choice = replace(choice, first_on_host=True)
        shrunk.append("trial 0's output kept on the host for the determinism re-run, instead of on the device")
    if not fits(choice) and choice.calls > 1:
        start = choice.calls
        while choice.calls > 1 and not fits(choice):
            choice = replace(choice, calls=choice.calls - 1)
        shrunk.append(f"calls per timed window {start} -> {choice.calls}")
    if choice.truth == "host":  # the largest slice that fits: each slice is some sixty kernels and a wait
        while compare_slice(fp, choice) < fp.compare_slice:
            wider = replace(choice, compare_slice=min(2 * compare_slice(fp, choice), fp.compare_slice))
            if not fits(wider):
                break
            choice = wider
    need, phases = needs(fp, choice, budget, reserve)
    host_need = host_needs(fp, choice)
    device_ok = budget is None or need <= budget
    ok = device_ok and host_fits(choice)
    trusted_peak = max(v for k, v in phases.items() if k.startswith("trusted_"))
    candidate_peak = max(v for k, v in phases.items() if k.startswith("candidate_"))
    on_device = phases["segments"] if fp.exchange_device == "cuda" or fp.device == "cpu" else 0
    figures = (f"needs {gib(need)} ({gib(trusted_peak)} the trusted side, {gib(candidate_peak)} the candidate, "
               f"{gib(on_device)} the exchange's segments, {gib(reserve)} reserve), has {gib(budget)}"
               + (f" ({gib(free)} free of {gib(total)})" if free is not None else "")
               + (f", capped at {gib(budget_setting)} by HARNESS_DEVICE_MEMORY_BUDGET_MB"
                  if budget_setting is not None else ""))
    if host_need and host_available is not None:
        held = [f"the exchange's segments {gib(phases['segments'])} and the trusted side's copies"] \
            if fp.exchange_device != "cuda" else []
        held += ["trial 0's output"] if choice.first_on_host else []
        figures += (f"; on the host it needs {gib(host_need)} ({' and '.join(held)}), with a tenth to spare, of "
                    f"{gib(host_available)} available")
    if ok:
        message = f"fits: {figures}" + (f"; shrunk: {'; '.join(shrunk)}" if shrunk else "")
    else:
        where = "this device's memory" if not device_ok else "the host's memory"
        message = (f"too large for {where}: {figures}; already shrunk: "
                   f"{'; '.join(shrunk) or 'nothing'}. One call's inputs are {gib(fp.inputs)}, its outputs "
                   f"{gib(fp.outputs)}, the parameters {gib(fp.parameters)}: evaluate the problem at a smaller size "
                   "or on a device with more memory")
    return MemoryPlan(
        fits=ok, message=message, budget_bytes=budget, free_bytes=free, total_bytes=total,
        budget_setting_bytes=budget_setting, reserve_bytes=reserve, needs_bytes=need, phases_bytes=phases,
        candidate_bytes=candidate_peak, segment_bytes=phases["segments"], exchange_device=fp.exchange_device,
        handover_slots=handover_slots(fp, choice), host_needs_bytes=host_need, host_available_bytes=host_available,
        judge_ahead=choice.judge_ahead,
        trials=fp.trials, trials_kept=choice.trials_kept, truth=choice.truth,
        first_output="host" if choice.first_on_host else "device",
        compare_slice=compare_slice(fp, choice),
        calls_per_window=choice.calls, calls_wanted=fp.calls_wanted, shrunk=shrunk,
        input_bytes=fp.inputs, output_bytes=fp.outputs, parameter_bytes=fp.parameters,
        truth_bytes=fp.outputs_f64, forward_work_bytes=fp.forward_work, output_held_bytes=fp.held,
        inputs_made_bytes=fp.made,
    )
