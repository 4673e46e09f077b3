"""The kernel trace's fast path, CUPTI's launch callbacks, against a stand-in for libcupti (the real one runs in the
GPU tests): kernels named as they are launched, demangled once each; a CUDA graph's launch, a refusal or no CUPTI
at all sends the trace to the profiler; CUPTI is let go whatever the call does."""

from __future__ import annotations

import ctypes

import pytest

from harness.sandbox import launches

RUNTIME_LAUNCH, DRIVER_LAUNCH, RUNTIME_GRAPH = (2, 211), (1, 307), (2, 311)


class FakeCupti:
    """Records what is asked of it; `fire` calls back as libcupti would on entry to (or exit from) a CUDA call."""

    def __init__(self, subscribe: int = 0, enable: int = 0):
        self.results = {"subscribe": subscribe, "enable": enable}
        self.callback = None
        self.enabled: list[tuple[int, int]] = []
        self.calls: list[str] = []
        self._keep: list[ctypes.Structure] = []

    def cuptiSubscribe(self, _handle, callback, _user):  # libcupti's names, as ctypes finds them
        self.calls.append("subscribe")
        self.callback = callback
        return self.results["subscribe"]

    def cuptiEnableCallback(self, enable, _subscriber, domain, cbid):
        self.enabled.append((domain, cbid))
        return self.results["enable"]

    def cuptiUnsubscribe(self, _subscriber):
        self.calls.append("unsubscribe")
        return 0

    def cuptiFinalize(self):
        self.calls.append("finalize")
        return 0

    def fire(self, site: tuple[int, int], symbol: bytes | None, enter: bool = True) -> None:
        data = launches._CallbackData(callbackSite=0 if enter else 1, functionName=b"f", symbolName=symbol)
        self._keep.append(data)
        assert self.callback is not None
        self.callback(None, site[0], site[1], ctypes.addressof(data))


def test_kernels_are_named_at_launch_demangled_once_each_and_cupti_is_let_go():
    lib = FakeCupti()

    def forward():
        lib.fire(RUNTIME_LAUNCH, b"_Z15hardtanh_kernelPKfPflff")
        lib.fire(DRIVER_LAUNCH, b"_Z15hardtanh_kernelPKfPflff")  # the runtime's launch, through the driver
        lib.fire(DRIVER_LAUNCH, b"triton_poi_fused_add_0")
        lib.fire(DRIVER_LAUNCH, b"on_exit_only", enter=False)
        lib.fire(RUNTIME_LAUNCH, None)

    names = launches.names_of_launches(forward, lib)
    assert names == ["hardtanh_kernel(float const*, float*, long, float, float)", "triton_poi_fused_add_0"]
    assert lib.calls == ["subscribe", "unsubscribe", "finalize"]
    assert RUNTIME_LAUNCH in lib.enabled and DRIVER_LAUNCH in lib.enabled and RUNTIME_GRAPH in lib.enabled


def test_a_cuda_graph_launch_or_a_refusing_cupti_leaves_the_trace_to_the_profiler(monkeypatch):
    lib = FakeCupti()

    def replay():
        lib.fire(RUNTIME_LAUNCH, b"_Z6beforev")
        lib.fire(RUNTIME_GRAPH, None)

    assert launches.names_of_launches(replay, lib) is None
    assert lib.calls == ["subscribe", "unsubscribe", "finalize"]

    ran = []
    held = FakeCupti(subscribe=39)  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: another holds it
    assert launches.names_of_launches(lambda: ran.append(1), held) is None
    refused = FakeCupti(enable=1)
    assert launches.names_of_launches(lambda: ran.append(1), refused) is None
    assert ran == [] and refused.calls == ["subscribe", "unsubscribe", "finalize"]

    monkeypatch.setattr(launches, "cupti", lambda: None)
    assert launches.names_of_launches(lambda: ran.append(1)) is None and ran == []


def test_the_calls_own_exception_propagates_and_cupti_is_still_let_go():
    lib = FakeCupti()

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        launches.names_of_launches(broken, lib)
    assert lib.calls == ["subscribe", "unsubscribe", "finalize"]
