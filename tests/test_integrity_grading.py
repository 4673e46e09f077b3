"""Grading of the integrity checks from stored figures: each check's catch and its honest twin.

The submissions that trigger these live in tests/fixtures/adversarial (see tests/evaluation/corpus.py);
here the boundaries are pinned down without processes or a GPU.
"""

from __future__ import annotations

import pytest

from harness.evaluation import windows
from harness.evaluation.windows import WindowSeries
from harness.grading import HANDOVER_LATENCY_CREDIT, grade
from harness.reporting import Scored, leaderboard
from harness.schema import (
    ChildExit,
    KernelTrace,
    Observations,
    OutputFigures,
    SpeedOfLight,
    StaticFinding,
    TimedOutputCheck,
    TimingEnvelope,
    TimingStats,
    Tolerance,
    TrialFigures,
)
from harness.verdicts import Verdict

TOL = Tolerance(atol=1e-4, rtol=1e-4)


def _timing(median: float, mean: float | None = None, n: int = 100) -> TimingStats:
    mean = median if mean is None else mean
    return TimingStats(clock="cuda_event", n=n, median_ms=median, mean_ms=mean, min_ms=median, max_ms=mean,
                       std_ms=0.0)


def _passing(**kw) -> Observations:
    fig = OutputFigures(index=0, got_type="Tensor", got_shape=[4], got_dtype="float32", expected_shape=[4],
                        expected_dtype="float32", nonfinite_mismatches=0, numel=4, max_abs_err=0.0, max_rel_err=0.0,
                        err_vs_fp64=1e-6, ref_err_vs_fp64=1e-6)
    return Observations(candidate_exit=ChildExit(finished=True), trials_expected=1,
                        trials=[TrialFigures(trial=0, outputs=[fig])], **kw)


def _checks(obs: Observations) -> tuple[Verdict, list[str]]:
    g = grade(obs, TOL)
    return g.verdict, [f.check for f in g.flags]


def _window_timing(median: float, spread: float = 0.01) -> TimingStats:
    return TimingStats(clock="parent_window", n=15, median_ms=median, raw_median_ms=median + 0.05, mean_ms=median,
                       min_ms=median, max_ms=median, std_ms=0.0, calls_per_window=10, spread=spread)


def _handed_over(got: float, n: int = 2) -> TimedOutputCheck:
    """n timed outputs judged by the trusted side, each with its largest difference `got`."""
    fig = OutputFigures(index=0, got_type="Tensor", got_shape=[4], got_dtype="float32", expected_shape=[4],
                        expected_dtype="float32", nonfinite_mismatches=0, numel=4, max_abs_err=got, max_rel_err=got,
                        worst_index=[1], worst_got=got, worst_expected=0.0)
    return TimedOutputCheck(reported=n, expected=n, checked=list(range(n)), handover_slack_ms=3.0,
                            handover_ms=[5.0] * (n // 2), reference_save_ms=[4.5] * (n // 2),
                            calls=[TrialFigures(trial=i, inputs="timed window", outputs=[fig]) for i in range(n)])


def test_a_timed_output_beyond_the_tolerance_is_flagged_and_one_within_it_passes():
    wrong = _passing(candidate_timing=_window_timing(1.0), timed_outputs=_handed_over(3e-3))
    assert _checks(wrong) == (Verdict.flagged, ["timed_outputs"])
    assert "timed call" in grade(wrong, TOL).log_excerpt
    assert _checks(_passing(candidate_timing=_window_timing(1.0), timed_outputs=_handed_over(5e-5)))[0] == \
        Verdict.passed


def test_a_missing_or_unreadable_handed_over_output_is_flagged():
    missing = _handed_over(0.0).model_copy(update={"reported": 1})
    assert _checks(_passing(candidate_timing=_window_timing(1.0), timed_outputs=missing)) == \
        (Verdict.flagged, ["timed_outputs"])
    fifo = _handed_over(0.0)
    fifo.calls[0] = TrialFigures(trial=0, inputs="timed window", file_error="handover_0_1.pt is not a regular file")
    g = grade(_passing(candidate_timing=_window_timing(1.0), timed_outputs=fifo), TOL)
    assert g.verdict == Verdict.flagged and "not a regular file" in g.log_excerpt


def _fingerprinted(candidate_ms: list[float], reference_ms: list[float], mismatches: tuple[str, ...] = ()
                   ) -> TimedOutputCheck:
    """Fingerprints of 19 outputs a window over len(candidate_ms) windows, and one hand-over judged exactly."""
    return _handed_over(0.0).model_copy(update={
        "handover_ms": [], "reference_save_ms": [], "fingerprint_ms": candidate_ms,
        "reference_fingerprint_ms": reference_ms, "fingerprinted": 19 * len(candidate_ms),
        "fingerprint_mismatches": list(mismatches)})


def test_fingerprints_that_compute_are_flagged_handover_time_and_ones_that_only_read_pass():
    """level2/75 on an H100: the trusted side fingerprints a window's 19 outputs in about 4 ms. A window that
    computed every other call, and the rest when asked (lazy_half_window.py), pays 30 ms of its 60 ms there;
    before fingerprints, only two picked calls were computed when asked, inside a hand-over allowed 45 ms more
    than its save, and it passed at 2x."""
    reference = [4.1, 3.9, 4.3, 4.0, 4.2]
    honest = _fingerprinted([4.6, 4.4, 5.0, 4.3, 4.9], reference)
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=honest))[0] == Verdict.passed
    near_slack = _fingerprinted([r + 4.5 for r in reference], reference)  # allowed: 3 ms + half of 4.1 ms
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=near_slack))[0] == Verdict.passed
    lazy_half = _fingerprinted([r + 30.0 for r in reference], reference)
    g = grade(_passing(candidate_timing=_window_timing(1.5), timed_outputs=lazy_half), TOL)
    assert [f.check for f in g.flags] == ["handover_time"] and g.verdict == Verdict.flagged
    assert "took 30 ms more than the trusted side's fingerprints" in g.log_excerpt
    # The rule of results stored before fingerprints does not apply to one that has them: a slow hand-over of
    # whole outputs (its time is a diagnostic now) is not a flag.
    slow_handover = honest.model_copy(update={"handover_ms": [400.0], "reference_save_ms": [5.0]})
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=slow_handover))[0] == Verdict.passed


