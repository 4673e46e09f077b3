"""Whose work kept the GPU busy when the trusted side had to wait for it before or after a reference window. No torch.

The trusted side's probe (reference_windows.ReferenceWindows.wait_idle) sees only that some process's work was queued
on the GPU. Where the GPU is the evaluation's alone, that work is the paused candidate's, left running after its reply
(grading._leftover_gpu_work). Where other processes compute on the same GPU (evaluations side by side on one card,
a co-tenant's job), the probe cannot say whose work it waited for, and the candidate is not blamed for it: the wait
is the GPU's sharing, and the result is marked `shared_gpu` (shown, not ranked).

NVML lists a device's compute processes by host PID, which is what the parent sees of its children (their jails'
cgroups and /proc, read from the parent's PID namespace). The evaluation's GPU is the one whose list holds the
trusted process. Where NVML cannot be asked (no binding, no driver) or holds none of the trusted side's processes (the
parent runs in a PID namespace of its own), the work cannot be told apart, and it is counted as shared: never the
candidate's.

When the candidate reports running out of device memory, the parent reads the same GPU's memory from NVML at that
moment (`memory_at_failure`): whose it was decides whether the failure is the submission's (grading).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from harness.schema import GpuMemoryAtFailure


class NvmlUnavailable(Exception):
    """NVML could not list the GPUs' compute processes; the message says why."""


# The host PIDs of each GPU's compute processes, one list per device; NvmlUnavailable where it cannot be known.
ComputeProcesses = Callable[[], list[list[int]]]


@contextlib.contextmanager
def _nvml() -> Iterator[Any]:
    """NVML started, its module; let go on the way out. NvmlUnavailable where it cannot be started."""
    try:
        import pynvml  # nvidia-ml-py: present where torch runs on CUDA; only the parent asks, and only on CUDA
    except ImportError:
        raise NvmlUnavailable("no NVML binding (the nvidia-ml-py package) in the harness's environment") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML did not start: {e}") from None
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def nvml_compute_processes() -> list[list[int]]:
    """NVML's compute processes of every GPU of the host, by host PID (nvmlDeviceGetComputeRunningProcesses)."""
    with _nvml() as nvml:
        try:
            return [[p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(i))]
                    for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML could not list the GPUs' processes: {e}") from None


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU's memory as NVML reports it: total and free bytes, and each compute process's used bytes by host PID
    (None where NVML does not say: MIG, some containers)."""

    total: int
    free: int
    used: dict[int, int | None]


# Every GPU's memory; NvmlUnavailable where it cannot be known.
DeviceMemories = Callable[[], list[DeviceMemory]]


def nvml_device_memory() -> list[DeviceMemory]:
    """NVML's memory figures of every GPU of the host (nvmlDeviceGetMemoryInfo, and each compute process's
    usedGpuMemory)."""
    with _nvml() as nvml:
        try:
            devices = []
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
                devices.append(DeviceMemory(total=int(info.total), free=int(info.free), used={
                    p.pid: p.usedGpuMemory for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}))
            return devices
        except nvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML could not read the GPUs' memory: {e}") from None


def memory_at_failure(memories: DeviceMemories, trusted: Iterable[int], candidate: Iterable[int]
                      ) -> GpuMemoryAtFailure:
    """The evaluation's GPU's memory now (the GPU NVML lists a trusted process on, or where none is left, a
    candidate's process), whose it is: the candidate's, the trusted side's, other processes'. Where NVML cannot say,
    why."""
    try:
        devices = memories()
    except NvmlUnavailable as e:
        return GpuMemoryAtFailure(unknown=str(e))
    ours, theirs = set(trusted), set(candidate)
    found = [d for d in devices if ours.intersection(d.used)] or [d for d in devices if theirs.intersection(d.used)]
    if not found:
        return GpuMemoryAtFailure(unknown=_not_listed(ours))
    device = found[0]
    unreported = sorted(pid for pid, used in device.used.items() if used is None)
    if unreported:
        return GpuMemoryAtFailure(total_bytes=device.total, free_bytes=device.free,
                                  unknown=f"NVML did not report the used memory of processes "
                                          f"{', '.join(map(str, unreported))}")

    def held(pids: Iterable[int]) -> int:  # a process NVML does not list holds nothing there
        return sum(device.used.get(pid) or 0 for pid in pids)

    others = sorted(pid for pid in device.used if pid not in ours | theirs)
    return GpuMemoryAtFailure(total_bytes=device.total, free_bytes=device.free, candidate_bytes=held(theirs),
                              trusted_bytes=held(ours), others_bytes=held(others), others=others[:32])


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


def sharing(devices: list[list[int]], trusted: Iterable[int], candidate: Iterable[int], idle: Iterable[int] = ()
            ) -> Sharing:
    """Who else computes on the GPU that holds a trusted process, from each device's compute processes. `idle` are the
    harness's own processes that run nothing now (a slot's warm trusted processes of other problems, its spare
    candidates before their import): listed by NVML for the context they hold, never others' work."""
    ours = set(trusted)
    found = [pids for pids in devices if ours.intersection(pids)]
    if not found:
        return Sharing(unknown=_not_listed(ours))
    known = ours | set(candidate) | set(idle)
    return Sharing(others=tuple(sorted({pid for pid in found[0] if pid not in known})))


def _not_listed(trusted: set[int]) -> str:
    return (f"NVML lists none of the trusted side's processes ({', '.join(map(str, sorted(trusted)))}) on any GPU: its "
            "PIDs are not the harness's (another PID namespace?)")


def ask(processes: ComputeProcesses, trusted: Iterable[int], candidate: Iterable[int], idle: Iterable[int] = ()
        ) -> Sharing:
    """`sharing` from what `processes` lists now; unknown where it cannot list them."""
    try:
        devices = processes()
    except NvmlUnavailable as e:
        return Sharing(unknown=str(e))
    return sharing(devices, trusted, candidate, idle)
