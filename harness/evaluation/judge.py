"""What the trusted side's judge says of one output of the candidate's, in process and with no state of its own: its
structure against the reference's, then each tensor's figures (compare.figures); trial 0 against the determinism
re-run's; and how outputs that compute nothing compare, so that passing is known to prove something. Whatever the
output holds, the answer is figures: nothing the candidate handed over makes a failure of the judge's."""

from __future__ import annotations

from typing import Any

import torch

from harness.evaluation import compare, tensors, untrusted

NO_OUTPUT = "the candidate saved no output for this call"


def output(got: Any, exp: Any, gt: Any, device: torch.device, atol: float, rtol: float,
           step: int = compare.COMPARE_SLICE) -> dict[str, Any]:
    """The candidate's output (a copy the trusted side made) against the reference's `exp` and its float64 truth `gt`
    (None: the reference alone judges). What could not be read as an output (`file_error`, figures already) or is
    not made of plain dense tensors (`structure_error`) is the submission's."""
    exp_list = tensors.as_list(exp)
    assert exp_list is not None
    if isinstance(got, dict):  # the take's figures: there is no output to compare
        return got
    gt_list = tensors.as_list(gt) if gt is not None else [None] * len(exp_list)
    got_list = tensors.as_list(got)
    assert gt_list is not None
    if isinstance(exp, torch.Tensor) and not isinstance(got, torch.Tensor):
        return {"structure_error": f"expected a Tensor, got {tensors.describe(got)}"}
    if not isinstance(exp, torch.Tensor) and (got_list is None or isinstance(got, torch.Tensor)):
        return {"structure_error": f"expected {tensors.describe(exp)} tensors, got {tensors.describe(got)}"}
    assert got_list is not None
    if len(got_list) != len(exp_list):
        return {"structure_error": f"expected {len(exp_list)} outputs, got {len(got_list)}"}
    outputs = []
    for k, (g, e, t) in enumerate(zip(got_list, exp_list, gt_list, strict=True)):
        try:
            outputs.append(tensor_figures(k, g, e, t, device, atol, rtol, step))
        except torch.OutOfMemoryError:
            raise  # the judge's memory: the output's size is the reference's, checked before
        except Exception as err:  # a tensor that passed every check and still cannot be compared
            return {"structure_error": f"output {k} cannot be compared with the reference's "
                                       f"({type(err).__name__}: {untrusted.shown(str(err))})"}
    return {"outputs": outputs}


def tensor_figures(index: int, got: Any, exp: torch.Tensor, gt: torch.Tensor | None, device: torch.device,
                   atol: float, rtol: float, step: int = compare.COMPARE_SLICE) -> dict[str, Any]:
    """Output `index`: its type, shape and dtype beside the reference's, and where they match, its figures."""
    fig: dict[str, Any] = {
        "index": index, "got_type": type(got).__name__, "expected_shape": list(exp.shape),
        "expected_dtype": str(tensors.expected_dtype(exp)).removeprefix("torch."),
    }
    if type(got) is not torch.Tensor:
        return fig
    fig.update(got_shape=list(got.shape), got_dtype=str(got.dtype).removeprefix("torch."), got_device=device.type)
    if got.shape != exp.shape or got.dtype != tensors.expected_dtype(exp):
        return fig
    fig.update(compare.figures(got, exp, gt if isinstance(gt, torch.Tensor) else None, device, atol, rtol, step))
    return fig


