"""What the parent and its two kinds of child say to each other. No torch here.

Trial data (init arguments, parameters, inputs, outputs) goes through shared memory (exchange.py): the trusted side
makes the segments and sends their descriptors to the parent, which relays them to the candidate
(`CandidateCommand.segments`); where the data lies in them, its layout, travels in these messages.

Commands go to a child as JSON lines on its stdin; children answer with JSON lines on a pipe the parent
made (`Channel`). The candidate's process is driven command by command: every command carries a fresh
nonce, and the only message the parent takes from the candidate is the reply its command names, carrying
that nonce (or an `error`). The candidate can write anything to its channel; a message that is not the
awaited reply is a protocol violation, and nothing it says is a figure the parent believes: times are the
parent's own clock, outputs are judged by the trusted side.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.schema import Precision, StateDictCopy


class ProblemLoad(BaseModel):
    """How a child loads the problem module: by path, with size overrides applied to its constants, its inputs made at
    a precision (problem_module.load_problem)."""

    path: Path
    overrides: dict[str, Any] = Field(default_factory=dict)
    precision: Precision = "fp32"


# --- the trusted child ---------------------------------------------------------------------------------

class PrepareCommand(BaseModel):
    cmd: Literal["prepare"] = "prepare"
    problem: ProblemLoad
    device: Literal["auto", "cpu", "cuda"]
    param_seed: int  # the seed both sides build their model under (KernelBench's rule)
    draw_seed: int  # the fresh parameters' (see parameters.draw_fresh)
    input_seed: int  # secret: never leaves the trusted process
    trials: int
    extra_distribution: bool = True  # one more trial on randn*2+0.5 inputs (see problem_module)
    fresh_parameters: bool = True  # the reference's tensors drawn anew (see parameters)
    fixed_parameters: list[str] = []  # ... but these
    # The judge's tolerance, where known: the outputs that compute nothing are judged ahead under it
    # (Trusted.trivial_ahead).
    atol: float | None = None
    rtol: float | None = None
    # The memory plan's (memory_plan.plan): a cap below the device's free memory, and the spare it keeps; bytes.
    memory_budget: int | None = None
    memory_reserve: int = 0
    # Where the trial segments live (exchange_probe.choose): on the host, or on the CUDA device (CUDA only).
    exchange_device: Literal["cpu", "cuda"] = "cpu"
    # The timed windows take their inputs from the window segment (rounds.RoundsPlan.staged): the memory plan counts it.
    windows_staged: bool = False


class StageCommand(BaseModel):
    """Write trial `trial`'s inputs into the inputs segment (over the last trial's); the reply's `layout` says where."""

    cmd: Literal["stage"] = "stage"
    trial: int


class TakeCommand(BaseModel):
    """Copy the candidate's output of trial `trial` (None: the determinism re-run, on trial 0's inputs) out of the
    output segment, as its `layout` (the candidate's, hostile) says, and judge it under the tolerance."""

    cmd: Literal["take"] = "take"
    trial: int | None
    layout: Any = None
    atol: float
    rtol: float


class JudgeCommand(BaseModel):
    """The trials taken, judged: their figures, the determinism re-run's, and how the outputs that compute nothing
    compare."""

    cmd: Literal["judge"] = "judge"
    atol: float
    rtol: float


class ReferenceWindowCommand(BaseModel):
    """Run one window of the reference (eager or torch.compile), or of a call that does nothing (empty): the
    fixed cost of a window, subtracted from every kind's. The parent's clock around the command times it. With
    `staged`, its calls take the inputs the last StageWindowCommand made (of these `seeds`), made before the clock."""

    cmd: Literal["window"] = "window"
    kind: Literal["eager", "compile", "empty"]
    seeds: list[int]
    forward_seeds: list[int]  # torch.manual_seed right before each call: a stochastic reference draws alike
    flush_l2: bool = True
    keep_outputs: bool = False  # kept for the next FingerprintCommand (eager's, in timed rounds)
    staged: bool = False


# The window segments: the candidate's, and eager's own process's, which the candidate never maps (a segment both
# mapped still held a round's inputs, written for eager's window, when the candidate's lead-in of that round ran).
# Eager's process takes its segment under the candidate's name: both run the same child code.
WINDOW_SEGMENT = "window"
EAGER_WINDOW_SEGMENT = "eager_window"


