"""The kernels a process launches, from CUPTI's callback API (ctypes; the candidate's process only).

CUPTI calls back on entry to every CUDA runtime or driver call that launches a kernel, with the kernel's name and
the call's parameters, whose first function argument is the kernel's handle: a driver launch's `CUfunction` (which
Triton's compiled kernels hold as `.function`), a runtime launch's host stub (or from CUDA 13 on, the stub's
cudaKernel_t). A `Tracer` subscribes once, before the submission's code loads, with every callback off; `start` turns
the launch callbacks on for the calls to trace and `stop` off again; each kernel first seen in between is reported
through `emit` at once (the candidate's process writes it to the parent as it happens). `build_kernel_handles` gives
the handles of the kernels a build defines, to tie a launch to that build.

Subscribing took about 20 ms on an H100 host; once unsubscribed and finalized nothing stays behind (a small
GroupNorm's launch took 45.5 us before and 44.1 us after), and the names were the torch profiler's, name for name.

A CUDA graph's kernels run inside its launch call, which names none of them: the tracer says so (`emit(None, None)`).
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import fatbin
from harness.fatbin import demangle

_DRIVER, _RUNTIME = 1, 2  # CUpti_CallbackDomain
_API_ENTER = 0  # CUpti_ApiCallbackSite
# CUpti_CallbackId of the calls that launch a kernel (cupti_runtime_cbid.h, cupti_driver_cbid.h): cudaLaunch,
# cudaLaunchKernel(_ptsz), cudaLaunchCooperativeKernel(_ptsz, MultiDevice), cudaLaunchKernelExC(_ptsz),
# __cudaLaunchKernel(_ptsz); cuLaunch, cuLaunchGrid(Async), cuLaunchKernel(_ptsz), cuLaunchCooperativeKernel(_ptsz,
# MultiDevice), cuLaunchKernelEx(_ptsz).
_LAUNCHES = {_RUNTIME: (13, 211, 214, 269, 270, 272, 430, 431, 505, 506),
             _DRIVER: (115, 116, 117, 307, 442, 477, 478, 480, 652, 653)}
# cudaGraphLaunch(_ptsz), cuGraphLaunch(_ptsz): kernels the callbacks cannot name.
_GRAPH_LAUNCHES = {_RUNTIME: (311, 312), _DRIVER: (514, 515)}


class _CallbackData(ctypes.Structure):  # CUpti_CallbackData
    _fields_ = [("callbackSite", ctypes.c_int), ("functionName", ctypes.c_char_p),
                ("functionParams", ctypes.c_void_p), ("functionReturnValue", ctypes.c_void_p),
                ("symbolName", ctypes.c_char_p), ("context", ctypes.c_void_p), ("contextUid", ctypes.c_uint32),
                ("correlationData", ctypes.c_void_p), ("correlationId", ctypes.c_uint32)]


_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
# Where a driver launch's parameters (cupti_driver_cbid.h's `*_params` structs) hold its CUfunction: first for
# cuLaunch, cuLaunchGrid(Async), cuLaunchKernel(_ptsz), cuLaunchCooperativeKernel(_ptsz); after the launch config for
# cuLaunchKernelEx(_ptsz) (Triton's launcher). The multi-device launch holds a list: no handle.
_HANDLE_OFFSET = {115: 0, 116: 0, 117: 0, 307: 0, 442: 0, 477: 0, 478: 0, 652: 8, 653: 8}
# Where a runtime launch's parameters hold its function: first (the host stub, or from CUDA 13 on, where nvcc's stubs
# call __cudaLaunchKernel(_ptsz), the cudaKernel_t that cudaGetKernel gives for that stub), but after the launch config
# for cudaLaunchKernelExC(_ptsz). The multi-device launch holds a list: no handle.
_STUB_OFFSET = {13: 0, 211: 0, 214: 0, 269: 0, 270: 0, 430: 8, 431: 8, 505: 0, 506: 0}
Emit = Callable[[str | None, int | None], None]  # (name, handle)


def _maps() -> list[tuple[int, int, str]]:
    """(start, file offset, path) of each file mapping of this process."""
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                # A build sealed after its import (sandbox/builds.py) replaced each file by the harness's copy of the
                # same bytes: the mapping then names the path it was loaded from, marked deleted.
                path = parts[5].rstrip("\n").removesuffix(" (deleted)")
                out.append((int(parts[0].split("-")[0], 16), int(parts[2], 16), path))
    return out


def _kernel_lookups() -> list[Any]:
    """Of each CUDA runtime this process has loaded, what gives a stub's cudaKernel_t: `__cudaGetKernel`, which nvcc
    13's stubs call themselves, and the public `cudaGetKernel`."""
    found = []
    for path in sorted({p for _, _, p in _maps() if "/libcudart.so" in p}):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("__cudaGetKernel", "cudaGetKernel"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p], ctypes.c_int
                found.append(fn)
    return found


