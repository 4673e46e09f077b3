"""The leaderboard pages in headless Chromium against a real server: they load, the chart has one line per
model, tables sort and filter (with and without JavaScript), user text stays text, and each page is
photographed for a person to look at."""

from __future__ import annotations

import re

import pytest

from harness import demo

from .conftest import XSS_MODEL, XSS_SUBMITTER, artifacts_dir

pytestmark = pytest.mark.browser


def shot(page, name: str) -> None:
    page.screenshot(path=str(artifacts_dir() / f"{name}.png"), full_page=True)


def column(page, table: str, index: int) -> list[str]:
    return page.locator(f"table#{table} tbody tr").evaluate_all(
        f"rows => rows.map(r => r.cells[{index}] ? r.cells[{index}].innerText.trim() : '')")


def test_home_page_draws_one_fast_p_line_per_model(page, seeded_server):
    response = page.goto(seeded_server.base + "/")
    assert response.status == 200
    paths = page.locator("svg.fast-p path.series")
    assert paths.count() == len(seeded_server.models)
    assert sorted(paths.evaluate_all("ps => ps.map(p => p.getAttribute('data-series'))")) == seeded_server.models
    assert page.locator("table#problems tbody tr").count() == 6
    assert page.locator("#fast-p-legend li").count() == len(seeded_server.models)
    shot(page, "home")


def test_home_page_fits_a_phone(browser, seeded_server):
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    try:
        pg = context.new_page()
        for path, name in (("/", "home-phone"), ("/problems/level2/75", "problem-phone"),
                           (f"/submissions/{seeded_server.best_75_id}", "submission-phone")):
            pg.goto(seeded_server.base + path)
            # Wide tables scroll inside their own box; the page itself does not scroll sideways.
            assert pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), path
            shot(pg, name)
    finally:
        context.close()


def test_problem_table_sorts_by_a_column_header(page, seeded_server):
    page.goto(seeded_server.base + "/problems/level2/75?verdict=all")
    page.click("table#results th a[data-sort=submitter]")
    page.wait_for_url(re.compile(r"sort=submitter"))
    names = [n.lower() for n in column(page, "results", 1)]
    assert names == sorted(names) and len(set(names)) > 1
    page.click("table#results th a[data-sort=submitter]")  # again: the other way round
    page.wait_for_url(re.compile(r"order=desc"))
    assert [n.lower() for n in column(page, "results", 1)] == sorted(names, reverse=True)

    page.click("table#results th a[data-sort=speedup_eager]")
    page.wait_for_url(re.compile(r"sort=speedup_eager"))
    values = page.locator("table#results tbody tr td:nth-child(5)").evaluate_all(
        "cells => cells.map(c => c.dataset.value)")
    timed = [float(v) for v in values if v]
    assert timed == sorted(timed, reverse=True) and timed
    assert all(not v for v in values[len(timed):])  # untimed results last


def test_problem_table_filters_by_model_and_verdict(page, seeded_server):
    page.goto(seeded_server.base + "/problems/level2/75")
    assert set(column(page, "results", 3)) == {"passed"}  # the leaderboard view: passing results only
    ranks = [int(r) for r in column(page, "results", 0)]
    assert ranks == sorted(ranks) and ranks[0] == 1
    shot(page, "problem")

    model = demo.MODELS[0].model
    with page.expect_navigation():
        page.select_option("#filters select[name=model]", model)  # applies on change (progressive JS)
    with page.expect_navigation():
        page.select_option("#filters select[name=verdict]", "all")
    rows = page.locator("table#results tbody tr[data-model]")
    assert rows.count() > 0
    assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.model)")) == {model}
    assert len(set(rows.evaluate_all("rs => rs.map(r => r.dataset.verdict)"))) > 1
    shot(page, "problem-filtered")


