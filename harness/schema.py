"""The result of one evaluation: pydantic models, JSON-serialisable and versioned.

`Observations` holds the raw figures the sandbox recorded; `grading.grade` turns them into a
verdict, so a stored result can be re-graded under another tolerance without a GPU.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from harness.verdicts import Phase, Verdict

SCHEMA_VERSION = 1

# rtol values at which the judge records the smallest atol that would pass (see OutputFigures).
RTOL_GRID: tuple[float, ...] = (0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)

# The dtype an evaluation casts the problem's inputs and both models to (harness/precision.py), KernelBench's names.
Precision = Literal["fp32", "fp16", "bf16"]


class Tolerance(BaseModel):
    atol: float = Field(gt=0)
    rtol: float = Field(ge=0)

    def __str__(self) -> str:
        if self.atol == self.rtol:
            return f"atol=rtol={self.atol:g}"
        return f"atol={self.atol:g} rtol={self.rtol:g}"


class OutputFigures(BaseModel):
    """One output tensor of one trial, as the trusted judge saw it."""

    index: int
    got_type: str
    got_shape: list[int] | None = None
    got_dtype: str | None = None
    got_device: str | None = None
    expected_shape: list[int]
    expected_dtype: str
    # Only set when type, shape and dtype all match.
    nonfinite_mismatches: int | None = None  # NaN/Inf where the reference differs
    max_abs_err: float | None = None
    max_rel_err: float | None = None  # max |a-b| / (1+|b|): passes atol=rtol=t iff <= t
    min_atol_at_rtol: dict[str, float] | None = None  # max(|a-b| - rtol*|b|) for each rtol in RTOL_GRID
    worst_index: list[int] | None = None
    worst_got: float | None = None
    worst_expected: float | None = None
    mismatches_at_eval_tolerance: int | None = None
    numel: int | None = None
    # Precision against a float64 ground truth, for candidate and reference alike.
    err_vs_fp64: float | None = None  # max |a-g| / (1+|g|)
    ref_err_vs_fp64: float | None = None
    rel_l2_vs_fp64: float | None = None  # ||a-g|| / ||g||
    ref_rel_l2_vs_fp64: float | None = None
    # An element is within the tolerance when it is within it of the reference b or of the float64 truth g: the
    # reference's own rounding (a long sum, then a normalisation that magnifies it) can put a correct element outside
    # the tolerance of b. The figures of that rule, where there is a truth (grading.within_tolerance):
    max_rel_err_or_fp64: float | None = None  # max over elements of min(|a-b| / (1+|b|), |a-g| / (1+|g|))
    min_atol_at_rtol_or_fp64: dict[str, float] | None = None  # max of min(|a-b| - rtol*|b|, |a-g| - rtol*|g|), >= 0
    fp64_only_at_eval_tolerance: int | None = None  # elements outside the tolerance of b, within it of g


class TrialFigures(BaseModel):
    trial: int
    inputs: str = "get_inputs"  # or the extra trial's distribution, e.g. "randn*2+0.5"
    structure_error: str | None = None  # e.g. "expected a Tensor, got tuple"
    file_error: str | None = None  # the output file is not a regular file of acceptable size (a FIFO, a link)
    outputs: list[OutputFigures] = Field(default_factory=list)


class DeterminismFigures(BaseModel):
    """The same inputs run twice (trial 0)."""

    bitwise_equal: bool
    max_rel_diff: float | None  # max |o1-o2| / (1+|o2|); None when structures differ


class TimingStats(BaseModel):
    """Milliseconds per call. `parent_window` (harness/evaluation/windows.py): the parent's clock over timed
    windows, n windows of calls_per_window calls each; the statistics are over windows. The in-process clocks
    (`cuda_event`, `perf_counter`) are those of results stored before the parent timed every window."""

    clock: Literal["parent_window", "cuda_event", "perf_counter"]
    n: int
    median_ms: float  # the median over windows of (window - median empty window + its charge) / calls
    raw_median_ms: float | None = None  # the same without the empty window taken off
    mean_ms: float
    min_ms: float
    max_ms: float
    std_ms: float
    overhead_ms: float | None = None  # the median empty window, per call
    loop_wall_ms: float | None = None  # (in-process clocks only)
    calls_per_window: int | None = None
    spread: float | None = None  # interquartile range over median of the per-window figures
    windows_ms: list[float] = Field(default_factory=list)  # each window's wall time, parent's clock
    noise_ms: float | None = None  # the empty windows' interquartile range, per call: below it, a time is noise
    # The candidate's only: what its fingerprints of each window's outputs took beyond the trusted side's of the same
    # outputs, net of the host's round trip (ms, >= 0; windows.fingerprint_charges), charged to that window's time;
    # and the median without them (the windows alone), the figure results stored before them ranked. Empty and None
    # there, and for the trusted side's kinds.
    charged_ms: list[float] = Field(default_factory=list)
    windows_alone_median_ms: float | None = None
    # A baseline's only: the candidate's speedup over it paired by round (exp of the median over rounds of log(this
    # kind's time per call / the candidate's) in the same round: windows.paired_ratio), and the interquartile range of
    # those logs. Where present it ranks, and its spread, not each kind's, says whether the windows can vouch for it;
    # results stored before them ranked the ratio of the medians.
    paired_speedup: float | None = None
    paired_spread: float | None = None
    # Diagnostics, never ranked: what the timed process's own clocks said (the candidate's are its claims).
    device_median_ms: float | None = None  # its CUDA events over each window's calls, per call, median
    inputs_median_ms: float | None = None  # its host time making each window's inputs, per call, median
    round_trip_ms: float | None = None  # median of (window wall time - its own time over the window)


class ChildExit(BaseModel):
    """How the candidate's process ended, as the parent saw it."""

    returncode: int | None = None
    signal: str | None = None
    finished: bool = False  # sent its final message
    timed_out: bool = False
    deadline_s: float | None = None
    idle_s: float | None = None  # timed out importing: this long with no compiler running in its session
    phase: Phase = Phase.compile  # the phase it was in when it ended


