"""The timing loop, shared by the reference side and the candidate side so both are timed alike.

CUDA: each call gets fresh inputs (made before the clock starts), the L2 is flushed, and the
device is synchronised before the end event is recorded, so work the call left on other streams
lands inside its window. CPU: the same loop on a host clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.sandbox.problem_module import synchronize

# Taken when this module is imported, i.e. before any submission is: a submission that patches
# torch.cuda.Event or time.perf_counter_ns later does not reach these.
_Event = torch.cuda.Event
_perf_counter_ns = time.perf_counter_ns
_cuda_sync = torch.cuda.synchronize

L2_FLUSH_BYTES_MIN = 256 << 20


def _stats(samples: list[float], clock: str, overhead: float | None) -> dict[str, Any]:
    return {
        "clock": clock, "n": len(samples), "median_ms": statistics.median(samples),
        "mean_ms": statistics.fmean(samples), "min_ms": min(samples), "max_ms": max(samples),
        "std_ms": statistics.pstdev(samples) if len(samples) > 1 else 0.0, "overhead_ms": overhead,
    }


def time_calls(
    fn: Callable[..., Any],
    make_inputs: Callable[[int], list[Any]],
    device: torch.device,
    *,
    warmup: int,
    calls: int,
    flush_l2: bool = True,
    fingerprints: list[Any] | None = None,
) -> dict[str, Any]:
    """Median-based statistics of `fn(*make_inputs(i))`, in milliseconds.

    With `fingerprints`, the fingerprint of each timed call's output is appended to it (computed
    after the clock stopped), so the outputs of timed calls can be checked too.
    """
    with torch.no_grad():
        for i in range(warmup):
            fn(*make_inputs(-1 - i))
            synchronize(device)
        timer = _time_cuda if device.type == "cuda" else _time_cpu
        samples = timer(fn, make_inputs, device, calls, flush_l2, fingerprints)
        overhead = timer(lambda *a: None, make_inputs, device, min(calls, 20), flush_l2, None)
        return _stats(samples, "cuda_event" if device.type == "cuda" else "perf_counter", statistics.median(overhead))


def fingerprint(out: Any) -> list[list[float]] | None:
    """Sum and sum of magnitudes of each output tensor, in float64.

    If an output passes allclose(atol, rtol) then |sum(a) - sum(b)| and |sum|a| - sum|b|| are both at
    most atol*n + rtol*sum|b|: a sound test of timed outputs that an honest kernel cannot fail.
    """
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if outs is None or not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    return [[float(o.double().sum()), float(o.double().abs().sum()), float(o.numel())] for o in outs]


def _time_cuda(fn, make_inputs, device, calls, flush_l2, fingerprints) -> list[float]:
    flush = None
    if flush_l2:
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        flush = torch.empty(max(L2_FLUSH_BYTES_MIN, 2 * l2) // 4, dtype=torch.float32, device=device)
    samples = []
    for i in range(calls):
        inputs = make_inputs(i)
        if flush is not None:
            flush.zero_()
        _cuda_sync(device)
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        start.record()
        out = fn(*inputs)
        _cuda_sync(device)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
        if fingerprints is not None:
            fingerprints.append(fingerprint(out))
        del out
    return samples


def _time_cpu(fn, make_inputs, device, calls, flush_l2, fingerprints) -> list[float]:
    samples = []
    for i in range(calls):
        inputs = make_inputs(i)
        t0 = _perf_counter_ns()
        out = fn(*inputs)
        samples.append((_perf_counter_ns() - t0) / 1e6)
        if fingerprints is not None:
            fingerprints.append(fingerprint(out))
        del out
    return samples
