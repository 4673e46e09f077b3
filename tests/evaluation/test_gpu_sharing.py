"""Whose work a long wait for an idle GPU waited out: NVML's compute processes against the evaluation's own."""

from __future__ import annotations

import sys
import types

from harness.evaluation import gpu_sharing
from harness.evaluation.gpu_sharing import NvmlUnavailable, Sharing, ask, sharing

TRUSTED, CANDIDATE = [100], [200, 201]


def test_the_candidate_alone_beside_the_trusted_side_is_not_a_shared_gpu():
    got = sharing([[300], [100, 200, 201]], TRUSTED, CANDIDATE)  # another process on the other GPU only
    assert got == Sharing() and not got.shared


def test_another_process_on_the_evaluations_gpu_shares_it_whether_or_not_the_candidate_computes_there():
    assert sharing([[100, 200, 300]], TRUSTED, CANDIDATE) == Sharing(others=(300,))
    assert sharing([[100, 300, 301]], TRUSTED, CANDIDATE).others == (300, 301)
    assert sharing([[100, 300]], TRUSTED, []).shared


def test_the_harness_s_own_idle_processes_are_nobody_elses_work():
    assert sharing([[100, 200, 300, 301]], TRUSTED, CANDIDATE, idle=[300, 301]) == Sharing()
    assert sharing([[100, 300, 302]], TRUSTED, CANDIDATE, idle=[300]).others == (302,)
    assert sharing([[300]], TRUSTED, CANDIDATE, idle=[300]).unknown  # the evaluation's GPU is the trusted side's


def test_a_gpu_with_none_of_the_trusted_sides_processes_cannot_be_told_apart():
    """NVML's PIDs are the host's: a parent in another PID namespace finds none of its own children there."""
    got = sharing([[7, 8]], TRUSTED, CANDIDATE)
    assert got.shared and not got.others and "none of the trusted side's processes (100)" in (got.unknown or "")


def test_nvml_that_cannot_be_asked_is_unknown_not_the_candidate():
    def broken() -> list[list[int]]:
        raise NvmlUnavailable("NVML did not start: Driver Not Loaded")

    assert ask(broken, TRUSTED, CANDIDATE) == Sharing(unknown="NVML did not start: Driver Not Loaded")


def test_without_the_nvml_binding_the_query_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    got = ask(gpu_sharing.nvml_compute_processes, TRUSTED, CANDIDATE)
    assert got.shared and "no NVML binding" in (got.unknown or "")


class NVMLError(Exception):
    pass


def _fake_pynvml(monkeypatch, devices: int, **queries) -> tuple[types.SimpleNamespace, list[str]]:
    """A pynvml module of `devices` GPUs answering `queries`, in sys.modules; and the list its init and shutdown
    append to."""
    calls: list[str] = []
    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: devices, nvmlDeviceGetHandleByIndex=lambda i: i, **queries)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake, calls


def test_the_nvml_query_lists_each_gpus_compute_processes_by_pid_and_lets_nvml_go(monkeypatch):
    fake, calls = _fake_pynvml(monkeypatch, 2, nvmlDeviceGetComputeRunningProcesses=lambda h: [
        types.SimpleNamespace(pid=p) for p in ([100, 200], [300])[h]])
    assert gpu_sharing.nvml_compute_processes() == [[100, 200], [300]] and calls == ["init", "shutdown"]

    def fails(h):
        raise NVMLError("Insufficient Permissions")

    fake.nvmlDeviceGetComputeRunningProcesses = fails
    got = ask(gpu_sharing.nvml_compute_processes, TRUSTED, CANDIDATE)
    assert got.unknown == "NVML could not list the GPUs' processes: Insufficient Permissions"
    assert calls[-1] == "shutdown"


GIB = 1 << 30


def _memory(*devices: gpu_sharing.DeviceMemory) -> gpu_sharing.DeviceMemories:
    return lambda: list(devices)


