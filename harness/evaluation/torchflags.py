"""Global torch settings that change numerics; a submission must leave them as it found them."""

from __future__ import annotations

from typing import Any

import torch


def snapshot() -> dict[str, Any]:
    flags: dict[str, Any] = {
        "default_dtype": str(torch.get_default_dtype()),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.enabled": torch.backends.cudnn.enabled,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
    }
    for name, obj in (("fp32_precision", torch.backends), ("cuda.matmul.fp32_precision", torch.backends.cuda.matmul),
                      ("cudnn.fp32_precision", torch.backends.cudnn)):
        if hasattr(obj, "fp32_precision"):  # torch >= 2.9 spells TF32 this way too
            flags[name] = obj.fp32_precision
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flags.items()}


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(k, before.get(k), after.get(k)) for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
