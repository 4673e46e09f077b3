"""Demo results: what a few weeks of LLM submissions to the six built-in problems look like.

For trying the leaderboard pages and for their browser tests. Each result is made of raw figures
(`Observations`) drawn from plausible distributions (H100 reference times from PROBLEMS.md, speedups
below the fp32 ceiling, TF32 shortcuts that fail 1e-4, the mistakes the seed documents show), graded by
`grading.grade`, and stored through the queue like a worker's result (create, claim, complete).
Deterministic for a given seed.
"""

from __future__ import annotations

import hashlib
import math
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy.orm import Session

from harness import __version__, grading
from harness.db import crud
from harness.problems.spec import ProblemSpec
from harness.schema import (
    ChildError,
    ChildExit,
    DeterminismFigures,
    EvalResult,
    FlagChange,
    Observations,
    OutputFigures,
    ProblemRef,
    Provenance,
    StateDictCopy,
    StaticFinding,
    TimedOutputCheck,
    TimingStats,
    TrialFigures,
)
from harness.verdicts import Phase, Verdict

# (eager ms, torch.compile ms) on an H100, and how much faster an fp32-exact solution can be (PROBLEMS.md).
H100_TIMES: dict[str, tuple[float, float, float]] = {
    "level2/75": (3.089, 2.873, 1.14), "level2/62": (3.085, 2.834, 1.15), "level2/37": (8.636, 6.072, 1.47),
    "level2/94": (2.954, 2.776, 1.10), "level2/30": (2.852, 2.754, 1.04), "level2/88": (3.069, 2.757, 1.13),
}
OUTCOMES = ("passed", "passed_low_precision", "compile_error", "runtime_error", "crashed", "wrong_answer",
            "tf32_wrong_answer", "shape_mismatch", "timeout", "flagged_tf32_flag", "flagged_timed_outputs",
            "invalid_submission")


@dataclass(frozen=True)
class DemoModel:
    submitter: str
    model: str
    skill: float  # median speedup of its passing kernels, as a share of the fp32 ceiling
    pass_rate: float


MODELS = (
    DemoModel("anthropic-evals", "claude-sonnet-4.5", 0.93, 0.70),
    DemoModel("openai-sweep", "gpt-5", 0.88, 0.62),
    DemoModel("dslab", "deepseek-r1", 0.72, 0.45),
    DemoModel("rl-loop-7", "qwen2.5-coder-32b-rl", 0.55, 0.35),
)

_SOURCE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# {model}, attempt {attempt}: {idea}
cuda_src = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

template <int BLOCK>
__global__ void {kernel}_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                const float* __restrict__ beta, float* __restrict__ out,
                                int rows, int channels, int groups, float eps) {{
    const int row = blockIdx.x, group = blockIdx.y;
    const int per_group = channels / groups;
    const float* xs = x + (size_t)row * channels + group * per_group;
    float sum = 0.f, sq = 0.f;
    for (int i = threadIdx.x; i < per_group; i += BLOCK) {{ float v = xs[i]; sum += v; sq += v * v; }}
    __shared__ float s_sum[BLOCK], s_sq[BLOCK];
    s_sum[threadIdx.x] = sum; s_sq[threadIdx.x] = sq;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) {{
            s_sum[threadIdx.x] += s_sum[threadIdx.x + s];
            s_sq[threadIdx.x] += s_sq[threadIdx.x + s];
        }}
        __syncthreads();
    }}
    const float mean = s_sum[0] / per_group;
    const float rstd = rsqrtf(s_sq[0] / per_group - mean * mean + eps);
    for (int i = threadIdx.x; i < per_group; i += BLOCK) {{
        const int c = group * per_group + i;
        out[(size_t)row * channels + c] = (xs[i] - mean) * rstd * gamma[c] + beta[c];
    }}
}}

