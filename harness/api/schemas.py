"""Wire models, named by role: what clients send (…Create, …Request) and get (…Public, …Summary)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from harness.db.queries import BaselineTime, DegenerateAt
from harness.reporting import FastPRow, LeaderboardRow
from harness.schema import Flag, Precision, ProblemRef, Provenance, TimingStats, Tolerance
from harness.verdicts import Verdict

T = TypeVar("T")


def _storable_text(value: Any, where: str = "") -> None:
    """JSON may spell lone UTF-16 surrogates (\\ud800), and NUL (\\u0000), that no database (PostgreSQL)
    can store as text."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where or 'the text'} holds a NUL character (\\u0000), which no Python file or reply "
                             "needs and PostgreSQL cannot store")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where or 'the text'} holds a lone surrogate (an escape such as \\ud800): send valid "
                             "Unicode") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _storable_text(k, "a key")
            _storable_text(v, f"the value of {k!r}")
    elif isinstance(value, list):
        for v in value:
            _storable_text(v, where)


Tag = Annotated[str, StringConstraints(min_length=1, max_length=64, strip_whitespace=True)]


class SubmissionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "problem": "level2/75", "submitter": "alice", "model": "my-llm-v3",
        "source": "import torch\n...\nclass ModelNew(torch.nn.Module):\n    ...", "tags": ["run-12"]}]})

    problem: str = Field(min_length=1, max_length=200,
                         description="Problem slug, KernelBench id (level2/75) or file stem; see /api/problems.")
    source: str | None = Field(None, min_length=1, description="A Python file that defines ModelNew.")
    reply: str | None = Field(None, min_length=1,
                              description="A raw LLM reply; its last Python code block defining ModelNew is used.")
    submitter: str = Field(min_length=1, max_length=100, description="Who submits (a person, a team, a run).")
    model: str = Field(min_length=1, max_length=200, description="The model that wrote the kernel.")
    tags: list[Tag] = Field(default_factory=list, max_length=32)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form JSON kept with the submission.")
    precision: Precision = Field("fp32", description="What to evaluate at, as KernelBench does: the problem's "
                                 "floating-point inputs and both models' parameters cast to fp32, fp16 or bf16, "
                                 "graded at that precision's tolerance, ranked apart from the others.")

    @field_validator("problem", "source", "reply", "submitter", "model", "tags", "metadata")
    @classmethod
    def _valid_unicode(cls, v: Any) -> Any:
        _storable_text(v)
        return v

    @model_validator(mode="after")
    def _one_text(self) -> SubmissionCreate:
        if (self.source is None) == (self.reply is None):
            raise ValueError("give the code in exactly one of the fields 'source' (a Python file) or 'reply' "
                             "(a raw LLM reply)")
        return self

    @property
    def text_and_kind(self) -> tuple[str, str]:
        return (self.source, "source") if self.source is not None else (str(self.reply), "reply")


class SubmissionAccepted(BaseModel):
    id: int
    status: str
    problem_id: str
    position: int | None = Field(description="1: the next job a worker takes.")
    url: str
    warning: str | None = Field(None, description="Set when the text will not evaluate (it is stored and judged "
                                "invalid_submission all the same), or when no live worker can take it (it waits).")


class ErrorFigures(BaseModel):
    """The worst figures over all correctness trials and outputs."""

    trials: int
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    err_vs_fp64: float | None = None
    ref_err_vs_fp64: float | None = None


class Timings(BaseModel):
    candidate: TimingStats | None = None
    eager: TimingStats | None = None
    compile: TimingStats | None = None
    compile_baseline_error: str | None = None


class ResultPublic(BaseModel):
    id: int
    verdict: str
    message: str
    log_excerpt: str
    flags: list[Flag]
    origin: str = Field(description="sandbox (an evaluation), queue (out of attempts, nothing measured) or regrade.")
    regraded_from: int | None
    device: str | None = Field(description="cuda, or cpu for a CPU result (small sizes; never ranked with GPU "
                               "results); null when nothing ran.")
    problem: ProblemRef
    tolerance: Tolerance
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    speedup_known_to: float | None = Field(
        default=None, description="What the speedups are known to: the 95% half-width, relative, of the candidate's "
        "time over each baseline's paired by round (the wider of eager's and torch.compile's); 0.02 reads +-2%. "
        "Null where nothing was timed, or for results stored before it was kept.")
    errors: ErrorFigures
    timings: Timings
    provenance: Provenance | None
    created_at: datetime


class SubmissionSummary(BaseModel):
    id: int
    problem_id: str
    submitter: str
    model: str
    tags: list[str]
    precision: Precision
    created_at: datetime
    status: str
    verdict: str | None
    message: str | None
    device: str | None
    tolerance: Tolerance | None = Field(description="The tolerance the current result was graded at.")
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None


class WorkerSilence(BaseModel):
    """An evaluation whose worker has stopped sending heartbeats: what the submission is waiting for."""

    worker_id: str | None
    silent_since: datetime = Field(description="The job's last heartbeat.")
    requeue_at: datetime | None = Field(description="When its lease expires and the job goes back to the queue "
                                        "(sooner if a worker restarts on that host).")
    message: str


