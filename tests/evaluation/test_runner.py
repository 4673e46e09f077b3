"""End-to-end evaluations on the CPU at the problems' small sizes: each fixture gets its verdict.

Every failure class has a fixture that must be caught and an honest twin that must pass.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from harness import grading
from harness.config import Settings
from harness.evaluation import windows
from harness.evaluation.runner import EvalOptions, evaluate
from harness.problems.spec import ProblemSpec
from harness.schema import Tolerance
from harness.verdicts import Verdict

from ..conftest import SUBMISSIONS

ADVERSARIAL = Path(__file__).parents[1] / "fixtures" / "adversarial"


def test_staged_windows_take_inputs_made_before_them_and_pass_as_unstaged(settings, registry):
    """With the windows' inputs staged, no window of either side makes any (each process's own clock says so), every
    window follows a lead-in, the fingerprints and hand-overs of its outputs match the reference's, and the honest
    submission passes as it does unstaged (the CPU's default, with eager's windows in a process of its own)."""
    defaults = {name: f.default for name, f in Settings.model_fields.items()}
    assert defaults["window_inputs_staged_cpu"] and defaults["eager_process_cpu"] == "own"
    assert not defaults["window_inputs_staged_cuda"]
    staged = settings.model_copy(update={"window_inputs_staged_cpu": True})
    text = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), staged)
    assert r.verdict == Verdict.passed, r.message
    o = r.observations
    assert "lead_ins" in o.phases and o.windows_unstaged is None
    assert o.eager_timing is not None and o.candidate_timing is not None
    assert o.eager_timing.inputs_median_ms < 0.05 and o.candidate_timing.inputs_median_ms < 0.05
    check = o.timed_outputs
    assert check is not None and not check.fingerprint_mismatches and check.checked
    assert o.memory_plan is not None and o.memory_plan.phases_bytes["trusted_windows"] > 0


def test_both_sides_window_threads_kept_to_one_core_for_the_rounds_and_the_submission_still_passes(settings,
                                                                                                  registry):
    """With a timing core named, both processes are told it before the rounds (each keeps its window thread there,
    timing.pin_thread) and the honest submission passes as without; the observations name the core."""
    core = sorted(os.sched_getaffinity(0))[-1]
    kept = settings.model_copy(update={"timing_core": str(core)})
    text = (SUBMISSIONS / "l75_pytorch_correct.py").read_text()
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), kept)
    assert r.verdict == Verdict.passed, r.message
    assert r.observations.timing_core == core and r.observations.timing_core_refused is None


def test_correct_pure_pytorch_modelnew_passes_with_figures_and_timings(run_fixture):
    r = run_fixture("level2/75", "l75_pytorch_correct.py")
    assert r.verdict == Verdict.passed, r.message
    o = r.observations
    assert len(o.trials) == 6  # five on get_inputs(), one on the extra distribution
    assert [t.inputs for t in o.trials][-1] != o.trials[0].inputs
    for t in o.trials:
        (out,) = t.outputs
        assert out.got_shape == [1, 256, 128, 1] and out.max_abs_err is not None and out.max_abs_err <= 1e-4
        assert out.err_vs_fp64 is not None and out.ref_err_vs_fp64 is not None
    assert o.determinism is not None and o.determinism.bitwise_equal
    # The reference's parameters and buffers as built (a share before the memory plan, on a GPU): level2/75's small
    # Linear(256, 256), GroupNorm(8, 256) and bias of (1, 256, 1, 1); no reserve off CUDA.
    assert o.reference_parameter_bytes == 4 * (256 * 256 + 256 + 2 * 256 + 256) and o.memory_reserve_bytes is None
    assert o.candidate_timing is not None and o.candidate_timing.clock == "parent_window"
    assert o.candidate_timing.n == 3 and len(o.candidate_timing.windows_ms) == 3  # the test settings' windows
    assert o.eager_timing is not None and o.compile_timing is None  # compile baseline is off on CPU by default
    assert o.eager_timing.calls_per_window == o.candidate_timing.calls_per_window
    # The speedup that ranks is paired by round (windows.paired_ratio). Net of the empty window, a call this small can
    # come to 0 on a loaded 2-core host: then no speedup is claimed.
    assert o.eager_timing.paired_speedup is not None and o.eager_timing.paired_spread is not None
    assert r.speedup_vs_eager == (pytest.approx(o.eager_timing.paired_speedup)
                                  if o.candidate_timing.median_ms > 0 else None)
    check = o.timed_outputs  # every output of every window fingerprinted; of a few, two handed over whole
    calls, picks = o.candidate_timing.calls_per_window, min(2, o.candidate_timing.calls_per_window)
    assert len(check.fingerprint_ms) == len(check.reference_fingerprint_ms) == len(check.fingerprint_latency_ms) == \
        len(check.reference_fingerprint_own_ms) == 3
    assert check.fingerprinted == check.fingerprint_terms == 3 * calls and check.fingerprint_mismatches == []
    assert check.fingerprint_deviation < check.fingerprint_terms  # the reference itself: far inside the tolerance
    assert all(0 < ms < 1e4 for ms in check.fingerprint_ms + check.reference_fingerprint_ms +
               check.fingerprint_latency_ms + check.reference_fingerprint_own_ms)
    assert not check.reference_save_ms and not check.latency_ms  # the hand-over's time bound no more
    # The time re-made from what is stored (walls kept to 0.1 us): each window less the empty one, plus its charge.
    t = o.candidate_timing
    assert t.charged_ms == windows.fingerprint_charges(
        check.fingerprint_ms, check.fingerprint_latency_ms, check.reference_fingerprint_own_ms,
        grading.HANDOVER_LATENCY_CREDIT * windows.HANDOVER_SLACK_MS["cpu"])
    empty = t.overhead_ms * calls
    assert t.median_ms == pytest.approx(statistics.median(
        (max(w - empty, 0.0) + c) / calls for w, c in zip(t.windows_ms, t.charged_ms, strict=True)), abs=1e-4)
    # Eager's own process fingerprints as the candidate's does (the CPU's default): its windows pay that noise too.
    assert o.eager_process == "own"
    assert o.eager_timing.charged_ms == windows.honest_charges(check.reference_fingerprint_own_ms)
    assert len(check.handover_ms) == 3  # three windows, fewer than CHECKED_WINDOWS: each drawn with chance 1
    assert check.reported == check.expected == len(check.calls) == len(check.handover_ms) * picks
    assert all(c.outputs and c.outputs[0].max_abs_err == 0.0 for c in check.calls)
    assert o.state_dict is not None and set(o.state_dict.copied) == {
        "gemm.weight", "gemm.bias", "group_norm.weight", "group_norm.bias", "bias"}
    p = r.provenance
    assert p is not None and p.device == "cpu" and p.torch_version and p.harness_version
    assert r.problem.id == "gemm-groupnorm-min-biasadd" and r.problem.size == "small"
    # Where the wall time went, phase by phase in the order the parent waited for them, adding up to the
    # evaluation's wall time. Without a target the candidate starts after the probe, so the trusted side's
    # preparation runs during its import; the candidate constructs while the trusted side draws the parameters, and
    # takes them while it makes the trials.
    # Eager's own process, started beside the candidate, builds its model and makes its first calls beside the
    # trials and the judge, and is waited for once the judge has passed the candidate. The timed rounds' time is
    # split into the windows and the checks between them, in the order the first round drew its kinds, the warm-up
    # rounds' as theirs under names of their own first; the CPU's windows are staged, each after a lead-in.
    names = list(o.phases)
    assert names[:12] == ["reference_start", "probe", "reference_init", "candidate_import", "candidate_construct",
                          "reference_parameters", "candidate_parameters", "reference_prepare", "candidate_trials",
                          "judge", "eager_ready", "warmup_setup"]
    rounds = names[12:-3]
    warm = rounds[:max(i for i, n in enumerate(rounds) if n.startswith("warmup_") or n == "timing_warmup") + 1]
    assert {"timing_warmup", "warmup_windows", "warmup_lead_ins", "warmup_fingerprints"} <= set(warm) <= {
        "timing_warmup", "warmup_windows", "warmup_lead_ins", "warmup_idle_waits", "warmup_fingerprints",
        "warmup_pauses"}
    assert set(rounds[len(warm):]) == {"timed_windows", "lead_ins", "idle_waits", "fingerprints", "handovers",
                                       "pauses"}
    assert names[-3:] == ["peaks", "candidate_exit", "teardown"]
    assert all(v >= 0 for v in o.phases.values())
    assert o.phases["reference_start"] > 0.2 and o.phases["candidate_import"] > 0.2  # each imports torch
    assert sum(o.phases.values()) == pytest.approx(p.wall_s, abs=0.5)


def test_with_the_slots_target_the_candidate_starts_beside_the_trusted_side_and_still_passes(run_fixture, settings):
    from harness.evaluation.prebuild import probe_device

    target = probe_device("cpu", settings)
    r = run_fixture("level2/75", "l75_pytorch_correct.py", target=target)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    o = r.observations
    assert len(o.trials) == 6 and o.candidate_timing is not None and o.eager_timing is not None
    # The candidate imported torch while the trusted child did: the parent waited for only part of its import.
    assert o.candidate_import_s is not None and o.candidate_import_s > 0.5
    assert o.phases["candidate_import"] < o.candidate_import_s - 0.3, o.phases
    assert sum(o.phases.values()) == pytest.approx(r.provenance.wall_s, abs=0.5)


def test_a_stale_target_restarts_the_candidate_for_the_device_found_and_the_submission_still_passes(
        run_fixture, settings, caplog):
    from harness.evaluation.prebuild import probe_device

    stale = probe_device("cpu", settings).model_copy(update={"torch_version": "0.0.1"})
    with caplog.at_level("WARNING", logger="harness.runner"):
        r = run_fixture("level2/75", "l75_pytorch_correct.py", target=stale)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    assert r.provenance is not None and r.provenance.torch_version != "0.0.1"
    assert any("torch_version '0.0.1'" in m and "starts again" in m for m in caplog.messages), caplog.messages


def test_a_wrong_constructor_with_an_early_candidate_is_invalid_submission(run_fixture, settings):
    from harness.evaluation.prebuild import probe_device

    r = run_fixture("level2/30", "l30_wrong_signature.py", target=probe_device("cpu", settings))
    assert r.verdict == Verdict.invalid_submission, r.message
    assert r.observations.candidate_exit is None  # stopped before it constructed anything


def test_cpp_load_inline_modelnew_compiles_passes_and_is_built_once(run_fixture, settings):
    first = run_fixture("level2/30", "l30_cpp_correct.py", timing=False)
    assert first.verdict == Verdict.passed, first.message + first.log_excerpt
    sos = list(settings.builds_dir.glob("*/kh_test_hardtanh/*.so"))
    assert len(sos) == 1
    built_at = sos[0].stat().st_mtime_ns
    ninja_log = sos[0].parent / ".ninja_log"  # a line per compile or link ninja ran in this build dir
    edges = ninja_log.read_text()
    t0 = time.monotonic()
    second = run_fixture("level2/30", "l30_cpp_correct.py", timing=False)
    assert second.verdict == Verdict.passed
    assert sos[0].stat().st_mtime_ns == built_at, "an identical source was rebuilt"
    assert ninja_log.read_text() == edges, "the compiler ran again for an identical source"
    assert time.monotonic() - t0 < 30
    # The import phase (start to 'imported', parent's clock) held the build the first time only.
    assert first.observations.candidate_import_s is not None and second.observations.candidate_import_s is not None
    assert second.observations.candidate_import_s < first.observations.candidate_import_s


def test_the_torch_compile_baseline_compiles_the_reference_once_into_a_cache_only_the_trusted_side_sees(
        run_fixture, settings):
    from harness.sandbox import capabilities

    if not capabilities.platform().user_switch:
        pytest.skip("the shared compile cache needs sandbox uids (root with user and mount namespaces)")
    first = run_fixture("level2/30", "l30_pytorch_reads_compile_cache_env.py", compile_baseline="on")
    assert first.verdict == Verdict.passed, first.message + first.log_excerpt  # the candidate saw no cache dir
    assert first.observations.compile_timing is not None, first.observations.compile_baseline_error
    cache = settings.data_dir / "compile-cache"
    compiled = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.suffix in (".so", ".py")}
    assert compiled, "inductor left nothing in the trusted compile cache"
    second = run_fixture("level2/30", "l30_pytorch_reads_compile_cache_env.py", compile_baseline="on")
    assert second.verdict == Verdict.passed and second.observations.compile_timing is not None
    after = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.suffix in (".so", ".py")}
    assert after == compiled, "the second evaluation compiled the reference again instead of using the cache"


def test_without_a_sandbox_uid_the_trusted_side_gets_no_shared_compile_cache(settings, monkeypatch):
    from harness.evaluation import starts
    from harness.sandbox import capabilities

    confined = capabilities.Platform(root=True, netns=True, mountns=True, user_switch=True, cgroup=None)
    monkeypatch.setattr(capabilities, "platform", lambda: confined)
    assert starts.trusted_cache_env(settings)["TORCHINDUCTOR_CACHE_DIR"].startswith(str(settings.data_dir))
    assert starts.trusted_cache_env(settings.model_copy(update={"sandbox_user": "off"})) == {}
    same_uid = capabilities.Platform(root=False, netns=True, mountns=False, user_switch=False, cgroup=None)
    monkeypatch.setattr(capabilities, "platform", lambda: same_uid)
    assert starts.trusted_cache_env(settings) == {}


def test_cpp_that_does_not_compile_is_compile_error_with_the_compilers_message(run_fixture):
    r = run_fixture("level2/30", "l30_cpp_broken.py")
    assert r.verdict == Verdict.compile_error
    assert "undeclared_factor" in r.message and "error" in r.message
    assert "undeclared_factor" in r.log_excerpt


@pytest.mark.parametrize("name, got", [("l75_shape_b1.py", "(128, 1)"), ("l75_shape_bc.py", "(128, 256)")])
def test_level2_75_broadcast_traps_are_shape_mismatch_naming_both_shapes(run_fixture, name, got):
    r = run_fixture("level2/75", name)
    assert r.verdict == Verdict.shape_mismatch
    assert got in r.message and "(1, 256, 128, 1)" in r.message


def test_groupnorm_statistics_across_the_batch_is_wrong_answer_with_max_error(run_fixture):
    r = run_fixture("level2/62", "l62_groupnorm_across_batch.py")
    assert r.verdict == Verdict.wrong_answer
    assert "max abs err" in r.message and "max abs err" in r.log_excerpt
    assert r.observations.trials[0].outputs[0].max_abs_err > 1e-2


def test_affine_parameters_recreated_with_randn_under_new_names_receive_the_references_in_order(run_fixture):
    # Its forward applies GroupNorm's affine step with its own gn_gamma/gn_beta: the reference's tensors (drawn
    # fresh) reach them by their names' likeness, so the code is judged on what it computes, not on how it initialises.
    r = run_fixture("level2/88", "l88_randn_affine_renamed.py", timing=False)
    assert r.verdict == Verdict.passed, r.message
    sd = r.observations.state_dict
    assert sd.by_position == {"gn_gamma": "group_norm.weight", "gn_beta": "group_norm.bias"}
    assert not sd.not_copied and not sd.reference_unused


def test_a_kernel_that_drops_the_affine_step_is_wrong_answer_against_fresh_reference_parameters(run_fixture):
    r = run_fixture("level2/30", "l30_drops_affine.py", timing=False)
    assert r.verdict == Verdict.wrong_answer, r.message
    assert {"group_norm.weight", "group_norm.bias"} <= set(r.observations.state_dict.drawn)
    # The hole it closes: with the problem's own initialisation (GroupNorm's weight 1, bias 0) it passed.
    assert run_fixture("level2/30", "l30_drops_affine.py", timing=False,
                       fresh_parameters=False).verdict == Verdict.passed


def test_its_honest_twin_under_its_own_names_passes(run_fixture):
    r = run_fixture("level2/30", "l30_renamed_affine.py", timing=False)
    assert r.verdict == Verdict.passed, r.message
    assert r.observations.state_dict.by_position == {"fc.weight": "gemm.weight", "fc.bias": "gemm.bias",
                                                     "gamma": "group_norm.weight", "beta": "group_norm.bias"}


def test_a_wrong_answer_from_tensors_that_got_no_reference_values_names_them(run_fixture):
    # Parameters the harness cannot reach keep their own initialisation, which the fresh reference's no longer
    # equals: the verdict says which tensors got nothing.
    r = run_fixture("level2/30", "l30_stale_derived_weight.py", timing=False)
    assert r.verdict == Verdict.wrong_answer, r.message
    assert "w_t" in r.message and "drawn fresh" in r.message


def test_the_same_randn_parameters_under_the_reference_names_pass_thanks_to_the_state_dict_copy(run_fixture):
    r = run_fixture("level2/88", "l88_randn_affine_named.py", timing=False)
    assert r.verdict == Verdict.passed, r.message
    assert {"group_norm.weight", "group_norm.bias"} <= set(r.observations.state_dict.copied)


def test_guessed_hardtanh_range_is_wrong_answer(run_fixture):
    assert run_fixture("level2/30", "l30_guessed_hardtanh.py", timing=False).verdict == Verdict.wrong_answer


def test_honest_twin_of_the_failure_fixtures_passes(run_fixture):
    r = run_fixture("level2/30", "l30_pytorch_correct.py")
    assert r.verdict == Verdict.passed, r.message


def test_an_honest_kernel_far_slower_than_the_reference_passes_with_windows_sized_on_its_own_speed(run_fixture):
    # Sized on the reference's speed alone (about 1 ms a call here), a window of a kernel 250x slower runs past its
    # time limit: an honest kernel was `timeout`. The candidate's own one-call window bounds the windows first.
    r = run_fixture("level2/30", "l30_slow_correct.py")
    assert r.verdict == Verdict.passed, r.message
    t = r.observations.candidate_timing
    assert t is not None and t.calls_per_window is not None and t.calls_per_window <= 2
    assert t.median_ms > 200 and r.speedup_vs_eager is not None and r.speedup_vs_eager < 0.1  # about 1/250
    assert r.observations.windows_sized_down is None  # slow when timed too: its windows are as long as aimed at


def _no_process_matching(pattern: str) -> bool:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return out.stdout.strip() == ""


def test_infinite_loop_at_import_is_timeout_within_the_limit(run_fixture):
    t0 = time.monotonic()
    r = run_fixture("level2/30", "l30_hang_import.py", compile_timeout_s=8)
    elapsed = time.monotonic() - t0
    assert r.verdict == Verdict.timeout and "compile phase" in r.message
    assert elapsed < 8 + 15, elapsed  # limit + grace + process start-up


def test_an_import_that_hangs_with_no_compiler_running_costs_seconds_not_the_compile_limit(settings, registry,
                                                                                            tmp_path):
    idle = settings.model_copy(update={"import_idle_timeout_s": 8.0})
    t0 = time.monotonic()
    r = evaluate(registry.get("level2/30"), (SUBMISSIONS / "l30_hang_import.py").read_text(),
                 EvalOptions(device="cpu", size="small"), idle)  # the problem's compile limit: 600 s
    assert r.verdict == Verdict.timeout and "no compiler running" in r.message, r.message
    assert r.observations.candidate_exit.idle_s >= 8.0
    assert time.monotonic() - t0 < 8 + 20
    # Its honest twin: a load_inline build longer than that idle limit (a fresh build dir) runs on to a pass.
    fresh = idle.model_copy(update={"data_dir": tmp_path, "scratch_dir": tmp_path / "scratch"})
    source = (SUBMISSIONS / "l30_cpp_correct.py").read_text().replace("kh_test_hardtanh", "kh_test_idle_build")
    t0 = time.monotonic()
    r = evaluate(registry.get("level2/30"), source, EvalOptions(device="cpu", size="small", timing=False), fresh)
    assert r.verdict == Verdict.passed, r.message
    assert time.monotonic() - t0 > 8.0  # the build outlasted the idle limit


def test_infinite_loop_in_forward_is_timeout_and_the_whole_process_group_is_killed(run_fixture):
    t0 = time.monotonic()
    r = run_fixture("level2/30", "l30_hang_forward.py", run_timeout_s=5)
    assert r.verdict == Verdict.timeout and "correctness phase" in r.message
    assert time.monotonic() - t0 < 5 + 20
    assert _no_process_matching("sleep 1000"), "a grandchild survived the kill"


def test_os_exit_0_at_import_is_crashed_never_passed(run_fixture):
    r = run_fixture("level2/30", "l30_exit0_import.py")
    assert r.verdict == Verdict.crashed
    assert "code 0" in r.message and "compile phase" in r.message


def test_sys_exit_in_forward_is_crashed(run_fixture):
    r = run_fixture("level2/30", "l30_sysexit_forward.py")
    assert r.verdict == Verdict.crashed and "sys.exit(0)" in r.message


def test_segfault_is_crashed_with_the_signal(run_fixture):
    r = run_fixture("level2/30", "l30_segfault.py")
    assert r.verdict == Verdict.crashed
    assert "killed by SIGSEGV" in r.message or "killed by SIGBUS" in r.message, r.message


def test_python_exception_in_forward_is_runtime_error_with_traceback(run_fixture):
    r = run_fixture("level2/30", "l30_raises.py")
    assert r.verdict == Verdict.runtime_error
    assert "RuntimeError" in r.message and "correctness trial" in r.message
    assert "forward" in r.log_excerpt


def test_output_with_nan_is_wrong_answer(run_fixture):
    r = run_fixture("level2/30", "l30_nan.py")
    assert r.verdict == Verdict.wrong_answer and "NaN/Inf in 1 of" in r.message


def test_output_of_the_wrong_dtype_is_dtype_mismatch(run_fixture):
    r = run_fixture("level2/30", "l30_float64.py")
    assert r.verdict == Verdict.dtype_mismatch
    assert "float64" in r.message and "float32" in r.message


def test_output_that_changes_on_the_same_inputs_is_nondeterministic(run_fixture):
    r = run_fixture("level2/30", "l30_drifts_on_rerun.py")
    assert r.verdict == Verdict.nondeterministic, r.message


def test_global_tf32_switch_is_flagged_and_the_reference_is_unaffected(run_fixture):
    r = run_fixture("level2/30", "l30_tf32_flags.py")
    assert r.verdict == Verdict.flagged
    assert [f.check for f in r.flags] == ["global_torch_flags"]
    changed = {c.name for c in r.observations.flag_changes}
    assert {"cuda.matmul.allow_tf32", "float32_matmul_precision"} <= changed
    ref_flags = r.provenance.reference_torch_flags
    assert ref_flags["cuda.matmul.allow_tf32"] is False and ref_flags["float32_matmul_precision"] == "highest"


def test_wrong_constructor_signature_is_invalid_submission(run_fixture):
    r = run_fixture("level2/30", "l30_wrong_signature.py")
    assert r.verdict == Verdict.invalid_submission
    assert "ModelNew.__init__ takes (in_features, out_features)" in r.message


def test_raw_reply_is_extracted_and_evaluated(run_fixture):
    r = run_fixture("level2/30", "l30_reply_two_blocks.md", timing=False)
    assert r.verdict == Verdict.passed, r.message


def test_truncated_seed_reply_gets_invalid_submission_without_starting_a_process(run_fixture):
    r = run_fixture("level2/75", "../seeds/000_c9a2099a227291ba.txt")
    assert r.verdict == Verdict.invalid_submission and r.provenance is None
    # Nothing ran, so no size was chosen: the result says so rather than naming the default.
    assert run_fixture("level2/75", "../seeds/000_c9a2099a227291ba.txt", size="auto").problem.size == "n/a"


def test_stricter_tolerance_at_eval_time_is_recorded(run_fixture):
    r = run_fixture("level2/30", "l30_pytorch_correct.py", tolerance=Tolerance(atol=1e-6, rtol=1e-6), timing=False)
    assert r.tolerance.atol == 1e-6 and r.verdict == Verdict.passed


def test_scratch_dirs_are_removed_and_logs_kept(run_fixture, settings):
    r = run_fixture("level2/30", "l30_raises.py")
    assert list((settings.scratch_dir).iterdir()) == []
    job = r.job_dir
    assert job and os.path.exists(os.path.join(job, "candidate.log")) and os.path.exists(
        os.path.join(job, "result.json"))


def test_precompile_on_a_cpu_warms_the_build_cache_the_evaluation_then_uses(settings, run_fixture):
    from harness.evaluation.prebuild import precompile, probe_device

    source = (SUBMISSIONS / "l30_cpp_correct.py").read_text().replace("kh_test_hardtanh", "kh_test_precompiled")
    target = probe_device("cpu", settings)
    warmed = precompile(source, target, settings)
    assert warmed.ok, warmed.log_tail
    (so,) = settings.builds_dir.glob("*/kh_test_precompiled/*.so")
    built_at = so.stat().st_mtime_ns
    from harness.problems import get_registry

    r = evaluate(get_registry().get("level2/30"), source, EvalOptions(device="cpu", size="small", timing=False),
                 settings)
    assert r.verdict == Verdict.passed and so.stat().st_mtime_ns == built_at
    assert not precompile((SUBMISSIONS / "l30_cpp_broken.py").read_text(), target, settings).ok


def test_a_broken_problem_file_is_infra_error_not_the_submissions_fault(settings, tmp_path):
    from harness.problems import load_kernelbench_dir

    level = tmp_path / "level2"
    level.mkdir()
    (level / "1_Broken.py").write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")  # no get_inputs
    (spec,) = load_kernelbench_dir(level)
    r = evaluate(spec, (SUBMISSIONS / "l30_pytorch_correct.py").read_text(), EvalOptions(device="cpu"), settings)
    assert r.verdict == Verdict.infra_error and not r.verdict.is_submission_fault
    assert "get_inputs" in r.message + r.log_excerpt


@pytest.mark.parametrize("problem", ["level2/75", "level2/62", "level2/37", "level2/94", "level2/30", "level2/88"])
def test_every_builtin_problem_passes_its_own_reference_renamed_modelnew_on_cpu(settings, problem):
    from harness.problems import get_registry

    spec = get_registry().get(problem)
    source = spec.source().replace("class Model(", "class ModelNew(")
    r = evaluate(spec, source, EvalOptions(device="cpu", size="small"), settings)
    assert r.verdict == Verdict.passed, r.message
    assert r.problem.size == "small"
    # A speedup, unless the host was too busy for one: a time within its windows' noise is marked, not ranked.
    assert r.speedup_vs_eager is not None or "timing_unreliable" in [f.check for f in r.flags]


def _stochastic_problem():
    from harness.problems.registry import get_registry

    return get_registry(SUBMISSIONS.parent / "problems").get("level2/66")


def test_a_stochastic_reference_resubmitted_as_itself_passes_with_both_sides_seeded_alike(settings):

    spec = _stochastic_problem()
    source = spec.source().replace("class Model(", "class ModelNew(")
    r = evaluate(spec, source, EvalOptions(device="cpu", compile_baseline="off"), settings)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    assert r.observations.stochastic_reference is True
    assert r.observations.timed_outputs.calls  # timed outputs matched too: the windows' calls were seeded alike


def test_skipping_a_stochastic_references_dropout_is_wrong_answer(settings):

    text = (SUBMISSIONS / "l66_skips_dropout.py").read_text()
    r = evaluate(_stochastic_problem(), text, EvalOptions(device="cpu", compile_baseline="off"), settings)
    assert r.verdict == Verdict.wrong_answer, r.message


def test_a_deterministic_reference_is_not_called_stochastic(run_fixture):
    r = run_fixture("level2/30", "l30_pytorch_correct.py", timing=False)
    assert r.verdict == Verdict.passed and r.observations.stochastic_reference is False


def test_a_reference_with_no_float64_twin_is_judged_without_the_ground_truth(settings):
    """KernelBench level3/44 holds a layer in a lambda, so its float64 copy still calls the float32 layer and fails:
    the ground truth is a diagnostic, so the evaluation goes on without it (it was an infra_error)."""
    from harness.problems.registry import get_registry

    spec = get_registry(SUBMISSIONS.parent / "problems").get("level3/44")
    source = spec.source().replace("class Model(", "class ModelNew(") + "\nModel = ModelNew\n"
    r = evaluate(spec, source, EvalOptions(device="cpu", timing=False), settings)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    (out,) = r.observations.trials[0].outputs
    assert out.max_abs_err == 0.0 and out.err_vs_fp64 is None


_RELU = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
batch_size = {batch}
dim = 4096
def get_inputs():
    return [torch.rand(batch_size, dim)]
def get_init_inputs():
    return []
"""