torch::Tensor {kernel}(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, int64_t groups, double eps) {{
    auto out = torch::empty_like(x);
    dim3 grid(x.size(0), groups);
    {kernel}_kernel<{block}><<<grid, {block}>>>(x.data_ptr<float>(), gamma.data_ptr<float>(),
        beta.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), groups, (float)eps);
    return out;
}}
"""

ext = load_inline(name="{kernel}", cpp_sources="torch::Tensor {kernel}(torch::Tensor, torch::Tensor, "
                  "torch::Tensor, int64_t, double);", cuda_sources=cuda_src, functions=["{kernel}"])


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        # Same parameters, same order as Model: seeded initialisation then matches.
        self.gemm = nn.Linear(args[0], args[1])
        self.group_norm = nn.GroupNorm(args[2], args[1])

    def forward(self, x):
        x = self.gemm(x)
        return ext.{kernel}(x, self.group_norm.weight, self.group_norm.bias, self.group_norm.num_groups, 1e-5)
'''

_IDEAS = ("keep cuBLAS for the GEMM, fuse the GroupNorm epilogue", "one block per (row, group), warp shuffles",
          "vectorised float4 loads in the epilogue", "two-pass Welford statistics",
          "persistent kernel over row tiles")

_TRUNCATED_REPLY = ("I'll optimize this model by fusing the GEMM with the GroupNorm and the elementwise ops into a "
                    "single CUDA kernel. The key insight is that the GroupNorm statistics can be computed in shared "
                    "memory while the GEMM tile is still resident, so we avoid a round trip through HBM.\n\n"
                    "Here is the plan:\n1. Tile the GEMM with 128x128 blocks\n2. Accumulate per-group sums")


def _timing(rng: random.Random, median: float, n: int = 15) -> TimingStats:
    """Figures shaped like the parent's timed windows: n windows of about 60 ms each."""
    spread = rng.uniform(0.004, 0.03)
    calls = max(1, round(60 / max(median, 1e-3)))
    return TimingStats(clock="parent_window", n=n, median_ms=round(median, 4),
                       mean_ms=round(median * (1 + spread / 3), 4), min_ms=round(median * (1 - spread / 2), 4),
                       max_ms=round(median * (1 + spread * rng.uniform(2, 6)), 4),
                       std_ms=round(median * spread / 2, 5), overhead_ms=0.006, calls_per_window=calls,
                       spread=round(spread, 4))


def _shape(kb: str) -> list[int]:
    return {"level2/75": [1, 8192, 1024, 1], "level2/37": [32768, 4096]}.get(kb, [1024, 8192])


def _output(rng: random.Random, kb: str, *, rel: float, cand_fp64: float, index: int = 0,
            got_shape: list[int] | None = None) -> OutputFigures:
    shape = _shape(kb)
    numel = math.prod(shape)
    got = got_shape or shape
    fig = OutputFigures(index=index, got_type="Tensor", got_shape=got, got_dtype="torch.float32", got_device="cuda:0",
                        expected_shape=shape, expected_dtype="torch.float32")
    if got != shape:
        return fig
    expected = rng.uniform(-2, 2)
    abs_err = rel * (1 + abs(expected))
    fig.nonfinite_mismatches = 0
    fig.max_abs_err, fig.max_rel_err, fig.numel = abs_err, rel, numel
    fig.min_atol_at_rtol = {f"{r:g}": max(abs_err - r * abs(expected), 0.0) for r in (0.0, 1e-5, 1e-4, 1e-3, 1e-2)}
    fig.worst_index = [rng.randrange(d) for d in shape]
    fig.worst_expected, fig.worst_got = expected, expected + abs_err
    fig.mismatches_at_eval_tolerance = 0 if rel <= 1e-4 else int(numel * min(1.0, rel * rng.uniform(0.5, 3)))
    fig.err_vs_fp64 = cand_fp64
    fig.ref_err_vs_fp64 = rng.uniform(2.5e-7, 6e-7)
    fig.rel_l2_vs_fp64, fig.ref_rel_l2_vs_fp64 = cand_fp64 / 8, fig.ref_err_vs_fp64 / 8
    return fig


def _trials(rng: random.Random, kb: str, rel: float, cand_fp64: float, n: int = 5, **kw) -> list[TrialFigures]:
    return [TrialFigures(trial=i, outputs=[_output(rng, kb, rel=rel * rng.uniform(0.7, 1.0),
                                                   cand_fp64=cand_fp64 * rng.uniform(0.8, 1.0), **kw)])
            for i in range(n)]


