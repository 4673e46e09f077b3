"""The closed verdict vocabulary, and the one place where failure text is classified."""

from __future__ import annotations

import re
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


# Flags on a passed result that keep it off the leaderboard: it is correct, but not a kernel of its own, or its time
# is not vouched for (too noisy, or timed on a GPU shared with other processes' work).
UNRANKED_CHECKS = frozenset({"no_custom_kernel", "timing_unreliable", "shared_gpu", "degenerate_tolerance"})
