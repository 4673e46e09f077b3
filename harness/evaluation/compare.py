"""The trusted side's comparisons, element by element: an output against the reference's and its float64 truth (the
reference run in float64 on the same inputs), in float64 on the device, a slice at a time. The figures let any
tolerance be re-graded (grading.within_tolerance); nothing here decides a verdict."""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch

from harness.schema import RTOL_GRID


def to_float64(obj: Any) -> Any:
    """Floating-point tensors, alone or in lists and tuples, as float64; anything else as it is."""
    if isinstance(obj, torch.Tensor) and obj.is_floating_point():
        return obj.double()
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_float64(o) for o in obj)
    return obj


def float64_copy(model: torch.nn.Module) -> torch.nn.Module | None:
    """The reference in float64, for the ground truth; None where it cannot be made (a layer held in a lambda)."""
    try:
        return copy.deepcopy(model).double()
    except Exception as e:  # without a truth nothing fails: the reference alone judges, as before it was drawn
        print(f"[trusted] no float64 ground truth: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None


def float64_forward(model64: torch.nn.Module | None, inputs: list[Any]) -> Any:
    """The float64 reference's output, or None where its forward makes float32 tensors of its own and fails."""
    if model64 is None:
        return None
    try:
        return model64(*to_float64(inputs))
    except Exception as e:
        print(f"[trusted] no float64 ground truth: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return None


def outside_tolerance(check: dict[str, Any]) -> bool:
    """Whether a judged output has finite elements outside the tolerance of the reference."""
    return any(o.get("mismatches_at_eval_tolerance") and not o.get("nonfinite_mismatches")
               for o in check.get("outputs", []))


# Elements compared at once: the comparison works in float64 with about fourteen temporaries of a slice's size, so
# a slice of 2**26 elements needs about 7 GiB beside the outputs (a 3.2 GB output compared whole needed 64 GB).
COMPARE_SLICE = 1 << 26


def figures(got: torch.Tensor, exp: torch.Tensor, gt: torch.Tensor | None, device: torch.device,
            atol: float, rtol: float, slice_elems: int = COMPARE_SLICE) -> dict[str, Any]:
    """Element-by-element figures of `got` against `exp` (and the float64 ground truth `gt`, where there is one), in
    float64 on `device`, a slice of the flattened tensors at a time: the same figures as comparing them whole."""
    n = exp.numel()
    fig: dict[str, Any] = {"numel": n, "nonfinite_mismatches": 0}
    if n == 0:
        return fig
    flat_got, flat_exp = got.reshape(-1), exp.reshape(-1)
    flat_gt = gt.reshape(-1) if gt is not None else None
    zero = torch.zeros((), dtype=torch.float64, device=device)
    bad_nonfinite = mismatches = 0
    max_abs = worst_rel = -1.0
    worst, worst_got, worst_exp = 0, 0.0, 0.0
    min_atol = dict.fromkeys(RTOL_GRID, 0.0)
    err = {"err_vs_fp64": 0.0, "ref_err_vs_fp64": 0.0}
    sq = dict.fromkeys(("err_vs_fp64", "ref_err_vs_fp64", "norm_err_vs_fp64", "norm_ref_err_vs_fp64"), 0.0)
    inf = torch.full((), float("inf"), dtype=torch.float64, device=device)
    worst_rel_or, min_atol_or, fp64_only = 0.0, dict.fromkeys(RTOL_GRID, 0.0), 0
    for start in range(0, n, slice_elems):
        # To the device as they are, then to float64 there (a blocking copy with a cast converts on the host).
        a = flat_got[start:start + slice_elems].to(device).to(torch.float64)
        b = flat_exp[start:start + slice_elems].to(device).to(torch.float64)
        finite = torch.isfinite(a) & torch.isfinite(b)
        same_nonfinite = (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & (a == b))
        bad = ~finite & ~same_nonfinite
        diff = torch.where(finite, (a - b).abs(), zero)
        absb = torch.where(finite, b.abs(), zero)
        rel = diff / (1 + absb)
        bad_nonfinite += int(bad.sum())
        mismatches += int(((diff > atol + rtol * absb) | bad).sum())
        max_abs = max(max_abs, float(diff.max()))
        k = int(rel.argmax())
        if float(rel[k]) > worst_rel:  # strictly: the first worst element, as argmax over the whole would give
            worst_rel, worst, worst_got, worst_exp = float(rel[k]), start + k, float(a[k]), float(b[k])
        for r in RTOL_GRID:
            min_atol[r] = max(min_atol[r], float((diff - r * absb).clamp_min(0).max()))
        if flat_gt is None:
            continue
        g = flat_gt[start:start + slice_elems].to(device).to(torch.float64)
        gfin = torch.isfinite(g)
        for key, x in (("err_vs_fp64", a), ("ref_err_vs_fp64", b)):
            ok = gfin & torch.isfinite(x)
            d = torch.where(ok, (x - g).abs(), zero)
            err[key] = max(err[key], float((d / (1 + torch.where(ok, g.abs(), zero))).max()))
            sq[key] += float(d.square().sum())
            sq[f"norm_{key}"] += float(torch.where(ok, g, zero).square().sum())
        # Within the tolerance of the reference or of the truth: each element's smaller error. Where the truth is
        # not finite, or the element is not (a non-finite mismatch fails apart), only the reference counts.
        ok = gfin & finite
        dg = torch.where(ok, (a - g).abs(), inf)
        absg = torch.where(ok, g.abs(), zero)
        worst_rel_or = max(worst_rel_or, float(torch.minimum(rel, dg / (1 + absg)).max()))
        for r in RTOL_GRID:
            need = torch.minimum(diff - r * absb, dg - r * absg)
            min_atol_or[r] = max(min_atol_or[r], float(need.clamp_min(0).max()))
        fp64_only += int(((diff > atol + rtol * absb) & (dg <= atol + rtol * absg)).sum())
    fig.update(
        nonfinite_mismatches=bad_nonfinite, max_abs_err=max_abs, max_rel_err=worst_rel,
        min_atol_at_rtol={f"{r:g}": v for r, v in min_atol.items()},
        worst_index=[int(x) for x in torch.unravel_index(torch.tensor(worst), exp.shape)],
        worst_got=worst_got, worst_expected=worst_exp, mismatches_at_eval_tolerance=mismatches,
    )
    if flat_gt is None:  # no float64 ground truth for this reference: the precision figures stay empty
        return fig
    for key in ("err_vs_fp64", "ref_err_vs_fp64"):
        norm = sq[f"norm_{key}"] ** 0.5
        fig[key] = err[key]
        fig[key.replace("err", "rel_l2")] = sq[key] ** 0.5 / norm if norm > 0 else None
    fig.update(max_rel_err_or_fp64=worst_rel_or, min_atol_at_rtol_or_fp64={f"{r:g}": v for r, v in min_atol_or.items()},
               fp64_only_at_eval_tolerance=fp64_only)
    return fig