@pytest.fixture
def small_scratch(settings, tmp_path):
    """Settings whose scratch dir is a 24 MiB tmpfs (root only: skipped where mounting is not allowed)."""
    mount = tmp_path / "scratch"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield settings.model_copy(update={"scratch_dir": mount})
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_size_whose_trial_files_would_not_fit_the_scratch_disk_writes_none(small_scratch, tmp_path):
    """KernelBench's level1 files at their own size wrote 90 GB of trial inputs and outputs, refused on a 64 GB disk.
    Trial data goes through shared memory now: 6 trials of 2 MiB in and 2 MiB out (24 MiB, which filled a 24 MiB
    scratch disk) pass there, and no trial file is written."""
    from harness.problems import load_kernelbench_dir

    level = tmp_path / "level1"
    level.mkdir()
    (level / "19_ReLU.py").write_text(_RELU.format(batch=128))
    (spec,) = load_kernelbench_dir(level)
    source = spec.source().replace("class Model(", "class ModelNew(")
    r = evaluate(spec, source, EvalOptions(device="cpu", compile_baseline="off"), small_scratch)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt


def test_no_trial_file_is_written_in_an_evaluation(settings, registry, monkeypatch):
    """Init arguments, parameters, inputs, outputs, hand-overs: all through shared memory. Every file either child
    opens for writing under the evaluation's dirs is recorded (the scratch dir is watched as it runs)."""
    import threading

    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for root in (settings.scratch_dir, settings.data_dir):
                for dirpath, _, files in os.walk(root):
                    seen.update(os.path.join(dirpath, f) for f in files if f.endswith(".pt"))
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        spec = registry.get("level2/75")
        r = evaluate(spec, (ADVERSARIAL / "exchange_scribbler_honest.py").read_text(),
                     EvalOptions(device="cpu", size="small"), settings)
    finally:
        stop.set()
        thread.join()
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    assert r.observations.timed_outputs is not None and r.observations.timed_outputs.checked
    assert seen == set()


