"""The kernel trace, CUPTI's launch callbacks, against a stand-in for libcupti (the real one runs in the GPU tests):
kernels named as they are launched, demangled and reported once each with the launch's handle (a driver launch's
CUfunction, a runtime launch's host stub or cudaKernel_t); callbacks on only between start and stop; a CUDA graph's
launch, a refusal or no CUPTI at all said so; CUPTI is let go whatever the call does."""

from __future__ import annotations

import ctypes
import sys
import types

import pytest

from harness.evaluation import launches

RUNTIME_LAUNCH, DRIVER_LAUNCH, RUNTIME_GRAPH = (2, 211), (1, 307), (2, 311)
DRIVER_LAUNCH_EX, RUNTIME_LAUNCH_EX = (1, 652), (2, 430)  # Triton's cuLaunchKernelEx; cudaLaunchKernelExC
RUNTIME_LAUNCH_13 = (2, 505)  # __cudaLaunchKernel: what nvcc 13's stubs call, with the stub's cudaKernel_t


class FakeCupti:
    """Records what is asked of it; `fire` calls back as libcupti would on entry to (or exit from) a CUDA call."""

    def __init__(self, subscribe: int = 0, enable: int = 0):
        self.results = {"subscribe": subscribe, "enable": enable}
        self.callback = None
        self.enabled: list[tuple[int, int]] = []
        self.disabled: list[tuple[int, int]] = []
        self.calls: list[str] = []
        self._keep: list[ctypes.Structure] = []

    def cuptiSubscribe(self, _handle, callback, _user):  # libcupti's names, as ctypes finds them
        self.calls.append("subscribe")
        self.callback = callback
        return self.results["subscribe"]

    def cuptiEnableCallback(self, enable, _subscriber, domain, cbid):
        (self.enabled if enable else self.disabled).append((domain, cbid))
        return self.results["enable"]

    def cuptiUnsubscribe(self, _subscriber):
        self.calls.append("unsubscribe")
        return 0

    def cuptiFinalize(self):
        self.calls.append("finalize")
        return 0

    def fire(self, site: tuple[int, int], symbol: bytes | None, enter: bool = True, params: tuple[int, ...] = ()
             ) -> None:
        """A callback for `site`; `params`, the launch's parameters as pointer-sized words."""
        words = (ctypes.c_uint64 * max(len(params), 1))(*params)
        data = launches._CallbackData(callbackSite=0 if enter else 1, functionName=b"f", symbolName=symbol,
                                      functionParams=ctypes.addressof(words) if params else None)
        self._keep += [data, words]
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


def test_each_kernel_is_reported_once_as_launched_with_its_function_and_only_while_on():
    lib = FakeCupti()
    got = []
    tracer = launches.Tracer.subscribe(lambda *record: got.append(record), lib)
    assert tracer is not None and lib.enabled == []  # subscribed with every callback off
    stub, cuda_kernel, cubin_function, config = 0x7F11_0000_0000, 0x5A5A_0000_0100, 0x5A5A_0000_0010, 0x1234
    assert tracer.start()
    lib.fire(RUNTIME_LAUNCH, b"_Z15hardtanh_kernelPKfPflff", params=(stub, 1, 1))
    lib.fire(RUNTIME_LAUNCH, b"_Z15hardtanh_kernelPKfPflff", params=(stub, 1, 1))  # once per function
    lib.fire(DRIVER_LAUNCH_EX, b"add_kernel", params=(config, cubin_function, 0, 0))  # after the launch config
    lib.fire(DRIVER_LAUNCH, b"triton_", params=(cubin_function + 8,))
    lib.fire(DRIVER_LAUNCH, b"triton_", params=(cubin_function + 16,))  # another kernel of the same name
    lib.fire(RUNTIME_LAUNCH_EX, b"_Z3fooPf", params=(config, stub + 64))
    lib.fire(RUNTIME_LAUNCH_13, b"_Z3barPf", params=(cuda_kernel, 1, 1))
    lib.fire(RUNTIME_GRAPH, None)
    lib.fire(RUNTIME_GRAPH, None)
    tracer.stop()
    assert lib.disabled == lib.enabled
    lib.fire(DRIVER_LAUNCH, b"after_stop", params=(7,))  # CUPTI calls back no more once off; ignored if it did
    assert got == [("hardtanh_kernel(float const*, float*, long, float, float)", stub),
                   ("add_kernel", cubin_function), ("triton_", cubin_function + 8), ("triton_", cubin_function + 16),
                   ("foo(float*)", stub + 64), ("bar(float*)", cuda_kernel), (None, None)]  # a graph, said once
    got.clear()  # a window traced after another says every kernel it launched, once
    assert tracer.start()
    lib.fire(RUNTIME_LAUNCH, b"_Z15hardtanh_kernelPKfPflff", params=(stub, 1, 1))
    lib.fire(RUNTIME_LAUNCH, b"_Z15hardtanh_kernelPKfPflff", params=(stub, 1, 1))
    tracer.stop()
    assert got == [("hardtanh_kernel(float const*, float*, long, float, float)", stub)]
    tracer.close()
    tracer.close()
    assert lib.calls == ["subscribe", "unsubscribe", "finalize"] and not tracer.start()


class _FakeJITFunction:
    """Triton's JITFunction as far as the trace reads it: `fn` (the decorated function), `device_caches` (device ->
    (compiled kernels by key, target, backend, binder)), each compiled kernel's `function` (its CUfunction)."""

    def __init__(self, fn, handles):
        self.fn = fn
        self.device_caches = {0: ({i: types.SimpleNamespace(function=h) for i, h in enumerate(handles)}, None, None,
                                  None)}


def test_own_triton_kernels_are_those_of_jit_functions_whose_code_is_in_the_submissions_file(tmp_path, monkeypatch):
    from harness.evaluation import child

    assert child.own_triton_kernels(tmp_path / "submission.py") == {}  # Triton never imported
    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = _FakeJITFunction
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    submission, cache = tmp_path / "submission.py", tmp_path / "torchinductor_x" / "ab" / "cabcdef.py"
    cache.parent.mkdir(parents=True)
    submission.write_text("def add_kernel(x):\n    pass\n\ndef triton_(x):\n    pass\n")
    cache.write_text("def triton_(x):\n    pass\n")
    mine, theirs = {}, {}
    exec(compile(submission.read_text(), str(submission), "exec"), mine)
    exec(compile(cache.read_text(), str(cache), "exec"), theirs)
    kept = [_FakeJITFunction(mine["add_kernel"], [0x10, 0x18]), _FakeJITFunction(mine["triton_"], [0x20]),
            _FakeJITFunction(theirs["triton_"], [0x30]), _FakeJITFunction(mine["add_kernel"], [None])]
    assert child.own_triton_kernels(submission) == {"add_kernel": [0x10, 0x18], "triton_": [0x20]}
    del kept
