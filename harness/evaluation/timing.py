"""The body of a timed window, shared by both children so that the candidate and the reference run alike.

A window's time is the parent's clock from sending its seeds to the answer (harness/evaluation/windows.py);
this is only what runs inside it: for each seed, the call's inputs made from the seed with a private
generator state (problem_module.seeded_inputs), the L2 flushed, the call, a wait for the device. The
candidate's process runs its own copy of this code and may change it: whatever it skips or adds is inside
the parent's window, and the outputs it keeps are checked by the trusted side.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.evaluation.problem_module import manual_seed, seeded_inputs, synchronize

_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_event_sync = torch.cuda.Event.synchronize
_cuda_sync = torch.cuda.synchronize

L2_FLUSH_BYTES_MIN = 32 << 20


def l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    """A buffer twice the L2's size (at least 32 MiB): zeroing it evicts what a previous call left there. It runs
    before every timed call, so no larger than that (on an H100, 100 MB: about 35 us a call)."""
    if device.type != "cuda":
        return None
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return torch.empty(max(L2_FLUSH_BYTES_MIN, 2 * l2) // 4, dtype=torch.float32, device=device)


def run_window(fn: Callable[..., Any], problem: Any, seeds: list[int], forward_seeds: list[int],
               device: torch.device, flush: torch.Tensor | None, keep: list[Any] | None = None,
               inputs: list[list[Any]] | None = None) -> dict[str, float]:
    """One window's calls: every call's inputs first (made from `seeds`, unless `inputs` were made before the window),
    then flush and call, flush and call, ..., one wait for the device at the end. The host queues ahead of the GPU,
    so its own jitter hides behind the GPU's work and the window measures the device; work a call leaves on other
    streams lands inside it. Each call runs right after
    `manual_seed(its forward seed)` (problem_module), on both sides, so a stochastic reference (dropout) draws alike.
    With `keep`, each call's output is appended to it (kept for a hand-over).

    Python's cyclic garbage collector is off for the window, as `timeit` keeps it: a collection walks every object
    the process holds, and the trusted process holds far more than the candidate's (a float64 copy of the model,
    the trials' outputs, the harness's own modules), so a launch-bound forward's collections would cost the
    reference more than the same forward in the candidate's process. What the calls leave to collect is collected
    after the window, off its clock, in either process.

    Returns the process's own view of the window, a diagnostic only (the candidate's is a claim): `host_ms`, its
    clock over the whole window, `inputs_ms` of it making the inputs, and on CUDA `device_ms`, events from after
    the inputs to the end."""
    with _collector_off():
        return _run_window(fn, problem, seeds, forward_seeds, device, flush, keep, inputs)


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    """The cyclic garbage collector off inside, and as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run_window(fn: Callable[..., Any], problem: Any, seeds: list[int], forward_seeds: list[int],
                device: torch.device, flush: torch.Tensor | None, keep: list[Any] | None,
                inputs: list[list[Any]] | None) -> dict[str, float]:
    t0 = time.perf_counter()
    with torch.no_grad():
        if inputs is None:
            inputs = [seeded_inputs(problem, seed, device) for seed in seeds]
        made = time.perf_counter()
        start = end = None
        if device.type == "cuda":
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _record(start)
        for x, forward_seed in zip(inputs, forward_seeds, strict=True):
            if flush is not None:
                flush.zero_()
            manual_seed(forward_seed, device)
            out = fn(*x)
            if keep is not None:
                keep.append(out)
            del out
        if end is not None:
            _record(end)
        synchronize(device)
    seen = {"host_ms": (time.perf_counter() - t0) * 1e3, "inputs_ms": (made - t0) * 1e3}
    if start is not None and end is not None:
        seen["device_ms"] = _elapsed_time(start, end)
    return seen


