"""Whose work a long wait for an idle GPU waited out: NVML's compute processes against the evaluation's own."""

from __future__ import annotations

import sys

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


def test_the_nvml_query_lists_each_gpus_compute_processes_by_pid_and_lets_nvml_go(monkeypatch):
    import types

    calls: list[str] = []

    class NVMLError(Exception):
        pass

    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=p) for p in ([100, 200], [300])[h]])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_sharing.nvml_compute_processes() == [[100, 200], [300]] and calls == ["init", "shutdown"]

    def fails(h):
        raise NVMLError("Insufficient Permissions")

    fake.nvmlDeviceGetComputeRunningProcesses = fails
    got = ask(gpu_sharing.nvml_compute_processes, TRUSTED, CANDIDATE)
    assert got.unknown == "NVML could not list the GPUs' processes: Insufficient Permissions"
    assert calls[-1] == "shutdown"
