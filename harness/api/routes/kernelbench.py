"""/api/kernelbench: a run in KernelBench's terms. Its metrics by KernelBench's definitions (our own fast_p named
beside them), its results as KernelBench's eval-results file, and the measured baselines as KernelBench's
baseline-time file.

A run is named by a model, a tag (eval-dir tags results with the run folder's name), a submitter or a batch.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query, status

from harness.api.deps import RegistryDep, SessionDep
from harness.api.schemas import ErrorBody
from harness.service import kernelbench as kb

router = APIRouter(prefix="/api/kernelbench", tags=["kernelbench"])
_RUN = {400: {"model": ErrorBody}}


def _samples(session, registry, model, submitter, tag, batch) -> tuple[list[kb.RunSample], kb.RunCounts]:
    try:
        rows = kb.run_rows(session, model=model, submitter=submitter, tag=tag, batch=batch)
    except kb.NoRun as e:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(e)) from None
    return kb.run_samples(registry, rows)


@router.get("", response_model=kb.KernelBenchReport, responses=_RUN)
def metrics(session: SessionDep, registry: RegistryDep, model: str | None = None, submitter: str | None = None,
            tag: str | None = None, batch: str | None = None,
            device: Literal["cuda", "cpu"] | None = Query(None, description="Default: cuda where the run has GPU "
                                                                            "results, else cpu."),
            baseline: Literal["eager", "compile"] = "eager",
            k: list[int] = Query([1], description="pass@k for each k given (k=1&k=10).")) -> kb.KernelBenchReport:
    """Compilation rate, correctness rate, fast_p over each level (every problem of it; a missing or failed one
    is not correct; sample 0 of each), the geometric-mean speedups and pass@k: KernelBench's definitions. The
    baseline is the harness's vouched measurements of the reference on the run's GPU and size."""
    if any(x < 1 for x in k):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"k (query parameter): pass@k needs k >= 1, got {k}")
    samples, counts = _samples(session, registry, model, submitter, tag, batch)
    return kb.kernelbench_report(session, registry, samples, counts, device=device, baseline=baseline, ks=k)


@router.get("/eval_results", responses=_RUN)
def eval_results(session: SessionDep, registry: RegistryDep, model: str | None = None, submitter: str | None = None,
                 tag: str | None = None, batch: str | None = None,
                 device: Literal["cuda", "cpu"] | None = None) -> dict[str, Any]:
    """The run as KernelBench's `eval_results.json`, one per level: {"level2": {"75": [{"sample_id": 0, ...}]}}."""
    samples, _ = _samples(session, registry, model, submitter, tag, batch)
    return {f"level{lv}": results for lv, results in kb.eval_results_json(samples, device).items()}


@router.get("/baseline")
def baseline_times(session: SessionDep, registry: RegistryDep, device_name: str | None = None,
                   device: Literal["cuda", "cpu"] = "cuda", size: str | None = None,
                   baseline: Literal["eager", "compile"] = "eager") -> dict[str, Any]:
    """The reference's vouched measurements as KernelBench's baseline-time file (`results/timing/<hardware>/
    baseline_time_torch.json` for eager): level -> problem file name -> statistics (ms). Without device_name,
    every GPU's measurements are pooled: name one when results come from several kinds."""
    specs = [s for specs in kb.level_specs(registry).values() for s in specs]
    measured = kb.measured_baselines(session, specs, device=device, device_name=device_name,
                                     size=size or ("small" if device == "cpu" else "default"), baseline=baseline)
    return kb.baseline_json(measured, specs)