def lead_in(fn: Callable[..., Any], inputs: list[list[Any]], calls: int, device: torch.device,
            flush: torch.Tensor | None) -> None:
    """`calls` untimed calls on `inputs` (round and round), as a window makes them (flush and call), one wait at the
    end; their outputs let go. Right before a timed window, it starts with the CPU and the GPU running: a window that
    began after its process had waited (while the other kinds' windows ran) was slower by up to half on an H100 for
    networks of many small kernels (benchmarks/window_spread.py). No call: only `touch`."""
    if not inputs or calls <= 0:
        touch(device)
        return
    with torch.no_grad():
        for j in range(calls):
            if flush is not None:
                flush.zero_()
            fn(*inputs[j % len(inputs)])
        synchronize(device)


def touch(device: torch.device) -> None:
    """One tiny kernel and a wait for it, on CUDA: the GPU last ran this process's context, as it has before a
    reference window (the trusted side's idle probe, reference_windows.ReferenceWindows.wait_idle, is the same add
    and wait)."""
    if device.type == "cuda":
        probe = torch.zeros(1, device=device)
        probe.add_(1)
        synchronize(device)


# The cores this process's threads may run on as it started: what `pin_thread(None)` gives back.
_CORES = sorted(os.sched_getaffinity(0))


# torch's intra-op threads as this process started (windows.timing_env): what `keep_threads(None)` gives back.
_THREADS = torch.get_num_threads()


def keep_threads(threads: int | None) -> int:
    """torch's intra-op threads set to `threads`, or to as many as the process started with (None); how many now.
    The CPU's one-core rounds run both sides on one (rounds.RoundsPlan.held)."""
    torch.set_num_threads(max(1, threads) if threads is not None else _THREADS)
    return torch.get_num_threads()


def pin_thread(cores: list[int] | None) -> list[int]:
    """The calling thread (the one that runs the windows and launches their kernels) kept to `cores`, or given back
    the cores it started with (None); the cores it may run on now. Both sides call it for the timed rounds, on the
    core windows.timing_core chooses (why: its docstring). Where the kernel refuses (a core outside the process's
    cgroup), the thread stays where it was."""
    with contextlib.suppress(OSError, ValueError):
        os.sched_setaffinity(0, cores if cores is not None else _CORES)
    return sorted(os.sched_getaffinity(0))


# Elements of outputs fingerprinted at once (FINGERPRINT_CHUNK_BYTES // 8 of them): on CUDA a window's hundreds of
# small outputs in one product, its few large ones a few at a time, one of gigabytes a slice at a time. On the CPU a
# slice whose temporaries stay in a core's cache (32,768 elements): on the 2-core VM a window's 140 outputs of that
# size took 37 ms one at a time and 55-133 ms eight at a time (median of 15; 251 ms with the earlier normal draws).
FINGERPRINT_CHUNK_BYTES = 256 << 20
FINGERPRINT_CHUNK_BYTES_CPU = 256 << 10

# Floating dtypes fingerprinted as they are (a product with 0 or 1 is exact in each), summed in float64. Others
# (integers, bool, the float8 kinds, complex) are made float64 first, as every output was before.
_KEPT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _tensors_of(output: Any) -> list[torch.Tensor | None]:
    """An output's tensors in order (a tensor, or a list/tuple of them); anything else holds none."""
    items = list(output) if isinstance(output, (list, tuple)) else [output]
    return [t if isinstance(t, torch.Tensor) else None for t in items]