def test_a_loaded_hosts_round_trip_is_taken_off_the_fingerprints_and_a_lazy_window_still_pays():
    """On the CPU (slack 40 ms), two evaluations side by side on 2 cores running a test suite: an honest reference's
    fingerprints (8 ms of work) came back 50-70 ms after they were asked for, the trusted side's command 10 ms:
    flagged handover_time. The trusted side's round trip right after each fingerprint (55-65 ms then) is taken off,
    and its own clock is what the work costs; a window that left 300 ms a window to its fingerprints still pays it,
    whatever latency it causes (credited at most 3 slacks, 120 ms)."""
    loaded = _fingerprinted([62.0, 71.0, 58.0, 66.0, 69.0], [10.0, 11.0, 9.5, 10.4, 10.1]).model_copy(
        update={"handover_slack_ms": 40.0})
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=loaded)) == \
        (Verdict.flagged, ["handover_time"])  # no round trips: the bound of results stored before them
    paired = loaded.model_copy(update={"fingerprint_latency_ms": [56.0, 63.0, 55.0, 60.0, 65.0],
                                       "reference_fingerprint_own_ms": [8.1, 8.0, 8.3, 7.9, 8.2]})
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=paired))[0] == Verdict.passed
    lazy = paired.model_copy(update={"fingerprint_ms": [c + 300.0 for c in paired.fingerprint_ms]})
    g = grade(_passing(candidate_timing=_window_timing(0.0), timed_outputs=lazy), TOL)
    assert [f.check for f in g.flags] == ["handover_time"] and "net of the host's round-trip latency (median 60 ms)" \
        in g.log_excerpt
    gamed = lazy.model_copy(update={"fingerprint_latency_ms": [lat + 300.0 for lat in paired.fingerprint_latency_ms]})
    g = grade(_passing(candidate_timing=_window_timing(0.0), timed_outputs=gamed), TOL)
    assert [f.check for f in g.flags] == ["handover_time"] and "(median 120 ms)" in g.log_excerpt


def _charged(check: TimedOutputCheck, window_ms: float, calls: int = 10) -> TimingStats:
    """The candidate's timing as the runner makes it: windows of `calls` calls lasting `window_ms`, each charged what
    its fingerprints took beyond the trusted side's (an empty window of 1 ms)."""
    charges = windows.fingerprint_charges(check.fingerprint_ms, check.fingerprint_latency_ms,
                                          check.reference_fingerprint_own_ms,
                                          HANDOVER_LATENCY_CREDIT * (check.handover_slack_ms or 0.0))
    n = len(charges)
    return windows.stats(WindowSeries(calls, [window_ms] * n, charged_ms=charges),
                         WindowSeries(calls, [1.0] * n))