class ChildError(BaseModel):
    phase: Phase
    exc_type: str
    message: str
    traceback: str = ""


class FlagChange(BaseModel):
    name: str
    before: Any
    after: Any
    when: Literal["import", "construct", "run"]


class TrivialOutput(BaseModel):
    """An output that computes nothing (all zeros, a constant, each row's mean), judged against the reference's
    outputs like a candidate's: its worst trial's figures, per output."""

    kind: str
    outputs: list[OutputFigures] = Field(default_factory=list)


class TimedOutputCheck(BaseModel):
    """Outputs of timed calls. Every output of every timed window is fingerprinted under a key the parent draws once
    the window closed (the candidate's process on the parent's clock; the trusted side the same for eager's
    outputs of the same seeds) and the fingerprints compared; a few calls, picked by the parent after their window
    closed, are handed over as kept and compared element by element with the reference by the trusted side."""

    reported: int = 0  # outputs handed over
    expected: int = 0  # outputs asked for
    checked: list[int] = Field(default_factory=list)  # call indices (window * calls_per_window + call)
    mismatches: list[str] = Field(default_factory=list)
    # Fingerprints, per timed window: the candidate's on the parent's clock, and the host's round trip right after
    # it (a trusted no-op on the parent's clock); the trusted side's of eager's outputs, on its own clock (what an
    # honest fingerprint costs) and, as a diagnostic, its command on the parent's clock less its scales step (in
    # results stored before the round trips, the bound). An output computed only when asked for is paid for here:
    # what the candidate's took beyond the trusted side's is charged to its window (TimingStats.charged_ms).
    # Outputs fingerprinted, and those whose fingerprint is off by more than an error within the tolerance.
    fingerprint_ms: list[float] = Field(default_factory=list)
    fingerprint_latency_ms: list[float] = Field(default_factory=list)
    reference_fingerprint_ms: list[float] = Field(default_factory=list)
    reference_fingerprint_own_ms: list[float] = Field(default_factory=list)
    fingerprinted: int = 0
    fingerprint_mismatches: list[str] = Field(default_factory=list)
    # The sum over the evaluation of (fingerprint difference / scale)**2, and its number of terms: outputs each
    # within its bound but all a little outside the tolerance add up (grading.fingerprint_deviation_bound).
    fingerprint_deviation: float = 0.0
    fingerprint_terms: int = 0
    # The hand-overs on the parent's clock (a diagnostic now), and, in results graded before fingerprints, the
    # trusted side's saves of outputs of the same sizes that bounded them (see grading._timed_outputs).
    handover_ms: list[float] = Field(default_factory=list)
    reference_save_ms: list[float] = Field(default_factory=list)
    # Before fingerprints: each hand-over's check by the trusted side on the parent's clock, less the time of its own
    # steps (the host's round-trip latency then, paired with the hand-over).
    latency_ms: list[float] = Field(default_factory=list)
    # The host's scheduling noise (windows.HANDOVER_SLACK_MS): the round trip taken off a fingerprint is credited at
    # most grading.HANDOVER_LATENCY_CREDIT of it; in results stored before the fingerprints' excess was charged to
    # the windows, what the fingerprints (before them, the hand-overs) could take over the trusted side's unflagged.
    handover_slack_ms: float | None = None
    # The judge's figures for each checked output (`trial` is its call index), graded like a trial's.
    calls: list[TrialFigures] = Field(default_factory=list)


