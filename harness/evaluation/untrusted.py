"""What the trusted side reads from the candidate, read as hostile data: its saved outputs (the trials', the
determinism re-run's, the hand-overs'). The submission owns the process that wrote them and can rewrite their
bytes, so nothing in them is taken on trust: `load_outputs` is the one way in, whatever carries the bytes.

Two kinds of failure, each the submission's, never the harness's:
  UntrustedFile  the bytes are not what torch.save writes for an output (a FIFO or a link in a file's place, too
                 many bytes, records or pickle bytes, a compressed record, a storage location that names no device):
                 graded runtime_error;
  BadOutput      it loads, but is not made of dense, strided, plain tensors on a real device (a sparse or meta
                 tensor, a subclass, an object that is no tensor): graded shape_mismatch.
A wrong dtype or shape is neither: the judge's figures say it (dtype_mismatch, shape_mismatch).
"""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import torch

# The unpickler runs before anything is known of what it makes: its input is bounded instead. torch.save's pickle
# of an output holds about 150 bytes per tensor, its archive six records besides one per storage; a pickle of
# millions of small objects (64 MiB of them would take gigabytes as Python objects) never reaches the unpickler.
PICKLE_BYTES = 64 << 10
PICKLE_BYTES_PER_TENSOR = 1 << 10
ARCHIVE_RECORDS = 16
# The storage locations torch.save writes for a tensor on a device the harness runs on.
_LOCATION = re.compile(r"(cpu|cuda)(:[0-9]{1,4})?")
# A description of the candidate's data in a message: bounded, whatever the data holds.
_SHOWN = 200


class UntrustedFile(Exception):
    """A file the candidate wrote that is not what torch.save writes for an output: the submission's fault."""


class BadOutput(Exception):
    """An output that loads but is not made of dense, strided, plain tensors on a real device."""


def shown(text: str) -> str:
    """Candidate-made text as a message shows it: one line, bounded."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= _SHOWN else line[:_SHOWN] + "..."


def read_untrusted(path: Path, max_bytes: int) -> bytes:
    """The bytes of a file the candidate's process wrote, read without following a link and without blocking
    (a FIFO or a device in its place would hang or mislead a plain open), up to `max_bytes`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a symbolic link
        raise UntrustedFile(f"{path.name} cannot be opened as a regular file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFile(f"{path.name} is not a regular file")
        if st.st_size > max_bytes:
            raise UntrustedFile(f"{path.name} has {st.st_size} bytes, more than the {max_bytes} an output of this "
                                "problem can need")
        return f.read(max_bytes + 1)[:max_bytes]


def check_archive(data: bytes, tensors: int) -> None:
    """The archive's table of contents, before anything in it is unpickled: a zip of stored records (a compressed
    one could inflate past any bound) that fit in the file, few enough for `tensors` outputs, with a pickle small
    enough for them."""
    try:
        records = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise UntrustedFile(f"it is not an archive torch.save writes ({shown(str(e))})") from None
    most = ARCHIVE_RECORDS + 2 * tensors
    if len(records) > most:
        raise UntrustedFile(f"its archive holds {len(records)} records, more than the {most} that {tensors} "
                            "output tensor(s) need")
    pickles = [r for r in records if r.filename.endswith("/data.pkl") or r.filename == "data.pkl"]
    if len(pickles) != 1:
        raise UntrustedFile(f"its archive holds {len(pickles)} pickles, not one")
    for r in records:
        if r.compress_type != zipfile.ZIP_STORED or r.file_size != r.compress_size or r.file_size > len(data):
            raise UntrustedFile(f"its record {shown(r.filename)!r} is compressed or larger than the file")
    limit = PICKLE_BYTES + PICKLE_BYTES_PER_TENSOR * tensors
    if pickles[0].file_size > limit:
        raise UntrustedFile(f"its pickle has {pickles[0].file_size} bytes, more than the {limit} that {tensors} "
                            "output tensor(s) need")


def check_tensor(t: Any, device_type: str) -> None:
    """One output tensor: a plain torch.Tensor, dense and strided, with data on the reference's kind of device."""
    if not isinstance(t, torch.Tensor):
        return  # not a tensor at all: the structure check (and its verdict) says what it is
    if type(t) is not torch.Tensor:
        raise BadOutput(f"a {type(t).__name__} (a torch.Tensor subclass), not a plain torch.Tensor")
    if t.layout != torch.strided:
        raise BadOutput(f"a {str(t.layout).removeprefix('torch.')} tensor, not a dense strided torch.Tensor")
    if t.is_meta:
        raise BadOutput(f"a tensor on the meta device (no data), the reference's on {device_type}")
    if t.is_quantized or t.is_nested:
        raise BadOutput("a quantized or nested tensor, not a dense strided torch.Tensor")


def load_outputs(data: bytes, tensors: int, device_type: str) -> Any:
    """An output as torch.save wrote it (`tensors`: how many the reference's output has), checked as hostile: the
    archive before unpickling (`check_archive`), plain tensors only while unpickling (weights_only), every storage's
    location a device of the reference's kind, every tensor by `check_tensor`. Storages stay on the host."""
    check_archive(data, tensors)
    locations: list[str] = []

    def record(storage: Any, location: Any) -> Any:
        if not isinstance(location, str) or _LOCATION.fullmatch(location) is None:
            raise UntrustedFile(f"a storage location {shown(repr(location))} that names no device")
        locations.append(location)
        return storage

    try:
        obj = torch.load(io.BytesIO(data), map_location=record, weights_only=True)
    except UntrustedFile:
        raise
    except Exception as e:  # a tensor subclass or arbitrary object: not a plain tensor output
        raise BadOutput(f"the output is not made of plain torch.Tensors ({shown(str(e)) or type(e).__name__})"
                        ) from None
    wrong = sorted({loc for loc in locations if loc.partition(":")[0] != device_type})
    if wrong:
        raise BadOutput(f"the output lives on {', '.join(wrong)}, the reference's on {device_type}")
    for t in obj if isinstance(obj, (list, tuple)) else [obj]:
        check_tensor(t, device_type)
    return obj
