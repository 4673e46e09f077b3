"""Trial data between the trusted process and the candidate's, in memory both map: no file, no disk.

The trusted side makes every segment (`create`): on the host a sealed memfd (its size fixed: F_SEAL_SHRINK and
F_SEAL_GROW, so no mapping of it can fault), on CUDA device memory of the driver's VMM API exported as a file
descriptor (`cuda_vmm.py`). Descriptors travel by SCM_RIGHTS over a socket each child shares with the parent (`FdLink`),
the parent relaying: the candidate runs in its own uid and PID namespace, where no /proc path of another process's
reaches. Where a segment's data lies is said in a layout, a JSON object carried by the protocol's messages:
`{"kind": "tensor"|"tuple"|"list"|"dict"|"other", "entries": [{"tensor": {"dtype", "shape", "offset"}} or
{"value": ...}], "keys": [...], "device": ..., "description": ...}`.

The candidate can write to every segment it maps at any time, so the trusted side reads nothing in place: `take`
copies an output out (with preadv on the host: it never maps a segment the candidate can write) and validates the
copy's layout as hostile data (untrusted.plan). One trial's data lives at a time: its inputs, its output, and the
hand-overs of one window (memory_plan.segments counts them).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.evaluation import untrusted

ALIGN = untrusted.ALIGN
_FD_MESSAGE = b"fds"


# --- the descriptors' way: a SOCK_SEQPACKET socket each child shares with the parent -------------------------------

class FdLink:
    """A child's end of its descriptor socket (`--fd-socket N`): descriptors in, descriptors out, one message each."""

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)

    def send(self, fds: list[int]) -> None:
        socket.send_fds(self.sock, [_FD_MESSAGE], fds)

    def receive(self, count: int) -> list[int]:
        if count == 0:
            return []
        _, fds, _, _ = socket.recv_fds(self.sock, len(_FD_MESSAGE), count)
        if len(fds) != count:
            for fd in fds:
                os.close(fd)
            raise OSError(f"{len(fds)} descriptors came where {count} were due")
        return fds


# --- segments ------------------------------------------------------------------------------------------------------