def test_a_window_that_left_half_its_calls_to_its_fingerprints_pays_for_them_and_no_bound_decides_it():
    """The CPU run of lazy_half_window.py: windows of 60 ms, half their calls left to the fingerprints, whose allowance
    (40 ms plus half the trusted side's time) took them all: a clean pass at 1.57x. The excess is now charged to each
    window: its time is its honest twin's, and no bound on the excess flags it or lets it through."""
    reference = [40.0, 42.0, 39.0, 41.0, 40.5]
    lazy = _fingerprinted([r + 30.5 for r in reference], reference).model_copy(update={
        "handover_slack_ms": 40.0, "fingerprint_latency_ms": [0.5] * 5, "reference_fingerprint_own_ms": reference})
    eager = _window_timing(6.0)
    stored_before = _passing(candidate_timing=_window_timing(3.0), eager_timing=eager, timed_outputs=lazy)
    assert _checks(stored_before)[0] == Verdict.passed  # within the old allowance: the clean pass at 2x
    assert grade(stored_before, TOL).speedup_vs_eager == 2.0
    timing = _charged(lazy, window_ms=31.0)
    assert timing.median_ms == pytest.approx(6.0) and timing.windows_alone_median_ms == pytest.approx(3.0)
    g = grade(_passing(candidate_timing=timing, eager_timing=eager, timed_outputs=lazy), TOL)
    assert g.verdict == Verdict.passed and g.flags == [] and g.speedup_vs_eager == pytest.approx(1.0)
    assert "its fingerprints took 50.0% of its time beyond the trusted side's" in g.message
    # No work left out at all (lazy_window.py): its whole time is in its fingerprints, and paid; no flag either.
    idle = lazy.model_copy(update={"fingerprint_ms": [r + 60.5 for r in reference]})
    g = grade(_passing(candidate_timing=_charged(idle, window_ms=1.0), eager_timing=eager, timed_outputs=idle), TOL)
    assert g.verdict == Verdict.passed and g.flags == [] and g.speedup_vs_eager == pytest.approx(1.0)
    # Its honest twin: fingerprints that only read come to no charge; its time is the windows'.
    honest = lazy.model_copy(update={"fingerprint_ms": [40.9, 40.6, 41.0, 40.2, 40.8]})
    timing = _charged(honest, window_ms=61.0)
    assert timing.charged_ms == [0.0] * 5 and timing.median_ms == timing.windows_alone_median_ms == 6.0
    g = grade(_passing(candidate_timing=timing, eager_timing=eager, timed_outputs=honest), TOL)
    assert g.verdict == Verdict.passed and g.flags == [] and "fingerprints took" not in g.message


def test_fingerprints_far_over_an_old_bound_are_no_flag_once_charged_and_stored_results_regrade_as_before():
    """A result stored before the charge is re-graded by its bound (the same figures flag handover_time); the same
    fingerprints in a result whose windows were charged are part of its time, however large."""
    reference = [4.1, 3.9, 4.3, 4.0, 4.2]
    slow = _fingerprinted([r + 30.0 for r in reference], reference).model_copy(update={
        "fingerprint_latency_ms": [0.2] * 5, "reference_fingerprint_own_ms": reference})
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=slow)) == \
        (Verdict.flagged, ["handover_time"])
    timing = _charged(slow, window_ms=16.0)
    assert timing.median_ms == pytest.approx((15.0 + 29.8) / 10)
    assert _checks(_passing(candidate_timing=timing, timed_outputs=slow)) == (Verdict.passed, [])


def test_a_submission_flagged_for_what_it_did_carries_its_static_findings_too():
    """profile_hook_spin.py on an H100: its profile hook runs at every Python call, its fingerprints' too, which came
    9 ms over their bound: flagged handover_time, and the static pre-check's profile_hook was lost with it. Both are
    shown; a clean result carries the static findings alone, and one with none carries none."""
    hook = [StaticFinding(rule="profile_hook", line=19, detail="sys.setprofile")]
    reference = [8.8] * 5
    slow = _fingerprinted([r + 9.3 for r in reference], reference)
    g = grade(_passing(candidate_timing=_window_timing(1.5), timed_outputs=slow, static_findings=hook), TOL)
    assert g.verdict == Verdict.flagged and [f.check for f in g.flags] == ["handover_time", "static:profile_hook"]
    assert "static:profile_hook line 19: sys.setprofile" in g.log_excerpt
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=slow)) == \
        (Verdict.flagged, ["handover_time"])
    clean = _fingerprinted(reference, reference)
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=clean, static_findings=hook)) == \
        (Verdict.flagged, ["static:profile_hook"])