class KernelLaunch(BaseModel):
    """A kernel a traced window launched, as the candidate's process reported it when it was first launched there."""

    name: str
    handle: int | None = None  # a driver launch's CUfunction, a runtime launch's host stub or cudaKernel_t


class KernelTrace(BaseModel):
    """The GPU kernels the calls of one timed window launched (CUPTI's launch callbacks in the candidate's process,
    each reported as it was first launched), and those of them the parent found the submission's own
    (kernels.custom_kernels)."""

    names: list[str] | None = None
    custom: list[str] = Field(default_factory=list)
    error: str | None = None
    # Not traced: the source builds nothing and can launch no kernel of its own (kernels.launches_only_library_kernels)
    from_source: bool = False
    window: int | None = None  # the timed round whose window was traced
    launches: list[KernelLaunch] = Field(default_factory=list)
    # The candidate's report after the timed rounds: the handles of the compiled kernels of the `@triton.jit` functions
    # in the submission's file, by function name; the handles of its build's kernels, by kernel name.
    own_triton: dict[str, list[int]] = Field(default_factory=dict)
    own_build: dict[str, list[int]] = Field(default_factory=dict)
    graph: bool = False  # a CUDA graph was launched in the traced window: its kernels are not named, nor credited


class TimingEnvelope(BaseModel):
    """The parent's own clock around the candidate's timing phase, and what it implies per call: results stored
    before the parent timed every window carry it (it is no longer graded: windows replaced it)."""

    wall_ms: float  # from sending the timed inputs' seed to receiving the candidate's timing report
    calls: int
    overhead_calls: int  # the empty calls that measure the overhead, also inside the envelope
    loop_ms: float | None = None  # the trusted side's wall ms per call of the same loop around a free call

    def implied_ms(self) -> float | None:
        """An estimate of the candidate's mean time per call that its report must not undercut: the
        envelope less the loop's own cost for every call in it (the empty calls are charged as if
        fingerprinted too, so the estimate errs low)."""
        if self.loop_ms is None:
            return None
        return max(self.wall_ms - (self.calls + self.overhead_calls) * self.loop_ms, 0.0) / self.calls


class SpeedOfLight(BaseModel):
    """The problem's physical floor on this GPU: its FLOPs at the measured dense bf16 tensor-core rate,
    or its minimum bytes at the measured memory bandwidth, whichever is longer."""

    flops: float | None = None
    min_bytes: float | None = None
    flops_per_s: float
    bytes_per_s: float

    def floor_ms(self) -> float:
        return 1e3 * max((self.flops or 0.0) / self.flops_per_s, (self.min_bytes or 0.0) / self.bytes_per_s)


class StateDictCopy(BaseModel):
    """How the reference's tensors (drawn fresh: harness/evaluation/parameters.py) reached the candidate's model."""

    copied: list[str] = Field(default_factory=list)  # candidate keys that received a reference tensor
    by_position: dict[str, str] = Field(default_factory=dict)  # of those, matched by order: candidate -> reference
    not_copied: list[str] = Field(default_factory=list)  # candidate keys with no reference tensor
    reference_unused: list[str] = Field(default_factory=list)  # reference keys no candidate tensor received
    drawn: list[str] = Field(default_factory=list)  # reference keys drawn fresh (the trusted side's word)


class StaticFinding(BaseModel):
    rule: str
    line: int
    detail: str


