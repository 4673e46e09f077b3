"""KernelBench's metrics by KernelBench's definitions, so that a paper can cite ours beside theirs. Pure: no DB,
no GPU, no torch.

The definitions are those of KernelBench's analysis (`scripts/benchmark_eval_analysis.py`, `score.py`):

- a level's problems are all of them: a problem without a result counts as neither compiled nor correct;
- one sample per problem, sample 0;
- compilation rate and correctness rate: compiled (correct) sample-0 results over the level's problems;
- fast_p: correct sample-0 results more than p times faster than the baseline, over the level's problems;
  speedup = the baseline's mean time / the sample's mean time (`runtime`), both in ms;
- geometric-mean speedup of the correct results, and of the correct results faster than the baseline;
- pass@k over all samples of a problem: the unbiased estimator 1 - C(n-c, k) / C(n, k) (n samples, c correct).

Where the harness adds to them, it says so by name:

- a time the harness does not vouch for (`reporting.ranked`: timing_unreliable, shared_gpu, no_custom_kernel,
  degenerate_tolerance) is correct but never faster: it counts for fast_p at p = 0 only and in no geometric
  mean (KernelBench's script reading our export would count it by its runtime; `unvouched` says how many);
- fast_0 is the correctness rate (KernelBench's is the share correct with a positive speedup: the same wherever
  every correct result was timed);
- pass@k averages over the problems with at least k samples (`pass_at_k_problems` says how many), where
  KernelBench's average divides by every problem it has results for.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

THRESHOLDS: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)  # KernelBench's p values


@dataclass(frozen=True)
class Sample:
    """One sample of one problem, as KernelBench's eval results hold it."""

    problem: int  # the problem's number in its level (level2/75: 75)
    sample: int
    compiled: bool
    correct: bool
    runtime_ms: float | None = None  # KernelBench's `runtime`: the mean time per call; None: not timed
    vouched: bool = True  # whether the harness vouches for runtime_ms (a result of another tool: True)


class KernelBenchMetrics(BaseModel):
    level: int
    problems: int  # every problem of the level: the denominator of every rate
    evaluated: int  # problems with a sample 0
    compiled: int
    correct: int
    compilation_rate: float
    correctness_rate: float
    baseline: str  # where the baseline times came from
    no_baseline: list[int]  # problems whose correct sample 0 has no baseline time: correct, never faster
    unvouched: int  # correct sample-0 results whose time the harness does not vouch for: correct, never faster
    fast_p: dict[str, float]
    geomean_speedup_correct: float | None  # None: no correct result with a speedup that counts
    geomean_speedup_correct_and_faster: float | None
    geomean_over: int  # the correct results with a speedup that counts
    pass_at_k: dict[str, float]
    pass_at_k_problems: dict[str, int]  # the problems with at least k samples, over which pass@k is averaged


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of the chance that at least one of k samples drawn from n (c correct) is correct."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def geometric_mean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def p_key(p: float) -> str:
    return f"{p:g}"


def level_metrics(level: int, problems: Iterable[int], samples: Iterable[Sample], baseline_ms: Mapping[int, float],
                  *, baseline: str, thresholds: Sequence[float] = THRESHOLDS, ks: Sequence[int] = (1,)
                  ) -> KernelBenchMetrics:
    """KernelBench's metrics of one level: `problems` are every problem of the level (numbers), `samples` the
    results (of one device class), `baseline_ms` the baseline's mean time per problem."""
    level_problems = sorted(set(problems))
    by_problem: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.problem in level_problems:
            by_problem[s.problem].append(s)
    first: dict[int, Sample] = {}
    for number, group in by_problem.items():
        zero = [s for s in group if s.sample == 0]
        if len(zero) > 1:
            raise ValueError(f"level{level}/{number} has {len(zero)} results for sample 0")
        if zero:
            first[number] = zero[0]
    n = len(level_problems)
    correct = [s for s in first.values() if s.correct]
    speedups: list[float] = []
    no_baseline: list[int] = []
    for s in correct:
        base = baseline_ms.get(s.problem)
        if base is None:
            no_baseline.append(s.problem)
        elif s.vouched and s.runtime_ms is not None and s.runtime_ms > 0:
            speedups.append(base / s.runtime_ms)
    fast = {p_key(p): (len(correct) if p == 0 else sum(sp > p for sp in speedups)) / n if n else 0.0
            for p in thresholds}
    passes: dict[str, float] = {}
    pass_problems: dict[str, int] = {}
    for k in ks:
        eligible = [g for g in by_problem.values() if len(g) >= k]
        pass_problems[f"pass@{k}"] = len(eligible)
        if eligible:
            passes[f"pass@{k}"] = math.fsum(pass_at_k(len(g), sum(s.correct for s in g), k)
                                            for g in eligible) / len(eligible)
    return KernelBenchMetrics(
        level=level, problems=n, evaluated=len(first), compiled=sum(s.compiled for s in first.values()),
        correct=len(correct), compilation_rate=sum(s.compiled for s in first.values()) / n if n else 0.0,
        correctness_rate=len(correct) / n if n else 0.0, baseline=baseline, no_baseline=sorted(no_baseline),
        unvouched=sum(1 for s in correct if not s.vouched), fast_p=fast,
        geomean_speedup_correct=geometric_mean(speedups),
        geomean_speedup_correct_and_faster=geometric_mean([sp for sp in speedups if sp > 1]),
        geomean_over=len(speedups), pass_at_k=passes, pass_at_k_problems=pass_problems)