def test_filters_work_without_javascript(browser, seeded_server):
    context = browser.new_context(java_script_enabled=False)
    try:
        pg = context.new_page()
        pg.goto(seeded_server.base + "/problems/level2/62?verdict=all")
        options = pg.locator("#filters select[name=verdict] option").evaluate_all("os => os.map(o => o.value)")
        failure = next(v for v in options if v not in ("all", "passed"))  # the seeded data has failures
        pg.select_option("#filters select[name=verdict]", failure)
        with pg.expect_navigation():
            pg.click("#filters button[type=submit]")
        verdicts = pg.locator("table#results tbody tr[data-verdict]").evaluate_all(
            "rs => rs.map(r => r.dataset.verdict)")
        assert verdicts and set(verdicts) == {failure}
        with pg.expect_navigation():
            pg.click("table#results th a[data-sort=model]")
        assert "sort=model" in pg.url and f"verdict={failure}" in pg.url
    finally:
        context.close()


def test_submission_page_shows_source_figures_timing_and_provenance(page, seeded_server):
    page.goto(f"{seeded_server.base}/submissions/{seeded_server.best_75_id}")
    assert page.locator(".badge").first.inner_text() == "passed"
    assert page.locator("#source .hl span[class^=k]").count() >= 5  # highlighted keywords
    assert page.locator("table#trials tbody tr").count() == 5
    assert page.locator("svg.timing g.spread").count() == 3  # candidate, eager, torch.compile
    assert "H100" in page.locator("#provenance").inner_text()
    assert page.locator("meta[http-equiv=refresh]").count() == 0
    shot(page, "submission")

    page.goto(f"{seeded_server.base}/submissions/{seeded_server.compile_error_id}")
    assert "compile error" in page.locator("h1 .badge").inner_text()
    assert "error:" in page.locator("details.log pre").first.inner_text()
    shot(page, "submission-compile-error")


def test_a_queued_submission_refreshes_itself(page, seeded_server):
    for sub_id in seeded_server.pending_ids:
        page.goto(f"{seeded_server.base}/submissions/{sub_id}")
        assert page.locator("meta[http-equiv=refresh]").count() == 1
    shot(page, "submission-running")


def test_markup_in_names_and_sources_renders_as_text(page, seeded_server):
    base = seeded_server.base
    for path in ("/", "/?by=submitter", "/problems/level2/75?verdict=all", f"/submissions/{seeded_server.xss_id}"):
        page.goto(base + path)
        assert page.locator("img[src=x]").count() == 0, path
        # Only the page's own script: nothing a submitter wrote became an element.
        assert page.locator("script").evaluate_all("ss => ss.map(s => s.getAttribute('src'))") == ["/static/pages.js"]
    page.goto(base + "/?by=submitter")
    assert XSS_SUBMITTER in page.locator("#fast-p-legend").inner_text()
    page.goto(base + "/problems/level2/75?verdict=all")
    row = page.locator(f"table#results tr[data-id='{seeded_server.xss_id}']")
    assert row.locator("td.who").inner_text() == XSS_SUBMITTER
    assert row.get_attribute("data-model") == XSS_MODEL
    page.goto(f"{base}/submissions/{seeded_server.xss_id}")
    assert page.locator("dd.who").inner_text() == XSS_SUBMITTER
    assert "</script><script>alert(3)</script>" in page.locator("#source").inner_text()
    shot(page, "submission-markup-as-text")
    assert page.dialogs == []


def test_unknown_ids_get_a_404_page(page, seeded_server):
    response = page.goto(seeded_server.base + "/submissions/999999")
    assert response.status == 404 and "Unknown submission" in page.locator("h1").inner_text()
    response = page.goto(seeded_server.base + "/problems/gemm_groupnorm_hardtan")
    assert response.status == 404
    shot(page, "not-found")
    suggestion = page.locator("main a[href^='/problems/']").first
    with page.expect_navigation():
        suggestion.click()
    assert page.locator("table#results").count() == 1  # a suggestion leads to its problem