@pytest.mark.parametrize("name", ["exchange_scribbler.py", "exchange_scribbler_honest.py"])
def test_writing_into_the_exchange_after_a_reply_changes_no_verdict_of_its_outputs(settings, registry, name):
    """A candidate that zeroes its output and hand-over segments after each reply, tries to shrink them and to write
    the next trial's inputs, is judged as its honest twin: on the trusted side's copies, taken while it is paused;
    a segment cannot shrink under the trusted side (sealed), and would read short rather than fault if it could."""
    r = evaluate(registry.get("level2/75"), (ADVERSARIAL / name).read_text(), EvalOptions(device="cpu", size="small"),
                 settings)
    # Correct either way; the scribbler's means (gc, raw descriptors) are the static pre-check's to flag, apart.
    static = {f.rule for f in r.observations.static_findings}
    assert r.verdict == (Verdict.flagged if static else Verdict.passed), r.message + r.log_excerpt
    assert r.message.startswith("correct") or r.verdict == Verdict.passed, r.message
    assert all(o.mismatches_at_eval_tolerance == 0 for t in r.observations.trials for o in t.outputs)
    assert r.observations.determinism is not None and r.observations.determinism.bitwise_equal
    assert r.observations.timed_outputs is not None and r.observations.timed_outputs.checked
    assert all(c.structure_error is None and c.file_error is None for c in r.observations.timed_outputs.calls)


