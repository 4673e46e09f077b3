"""The precisions an evaluation runs at, as KernelBench names them, and each one's tolerance. No torch here: the API,
the DB and the CLI validate and show a precision; only the sandbox turns it into a dtype (problem_module.dtype_of).

At a precision, the problem's floating-point inputs and the floating-point parameters and buffers of both models are
cast to it (at fp32 a problem's fp32 tensors stay as they are), so the reference's output, and the one the candidate
must return, has its dtype; the float64 truth is still computed in float64, from those rounded inputs and parameters.
Integer and boolean inputs (indices, masks) keep their dtype, where KernelBench casts every tensor (an index cast to
fp16 breaks the reference).
"""

from __future__ import annotations

from typing import get_args

from harness.schema import Precision, Tolerance

PRECISIONS: tuple[str, ...] = get_args(Precision)
DEFAULT_PRECISION: Precision = "fp32"

# torch's name of each precision's dtype (`torch.float16` is `getattr(torch, "float16")`).
DTYPE_NAMES: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
# Bytes per element of every dtype the harness reads or plans for, by torch's name without "torch." (the numbers torch
# makes on the devices the harness runs on): the dtypes an output may have (evaluation/untrusted.py), and the sizes
# the memory plan counts in.
DTYPE_BYTES: dict[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
                               "float8_e5m2": 1, "complex128": 16, "complex64": 8, "int64": 8, "int32": 4, "int16": 2,
                               "int8": 1, "uint8": 1, "bool": 1}

# KernelBench's get_tolerance_for_precision (after torchbench): atol = rtol = 1e-4 at fp32, 1e-2 at fp16 and bf16.
# A half-precision format has 8 (bf16) or 11 (fp16) significant bits: one rounding of an output is already 4e-3
# (bf16) or 5e-4 (fp16) of it, so fp32's 1e-4 fails an honest kernel on rounding alone.
KERNELBENCH_TOLERANCE: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-4),
    "fp16": Tolerance(atol=1e-2, rtol=1e-2),
    "bf16": Tolerance(atol=1e-2, rtol=1e-2),
}


class UnknownPrecision(ValueError):
    pass


def check(name: str) -> Precision:
    """`name` as a precision, or a clear error naming the known ones."""
    if name not in PRECISIONS:
        raise UnknownPrecision(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
    return name  # type: ignore[return-value]


def tolerance(problem_tolerance: Tolerance, precision: str) -> Tolerance:
    """The tolerance an evaluation at `precision` is graded at: the problem's own at fp32 (KernelBench's 1e-4 unless
    the problem says otherwise); at a half precision KernelBench's for it, or the problem's own where that is looser."""
    if check(precision) == "fp32":
        return problem_tolerance
    base = KERNELBENCH_TOLERANCE[precision]
    return Tolerance(atol=max(base.atol, problem_tolerance.atol), rtol=max(base.rtol, problem_tolerance.rtol))
