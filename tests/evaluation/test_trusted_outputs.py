"""The trusted side's expected outputs: kept from the prepare to the judge while they fit, computed again there
one trial at a time past that. In this process, on the CPU, with the module's own classes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from harness import grading
from harness.evaluation import compare, problem_module, tensors, trusted
from harness.evaluation.protocol import JudgeCommand, JudgeHandoversCommand, PrepareCommand, ProblemLoad
from harness.schema import OutputFigures, Tolerance
from tests.evaluation import exchange_play

_DROPOUT_LINEAR = """import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 32)
    def forward(self, x):
        return torch.nn.functional.dropout(self.linear(x), p=0.5, training=True)
def get_inputs():
    return [torch.rand(16, 64)]
def get_init_inputs():
    return []
"""


def _judge(tmp_path, keep_bytes: int, monkeypatch, candidate_outputs, ahead: tuple[float, float] | None = None):
    """Prepare and judge with KEEP_BYTES at `keep_bytes`; the candidate's outputs are `candidate_outputs(side, i)`.
    With `ahead` (atol, rtol) the prepare is told that tolerance, and its work after the reply runs before the
    candidate's outputs are written (as in a trusted process, while the candidate runs its trials)."""
    monkeypatch.setattr(trusted, "KEEP_BYTES", keep_bytes)
    problem = tmp_path / "problem.py"
    problem.write_text(_DROPOUT_LINEAR)
    side = trusted.Trusted()
    atol, rtol = ahead or (None, None)
    prepared = side.prepare(PrepareCommand(problem=ProblemLoad(path=problem), device="cpu", param_seed=42,
                                           draw_seed=7, input_seed=1234, trials=3,
                                           atol=atol, rtol=rtol))
    if side.after_reply is not None:
        side.after_reply()
    exchange_play.take_all(side, prepared, lambda i: candidate_outputs(side, i, prepared))
    return side, prepared, side.judge(JudgeCommand(atol=1e-4, rtol=1e-4))


def _reference(side, i, prepared):
    """What an honest candidate computes for trial i: the reference on the trial's inputs and forward seed."""
    inputs = side._trial_inputs(i)
    with torch.no_grad():
        torch.manual_seed(prepared["forward_seeds"][i])
        return side.model(*inputs)


@pytest.mark.parametrize("keep_bytes", [trusted.KEEP_BYTES, 0])
def test_expected_outputs_recomputed_at_the_judge_judge_as_the_kept_ones(tmp_path, monkeypatch, keep_bytes):
    """KernelBench's level1/41 at its own size: 7 trials of 3.2 GB outputs and their 6.4 GB float64 truths ran an
    H100 out of memory in the trusted process. Past KEEP_BYTES nothing is kept and each trial's is computed again
    at the judge, on the same inputs and forward seed (a stochastic reference too, here dropout): an honest
    candidate passes every trial exactly, and its error against float64 is measured, either way."""
    side, prepared, judged = _judge(tmp_path, keep_bytes, monkeypatch, _reference)
    assert prepared["stochastic"] and prepared["output_shapes"] == [[16, 32]]
    assert side.recompute == [keep_bytes == 0] * 4
    for t in judged["trials"]:
        (o,) = t["outputs"]
        assert o["max_abs_err"] == 0 and o["mismatches_at_eval_tolerance"] == 0, t
        assert o["err_vs_fp64"] is not None and o["err_vs_fp64"] < 1e-5
    assert judged["determinism"]["bitwise_equal"]
    kinds = {k["kind"] for k in judged["trivial"]}
    assert kinds == {"zeros", "constant", "row mean"}


