"""The HTML pages through the app, without a browser: what they show, how query parameters sort and
filter them, that user text is escaped, and 404s. (tests/web drives the same pages in Chromium.)"""

from __future__ import annotations

import random
import re
from html import unescape

import pytest

from harness import demo
from harness.db import crud, queries
from harness.problems import get_registry
from harness.schema import StateDictCopy, TimedOutputCheck, Tolerance
from harness.service.reeval import regrade_matching

from ..db.factories import eval_result, new_submission, seed

HTML = {"accept": "text/html"}


def store(db, problem: str, outcome: str, *, submitter: str = "alice", model: str = "m1", rng_seed: int = 0) -> int:
    spec = get_registry().get(problem)
    text, result = demo.demo_result(random.Random(rng_seed), spec, outcome, model=model)
    with db.session() as s:
        return demo.store(s, spec, text, result, submitter=submitter, model=model)


def ids_in_table(html: str, table: str) -> list[int]:
    body = html.split(f'<table id="{table}"', 1)[1].split("</table>", 1)[0]
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', body)]


@pytest.fixture
def demo_db(db):
    with db.session() as s:
        demo.seed_demo(s, get_registry().all(), seed=3)
    return db


def test_home_lists_every_problem_and_draws_one_fast_p_line_per_model(client, demo_db):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.text.count('<tr data-problem="') == 6
    models = sorted(m.model for m in demo.MODELS)
    assert re.findall(r'<path class="series" data-series="([^"]+)"', r.text) == models
    by_submitter = client.get("/?by=submitter&baseline=compile").text
    assert len(re.findall(r'<path class="series"', by_submitter)) == len({m.submitter for m in demo.MODELS})
    assert "fast_p vs torch.compile" in by_submitter


def test_home_shows_best_passing_speedup_and_pass_rate(client, db):
    seed(db, eval_result(candidate_ms=1.0, eager_ms=2.0, compile_ms=1.5), submitter="alice")  # 2x, 1.5x
    seed(db, eval_result(candidate_ms=0.5, eager_ms=2.0, compile_ms=1.5, max_rel_err=1.0), submitter="bob")  # wrong
    row = client.get("/").text.split('<tr data-problem="gemm-groupnorm-min-biasadd">', 1)[1].split("</tr>", 1)[0]
    assert "2.000×" in row and "1.500×" in row and "alice / m1" in row
    assert "50%" in row and "1 of 2" in row


def test_a_passing_result_kept_off_the_boards_gets_no_rank_and_is_not_the_best(client, db):
    """A result whose tolerance all-zero outputs would pass too (`degenerate_tolerance`) is shown, not ranked: the
    leaderboard leaves it out, and so do the problem page's ranks and chart and the home page's best (they took
    every passing result, its 4x included)."""
    honest = seed(db, eval_result(candidate_ms=1.0, eager_ms=2.0, compile_ms=1.5), submitter="alice")  # 2x
    zeros_pass = seed(db, eval_result(candidate_ms=0.5, eager_ms=2.0, compile_ms=1.5, zeros_rel_err=1e-5),
                      submitter="bob")  # 4x, but zeros would pass
    board = client.get("/api/leaderboard?problem=gemm-groupnorm-min-biasadd").json()
    assert [r["submission_id"] for r in board["gpu"]["rows"]] == [honest]
    row = client.get("/").text.split('<tr data-problem="gemm-groupnorm-min-biasadd">', 1)[1].split("</tr>", 1)[0]
    assert "2.000×" in row and "4.000×" not in row and "2 of 2" in row
    page = client.get("/problems/level2/75").text
    ranks = dict(re.findall(r'<tr data-id="(\d+)"[^>]*>\s*<td class="num">(\d*)</td>', page))
    assert ranks == {str(honest): "1", str(zeros_pass): ""}