class MemoryPlan(BaseModel):
    """Whether the evaluation fits on the device's memory, said before its first trial (evaluation/memory_plan.py):
    what the harness keeps (trials kept to the judge, where the float64 truth lives, calls per timed window), what
    it shrank to fit, and the figures. Bytes throughout."""

    fits: bool
    message: str
    budget_bytes: int | None = None  # what the evaluation may use; None: no limit known (the host)
    free_bytes: int | None = None  # the device's free memory with what the trusted process held
    total_bytes: int | None = None
    budget_setting_bytes: int | None = None  # HARNESS_DEVICE_MEMORY_BUDGET_MB, where set
    reserve_bytes: int = 0
    needs_bytes: int = 0
    phases_bytes: dict[str, int] = Field(default_factory=dict)  # each side's peak in each of its phases
    trials: int = 0
    trials_kept: int = 0  # trials whose expected outputs (and truths) are kept from the prepare to the judge
    truth: Literal["device", "host"] = "device"  # where the float64 truth is computed and held
    first_output: Literal["device", "host"] = "device"  # where trial 0's output waits for the determinism re-run's
    compare_slice: int = 0  # elements compared at once
    calls_per_window: int = 1  # the most calls a timed window may hold
    calls_wanted: int = 1  # ... before the plan
    shrunk: list[str] = Field(default_factory=list)  # what was shrunk to fit, in order
    input_bytes: int = 0  # one call's
    output_bytes: int = 0
    parameter_bytes: int = 0
    truth_bytes: int = 0  # one call's outputs in float64
    forward_work_bytes: int = 0  # the reference forward's peak above its inputs
    output_held_bytes: int = 0  # the storages one call's outputs hold as returned (a timed window keeps them)
    inputs_made_bytes: int = 0  # the peak of making one trial's inputs
    # The candidate's planned share of the device: its peak over its phases (trials, timed windows), were its kernels
    # the reference's. An out-of-memory error within it is the harness's plan failing, not the submission.
    candidate_bytes: int = 0
    segment_bytes: int = 0  # the exchange's segments: one trial's inputs and output, one window's hand-overs
    exchange_device: Literal["cpu", "cuda"] = "cpu"  # where the segments live
    handover_slots: int = 1  # outputs one window hands over at most (the hand-over segment's slots)
    host_needs_bytes: int = 0  # host memory the exchange takes beside a CUDA evaluation (segments, copies)
    host_available_bytes: int | None = None  # the host's MemAvailable when the plan was made
    judge_ahead: bool = False  # the outputs that compute nothing judged after the prepare's reply, beside the trials


class GpuMemoryAtFailure(BaseModel):
    """The evaluation's GPU (the one NVML lists the trusted process on) as NVML saw it when the candidate reported
    running out of device memory, read by the parent (evaluation/gpu_sharing.py). Bytes; each process's is NVML's
    used memory of that process on this GPU. `unknown` says why the figures are missing, where they are."""

    total_bytes: int | None = None
    free_bytes: int | None = None
    candidate_bytes: int | None = None
    trusted_bytes: int | None = None
    others_bytes: int | None = None  # processes neither the candidate's nor the trusted side's
    others: list[int] = Field(default_factory=list)  # their host PIDs
    unknown: str | None = None


