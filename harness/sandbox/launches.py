"""The names of the kernels a call launches, from CUPTI's callback API (ctypes; the candidate's process only).

CUPTI calls back on entry to every CUDA runtime or driver call that launches a kernel, with the kernel's name.
Subscribing takes about 20 ms, and once unsubscribed and finalized nothing stays behind: on an H100 host a small
GroupNorm's launch took 45.5 us before and 44.1 us after, and the names were the torch profiler's, name for name.
The profiler's first start in a process takes 4-7 s there, and leaves about a third more on every later launch.

A CUDA graph's kernels run inside its launch call, which names none of them: `names_of_launches` then says None,
as it does where CUPTI is missing or refuses (another subscriber holds it), and the caller asks the profiler.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from typing import Any

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


def names_of_launches(call: Callable[[], Any], lib: Any | None = None) -> list[str] | None:
    """Run `call` with CUPTI's launch callbacks on: the (demangled) names of the kernels it launched, sorted. None
    where they cannot tell (no CUPTI, it refused, a CUDA graph was launched); `call`'s own exception propagates."""
    lib = lib if lib is not None else cupti()
    if lib is None:
        return None
    names: set[bytes] = set()
    graphs: list[int] = []

    def on_enter(_user: Any, domain: int, cbid: int, data: Any) -> None:
        d = ctypes.cast(data, ctypes.POINTER(_CallbackData)).contents
        if d.callbackSite != _API_ENTER:
            return
        if cbid in _GRAPH_LAUNCHES.get(domain, ()):
            graphs.append(cbid)
        elif d.symbolName:
            names.add(d.symbolName)

    callback = _CALLBACK(on_enter)  # referenced until unsubscribed
    subscriber = ctypes.c_void_p()
    if lib.cuptiSubscribe(ctypes.byref(subscriber), callback, None) != 0:
        return None
    try:
        wanted = [(domain, cbid) for table in (_LAUNCHES, _GRAPH_LAUNCHES) for domain, ids in table.items()
                  for cbid in ids]
        if any(lib.cuptiEnableCallback(1, subscriber, domain, cbid) != 0 for domain, cbid in wanted):
            return None
        call()
    finally:
        lib.cuptiUnsubscribe(subscriber)
        lib.cuptiFinalize()  # detached: no cost left on later launches
    if graphs:
        return None
    return sorted({demangle(n) for n in names})