def test_home_board_of_a_device_shows_only_results_that_ran_on_it(client, db):
    seed(db, eval_result(candidate_ms=0.5, eager_ms=1.0, device="cpu", compile_ms=None), submitter="cat")
    never_ran = eval_result(problem="gemm-groupnorm-hardtanh", kb="level2/30", static_error="no code", device=None)
    seed(db, never_ran, submitter="cat")
    gpu = client.get("/?device=cuda").text
    assert "correct ·" not in gpu and '<path class="series"' not in gpu  # was "0/2 correct"
    cpu = client.get("/?device=cpu").text
    assert "1/1 correct" in cpu


def test_a_submission_that_never_ran_shows_no_problem_size(client, db):
    sid = seed(db, eval_result(static_error="the source defines no top-level `class ModelNew`", device=None))
    html = client.get(f"/submissions/{sid}").text
    assert "v1</dd>" in html and " size</dd>" not in html  # was "v1, default size"
    ran = seed(db, eval_result(device="cpu"))
    assert re.search(r"v1, \w+ size</dd>", client.get(f"/submissions/{ran}").text)


def test_problem_page_ranks_passing_results_and_counts_every_verdict(client, db):
    fast = store(db, "level2/75", "passed", submitter="fast", rng_seed=1)
    slow = store(db, "level2/75", "passed", submitter="slow", rng_seed=2)
    store(db, "level2/75", "compile_error", submitter="c")
    store(db, "level2/75", "timeout", submitter="t")
    store(db, "level2/75", "tf32_wrong_answer", submitter="w")
    store(db, "level2/75", "flagged_tf32_flag", submitter="f")
    r = client.get("/problems/level2/75")
    assert r.status_code == 200
    ranked = ids_in_table(r.text, "results")
    assert sorted(ranked) == sorted([fast, slow])  # passing only, by default
    for verdict in ("passed", "compile_error", "timeout", "wrong_answer", "flagged"):
        assert f'data-verdict="{verdict}">' in r.text
    assert '<svg class="chart strips"' in r.text and '<svg class="chart stacked"' in r.text
    everything = client.get("/problems/gemm-groupnorm-min-biasadd?verdict=all").text
    assert len(ids_in_table(everything, "results")) == 6
    assert ids_in_table(client.get("/problems/level2/75?verdict=timeout").text, "results") != []


def test_sorting_and_filtering_are_query_parameters(client, db):
    a = store(db, "level2/62", "passed", submitter="anna", model="ma", rng_seed=11)
    b = store(db, "level2/62", "passed", submitter="bert", model="mb", rng_seed=12)
    c = store(db, "level2/62", "wrong_answer", submitter="cleo", model="ma", rng_seed=13)
    assert ids_in_table(client.get("/problems/level2/62?verdict=all&sort=submitter").text, "results") == [a, b, c]
    assert ids_in_table(client.get("/problems/level2/62?verdict=all&sort=submitter&order=desc").text,
                        "results") == [c, b, a]
    by_model = client.get("/problems/level2/62?verdict=all&model=ma").text
    assert ids_in_table(by_model, "results") == [a, c]  # the ranked one first
    assert ids_in_table(client.get("/problems/level2/62?verdict=wrong_answer").text, "results") == [c]
    # Unknown sort keys fall back to the default order rather than failing.
    assert client.get("/problems/level2/62?sort=nonsense&order=sideways").status_code == 200
    # Header links keep the filters.
    html = client.get("/problems/level2/62?verdict=all&model=ma").text
    link = re.search(r'<a href="([^"]+)" data-sort="submitter"', html).group(1)
    assert "verdict=all" in unescape(link) and "model=ma" in unescape(link) and "sort=submitter" in unescape(link)


def test_a_lower_precision_result_is_marked_next_to_the_references_error(client, db):
    sid = store(db, "level2/30", "passed_low_precision", rng_seed=5)
    html = client.get("/problems/level2/30").text
    row = html.split(f'<tr data-id="{sid}"', 1)[1].split("</tr>", 1)[0]
    assert "lower precision" in row and 'class="num precision low"' in row and "ref " in row


