"""`harness bench throughput`: distinct variants, serial and pipelined modes through the worker, consistent figures."""

from __future__ import annotations

import json
import subprocess

import pytest
from rich.console import Console

from harness.cli.bench import render
from harness.problems import UnknownProblem, get_registry
from harness.service import throughput
from harness.service.throughput import ModeReport
from harness.submission import extract

from .conftest import REPO, harness_cmd, service_env


def _extension_sources(text: str) -> list[str]:
    """The raw strings of a submission (its C++/CUDA sources), in order."""
    return text.split('r"""')[1:]


def test_cuda_variants_cycle_the_reference_solutions_and_every_extension_source_differs():
    registry = get_registry()
    variants = throughput.make_variants(8, "cuda", registry, REPO / "reference_solutions", run_tag="t")
    templates = throughput.reference_templates(REPO / "reference_solutions", registry)
    assert len(templates) == 6
    assert [v.origin for v in variants] == [name for _, name, _ in templates] + [templates[0][1], templates[1][1]]
    assert len({v.text for v in variants}) == 8
    first, seventh = variants[0], variants[6]  # the same reference solution, varied twice
    for a, b in zip(_extension_sources(first.text), _extension_sources(seventh.text), strict=True):
        assert a != b  # the .cu and the .cpp both differ: each variant is a build of its own
    assert "// kernelharness bench variant 1 of 8 (run t)" in first.text
    one = throughput.make_variants(3, "cuda", registry, REPO / "reference_solutions", problems=["level2/75"])
    assert [v.spec.kernelbench_id for v in one] == ["level2/75"] * 3 and len({v.text for v in one}) == 3
    with pytest.raises(UnknownProblem, match="unknown problem 'level2/1'"):  # no built-in: see --problems-dir
        throughput.make_variants(3, "cuda", registry, REPO / "reference_solutions", problems=["level2/1"])


def test_cpu_variants_are_distinct_cpp_only_submissions_for_one_problem():
    variants = throughput.make_variants(3, "cpu", get_registry())
    assert len({v.text for v in variants}) == 3
    assert {v.spec.kernelbench_id for v in variants} == {"level2/30"}
    assert all("cuda_sources" not in v.text and "load_inline" in v.text for v in variants)


KERNELBENCH = REPO / "tests" / "fixtures" / "kernelbench"  # level1/19, level2/30 and level3/1 among others


def test_a_problem_without_a_reference_solution_gets_distinct_aa_copies_of_its_own_reference():
    registry = get_registry(KERNELBENCH)
    variants = throughput.make_variants(4, "cuda", registry, problems=["level1/19", "level3/1"], run_tag="t")
    assert [(v.spec.id, v.aa) for v in variants] == [("level1/19", True), ("level3/1", True)] * 2
    assert len({v.text for v in variants}) == 4
    for v in variants:
        assert v.spec.source_path.is_relative_to(KERNELBENCH) and v.origin == f"A/A copy of {v.spec.id}'s reference"
        assert v.text.startswith("# kernelharness bench variant ") and f"A/A copy of {v.spec.id}'s" in v.text
        # The reference itself as ModelNew, whole: what the candidate's child imports.
        assert v.spec.source().rstrip() in extract(v.text).source and "class ModelNew(Model)" in v.text
        assert not any(m in v.text for m in ("load_inline", "cpp_extension", "load("))  # the worker builds nothing
    assert "# kernelharness bench variant 3 of 4 (run t): A/A copy of level1/19's reference" in variants[2].text
    with pytest.raises(UnknownProblem, match=r"unknown problem 'level1/190'; did you mean: .*level1/19"):
        throughput.make_variants(2, "cuda", registry, problems=["level1/19", "level1/190"])


def test_with_a_problems_dir_a_problem_keeps_its_reference_solution_and_the_folder_s_file(tmp_path):
    """The rule: a named problem resolves with the folder winning over a built-in of its id; its submissions are its
    reference solution's variants (CUDA) where --solutions-dir has one for that id, else its A/A copies."""
    registry = get_registry(KERNELBENCH)  # the folder has level2/30 (a built-in too), not level2/75
    variants = throughput.make_variants(3, "cuda", registry, problems=["level2/30", "level2/75", "level1/19"])
    (l30, l75, l19) = variants
    assert (l30.spec.source_path.parent, l30.origin, l30.aa) == \
        (KERNELBENCH / "level2", "level2_30_gemm_groupnorm_hardtanh.py", False)
    assert l75.spec.builtin and l75.origin == "level2_75_gemm_groupnorm_min_biasadd.py" and not l75.aa
    assert "// kernelharness bench variant 2 of 3" in l75.text and l19.aa
    assert throughput.make_variants(1, "cuda", registry, problems=["gemm-groupnorm-min-biasadd"])[0].origin == \
        l75.origin  # a built-in named by its slug finds its solution too
    # No solution for the id (an empty --solutions-dir), or the CPU (the solutions are CUDA): the A/A copy.
    assert all(v.aa for v in throughput.make_variants(2, "cuda", registry, tmp_path, problems=["level2/30"]))
    assert all(v.aa for v in throughput.make_variants(2, "cpu", registry, problems=["level2/75", "level1/19"]))


