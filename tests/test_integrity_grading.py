"""Grading of the integrity checks from stored figures: each check's catch and its honest twin.

The submissions that trigger these live in tests/fixtures/adversarial (see tests/sandbox/corpus.py);
here the boundaries are pinned down without processes or a GPU.
"""

from __future__ import annotations

from harness.grading import grade
from harness.reporting import Scored, leaderboard
from harness.schema import (
    ChildExit,
    KernelTrace,
    Observations,
    OutputFigures,
    SpeedOfLight,
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


def test_envelope_flags_a_report_its_own_clock_contradicts_and_passes_an_honest_one():
    env = TimingEnvelope(wall_ms=100 * 3.0 + 120 * 0.3, calls=100, overhead_calls=20, loop_ms=0.3)
    assert abs(env.implied_ms() - 3.0) < 1e-9
    assert _checks(_passing(candidate_timing=_timing(0.001), envelope=env)) == (Verdict.flagged, ["timing_envelope"])
    assert _checks(_passing(candidate_timing=_timing(0.2), envelope=env)) == (Verdict.flagged, ["timing_envelope"])
    assert _checks(_passing(candidate_timing=_timing(2.9), envelope=env))[0] == Verdict.passed
    # A 3x discrepancy is within what a busy host's wall clock can add: not evidence (see ENVELOPE_FACTOR).
    assert _checks(_passing(candidate_timing=_timing(1.0), envelope=env))[0] == Verdict.passed
    # Without the trusted side's calibration (the reference was not timed) nothing can be said.
    uncalibrated = env.model_copy(update={"loop_ms": None})
    assert _checks(_passing(candidate_timing=_timing(0.001), envelope=uncalibrated))[0] == Verdict.passed


def test_envelope_lets_an_honest_fast_kernel_through_a_hiccup_of_the_host():
    # 100 calls of 0.05 ms in a 0.3 ms loop, and 150 ms of the host doing something else meanwhile.
    env = TimingEnvelope(wall_ms=100 * 0.05 + 120 * 0.3 + 150, calls=100, overhead_calls=20, loop_ms=0.3)
    assert _checks(_passing(candidate_timing=_timing(0.05), envelope=env))[0] == Verdict.passed


def test_envelope_flags_a_report_of_fewer_calls_than_asked():
    env = TimingEnvelope(wall_ms=400, calls=100, overhead_calls=20, loop_ms=0.3)
    verdict = _checks(_passing(candidate_timing=_timing(3.0, n=10), envelope=env))
    assert verdict == (Verdict.flagged, ["timing_envelope"])


def test_speed_of_light_flags_the_impossible_and_passes_a_kernel_at_the_floor():
    # 2*1024*8192*8192 FLOP at 800 TFLOP/s is 0.172 ms; 64 MiB at 3 TB/s is 0.022 ms.
    sol = SpeedOfLight(flops=2 * 1024 * 8192 * 8192, min_bytes=64 << 20, flops_per_s=800e12, bytes_per_s=3e12)
    assert abs(sol.floor_ms() - 0.1718) < 1e-3
    assert _checks(_passing(candidate_timing=_timing(0.05), speed_of_light=sol)) == (Verdict.flagged,
                                                                                      ["speed_of_light"])
    assert _checks(_passing(candidate_timing=_timing(0.17), speed_of_light=sol))[0] == Verdict.passed
    # A tiny honest kernel whose median is ~0 once the empty-call overhead is taken off: judged on its raw median.
    tiny = SpeedOfLight(flops=2e6, min_bytes=1e6, flops_per_s=800e12, bytes_per_s=3e12)  # floor 0.33 us
    zeroed = _timing(0.0).model_copy(update={"raw_median_ms": 0.021})
    assert _checks(_passing(candidate_timing=zeroed, speed_of_light=tiny))[0] == Verdict.passed
    no_op = _timing(0.0).model_copy(update={"raw_median_ms": 0.021})
    assert _checks(_passing(candidate_timing=no_op, speed_of_light=sol)) == (Verdict.flagged, ["speed_of_light"])


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
    assert _checks(_passing(kernels=KernelTrace(names=None, error="no CUPTI"))) == (Verdict.passed, [])

    rows = [Scored(submission_id=1, problem_id="p", submitter="a", model="m", verdict="passed", device="cuda",
                   speedup_vs_eager=1.0, unranked=True),
            Scored(submission_id=2, problem_id="p", submitter="b", model="m", verdict="passed", device="cuda",
                   speedup_vs_eager=1.2)]
    assert [r.submitter for r in leaderboard(rows)] == ["b"]