class SubmissionPublic(BaseModel):
    id: int
    problem_id: str
    problem_version: int
    submitter: str
    model: str
    tags: list[str]
    metadata: dict[str, Any]
    text_kind: str
    text: str
    precision: Precision
    created_at: datetime
    status: str = Field(description="queued, compiling, running or done (of its latest evaluation).")
    position: int | None = Field(description="Place in the queue while queued.")
    attempts: int
    verdict: str | None = Field(description="The current result's verdict.")
    waiting: WorkerSilence | None = Field(None, description="Set while compiling or running and the job's worker "
                                          "has sent no heartbeat for several intervals.")
    waits_for: str | None = Field(None, description="Set while queued and no live worker can take the job, e.g. "
                                  "\"waits for a GPU worker; none is connected\".")
    needs: str | None = Field(None, description="What its evaluation needs of a worker: null (any), \"cuda\", "
                              "\"cuda sm_90a\" (read from the source when it was queued).")
    result: ResultPublic | None


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class SizePublic(BaseModel):
    overrides: dict[str, Any]
    flops: float | None
    min_bytes: float | None


class ProblemPublic(BaseModel):
    id: str
    version: int
    kernelbench_id: str | None
    name: str
    description: str
    tolerance: Tolerance
    tolerances: dict[str, Tolerance] = Field(description="The tolerance at each precision (fp32's is `tolerance`).")
    sizes: dict[str, SizePublic]
    compile_timeout_s: float
    run_timeout_s: float
    init_args: list[str]
    stochastic: list[str] = Field(default_factory=list, description="What in the reference draws random numbers "
                                  "(dropout): both sides then run each call after the same fresh torch.manual_seed.")


class ProblemDetail(ProblemPublic):
    source: str
    constants: dict[str, str]
    baseline_times: list[BaselineTime] = Field(
        description="The reference's times on each device and size: the median of the measurements the harness "
        "vouches for, with how many there were (a measurement in windows too noisy to vouch for is left out).")
    degenerate: list[DegenerateAt] = Field(
        default_factory=list, description="Where outputs that compute nothing (zeros, a constant, each row's mean) "
        "pass: results there are flagged degenerate_tolerance and not ranked.")


class Board(BaseModel):
    rows: list[LeaderboardRow]
    fast_p: list[FastPRow]


class LeaderboardPublic(BaseModel):
    problem: str | None
    baseline: str
    precision: Precision = Field(description="The boards' results all ran at this precision.")
    thresholds: list[float]
    gpu: Board
    cpu: Board = Field(description="CPU results (small sizes), ranked apart from GPU results.")


class ReevalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    problem: str | None = None
    verdict: Verdict | None = None
    since: datetime | None = None
    regrade_only: bool = Field(False, description="Grade the stored figures again (no GPU) instead of re-running.")
    atol: float | None = Field(None, gt=0, description="With regrade_only: grade under this tolerance "
                               "(one of atol and rtol given alone stands for both).")
    rtol: float | None = Field(None, ge=0)
    undo: bool = Field(False, description="Restore the grading each matching result had before its latest re-grade.")
    dry_run: bool = Field(False, description="With regrade_only or undo: report what would change, write nothing.")

    @model_validator(mode="after")
    def _rtol_alone_is_a_valid_atol(self) -> ReevalRequest:
        if self.atol is None and self.rtol == 0:
            raise ValueError("rtol given alone stands for atol too, and atol must be greater than 0: "
                             "give atol as well (e.g. atol=1e-4, rtol=0)")
        if self.undo and self.regrade_only:
            raise ValueError("undo restores the grading before a re-grade: give it without regrade_only")
        return self


class ReevalSummary(BaseModel):
    matched: int
    dry_run: bool = False
    queued: int = 0
    already_queued: int = 0
    regraded: int = Field(0, description="Results given a new revision (re-grade): verdict changed, or graded at "
                          "another tolerance with the same verdict.")
    verdicts_changed: int = 0
    unchanged: int = 0
    skipped: int = Field(0, description="Results without figures a tolerance applies to (re-grade), or without a "
                         "re-grade to undo (undo).")
    restored: int = Field(0, description="Results whose grading before their latest re-grade is current again.")
    transitions: dict[str, int] = Field(default_factory=dict, description="'before -> after': count.")
    outcomes: dict[str, int] = Field(default_factory=dict, description="What happened to each result: count.")


class ReevalOne(BaseModel):
    submission_id: int
    job_id: int | None = None
    position: int | None = None
    verdict: str | None = None


class WorkerPublic(BaseModel):
    id: str
    hostname: str
    slots: list[str]
    last_seen: datetime


class Unmet(BaseModel):
    """Queued jobs that no live worker can take."""

    needs: str | None = Field(description="What they need: null (any worker), \"cuda\", \"cuda sm_90a\".")
    message: str = Field(description="e.g. \"waits for a GPU worker; none is connected\".")
    jobs: int
    submission_ids: list[int] = Field(description="The oldest few.")


class Health(BaseModel):
    status: str = Field(description="ok; degraded while queued jobs wait for a worker that none live can be "
                        "(`waiting` says which); unavailable when the database does not answer.")
    version: str
    database: str
    open_mode: bool
    queue: dict[str, int]
    workers: list[WorkerPublic]
    waiting: list[Unmet] = []


class ErrorBody(BaseModel):
    detail: str
    suggestions: list[str] | None = None
