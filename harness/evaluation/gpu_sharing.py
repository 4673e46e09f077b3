"""Whose work kept the GPU busy when the trusted side had to wait for it before or after a reference window. No torch.

The trusted side's probe (trusted.wait_idle) sees only that some process's work was queued on the GPU. Where the
GPU is the evaluation's alone, that work is the paused candidate's, left running after its reply
(grading._leftover_gpu_work). Where other processes compute on the same GPU (evaluations side by side on one card,
a co-tenant's job), the probe cannot say whose work it waited for, and the candidate is not blamed for it: the wait
is the GPU's sharing, and the result is marked `shared_gpu` (shown, not ranked).

NVML lists a device's compute processes by host PID, which is what the parent sees of its children (their jails'
cgroups and /proc, read from the parent's PID namespace). The evaluation's GPU is the one whose list holds the
trusted process. Where NVML cannot be asked (no binding, no driver) or holds none of the trusted side's processes (the
parent runs in a PID namespace of its own), the work cannot be told apart, and it is counted as shared: never the
candidate's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


class NvmlUnavailable(Exception):
    """NVML could not list the GPUs' compute processes; the message says why."""


# The host PIDs of each GPU's compute processes, one list per device; NvmlUnavailable where it cannot be known.
ComputeProcesses = Callable[[], list[list[int]]]


def nvml_compute_processes() -> list[list[int]]:
    """NVML's compute processes of every GPU of the host, by host PID (nvmlDeviceGetComputeRunningProcesses)."""
    try:
        import pynvml  # nvidia-ml-py: present where torch runs on CUDA; only the parent asks, and only on CUDA
    except ImportError:
        raise NvmlUnavailable("no NVML binding (the nvidia-ml-py package) in the harness's environment") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML did not start: {e}") from None
    try:
        return [[p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))]
                for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML could not list the GPUs' processes: {e}") from None
    finally:
        pynvml.nvmlShutdown()


@dataclass(frozen=True)
class Sharing:
    """Who else computes on the evaluation's GPU: `others`' host PIDs (neither the trusted side's nor the
    candidate's); `unknown` says why that cannot be told, where it cannot."""

    others: tuple[int, ...] = ()
    unknown: str | None = None

    @property
    def shared(self) -> bool:
        """Whether the GPU's work cannot be put down to the candidate alone."""
        return bool(self.others) or self.unknown is not None


def sharing(devices: list[list[int]], trusted: Iterable[int], candidate: Iterable[int]) -> Sharing:
    """Who else computes on the GPU that holds a trusted process, from each device's compute processes."""
    ours = set(trusted)
    found = [pids for pids in devices if ours.intersection(pids)]
    if not found:
        return Sharing(unknown=f"NVML lists none of the trusted side's processes ({', '.join(map(str, sorted(ours)))}) "
                               "on any GPU: its PIDs are not the harness's (another PID namespace?)")
    theirs = ours | set(candidate)
    return Sharing(others=tuple(sorted({pid for pid in found[0] if pid not in theirs})))


def ask(processes: ComputeProcesses, trusted: Iterable[int], candidate: Iterable[int]) -> Sharing:
    """`sharing` from what `processes` lists now; unknown where it cannot list them."""
    try:
        devices = processes()
    except NvmlUnavailable as e:
        return Sharing(unknown=str(e))
    return sharing(devices, trusted, candidate)
