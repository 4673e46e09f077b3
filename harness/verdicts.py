"""The closed verdict vocabulary, and the one place where failure text is classified."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Verdict(str, Enum):
    passed = "passed"
    invalid_submission = "invalid_submission"
    compile_error = "compile_error"
    runtime_error = "runtime_error"
    shape_mismatch = "shape_mismatch"
    dtype_mismatch = "dtype_mismatch"
    wrong_answer = "wrong_answer"
    nondeterministic = "nondeterministic"
    timeout = "timeout"
    crashed = "crashed"
    flagged = "flagged"
    infra_error = "infra_error"

    @property
    def is_submission_fault(self) -> bool:
        return self not in (Verdict.passed, Verdict.infra_error)


class Phase(str, Enum):
    """Where in the candidate's life something happened."""

    static = "static"  # parent-side checks of the text, nothing imported
    compile = "compile"  # importing the submission (load_inline builds) and constructing ModelNew
    correctness = "correctness"
    timing = "timing"
    reference = "reference"  # the trusted side: our fault if it fails


# CUDA errors that leave the context unusable: the process is as good as dead.
_CUDA_FATAL = re.compile(
    r"illegal memory access|unspecified launch failure|misaligned address|illegal instruction|"
    r"device-side assert|CUDA error: an illegal|invalid program counter|hardware stack error|"
    r"CUBLAS_STATUS_EXECUTION_FAILED|uncorrectable ECC",
    re.IGNORECASE,
)
_BUILD_FAILURE = re.compile(r"Error building extension|error: command .* failed|ninja: build stopped")


def classify_exception(phase: Phase, exc_type: str, message: str) -> Verdict:
    """Map an exception raised by submission code to a verdict.

    This is the only function that looks at exception text (STYLE.md).
    """
    if exc_type == "SystemExit":
        return Verdict.crashed
    if _CUDA_FATAL.search(message):
        return Verdict.crashed
    if phase == Phase.compile and _BUILD_FAILURE.search(message):
        return Verdict.compile_error
    return Verdict.runtime_error


# A device allocation that failed: PyTorch's OutOfMemoryError (torch.cuda's too), and the CUDA runtime's, cuBLAS's and
# cuDNN's own words for it, as a load_inline extension or a library raises them.
_DEVICE_OOM_TYPES = frozenset({"OutOfMemoryError"})
_DEVICE_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation|"
                         r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED")
_SIZE = r"([0-9]+(?:\.[0-9]+)?) (bytes|KiB|MiB|GiB|TiB)"
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
# PyTorch's caching allocator's message (c10's format_size): "Tried to allocate 4.00 GiB. GPU 0 has a total capacity
# of 79.18 GiB of which 1.77 GiB is free. Including non-PyTorch memory, this process has 12.69 GiB memory in use."
_TRIED = re.compile(r"Tried to allocate " + _SIZE)
_FREE = re.compile(r"of which " + _SIZE + r" is free")
_HELD = re.compile(r"this process has " + _SIZE + r" memory in use")


@dataclass(frozen=True)
class OutOfMemoryClaim:
    """What a device out-of-memory error's text says, in bytes (None where it does not say): the allocation that
    failed, the device's free memory and the process's own use. Written by the process that failed: claims."""

    tried: int | None = None
    free: int | None = None
    held: int | None = None


def _bytes(pattern: re.Pattern[str], message: str) -> int | None:
    m = pattern.search(message)
    return None if m is None else int(float(m[1]) * _UNITS[m[2]])


def device_out_of_memory(exc_type: str, message: str) -> OutOfMemoryClaim | None:
    """Whether an exception is a device allocation that failed, and what its text claims of the memory; None where
    it is not one."""
    if exc_type not in _DEVICE_OOM_TYPES and not _DEVICE_OOM.search(message):
        return None
    return OutOfMemoryClaim(tried=_bytes(_TRIED, message), free=_bytes(_FREE, message), held=_bytes(_HELD, message))


# Flags on a passed result that keep it off the leaderboard: it is correct, but not a kernel of its own, or its time
# is not vouched for (too noisy, or timed on a GPU shared with other processes' work).
UNRANKED_CHECKS = frozenset({"no_custom_kernel", "timing_unreliable", "shared_gpu", "degenerate_tolerance"})