def test_aa_copies_run_the_warm_mode_alone_and_refuse_the_modes_that_measure_builds():
    registry = get_registry(KERNELBENCH)
    solutions = throughput.make_variants(2, "cuda", registry, problems=["level2/75"])
    mixed = throughput.make_variants(2, "cuda", registry, problems=["level2/75", "level1/19"])
    assert throughput.default_modes(solutions) == ("serial", "pipelined", "warm")
    assert throughput.default_modes(mixed) == ("warm",)
    throughput.check_modes(["serial", "pipelined", "warm"], solutions)
    throughput.check_modes(["warm"], mixed)
    with pytest.raises(ValueError, match=r"the serial and pipelined modes measure load_inline builds, and the "
                                         r"submissions of level1/19 \(A/A copies.*--modes warm"):
        throughput.check_modes(["serial", "pipelined", "warm"], mixed)
    with pytest.raises(ValueError, match="the pipelined mode measure"):
        throughput.check_modes(["pipelined"], mixed)


def _evaluation(problem: str, seconds: float, warm: bool, speedup: float | None = None) -> dict:
    return {"problem": problem, "seconds": seconds, "verdict": "passed", "flags": [], "speedup_vs_eager": speedup,
            "trusted_warm": warm, "candidate_ahead": warm, "phases": {}, "windows": {}}


def test_each_problem_s_median_is_over_its_evaluations_with_the_trusted_process_warm():
    records = [_evaluation("level1/19", 20.0, False, 0.99), _evaluation("level1/19", 1.0, True, 1.01),
               _evaluation("level1/19", 3.0, True, 1.0), _evaluation("level1/19", 2.0, True, 0.98),
               _evaluation("level3/1", 9.0, False), _evaluation("level3/1", 2.4, True),
               _evaluation("level2/75", 8.0, False)]
    figures = throughput.problem_figures(records)
    assert list(figures) == ["level1/19", "level2/75", "level3/1"]
    assert figures["level1/19"].model_dump() == {"evaluations": 4, "warm": 3, "median_warm_s": 2.0,  # not the cold 20
                                                 "speedups_vs_eager": [0.99, 1.01, 1.0, 0.98]}
    assert figures["level3/1"].median_warm_s == 2.4
    assert figures["level2/75"].model_dump() == {"evaluations": 1, "warm": 0, "median_warm_s": None,  # its cold one
                                                 "speedups_vs_eager": []}
    warm = _mode("warm", 60.0, submissions=7, verdicts={"passed": 7}, evaluations=records, per_problem=figures)
    rep = throughput.ThroughputReport(device="cuda", device_name="H200", n=7, distinct_sources=7, origins=["x"],
                                      arch_list=None, modes=[warm])
    assert throughput.ThroughputReport.model_validate_json(rep.model_dump_json()).modes[0].per_problem == figures
    console = Console(record=True, width=160)
    render(rep, console)
    out = console.export_text()
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines()
            if line.startswith("│ level")}
    assert rows == {"level1/19": "2.00 (3 of 4)", "level2/75": "- (0 of 1)", "level3/1": "2.40 (1 of 2)"}
    # With each evaluation's speedup over eager beside it (an A/A copy's: its A/A), of all four.
    assert "bar: level1/19 median warm evaluation 2.00 s <= 2.5 s: met; vs eager 0.980x-1.010x, median 0.995x" in out
    assert "bar: level3/1 median warm evaluation 2.40 s <= 2.5 s: met" in out
    assert "bar: level2/75 median warm evaluation - <= 2.5 s: no warm evaluation (give -n at least 2" in out
    slow = throughput.problem_figures([_evaluation("level3/1", 9.0, False), _evaluation("level3/1", 2.6, True)])
    console = Console(record=True, width=160)
    render(rep.model_copy(update={"modes": [warm.model_copy(update={"per_problem": slow})]}), console)
    assert "bar: level3/1 median warm evaluation 2.60 s <= 2.5 s: NOT met" in console.export_text()