def test_gpu_work_left_running_after_the_reply_is_flagged_and_a_probe_late_on_a_busy_host_is_not():
    """On an H100 a tiny kernel and its sync take 0.06 ms on an idle GPU and 1.3-1.5 ms behind another process's
    queued kernels; 20 matmuls ran 2.2-2.5x slower beside them. leftover_gpu_work.py queues 40 ms of kernels after
    each of its replies: the trusted side waited about that long before the reference windows that followed. A
    probe that a busy host's scheduler delayed waits a millisecond or two, and passes."""
    honest = _passing(candidate_timing=_window_timing(1.0), gpu_idle_waits_ms=[0.0] * 30 + [1.2, 0.6])
    assert _checks(honest)[0] == Verdict.passed
    left = honest.model_copy(update={"gpu_idle_waits_ms": [0.0] * 20 + [38.5, 39.1, 0.0, 40.2]})
    g = grade(left, TOL)
    assert [f.check for f in g.flags] == ["leftover_gpu_work"] and g.verdict == Verdict.flagged
    assert "before 3 of 24 reference windows" in g.log_excerpt and "longest wait 40.2 ms" in g.log_excerpt
    stuck = honest.model_copy(update={"gpu_idle_waits_ms": [10000.0], "gpu_busy_windows": 1})
    assert _checks(stuck) == (Verdict.flagged, ["leftover_gpu_work"])
    assert _checks(_passing(candidate_timing=_window_timing(1.0)))[0] == Verdict.passed  # CPU, or no wait: no figures


def test_a_fingerprint_off_the_reference_is_flagged_timed_outputs():
    forged = _fingerprinted([0.2] * 5, [4.0] * 5, tuple(
        f"timed call {c} output 0: fingerprint 0.0 where the reference's is 12.5 (within 0.0031 for an output "
        "within the tolerance)" for c in range(95)))
    g = grade(_passing(candidate_timing=_window_timing(0.01), timed_outputs=forged), TOL)
    assert g.verdict == Verdict.flagged and [f.check for f in g.flags] == ["timed_outputs"]
    assert "95 of 95 fingerprinted outputs: timed call 0 output 0" in g.log_excerpt and "92 more" in g.log_excerpt


def test_fingerprints_a_little_off_in_every_output_add_up_to_timed_outputs():
    """285 outputs each within six scales, but off by twice the tolerance's scale on average: the sum of squares (about
    1140) is past what outputs within the tolerance reach but with a chance of 2e-9 (about 476); at the tolerance's
    scale on average (285), they pass."""
    honest = _fingerprinted([4.0] * 15, [4.0] * 15).model_copy(update={"fingerprint_deviation": 285.0,
                                                                       "fingerprint_terms": 285})
    assert _checks(_passing(candidate_timing=_window_timing(1.5), timed_outputs=honest))[0] == Verdict.passed
    low_precision = honest.model_copy(update={"fingerprint_deviation": 1140.0})
    g = grade(_passing(candidate_timing=_window_timing(1.5), timed_outputs=low_precision), TOL)
    assert g.verdict == Verdict.flagged and [f.check for f in g.flags] == ["timed_outputs"]
    assert "off the reference's by 1140 squared scales in all, over the 476" in g.log_excerpt


def test_a_handover_that_computes_is_flagged_and_one_that_only_saves_passes():
    """Results stored before fingerprints keep the hand-over's own bound (regrading them decides as before)."""
    # Credited 0.01 ms per call, yet handing over 2 outputs took 40 ms more than saving them: computed when asked.
    lazy = _handed_over(0.0).model_copy(update={"handover_ms": [45.0, 44.0, 46.0], "reference_save_ms": [5.0] * 3,
                                               "expected": 6, "reported": 6})
    assert _checks(_passing(candidate_timing=_window_timing(0.01), timed_outputs=lazy)) == \
        (Verdict.flagged, ["handover_time"])
    # An honest 30 ms kernel: half its credited time for each pick is allowed on top of the save (host noise).
    honest = lazy.model_copy(update={"handover_ms": [25.0, 24.0, 26.0]})
    assert _checks(_passing(candidate_timing=_window_timing(30.0), timed_outputs=honest))[0] == Verdict.passed
    within_slack = lazy.model_copy(update={"handover_ms": [7.0, 7.5, 6.0]})
    assert _checks(_passing(candidate_timing=_window_timing(0.01), timed_outputs=within_slack))[0] == Verdict.passed