class Observations(BaseModel):
    """Everything grading needs, all raw."""

    static_error: str | None = None
    static_findings: list[StaticFinding] = Field(default_factory=list)
    reference_error: str | None = None  # the trusted side failed: infra_error
    candidate_exit: ChildExit | None = None
    # Candidate start to its 'imported' message on the parent's clock: interpreter, torch and any load_inline
    # build (little but the imports when the build dir was ready). Throughput figures, never graded.
    candidate_import_s: float | None = None
    # Where the evaluation's wall time went, on the parent's clock, in the order the phases ran: seconds from
    # the end of the previous phase to the end of this one (see runner._Phases). Never graded.
    phases: dict[str, float] = Field(default_factory=dict)
    # The trusted process had served an earlier evaluation of this problem on the slot (kept warm: warm.py).
    trusted_warm: bool = False
    # The candidate's process had been started ahead, during the slot's previous evaluation (starts.prestart).
    candidate_ahead: bool = False
    # So had the trusted process, for a problem none was warm for (starts.prestart_trusted).
    trusted_ahead: bool = False
    # Seconds per step of the trusted side's commands on its own clock, summed ("judge.trivial"): diagnostics.
    trusted_seconds: dict[str, float] = Field(default_factory=dict)
    candidate_error: ChildError | None = None
    flag_changes: list[FlagChange] = Field(default_factory=list)
    trials_expected: int = 0
    trials: list[TrialFigures] = Field(default_factory=list)
    determinism: DeterminismFigures | None = None
    # The reference draws random numbers in forward (dropout): its output changed with the forward seed. Both sides
    # then run each call right after torch.manual_seed(the same fresh seed), so drawing as PyTorch does matches.
    stochastic_reference: bool | None = None
    # Set where the candidate's warm-up windows sized the timed ones below what eager's speed asks for, and its timed
    # windows then ran far short of their target: a figure from such short windows is not ranked.
    windows_sized_down: str | None = None
    # Set where the first timed rounds' windows were so (what windows_sized_down would have said of them): they were
    # taken as one more warm-up and the timed rounds ran again, on windows sized on their calls.
    windows_retimed: str | None = None
    # Each kind's untimed windows before the timed rounds, in order, as [calls, ms on the parent's clock]: the
    # candidate's one-call window first, then each warm-up round's. What the timed windows were sized on.
    warmup_windows: dict[str, list[list[float]]] = Field(default_factory=dict)
    # Beside each of those, what the window's process said its own clocks took, as [host ms, device ms] (None where it
    # said no such number): a diagnostic that tells a slow untimed window's GPU work from what surrounds it. The
    # candidate's are its claims, never a figure that sizes or ranks.
    warmup_own_ms: dict[str, list[list[float | None]]] = Field(default_factory=dict)
    # Why the timed windows made their own inputs rather than taking them from the window segment (RoundsPlan.staged);
    # None where they took them, or where there was no segment to take them from (a CUDA evaluation exchanging through
    # host memory).
    windows_unstaged: str | None = None
    # How the trusted process was paused before its staged windows (as the candidate is: `pause_method`); None where
    # windows were not staged or it could not be paused.
    trusted_pause_method: str | None = None
    # The core both sides' window threads were kept to for the timed rounds (rounds.RoundsPlan.core), and what kept a
    # side from it, where something did (its own words: a claim of the candidate's is a diagnostic, never a figure).
    timing_core: int | None = None
    timing_core_refused: str | None = None
    # Whether every process of the candidate's was held to that core (its cpuset), both sides' torch on one thread:
    # the CPU's one-core timing (rounds.RoundsPlan.held).
    timing_core_held: bool = False
    # Where eager's windows and the empty window ran (eager_process.py): "own", a process of eager's own started as the
    # candidate's is; "trusted", the trusted process; None where nothing was timed. Beside "trusted", why not its own
    # where the settings asked for it (no room on the device, staged windows).
    eager_process: Literal["own", "trusted"] | None = None
    eager_process_note: str | None = None
    # The core kept busy through the timed rounds (busy_core.py), where one was; None where none was.
    busy_core: int | None = None
    # What the candidate's speedup over each baseline, paired by round, was known to when the timed rounds ended (95%,
    # relative; windows.paired_halfwidth), the wider of eager's and torch.compile's: the rounds end early once it is
    # within the plan's aim (rounds.RoundsPlan.known_to). None where no round was timed.
    timing_known_to: float | None = None
    trivial_outputs: list[TrivialOutput] = Field(default_factory=list)
    # Before each reference window on CUDA, how long the trusted side waited for the GPU to run nothing of another
    # process's (ms; the candidate's processes stopped since its reply), and how many windows found it busy still
    # at the wait's limit: GPU work the candidate left running after its reply.
    gpu_idle_waits_ms: list[float] = Field(default_factory=list)
    gpu_busy_windows: int = 0
    # Waits longer than grading.LEFTOVER_GPU_MS (or busy still at the limit) while processes neither the candidate's
    # nor the trusted side's computed on the same GPU, or while whose work it was could not be told (no NVML, or it
    # listed none of the trusted side's processes: `gpu_unattributed` says why): not the candidate's, so kept here
    # rather than in gpu_idle_waits_ms / gpu_busy_windows (evaluation/gpu_sharing.py). The result is marked shared_gpu.
    gpu_shared_waits_ms: list[float] = Field(default_factory=list)
    gpu_shared_busy: int = 0
    gpu_sharers: list[int] = Field(default_factory=list)  # the other processes' host PIDs NVML listed on the GPU
    gpu_unattributed: str | None = None
    # How the candidate was paused between its turns (sandbox/pause.py): "cgroup_freeze", "cgroup_v1_freezer" or
    # "ptrace"; None where it never was (and in results stored before: SIGSTOP, which its own SIGCONT timer lifted).
    pause_method: str | None = None
    # Where the trial data between the two processes lived (evaluation/exchange_probe.py): "host", "device", and
    # on CUDA why ("host (device probe failed: ...)"); None in results stored before it was recorded.
    exchange_memory: str | None = None
    # Why it could not be paused (a thread already traced, or that would not freeze): the submission's failure.
    pause_error: str | None = None
    # Reference windows during which the paused candidate used CPU (or, on CUDA, its GPU work ran after the window),
    # each a line that says which and how much: every one was timed again, and none counted.
    ran_while_paused: list[str] = Field(default_factory=list)
    paused_cpu_windows: int = 0  # of those, the windows in which its processes used CPU (the rest: GPU work)
    # Every try of one reference window was disturbed (the last line of `ran_while_paused` says which): timing stopped.
    paused_timing_stopped: bool = False
    candidate_timing: TimingStats | None = None
    timed_outputs: TimedOutputCheck | None = None
    eager_timing: TimingStats | None = None
    compile_timing: TimingStats | None = None
    compile_baseline_error: str | None = None
    state_dict: StateDictCopy | None = None
    # Claims of the candidate's own process about its correctness calls (see child.checked_call).
    outputs_changed: list[str] = Field(default_factory=list)  # trials whose output changed after return
    inputs_mutated: list[str] = Field(default_factory=list)  # "trial 2: input 0"
    kernels: KernelTrace | None = None
    protocol_violations: list[str] = Field(default_factory=list)
    envelope: TimingEnvelope | None = None
    speed_of_light: SpeedOfLight | None = None
    # Results stored before there was a plan have none.
    memory_plan: MemoryPlan | None = None
    # What a candidate may hold on a GPU before the plan is made (grading._share_before_plan): the reference's
    # parameters and buffers as built (bytes; None before it was built) and the plan's reserve (on CUDA only).
    reference_parameter_bytes: int | None = None
    memory_reserve_bytes: int | None = None
    # Set where the candidate reported running out of device memory on CUDA (grading._device_out_of_memory).
    gpu_memory_at_failure: GpuMemoryAtFailure | None = None
    log_tail: str = ""

    def window_costs(self) -> dict[str, Any]:
        """What the timed windows cost: each kind's calls per window and median window (ms, parent's clock), the
        candidate's fingerprints of a window's outputs and the host's round trip after them, the trusted side's (on
        the parent's clock and its own), what was charged to a window for its fingerprints (median), the hand-overs',
        and the waits for an idle GPU before the reference windows. Diagnostics (benchmarks/phase_table.py,
        `harness bench throughput`'s records)."""
        out: dict[str, Any] = {
            kind: {"calls": t.calls_per_window, "median_window_ms": statistics.median(t.windows_ms)}
            for kind, t in (("candidate", self.candidate_timing), ("eager", self.eager_timing),
                            ("compile", self.compile_timing)) if t is not None and t.windows_ms}
        if self.candidate_timing is not None and self.candidate_timing.charged_ms:
            out["median_charged_ms"] = statistics.median(self.candidate_timing.charged_ms)
        if self.gpu_idle_waits_ms:
            out["gpu_idle_wait_max_ms"] = max(self.gpu_idle_waits_ms)
            out["gpu_idle_waits_over_1ms"] = sum(w > 1.0 for w in self.gpu_idle_waits_ms)
        if self.gpu_shared_waits_ms:
            out["gpu_shared_waits"] = len(self.gpu_shared_waits_ms)
        if self.timed_outputs is not None:
            check = self.timed_outputs
            out["handovers"] = len(check.handover_ms)
            for key in ("fingerprint_ms", "fingerprint_latency_ms", "reference_fingerprint_ms",
                        "reference_fingerprint_own_ms", "handover_ms"):
                values = getattr(check, key)
                out[f"median_{key}"] = statistics.median(values) if values else None
        return out


class Flag(BaseModel):
    check: str
    detail: str


class ProblemRef(BaseModel):
    id: str
    version: int
    kernelbench_id: str | None = None
    size: str
    overrides: dict[str, Any] = Field(default_factory=dict)  # the module constants the size set
    source: str
    precision: Precision = "fp32"  # results stored before there was a choice ran at fp32


class Provenance(BaseModel):
    harness_version: str
    device: str  # "cpu" or "cuda"
    device_name: str
    compute_capability: str | None = None
    torch_version: str
    cuda_version: str | None = None
    driver_version: str | None = None
    python_version: str
    hostname: str
    reference_torch_flags: dict[str, Any] = Field(default_factory=dict)
    started_at: datetime
    wall_s: float = 0.0


class EvalResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    verdict: Verdict
    message: str
    log_excerpt: str = ""
    flags: list[Flag] = Field(default_factory=list)
    problem: ProblemRef
    tolerance: Tolerance
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    submission_sha256: str
    observations: Observations
    provenance: Provenance | None = None
    job_dir: str | None = None
