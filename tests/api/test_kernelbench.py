"""/api/kernelbench: a run of ours in KernelBench's terms, and the numbers KernelBench's own analysis gives for
our export of it.

`kernelbench_analysis` below restates KernelBench's `scripts/benchmark_eval_analysis.py` and `score.py` from
their definitions, over the two files our export writes (eval results and baseline times): the test holds our
metrics module to them."""

from __future__ import annotations

import json
import math

from harness.schema import Flag

from ..db.factories import eval_result, seed

LEVEL2 = {75: "gemm-groupnorm-min-biasadd", 62: "matmul-groupnorm-leakyrelu-sum", 37: "matmul-swish-sum-groupnorm",
          94: "gemm-biasadd-hardtanh-mish-groupnorm", 30: "gemm-groupnorm-hardtanh",
          88: "gemm-groupnorm-swish-multiply-swish"}  # every level-2 problem the service has
FILES = {75: "75_Gemm_GroupNorm_Min_BiasAdd.py", 62: "62_Matmul_GroupNorm_LeakyReLU_Sum.py",
         37: "37_Matmul_Swish_Sum_GroupNorm.py", 94: "94_Gemm_BiasAdd_Hardtanh_Mish_GroupNorm.py",
         30: "30_Gemm_GroupNorm_Hardtanh.py", 88: "88_Gemm_GroupNorm_Swish_Multiply_Swish.py"}


def result(number: int, **kw):
    return eval_result(problem=LEVEL2[number], kb=f"level2/{number}", **kw)


def kernelbench_analysis(eval_results: dict, baseline: dict, level: int, files: dict[int, str]) -> dict:
    """KernelBench's analysis of one level, restated: the level's problems are the dataset's; sample 0 of each
    problem; a problem without one is patched in as neither compiled nor correct; rates divide by the dataset;
    speedup = baseline mean / runtime for the correct ones among the problems the baseline file has; fast_p
    divides by those problems; the geometric means are over the correct speedups (and those above 1)."""
    first = {}
    for key, entries in eval_results.items():
        zero = [e for e in entries if e["sample_id"] == 0]
        assert len(zero) <= 1
        if zero:
            first[int(key)] = zero[0]
    blank = {"compiled": False, "correctness": False, "runtime": -1.0}
    entry = {n: first.get(n, blank) for n in files}
    total = len(files)
    aligned = [(entry[n], baseline[f"level{level}"][name]["mean"]) for n, name in sorted(files.items())
               if name in baseline[f"level{level}"]]
    speedups = [base / e["runtime"] for e, base in aligned if e["correctness"]]
    faster = [s for s in speedups if s > 1]
    return {
        "compilation_rate": sum(e["compiled"] is True for e in entry.values()) / total,
        "correctness_rate": sum(e["correctness"] is True for e in entry.values()) / total,
        "fast_p": {f"{p:g}": sum(s > p for s in speedups) / len(aligned) for p in (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)},
        "geomean_correct": math.prod(speedups) ** (1 / len(speedups)) if speedups else 0,
        "geomean_correct_and_faster": math.prod(faster) ** (1 / len(faster)) if faster else 0,
    }


def _seed_run(db):
    run = {"model": "llm-x", "tags": ["eval-dir", "run1"]}
    seed(db, result(75, candidate_ms=1.0, eager_ms=2.0), meta={"sample": 0}, **run)
    seed(db, result(75, max_rel_err=1.0), meta={"sample": 1}, **run)
    seed(db, result(62, candidate_ms=2.2, eager_ms=1.1), meta={"sample": 0}, **run)
    seed(db, result(37, compiler_error="error: identifier x is undefined"), meta={"sample": 0}, **run)
    seed(db, result(37, candidate_ms=0.5, eager_ms=1.0), meta={"sample": 1}, **run)
    seed(db, result(94, max_rel_err=1.0), meta={"sample": 0}, **run)
    seed(db, result(30, static_error="no code block", device=None), meta={"sample": 0}, **run)
    # 88: no result in the run. Other evaluations measured the reference of every problem.
    for number, eager in ((75, 1.9), (75, 2.1), (62, 1.0), (37, 1.2), (94, 3.0), (30, 0.15), (88, 0.8)):
        seed(db, result(number, candidate_ms=eager, eager_ms=eager), model="reference-timer")


