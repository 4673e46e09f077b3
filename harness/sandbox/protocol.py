"""Messages between the parent and its two kinds of child. No torch here: the parent imports this.

Children answer with JSON lines on a pipe the parent made (`Channel`); what a candidate's process
says is a claim, checked by the parent and the trusted judge, never taken as a verdict.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

MAX_MESSAGE_BYTES = 1 << 20


class ProblemLoad(BaseModel):
    """How a child loads the problem module: by path, with size overrides applied to its constants."""

    path: Path
    overrides: dict[str, Any] = Field(default_factory=dict)


class TimingConfig(BaseModel):
    warmup: int = 5
    calls: int = 100
    flush_l2: bool = True


class WarmupCommand(BaseModel):
    """The parent's go-ahead for a candidate whose trials were judged correct: warm up on inputs from
    this seed (unrelated to the timed inputs' seed), then say "warmed"."""

    cmd: Literal["warmup"] = "warmup"
    seed: int


class TimeCommand(BaseModel):
    """Time now. The seed of the timed inputs travels only here, after the warm-up: a submission cannot
    prepare answers for inputs it cannot know before, and whatever it does once it knows them is
    inside the parent's envelope, which opens when this command is sent."""

    cmd: Literal["time"] = "time"
    seed: int  # inputs of timed call i come from get_inputs() under seed + i


class PrepareCommand(BaseModel):
    cmd: Literal["prepare"] = "prepare"
    problem: ProblemLoad
    device: Literal["auto", "cpu", "cuda"]
    param_seed: int
    input_seed: int  # secret: never leaves the trusted process
    trials: int
    extra_distribution: bool = True  # one more trial on randn*2+0.5 inputs (see problem_module)
    exchange_dir: Path


class JudgeCommand(BaseModel):
    cmd: Literal["judge"] = "judge"
    outputs_dir: Path
    atol: float
    rtol: float


class TimeReferenceCommand(BaseModel):
    cmd: Literal["time_reference"] = "time_reference"
    timing: TimingConfig
    seed: int
    compile_baseline: bool


class CheckTimedCommand(BaseModel):
    """Recompute the reference on the inputs of some timed calls and compare output fingerprints."""

    cmd: Literal["check_timed"] = "check_timed"
    timing_seed: int
    indices: list[int]
    fingerprints: list[Any]  # the candidate's, one per index
    atol: float
    rtol: float


class CandidateRequest(BaseModel):
    submission_path: Path
    problem: ProblemLoad
    device: Literal["cpu", "cuda"]
    param_seed: int
    exchange_dir: Path  # init.pt (init args + reference state dict) and inputs_<i>.pt, from the trusted side
    outputs_dir: Path
    timing: TimingConfig | None


class ConstructCommand(BaseModel):
    """After 'imported': the trusted side has written the exchange dir; construct the model and run the trials."""

    cmd: Literal["construct"] = "construct"
    trials: int


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
