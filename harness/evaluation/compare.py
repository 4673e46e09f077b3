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
    float64 on `device`, a slice of the flattened tensors at a time: the same figures as comparing them whole.

    The running figures stay on the device and are read once at the end: read after every slice (a dozen reads, each a
    wait for the device), a 6 GiB output in slices of 2**20 elements waited some 70,000 times."""
    n = exp.numel()
    fig: dict[str, Any] = {"numel": n, "nonfinite_mismatches": 0}
    if n == 0:
        return fig
    flat_got, flat_exp = got.reshape(-1), exp.reshape(-1)
    flat_gt = gt.reshape(-1) if gt is not None else None
    f64 = {"dtype": torch.float64, "device": device}
    zero = torch.zeros((), **f64)
    inf = torch.full((), float("inf"), **f64)
    counts = torch.zeros(3, dtype=torch.int64, device=device)  # non-finite mismatches, mismatches, fp64-only
    # max abs, worst rel, its got and expected values, its index (exact in float64 below 2**53 elements)
    worst = torch.tensor([-1.0, -1.0, 0.0, 0.0, 0.0], **f64)
    min_atol = torch.zeros(len(RTOL_GRID), **f64)
    min_atol_or = torch.zeros(len(RTOL_GRID), **f64)
    # err_vs_fp64, ref_err_vs_fp64, worst rel to the nearer; sums of squares: err, ref err, norm, norm (ref)
    near = torch.zeros(3, **f64)
    sq = torch.zeros(4, **f64)
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
        counts[0] += bad.sum()
        counts[1] += ((diff > atol + rtol * absb) | bad).sum()
        k = rel.argmax().reshape(1)
        rel_k = rel.index_select(0, k)[0]
        # Strictly: the first worst element, as argmax over the whole would give.
        better = rel_k > worst[1]
        worst[0] = torch.maximum(worst[0], diff.max())
        worst[1:] = torch.where(better, torch.stack([rel_k, a.index_select(0, k)[0], b.index_select(0, k)[0],
                                                     (k[0] + start).to(torch.float64)]), worst[1:])
        for i, r in enumerate(RTOL_GRID):
            min_atol[i] = torch.maximum(min_atol[i], (diff - r * absb).clamp_min(0).max())
        if flat_gt is None:
            continue
        g = flat_gt[start:start + slice_elems].to(device).to(torch.float64)
        gfin = torch.isfinite(g)
        for j, x in enumerate((a, b)):
            ok = gfin & torch.isfinite(x)
            d = torch.where(ok, (x - g).abs(), zero)
            near[j] = torch.maximum(near[j], (d / (1 + torch.where(ok, g.abs(), zero))).max())
            sq[j] += d.square().sum()
            sq[2 + j] += torch.where(ok, g, zero).square().sum()
        # Within the tolerance of the reference or of the truth: each element's smaller error. Where the truth is
        # not finite, or the element is not (a non-finite mismatch fails apart), only the reference counts.
        ok = gfin & finite
        dg = torch.where(ok, (a - g).abs(), inf)
        absg = torch.where(ok, g.abs(), zero)
        near[2] = torch.maximum(near[2], torch.minimum(rel, dg / (1 + absg)).max())
        for i, r in enumerate(RTOL_GRID):
            min_atol_or[i] = torch.maximum(min_atol_or[i], torch.minimum(diff - r * absb, dg - r * absg)
                                           .clamp_min(0).max())
        counts[2] += ((diff > atol + rtol * absb) & (dg <= atol + rtol * absg)).sum()
    (bad_nonfinite, mismatches, fp64_only), (max_abs, worst_rel, worst_got, worst_exp, worst_at) = (
        counts.tolist(), worst.tolist())
    fig.update(
        nonfinite_mismatches=bad_nonfinite, max_abs_err=max_abs, max_rel_err=worst_rel,
        min_atol_at_rtol={f"{r:g}": v for r, v in zip(RTOL_GRID, min_atol.tolist(), strict=True)},
        worst_index=[int(x) for x in torch.unravel_index(torch.tensor(int(worst_at)), exp.shape)],
        worst_got=worst_got, worst_expected=worst_exp, mismatches_at_eval_tolerance=mismatches,
    )
    if flat_gt is None:  # no float64 ground truth for this reference: the precision figures stay empty
        return fig
    err, ref_err, worst_rel_or = near.tolist()
    sq_err, sq_ref, norm, norm_ref = sq.tolist()
    for key, e, s2, nn in (("err_vs_fp64", err, sq_err, norm), ("ref_err_vs_fp64", ref_err, sq_ref, norm_ref)):
        fig[key] = e
        fig[key.replace("err", "rel_l2")] = s2 ** 0.5 / nn ** 0.5 if nn > 0 else None
    fig.update(max_rel_err_or_fp64=worst_rel_or,
               min_atol_at_rtol_or_fp64={f"{r:g}": v for r, v in zip(RTOL_GRID, min_atol_or.tolist(), strict=True)},
               fp64_only_at_eval_tolerance=fp64_only)
    return fig