def test_kernelbenchs_analysis_of_our_export_gives_our_kernelbench_metrics(client, db):
    _seed_run(db)
    ours = client.get("/api/kernelbench?tag=run1&k=1&k=2").json()
    (level,) = ours["levels"]
    assert (ours["device"], ours["device_name"], ours["size"]) == ("cuda", "NVIDIA H100 80GB HBM3", "default")
    assert (level["level"], level["problems"], level["evaluated"], level["compiled"], level["correct"]) == (
        2, 6, 5, 3, 2)
    # Our export, through JSON files, read by KernelBench's analysis as restated above.
    exported = json.loads(json.dumps(client.get("/api/kernelbench/eval_results?tag=run1").json()))["level2"]
    baseline = json.loads(json.dumps(client.get("/api/kernelbench/baseline?device_name=NVIDIA H100 80GB HBM3").json()))
    assert set(baseline["level2"]) == set(FILES.values())
    assert set(exported) == {"30", "37", "62", "75", "94"} and [e["sample_id"] for e in exported["75"]] == [0, 1]
    theirs = kernelbench_analysis(exported, baseline, 2, FILES)
    assert level["compilation_rate"] == theirs["compilation_rate"] == 0.5
    assert level["correctness_rate"] == theirs["correctness_rate"] == 2 / 6
    assert level["fast_p"] == theirs["fast_p"]
    assert level["fast_p"]["1"] == 1 / 6 and level["fast_p"]["0.5"] == 1 / 6 and level["fast_p"]["0"] == 2 / 6
    assert math.isclose(level["geomean_speedup_correct"], theirs["geomean_correct"], rel_tol=1e-12)
    assert math.isclose(level["geomean_speedup_correct_and_faster"], theirs["geomean_correct_and_faster"],
                        rel_tol=1e-12)
    # pass@k over every sample: 75 has 1 of 2 correct, 37 1 of 2, 62 1 of 1, 94 and 30 0 of 1.
    assert level["pass_at_k"]["pass@1"] == (0.5 + 0.5 + 1 + 0 + 0) / 5
    assert level["pass_at_k"]["pass@2"] == (1.0 + 1.0) / 2 and level["pass_at_k_problems"]["pass@2"] == 2
    # Beside them, our own view, named: the best sample of each problem with a result.
    assert ours["harness_fast_p"]["0"] == 3 / 5


def test_the_export_says_what_kernelbenchs_fields_cannot(client, db):
    _seed_run(db)
    exported = client.get("/api/kernelbench/eval_results?model=llm-x").json()["level2"]
    (e30,) = exported["30"]
    assert (e30["compiled"], e30["correctness"], e30["runtime"], e30["runtime_stats"]) == (False, False, -1.0, {})
    assert e30["metadata"]["verdict"] == "invalid_submission" and e30["metadata"]["compilation_error"]
    e37 = exported["37"][0]
    assert e37["compiled"] is False and "identifier x is undefined" in e37["metadata"]["compilation_error"]
    e75 = exported["75"][0]
    assert e75["correctness"] is True and e75["runtime"] == e75["runtime_stats"]["mean"] == 1.01
    assert set(e75["runtime_stats"]) >= {"mean", "std", "min", "max", "num_trials"}
    assert e75["metadata"]["timing_vouched"] is True and e75["metadata"]["hardware"] == "NVIDIA H100 80GB HBM3"
    e94 = exported["94"][0]
    assert e94["compiled"] is True and e94["correctness"] is False and e94["metadata"]["correctness_issue"]
    baseline = client.get("/api/kernelbench/baseline").json()["level2"]
    b75 = baseline[FILES[75]]
    assert b75["measurements"] == 3 and b75["mean"] == 2.0 * 1.01 and b75["hardware"] == "NVIDIA H100 80GB HBM3"
    assert set(b75) >= {"mean", "std", "min", "max", "num_trials", "hardware", "device"}