def test_memory_at_a_failure_is_the_trusted_sides_gpus_split_by_whose_processes_hold_it():
    other_gpu = gpu_sharing.DeviceMemory(total=80 * GIB, free=1 * GIB, used={300: 79 * GIB})
    ours = gpu_sharing.DeviceMemory(total=80 * GIB, free=2 * GIB,
                                    used={100: 64 * GIB, 200: 12 * GIB, 201: 1 * GIB, 400: 1 * GIB})
    got = gpu_sharing.memory_at_failure(_memory(other_gpu, ours), TRUSTED, CANDIDATE)
    assert (got.total_bytes, got.free_bytes, got.candidate_bytes, got.trusted_bytes, got.others_bytes) == \
        (80 * GIB, 2 * GIB, 13 * GIB, 64 * GIB, 1 * GIB)
    assert got.others == [400] and got.unknown is None


def test_a_candidate_process_nvml_does_not_list_holds_nothing_on_the_gpu():
    """One that exited before NVML was read gave its memory back: NVML counts it free."""
    ours = gpu_sharing.DeviceMemory(total=80 * GIB, free=16 * GIB, used={100: 64 * GIB})
    got = gpu_sharing.memory_at_failure(_memory(ours), TRUSTED, CANDIDATE)
    assert got.candidate_bytes == 0 and got.free_bytes == 16 * GIB and got.others == []


def test_memory_after_the_trusted_process_is_gone_is_read_on_the_candidates_gpu():
    """The trusted side ran out of memory and exited before NVML was read: the candidate's processes name the GPU, and
    what they hold there is counted (grading._crowded_out); another GPU's processes are not."""
    other_gpu = gpu_sharing.DeviceMemory(total=80 * GIB, free=70 * GIB, used={7: 9 * GIB})
    ours = gpu_sharing.DeviceMemory(total=80 * GIB, free=40 * GIB, used={200: 39 * GIB})
    got = gpu_sharing.memory_at_failure(_memory(other_gpu, ours), TRUSTED, CANDIDATE)
    assert (got.total_bytes, got.free_bytes, got.candidate_bytes, got.trusted_bytes, got.others) == \
        (80 * GIB, 40 * GIB, 39 * GIB, 0, [])


def test_memory_nvml_cannot_attribute_says_why():
    def broken() -> list[gpu_sharing.DeviceMemory]:
        raise NvmlUnavailable("NVML did not start: Driver Not Loaded")

    assert gpu_sharing.memory_at_failure(broken, TRUSTED, CANDIDATE).unknown == "NVML did not start: Driver Not Loaded"
    elsewhere = gpu_sharing.DeviceMemory(total=80 * GIB, free=2 * GIB, used={7: GIB})
    got = gpu_sharing.memory_at_failure(_memory(elsewhere), TRUSTED, CANDIDATE)
    assert got.candidate_bytes is None and "none of the trusted side's processes (100)" in (got.unknown or "")
    unreported = gpu_sharing.DeviceMemory(total=80 * GIB, free=2 * GIB, used={100: GIB, 200: None})
    got = gpu_sharing.memory_at_failure(_memory(unreported), TRUSTED, CANDIDATE)
    assert got.candidate_bytes is None and got.free_bytes == 2 * GIB
    assert got.unknown == "NVML did not report the used memory of processes 200"


def test_the_nvml_memory_query_reads_each_gpus_memory_and_its_processes_use(monkeypatch):
    fake, calls = _fake_pynvml(
        monkeypatch, 1,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * GIB, free=2 * GIB, used=78 * GIB),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=100, usedGpuMemory=64 * GIB),
                                                        types.SimpleNamespace(pid=200, usedGpuMemory=None)])
    assert gpu_sharing.nvml_device_memory() == [
        gpu_sharing.DeviceMemory(total=80 * GIB, free=2 * GIB, used={100: 64 * GIB, 200: None})]
    assert calls == ["init", "shutdown"]

    def fails(h):
        raise NVMLError("Insufficient Permissions")

    fake.nvmlDeviceGetMemoryInfo = fails
    got = gpu_sharing.memory_at_failure(gpu_sharing.nvml_device_memory, TRUSTED, CANDIDATE)
    assert got.unknown == "NVML could not read the GPUs' memory: Insufficient Permissions" and calls[-1] == "shutdown"
