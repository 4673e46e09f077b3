"""What the parent and its two kinds of child say to each other, and the files they exchange. No torch here.

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

# The exchange: the trusted side writes the Model's init arguments, then the reference's parameters, then the trials'
# inputs into the exchange dir (the candidate reads them); the candidate writes its outputs into its own outputs dir
# (the trusted side reads them).
INIT_ARGS_FILE = "init_args.pt"
PARAMETERS_FILE = "parameters.pt"
DETERMINISM_FILE = "det.pt"


def inputs_file(trial: int) -> str:
    return f"inputs_{trial}.pt"


def output_file(trial: int) -> str:
    return f"out_{trial}.pt"


def handover_file(window: int, call: int) -> str:
    return f"handover_{window}_{call}.pt"


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
    exchange_dir: Path
    # The judge's tolerance, where known: the outputs that compute nothing are judged ahead under it
    # (Trusted.trivial_ahead).
    atol: float | None = None
    rtol: float | None = None
    # The memory plan's (memory_plan.plan): a cap below the device's free memory, and the spare it keeps; bytes.
    memory_budget: int | None = None
    memory_reserve: int = 0


class JudgeCommand(BaseModel):
    cmd: Literal["judge"] = "judge"
    outputs_dir: Path
    atol: float
    rtol: float


class ReferenceWindowCommand(BaseModel):
    """Run one window of the reference (eager or torch.compile), or of a call that does nothing (empty): the
    fixed cost of a window, subtracted from every kind's. The parent's clock around the command times it."""

    cmd: Literal["window"] = "window"
    kind: Literal["eager", "compile", "empty"]
    seeds: list[int]
    forward_seeds: list[int]  # torch.manual_seed right before each call: a stochastic reference draws alike
    flush_l2: bool = True
    keep_outputs: bool = False  # kept for the next FingerprintCommand (eager's, in timed rounds)


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
    files: list[Path]
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
    exchange_dir: Path  # INIT_ARGS_FILE, PARAMETERS_FILE and inputs_file(i), from the trusted side
    outputs_dir: Path
    # Subscribe CUPTI before the import, for the kernel trace of a timed window (a CUDA source that can launch a
    # kernel of its own, unless the options say no trace): others never hold a subscription.
    kernel_trace: bool = False


def nonce() -> str:
    return secrets.token_hex(8)


class CandidateCommand(BaseModel):
    cmd: str
    nonce: str = Field(default_factory=nonce)


class Import(CandidateCommand):
    """Import the submission now (running its load_inline builds). Until then the process holds torch and the
    harness's modules only: it can be started ahead of its evaluation, while another one is timed on its GPU."""

    cmd: Literal["import"] = "import"


class Construct(CandidateCommand):
    """After 'imported', once INIT_ARGS_FILE is written: construct ModelNew from it under `param_seed` (the reference
    Model's, KernelBench's rule), while the trusted side writes the reference's parameters."""

    cmd: Literal["construct"] = "construct"
    param_seed: int


class LoadParameters(CandidateCommand):
    """After 'constructed', once PARAMETERS_FILE is written: copy the reference's tensors into the model (by name,
    then by shape: parameters.match) and move it to the device."""

    cmd: Literal["parameters"] = "parameters"


class RunTrials(CandidateCommand):
    """Run forward on each trial's inputs (then trial 0's again), saving the outputs for the judge."""

    cmd: Literal["trials"] = "trials"
    trials: int
    forward_seeds: list[int]  # one per trial (the determinism re-run reuses trial 0's), from the trusted side


class Window(CandidateCommand):
    """Make each call's inputs from its seed, flush the L2, call, wait for the device; keep the outputs until the
    next window. The parent's clock around the command times it (warm-up windows are not counted)."""

    cmd: Literal["window"] = "window"
    seeds: list[int]
    forward_seeds: list[int]
    flush_l2: bool = True
    # Trace this window's launches: each kernel first launched in it is reported as it happens ('launched').
    trace: bool = False


class Fingerprint(CandidateCommand):
    """Fingerprint every output the last window kept under `key`, drawn by the parent once that window closed
    (timing.fingerprints): the parent's clock around the command bounds what was left to compute."""

    cmd: Literal["fingerprint"] = "fingerprint"
    key: int


class Handover(CandidateCommand):
    """Save the outputs of the last window's calls `picks`, as kept, to handover_file(window, call)."""

    cmd: Literal["handover"] = "handover"
    window: int
    picks: list[int]


class Trace(CandidateCommand):
    """After the timed rounds: let CUPTI go, and report the handles of what the submission defined: its build's kernels
    and the compiled kernels of the `@triton.jit` functions in its file (the traced window's launches came as they
    happened)."""

    cmd: Literal["trace"] = "trace"


REPLIES = {"import": "imported", "construct": "constructed", "parameters": "parameters_loaded", "trials": "trials_done",
           "window": "window_done", "fingerprint": "fingerprinted", "handover": "handed_over", "trace": "traced"}


# What the parent reads from the candidate's replies, typed: a reply that does not fit is the candidate's protocol
# violation, never a fault of the harness's (the window's and the hand-over's fields are diagnostics or nothing).
class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class ParametersReply(_Reply):
    state_dict: StateDictCopy | None = None


class TrialsReply(_Reply):
    outputs_changed: list[int | None]
    inputs_mutated: list[tuple[int | None, list[int]]]


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


REPLY_MODELS: dict[str, type[_Reply]] = {"parameters_loaded": ParametersReply, "trials_done": TrialsReply,
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