def test_a_template_without_an_extension_header_cannot_be_varied():
    with pytest.raises(ValueError, match=r"torch/extension\.h"):
        throughput.make_variant("class ModelNew: pass\n", "1")


def _mode(mode: str, wall: float, **kw) -> ModeReport:
    fields = dict(compile_workers=0, submissions=32, verdicts={"passed": 32}, wall_s=wall, compile_s=0.0,
                  compile_where="", slot_s=0.0, slot_import_s=0.0, device_s=0.0, device_busy_fraction=0.0,
                  evals_per_hour=32 * 3600 / wall, children_cpu_s=0.0)
    return ModeReport(mode=mode, **{**fields, **kw})


def test_bar_is_the_slower_stage_with_25_percent_slack_and_five_times_serial():
    serial = _mode("serial", 1000.0)
    # compile 640 s over 8 workers = 80 s < a device stage of 150 s: the bound is 150 s, the wall may be 187.5 s.
    met = throughput.bar_check(serial, _mode("pipelined", 187.5, compile_workers=8, compile_s=640.0, slot_s=150.0))
    assert met.stage_bound_s == 150.0 and met.wall_ok and met.speedup == pytest.approx(1000 / 187.5) and met.speedup_ok
    slow = throughput.bar_check(serial, _mode("pipelined", 210.0, compile_workers=2, compile_s=320.0, slot_s=150.0))
    assert slow.stage_bound_s == 160.0 and not slow.wall_ok and not slow.speedup_ok
    alone = throughput.bar_check(None, _mode("pipelined", 187.5, compile_workers=8, compile_s=640.0, slot_s=150.0))
    assert alone.wall_ok and alone.speedup is None and alone.speedup_ok is None  # a cold batch, no serial run


def _ninja_outputs(build_root) -> dict[str, list[str]]:
    """Per build dir, the outputs ninja built (one line per edge run, over every build in that dir)."""
    out = {}
    for log in build_root.glob("*/*/.ninja_log"):
        lines = [ln.split("\t") for ln in log.read_text().splitlines() if ln and not ln.startswith("#")]
        out[log.parent.parent.name] = [parts[3] for parts in lines]
    return out


