"""What a forward's output is made of (a tensor, or a list or tuple of them) and the bytes it holds, as the trusted
side asks it: its judge, its memory plan and its reference windows. Functions of the values they are given alone: none
runs a model or reads a device's state.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.evaluation import exchange, untrusted


def as_list(obj: Any) -> list[Any] | None:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return list(obj)
    return None


def describe(obj: Any) -> str:
    if isinstance(obj, (tuple, list)):
        return f"{type(obj).__name__} of {len(obj)}"
    if isinstance(obj, str) and obj.startswith("<"):
        return untrusted.shown(obj.strip("<>"))  # the child's description of an object it could not save
    return type(obj).__name__


def expected_dtype(exp: torch.Tensor) -> torch.dtype:
    """The dtype a candidate's output must have: the reference's output's, computed at the evaluation's precision (its
    inputs and parameters cast to it: float16 at fp16 for a floating-point output; an index output stays int64).
    The one place that says it: a kernel that computes at fp16 but returns fp32 is a dtype_mismatch."""
    return exp.dtype


def same_outputs(a: Any, b: Any) -> bool:
    la, lb = as_list(a), as_list(b)
    if la is None or lb is None or len(la) != len(lb):
        return False
    return all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
               and torch.equal(x.nan_to_num(), y.nan_to_num()) for x, y in zip(la, lb, strict=True))


def described(values: list[Any]) -> list[tuple[int, str]]:
    """Tensors as (elements, dtype name), for the memory plan."""
    return [(t.numel(), str(t.dtype).removeprefix("torch.")) for t in values if isinstance(t, torch.Tensor)]


def stageable(value: Any) -> bool:
    """Whether an input can go through the window segment as it is: a plain dense tensor, or a JSON scalar."""
    if isinstance(value, torch.Tensor):
        return exchange.not_dense(value) is None
    return value is None or isinstance(value, (bool, int, float, str))


def tensor_bytes(values: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


def held_bytes(values: list[Any]) -> int:
    """The bytes of the storages `values`' tensors hold (each storage once): more than their elements where a
    tensor is a view, or was resized down (smooth_l1_loss's 0-dim mean keeps the unreduced loss's storage)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in values
                if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_meta}
    return sum(storages.values())


def compact(obj: Any) -> Any:
    """An output, alone or in a list or tuple, with each tensor that holds a storage larger than its elements
    replaced by a copy of them: what the trusted side keeps of a forward. level1/96's expected 0-dim loss held 4 GiB
    and its float64 truth 8 GiB a trial, and six trials kept ran the prepare out of an H100's memory. A tensor
    already its storage's own size is itself, not a copy."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_meta:
            return obj
        return obj.clone() if obj.untyped_storage().nbytes() > obj.numel() * obj.element_size() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(compact(o) for o in obj)
    return obj
