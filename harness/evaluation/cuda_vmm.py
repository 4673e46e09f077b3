"""Device memory two processes share through a plain file descriptor: the CUDA driver's VMM API over ctypes.

Legacy CUDA IPC (cudaIpcGetMemHandle, torch's storage._share_cuda_) fails across PID namespaces: the candidate runs
in its own. cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR exports an fd (cuMemExportToShareableHandle)
that SCM_RIGHTS carries like a memfd; the importer maps it (cuMemImportFromShareableHandle, cuMemAddressReserve,
cuMemMap, cuMemSetAccess). torch wraps a mapped range without a copy through __cuda_array_interface__.
The process's primary context must be current (torch's, once it touched the device).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import torch

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class CudaError(RuntimeError):
    pass


_lib: Any = None


def _cuda() -> Any:
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL("libcuda.so.1")
    return _lib


def _check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(result, ctypes.byref(name))
        raise CudaError(f"{what} failed: {name.value.decode() if name.value else result}")


def _prop(device: int) -> _Prop:
    prop = _Prop()
    prop.type = _CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = _Location(_CU_MEM_LOCATION_TYPE_DEVICE, device)
    return prop


def granularity(device: int) -> int:
    """The allocation unit of a segment's device memory (2 MiB on an H100): what a segment of any size takes."""
    g = ctypes.c_size_t()
    prop = _prop(device)
    _check(_cuda().cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop),
                                                 _CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
    return g.value


class _ArrayInterface:
    """A device range as __cuda_array_interface__ describes it: torch.as_tensor wraps it without a copy."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


class Mapping:
    """One physical allocation mapped at a virtual range of this process's, `size` bytes (the granularity's
    multiple); `handle` the allocation's (kept by its maker, to export it)."""

    def __init__(self, handle: int, ptr: int, size: int, device: int, owner: bool):
        self.handle, self.ptr, self.size, self.device, self.owner = handle, ptr, size, device, owner

    def export_fd(self) -> int:
        fd = ctypes.c_int(-1)
        _check(_cuda().cuMemExportToShareableHandle(ctypes.byref(fd), ctypes.c_uint64(self.handle),
                                                    _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, ctypes.c_ulonglong(0)),
               "cuMemExportToShareableHandle")
        return fd.value

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        """Bytes `offset`..`offset + nbytes` as a uint8 tensor on the device, in place."""
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"bytes {offset}..{offset + nbytes} outside the {self.size}-byte mapping")
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8, device=f"cuda:{self.device}")
        return torch.as_tensor(_ArrayInterface(self.ptr + offset, nbytes), device=f"cuda:{self.device}")

    def close(self) -> None:
        if self.ptr:
            torch.cuda.synchronize(self.device)
            _cuda().cuMemUnmap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
            _cuda().cuMemAddressFree(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
            _cuda().cuMemRelease(ctypes.c_uint64(self.handle))
            self.ptr = 0


def _map(handle: int, size: int, device: int, owner: bool) -> Mapping:
    ptr = ctypes.c_uint64()
    _check(_cuda().cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                       ctypes.c_uint64(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
    _check(_cuda().cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(handle),
                            ctypes.c_ulonglong(0)), "cuMemMap")
    access = _Access(_Location(_CU_MEM_LOCATION_TYPE_DEVICE, device), _CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    _check(_cuda().cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)),
           "cuMemSetAccess")
    return Mapping(handle, ptr.value, size, device, owner)


def allocate(nbytes: int, device: int) -> Mapping:
    """Device memory of at least `nbytes` (at least one granule), exportable as an fd, mapped here."""
    torch.zeros(1, device=f"cuda:{device}")  # the primary context, current
    g = granularity(device)
    size = max(g, (nbytes + g - 1) // g * g)
    handle = ctypes.c_uint64()
    prop = _prop(device)
    _check(_cuda().cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
                               ctypes.c_ulonglong(0)), "cuMemCreate")
    return _map(handle.value, size, device, owner=True)


def import_fd(fd: int, nbytes: int, device: int) -> Mapping:
    """The allocation another process exported as `fd`, mapped here (`nbytes`: its size as its maker said)."""
    torch.zeros(1, device=f"cuda:{device}")
    handle = ctypes.c_uint64()
    _check(_cuda().cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd),
                                                  _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
           "cuMemImportFromShareableHandle")
    os.close(fd)  # the allocation is held by its handle now
    return _map(handle.value, nbytes, device, owner=False)