@pytest.mark.slow
def test_bench_throughput_on_cpu_evaluates_every_variant_in_each_mode(svc_settings, tmp_path):
    """Serial on a sample of 2, pipelined on all 4, then warm on the same 4 (their builds cached): six C++ builds
    and ten evaluations, about three minutes on a 2-core machine."""
    work, out = tmp_path / "bench", tmp_path / "report.json"
    p = subprocess.run(harness_cmd("bench", "throughput", "-n", "4", "--serial-n", "2", "--device", "cpu",
                                   "--work-dir", str(work), "--json", str(out)),
                       env=service_env(svc_settings, COLUMNS="160"), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    assert "evaluations per hour" in p.stdout and "bar: pipelined" in p.stdout
    assert "serial mode on the first 2 of the 4" in p.stdout

    rep = throughput.ThroughputReport.model_validate_json(out.read_text())
    assert rep.device == "cpu" and rep.n == 4 and rep.serial_n == 2 and rep.distinct_sources == 4
    serial, pipelined, warm = rep.modes
    assert (serial.mode, serial.compile_workers) == ("serial", 0)
    assert pipelined.mode == "pipelined" and pipelined.compile_workers >= 1
    assert warm.mode == "warm" and rep.bar.warm_evals_per_hour == pytest.approx(warm.evals_per_hour)
    assert "bar: warm evaluations per hour" in p.stdout
    # One problem on the CPU: each mode's slot starts its trusted process once and keeps it for the three after.
    assert len(pipelined.trusted_warm_s) == len(warm.trusted_warm_s) == 3
    assert warm.trusted_warm_per_hour() == pytest.approx(3600 / sorted(warm.trusted_warm_s)[1])
    assert "warm: 3 evaluations with the trusted process warm, median" in p.stdout
    for m, count in zip(rep.modes, (2, 4, 4), strict=True):
        assert m.submissions == count and m.verdicts == {"passed": count}, m.verdicts
        assert m.wall_s > 0 and m.evals_per_hour == pytest.approx(count * 3600 / m.wall_s)
        assert 0 <= m.device_busy_fraction <= 1
        assert m.device_s == pytest.approx(m.slot_s - m.slot_import_s)
        assert 0 < m.slot_s <= m.wall_s * (1 + 1e-6)  # one slot: its evaluations never overlap
        assert m.compile_s > 0 and m.children_cpu_s > 0
        # The evaluations' phases add up to the device stage (each evaluation's phases to its wall time).
        # (The parent waits for the candidate's import after the trusted side's preparation: often not at all.)
        assert m.phases_s["candidate_import"] >= 0 and m.phases_s["timed_windows"] > 0
        assert sum(m.phases_s.values()) == pytest.approx(m.slot_s, rel=0.1, abs=1.0)
        assert f"{m.mode}: evaluation phases, s summed over {count}" in p.stdout
        # Serial and pipelined have a cache of their own, and in each every variant was built exactly once: in serial
        # mode by its evaluation, in pipelined mode by the pool (its evaluation found the build dir ready); the warm
        # mode found the pipelined mode's builds and built nothing again.
        built = _ninja_outputs(work / ("pipelined" if m.mode == "warm" else m.mode) / "builds")
        assert len(built) == count
        for outputs in built.values():
            assert outputs and len(outputs) == len(set(outputs)), outputs
    assert serial.compile_s == serial.slot_import_s  # the serial mode builds inside the slot
    assert "compile pool" in pipelined.compile_where
    # With the build done ahead, the pipelined candidates' import phase is the imports alone.
    assert pipelined.slot_import_s / 4 < serial.slot_import_s / 2
    assert rep.bar.speedup == pytest.approx(pipelined.evals_per_hour / serial.evals_per_hour)
    assert json.loads(out.read_text())["schema_version"] == 1


def test_bench_runs_the_modes_asked_for_and_writes_each_as_it_ends(svc_settings, tmp_path):
    """On an H100 host `-n 6` of all three modes outlasted a 10-minute limit and left nothing: each mode's figures now
    go to stderr and to --json as soon as it ends, and `--modes` runs some of them (warm needs pipelined's builds)."""
    out = tmp_path / "report.json"
    p = subprocess.run(harness_cmd("bench", "throughput", "-n", "2", "--device", "cpu", "--modes", "pipelined,warm",
                                   "--json", str(out)),
                       env=service_env(svc_settings, COLUMNS="160"), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    assert "pipelined done: 2 evaluations in" in p.stderr and "warm done: 2 evaluations in" in p.stderr
    rep = throughput.ThroughputReport.model_validate_json(out.read_text())
    assert [m.mode for m in rep.modes] == ["pipelined", "warm"] and rep.serial_n is None
    assert rep.bar is not None and rep.bar.speedup is None and rep.bar.warm_ok is not None
    assert all(m.verdicts == {"passed": 2} for m in rep.modes)
    assert "bar: warm evaluations per hour" in p.stdout and "bar: pipelined wall" in p.stdout
    assert "needs the serial mode too" in p.stdout
    bad = subprocess.run(harness_cmd("bench", "throughput", "--device", "cpu", "--modes", "warm,fast"),
                         env=service_env(svc_settings), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "the modes are serial, pipelined, warm" in bad.stderr


def test_the_warm_mode_alone_builds_first_untimed_and_evaluates_with_the_trusted_process_warm(svc_settings, tmp_path):
    """The warm target in one run that fits a 10-minute limit: `--modes warm` builds its submissions first (the
    pipelined mode's pool would have), then evaluates them problem by problem; all but the first with the trusted
    process warm. Its evaluations built nothing, so its import phase holds no build."""
    out, work = tmp_path / "report.json", tmp_path / "bench"
    # A shared build cache set for the host is not the bench's: each mode builds into its own.
    p = subprocess.run(harness_cmd("bench", "throughput", "-n", "3", "--device", "cpu", "--modes", "warm",
                                   "--work-dir", str(work), "--json", str(out)),
                       env=service_env(svc_settings, COLUMNS="160", HARNESS_BUILD_CACHE_DIR=str(tmp_path / "host")),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    (warm,) = throughput.ThroughputReport.model_validate_json(out.read_text()).modes
    assert warm.mode == "warm" and warm.verdicts == {"passed": 3} and len(warm.trusted_warm_s) == 2
    # Each evaluation's own record: what a slow one spent its time on.
    assert [(e["problem"], e["verdict"], e["trusted_warm"]) for e in warm.evaluations] == \
        [("level2/30", "passed", False), ("level2/30", "passed", True), ("level2/30", "passed", True)]
    assert all(e["phases"]["timed_windows"] > 0 and e["seconds"] > 0 for e in warm.evaluations)
    assert all(e["windows"]["candidate"]["calls"] >= 1 and e["windows"]["eager"]["median_window_ms"] > 0
               for e in warm.evaluations)
    assert "warm: 2 evaluations with the trusted process warm" in p.stdout and "bar: warm evaluations" in p.stdout
    # Not a terminal: a line as the builds end and as each evaluation ends, so that a run cut off says how far it got.
    progress = [line.split(" done at ")[0] for line in p.stderr.splitlines() if " done at " in line]
    assert progress == [f"warm: {i} of 3" for i in range(4)], p.stderr
    evaluated = [line.split(" evaluated in ")[1].split(" s", 1)[1] for line in p.stderr.splitlines()
                 if line.startswith("warm: level2/30 evaluated in ")]
    assert evaluated == [": passed", " (trusted process warm): passed", " (trusted process warm): passed"], p.stderr
    built = _ninja_outputs(work / "pipelined" / "builds")
    assert len(built) == 3 and all(outputs and len(outputs) == len(set(outputs)) for outputs in built.values())


def test_bench_refuses_a_serial_sample_larger_than_the_batch(svc_settings):
    p = subprocess.run(harness_cmd("bench", "throughput", "-n", "3", "--serial-n", "4", "--device", "cpu"),
                       env=service_env(svc_settings), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--serial-n (4) cannot exceed -n (3)" in p.stderr


def test_bench_refuses_an_arch_list_without_cuda(svc_settings):
    p = subprocess.run(harness_cmd("bench", "throughput", "--device", "cpu", "--arch-list", "9.0"),
                       env=service_env(svc_settings), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--arch-list needs --device cuda" in p.stderr


def test_bench_refuses_problems_it_cannot_measure_as_asked(svc_settings):
    def bench(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(harness_cmd("bench", "throughput", "--device", "cpu", *args),
                              env=service_env(svc_settings), capture_output=True, text=True, timeout=120)

    p = bench("--problems-dir", str(KERNELBENCH), "--problem", "level1/19", "--problem", "level1/190")
    assert p.returncode == 2 and "error: --problem: unknown problem 'level1/190'; did you mean:" in p.stderr
    assert f"(not in {KERNELBENCH} nor the built-ins)" in p.stderr
    p = bench("--problem", "level1/19")  # not a built-in: the folder it is in has to be given
    assert p.returncode == 2 and "unknown problem 'level1/19'" in p.stderr and "see --problems-dir" in p.stderr
    p = bench("--problems-dir", str(KERNELBENCH))
    assert p.returncode == 2 and "--problems-dir needs --problem" in p.stderr
    p = bench("--problems-dir", str(KERNELBENCH), "--problem", "level1/19", "--modes", "serial,warm")
    assert p.returncode == 2 and "error: --modes: the serial mode measure" in p.stderr and "--modes warm" in p.stderr


def test_bench_measures_a_folder_s_problem_by_its_aa_copy_in_the_warm_mode(svc_settings, tmp_path):
    """A KernelBench problem with no reference solution, from --problems-dir: two A/A copies, the warm mode alone (the
    default for them), the second with the trusted process warm; its median in the JSON and printed. About 30 s on
    a 2-core machine (at the fixture's level1/19 sizes, reduced for the CPU, twice that: a tiny copy of it here)."""
    level1 = tmp_path / "kb" / "level1"
    level1.mkdir(parents=True)
    relu = (KERNELBENCH / "level1" / "19_ReLU.py").read_text()
    (level1 / "19_ReLU.py").write_text(relu.replace("batch_size = 4096", "batch_size = 16")
                                       .replace("dim = 393216", "dim = 64"))
    out = tmp_path / "report.json"
    p = subprocess.run(harness_cmd("bench", "throughput", "-n", "2", "--device", "cpu", "--problems-dir",
                                   str(tmp_path / "kb"), "--problem", "level1/19", "--json", str(out)),
                       env=service_env(svc_settings, COLUMNS="160"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rep = throughput.ThroughputReport.model_validate_json(out.read_text())
    (warm,) = rep.modes
    assert warm.mode == "warm" and warm.verdicts == {"passed": 2} and rep.distinct_sources == 2
    assert rep.origins == ["A/A copy of level1/19's reference"]
    assert [(e["problem"], e["trusted_warm"]) for e in warm.evaluations] == [("level1/19", False), ("level1/19", True)]
    figures = warm.per_problem["level1/19"]
    assert (figures.evaluations, figures.warm) == (2, 1) and figures.median_warm_s == warm.evaluations[1]["seconds"]
    assert f"bar: level1/19 median warm evaluation {figures.median_warm_s:.2f} s <= 2.5 s:" in p.stdout
