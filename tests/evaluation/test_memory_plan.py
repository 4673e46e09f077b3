"""The memory plan (harness/evaluation/memory_plan.py): arithmetic only, no device. What fits, what is shrunk first,
what is too large and the figures it says; and where level1/96 and level1/23's memory goes at their own sizes."""

from __future__ import annotations

import ast
from pathlib import Path

from harness.evaluation import memory_plan as mp
from harness.evaluation import windows

GIB, MIB = 1 << 30, 1 << 20
FIXTURES = Path(__file__).parent.parent / "fixtures" / "kernelbench"


def _footprint(inputs: list[tuple[int, str]], outputs: list[tuple[int, str]], work: int, trials: int = 6,
               parameters: list[tuple[int, str]] | None = None, device: str = "cuda",
               **exchange: object) -> mp.Footprint:
    params = parameters or []
    io = mp.tensor_bytes(inputs) + mp.tensor_bytes(outputs)
    return mp.Footprint(inputs=mp.tensor_bytes(inputs), inputs_f64=mp.float64_bytes(inputs),
                        outputs=mp.tensor_bytes(outputs), outputs_f64=mp.float64_bytes(outputs),
                        parameters=mp.tensor_bytes(params), parameters_f64=mp.float64_bytes(params),
                        forward_work=work, trials=trials, calls_wanted=windows.most_calls(io, device),
                        keep_bytes=8 << 30, compare_slice=1 << 26, fingerprint_chunk=256 * MIB,
                        device=device, **exchange)  # type: ignore[arg-type]


# One call of 4 MiB in and out (KernelBench's ReLU at batch 256), its float64 copies twice that.
RELU = _footprint([(1 << 20, "float32")], [(1 << 20, "float32")], work=4 * MIB, device="cpu")


def test_a_problem_that_fits_keeps_everything_and_says_its_figures():
    plan = mp.plan(RELU, free=80 * GIB, total=80 * GIB, budget_setting=None, reserve=2 * GIB)
    assert plan.fits and plan.shrunk == []
    assert (plan.trials_kept, plan.truth, plan.calls_per_window) == (6, "device", 128)
    assert plan.needs_bytes == mp.needs(RELU, mp.Choice(6, "device", 128), 80 * GIB, 2 * GIB)[0] <= 80 * GIB
    assert plan.message.startswith("fits: needs ") and "has 80.00 GiB" in plan.message
    # On the host with no budget set nothing bounds it: it fits, with its figures.
    host = mp.plan(RELU, free=None, total=None, budget_setting=None, reserve=0)
    assert host.fits and host.budget_bytes is None and host.needs_bytes > 0


# An output four times its input (1 GiB a call, 2 GiB in float64): the trusted side's truth and comparison weigh most.
WIDE = _footprint([(1 << 26, "float32")], [(1 << 28, "float32")], work=1 * GIB)


def test_the_harness_shrinks_what_it_keeps_in_order_before_anything_else():
    """Trials kept first (down to none), then the truth to the host, then trial 0's output to the host, then calls per
    window: each step only where the one before did not make it fit."""
    def at(budget: int):
        return mp.plan(WIDE, free=budget, total=80 * GIB, budget_setting=None, reserve=0)

    assert (mp.plan(WIDE, free=80 * GIB, total=80 * GIB, budget_setting=None, reserve=0).trials_kept,
            WIDE.calls_wanted) == (2, 3)  # 3 GiB a trial kept, within 8 GiB
    full = mp.needs(WIDE, mp.Choice(2, "device", 3), None, 0)[0]
    kept_1 = at(full - 1)  # one trial fewer is enough: nothing else shrinks
    assert kept_1.fits and (kept_1.trials_kept, kept_1.truth, kept_1.calls_per_window) == (1, "device", 3)
    assert kept_1.shrunk == ["trials kept from the prepare to the judge 2 -> 1 (the others made again at the judge, "
                             "one at a time)"]
    none_kept = mp.needs(WIDE, mp.Choice(0, "device", 3), None, 0)[0]
    host = at(none_kept - 1)  # no trial kept is not enough: the truth moves to the host
    assert host.fits and (host.trials_kept, host.truth, host.calls_per_window) == (0, "host", 3)
    assert host.compare_slice == WIDE.compare_slice and len(host.shrunk) == 2  # the widest slice fits still
    assert host.first_output == "device"
    two = mp.needs(WIDE, mp.Choice(0, "host", 2, first_on_host=True), None, 0)[0]
    calls = at(two)  # then trial 0's output to the host (here its timed windows weigh more), then calls per window
    assert calls.fits and (calls.trials_kept, calls.truth, calls.first_output, calls.calls_per_window) == \
        (0, "host", "host", 2)
    assert [s.split(" ")[0] for s in calls.shrunk] == ["trials", "float64", "trial", "calls"]
    assert calls.shrunk[2] == "trial 0's output kept on the host for the determinism re-run, instead of on the device"
    assert calls.shrunk[3] == "calls per timed window 3 -> 2"
    assert calls.host_needs_bytes == mp.host_needs(WIDE, mp.Choice(0, "host", 2)) + WIDE.outputs
    assert calls.needs_bytes == two < none_kept < full