def _random_signs(shape: tuple[int, int], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """True where a draw is -1, False where it is +1, each with probability 1/2: the sign bits of random bytes
    (64 random bits a word, the full range: torch's `random_()` alone never sets a word's top bit)."""
    count = shape[0] * shape[1]
    words = torch.empty((count + 7) // 8, dtype=torch.int64, device=device).random_(-(1 << 63), None, generator=gen)
    return words.view(torch.int8)[:count].view(shape) < 0


def fingerprints(outputs: list[Any], key: int, device: torch.device) -> list[list[float | None]]:
    """One number per tensor of each kept output: its elements dotted with random signs (+1 or -1, each with
    probability 1/2) made from `key`, drawn anew for every call (so that errors alike in every call do not add up
    alike), summed in float64. An error e in an output moves its number by sum(e_i * s_i): mean 0 and variance
    sum(e_i**2), as with standard normal draws, and tails no heavier than a normal's of that variance by Chernoff's
    bound (the signs are sub-Gaussian), which is what windows.FINGERPRINT_Z and grading.fingerprint_deviation_bound
    rest on. A sign is one random byte's top bit: on the CPU float64 normal draws (the earlier kind) were 57 of a
    window's 65 ms of fingerprints, and what the candidate's took beyond the trusted side's was charged to its window.

    The key is drawn by the parent after the window closed, so the only way to these numbers is through outputs
    already computed: an output computed only when asked for is paid for inside this command, on the parent's
    clock. Both sides draw the same signs in the same order (one generator per tensor position and size, slices of
    at most FINGERPRINT_CHUNK_BYTES // 8 elements). None where the number is not finite or the output holds no
    tensor there."""
    tensors = [_tensors_of(o) for o in outputs]
    result: list[list[float | None]] = [[None] * len(ts) for ts in tensors]
    groups: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = {}
    for j, ts in enumerate(tensors):
        for k, t in enumerate(ts):
            if t is not None:
                groups.setdefault((k, t.numel()), []).append((j, t))
    chunk_bytes = FINGERPRINT_CHUNK_BYTES if device.type == "cuda" else FINGERPRINT_CHUNK_BYTES_CPU
    elements = max(1, chunk_bytes // 8)
    with torch.no_grad():
        for (k, n), members in groups.items():
            gen = torch.Generator(device=device).manual_seed((key + k) % (1 << 63))
            cols = max(1, min(n, elements))  # a large output in slices of columns
            rows = max(1, elements // max(n, 1))  # small ones many calls at once
            for s in range(0, len(members), rows):
                chunk = members[s:s + rows]
                sums = torch.zeros(len(chunk), dtype=torch.float64, device=device)
                for c in range(0, n, cols):
                    stacked = torch.stack([_signable(t.detach().reshape(-1)[c:c + cols].to(device)) for _, t in chunk])
                    negative = _random_signs((stacked.shape[0], stacked.shape[1]), gen, device)
                    # sum(x * s) = sum(x) - 2 * sum(x where s = -1): one product of the slice, no negated copy.
                    sums += stacked.sum(dim=1, dtype=torch.float64)
                    sums -= 2 * stacked.mul(negative).sum(dim=1, dtype=torch.float64)
                for (j, _), v in zip(chunk, sums.tolist(), strict=True):
                    result[j][k] = v if math.isfinite(v) else None
    return result


def _signable(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in _KEPT_DTYPES else t.to(torch.float64)


def fingerprint_scales(outputs: list[Any], atol: float, rtol: float) -> list[list[float | None]]:
    """For each tensor of each (reference) output, sqrt(sum((atol + rtol*|b_i|)**2)): the standard deviation of an
    output's fingerprint error when every element is off by its whole tolerance (each draw a random sign), so an
    output within tolerance is off by more than z of these, either way, with a chance under 2 * exp(-z**2 / 2). None
    where the reference holds a non-finite element (its fingerprint decides nothing)."""
    scales: list[list[float | None]] = []
    elements = FINGERPRINT_CHUNK_BYTES // 8  # a slice at a time: a 3.2 GB output in float64 whole is 6.4 GB a copy
    with torch.no_grad():
        for output in outputs:
            row: list[float | None] = []
            for t in _tensors_of(output):
                if t is None or not bool(torch.isfinite(t).all()):
                    row.append(None)
                    continue
                flat, total = t.detach().reshape(-1), 0.0
                for c in range(0, flat.numel(), elements):
                    b = flat[c:c + elements].to(torch.float64)
                    total += float((atol + rtol * b.abs()).square().sum())
                row.append(math.sqrt(total))
            scales.append(row)
    return scales


def empty_call(*inputs: Any) -> None:
    return None


class Clock:
    """Seconds per step of one command on the trusted process's own clock: where its time goes (diagnostics,
    `observations.trusted_seconds`; nothing is graded on them but the fingerprint's own step, as what an honest
    fingerprint costs). The device is synchronised at each lap."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._t, 4)
        self._t = now


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