def _build_log(kernel: str, error: str) -> str:
    return (f"[1/3] /usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME={kernel} -O3 -gencode=arch=compute_90,code=sm_90 "
            f"-c cuda.cu -o cuda.cuda.o\nFAILED: cuda.cuda.o\n/tmp/torch_extensions/{kernel}/cuda.cu(41): error: "
            f"{error}\n\n1 error detected in the compilation of \"cuda.cu\".\nninja: build stopped: subcommand failed.")


def observations(rng: random.Random, outcome: str, kb: str, speedup: float, kernel: str) -> Observations:
    """Raw figures of one evaluation with the given outcome (see OUTCOMES)."""
    eager, compiled, _ = H100_TIMES[kb]
    eager *= rng.uniform(0.99, 1.015)
    compiled *= rng.uniform(0.99, 1.015)
    obs = Observations(trials_expected=5)
    timed = {"candidate_timing": _timing(rng, eager / speedup), "eager_timing": _timing(rng, eager),
             "compile_timing": _timing(rng, compiled)}
    exact = rng.uniform(3e-7, 9e-7)
    if outcome == "invalid_submission":
        obs.static_error = ("no code: the reply has no fenced code block and no `class ModelNew` (it may have been "
                            "cut off)")
        obs.trials_expected = 0
    elif outcome == "compile_error":
        error = rng.choice(['identifier "blockDim_x" is undefined',
                            'no instance of overloaded function "atomicAdd" matches the argument list',
                            'expression must have a constant value'])
        log = _build_log(kernel, error)
        obs.candidate_exit = ChildExit(returncode=1, finished=True, phase=Phase.compile)
        obs.candidate_error = ChildError(phase=Phase.compile, exc_type="RuntimeError",
                                         message=f"Error building extension '{kernel}':\n{log}",
                                         traceback="Traceback (most recent call last):\n  File \"submission.py\", "
                                         "line 52, in <module>\n    ext = load_inline(...)\nRuntimeError: Error "
                                         f"building extension '{kernel}'")
        obs.log_tail = log
    elif outcome in ("runtime_error", "crashed"):
        msg = ("CUDA error: invalid configuration argument\nCUDA kernel errors might be asynchronously reported"
               if outcome == "runtime_error" else "CUDA error: an illegal memory access was encountered")
        obs.candidate_exit = ChildExit(returncode=1, finished=True, phase=Phase.correctness)
        obs.candidate_error = ChildError(phase=Phase.correctness, exc_type="RuntimeError", message=msg,
                                         traceback="Traceback (most recent call last):\n  File \"submission.py\", "
                                         f"line 71, in forward\n    return ext.{kernel}(x, ...)\nRuntimeError: {msg}")
        obs.log_tail = f"launching {kernel}_kernel with grid (1024, 512) block (2048)\n" if outcome == "runtime_error" \
            else "compute-sanitizer not attached\n"
    elif outcome == "timeout":
        obs.trials = _trials(rng, kb, rng.uniform(1e-6, 2e-5), exact)
        obs.candidate_exit = ChildExit(returncode=None, signal="SIGKILL", timed_out=True, deadline_s=300.0,
                                       phase=Phase.timing)
        obs.log_tail = "warm-up call 1 of 5\nwarm-up call 2 of 5\n"
    elif outcome == "shape_mismatch":
        obs.trials = [TrialFigures(trial=i, outputs=[_output(rng, kb, rel=0, cand_fp64=0, got_shape=[1024, 1])])
                      for i in range(5)]
    elif outcome in ("wrong_answer", "tf32_wrong_answer"):
        rel = rng.uniform(0.2, 1.5) if outcome == "wrong_answer" else rng.uniform(8e-4, 3e-3)
        obs.trials = _trials(rng, kb, rel, rel * 0.9)
        obs.determinism = DeterminismFigures(bitwise_equal=True, max_rel_diff=0.0)
    else:
        low = outcome == "passed_low_precision"
        obs.trials = _trials(rng, kb, rng.uniform(2e-5, 6e-5) if low else rng.uniform(1e-6, 1.5e-5),
                             rng.uniform(2e-5, 6e-5) if low else exact)
        obs.determinism = DeterminismFigures(bitwise_equal=True, max_rel_diff=0.0)
        names = ["gemm.weight", "gemm.bias", "group_norm.weight", "group_norm.bias"]
        obs.state_dict = StateDictCopy(copied=names, drawn=names)
        obs.timed_outputs = TimedOutputCheck(reported=100, expected=100, checked=[3, 41, 97])
        for name, value in timed.items():
            setattr(obs, name, value)
        if outcome == "flagged_tf32_flag":
            obs.flag_changes = [FlagChange(name="torch.backends.cuda.matmul.allow_tf32", before=False, after=True,
                                           when="import")]
        elif outcome == "flagged_timed_outputs":
            obs.timed_outputs = TimedOutputCheck(reported=100, expected=100, checked=[7, 55, 90],
                                                 mismatches=["call 55: output fingerprint differs from the reference"])
        elif outcome == "passed" and rng.random() < 0.08:
            obs.static_findings = [StaticFinding(rule="timer_patch", line=88,
                                                 detail="assigns to torch.cuda.Event.elapsed_time")]
    return obs