def test_a_problem_too_large_says_what_it_needs_what_there_is_and_what_was_shrunk():
    least = mp.needs(RELU, mp.Choice(0, "host", 1), None, 0)[0]
    plan = mp.plan(RELU, free=80 * GIB, total=80 * GIB, budget_setting=least - MIB, reserve=0)
    assert not plan.fits and plan.needs_bytes == least
    assert (plan.trials_kept, plan.truth, plan.calls_per_window) == (0, "host", 1)
    assert plan.message.startswith(f"too large for this device's memory: needs {least / GIB:.2f} GiB")
    assert f"has {(least - MIB) / GIB:.2f} GiB (80.00 GiB free of 80.00 GiB), capped at" in plan.message
    assert "HARNESS_DEVICE_MEMORY_BUDGET_MB; already shrunk: trials kept" in plan.message
    assert "calls per timed window 128 -> 1" in plan.message and "inputs are 0.00 GiB" in plan.message
    # Exactly the least it needs: it fits.
    assert mp.plan(RELU, free=80 * GIB, total=80 * GIB, budget_setting=least, reserve=0).fits


def test_a_reference_and_one_candidate_copy_that_fit_are_evaluated():
    """What the shrunk plan needs is the reference's call and the candidate's (its inputs, their copy, output and
    snapshot), and the harness's comparison slice: nothing that grows with the trials or the windows."""
    big = _footprint([(1 << 30, "float32")], [(1 << 30, "float32")], work=4 * GIB, trials=6)
    least = mp.needs(big, mp.Choice(0, "host", 1), None, 0)[0]
    reference = big.inputs + big.forward_work  # its output is in its working memory
    candidate = 2 * big.inputs + big.forward_work + big.outputs
    slack = 2 * big.outputs + mp.SMALL_COMPARE_SLICE * mp.COMPARE_BYTES_PER_ELEMENT  # the judge's, beside the call
    assert least <= reference + slack + candidate
    assert mp.plan(big, free=least, total=80 * GIB, budget_setting=None, reserve=0).fits


def _constants(path: Path) -> dict[str, object]:
    tree = ast.parse(path.read_text())
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


# Free memory as parameters: an H100 80GB (79.6 GiB in all) and an H200 141GB (140.4 GiB), each with its two
# processes' contexts made.
H100 = (79 * GIB, int(79.6 * GIB))
H200 = (139 * GIB, int(140.4 * GIB))