def _relu_copy(tmp_path: Path) -> tuple[ProblemSpec, str]:
    """KernelBench's level1/19 (ReLU) at batch 256 (inputs and outputs of 4 MiB), and its reference as ModelNew."""
    from harness.problems import load_kernelbench_dir

    level = tmp_path / "level1"
    level.mkdir()
    (level / "19_ReLU.py").write_text(_RELU.format(batch=256))
    (spec,) = load_kernelbench_dir(level)
    return spec, spec.source().replace("class Model(", "class ModelNew(")


def test_trial_outputs_the_harness_asks_for_are_never_counted_against_the_candidates_disk_share(settings, tmp_path):
    """KernelBench's level1/54 at its own size (976 MB outputs) was killed on an H100 for writing 8199 MiB, over its
    8192 MiB share: the 7 trial outputs and a hand-over that the harness itself asked it to keep. The share grows by
    what the harness asks to be kept, and judged outputs are removed. Here: 7 outputs of 4 MiB against an 8 MiB
    share; the honest reference passes. The exploit that fills the disk on its own (test_containment) is still
    killed, and its verdict names the limit."""
    spec, source = _relu_copy(tmp_path)
    tight = settings.model_copy(update={"child_disk_mb": 8})
    r = evaluate(spec, source, EvalOptions(device="cpu", compile_baseline="off"), tight)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    assert "killed" not in (r.observations.log_tail or "")