class StageWindowCommand(BaseModel):
    """Make a round's window inputs from `seeds` and keep them (this process's own copy, which its windows and
    lead-ins use); the reply's `layout` says where `FillWindowCommand` will write them in a window segment, one
    layout per call, and `segments` names a new window segment where the last was too small. With `eager`, eager's
    own process has a window segment of its own beside the candidate's, laid out alike."""

    cmd: Literal["stage_window"] = "stage_window"
    seeds: list[int]
    eager: bool = False


class FillWindowCommand(BaseModel):
    """Write the staged inputs into a window segment (its process paused: it sees them only in its window)."""

    cmd: Literal["fill_window"] = "fill_window"
    segment: Literal["window", "eager_window"] = WINDOW_SEGMENT


class LeadInCommand(BaseModel):
    """Calls of `kind` on the staged inputs right before its window, untimed: the window then starts in a process
    (and on a device) that is running, as the candidate's does after its own lead-in."""

    cmd: Literal["lead_in"] = "lead_in"
    kind: Literal["eager", "compile", "empty"]
    calls: int
    flush_l2: bool = True


class FingerprintCommand(BaseModel):
    """Fingerprint the outputs the last window kept (timing.fingerprints) under `key`, and give each the scale of an
    error within the tolerance (timing.fingerprint_scales); then let them go."""

    cmd: Literal["fingerprint"] = "fingerprint"
    key: int
    atol: float
    rtol: float


class CheckHandoverCommand(BaseModel):
    """Compare the candidate's handed-over outputs with the reference on the same seeds, element by element. With
    `defer`, only read them now (the bytes as they are at the hand-over) and compare them at `JudgeHandoversCommand`,
    once the candidate's timed windows are over."""

    cmd: Literal["check_handover"] = "check_handover"
    layouts: list[Any]  # the candidate's, one per pick, each in its slot of the hand-over segment
    seeds: list[int]
    forward_seeds: list[int]
    atol: float
    rtol: float
    defer: bool = False


class JudgeHandoversCommand(BaseModel):
    """Compare the hand-overs read with `defer`, in the order read; then forget them."""

    cmd: Literal["judge_handovers"] = "judge_handovers"
    atol: float
    rtol: float


# --- the candidate's process ---------------------------------------------------------------------------

class CandidateRequest(BaseModel):
    """What the candidate's process is started with; it imports torch, then waits for `Import`. What depends on the
    evaluation's trusted side (the seed its Model was built under) comes with `Construct`."""

    submission_path: Path
    problem: ProblemLoad
    device: Literal["cpu", "cuda"]
    # Subscribe CUPTI before the import, for the kernel trace of a timed window (a CUDA source that can launch a
    # kernel of its own, unless the options say no trace): others never hold a subscription.
    kernel_trace: bool = False


def nonce() -> str:
    return secrets.token_hex(8)


class CandidateCommand(BaseModel):
    cmd: str
    nonce: str = Field(default_factory=nonce)
    # Segments whose descriptors the parent passed on the fd socket just before this command (exchange.Segment.spec:
    # name, nbytes, device, writable), in the order sent: the process takes them before it runs the command.
    segments: list[dict[str, Any]] = []


class Import(CandidateCommand):
    """Import the submission now (running its load_inline builds). Until then the process holds torch and the
    harness's modules only: it can be started ahead of its evaluation, while another one is timed on its GPU."""

    cmd: Literal["import"] = "import"


class Construct(CandidateCommand):
    """After 'imported', once the init arguments are made: construct ModelNew from them (`init_args`, a layout in the
    'init_args' segment) under `param_seed` (the reference Model's, KernelBench's rule), while the trusted side
    writes the reference's parameters."""

    cmd: Literal["construct"] = "construct"
    param_seed: int
    init_args: dict[str, Any]


class LoadParameters(CandidateCommand):
    """After 'constructed', once the reference's parameters are written (`state_dict`, a layout in the 'parameters'
    segment): copy them into the model (by name, then by shape: parameters.match) and move it to the device."""

    cmd: Literal["parameters"] = "parameters"
    state_dict: dict[str, Any]


class RunTrial(CandidateCommand):
    """Run forward on one trial's inputs (`inputs`, a layout in the 'inputs' segment), packing the output into the
    'output' segment for the judge. Trial None is the determinism re-run, on trial 0's inputs."""

    cmd: Literal["trial"] = "trial"
    trial: int | None
    forward_seed: int  # the trial's (the determinism re-run reuses trial 0's), from the trusted side
    inputs: dict[str, Any]