def trivial_outputs(found: dict[str, dict[int, dict[str, Any]]], exp: Any, gt: Any, device: torch.device,
                    atol: float, rtol: float, step: int = compare.COMPARE_SLICE) -> None:
    """How outputs that compute nothing compare with the reference's on a trial: all zeros, one constant (the
    output's mean), each row's mean; the worst over the trials is kept in `found`. Where one passes at a
    tolerance, passing proves nothing there."""
    exps = tensors.as_list(exp) or []
    gts = (tensors.as_list(gt) or []) if gt is not None else [None] * len(exps)
    for k, (e, g) in enumerate(zip(exps, gts, strict=True)):
        if not (isinstance(e, torch.Tensor) and e.is_floating_point() and e.numel()):
            continue
        # Made one at a time (at a problem's own size each is gigabytes on the device beside the candidate's);
        # the constant ones are one number seen at every element, made whole a slice at a time by the comparison.
        trivial: list[tuple[str, Any]] = [
            ("zeros", lambda e=e: torch.zeros((), dtype=e.dtype, device=e.device).expand_as(e))]
        # The output's mean, and each row's, stand for the output only where it varies: a single number (a
        # loss) is its own mean, an output constant along its rows (a last dimension of 1, a broadcast) its
        # own row mean, and computing that is the work.
        if bool(e.amax() != e.amin()):
            trivial.append(("constant", lambda e=e: torch.full((), float(e.mean()), dtype=e.dtype,
                                                               device=e.device).expand_as(e)))
        if e.dim() and bool((e.amax(dim=-1) != e.amin(dim=-1)).any()):
            trivial.append(("row mean", lambda e=e: e.mean(dim=-1, keepdim=True).expand_as(e)))
        for kind, make in trivial:
            fig = tensor_figures(k, make(), e, g, device, atol, rtol, step)
            worst = found.setdefault(kind, {}).get(k)
            if worst is None or (fig.get("max_rel_err") or 0.0) > (worst.get("max_rel_err") or 0.0):
                found[kind][k] = fig


def determinism(first: Any, second: Any, trial0: dict[str, Any], device: torch.device,
                step: int = compare.COMPARE_SLICE) -> dict[str, Any] | None:
    """Trial 0's output against the determinism re-run's on the same inputs (both copies the trusted side made).
    Only where trial 0's output has the reference's structure, shapes and dtypes (`trial0`, its figures): else the
    trial fails already, and the re-run's tensors are held to those shapes, so no layout can make this comparison
    larger than the judge's."""
    shapes = [(o.get("expected_shape"), o.get("expected_dtype")) for o in trial0.get("outputs", [])]
    if not shapes or first is None or isinstance(first, dict) or any(
            (o.get("got_shape"), o.get("got_dtype")) != want for o, want in zip(trial0["outputs"], shapes,
                                                                                  strict=True)):
        return None
    if isinstance(second, dict) and second.get("structure_error") == NO_OUTPUT:
        return None
    la, lb = tensors.as_list(first), tensors.as_list(second) if not isinstance(second, dict) else None
    if la is None or lb is None or len(la) != len(shapes) or len(lb) != len(shapes) or not all(
        type(x) is torch.Tensor and type(y) is torch.Tensor and list(x.shape) == list(y.shape) == shape
        and x.dtype == y.dtype and not x.is_meta and not y.is_meta
        and str(x.dtype).removeprefix("torch.") == dtype
        for x, y, (shape, dtype) in zip(la, lb, shapes, strict=True)
    ):
        return {"bitwise_equal": False, "max_rel_diff": None}  # the re-run's output is not one
    equal = all(torch.equal(x, y) or (x.is_floating_point() and torch.equal(x.nan_to_num(), y.nan_to_num()))
                for x, y in zip(la, lb, strict=True))
    worst = torch.zeros((), dtype=torch.float64, device=device)  # read once: a wait per slice is not
    for x, y in zip(la, lb, strict=True):
        fx, fy = x.reshape(-1), y.reshape(-1)
        for start in range(0, fx.numel(), step):  # on the device, a slice at a time (compare.figures)
            xd = fx[start:start + step].to(device).to(torch.float64)
            yd = fy[start:start + step].to(device).to(torch.float64)
            worst = torch.maximum(worst, ((xd - yd).abs() / (1 + yd.abs())).nan_to_num(nan=float("inf")).max())
    return {"bitwise_equal": equal, "max_rel_diff": float(worst)}