@pytest.mark.parametrize("keep_bytes", [trusted.KEEP_BYTES, 0])
def test_outputs_that_compute_nothing_judged_ahead_compare_as_judged_at_the_judge(tmp_path, monkeypatch, keep_bytes):
    """Judged while the candidate runs its trials (the prepare told the tolerance), the trivial outputs' figures
    are those the judge makes itself; under another tolerance the judge makes them. Where expected outputs are made
    again at each trial's take (none kept), they are judged there, trial 0's at the judge. A candidate that returns
    zeros is judged at the judge, as before."""
    def zeros(side, i, prepared):
        return torch.zeros_like(_reference(side, i, prepared))

    def again_at_the_judge(side, tol=(1e-4, 1e-4)):  # the same outputs, nothing judged ahead
        side.trivial_judged = None
        return side.judge(JudgeCommand(atol=1e-4, rtol=1e-4))

    side, _, ahead = _judge(tmp_path, keep_bytes, monkeypatch, zeros, ahead=(1e-4, 1e-4))
    assert side.trivial_judged is not None
    if not keep_bytes:  # none kept: judged at each take (its expected output made there), trial 0 at the judge
        assert side.trivial_judged[1] == {1, 2}, side.trivial_judged
    assert ("trivial_ahead" in ahead["seconds"]) == (keep_bytes > 0), ahead["seconds"]
    plain = again_at_the_judge(side)
    assert "trivial_ahead" not in plain["seconds"]
    assert {k["kind"] for k in plain["trivial"]} == {"zeros", "constant", "row mean"}
    assert ahead["trivial"] == plain["trivial"]
    assert ahead["trials"] == plain["trials"] and ahead["trials"][0]["outputs"][0]["mismatches_at_eval_tolerance"]
    side, _, other = _judge(tmp_path, keep_bytes, monkeypatch, zeros, ahead=(1e-2, 1e-2))  # not the judge's
    assert "trivial_ahead" not in other["seconds"] and other["trivial"] == again_at_the_judge(side, (1e-2, 1e-2))[
        "trivial"]
    monkeypatch.setattr(trusted, "TRIVIAL_AHEAD_BYTES", 0)  # outputs too large to judge beside the candidate's
    (tmp_path / "large").mkdir()
    side, _, large = _judge(tmp_path / "large", keep_bytes, monkeypatch, zeros, ahead=(1e-4, 1e-4))
    assert (side.trivial_judged is None) == (keep_bytes > 0) and "trivial_ahead" not in large["seconds"]


@pytest.mark.parametrize("keep_bytes", [trusted.KEEP_BYTES, 0])
def test_recomputed_expected_outputs_still_catch_a_wrong_trial(tmp_path, monkeypatch, keep_bytes):
    def wrong_on_trial_2(side, i, prepared):
        out = _reference(side, i, prepared)
        return out + 1e-2 if i == 2 else out

    _, _, judged = _judge(tmp_path, keep_bytes, monkeypatch, wrong_on_trial_2)
    bad = [t["trial"] for t in judged["trials"] if t["outputs"][0]["mismatches_at_eval_tolerance"]]
    assert bad == [2]


def _whole_figures(got: torch.Tensor, exp: torch.Tensor, gt: torch.Tensor, atol: float, rtol: float) -> dict:
    """The figures computed over whole tensors at once, written independently of the sliced comparison."""
    a, b, g = got.double(), exp.double(), gt.double()
    finite = a.isfinite() & b.isfinite()
    bad = ~finite & ~((a.isnan() & b.isnan()) | (a.isinf() & (a == b)))
    diff = torch.where(finite, (a - b).abs(), 0.0)
    absb = torch.where(finite, b.abs(), 0.0)
    rel = (diff / (1 + absb)).reshape(-1)
    worst = int(rel.argmax())
    fig = {"numel": a.numel(), "nonfinite_mismatches": int(bad.sum()), "max_abs_err": float(diff.max()),
           "max_rel_err": float(rel[worst]), "worst_index": [int(i) for i in torch.unravel_index(torch.tensor(worst),
                                                                                                  a.shape)],
           "worst_got": float(a.reshape(-1)[worst]), "worst_expected": float(b.reshape(-1)[worst]),
           "mismatches_at_eval_tolerance": int(((diff > atol + rtol * absb) | bad).sum()),
           "min_atol_at_rtol": {f"{r:g}": float((diff - r * absb).clamp_min(0).max()) for r in compare.RTOL_GRID}}
    for key, x in (("err_vs_fp64", a), ("ref_err_vs_fp64", b)):
        ok = g.isfinite() & x.isfinite()
        d = torch.where(ok, (x - g).abs(), 0.0)
        fig[key] = float((d / (1 + torch.where(ok, g.abs(), 0.0))).max())
        fig[key.replace("err", "rel_l2")] = float(d.norm()) / float(torch.where(ok, g, 0.0).norm())
    # Within the tolerance of b or of g: element by element, the smaller error (g counts where it and a, b are finite).
    ok = g.isfinite() & finite
    dg = torch.where(ok, (a - g).abs(), float("inf"))
    absg = torch.where(ok, g.abs(), 0.0)
    fig["max_rel_err_or_fp64"] = float(torch.minimum(diff / (1 + absb), dg / (1 + absg)).max())
    fig["min_atol_at_rtol_or_fp64"] = {f"{r:g}": float(torch.minimum(diff - r * absb, dg - r * absg).clamp_min(0).max())
                                       for r in compare.RTOL_GRID}
    fig["fp64_only_at_eval_tolerance"] = int(((diff > atol + rtol * absb) & (dg <= atol + rtol * absg)).sum())
    return fig