def test_a_loaded_hosts_round_trip_latency_is_not_taken_for_computing_at_the_hand_over():
    """On an H100 host busy with nvcc and 8 evaluations, an honest pure-PyTorch submission (0.14 ms a call) handed
    over 2 outputs 5.06 ms slower than the trusted side saved them (allowed 3.62 ms): flagged handover_time. The
    host's latency at each hand-over (the trusted side's check of it, less its own steps) is taken off, pair by
    pair; the lazy window still pays the computing it left out of the window, whatever the latency."""
    honest_loaded = _handed_over(0.0).model_copy(update={
        "handover_ms": [7.2, 6.1, 6.6, 5.9, 7.0], "reference_save_ms": [1.2] * 3, "expected": 10, "reported": 10})
    obs = _passing(candidate_timing=_window_timing(0.14), timed_outputs=honest_loaded)
    assert _checks(obs) == (Verdict.flagged, ["handover_time"])  # no latency measured: what the H100 run saw
    paired = honest_loaded.model_copy(update={"latency_ms": [5.5, 4.8, 5.1, 4.6, 5.7]})
    assert _checks(_passing(candidate_timing=_window_timing(0.14), timed_outputs=paired))[0] == Verdict.passed
    lazy = paired.model_copy(update={"handover_ms": [h + 40.0 for h in paired.handover_ms]})
    g = grade(_passing(candidate_timing=_window_timing(0.0), timed_outputs=lazy), TOL)
    assert [f.check for f in g.flags] == ["handover_time"] and "round-trip latency, median 5.1 ms" in g.log_excerpt
    # A lazy window that loads the host after its reply, delaying the trusted side's wake-up by as much as it
    # computed: the latency credited is at most 3x the slack (9 ms here), so it still pays the rest.
    gamed = lazy.model_copy(update={"latency_ms": [lat + 40.0 for lat in paired.latency_ms]})
    assert _checks(_passing(candidate_timing=_window_timing(0.0), timed_outputs=gamed)) == \
        (Verdict.flagged, ["handover_time"])


def test_noisy_windows_pass_unranked_as_timing_unreliable():
    g = grade(_passing(candidate_timing=_window_timing(1.0, spread=0.4), eager_timing=_window_timing(1.0)), TOL)
    assert g.verdict == Verdict.passed and [f.check for f in g.flags] == ["timing_unreliable"]
    assert "candidate 40.0%" in g.flags[0].detail
    steady = grade(_passing(candidate_timing=_window_timing(1.0), eager_timing=_window_timing(1.0)), TOL)
    assert steady.verdict == Verdict.passed and steady.flags == []
    short = grade(_passing(candidate_timing=_window_timing(1.0), eager_timing=_window_timing(1.0),
                           windows_sized_down="windows of 2 calls (eager's speed asks for 19) ..."), TOL)
    assert short.verdict == Verdict.passed and [f.check for f in short.flags] == ["timing_unreliable"]
    assert "eager's speed asks for 19" in short.flags[0].detail


def test_a_speedup_paired_by_round_ranks_and_its_spread_not_each_kinds_says_whether_it_can():
    """Level 3's networks on an H200's host: both kinds' windows drift together with the host's speed (30% apart
    within a row), the speedup paired by round 1.5% apart: ranked at the paired figure. A candidate whose own
    windows come and go (every other one slow) spreads its paired speedups too, and is marked."""
    drifting = _window_timing(10.0, spread=0.3)
    eager = _window_timing(9.0, spread=0.3).model_copy(update={"paired_speedup": 1.02, "paired_spread": 0.015})
    g = grade(_passing(candidate_timing=drifting, eager_timing=eager), TOL)
    assert g.verdict == Verdict.passed and g.flags == [] and g.speedup_vs_eager == pytest.approx(1.02)
    erratic = eager.model_copy(update={"paired_spread": 0.45})
    g = grade(_passing(candidate_timing=drifting, eager_timing=erratic), TOL)
    assert g.verdict == Verdict.passed and [f.check for f in g.flags] == ["timing_unreliable"]
    assert "paired by round, spread over eager 45.0%" in g.flags[0].detail


def test_results_timed_in_process_before_windows_still_grade():
    legacy = TimedOutputCheck(reported=100, expected=100, checked=[3], mismatches=["timed call 3: sum differs"])
    assert _checks(_passing(candidate_timing=_timing(1.0), timed_outputs=legacy)) == (Verdict.flagged,
                                                                                      ["timed_outputs"])
    stored = _passing(candidate_timing=_timing(1.0), envelope=TimingEnvelope(wall_ms=1.0, calls=100, overhead_calls=20))
    assert _checks(stored)[0] == Verdict.passed


