"""The trusted side's comparisons, element by element: an output against the reference's and its float64 truth (the
reference run in float64 on the same inputs), in float64 on the device, a slice at a time. The figures let any
tolerance be re-graded (grading.within_tolerance); nothing here decides a verdict."""

from __future__ import annotations

import copy
import sys
from typing import Any, NamedTuple

import torch

from harness.schema import RTOL_GRID


def unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """A flat (row-major) index as one index per dimension, in plain Python. torch.unravel_index checks its
    arguments through torch._check, whose first call imports sympy: 0.7-2 s of a cold trusted process's first judge."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return index[::-1]


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


# Elements compared at once: the comparison works in float64 with about twelve temporaries of a slice's size, the
# outputs' float64 copies among them (memory_plan counts fourteen), so a slice of 2**26 elements needs about 6 GiB
# beside the outputs (a 3.2 GB output compared whole needed 64 GB).
COMPARE_SLICE = 1 << 26


def figures(got: torch.Tensor, exp: torch.Tensor, gt: torch.Tensor | None, device: torch.device,
            atol: float, rtol: float, slice_elems: int = COMPARE_SLICE) -> dict[str, Any]:
    """Element-by-element figures of `got` against `exp` (and the float64 ground truth `gt`, where there is one), in
    float64 on `device`, a slice of the flattened tensors at a time: the same figures as comparing them whole.

    The running figures stay on the device and are read once at the end: read after every slice (a dozen reads, each a
    wait for the device), a 6 GiB output in slices of 2**20 elements waited some 70,000 times. One read a slice is
    left, whether all its elements are finite: where they are, the masks that keep the finite ones would keep them all
    and are not made. Either way the figures are those of the masked comparison to the bit: each element goes through
    the same float64 operations (a product rounded, then a difference, never one fused step), and a maximum clamped at
    zero is the maximum of the clamped. At KernelBench's level1/19 (1.6G elements) an H200 took 19 s over 6 trials'
    comparisons, some 145 passes over each slice with the truth; a finite slice now takes 75, most of them the rtol
    grid's (for each rtol a product, a difference and a max, and again against the truth)."""
    n = exp.numel()
    fig: dict[str, Any] = {"numel": n, "nonfinite_mismatches": 0}
    if n == 0:
        return fig
    flat_got, flat_exp = got.reshape(-1), exp.reshape(-1)
    flat_gt = gt.reshape(-1) if gt is not None else None
    f64 = {"dtype": torch.float64, "device": device}
    zero, inf = torch.zeros((), **f64), torch.full((), float("inf"), **f64)
    no_count = torch.zeros((), dtype=torch.int64, device=device)
    counts = torch.zeros(3, dtype=torch.int64, device=device)  # non-finite mismatches, mismatches, fp64-only
    # worst rel, its got and expected values, its index (exact in float64 below 2**53 elements)
    worst = torch.tensor([-1.0, 0.0, 0.0, 0.0], **f64)
    peaks = torch.zeros(1 + len(RTOL_GRID), **f64)  # max abs; min atol at each rtol
    # err_vs_fp64, ref_err_vs_fp64, worst rel to the nearer; min atol at each rtol to the nearer
    peaks_gt = torch.zeros(3 + len(RTOL_GRID), **f64)
    sq = torch.zeros(4, **f64)  # sums of squares: err, ref err, norm, norm (ref)
    for start in range(0, n, slice_elems):
        a, b = _to_device(flat_got, start, slice_elems, device), _to_device(flat_exp, start, slice_elems, device)
        g = _to_device(flat_gt, start, slice_elems, device) if flat_gt is not None else None
        diff, absb = a - b, b.abs()
        dg = a - g if g is not None else None
        # A sum is finite only where every element is (finite ones whose sum overflows take the masked path, to the
        # same figures), and a - b only where a and b are.
        total = diff.sum() if dg is None else diff.sum() + dg.sum()
        diff.abs_()
        masks = None if bool(total.isfinite()) else _Masks.of(a, b, g)
        if masks is not None:
            torch.where(masks.finite, diff, zero, out=diff)
            torch.where(masks.finite, absb, zero, out=absb)
        scratch = torch.mul(absb, rtol).add_(atol)
        over = diff > scratch  # beyond atol + rtol * |b|
        rel = torch.div(diff, torch.add(absb, 1, out=scratch), out=scratch)
        k = rel.argmax().reshape(1)
        found = torch.cat([rel.index_select(0, k), a.index_select(0, k), b.index_select(0, k),
                           (k + start).to(torch.float64)])
        # Strictly: the first worst element, as argmax over the whole would give.
        worst = torch.where(found[:1] > worst[:1], found, worst)
        max_abs = diff.max()
        bad, mismatches = (masks.bad.sum(), (over | masks.bad).sum()) if masks is not None else (no_count, over.sum())
        if dg is None:
            counts += torch.stack([bad, mismatches, no_count])
            peaks = torch.maximum(peaks, torch.stack([max_abs, *_rtol_peaks(diff, absb, max_abs)[0]]).clamp_min_(0))
            continue
        assert g is not None
        dg.abs_()
        truth = _Truth.finite(b, g, dg, rel) if masks is None else _Truth.masked(b, g, dg, rel, masks, zero, inf)
        del rel
        # Within the tolerance of the reference or of the truth: each element's smaller error. Where the truth is
        # not finite, or the element is not (a non-finite mismatch fails apart), only the reference counts.
        fp64_only = (over & (truth.dg <= torch.mul(truth.absg, rtol).add_(atol))).sum()
        counts += torch.stack([bad, mismatches, fp64_only])
        ref_peaks, either_peaks = _rtol_peaks(diff, absb, max_abs, truth.dg, truth.absg)
        peaks = torch.maximum(peaks, torch.stack([max_abs, *ref_peaks]).clamp_min_(0))
        peaks_gt = torch.maximum(peaks_gt, torch.stack([*truth.near, *either_peaks]).clamp_min_(0))
        sq += torch.stack(truth.squares)
    bad_nonfinite, mismatches, fp64_only = counts.tolist()
    worst_rel, worst_got, worst_exp, worst_at = worst.tolist()
    max_abs, *min_atol = peaks.tolist()
    fig.update(
        nonfinite_mismatches=bad_nonfinite, max_abs_err=max_abs, max_rel_err=worst_rel,
        min_atol_at_rtol={f"{r:g}": v for r, v in zip(RTOL_GRID, min_atol, strict=True)},
        worst_index=unravel(int(worst_at), tuple(exp.shape)),
        worst_got=worst_got, worst_expected=worst_exp, mismatches_at_eval_tolerance=mismatches,
    )
    if flat_gt is None:  # no float64 ground truth for this reference: the precision figures stay empty
        return fig
    err, ref_err, worst_rel_or, *min_atol_or = peaks_gt.tolist()
    sq_err, sq_ref, norm, norm_ref = sq.tolist()
    for key, e, s2, nn in (("err_vs_fp64", err, sq_err, norm), ("ref_err_vs_fp64", ref_err, sq_ref, norm_ref)):
        fig[key] = e
        fig[key.replace("err", "rel_l2")] = s2 ** 0.5 / nn ** 0.5 if nn > 0 else None
    fig.update(max_rel_err_or_fp64=worst_rel_or,
               min_atol_at_rtol_or_fp64={f"{r:g}": v for r, v in zip(RTOL_GRID, min_atol_or, strict=True)},
               fp64_only_at_eval_tolerance=fp64_only)
    return fig