@pytest.mark.parametrize("slice_elems", [1, 7, 64, compare.COMPARE_SLICE])
def test_a_comparison_in_slices_gives_the_figures_of_a_whole_one(slice_elems):
    """KernelBench's level1/41 at its own size: one 3.2 GB output compared whole in float64 made about ten 6.4 GB
    temporaries beside the candidate's 27.7 GB and ran the H100 out of memory in the judge. The comparison goes a
    slice at a time; its figures are those of the whole: the worst element (the first of equal ones, across slices),
    the counts, the maxima and the L2 ratios, with mismatched NaN/inf and matching ones."""
    gen = torch.Generator().manual_seed(3)
    exp = torch.randn(6, 5, 4, generator=gen)
    got = exp + 1e-3 * torch.randn(6, 5, 4, generator=gen)
    got[1, 2, 3] = exp[1, 2, 3] + 0.5  # the worst element, equalled later in another slice: the first one counts
    got[4, 0, 1] = exp[4, 0, 1] + 0.5
    exp[4, 0, 1] = exp[1, 2, 3]
    got[0, 0, 0], exp[0, 0, 0] = float("nan"), float("nan")  # matching NaNs
    got[2, 2, 2] = float("inf")  # a non-finite mismatch
    gt = exp.double() + 1e-7
    sliced = compare.figures(got, exp, gt, torch.device("cpu"), 1e-4, 1e-4, slice_elems)
    whole = _whole_figures(got, exp, gt, 1e-4, 1e-4)
    assert sliced["worst_index"] == [1, 2, 3] == whole["worst_index"]
    assert sliced["nonfinite_mismatches"] == 1 and sliced["mismatches_at_eval_tolerance"] > 2
    assert sliced.keys() == whole.keys()
    for key, value in whole.items():
        if key in ("min_atol_at_rtol", "min_atol_at_rtol_or_fp64"):
            assert sliced[key] == pytest.approx(value, rel=1e-12)
        else:
            assert sliced[key] == pytest.approx(value, rel=1e-9), key
    assert compare.figures(got, exp, None, torch.device("cpu"), 1e-4, 1e-4, slice_elems).keys() == \
        whole.keys() - {"err_vs_fp64", "ref_err_vs_fp64", "rel_l2_vs_fp64", "ref_rel_l2_vs_fp64",
                        "max_rel_err_or_fp64", "min_atol_at_rtol_or_fp64", "fp64_only_at_eval_tolerance"}


