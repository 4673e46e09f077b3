"""The leaderboard pages in headless Chromium against a real server: they load, the chart has one line per
model, tables sort and filter (with and without JavaScript), user text stays text, and each page is
photographed for a person to look at."""

from __future__ import annotations

import itertools
import re

import pytest

from harness import demo

from .conftest import WIDE_SPREAD, WIDE_SPREAD_PROBLEM, XSS_MODEL, XSS_SUBMITTER, artifacts_dir

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
        # The demo has no worker: the page says so rather than promise a verdict.
        assert "No worker is running" in page.locator("#verdict").inner_text()
        assert "until the verdict is in" not in page.locator("#verdict").inner_text()
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


PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True}
DESKTOP = {"viewport": {"width": 1280, "height": 900}}

# The (character before, character after) of every line break inside one text node of an element, found
# from where each character is drawn: a break is where a character starts a new line. Breaks between text
# nodes (at a <wbr>, or between two elements) are left out: those are the places meant for breaking.
LINE_BREAKS_JS = """el => {
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  const breaks = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    let last = null;
    for (let i = 0; i < node.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getBoundingClientRect();
      if (box.width === 0) continue;
      if (last && box.top > last[1] + 2) breaks.push(last[0] + node.data[i]);
      last = [node.data[i], box.top];
    }
  }
  return breaks;
}"""


def mid_word(breaks: list[str]) -> list[str]:
    return [b for b in breaks if b[0] not in "_./= " and b[1] != " "]


def boxes(locator) -> list[dict]:
    return locator.evaluate_all("els => els.map(e => { const r = e.getBoundingClientRect(); "
                                "return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; })")


@pytest.mark.parametrize("name,viewport", [("desktop", DESKTOP), ("phone", PHONE)])
def test_wide_spread_speedups_get_readable_ticks_and_rows_that_hold_their_dots(browser, seeded_server, name,
                                                                                 viewport):
    context = browser.new_context(**viewport)
    try:
        pg = context.new_page()
        pg.goto(f"{seeded_server.base}/problems/{WIDE_SPREAD_PROBLEM}")
        chart = pg.locator("svg.strips")
        ticks = chart.locator("g.grid text")
        # Issue 18: one label per power of two from 0.0078125x to 128x ran into each other.
        assert ticks.all_text_contents() == ["0.01×", "0.1×", "1×", "10×", "100×"]
        spans = sorted(boxes(ticks), key=lambda b: b["left"])
        assert all(a["right"] + 4 <= b["left"] for a, b in itertools.pairwise(spans)), spans
        (frame,) = boxes(chart)
        assert frame["left"] <= spans[0]["left"] and spans[-1]["right"] <= frame["right"]  # none cut off
        (title,) = boxes(chart.locator("text.axis"))
        assert all(b["bottom"] <= title["top"] for b in spans)  # the axis title sits below the labels
        assert chart.locator("circle").count() >= len(WIDE_SPREAD)  # and the demo's own results
        bands = boxes(chart.locator("rect.band"))
        strips = chart.locator("g.strip")
        assert strips.count() == len(bands)
        for i in range(strips.count()):
            # Each model's name and its dots lie inside one band of their own.
            band = bands[i]
            for item in boxes(strips.nth(i).locator("text.strip-label")) + boxes(strips.nth(i).locator("circle")):
                assert band["top"] <= item["top"] and item["bottom"] <= band["bottom"], (i, band, item)
        chart.screenshot(path=str(artifacts_dir() / f"speedups-wide-{name}.png"))
        shot(pg, f"problem-wide-{name}")
    finally:
        context.close()


def test_titles_and_reference_flags_break_between_words_on_a_phone(browser, seeded_server):
    context = browser.new_context(**PHONE)
    try:
        pg = context.new_page()
        for kb in ("level2/75", "level2/62", "level2/37", "level2/94", "level2/30", "level2/88"):
            pg.goto(f"{seeded_server.base}/problems/{kb}")
            title = pg.locator("h1")
            assert mid_word(title.evaluate(LINE_BREAKS_JS)) == [], title.inner_text()  # was "Hardtan h"
        pg.goto(f"{seeded_server.base}/submissions/{seeded_server.best_75_id}")
        flags = pg.locator("#provenance dd.torch-flags")
        assert "cuda.matmul.allow_fp16_reduced_precision_reduction=True" in flags.inner_text().replace("\n", "")
        assert mid_word(flags.evaluate(LINE_BREAKS_JS)) == []
        assert pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        pg.locator("#provenance").screenshot(path=str(artifacts_dir() / "provenance-phone.png"))
    finally:
        context.close()


TABLE_BOXES_JS = """ws => ws.map(w => ({right: w.getBoundingClientRect().right, overflow: getComputedStyle(w).overflowX,
  table: w.querySelector('table').scrollWidth, box: w.clientWidth, id: w.querySelector('table').id}))"""


def test_tables_scroll_in_their_own_box_and_the_verdicts_log_wraps_on_a_phone(browser, seeded_server):
    """Issue 33: at 390 px the home and problem tables and the submission page's 'why this verdict' log were cut off."""
    context = browser.new_context(**PHONE)
    try:
        pg = context.new_page()
        for path in ("/", "/problems/level2/75?verdict=all", f"/submissions/{seeded_server.best_75_id}"):
            pg.goto(seeded_server.base + path)
            width = pg.evaluate("window.innerWidth")
            tables = pg.locator(".table-wrap").evaluate_all(TABLE_BOXES_JS)
            assert tables, path
            for t in tables:  # each box stays on the screen and scrolls sideways itself when its table is wider
                assert t["right"] <= width + 1 and t["overflow"] == "auto", (path, t)
            if path == "/":  # the problems table fits: its headers and names wrap
                (home,) = tables
                assert home["table"] <= home["box"] + 1, home
        pg.goto(f"{seeded_server.base}/submissions/{seeded_server.compile_error_id}")
        logs = pg.locator("details.log[open] pre")
        assert logs.count() >= 1 and "why this verdict" in pg.locator("details.log summary").first.inner_text()
        for i in range(logs.count()):  # wrapped: nothing of it lies past the box's right edge
            assert logs.nth(i).evaluate("p => p.scrollWidth <= p.clientWidth + 1"), logs.nth(i).inner_text()[:200]
        shot(pg, "submission-log-phone")
    finally:
        context.close()