def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Segment:
    """A piece of shared memory: `fd` its descriptor (a memfd, or on CUDA the exported allocation's), `nbytes` its
    size. The trusted side's own (`create`) are written and read through the descriptor; the candidate's side maps
    them (`attach`)."""

    fd: int
    nbytes: int
    device: str  # "cpu" or "cuda"
    writable: bool = True  # the candidate may write it (its output); inputs go read-only
    _cuda: Any = None  # cuda_vmm.Mapping: the device memory mapped into this process
    _maps: list[Any] = field(default_factory=list)

    def close(self) -> None:
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1

    def spec(self, name: str) -> dict[str, Any]:
        return {"name": name, "nbytes": self.nbytes, "device": self.device, "writable": self.writable}

    def shared_fd(self) -> int:
        """The descriptor to hand the candidate: read-only where it must only read (a fresh open file of the
        memfd: the candidate's mapping then cannot write it); its own where it writes. The caller closes it."""
        if self.device == "cpu" and not self.writable:
            with contextlib.suppress(OSError):
                return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        return os.dup(self.fd)

    def freeze(self) -> None:
        """Written once and for all (a `written_once` host segment): sealed against writes by anyone, through any
        descriptor, before any goes out. A read-only descriptor does not do that by itself: a process with the
        same uid can open the memfd again through /proc/self/fd with write access, and the parameters one process
        took would then be what another process of the evaluation (eager's own) takes later."""
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)

    # The trusted side's way in and out: through the descriptor, never a mapping of the candidate's memory.
    def write(self, offset: int, data: torch.Tensor) -> None:
        flat = _bytes_of(data)
        if self.device == "cuda":
            self._cuda.tensor(offset, flat.numel()).copy_(flat)
            return
        # A CUDA evaluation's data into a host segment (exchange memory "host"): through this process's memory.
        view = memoryview(flat.cpu().numpy()) if flat.numel() else memoryview(b"")
        while view:
            n = os.pwritev(self.fd, [view], offset)
            view, offset = view[n:], offset + n

    def read(self, offset: int, nbytes: int, device: torch.device) -> torch.Tensor:
        """A copy of `nbytes` at `offset`, the trusted process's own; on the host read with preadv, so a segment
        shrunk under it (an unsealed one) reads short (UntrustedFile), never faults."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise untrusted.UntrustedFile(f"bytes {offset}..{offset + nbytes} lie outside the {self.nbytes}-byte "
                                          "segment")
        if self.device == "cuda":
            return self._cuda.tensor(offset, nbytes).clone()
        out = torch.empty(nbytes, dtype=torch.uint8)
        view = memoryview(out.numpy()) if nbytes else memoryview(b"")
        done = 0
        while done < nbytes:
            n = os.preadv(self.fd, [view[done:]], offset + done)
            if n <= 0:
                raise untrusted.UntrustedFile(f"the segment holds {offset + done} bytes, fewer than the "
                                              f"{offset + nbytes} its layout names (it was shrunk)")
            done += n
        return out.to(device)

    # The candidate's way: mapped.
    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """The segment's bytes as a uint8 tensor on its device, in place (the candidate's side). A read-only segment
        is mapped private and copy-on-write, anew for each call: writes stay the mapper's, and the next trial's
        bytes show in a fresh view."""
        if self.device == "cuda":
            return self._cuda.tensor(offset, nbytes)
        if self.nbytes == 0 or nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        if self.writable:
            if not self._maps:
                self._maps.append(mmap.mmap(self.fd, self.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
            m = self._maps[0]
        else:
            m = mmap.mmap(self.fd, self.nbytes, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        return torch.frombuffer(m, dtype=torch.uint8, count=nbytes, offset=offset)


def create(nbytes: int, device: str, writable: bool = True, written_once: bool = False) -> Segment:
    """A segment of the trusted side's, `nbytes` long, its size sealed. `written_once` (a host segment the candidate
    only reads, written once, as the parameters are): its seals stay open until `freeze` adds the last."""
    if device == "cuda":
        from harness.evaluation import cuda_vmm

        mapping = cuda_vmm.allocate(nbytes, torch.cuda.current_device())
        return Segment(mapping.export_fd(), mapping.size, "cuda", writable, _cuda=mapping)
    fd = os.memfd_create("harness-exchange", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        # Nobody, the candidate included, can change its size now: a mapping of it never faults past its end.
        last = 0 if written_once else fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | last)
        os.fchmod(fd, 0o600)  # another uid cannot open it again through /proc with more rights than it was given
    except BaseException:
        os.close(fd)
        raise
    return Segment(fd, nbytes, "cpu", writable)


def attach(spec: dict[str, Any], fd: int) -> Segment:
    """The candidate's side of a segment the trusted side made, from its spec and the descriptor that came."""
    seg = Segment(fd, int(spec["nbytes"]), str(spec["device"]), bool(spec["writable"]))
    if seg.device == "cuda":
        from harness.evaluation import cuda_vmm

        seg._cuda = cuda_vmm.import_fd(fd, seg.nbytes, torch.cuda.current_device())
        seg.fd = -1  # closed by the import: the mapping holds the allocation
    return seg


# --- what goes in them -------------------------------------------------------------------------------------------

def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A tensor's data as a flat uint8 tensor, dense (copied where it is not)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def not_dense(t: torch.Tensor) -> str | None:
    """Why a tensor is no output the judge can take (untrusted's kinds of BadOutput), None where it is one."""
    if type(t) is not torch.Tensor:
        return f"a {type(t).__name__} (a torch.Tensor subclass), not a plain torch.Tensor"
    if t.layout != torch.strided:
        return f"a {str(t.layout).removeprefix('torch.')} tensor, not a dense strided torch.Tensor"
    if t.is_meta:
        return "a tensor on the meta device (no data)"
    if t.is_quantized or t.is_nested:
        return "a quantized or nested tensor, not a dense strided torch.Tensor"
    if _dtype_name(t.dtype) not in untrusted.DTYPES:
        return f"a tensor of dtype {_dtype_name(t.dtype)}, which the judge does not read"
    return None