def test_hand_overs_read_now_and_compared_after_the_rounds_judge_as_compared_at_once(tmp_path):
    """A hand-over's bytes are read as soon as the candidate says it handed them over; with `defer` they are compared
    only once the timed rounds are over, beside the candidate's trace and exit. The figures are those of comparing at
    once, for an honest output and a wrong one, and what the candidate writes into the files after the read counts
    for nothing. Nothing deferred outlives the evaluation."""
    problem = tmp_path / "problem.py"
    problem.write_text(_DROPOUT_LINEAR)
    side = trusted.Trusted()
    side.prepare(PrepareCommand(problem=ProblemLoad(path=problem), device="cpu", param_seed=42, draw_seed=7,
                                input_seed=1234, trials=2))
    seeds, forward_seeds = [11, 12], [21, 22]
    outs = []
    with torch.no_grad():
        for seed, forward_seed, error in zip(seeds, forward_seeds, (0.0, 1e-2), strict=True):
            inputs = problem_module.seeded_inputs(side.module, seed, side.device)
            problem_module.manual_seed(forward_seed, side.device)
            outs.append(side.model(*inputs) + error)
    command = exchange_play.handover_command(side, outs, seeds, forward_seeds)
    at_once = side.check_handover(command)["checks"]
    assert at_once[0]["outputs"][0]["mismatches_at_eval_tolerance"] == 0
    assert at_once[1]["outputs"][0]["mismatches_at_eval_tolerance"] > 0
    assert side.check_handover(command.model_copy(update={"defer": True}))["checks"] == []
    seg = side.segments["handover"]  # rewritten after the hand-over: too late
    seg.write(0, torch.zeros(seg.nbytes, dtype=torch.uint8))
    assert side.judge_handovers(JudgeHandoversCommand(atol=1e-4, rtol=1e-4))["checks"] == at_once
    assert side.handed_over == []
    side.check_handover(command.model_copy(update={"defer": True}))
    side.release()
    assert side.handed_over == []


ROUNDED_OFFSET = Path(__file__).resolve().parents[1] / "fixtures" / "problems" / "level1" / "150_RoundedOffset.py"


def test_an_output_within_the_tolerance_of_the_float64_truth_passes_where_the_references_rounding_is_off(tmp_path):
    """The reference of level1/150 rounds its first column to about 1e-3 in fp32; its float64 truth is 2 * x. The
    exact output is outside the tolerance of the fp32 reference there and within it of the truth: within the
    tolerance, in the trials and in a hand-over alike (whose truth is made only when an element is outside the
    reference's tolerance). An output rounded coarser than the reference is within neither, and fails."""
    side = trusted.Trusted()
    prepared = side.prepare(PrepareCommand(problem=ProblemLoad(path=ROUNDED_OFFSET), device="cpu", param_seed=42,
                                           draw_seed=7, input_seed=1234, trials=2))
    tol = Tolerance(atol=1e-4, rtol=1e-4)

    def coarser(x):
        return torch.cat([(x[:, :1] + 1e5) - 1e5, x[:, 1:]], dim=1) * 2.0

    for name, forward, passes in (("exact", lambda x: x * 2.0, True), ("coarser", coarser, False)):
        exchange_play.take_all(side, prepared, lambda i, forward=forward: forward(*side._trial_inputs(i)))
        judged = side.judge(JudgeCommand(atol=1e-4, rtol=1e-4))
        for t in judged["trials"]:
            fig = OutputFigures.model_validate(t["outputs"][0])
            assert fig.mismatches_at_eval_tolerance and not grading.within_reference_tolerance(fig, tol)
            assert grading.within_tolerance(fig, tol) is passes, (name, fig)
            assert (fig.fp64_only_at_eval_tolerance == fig.mismatches_at_eval_tolerance) is passes
        seed, forward_seed = 11, 21
        handed = forward(*problem_module.seeded_inputs(side.module, seed, side.device))
        (check,) = side.check_handover(exchange_play.handover_command(side, [handed], [seed], [forward_seed]))[
            "checks"]
        fig = OutputFigures.model_validate(check["outputs"][0])
        assert fig.max_rel_err_or_fp64 is not None and fig.mismatches_at_eval_tolerance
        assert grading.within_tolerance(fig, tol) is passes, (name, fig)


_NONFINITE = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.log(x) + 1 / x.round()  # NaN where x < 0, inf where x rounds to 0
def get_inputs():
    return [torch.randn(37, 29)]
def get_init_inputs():
    return []