def test_outputs_larger_than_the_largest_file_a_candidate_may_write_are_exchanged_in_memory(settings, tmp_path):
    """KernelBench's level3/17 at its own size has outputs of 4.3 GB, over the candidate's 4 GiB file-size limit
    (RLIMIT_FSIZE): saved as files they were the harness's limit. In shared memory they are no file: outputs of
    4 MiB pass under a 2 MiB file-size limit."""
    spec, source = _relu_copy(tmp_path)
    small_files = settings.model_copy(update={"child_file_mb": 2})
    r = evaluate(spec, source, EvalOptions(device="cpu", compile_baseline="off"), small_files)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt


def test_a_commands_deadline_covers_writing_the_outputs_it_saves():
    """KernelBench's level2/19 at its own size saves 7 trial outputs of 2.2 GB: its honest reference, resubmitted,
    was a `timeout` on an H100 after the 30 s floor (50 x its 7 calls' time is a few seconds). The time to write
    what a command saves, at 100 MB/s, is added; small outputs keep the floor; the problem's run limit caps it."""
    from harness.evaluation.runner import command_deadline

    assert command_deadline(30.0, 7, 20.0, 7 * 64 << 10, 300.0) == 30.0
    assert command_deadline(30.0, 7, 20.0, 7 * 2_200_000_000, 300.0) == pytest.approx(7 + 154)
    assert command_deadline(30.0, 7, 20.0, 70 * 2_200_000_000, 300.0) == 300.0


