"""GET /api/problems: ids, sizes, tolerance; one problem with its reference source and baseline times."""

from __future__ import annotations

from ..db.factories import eval_result, seed


def test_problems_list_every_builtin_with_sizes_and_tolerance(client):
    got = client.get("/api/problems").json()
    assert len(got) == 6
    p75 = next(p for p in got if p["kernelbench_id"] == "level2/75")
    assert p75["id"] == "gemm-groupnorm-min-biasadd" and p75["tolerance"] == {"atol": 1e-4, "rtol": 1e-4}
    assert p75["tolerances"] == {"fp32": {"atol": 1e-4, "rtol": 1e-4}, "fp16": {"atol": 1e-2, "rtol": 1e-2},
                                 "bf16": {"atol": 1e-2, "rtol": 1e-2}}  # KernelBench's per precision
    assert set(p75["sizes"]) == {"default", "small"} and p75["sizes"]["small"]["overrides"]["batch_size"] == 128
    assert p75["init_args"] == ["in_features", "out_features", "num_groups", "bias_shape"]


def test_a_problem_by_kernelbench_id_has_source_constants_and_measured_baselines(client, db):
    seed(db, eval_result(eager_ms=2.5, compile_ms=1.25))
    seed(db, eval_result(device="cpu", eager_ms=0.25, compile_ms=None))
    got = client.get("/api/problems/level2/75").json()
    assert got["id"] == "gemm-groupnorm-min-biasadd" and "class Model(nn.Module)" in got["source"]
    assert got["constants"]["batch_size"] == "1024"
    times = {t["device"]: t for t in got["baseline_times"]}
    assert times["cuda"]["eager_ms"] == 2.5 and times["cuda"]["compile_ms"] == 1.25
    assert times["cuda"]["device_name"] == "NVIDIA H100 80GB HBM3" and times["cuda"]["size"] == "default"
    assert times["cpu"]["eager_ms"] == 0.25 and times["cpu"]["size"] == "small"
    assert client.get("/api/problems/gemm-groupnorm-min-biasadd").json()["id"] == got["id"]


def test_an_unknown_problem_is_404_with_suggestions(client):
    r = client.get("/api/problems/gemm_gn_min")
    assert r.status_code == 404 and "did you mean" in r.json()["detail"] and r.json()["suggestions"]


def test_a_problem_says_where_its_tolerance_is_degenerate(client, db):
    seed(db, eval_result(zeros_rel_err=5e-5))  # zeros within 1e-4: passing there proves nothing
    seed(db, eval_result(device="cpu", zeros_rel_err=0.5))
    got = client.get("/api/problems/level2/75").json()
    assert got["degenerate"] == [{"device": "cuda", "size": "default", "atol": 1e-4, "rtol": 1e-4}]
    page = client.get("/problems/level2/75?device=cuda").text
    assert "degenerate" in page and "outputs that compute nothing pass there" in page


def test_the_reference_time_shown_is_the_median_of_the_vouched_measurements_with_their_count(client, db):
    from harness.schema import Flag

    for eager in (0.150, 0.153, 0.160):
        seed(db, eval_result(candidate_ms=0.1, eager_ms=eager, compile_ms=0.5))
    noisy = eval_result(candidate_ms=0.1, eager_ms=15.227, compile_ms=0.5).model_copy(
        update={"flags": [Flag(check="timing_unreliable", detail="eager 159.6%")]})
    seed(db, noisy)  # the latest, and one the harness does not vouch for
    (cuda,) = client.get("/api/problems/level2/75").json()["baseline_times"]
    assert cuda["eager_ms"] == 0.153 and cuda["eager_measurements"] == 3 and cuda["unvouched"] == 1
    assert cuda["compile_ms"] == 0.5 and cuda["compile_measurements"] == 3
    shown = client.get("/problems/level2/75?device=cuda").text.split('class="reference-time"', 1)[1].split("</div>")[0]
    assert "15.2" not in shown and "median of 3 vouched measurements" in shown and "1 not vouched for" in shown


def test_a_reference_never_measured_in_windows_the_harness_vouches_for_shows_no_time(client, db):
    from harness.schema import Flag

    noisy = eval_result(candidate_ms=0.1, eager_ms=15.227, compile_ms=0.5).model_copy(
        update={"flags": [Flag(check="timing_unreliable", detail="eager 159.6%")]})
    seed(db, noisy)
    (cuda,) = client.get("/api/problems/level2/75").json()["baseline_times"]
    assert cuda["eager_ms"] is None and cuda["eager_measurements"] == 0 and cuda["unvouched"] == 1
    shown = client.get("/problems/level2/75?device=cuda").text.split('class="reference-time"', 1)[1].split("</div>")[0]
    assert "no measurement the harness vouches for" in shown and "15.2" not in shown