def test_speed_of_light_flags_the_impossible_and_passes_a_kernel_at_the_floor():
    # 2*1024*8192*8192 FLOP at 800 TFLOP/s is 0.172 ms; 64 MiB at 3 TB/s is 0.022 ms.
    sol = SpeedOfLight(flops=2 * 1024 * 8192 * 8192, min_bytes=64 << 20, flops_per_s=800e12, bytes_per_s=3e12)
    assert abs(sol.floor_ms() - 0.1718) < 1e-3
    assert _checks(_passing(candidate_timing=_timing(0.05), speed_of_light=sol)) == (Verdict.flagged,
                                                                                      ["speed_of_light"])
    assert _checks(_passing(candidate_timing=_timing(0.17), speed_of_light=sol))[0] == Verdict.passed
    # In-process results (stored before parent-clock windows): a tiny kernel's ~0 net median is judged raw.
    tiny = SpeedOfLight(flops=2e6, min_bytes=1e6, flops_per_s=800e12, bytes_per_s=3e12)  # floor 0.33 us
    zeroed = _timing(0.0).model_copy(update={"raw_median_ms": 0.021})
    assert _checks(_passing(candidate_timing=zeroed, speed_of_light=tiny))[0] == Verdict.passed
    no_op = _timing(0.0).model_copy(update={"raw_median_ms": 0.021})
    assert _checks(_passing(candidate_timing=no_op, speed_of_light=sol)) == (Verdict.flagged, ["speed_of_light"])
    # Parent-clock windows: the net median is what counts; the raw one carries the window's own cost per call.
    window = _window_timing(0.05).model_copy(update={"raw_median_ms": 0.3})
    assert _checks(_passing(candidate_timing=window, speed_of_light=sol)) == (Verdict.flagged, ["speed_of_light"])


def test_more_than_ten_times_torch_compile_is_held_for_review():
    fast = _passing(candidate_timing=_timing(0.2), compile_timing=_timing(2.5), eager_timing=_timing(3.0))
    assert _checks(fast) == (Verdict.flagged, ["review_speedup"])
    fine = _passing(candidate_timing=_timing(0.3), compile_timing=_timing(2.5), eager_timing=_timing(3.0))
    assert _checks(fine)[0] == Verdict.passed


def test_protocol_violation_is_flagged_before_anything_else():
    obs = _passing(protocol_violations=["a second 'timing' message"])
    assert _checks(obs) == (Verdict.flagged, ["protocol"])


def test_deferred_output_and_input_mutation_are_flagged():
    assert _checks(_passing(outputs_changed=["trial 0"])) == (Verdict.flagged, ["deferred_output"])
    assert _checks(_passing(inputs_mutated=["trial 0: input(s) [0]"])) == (Verdict.flagged, ["input_mutation"])


def test_no_custom_kernel_is_a_mark_on_a_pass_and_keeps_it_off_the_leaderboard():
    library_only = KernelTrace(names=["sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32",
                                      "void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float>(...)"])
    verdict, checks = _checks(_passing(kernels=library_only))
    assert verdict == Verdict.passed and checks == ["no_custom_kernel"]
    own = KernelTrace(names=[*library_only.names, "fused_groupnorm_kernel(float*, int)"],
                      custom=["fused_groupnorm_kernel(float*, int)"])
    assert _checks(_passing(kernels=own)) == (Verdict.passed, [])
    # A window whose launches could not be traced shows no kernel of its own: no credit, and the detail says why.
    untraceable = grade(_passing(kernels=KernelTrace(names=[], error="CUPTI is missing or refused a subscriber")),
                        TOL)
    assert [f.check for f in untraceable.flags] == ["no_custom_kernel"] and "could not be traced" in \
        untraceable.flags[0].detail
    # A traced window that launched a CUDA graph: its kernels are not named, and the detail says so.
    graph = grade(_passing(kernels=KernelTrace(names=["void at::native::copy_kernel(int)"], graph=True, window=4)), TOL)
    assert [f.check for f in graph.flags] == ["no_custom_kernel"] and "timed window 4" in graph.flags[0].detail \
        and "CUDA graph" in graph.flags[0].detail
    # Not traced: a source that builds nothing and imports only torch launches library kernels alone.
    untraced = grade(_passing(kernels=KernelTrace(names=[], from_source=True)), TOL)
    assert untraced.verdict == Verdict.passed and [f.check for f in untraced.flags] == ["no_custom_kernel"]
    assert "not traced" in untraced.flags[0].detail

    rows = [Scored(submission_id=1, problem_id="p", submitter="a", model="m", verdict="passed", device="cuda",
                   speedup_vs_eager=1.0, flags=["no_custom_kernel"]),
            Scored(submission_id=2, problem_id="p", submitter="b", model="m", verdict="passed", device="cuda",
                   speedup_vs_eager=1.2)]
    assert [r.submitter for r in leaderboard(rows)] == ["b"]