def _to_device(flat: torch.Tensor, start: int, count: int, device: torch.device) -> torch.Tensor:
    """A slice, to the device as it is, then to float64 there (a blocking copy with a cast converts on the host).
    Where it is float64 on the device already, the slice is the tensor's own memory: nothing writes to it."""
    return flat[start:start + count].to(device).to(torch.float64)


class _Masks(NamedTuple):
    """A slice with non-finite elements: where got and expected are both finite, the non-finite mismatches, and
    where the truth is finite with got, with expected, and with both."""

    finite: torch.Tensor
    bad: torch.Tensor
    truth: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None

    @classmethod
    def of(cls, a: torch.Tensor, b: torch.Tensor, g: torch.Tensor | None) -> _Masks:
        fin_a, fin_b = a.isfinite(), b.isfinite()
        finite = fin_a & fin_b
        bad = ~finite & ~((a.isnan() & b.isnan()) | (a.isinf() & (a == b)))
        if g is None:
            return cls(finite, bad, None)
        fin_g = g.isfinite()
        return cls(finite, bad, (fin_g & fin_a, fin_g & fin_b, fin_g & finite))


class _Truth(NamedTuple):
    """A slice against its truth: got's and expected's worst relative errors and each element's smaller of got's
    to expected and to the truth (`near`); |a - g| and |g| where all three are finite, else inf and 0 (`dg`,
    `absg`); the sums of squares: err, ref err, norm, norm (ref)."""

    near: list[torch.Tensor]
    dg: torch.Tensor
    absg: torch.Tensor
    squares: list[torch.Tensor]

    @classmethod
    def finite(cls, b: torch.Tensor, g: torch.Tensor, dg: torch.Tensor, rel: torch.Tensor) -> _Truth:
        """Every element finite: one |g| and one 1 + |g| serve all, and got's error to the truth is `dg`."""
        absg = g.abs()
        den = absg + 1
        rel_got = dg / den
        near_got = rel_got.max()
        near_either = torch.minimum(rel, rel_got, out=rel_got).max()
        del rel_got
        d_exp = (b - g).abs_()
        near_exp = torch.div(d_exp, den, out=den).max()
        del den
        norm = g.square().sum()
        squares = [dg.square().sum(), d_exp.square_().sum(), norm, norm]
        return cls([near_got, near_exp, near_either], dg, absg, squares)

    @classmethod
    def masked(cls, b: torch.Tensor, g: torch.Tensor, dg: torch.Tensor, rel: torch.Tensor, masks: _Masks,
               zero: torch.Tensor, inf: torch.Tensor) -> _Truth:
        """Some element not finite: each figure over the elements where its operands are."""
        assert masks.truth is not None
        ok_got, ok_exp, ok = masks.truth
        absg = g.abs()
        (near_got, err, norm), (near_exp, ref_err, norm_ref) = (
            _kept(dg, ok_got, g, absg, zero), _kept((b - g).abs_(), ok_exp, g, absg, zero))
        torch.where(ok, dg, inf, out=dg)
        torch.where(ok, absg, zero, out=absg)
        rel_or = absg + 1
        near_either = torch.minimum(rel, torch.div(dg, rel_or, out=rel_or), out=rel_or).max()
        del rel_or
        return cls([near_got, near_exp, near_either], dg, absg, [err, ref_err, norm, norm_ref])