class Window(CandidateCommand):
    """Make each call's inputs from its seed (or with `staged`, take them from the window segment, where the trusted
    side wrote them while this process was paused, as the last LeadIn's layout says), flush the L2, call, wait for the
    device; keep the outputs until the next window. The parent's clock around the command times it (warm-up windows
    are not counted)."""

    cmd: Literal["window"] = "window"
    seeds: list[int]
    forward_seeds: list[int]
    flush_l2: bool = True
    staged: bool = False
    # Trace this window's launches: each kernel first launched in it is reported as it happens ('launched').
    trace: bool = False
    # The calls made to nothing (timing.empty_call): the empty window, where eager's windows run in a process of
    # their own (the reference's, never the candidate's).
    empty: bool = False


class LeadIn(CandidateCommand):
    """Untimed calls right before a window, on what the window segment holds now (the last window's inputs, seen
    already): the window then starts in a running process. `layout` (one per call), where given, says where the
    window segment's inputs lie from now on."""

    cmd: Literal["lead_in"] = "lead_in"
    calls: int
    layout: list[dict[str, Any]] | None = None
    flush_l2: bool = True


class Pin(CandidateCommand):
    """The thread that runs the windows kept to `cores` for the timed rounds (timing.pin_thread), and torch on
    `threads` intra-op threads (timing.keep_threads; None: as many as the process started with)."""

    cmd: Literal["pin"] = "pin"
    cores: list[int]
    threads: int | None = None


class Fingerprint(CandidateCommand):
    """Fingerprint every output the last window kept under `key`, drawn by the parent once that window closed
    (timing.fingerprints): the parent's clock around the command bounds what was left to compute."""

    cmd: Literal["fingerprint"] = "fingerprint"
    key: int


class Scales(CandidateCommand):
    """Each tensor of every output the last window kept, its fingerprint's scale of an error within the tolerance
    (timing.fingerprint_scales): asked only of eager's own process, whose outputs are the reference's."""

    cmd: Literal["scales"] = "scales"
    atol: float
    rtol: float


class Handover(CandidateCommand):
    """Pack the outputs of the last window's calls `picks`, as kept, one to a slot of the 'handover' segment."""

    cmd: Literal["handover"] = "handover"
    window: int
    picks: list[int]


class Trace(CandidateCommand):
    """After the timed rounds: let CUPTI go, and report the handles of what the submission defined: its build's kernels
    and the compiled kernels of the `@triton.jit` functions in its file (the traced window's launches came as they
    happened)."""

    cmd: Literal["trace"] = "trace"


REPLIES = {"import": "imported", "construct": "constructed", "parameters": "parameters_loaded", "trial": "trial_done",
           "window": "window_done", "fingerprint": "fingerprinted", "handover": "handed_over", "trace": "traced",
           "lead_in": "led_in", "pin": "pinned", "scales": "scaled"}


# What the parent reads from the candidate's replies, typed: a reply that does not fit is the candidate's protocol
# violation, never a fault of the harness's (the window's and the hand-over's fields are diagnostics or nothing).
class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class ParametersReply(_Reply):
    state_dict: StateDictCopy | None = None


class TrialReply(_Reply):
    output: Any = None  # the output's layout: hostile data, read by the trusted side alone
    output_changed: bool
    inputs_mutated: list[int]


class HandedOverReply(_Reply):
    layouts: list[Any]


class FingerprintedReply(_Reply):
    sums: list[list[float | None]]


class TracedReply(_Reply):
    own_triton: dict[str, list[int]] = {}
    own_build: dict[str, list[int]] = {}


class LaunchedMessage(_Reply):
    """A kernel first launched in the traced window, as it happened; or a CUDA graph's launch; or why none can be."""

    name: str | None = None
    handle: int | None = None
    graph: bool = False
    error: str | None = None


REPLY_MODELS: dict[str, type[_Reply]] = {"parameters_loaded": ParametersReply, "trial_done": TrialReply,
                                         "handed_over": HandedOverReply,
                                         "fingerprinted": FingerprintedReply, "traced": TracedReply}


class Channel:
    """The child's end: one JSON object per line on an inherited pipe fd."""

    def __init__(self, fd: int):
        self._fd = fd

    def send(self, event: str, **fields: Any) -> None:
        data = (json.dumps({"event": event, **fields}, default=str) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