def test_level1_96_huber_loss_at_its_own_size():
    """KernelBench's level1/96 (smooth_l1_loss of two (32768, 32768) float32 tensors, its file's batch_size and
    input_shape): 8 GiB of inputs a call, a 4-byte output. On an H200 the trusted side ran out of memory with 136.71
    GiB in use: the prepare's calibration window made 20 calls' inputs at once (160 GiB). The plan holds it to the
    calls a window may hold (one), and the evaluation fits both cards, truth on the device."""
    n = 32768 * 32768
    inputs, outputs = [(n, "float32"), (n, "float32")], [(1, "float32")]
    # smooth_l1_loss with the mean reduction makes the unreduced loss (one tensor of an input's size) then its mean
    # (on the H100 its output's storage was an input's size too: 8 GiB measured, see the test below).
    fp = _footprint(inputs, outputs, work=4 * n)
    assert (fp.inputs, fp.inputs_f64, fp.outputs, fp.outputs_f64) == (8 * GIB, 16 * GIB, 4, 8)
    assert fp.calls_wanted == 1  # a window holds 4 GiB of calls, at least one
    before = mp.trusted_phases(fp, mp.Choice(6, "device", 20))["calibration"]
    assert before == 160 * GIB > H200[0]
    for free, total in (H100, H200):
        plan = mp.plan(fp, free=free, total=total, budget_setting=None, reserve=2 * GIB)
        assert plan.fits and plan.shrunk == [] and plan.calls_per_window == 1, plan.message
        assert plan.trials_kept == 6 and plan.truth == "device"  # 12 bytes a trial
        assert plan.phases_bytes["trusted_calibration"] == 8 * GIB
        # The float64 truth's forward: the inputs in float64 (16 GiB) and its unreduced loss (8 GiB), beside the
        # float32 inputs: the trusted side's peak.
        assert plan.phases_bytes["trusted_prepare"] == 8 * GIB + 16 * GIB + 8 * GIB + 4 + 6 * 12
        # The candidate's trial: a quarter of the free memory poisoned, or its copy of the inputs and the loss.
        assert plan.phases_bytes["candidate_trials"] == max(min(32 * GIB, free // 4), 12 * GIB + 4)
        assert plan.needs_bytes == plan.phases_bytes["trusted_prepare"] + plan.phases_bytes["candidate_trials"] + \
            2 * GIB


def test_level1_23_softmax_at_its_own_size():
    """KernelBench's level1/23 (softmax over dim 1 of a (4096, 393216) float32 tensor): 6 GiB in and 6 GiB out a
    call, 12 GiB each in float64. No trial's output and truth (18 GiB) fit the 8 GiB kept at most: each is made again
    at the judge. It fits an H100 with the truth on the device, one call a window."""
    constants = _constants(FIXTURES / "level1" / "23_Softmax.py")
    n = int(constants["batch_size"]) * int(constants["dim"])  # type: ignore[call-overload]
    fp = _footprint([(n, "float32")], [(n, "float32")], work=4 * n)  # softmax makes its output alone
    assert (fp.inputs, fp.outputs, fp.inputs_f64, fp.outputs_f64) == (6 * GIB, 6 * GIB, 12 * GIB, 12 * GIB)
    for free, total in (H100, H200):
        plan = mp.plan(fp, free=free, total=total, budget_setting=None, reserve=2 * GIB)
        assert plan.fits and plan.shrunk == [], plan.message
        assert (plan.trials_kept, plan.truth, plan.calls_per_window) == (0, "device", 1)
        # The truth's forward beside the float32 input and output: 6 + 6 + 12 + 12 GiB; at each trial's take, trial
        # 0's output (6 GiB) beside it, held for the determinism re-run's.
        assert plan.phases_bytes["trusted_prepare"] == plan.phases_bytes["trusted_judge"] == 36 * GIB
        assert plan.phases_bytes["trusted_trials"] == 42 * GIB
        # Its copy of the input, output and snapshot, or the poisoned quarter of the free memory where larger.
        candidate = max(min(24 * GIB, free // 4), 18 * GIB)
        assert plan.phases_bytes["candidate_trials"] == candidate
        assert plan.needs_bytes == 44 * GIB + candidate
    # On a card with 48 GiB free the truth goes to the host: the trusted side then holds its float32 call alone
    # (the input, the expected output, and the stochastic check's second output) and trial 0's output.
    small = mp.plan(fp, free=48 * GIB, total=48 * GIB, budget_setting=None, reserve=2 * GIB)
    assert small.fits and small.truth == "host" and small.first_output == "device"
    # Compared in the widest slices that fit: the device's 64M elements, 7 GiB of temporaries beside the two outputs
    # and trial 0's.
    assert small.compare_slice == fp.compare_slice
    assert small.needs_bytes == (6 + 12 + 7) * GIB + 18 * GIB + 2 * GIB <= 48 * GIB


# The H100 80GB where level1/96 and level1/23 ran at their own sizes: 79.18 GiB in all, 78.57 GiB free with the
# trusted process's context made; the exchange's segments in its device memory (2 MiB a granule).
H100_MEASURED = (int(78.57 * GIB), int(79.18 * GIB))
DEVICE_EXCHANGE = {"exchange_device": "cuda", "granule": 2 * MIB, "picks_per_window": windows.PICKS_PER_WINDOW}


def test_level1_96_counts_the_segments_and_judging_ahead_beside_the_candidates_trials():
    """level1/96 on the H100: the plan said 66 GiB of 78.57 fit (40 the trusted side's prepare, 24 the candidate's
    trial), and the candidate ran out of memory in its trial with 64.7 GiB held by the other processes. The 8 GiB
    input segment was in no term. Now the segments count on the device, and the trusted side's work while the
    candidate runs its trials (staging, taking, judging ahead) counts beside the candidate's trial."""
    n = 32768 * 32768
    fp = _footprint([(n, "float32"), (n, "float32")], [(1, "float32")], work=8 * GIB + 16896, judge_ahead=True,
                    **DEVICE_EXCHANGE)
    plan = mp.plan(fp, *H100_MEASURED, budget_setting=None, reserve=2 * GIB, host_available=200 * GIB)
    assert plan.fits, plan.message
    # One window of one call hands over one output: one slot, not PICKS_PER_WINDOW.
    assert plan.calls_per_window == 1 and plan.handover_slots == 1
    assert plan.phases_bytes["segments"] == 8 * GIB + 2 * MIB + 2 * MIB
    assert plan.phases_bytes["trusted_at_trials"] == plan.phases_bytes["trusted_trials"] + \
        plan.phases_bytes["trusted_ahead"]
    assert plan.phases_bytes["trusted_ahead"] > 0 and plan.judge_ahead
    # One copy of the inputs (compared with the segment after the call), the forward's work and the output; or the
    # poisoned quarter of the free memory, where larger.
    assert plan.candidate_bytes == plan.phases_bytes["candidate_trials"] == \
        max(H100_MEASURED[0] // 4, 16 * GIB + 16896 + 4)
    assert plan.needs_bytes == plan.phases_bytes["trusted_prepare"] + plan.candidate_bytes + \
        plan.phases_bytes["segments"] + 2 * GIB
    assert "the exchange's segments" in plan.message and "8.00 GiB the exchange's segments" in plan.message
    assert plan.host_needs_bytes == 0  # the segments are the device's


def test_level1_23_fits_the_h100_with_one_handover_slot():
    """level1/23 on the H100 ended before any trial: the exchange's own check counted two hand-over slots of 6 GiB
    (54 GiB in one trial, against 47 GiB available then). One call a window hands over one output: the segments are
    6 + 6 + 6 GiB, and the plan, the one owner of the verdict, fits it."""
    n = 4096 * 393216
    fp = _footprint([(n, "float32")], [(n, "float32")], work=4 * n, **DEVICE_EXCHANGE)
    plan = mp.plan(fp, *H100_MEASURED, budget_setting=None, reserve=2 * GIB, host_available=200 * GIB)
    assert plan.fits, plan.message
    assert (plan.calls_per_window, plan.handover_slots, plan.trials_kept) == (1, 1, 0)
    assert plan.phases_bytes["segments"] == 18 * GIB
    assert plan.candidate_bytes == max(H100_MEASURED[0] // 4, 18 * GIB)
    assert plan.needs_bytes <= H100_MEASURED[0]
    assert plan.needs_bytes == max(v for k, v in plan.phases_bytes.items() if k.startswith("trusted_")) + \
        plan.candidate_bytes + 18 * GIB + 2 * GIB


def test_host_segments_are_bounded_by_the_hosts_available_memory():
    """A CUDA evaluation whose segments are the host's: the plan checks them (and the trusted side's host copies)
    against MemAvailable with a tenth to spare, and says so when they do not fit."""
    n = 4096 * 393216
    fp = _footprint([(n, "float32")], [(n, "float32")], work=4 * n, exchange_device="cpu")
    ok = mp.plan(fp, *H100_MEASURED, budget_setting=None, reserve=2 * GIB, host_available=64 * GIB)
    assert ok.fits and ok.host_needs_bytes == 18 * GIB + 12 * GIB and ok.phases_bytes["segments"] == 18 * GIB
    short = mp.plan(fp, *H100_MEASURED, budget_setting=None, reserve=2 * GIB, host_available=32 * GIB)
    assert not short.fits and short.message.startswith("too large for the host's memory")


def test_judging_ahead_is_the_first_thing_shrunk():
    """Where the work judged ahead does not fit beside the candidate's trials, it moves to the judge first."""
    # Windows of one call: their inputs staged and the window segment then weigh less than the trials' work.
    fp = mp.replace(_footprint([(16 << 20, "float32")], [(16 << 20, "float32")], work=64 * MIB, judge_ahead=True,
                               **DEVICE_EXCHANGE), calls_wanted=1)
    c = mp.Choice(6, "device", fp.calls_wanted, judge_ahead=True)
    ahead, at_judge = mp.needs(fp, c, None, 0)[0], mp.needs(fp, mp.replace(c, judge_ahead=False), None, 0)[0]
    assert ahead > at_judge
    plan = mp.plan(fp, None, None, budget_setting=ahead - 1, reserve=0)
    assert plan.fits and not plan.judge_ahead and plan.shrunk[0].startswith("the outputs that compute nothing")
    assert plan.trials_kept == 6 and plan.needs_bytes == at_judge  # nothing else had to go


def test_level1_96_counts_what_the_trusted_side_holds_at_each_step_and_fits_the_h100():
    """level1/96 on the H100: after its prepare the trusted side held 48 GiB, its prepare peaked at 72 GiB and three
    float64 truths ran out of memory. smooth_l1_loss's 0-dim mean keeps the storage of the unreduced loss it was
    made from (its meta function sizes the output as the inputs, then resizes it to 0-dim): each trial kept 4 GiB
    of expected output and 8 GiB of truth, where the plan counted 12 bytes. The trusted side now keeps copies of
    the elements, and the windows, which keep outputs as returned, count their storages."""
    n = 32768 * 32768
    inputs = [(n, "float32"), (n, "float32")]
    # As measured on the H100: the forward's peak above its inputs is its output's storage and the unreduced loss.
    work = 8 * GIB + 16896
    assert mp.redistributed_bytes(inputs) == 12 * GIB  # the extra trial: 8 GiB of inputs, a 4 GiB draw beside
    fp = _footprint(inputs, [(1, "float32")], work=work, judge_ahead=True, outputs_held=4 * n,
                    inputs_made=mp.redistributed_bytes(inputs), **DEVICE_EXCHANGE)
    plan = mp.plan(fp, *H100_MEASURED, budget_setting=None, reserve=2 * GIB, host_available=200 * GIB)
    kept = plan.trials_kept * (4 + 8)  # copies of the expected output and truth, not their storages
    # The prepare's trial as trusted.prepare runs it, what is held at each step:
    steps = {
        "inputs made (the extra trial's redraw)": 12 * GIB,
        "forward": 8 * GIB + work,
        "expected copied": 8 * GIB + 4 * GIB + 4,
        "stochastic check beside the copy": 8 * GIB + 4 + work,
        # float64 inputs, then the float64 forward's output storage and unreduced loss (its work scaled by two)
        "float64 truth": 8 * GIB + 4 + 16 * GIB + 2 * work,
        "truth copied": 8 * GIB + 4 + 16 * GIB + 8 * GIB + 8,
    }
    assert plan.phases_bytes["trusted_prepare"] >= kept + max(steps.values())
    # A timed window keeps its call's output as returned: the loss's storage, within the forward's work.
    assert plan.output_held_bytes == 4 * GIB and plan.inputs_made_bytes == 12 * GIB
    assert plan.phases_bytes["trusted_windows"] >= plan.calls_per_window * (8 * GIB + 4 * GIB) + work - 4 * GIB
    # It fits as it is, the truth on the device, and the candidate's share is one reference call's at least.
    assert plan.fits and plan.shrunk == [] and plan.truth == "device", plan.message
    assert plan.candidate_bytes >= fp.inputs + work
    assert plan.needs_bytes <= H100_MEASURED[0]


def test_level1_96_on_a_smaller_device_moves_the_truth_to_the_host_rather_than_try_it():
    """Where the float64 truth's forward (40 GiB of the trusted side's) does not fit beside the candidate's trial,
    the plan says so before the first truth: it is made on the host, and the device keeps the float32 call alone."""
    n = 32768 * 32768
    inputs = [(n, "float32"), (n, "float32")]
    fp = _footprint(inputs, [(1, "float32")], work=8 * GIB, outputs_held=4 * n,
                    inputs_made=mp.redistributed_bytes(inputs), **DEVICE_EXCHANGE)
    on_device = mp.needs(fp, mp.Choice(6, "device", 1), 64 * GIB, 2 * GIB)[0]
    assert on_device > 64 * GIB
    plan = mp.plan(fp, 64 * GIB, 64 * GIB, budget_setting=None, reserve=2 * GIB)
    assert plan.fits and plan.truth == "host", plan.message
    assert plan.shrunk[-1].startswith("float64 truth computed on the host")
    # Trials kept went first (12 bytes a trial: it did not help): the prepare holds the inputs made for the extra
    # trial at most, or the float32 forward beside its inputs and the expected output's copy.
    assert plan.trials_kept == 0 and plan.shrunk[0].startswith("trials kept")
    assert plan.phases_bytes["trusted_prepare"] == max(12 * GIB, 8 * GIB + 8 * GIB + 4)


def test_a_window_counts_each_calls_output_as_returned():
    """Outputs that hold more than their elements (a view into a larger storage): a window of several calls keeps
    each one's storage, on both sides; what a trial keeps is a copy of the elements alone."""
    compact = _footprint([(1 << 20, "float32")], [(1 << 10, "float32")], work=8 * MIB)
    viewed = mp.replace(compact, outputs_held=4 * MIB)
    c = mp.Choice(6, "device", 3)
    grown = 3 * (4 * MIB - 4 * (1 << 10)) - (4 * MIB - 4 * (1 << 10))  # the two calls' storages beyond the last's
    for side in (mp.trusted_phases, lambda fp, c: mp.candidate_phases(fp, c, None)):
        assert side(viewed, c)["windows"] - side(compact, c)["windows"] == grown
    assert mp.trusted_phases(viewed, c)["judge"] == mp.trusted_phases(compact, c)["judge"]


def test_staged_windows_put_a_windows_inputs_in_the_trusted_sides_segment_not_the_candidates_windows():
    """Staged, a window's inputs are the trusted side's (its staged copy and the window segment it writes them into)
    and the candidate's windows make none; unstaged (the setting off, or through host memory on CUDA), each side
    makes its own as before."""
    io = [(1 << 20, "float32")]
    on_device = _footprint(io, io, work=4 * MIB, windows_staged=True, **DEVICE_EXCHANGE)
    via_host = mp.replace(on_device, exchange_device="cpu", windows_staged=False)
    c = mp.Choice(6, "device", 8, judge_ahead=False)
    assert mp.staged(on_device) and not mp.staged(via_host)
    staged, unstaged = mp.trusted_phases(on_device, c), mp.trusted_phases(via_host, c)
    assert staged["windows"] - unstaged["windows"] == mp.window_segment(on_device, c) >= 8 * 4 * MIB
    assert mp.candidate_phases(via_host, c, None)["windows"] - mp.candidate_phases(on_device, c, None)["windows"] \
        == 8 * 4 * MIB


def test_level1_45_fits_the_h100_with_one_copy_of_its_input_a_side():
    """KernelBench's level1/45 (AvgPool2d, kernel 11, of a (16, 64, 2048, 2048) float32 input: 16 GiB in, 0.13 GiB
    out). On the H100 the plan refused it before any trial: "needs 98.53 GiB (48.00 GiB the trusted side, 32.26 GiB
    the candidate, 16.27 GiB the exchange's segments, 2.00 GiB reserve), has 78.66 GiB". The trusted side's 48 GiB
    were the extra trial's redraw (the input and two temporaries of its size), the candidate's 32 its clone of the
    input and a second copy for the mutation check. The redraw now replaces the input in place (one draw beside it)
    and the candidate compares its clone with the segment it came from: it fits, as its reference and one candidate
    copy do."""
    n, m = 16 * 64 * 2048 * 2048, 16 * 64 * 186 * 186
    inputs = [(n, "float32")]
    assert mp.redistributed_bytes(inputs) == 32 * GIB
    fp = mp.replace(_footprint(inputs, [(m, "float32")], work=4 * m, **DEVICE_EXCHANGE),
                    inputs_made=mp.redistributed_bytes(inputs))
    plan = mp.plan(fp, int(78.66 * GIB), *H100_MEASURED[1:], budget_setting=None, reserve=2 * GIB,
                   host_available=200 * GIB)
    assert plan.fits, plan.message
    assert max(v for k, v in plan.phases_bytes.items() if k.startswith("trusted_")) < 33 * GIB
    assert plan.candidate_bytes < 20 * GIB  # one copy of the input, or the poisoned quarter of the free memory
    assert plan.needs_bytes <= 78.66 * GIB


def test_level1_39_holds_trial_0s_output_on_the_host_to_fit_the_h100():
    """KernelBench's level1/39 (L2 norm of a (32768, 65535) float32 tensor: 8 GiB in, 8 GiB out). On the H100 the plan
    said it fit in 74 GiB with 24 the trusted side's, and the trusted side ran out of memory in its first take holding
    24.1 GiB and asking for 8 more: the candidate's output read, then the trial's input and expected output made
    again beside it. The take now makes the expected output first (its input let go before the output is read), and
    the plan counts trial 0's output, held to the determinism re-run's, beside every later take: 32 GiB there, which
    does not fit beside the candidate's 24 and the segments' 24; kept on the host instead, it does."""
    n = 32768 * 65535
    io = [(n, "float32")]
    fp = mp.replace(_footprint(io, io, work=4 * n, **DEVICE_EXCHANGE), inputs_made=2 * 4 * n)
    old = mp.Choice(0, "host", 1)
    # Trial 0's output held, beside a later trial made again: its input, its expected output and the stochastic
    # check's second one (8 GiB each).
    assert mp.trusted_phases(fp, old)["trials"] == 4 * (4 * n)
    plan = mp.plan(fp, *H100_MEASURED, budget_setting=None, reserve=2 * GIB, host_available=120 * GIB)
    assert plan.fits, plan.message
    assert (plan.trials_kept, plan.truth, plan.first_output, plan.calls_per_window) == (0, "host", "host", 1)
    assert plan.phases_bytes["trusted_trials"] == 3 * (4 * n) and plan.host_needs_bytes == 4 * n
    assert "on the host it needs 8.00 GiB (trial 0's output)" in plan.message
    assert plan.needs_bytes <= H100_MEASURED[0]
    # Compared in the widest slices that fit, here the device's (1M-element slices took 9 s a take there).
    assert plan.compare_slice == fp.compare_slice


def test_a_truth_on_the_host_is_compared_in_the_widest_slices_that_fit():
    """Where the truth moved to the host, the slices grow from 1M elements, doubling while the plan still fits."""
    n = 4096 * 393216
    fp = _footprint([(n, "float32")], [(n, "float32")], work=4 * n)
    plan = mp.plan(fp, free=int(38.5 * GIB), total=48 * GIB, budget_setting=None, reserve=2 * GIB)
    assert plan.fits and plan.truth == "host" and plan.first_output == "host"
    assert mp.SMALL_COMPARE_SLICE < plan.compare_slice < fp.compare_slice
    chosen = mp.Choice(0, "host", plan.calls_per_window, first_on_host=True, compare_slice=plan.compare_slice)
    assert mp.needs(fp, chosen, plan.budget_bytes, 2 * GIB)[0] == plan.needs_bytes <= 38.5 * GIB
    wider = mp.replace(chosen, compare_slice=2 * plan.compare_slice)
    assert mp.needs(fp, wider, plan.budget_bytes, 2 * GIB)[0] > 38.5 * GIB