def test_submission_page_shows_source_logs_trials_timing_and_provenance(client, db):
    ok = store(db, "level2/94", "passed", rng_seed=3)
    html = client.get(f"/submissions/{ok}").text
    assert '<div class="code" id="source">' in html and 'class="hl"' in html
    assert html.count('<svg class="chart timing"') == 1 and "torch.compile" in html
    assert 'id="trials"' in html and "NVIDIA H100 80GB HBM3" in html
    assert 'http-equiv="refresh"' not in html
    bad = store(db, "level2/94", "compile_error", rng_seed=4)
    html = client.get(f"/submissions/{bad}").text
    assert "compile error" in html and "ninja: build stopped" in html and "Traceback" in html


def test_submission_page_says_what_the_speedup_is_known_to(client, db):
    spec = get_registry().get("level2/30")
    text, result = demo.demo_result(random.Random(1), spec, "passed")
    result.observations.timing_known_to = 0.0452
    with db.session() as s:
        sid = demo.store(s, spec, text, result, submitter="alice", model="m1")
    html = unescape(client.get(f"/submissions/{sid}").text)
    assert "known to ±4.5% (95%, paired by round)" in html.split('id="known-to">', 1)[1].split("</span>", 1)[0]
    result.observations.timing_known_to = None
    with db.session() as s:
        sid = demo.store(s, spec, text, result, submitter="alice", model="m1")
    assert 'id="known-to"' not in client.get(f"/submissions/{sid}").text


def test_submission_page_says_which_pause_held_the_candidate_between_its_turns(client, db):
    spec = get_registry().get("level2/30")
    text, result = demo.demo_result(random.Random(1), spec, "passed")
    result.observations.pause_method = "ptrace"
    with db.session() as s:
        sid = demo.store(s, spec, text, result, submitter="alice", model="m1")
    provenance = client.get(f"/submissions/{sid}").text.split('id="provenance">', 1)[1].split("</dl>", 1)[0]
    assert "candidate paused by" in provenance and "a ptrace-stop" in provenance


def test_submission_page_says_which_elements_were_within_the_tolerance_of_the_float64_truth_only(client, db):
    spec = get_registry().get("level2/94")
    text, result = demo.demo_result(random.Random(1), spec, "passed")
    out = result.observations.trials[-1].outputs[0]
    out.mismatches_at_eval_tolerance, out.fp64_only_at_eval_tolerance = 1, 1
    with db.session() as s:
        sid = demo.store(s, spec, text, result, submitter="alice", model="m1")
    trials = client.get(f"/submissions/{sid}").text.split('id="trials">', 1)[1].split("</table>", 1)[0]
    assert trials.count("within it of the fp64 truth") == 1 and "1 within it of the fp64 truth" in trials


def test_submission_page_says_how_the_fresh_reference_parameters_reached_the_model(client, db):
    spec = get_registry().get("level2/30")
    text, result = demo.demo_result(random.Random(1), spec, "passed")
    result.observations.state_dict = StateDictCopy(
        copied=["beta", "fc.bias", "fc.weight", "gamma", "w_t"], not_copied=["cache"],
        by_position={"gamma": "group_norm.weight", "beta": "group_norm.bias"}, drawn=["gemm.weight"])
    with db.session() as s:
        sid = demo.store(s, spec, text, result, submitter="alice", model="m1")
    item = client.get(f"/submissions/{sid}").text.split('id="parameters">', 1)[1].split("</li>", 1)[0]
    assert "drawn fresh for this evaluation" in item and "gamma ← group_norm.weight" in unescape(item)
    assert "No reference values for cache" in item