def test_a_device_budget_too_small_for_what_the_harness_keeps_shrinks_it_and_one_smaller_is_too_large(settings,
                                                                                                     tmp_path):
    """The memory plan on the host, its device budget set (HARNESS_DEVICE_MEMORY_BUDGET_MB, for a GPU shared with
    other work): KernelBench's ReLU at batch 256 (4 MiB in and out a call). Where what the harness keeps does not fit,
    it keeps no trial to the judge, computes the float64 truth on the host and holds fewer calls a window, and the
    honest reference still passes; below the least it needs, the verdict is the harness's limit, with its figures."""
    from harness.evaluation import memory_plan as mp

    spec, source = _relu_copy(tmp_path)
    mib = 1 << 20
    relu = mp.Footprint(inputs=4 * mib, inputs_f64=8 * mib, outputs=4 * mib, outputs_f64=8 * mib, parameters=0,
                        parameters_f64=0, forward_work=4 * mib, trials=6, calls_wanted=128, keep_bytes=8 << 30,
                        compare_slice=1 << 26, fingerprint_chunk=256 * mib, device="cpu", judge_ahead=True,
                        windows_staged=settings.windows_staged("cpu"))
    two_calls = mp.needs(relu, mp.Choice(0, "host", 2), None, 0)[0]
    least = mp.needs(relu, mp.Choice(0, "host", 1), None, 0)[0]
    shrunk = settings.model_copy(update={"device_memory_budget_mb": two_calls // mib, "device_memory_reserve_mb": 0})
    r = evaluate(spec, source, EvalOptions(device="cpu", compile_baseline="off"), shrunk)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    plan = r.observations.memory_plan
    assert plan is not None and plan.fits and plan.budget_bytes == two_calls and plan.free_bytes is None
    assert (plan.input_bytes, plan.output_bytes, plan.truth_bytes, plan.forward_work_bytes, plan.calls_wanted) == (
        4 * mib, 4 * mib, 8 * mib, 4 * mib, 128)  # what the trusted side saw is what was counted by hand
    assert (plan.trials_kept, plan.truth, plan.calls_per_window) == (0, "host", 2)
    # Judging ahead goes first (on the host its comparison's temporaries are 112 MiB beside the trials).
    assert [s.split(" ")[0] for s in plan.shrunk] == ["the", "trials", "float64", "calls"]
    from harness.cli.eval import render  # `harness eval`'s report says the plan

    assert f"memory:     {plan.message}" in render(r) and "0 of 6 trials kept to the judge" in render(r)
    assert r.observations.candidate_timing is not None and r.observations.candidate_timing.calls_per_window <= 2
    for t in r.observations.trials:  # exact: a truth on the host is made only for an output outside the tolerance
        assert t.outputs[0].max_abs_err == 0 and t.outputs[0].err_vs_fp64 is None
    assert "no float64 truth made" in render(r)
    tight = settings.model_copy(update={"device_memory_budget_mb": least // mib - 1, "device_memory_reserve_mb": 0})
    r = evaluate(spec, source, EvalOptions(device="cpu", compile_baseline="off"), tight)
    assert r.verdict == Verdict.infra_error, r.message + r.log_excerpt
    assert r.observations.memory_plan is not None and not r.observations.memory_plan.fits
    assert r.observations.trials == []  # said before the candidate's first trial
    assert f"too large for this device's memory: needs {least / (1 << 30):.2f} GiB" in r.message
    assert "capped at" in r.message and "already shrunk: the outputs that compute nothing" in r.message


_SLOW_TO_BUILD = '''import time
import torch


class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        time.sleep(1.5)  # a network whose layers take seconds to build
        self.lin = torch.nn.Linear(n, n)

    def forward(self, x):
        return self.lin(x)


def get_inputs():
    return [torch.rand(4, 16)]


def get_init_inputs():
    return [16]
'''


def _slow_to_build(tmp_path: Path) -> ProblemSpec:
    from harness.problems import load_kernelbench_dir

    level = tmp_path / "level1"
    level.mkdir()
    (level / "1_SlowToBuild.py").write_text(_SLOW_TO_BUILD)
    (spec,) = load_kernelbench_dir(level)
    return spec


def test_the_candidate_constructs_beside_the_references_build(settings, tmp_path):
    """The init arguments are written before the reference Model is built, so a cold evaluation's candidate builds its
    own beside it (level3/11 on the CPU waited 1.9 s). A reference that takes 1.5 s to build, and its own copy as the
    candidate: the wait for the init arguments holds no build (it held the whole 1.5 s when they came after it), and
    the reference's parameters, counted with the parameters' message now, are still in the observations."""
    spec = _slow_to_build(tmp_path)
    source = _SLOW_TO_BUILD.replace("class Model(", "class ModelNew(")
    r = evaluate(spec, source, EvalOptions(device="cpu", size="default", timing=False), settings)
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt
    o = r.observations
    assert o.phases["reference_init"] < 1.0, o.phases
    assert o.reference_parameter_bytes == 4 * (16 * 16 + 16)


def test_a_candidate_out_of_device_memory_in_its_constructor_still_finds_the_references_parameters_counted(
        settings, tmp_path):
    """Whose failure a device OOM before the memory plan is counts the reference's parameters (grading: twice them and
    the reserve); they are counted once the reference is built, which now goes on beside the candidate's construct.
    A constructor that fails as an OOM waits for that count; one that fails otherwise does not."""
    spec = _slow_to_build(tmp_path)
    for raised, counted in (("torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')", True),
                            ("ValueError('no such layer')", False)):
        source = _SLOW_TO_BUILD.replace("class Model(", "class ModelNew(").replace(
            "        time.sleep(1.5)", f"        raise {raised}")
        r = evaluate(spec, source, EvalOptions(device="cpu", size="default", timing=False), settings)
        assert r.verdict == Verdict.runtime_error, r.message
        assert (r.observations.reference_parameter_bytes == 4 * (16 * 16 + 16)) == counted, raised