"""


def test_a_truth_made_on_the_host_and_compared_in_small_slices_judges_as_one_made_and_compared_whole(tmp_path,
                                                                                                   monkeypatch):
    """Where the memory plan moves the float64 truth to the host (memory_plan: the device cannot hold its forward),
    the judge compares it a small slice at a time: every figure is the one the whole-tensor path gives, for an output
    with errors, a NaN where the reference is finite and an inf of the wrong sign. There the truth is made only for
    an output outside the reference's tolerance (level1/19 at its own size on an H100 took 272 s, a host truth made
    for every trial three times over): an honest output's figures are the same without the float64 ones, and no
    trial's expected output is made a third time at the judge (trial 0's waits for it)."""
    from harness.evaluation import memory_plan

    problem = tmp_path / "problem.py"
    problem.write_text(_NONFINITE)
    plan = memory_plan.plan

    def judged(truth: str, slice_elems: int, outputs) -> dict:
        def planned(*args, **kwargs):
            return plan(*args, **kwargs).model_copy(update={"truth": truth, "compare_slice": slice_elems,
                                                            "trials_kept": 0 if truth == "host" else 6})
        monkeypatch.setattr(memory_plan, "plan", planned)
        made.clear()
        side = trusted.Trusted()
        prepared = side.prepare(PrepareCommand(problem=ProblemLoad(path=problem), device="cpu", param_seed=42,
                                               draw_seed=7, input_seed=99, trials=3))
        assert side.plan is not None and side.plan.truth == truth
        exchange_play.take_all(side, prepared, lambda i: outputs(side, i, prepared))
        return side.judge(JudgeCommand(atol=1e-4, rtol=1e-4))["trials"]

    def wrong(side, i, prepared):
        out = _reference(side, i, prepared).clone()
        flat = out.reshape(-1)
        finite = flat.isfinite().nonzero().reshape(-1)
        flat[finite[::5]] += 1e-2
        flat[finite[1]] = float("nan")
        flat[flat.isinf().nonzero().reshape(-1)[:1]] *= -1
        return out

    made: list[str] = []
    truth, forward = trusted.Trusted._truth, trusted.Trusted._trial_outputs

    def counted_truth(self, model64, inputs):
        made.append("truth")
        return truth(self, model64, inputs)

    def counted_forward(self, i, model64):
        made.append("expected")
        return forward(self, i, model64)

    monkeypatch.setattr(trusted.Trusted, "_truth", counted_truth)
    monkeypatch.setattr(trusted.Trusted, "_trial_outputs", counted_forward)
    fp64 = {"err_vs_fp64", "ref_err_vs_fp64", "rel_l2_vs_fp64", "ref_rel_l2_vs_fp64", "max_rel_err_or_fp64",
            "min_atol_at_rtol_or_fp64", "fp64_only_at_eval_tolerance"}
    def off(side, i, prepared):  # finite errors alone: the truth may say they are within its tolerance
        out = _reference(side, i, prepared).clone()
        flat = out.reshape(-1)
        flat[flat.isfinite().nonzero().reshape(-1)[::5]] += 1e-2
        return out

    for outputs in (_reference, wrong, off):
        whole, sliced = judged("device", compare.COMPARE_SLICE, outputs), judged("host", 7, outputs)
        # Each trial made once at its take, trial 0 again at the judge; host truths only where an output is outside
        # the reference's tolerance and the truth could change that (a non-finite mismatch fails whatever it says).
        assert made.count("expected") == 3 + 1 + 1, made  # three trials and the extra one, and trial 0 at the judge
        assert made.count("truth") == (4 if outputs is off else 0), made
        assert len(whole) == len(sliced)
        for a, b in zip(whole, sliced, strict=True):
            (fa,), (fb,) = a.pop("outputs"), b.pop("outputs")
            if outputs is not off:
                assert fb.keys() == fa.keys() - fp64 and fa.keys() & fp64
                fa = {k: v for k, v in fa.items() if k not in fp64}
            assert a == b and fa.keys() == fb.keys()
            for key, value in fa.items():
                if "l2" in key:  # sums of squares added a slice at a time: the last bit may differ
                    assert fb[key] == pytest.approx(value, rel=1e-12), key
                elif isinstance(value, float) and math.isnan(value):
                    assert math.isnan(fb[key]), key
                else:
                    assert fb[key] == value, key
        assert outputs is not off or fa["err_vs_fp64"] is not None
        assert (fa["nonfinite_mismatches"] > 0) == (outputs is wrong)


_HUBER = """import torch
class Model(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.smooth_l1_loss(predictions, targets)
def get_inputs():
    scale = torch.rand(())
    return [torch.rand(256, 256) * scale, torch.rand(256, 256)]
def get_init_inputs():
    return []
"""


def _storages(values) -> int:
    return tensors.held_bytes([t for v in values if v is not None for t in (tensors.as_list(v) or [])])


@pytest.mark.parametrize("keep_bytes", [trusted.KEEP_BYTES, 0])
def test_what_the_trusted_side_keeps_of_a_trial_is_what_the_plan_counts(tmp_path, monkeypatch, keep_bytes):
    """KernelBench's level1/96 (smooth_l1_loss, its mean a 0-dim tensor) on an H100: the 0-dim expected output kept
    the storage of the unreduced loss it was made from (4 GiB), its float64 truth 8 GiB, and six trials kept ran
    the prepare out of memory where the plan counted 12 bytes a trial. What is kept, and what a trial made again
    at the judge holds while it is judged, are copies of the elements: the plan's bytes. A plain output (Linear,
    dropout) is kept as it is."""
    monkeypatch.setattr(trusted, "KEEP_BYTES", keep_bytes)
    problem = tmp_path / "huber.py"
    problem.write_text(_HUBER)
    side = trusted.Trusted()
    prepared = side.prepare(PrepareCommand(problem=ProblemLoad(path=problem), device="cpu", param_seed=42,
                                           draw_seed=7, input_seed=1234, trials=3, extra_distribution=True))
    plan = prepared["memory_plan"]
    assert plan["output_held_bytes"] == 256 * 256 * 4  # as the forward returned it: the loss's storage
    assert plan["output_bytes"] == 4 and plan["truth_bytes"] == 8
    assert plan["trials_kept"] == (4 if keep_bytes else 0)
    assert _storages(side.expected + side.ground_truth) == plan["trials_kept"] * (4 + 8)
    model64 = side._model64()
    for i in range(4):
        exp, gt = side._trial_outputs(i, model64)
        assert _storages([exp, gt]) == 4 + 8
        # The copies are the forward's values.
        inputs = side._trial_inputs(i)
        torch.manual_seed(prepared["forward_seeds"][i])
        assert torch.equal(exp, side.model(*inputs)) and gt.dtype == torch.float64
    linear = torch.nn.Linear(4, 2)
    out = linear(torch.rand(3, 4))
    assert tensors.compact(out) is out and tensors.compact([out])[0] is out


def test_a_take_makes_the_expected_output_before_it_reads_the_candidates(tmp_path, monkeypatch):
    """level1/39 at its own size ran the trusted side out of device memory in its first take: the candidate's 8 GiB
    output was read first, then the trial's input and expected output were made beside it. With nothing kept, each
    take now makes the trial's expected output first (its input let go with it), then reads the candidate's; and
    trial 0's output waits for the determinism re-run's where the plan puts it (on the host, `_first_on_host`),
    brought back to the device for that comparison alone."""
    order: list[str] = []
    made, read = trusted.Trusted._trial_outputs, trusted.Trusted._take
    monkeypatch.setattr(trusted.Trusted, "_trial_outputs",
                        lambda self, i, m: order.append(f"made {i}") or made(self, i, m))
    monkeypatch.setattr(trusted.Trusted, "_take", lambda self, *a: order.append("read") or read(self, *a))
    moved: list[str] = []
    to_device = problem_module.to_device
    monkeypatch.setattr(trusted.problem_module, "to_device",
                        lambda obj, device: moved.append(device.type) or to_device(obj, device))
    monkeypatch.setattr(trusted.Trusted, "_first_on_host", lambda self: True)
    _, _, judged = _judge(tmp_path, 0, monkeypatch, _reference)
    takes = [e for e in order if e == "read" or e.startswith("made")]
    # Trials 0-2 and the extra distribution's trial 3, each made then read; the determinism re-run is only read.
    assert takes[:9] == ["made 0", "read", "made 1", "read", "made 2", "read", "made 3", "read", "read"], order
    assert judged["determinism"]["bitwise_equal"]
    assert "cpu" in moved  # trial 0's output went to the host's memory and came back for the re-run's comparison