def test_a_time_within_the_empty_windows_noise_is_timing_unreliable():
    lost = _window_timing(0.0).model_copy(update={"noise_ms": 0.01})
    g = grade(_passing(candidate_timing=lost, eager_timing=_window_timing(1.0)), TOL)
    assert g.verdict == Verdict.passed and [f.check for f in g.flags] == ["timing_unreliable"]
    assert "candidate time is within the empty windows' noise" in g.flags[0].detail
    clear = _window_timing(0.5).model_copy(update={"noise_ms": 0.01})
    assert grade(_passing(candidate_timing=clear, eager_timing=_window_timing(1.0)), TOL).flags == []
def test_a_passing_result_whose_tolerance_passes_zeros_too_is_unranked_and_regrades_with_the_tolerance():
    from harness.grading import degenerate_at
    from harness.schema import TrivialOutput

    zeros = OutputFigures(index=0, got_type="Tensor", got_shape=[4], got_dtype="float32", expected_shape=[4],
                          expected_dtype="float32", nonfinite_mismatches=0, numel=4, max_abs_err=3e-4,
                          max_rel_err=3e-4)
    obs = _passing(trivial_outputs=[TrivialOutput(kind="zeros", outputs=[zeros])])
    assert _checks(obs) == (Verdict.passed, [])  # 3e-4 is beyond 1e-4: zeros fail, the tolerance means something
    loose = Tolerance(atol=1e-2, rtol=1e-2)
    assert degenerate_at(obs, loose) == ["zeros"]
    g = grade(obs, loose)
    assert g.verdict == Verdict.passed and [f.check for f in g.flags] == ["degenerate_tolerance"]
    from harness.verdicts import UNRANKED_CHECKS

    assert "degenerate_tolerance" in UNRANKED_CHECKS


def test_a_speedup_from_windows_too_noisy_to_rank_is_marked_unreliable_not_held_for_review():
    noisy = _passing(candidate_timing=_window_timing(0.2, spread=0.3), compile_timing=_window_timing(2.6),
                     eager_timing=_window_timing(3.0))
    assert _checks(noisy) == (Verdict.passed, ["timing_unreliable"])
    steady = _passing(candidate_timing=_window_timing(0.2), compile_timing=_window_timing(2.6),
                      eager_timing=_window_timing(3.0))
    assert _checks(steady) == (Verdict.flagged, ["review_speedup"])


def test_a_candidate_that_ran_while_paused_is_flagged_with_the_window_and_its_cpu_time():
    """The runner times a reference window again where the paused candidate's CPU clock moved during it, and says so;
    the result is flagged with that line. An honest candidate's clock stands still: nothing is said, and it passes
    with the pause that held it recorded."""
    honest = _passing(candidate_timing=_window_timing(1.0), pause_method="cgroup_freeze")
    assert _checks(honest) == (Verdict.passed, [])
    line = "the eager window of round 2: the candidate's processes used 14166 µs of CPU while paused (sigstop)"
    ran = honest.model_copy(update={"ran_while_paused": [line], "paused_cpu_windows": 1, "pause_method": "sigstop"})
    g = grade(ran, TOL)
    assert [f.check for f in g.flags] == ["ran_while_paused"] and line in g.message and "14166 µs" in g.log_excerpt
    for method in ("cgroup_v1_freezer", "ptrace"):  # neither wakes a held task at all
        assert _checks(ran.model_copy(update={"pause_method": method})) == (Verdict.flagged, ["ran_while_paused"])


def test_microseconds_a_v2_frozen_candidate_was_counted_are_timed_again_not_blamed_unless_every_try_was():
    """cgroup v2's freezer: a frozen task that something wakes is parked again by the kernel before any code of its
    own runs, and the µs that costs are counted. On an H100 host running twelve evaluations at once, three entries
    that send themselves nothing were counted 5-18 µs (a few threads, 1-2 windows of ~60) and were flagged
    `ran_while_paused` over their own verdict. Such a window is timed again (the lines stay, as observations) and
    nothing is flagged; where every try of a window was disturbed and timing stopped, it is."""
    honest = _passing(candidate_timing=_window_timing(1.0), pause_method="cgroup_freeze")
    lines = ["the eager window of round 5: the candidate's processes used 5 µs of CPU while paused (cgroup_freeze): "
             "'python3' (tid 5141) 5 µs",
             "the eager window of round 9: the candidate's processes used 18 µs of CPU while paused (cgroup_freeze): "
             "'python3' (tid 5153) 6 µs, 'python3' (tid 5145) 3 µs, 9 µs by no thread alive now"]
    woken = honest.model_copy(update={"ran_while_paused": lines, "paused_cpu_windows": 2})
    assert _checks(woken) == (Verdict.passed, [])
    stopped = woken.model_copy(update={
        "ran_while_paused": [*lines, "the eager window of round 9 was disturbed 3 times: timing stopped"],
        "paused_timing_stopped": True})
    assert _checks(stopped) == (Verdict.flagged, ["ran_while_paused"])