def build_kernel_handles(build_root: Path) -> dict[str, list[int]]:
    """For each kernel in the device code of a shared object under `build_root` that this process has loaded: the
    handles its runtime launches carry (its host stub's address, and the cudaKernel_t of that stub), by its demangled
    name. Objects are read, never loaded: only those already mapped count."""
    root = os.path.realpath(build_root) + os.sep
    bases: dict[str, int] = {}
    for start, offset, path in _maps():
        if path.startswith(root) and offset == 0:
            bases.setdefault(path, start)
    lookups = _kernel_lookups() if bases else []
    own: dict[str, list[int]] = {}
    for path, base in bases.items():
        mangled = fatbin.device_kernel_symbols(Path(path))
        for name, value in fatbin.host_functions(Path(path), mangled).items():
            stub = base + value
            handles = {stub}
            for lookup in lookups:
                kernel = ctypes.c_void_p()
                if lookup(ctypes.byref(kernel), ctypes.c_void_p(stub)) == 0 and kernel.value:
                    handles.add(kernel.value)
            own.setdefault(demangle(name), []).extend(sorted(handles))
    return own


def cupti() -> Any | None:
    """libcupti: the one this process has loaded (torch's profiler links it), else the one beside torch's CUDA
    libraries, else the loader's; None where there is none."""
    with open("/proc/self/maps") as maps:
        loaded = next((line.split()[-1] for line in maps if "/libcupti.so" in line), None)
    import torch  # where its CUDA libraries are

    beside = sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**", "libcupti.so*"),
                              recursive=True))
    for path in [p for p in (loaded, *beside) if p] + ["libcupti.so"]:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


class Tracer:
    """CUPTI's launch callbacks, subscribed once (`subscribe`); on between `start` and `stop`. Each kernel first seen
    while on (by its handle, else its name) goes to `emit(name, handle)`, demangled: a driver launch's handle is its
    CUfunction, a runtime launch's its host stub or cudaKernel_t. The first CUDA graph launch goes to
    `emit(None, None)`. `close` lets CUPTI go."""

    def __init__(self, lib: Any, subscriber: ctypes.c_void_p, callback: Any, emit: Emit):
        self.lib, self.subscriber, self.emit = lib, subscriber, emit
        self._callback = callback  # referenced until unsubscribed
        self.seen: set[Any] = set()
        self.graph = False
        self.on = False
        self.closed = False

    @classmethod
    def subscribe(cls, emit: Emit, lib: Any | None = None) -> Tracer | None:
        """A tracer with every callback off, or None where CUPTI is missing or refuses (another subscriber holds it)."""
        lib = lib if lib is not None else cupti()
        if lib is None:
            return None
        holder: list[Tracer] = []

        def on_enter(_user: Any, domain: int, cbid: int, data: Any) -> None:
            if holder:
                holder[0]._launched(domain, cbid, data)

        callback = _CALLBACK(on_enter)
        subscriber = ctypes.c_void_p()
        if lib.cuptiSubscribe(ctypes.byref(subscriber), callback, None) != 0:
            return None
        holder.append(cls(lib, subscriber, callback, emit))
        return holder[0]

    def _launched(self, domain: int, cbid: int, data: Any) -> None:
        d = ctypes.cast(data, ctypes.POINTER(_CallbackData)).contents
        if d.callbackSite != _API_ENTER or not self.on:
            return
        if cbid in _GRAPH_LAUNCHES.get(domain, ()):
            if not self.graph:
                self.graph = True
                self.emit(None, None)
            return
        offset = (_HANDLE_OFFSET if domain == _DRIVER else _STUB_OFFSET).get(cbid)
        handle = ctypes.c_void_p.from_address(d.functionParams + offset).value \
            if offset is not None and d.functionParams else None
        if not d.symbolName:
            return
        key = (domain, handle) if handle else d.symbolName
        if key in self.seen:
            return
        self.seen.add(key)
        self.emit(demangle(d.symbolName), handle)

    def _enable(self, on: int) -> bool:
        wanted = [(domain, cbid) for table in (_LAUNCHES, _GRAPH_LAUNCHES) for domain, ids in table.items()
                  for cbid in ids]
        results = [self.lib.cuptiEnableCallback(on, self.subscriber, domain, cbid) for domain, cbid in wanted]
        return all(r == 0 for r in results)

    def start(self) -> bool:
        """The launch callbacks on, each kernel reported again once (a window traced after another says all it
        launched: `TimedRounds._retime` traces one of its own); False where CUPTI refused (or was let go)."""
        if self.closed:
            return False
        self.seen.clear()
        self.graph = False
        self.on = True
        if not self._enable(1):
            self.stop()
        return self.on

    def stop(self) -> None:
        if self.on:
            self._enable(0)
            self.on = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.lib.cuptiUnsubscribe(self.subscriber)
            self.lib.cuptiFinalize()  # detached: no cost left on later launches


def names_of_launches(call: Callable[[], Any], lib: Any | None = None) -> list[str] | None:
    """Run `call` with CUPTI's launch callbacks on: the (demangled) names of the kernels it launched, sorted. None
    where they cannot tell (no CUPTI, it refused, a CUDA graph was launched); `call`'s own exception propagates."""
    names: set[str] = set()
    tracer = Tracer.subscribe(lambda name, _handle: names.add(name) if name else None, lib)
    if tracer is None:
        return None
    try:
        if not tracer.start():
            return None
        call()
    finally:
        tracer.close()
    return None if tracer.graph else sorted(names)