def packed_bytes(obj: Any) -> int:
    """The bytes `pack` needs for `obj` (each tensor aligned)."""
    if isinstance(obj, torch.Tensor):
        return aligned(obj.numel() * obj.element_size())
    if isinstance(obj, (list, tuple)):
        return sum(packed_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(packed_bytes(o) for o in obj.values())
    return 0


def pack(obj: Any, seg: Segment | None, base: int = 0, *, in_place: bool = False, write: bool = True
         ) -> dict[str, Any]:
    """Write `obj` (a tensor, or a list, tuple or dict of tensors and JSON values) into `seg` from `base`; its
    layout. `in_place`: write through the candidate's mapping (its side) rather than the descriptor; `write=False`:
    only the layout that writing would give. A tensor that does not fit, or no plain dense one, is described rather
    than written: the judge reads what it says."""
    if isinstance(obj, torch.Tensor):
        kind, items, keys = "tensor", [obj], None
    elif isinstance(obj, (list, tuple)):
        kind, items, keys = type(obj).__name__, list(obj), None
    elif isinstance(obj, dict):
        kind, items, keys = "dict", list(obj.values()), [str(k) for k in obj]
    else:
        return {"kind": "other", "description": f"<{type(obj).__name__}>"}
    entries: list[dict[str, Any]] = []
    offset = base
    device = None
    for item in items:
        if not isinstance(item, torch.Tensor):
            entries.append({"value": item})
            continue
        why = not_dense(item)
        if why is not None:
            return {"kind": "other", "description": f"<{why}>"}
        device = device or item.device.type
        n = item.numel() * item.element_size()
        fits = seg is not None and offset + n <= seg.nbytes
        entries.append({"tensor": {"dtype": _dtype_name(item.dtype), "shape": list(item.shape),
                                   "offset": offset if fits else None}})
        if fits and n and write:
            assert seg is not None
            if in_place:
                seg.view(offset, n).copy_(_bytes_of(item))
            else:
                seg.write(offset, item)
        offset += aligned(n) if fits else 0
    layout: dict[str, Any] = {"kind": kind, "entries": entries, "device": device}
    if keys is not None:
        layout["keys"] = keys
    return layout


def unpack(layout: dict[str, Any], seg: Segment | None, device: torch.device) -> Any:
    """What `pack` wrote, from the trusted side's own layout (the candidate's side: in place, on `device`). The
    trusted side reads the candidate's with `take`."""
    if layout["kind"] == "other":
        return layout.get("description")
    items = []
    for entry in layout["entries"]:
        if "value" in entry:
            items.append(entry["value"])
            continue
        t = entry["tensor"]
        dtype = getattr(torch, t["dtype"])
        n = _numel(t["shape"]) * torch.empty(0, dtype=dtype).element_size()
        assert seg is not None
        raw = seg.view(t["offset"], n) if n else torch.empty(0, dtype=torch.uint8, device=seg.device)
        items.append(raw.view(dtype).reshape(t["shape"]).to(device))
    if layout["kind"] == "tensor":
        return items[0]
    if layout["kind"] == "dict":
        return dict(zip(layout["keys"], items, strict=True))
    return tuple(items) if layout["kind"] == "tuple" else items


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def take(layout: Any, seg: Segment, expected_tensors: int, device: torch.device) -> Any:
    """The candidate's output as the trusted side judges it: its layout validated as hostile data
    (untrusted.plan), each tensor copied out of the segment into this process's memory on `device`. A tensor the
    layout says did not fit (no offset) comes as a meta tensor: its shape and dtype say what was wrong, and no
    comparison reaches its data (untrusted.plan allows it only where the data could not have fitted)."""
    plan = untrusted.plan(layout, seg.nbytes, expected_tensors, device.type)
    if isinstance(plan, str):
        return plan  # the candidate's description of what it could not pack
    kind, tensors = plan
    got = []
    for dtype_name, shape, offset, nbytes in tensors:
        dtype = getattr(torch, dtype_name)
        if offset is None:
            got.append(torch.empty(shape, dtype=dtype, device="meta"))
            continue
        raw = seg.read(offset, nbytes, device)
        got.append(raw.view(dtype).reshape(shape))
    if kind == "tensor":
        return got[0]
    return tuple(got) if kind == "tuple" else got