# What the trusted process records (evaluation/torchflags.snapshot) under torch 2.13's defaults.
REFERENCE_TORCH_FLAGS = {
    "default_dtype": "torch.float32", "float32_matmul_precision": "highest", "deterministic_algorithms": False,
    "cuda.matmul.allow_tf32": False, "cuda.matmul.allow_fp16_reduced_precision_reduction": True,
    "cuda.matmul.allow_bf16_reduced_precision_reduction": True, "cudnn.enabled": True, "cudnn.allow_tf32": True,
    "cudnn.benchmark": False, "cudnn.deterministic": False, "fp32_precision": "none",
    "cuda.matmul.fp32_precision": "none", "cudnn.fp32_precision": "none",
}


def _provenance(rng: random.Random, when: datetime) -> Provenance:
    return Provenance(harness_version=__version__, device="cuda", device_name="NVIDIA H100 80GB HBM3",
                      compute_capability="9.0", torch_version="2.11.0+cu130", cuda_version="13.0",
                      driver_version="580.159.04", python_version="3.11.9",
                      hostname=f"gpu-node-{rng.randrange(1, 5):02d}",
                      reference_torch_flags=REFERENCE_TORCH_FLAGS,
                      started_at=when, wall_s=round(rng.uniform(25, 140), 1))


def demo_result(rng: random.Random, spec: ProblemSpec, outcome: str, *, model: str = "demo", attempt: int = 1,
                skill: float = 0.85, when: datetime | None = None) -> tuple[str, EvalResult]:
    """A submission text and its graded result for one outcome, evaluated at `when` (default: now, for a
    submission stored now: never evaluated before it was submitted)."""
    kb = spec.kernelbench_id or "level2/75"
    ceiling = H100_TIMES.get(kb, H100_TIMES["level2/75"])[2]
    if outcome == "tf32_wrong_answer":
        speedup = rng.uniform(3.2, 4.4)
    elif outcome == "flagged_tf32_flag":
        speedup = rng.uniform(3.0, 4.0)
    else:
        speedup = min(ceiling * 0.995, ceiling * skill * math.exp(rng.gauss(0, 0.28)))
    kernel = f"gn_fused_{hashlib.sha256(f'{model}{spec.id}{attempt}'.encode()).hexdigest()[:6]}"
    text = _TRUNCATED_REPLY if outcome == "invalid_submission" else _SOURCE.format(
        model=model, attempt=attempt, idea=rng.choice(_IDEAS), kernel=kernel, block=rng.choice((128, 256, 512)))
    obs = observations(rng, outcome, kb, speedup, kernel)
    g = grading.grade(obs, spec.tolerance)
    started = when or datetime.now(timezone.utc)
    result = EvalResult(
        **g.result_fields(),
        problem=ProblemRef(id=spec.id, version=spec.version, kernelbench_id=spec.kernelbench_id, size="default",
                           source=str(spec.source_path.name)),
        tolerance=spec.tolerance, submission_sha256=hashlib.sha256(text.encode()).hexdigest(),
        observations=obs, provenance=None if outcome == "invalid_submission" else _provenance(rng, started))
    return text, result


