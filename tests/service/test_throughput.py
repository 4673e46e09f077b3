"""`harness bench throughput`: distinct variants, serial and pipelined modes through the worker, consistent figures."""

from __future__ import annotations

import json
import subprocess

import pytest

from harness.problems import get_registry
from harness.service import throughput
from harness.service.throughput import ModeReport

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
    with pytest.raises(ValueError, match="no reference solution of level2/1 in"):
        throughput.make_variants(3, "cuda", registry, REPO / "reference_solutions", problems=["level2/1"])


def test_cpu_variants_are_distinct_cpp_only_submissions_for_one_problem():
    variants = throughput.make_variants(3, "cpu", get_registry())
    assert len({v.text for v in variants}) == 3
    assert {v.spec.kernelbench_id for v in variants} == {"level2/30"}
    assert all("cuda_sources" not in v.text and "load_inline" in v.text for v in variants)


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