def test_waits_for_a_gpu_other_processes_share_mark_the_result_shared_gpu_shown_not_ranked_never_leftover_gpu_work():
    """Four evaluations on one GPU: each one's waits for an idle GPU were long with the others' work. Those waits are
    kept apart (the rounds asked NVML who computed on the GPU) and mark the result shared_gpu, not ranked, never
    leftover_gpu_work. The same waits put down to the candidate alone are leftover_gpu_work, as before."""
    honest = _passing(candidate_timing=_window_timing(1.0), gpu_idle_waits_ms=[0.06] * 20)
    assert _checks(honest) == (Verdict.passed, [])
    shared = honest.model_copy(update={"gpu_shared_waits_ms": [38.5, 61.0], "gpu_shared_busy": 1,
                                       "gpu_sharers": [4242, 4343]})
    g = grade(shared, TOL)
    assert (g.verdict, [f.check for f in g.flags]) == (Verdict.passed, ["shared_gpu"])
    assert "host PIDs 4242, 4343" in g.flags[0].detail and "longest 61 ms" in g.flags[0].detail
    assert "shown, not ranked" in g.flags[0].detail
    unknown = honest.model_copy(update={"gpu_shared_waits_ms": [38.5], "gpu_unattributed": "no NVML binding"})
    g = grade(unknown, TOL)
    assert [f.check for f in g.flags] == ["shared_gpu"] and "could not be told apart" in g.flags[0].detail
    assert "(no NVML binding)" in g.flags[0].detail
    # The candidate's own waits beside shared ones: its work, flagged.
    both = shared.model_copy(update={"gpu_idle_waits_ms": [0.06] * 20 + [40.2]})
    assert _checks(both) == (Verdict.flagged, ["leftover_gpu_work"])


def test_a_shared_gpu_result_is_shown_and_left_off_the_ranking():
    from harness.reporting import ranked, reference_vouched

    assert not ranked("passed", ["shared_gpu"]) and ranked("passed", [])
    assert not reference_vouched("passed", ["shared_gpu"]) and reference_vouched("passed", [])


def test_gpu_work_left_running_through_a_reference_window_is_named_leftover_gpu_work_not_a_pause_that_failed():
    """Work the candidate queued on the GPU before its pause runs on beside the reference's window: the window is
    timed again, and the flag names the GPU work (the GPU suite saw `ran_while_paused` where the corpus expects
    `leftover_gpu_work`). Its own CPU time during a window, where the pause never lets a held task run (ptrace, v1's
    freezer), is the pause's failure, whatever the GPU did; v2-frozen, it is the kernel's, and the GPU work is named."""
    honest = _passing(candidate_timing=_window_timing(1.0), pause_method="cgroup_freeze")
    gpu = ("the eager window of round 1: another process's GPU work ran after it (the trusted side waited 180 ms "
           "for an idle GPU)")
    left = honest.model_copy(update={"ran_while_paused": [gpu], "gpu_idle_waits_ms": [0.05, 180.0]})
    assert [f.check for f in grade(left, TOL).flags] == ["leftover_gpu_work"]
    cpu = "the eager window of round 2: the candidate's processes used 900 µs of CPU while paused (cgroup_freeze)"
    both = left.model_copy(update={"ran_while_paused": [gpu, cpu], "paused_cpu_windows": 1})
    assert [f.check for f in grade(both, TOL).flags] == ["leftover_gpu_work"]
    traced = both.model_copy(update={"pause_method": "ptrace"})
    assert [f.check for f in grade(traced, TOL).flags] == ["ran_while_paused"]


def test_a_candidate_that_could_not_be_paused_is_flagged_not_crashed():
    """A pause the candidate refused (a thread already traced) ends the evaluation there, the harness killing its
    process: the verdict names the refusal, not the kill."""
    why = "its thread 4242 is already traced (by pid 4243): the harness cannot pause it"
    refused = _passing(pause_error=why).model_copy(
        update={"candidate_exit": ChildExit(finished=False, signal="SIGTERM from the harness")})
    g = grade(refused, TOL)
    assert [f.check for f in g.flags] == ["pause_refused"] and why in g.message and g.verdict == Verdict.flagged