def _kept(d: torch.Tensor, kept: torch.Tensor, g: torch.Tensor, absg: torch.Tensor,
          zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An output's error to the truth `d` (|x - g|) over the elements `kept`: its worst relative error, its sum of
    squares and the truth's."""
    d = torch.where(kept, d, zero)
    den = torch.where(kept, absg, zero).add_(1)
    near = torch.div(d, den, out=den).max()
    del den
    return near, d.square_().sum(), torch.where(kept, g, zero).square_().sum()


def _rtol_peaks(diff: torch.Tensor, absb: torch.Tensor, max_abs: torch.Tensor, dg: torch.Tensor | None = None,
                absg: torch.Tensor | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The slice's max(diff - rtol * absb) at each rtol of the grid (`max_abs`, diff's max, at rtol 0), and with the
    truth the max of each element's smaller of that and dg - rtol * absg; not yet clamped at zero."""
    x = torch.empty_like(diff)
    y = torch.empty_like(diff) if dg is not None else None
    ref, either = [], []
    for r in RTOL_GRID:
        if r == 0:  # diff - 0 * absb is diff, exactly (absb is finite)
            ref.append(max_abs)
            if dg is not None and y is not None:
                either.append(torch.minimum(diff, dg, out=y).max())
            continue
        ref.append(torch.sub(diff, torch.mul(absb, r, out=x), out=x).max())
        if dg is not None and absg is not None and y is not None:
            torch.sub(dg, torch.mul(absg, r, out=y), out=y)
            either.append(torch.minimum(x, y, out=y).max())
    return ref, either