def test_submission_page_counts_the_fingerprinted_timed_outputs_and_those_off_the_reference(client, db):
    spec = get_registry().get("level2/30")
    text, result = demo.demo_result(random.Random(1), spec, "passed")
    result.observations.timed_outputs = TimedOutputCheck(
        fingerprinted=285, checked=[3, 40, 100, 141, 250, 251], reported=6, expected=6,
        fingerprint_mismatches=["timed call 7 output 0: fingerprint 0.0 where the reference's is 12.5 (within 0.2 "
                                "for an output within the tolerance)"])
    with db.session() as s:
        sid = demo.store(s, spec, text, result, submitter="alice", model="m1")
    item = client.get(f"/submissions/{sid}").text.split("Outputs of timed calls:", 1)[1].split("</li>", 1)[0]
    assert "285 fingerprinted" in item and "1 off the reference" in unescape(item)
    assert "6 checked against the reference element by element, all matched" in item


def test_a_cut_off_reply_shows_the_text_as_received(client, db):
    sid = store(db, "level2/37", "invalid_submission")
    html = client.get(f"/submissions/{sid}").text
    assert "invalid submission" in html and 'id="raw-text"' in html and "Here is the plan" in html


def test_user_text_is_escaped_everywhere(client, db):
    evil = "<script>alert(1)</script>"
    sid = seed(db, eval_result(log_tail="<img src=x onerror=alert(2)>", max_rel_err=1.0), submitter=evil,
               model="<b>m</b>")
    for path in ("/", "/?by=submitter", "/?by=pair", "/problems/level2/75?verdict=all", f"/submissions/{sid}"):
        html = client.get(path).text
        assert evil not in html and "<img src=x" not in html and "<b>m</b>" not in html, path
    html = client.get(f"/submissions/{sid}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x onerror=alert(2)&gt;" in html


def test_a_queued_or_running_submission_refreshes_itself(client, db):
    with db.session() as s:
        sub, _ = crud.create_submission(s, new_submission("gemm-groupnorm-hardtanh"), token=None, queue_limit=None,
                                        max_attempts=3)
    html = client.get(f"/submissions/{sub.id}").text
    assert '<meta http-equiv="refresh" content="5">' in html and "number 1 in the queue" in html
    assert "1 waiting" in client.get("/").text


def test_unknown_ids_get_html_404_pages_and_the_api_keeps_json(client):
    r = client.get("/submissions/12345", headers=HTML)
    assert r.status_code == 404 and "Unknown submission" in r.text
    assert client.get("/submissions/abc", headers=HTML).status_code == 404
    r = client.get("/problems/gemm_gn_hardtanh", headers=HTML)
    assert r.status_code == 404 and "Did you mean" in r.text
    for href in re.findall(r'href="(/problems/[^"]+)"', r.text):
        assert client.get(href).status_code == 200, href  # every suggestion leads to its problem
    r = client.get("/no/such/page", headers=HTML)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    r = client.get("/api/submissions/12345", headers=HTML)
    assert r.status_code == 404 and r.json()["detail"] == "no submission 12345"
    assert client.get("/no/such/page").json() == {"detail": "Not Found"}


def test_static_files_and_highlight_css_are_served(client):
    assert client.get("/static/style.css").status_code == 200
    assert "addEventListener" in client.get("/static/pages.js").text
    css = client.get("/highlight.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css") and ".hl" in css.text


def test_empty_database_pages_render(client):
    assert "No results yet" in client.get("/").text
    assert "No submissions match" in client.get("/problems/level2/88").text


def test_highlighting_keeps_the_source_exact_and_lexes_cuda_strings_as_cuda():
    from html import unescape as text_of

    from harness.api.submission_page import highlighted

    source = ('import torch\nsrc = r"""\n#include <torch/extension.h>\n__global__ void k(float* x) { x[0] = 1.f; }\n'
              '// </script><script>alert(1)</script>\n"""\nclass ModelNew(torch.nn.Module):\n    pass\n')
    html = str(highlighted(source))
    assert "<script>" not in html
    code = html.split('<td class="code">', 1)[1]
    assert text_of(re.sub(r"<[^>]+>", "", code)).rstrip("\n") == source.rstrip("\n")
    assert '<span class="kt">float</span>' in html  # a CUDA type, not part of a Python string
    assert str(highlighted('x = """never closed')).count("never closed") == 1


def test_home_table_sorts_by_query_parameters(client, db):
    seed(db, eval_result(candidate_ms=1.0, eager_ms=3.0), submitter="a")  # level2/75: 3x
    seed(db, eval_result(problem="gemm-groupnorm-hardtanh", kb="level2/30", candidate_ms=1.0, eager_ms=2.0))  # 2x

    def order(query: str) -> list[str]:
        return re.findall(r'<tr data-problem="([^"]+)"', client.get("/" + query).text)

    by_speed = order("?sort=best_eager")
    assert by_speed[:2] == ["gemm-groupnorm-min-biasadd", "gemm-groupnorm-hardtanh"]  # best first, empty last
    assert order("?sort=best_eager&order=asc")[:2] == ["gemm-groupnorm-hardtanh", "gemm-groupnorm-min-biasadd"]
    assert order("")[0] == "gemm-groupnorm-hardtanh"  # by KernelBench id: level2/30 first


def test_a_regraded_result_shows_the_tolerance_it_was_graded_at(client, db):
    sid = seed(db, eval_result(max_rel_err=5e-3), submitter="loose")
    with db.session() as s:
        regrade_matching(s, get_registry(), queries.SubmissionFilter(ids=[sid]), tolerance=Tolerance(atol=1e-2,
                                                                                                     rtol=1e-2))
    row = client.get("/problems/level2/75").text.split(f'<tr data-id="{sid}"', 1)[1].split("</tr>", 1)[0]
    assert "graded at atol=rtol=0.01 (re-graded)" in row
    page = client.get(f"/submissions/{sid}").text
    graded = unescape(page.split('id="graded-at">', 1)[1].split("</dd>", 1)[0])
    assert "atol=rtol=0.01" in graded and "the problem's tolerance is atol=rtol=0.0001" in graded
    assert "re-graded from result" in graded


def test_a_queued_submission_with_no_worker_running_says_so(client, db):
    with db.session() as s:
        sub, _ = crud.create_submission(s, new_submission("gemm-groupnorm-hardtanh"), token=None, queue_limit=None,
                                        max_attempts=3)
    html = client.get(f"/submissions/{sub.id}").text
    assert "No worker is running" in html and "until the verdict is in" not in html
    with db.session() as s:
        crud.register_worker(s, "host:1:a", hostname="host", pid=1, slots=["cpu"])
    html = client.get(f"/submissions/{sub.id}").text
    assert "No worker is running" not in html and "until the verdict is in" in html


def test_cpu_results_are_not_said_to_be_timed_on_a_gpu(client, db):
    seed(db, eval_result(candidate_ms=0.5, eager_ms=1.0, device="cpu", compile_ms=None))
    lead = client.get("/").text.split('<p class="lead">', 1)[1].split("</p>", 1)[0]
    assert "timed on the same CPU" in lead and "GPU" not in lead
    seed(db, eval_result(candidate_ms=0.5, eager_ms=1.0))
    assert "timed on the same GPU" in client.get("/?device=cuda").text


def test_the_pass_rate_says_what_it_leaves_out(client, db):
    seed(db, eval_result(candidate_ms=1.0, eager_ms=2.0))
    seed(db, eval_result(static_error="no code", device=None))  # never ran: not in the rate
    page = client.get("/").text
    row = page.split('<tr data-problem="gemm-groupnorm-min-biasadd">', 1)[1].split("</tr>", 1)[0]
    assert "100%" in row and "1 of 1" in row
    defined = page.split('id="pass-rate-defined">', 1)[1].split("</p>", 1)[0]
    assert "evaluated on the GPU" in defined and "never ran" in defined and "invalid" in defined


def test_problem_results_link_each_submission_by_its_id(client, db):
    sub = seed(db, eval_result(candidate_ms=1.0, eager_ms=2.0))
    page = client.get("/problems/level2/75").text
    row = page.split(f'<tr data-id="{sub}"', 1)[1].split("</tr>", 1)[0]
    assert f'<a href="/submissions/{sub}">#{sub}</a>' in row
    assert 'data-sort="id"' in page  # the column sorts by id


def test_favicon_is_served_from_here(client):
    for path in ("/favicon.ico", "/favicon.svg"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
        assert r.text.startswith("<svg") and "href" not in r.text  # it loads nothing from elsewhere
    assert '<link rel="icon" href="/favicon.svg"' in client.get("/").text


def test_every_table_scrolls_in_its_own_box_and_logs_wrap_on_a_phone(client, db):
    """Issue 33: at 390 px the tables and the 'why this verdict' log were cut off. Every data table sits in a box
    that scrolls sideways by itself, and logs wrap their lines instead of running past the screen's edge."""
    sub = seed(db, eval_result(compiler_error="error: " + "x" * 300, log_tail="nvcc " + "y" * 300))
    passed = seed(db, eval_result())
    pages = [client.get(p).text for p in ("/", "/problems/level2/75?verdict=all", f"/submissions/{sub}",
                                          f"/submissions/{passed}")]
    for html, has_tables in zip(pages, (True, True, False, True), strict=True):
        tables = re.findall(r'<table [^>]*class="data"', html)
        assert bool(tables) == has_tables
        assert len(re.findall(r'<div class="table-wrap">\s*<table [^>]*class="data"', html)) == len(tables)
    assert "why this verdict" in pages[2]
    css = re.sub(r"/\*.*?\*/", "", client.get("/static/style.css").text, flags=re.DOTALL)
    rules = {m.group(1).strip(): m.group(2) for m in re.finditer(r"([^{}]+)\{([^{}]*)\}", css)}
    assert "overflow-x: auto" in rules[".table-wrap"]
    assert "white-space: pre-wrap" in rules["details.log pre"] and "overflow-wrap: anywhere" in rules[
        "details.log pre"]
    phone = {m.group(1).strip(): m.group(2) for m in re.finditer(r"([^{}]+)\{([^{}]*)\}",
                                                                 css.split("@media (max-width: 720px) {", 1)[1])}
    # Headers wrap between words on a phone, the numeric ones too (`table.data .num` keeps them on one line otherwise).
    assert "white-space: normal" in phone["table.data thead th, table.data thead th.num"]


def test_pages_show_one_precision_at_a_time_and_a_bf16_result_graded_at_its_own_tolerance(client, db):
    fp32 = seed(db, eval_result(candidate_ms=1.0, eager_ms=2.0), submitter="full")
    bf16 = seed(db, eval_result(candidate_ms=0.5, eager_ms=2.0, max_rel_err=5e-3, precision="bf16",
                                tolerance=Tolerance(atol=1e-2, rtol=1e-2)), submitter="half")
    default = client.get("/problems/level2/75").text
    assert ids_in_table(default, "results") == [fp32]
    assert 'href="/problems/level2/75?precision=bf16"' in default  # a switch, where both are present
    at_bf16 = client.get("/problems/level2/75?precision=bf16").text
    assert ids_in_table(at_bf16, "results") == [bf16] and "ran at bf16" in at_bf16
    row = at_bf16.split(f'<tr data-id="{bf16}"', 1)[1].split("</tr>", 1)[0]
    assert "graded at" not in row  # its tolerance is the problem's at bf16: nothing to point out
    assert "atol=rtol=0.01 at bf16" in unescape(at_bf16.split('id="tolerance-at-precision">', 1)[1])
    page = client.get(f"/submissions/{bf16}").text
    assert "bf16" in page.split('id="precision">', 1)[1].split("</dd>", 1)[0]
    assert "the problem's tolerance is" not in page.split('id="graded-at">', 1)[1].split("</dd>", 1)[0]
    home = client.get("/").text
    assert "half" not in home and "full" in home
    assert "half" in client.get("/?precision=bf16").text
