"""The timing loop, shared by the reference side and the candidate side so both are timed alike.

CUDA: each call gets fresh inputs (made before the clock starts), the L2 is flushed, and the
device is synchronised before the end event is recorded, so work the call left on other streams
lands inside its window. The start event is queued right behind the flush, not after a host sync,
so the host's dispatch of the call overlaps the flush instead of opening an idle gap in the window.
The same loop around an empty call measures what the window holds besides the call (the sync's
wake-up and the end event's launch); `median_ms` is the raw median less that overhead.
CPU: the same loop on a host clock.

`loop_wall_ms` is the host's wall time per call of the whole loop (inputs, flush, call, syncs,
fingerprint): the trusted side's figure for an empty call calibrates the parent's envelope check.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.sandbox.problem_module import synchronize

# Taken when this module is imported, i.e. before any submission is: a submission that patches
# torch.cuda.Event (the class or its methods: assigning `torch.cuda.Event.elapsed_time` changes the
# class this module holds, so the methods are held as functions too), time.perf_counter_ns or
# torch.cuda.synchronize later does not reach these.
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_event_sync = torch.cuda.Event.synchronize
_perf_counter_ns = time.perf_counter_ns
_cuda_sync = torch.cuda.synchronize

L2_FLUSH_BYTES_MIN = 256 << 20


def _stats(samples: list[float], clock: str, overhead: float, loop_wall_ms: float) -> dict[str, Any]:
    raw = statistics.median(samples)
    return {
        "clock": clock, "n": len(samples), "median_ms": max(raw - overhead, 0.0), "raw_median_ms": raw,
        "mean_ms": statistics.fmean(samples), "min_ms": min(samples), "max_ms": max(samples),
        "std_ms": statistics.pstdev(samples) if len(samples) > 1 else 0.0, "overhead_ms": overhead,
        "loop_wall_ms": loop_wall_ms,
    }


def _empty_call(*inputs: Any) -> None:
    return None


def warm_up(fn: Callable[..., Any], make_inputs: Callable[[int], list[Any]], device: torch.device,
            calls: int) -> None:
    """Untimed calls before timing (lazy initialisation, autotuning, caches of the allocator)."""
    with torch.no_grad():
        for i in range(calls):
            fn(*make_inputs(i))
            synchronize(device)


def time_calls(
    fn: Callable[..., Any],
    make_inputs: Callable[[int], list[Any]],
    device: torch.device,
    *,
    calls: int,
    flush_l2: bool = True,
    fingerprints: list[Any] | None = None,
) -> dict[str, Any]:
    """Median-based statistics of `fn(*make_inputs(i))`, in milliseconds, then the same loop around an
    empty call (min(calls, 20) of them) for the overhead.

    With `fingerprints`, the fingerprint of each timed call's output is appended to it (computed
    after the clock stopped), so the outputs of timed calls can be checked too.
    """
    with torch.no_grad():
        timer = _time_cuda if device.type == "cuda" else _time_cpu
        t0 = _perf_counter_ns()
        samples = timer(fn, make_inputs, device, calls, flush_l2, fingerprints)
        loop_wall_ms = (_perf_counter_ns() - t0) / 1e6 / calls
        overhead = timer(_empty_call, make_inputs, device, min(calls, 20), flush_l2, None)
        return _stats(samples, "cuda_event" if device.type == "cuda" else "perf_counter",
                      statistics.median(overhead), loop_wall_ms)


def calibrate_loop(make_inputs: Callable[[int], list[Any]], device: torch.device, example_output: Any, *,
                   calls: int, flush_l2: bool = True) -> float:
    """Host wall ms per call of the timed loop around a call that costs nothing (it returns a ready
    output, so the fingerprinting costs what it costs for a real output): the loop's own cost."""
    prints: list[Any] = []
    timer = _time_cuda if device.type == "cuda" else _time_cpu
    with torch.no_grad():
        t0 = _perf_counter_ns()
        timer(lambda *a: example_output, make_inputs, device, calls, flush_l2, prints)
        return (_perf_counter_ns() - t0) / 1e6 / calls


def fingerprint(out: Any) -> list[list[float]] | None:
    """Sum and sum of magnitudes of each output tensor, in float64.

    If an output passes allclose(atol, rtol) then |sum(a) - sum(b)| and |sum|a| - sum|b|| are both at
    most atol*n + rtol*sum|b|: a sound test of timed outputs that an honest kernel cannot fail.
    """
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if outs is None or not all(type(o) is torch.Tensor for o in outs):  # a subclass could compute only now
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
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _cuda_sync(device)  # nothing of the previous call or the input generation is still running
        if flush is not None:
            flush.zero_()
        _record(start)  # fires when the flush ends; meanwhile the host dispatches the call
        out = fn(*inputs)
        _cuda_sync(device)
        _record(end)
        _event_sync(end)
        samples.append(_elapsed_time(start, end))
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


def measure_peaks(device: torch.device) -> dict[str, float]:
    """This GPU's measured rates, for the speed-of-light floor: device-memory bandwidth (a 1 GiB
    copy: bytes read plus written) and dense bf16 tensor-core matmul throughput (8192^3), the
    fastest arithmetic any kernel could use (an fp32-tolerance result gains nothing from fp8).
    Best of 5 each; about 30 ms in all on an H100."""
    n = 1 << 28  # floats: 1 GiB
    copy_ms = _best_of_copy(n, device)
    m = 8192
    mm_ms = _best_of_mm(m, device)
    torch.cuda.empty_cache()
    return {"bytes_per_s": 2 * 4 * n / (copy_ms / 1e3), "flops_per_s": 2 * m**3 / (mm_ms / 1e3)}


def _best_of_copy(n: int, device: torch.device) -> float:
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return _best_of(lambda: dst.copy_(src), 5)


def _best_of_mm(m: int, device: torch.device) -> float:
    a = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    b = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    return _best_of(lambda: torch.mm(a, b), 5)


def _best_of(fn: Callable[[], Any], reps: int) -> float:
    fn()
    _cuda_sync()
    best = float("inf")
    for _ in range(reps):
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _record(start)
        fn()
        _record(end)
        _event_sync(end)
        best = min(best, _elapsed_time(start, end))
    return best