def _pick_outcome(rng: random.Random, m: DemoModel) -> str:
    if rng.random() < m.pass_rate:
        return rng.choices(["passed", "passed_low_precision"], [0.9, 0.1])[0]
    return rng.choices(OUTCOMES[2:], [16, 8, 4, 14, 10, 5, 6, 3, 2, 6])[0]


def store(session: Session, spec: ProblemSpec, text: str, result: EvalResult, *, submitter: str, model: str,
          tags: list[str] | None = None, created_at: datetime | None = None) -> int:
    """Store a submission and its result as a worker would (create, claim, complete); returns its id."""
    batch = f"demo-{uuid.uuid4().hex[:10]}"  # claim exactly this job, whatever else is queued
    new = crud.NewSubmission(problem_id=spec.id, problem_version=spec.version, text=text,
                             text_kind="reply" if result.verdict == Verdict.invalid_submission else "source",
                             submitter=submitter, model=model, tags=tags or [], meta={"demo": True},
                             created_at=created_at)
    sub, _ = crud.create_submission(session, new, token=None, queue_limit=None, max_attempts=3, batch=batch)
    claim = crud.claim_job(session, "demo-seed", 60, batch=batch)
    if claim is None:
        raise RuntimeError("could not claim the demo job just queued")
    crud.complete_job(session, claim.job_id, claim.claim_token, result)
    return sub.id


def queue_pending(session: Session, spec: ProblemSpec, text: str, *, submitter: str, model: str,
                  running: bool = False) -> int:
    """A submission left queued (or claimed and running): its page refreshes itself."""
    batch = f"demo-pending-{uuid.uuid4().hex[:10]}"
    new = crud.NewSubmission(problem_id=spec.id, problem_version=spec.version, text=text, text_kind="source",
                             submitter=submitter, model=model, tags=[], meta={"demo": True})
    sub, _ = crud.create_submission(session, new, token=None, queue_limit=None, max_attempts=3, batch=batch)
    if running:
        claim = crud.claim_job(session, "demo-seed", 3600, batch=batch)
        if claim is not None:
            crud.mark_running(session, claim.job_id, claim.claim_token)
    return sub.id


@dataclass
class SeedSummary:
    submissions: int
    verdicts: dict[str, int]
    pending: list[int]


def seed_demo(session: Session, problems: list[ProblemSpec], *, seed: int = 0, attempts: tuple[int, int] = (2, 4),
              pending: bool = True, models: tuple[DemoModel, ...] = MODELS) -> SeedSummary:
    """Every demo model tries every problem a few times; optionally one queued and one running submission."""
    rng = random.Random(seed)  # noqa: S311 - demo figures, not secrets
    verdicts: dict[str, int] = {}
    n = 0
    now = datetime.now(timezone.utc)
    for spec in problems:
        for m in models:
            when = now - timedelta(days=rng.uniform(2, 28))  # a sweep's first attempt, then the retries
            for attempt in range(1, rng.randint(*attempts) + 1):
                when += timedelta(minutes=rng.uniform(3, 90))
                text, result = demo_result(rng, spec, _pick_outcome(rng, m), model=m.model, attempt=attempt,
                                           skill=m.skill, when=when)
                store(session, spec, text, result, submitter=m.submitter, model=m.model, tags=["demo"],
                      created_at=when - timedelta(seconds=rng.uniform(5, 120)))  # queued, then evaluated
                verdicts[result.verdict.value] = verdicts.get(result.verdict.value, 0) + 1
                n += 1
    ids = []
    if pending and problems:
        m = models[0]
        for running in (False, True):
            text, _ = demo_result(rng, problems[0], "passed", model=m.model, attempt=99)
            ids.append(queue_pending(session, problems[0], text, submitter=m.submitter, model=m.model,
                                     running=running))
    return SeedSummary(submissions=n, verdicts=verdicts, pending=ids)
