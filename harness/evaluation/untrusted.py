"""What the trusted side reads from the candidate, read as hostile data: the layout of each output it packed into
shared memory (the trials', the determinism re-run's, the hand-overs'), a JSON object its process wrote. The
submission owns that process and can write anything there, and into the segment at any time, so nothing in it is
taken on trust: `plan` is the one way in, and the bytes are then copied out before anything looks at them
(exchange.take).

Two kinds of failure, each the submission's, never the harness's:
  UntrustedFile  the layout is not what the harness's packing writes for an output (an unknown kind or dtype, a
                 shape or an offset out of bounds, overlapping or unaligned data, more entries than the output has,
                 a segment that holds fewer bytes than it names): graded runtime_error;
  BadOutput      it reads, but is not made of plain tensors on the reference's kind of device (a value that is no
                 tensor, a tensor on another device): graded shape_mismatch. A sparse, meta, subclassed or quantized
                 output is described by the packing, never packed: its description says so (also shape_mismatch).
A wrong dtype or shape is neither: the judge's figures say it (dtype_mismatch, shape_mismatch).
"""

from __future__ import annotations

from typing import Any

from harness.precision import DTYPE_BYTES

ALIGN = 64  # every tensor's data starts at a multiple of this in a segment (any dtype's view is aligned)
DTYPES = DTYPE_BYTES  # the dtypes an output may have, with their sizes
MAX_DIMS = 32
MAX_ELEMENTS = 1 << 48  # a shape past this describes no output any device holds
EXTRA_ENTRIES = 16  # entries beyond the reference's output's count that a layout may list (then refused)
_SHOWN = 200
_KINDS = ("tensor", "tuple", "list", "other")


class UntrustedFile(Exception):
    """What the candidate packed is not what the harness's packing writes for an output: the submission's fault."""


class BadOutput(Exception):
    """An output that reads but is not made of plain tensors on the reference's kind of device."""


def shown(text: str) -> str:
    """Candidate-made text as a message shows it: one line, bounded."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= _SHOWN else line[:_SHOWN] + "..."


def _int(x: Any, what: str, low: int, high: int) -> int:
    if type(x) is not int or not low <= x <= high:
        raise UntrustedFile(f"its {what} {shown(repr(x))} is no integer in {low}..{high}")
    return x


def plan(layout: Any, segment_bytes: int, expected_tensors: int, device_type: str
         ) -> str | tuple[str, list[tuple[str, list[int], int | None, int]]]:
    """A layout checked before any byte is read: the candidate's description of an output it could not pack (a
    string, bounded), or (kind, [(dtype, shape, offset or None, nbytes)]) where each tensor's data lies inside the
    segment, aligned, apart from the others'. An offset of None (the data was not written) is allowed only where the
    tensor could not have fitted in the segment: one of the reference's shape and dtype always fits."""
    if not isinstance(layout, dict):
        raise UntrustedFile(f"its layout is a {type(layout).__name__}, not an object")
    kind = layout.get("kind")
    if kind not in _KINDS:
        raise UntrustedFile(f"its layout's kind {shown(repr(kind))} is none of {', '.join(_KINDS)}")
    if kind == "other":
        description = layout.get("description")
        return shown(description) if isinstance(description, str) and description.startswith("<") else "<?>"
    entries = layout.get("entries")
    if not isinstance(entries, list) or len(entries) > expected_tensors + EXTRA_ENTRIES:
        raise UntrustedFile(f"its layout lists {len(entries) if isinstance(entries, list) else 'no'} entries, "
                            f"where the reference's output has {expected_tensors} tensor(s)")
    if kind == "tensor" and len(entries) != 1:
        raise UntrustedFile(f"its layout of one tensor lists {len(entries)} entries")
    if entries and layout.get("device") != device_type:
        raise BadOutput(f"the output lives on {shown(str(layout.get('device')))}, the reference's on {device_type}")
    tensors: list[tuple[str, list[int], int | None, int]] = []
    spans: list[tuple[int, int]] = []
    for entry in entries:
        t = entry.get("tensor") if isinstance(entry, dict) else None
        if not isinstance(t, dict):
            raise BadOutput("the output holds a value that is not a tensor")
        dtype = t.get("dtype")
        if dtype not in DTYPES:
            raise UntrustedFile(f"a tensor of dtype {shown(repr(dtype))}, which no output has")
        shape = t.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise UntrustedFile(f"a tensor's shape {shown(repr(shape))} is no list of at most {MAX_DIMS} sizes")
        numel = 1
        for d in shape:
            numel *= _int(d, "dimension", 0, MAX_ELEMENTS)
        if numel > MAX_ELEMENTS:
            raise UntrustedFile(f"a tensor of {numel} elements, more than any device holds")
        nbytes = numel * DTYPES[dtype]
        offset = t.get("offset")
        if offset is None:
            if nbytes <= segment_bytes:
                raise UntrustedFile(f"a tensor of {nbytes} bytes, which fits the segment, was not written")
        else:
            _int(offset, "offset", 0, segment_bytes)
            if offset % ALIGN or offset + nbytes > segment_bytes:
                raise UntrustedFile(f"a tensor's data at {offset}..{offset + nbytes} is unaligned or lies outside "
                                    f"the {segment_bytes}-byte segment")
            if nbytes and any(offset < end and start < offset + nbytes for start, end in spans):
                raise UntrustedFile(f"a tensor's data at {offset}..{offset + nbytes} overlaps another's")
            spans.append((offset, offset + nbytes))
        tensors.append((dtype, list(shape), offset, nbytes))
    return kind, tensors