def test_a_time_not_vouched_for_counts_as_correct_never_as_faster(client, db):
    noisy = result(75, candidate_ms=0.1, eager_ms=1.8, compile_ms=0.9).model_copy(
        update={"flags": [Flag(check="timing_unreliable", detail="spread 159.6%")]})
    seed(db, noisy, model="llm-y", meta={"sample": 0})
    (level,) = client.get("/api/kernelbench?model=llm-y").json()["levels"]
    assert level["correct"] == 1 and level["unvouched"] == 1 and level["fast_p"]["0"] == 1 / 6
    assert level["fast_p"]["0.5"] == 0.0 and level["geomean_speedup_correct"] is None
    exported = client.get("/api/kernelbench/eval_results?model=llm-y").json()["level2"]["75"][0]
    assert exported["metadata"]["timing_vouched"] is False and exported["metadata"]["flags"] == ["timing_unreliable"]


def test_a_run_must_be_named_and_infra_errors_are_never_the_models(client, db):
    from harness.db.models import ResultOrigin, Submission
    from harness.service.outcomes import infra_result

    r = client.get("/api/kernelbench")
    assert r.status_code == 400 and "name the run" in r.json()["detail"]
    assert client.get("/api/kernelbench?model=m&k=0").status_code == 400
    sub_id = seed(db, result(75), model="other")
    with db.session() as s:
        lost = infra_result(s.get(Submission, sub_id), "worker lost")
    seed(db, lost, model="llm-z", meta={"sample": 0}, origin=ResultOrigin.queue)
    seed(db, result(62, candidate_ms=0.5, eager_ms=1.0), model="llm-z", meta={"sample": 0})
    got = client.get("/api/kernelbench?model=llm-z").json()
    (level,) = got["levels"]
    assert got["left_out"]["infra_errors"] == 1 and level["evaluated"] == 1 and level["correct"] == 1
    assert "75" not in client.get("/api/kernelbench/eval_results?model=llm-z").json()["level2"]


def test_a_kernelbench_baseline_file_gives_the_baseline_times(client, db):
    from harness.kernelbench_format import read_baseline
    from harness.problems import get_registry
    from harness.service import kernelbench as kb

    _seed_run(db)
    # KernelBench's own H100 figures for these problems, say: 75 at 4.04 ms makes run's 1.01 ms sample 4x.
    theirs = read_baseline({"level2": {FILES[75]: {"mean": 4.04, "hardware": "NVIDIA H100 80GB HBM3"},
                                       FILES[62]: {"mean": 0.5555}}})  # 62: 2.222 ms, 0.25x
    registry = get_registry()
    with db.session() as s:
        samples, counts = kb.run_samples(registry, kb.run_rows(s, tag="run1"))
        report = kb.kernelbench_report(s, registry, samples, counts, baseline_file=theirs, baseline_label="H100 file")
    (level,) = report.levels
    assert report.baseline_source == "H100 file" and level.baseline == "H100 file"
    assert level.geomean_over == 2 and math.isclose(level.geomean_speedup_correct, math.sqrt(4.0 * 0.25))
    assert level.fast_p["2"] == 1 / 6 and level.fast_p["0.5"] == 1 / 6 and level.no_baseline == []


def test_compiled_is_whether_the_candidate_built_and_constructed():
    from harness.db.models import Result
    from harness.service.kernelbench import _compiled

    def res(verdict, **obs):
        return Result(verdict=verdict, payload={"observations": obs})

    assert not _compiled(res("compile_error")) and not _compiled(res("invalid_submission"))
    assert not _compiled(res("timeout", candidate_exit={"timed_out": True, "phase": "compile"}))  # a hung nvcc
    assert _compiled(res("timeout", candidate_exit={"timed_out": True, "phase": "timing"}))
    assert not _compiled(res("runtime_error", candidate_error={"phase": "compile", "exc_type": "E", "message": ""}))
    assert _compiled(res("runtime_error", candidate_error={"phase": "correctness", "exc_type": "E", "message": ""}))
    assert _compiled(res("wrong_answer")) and _compiled(res("passed"))
