"""The server-drawn SVG charts: fast_p steps, escaping of labels, one element per series."""

from __future__ import annotations

import re

import pytest

from harness.api import charts


def test_fast_p_steps_down_where_a_speedup_is_passed():
    # 4 problems: 3 correct at 0.5x, 1.2x, 2.0x; one failed (not in the values).
    pts = charts.step_points([0.5, 1.2, 2.0], 4, 3.0)
    assert pts[0] == (0.0, 0.75)
    assert pts[-1] == (3.0, 0.0)
    assert (0.5, 0.75) in pts and (0.5, 0.5) in pts and (1.2, 0.25) in pts and (2.0, 0.0) in pts


def test_fast_p_at_zero_counts_correct_results_without_a_time():
    assert charts.step_points([None, 1.5], 2, 3.0)[:2] == [(0.0, 1.0), (0.0, 0.5)]
    assert charts.step_points([], 0, 3.0) == [(0.0, 0.0), (3.0, 0.0)]


def test_one_path_per_series_and_labels_are_escaped():
    series = [charts.Series("<script>x</script>", [(0, 1), (3, 0)], "#000"), charts.Series("b", [(0, 0)], "#111")]
    svg = str(charts.fast_p_chart(series))
    assert len(re.findall(r"<path class=\"series\"", svg)) == 2
    assert "<script>" not in svg and "&lt;script&gt;x&lt;/script&gt;" in svg


def test_strips_timing_and_bar_draw_their_data():
    strips = str(charts.speedup_strips([charts.Strip("m", [0.5, 1.1], "#000", ["/submissions/1", "/submissions/2"])]))
    assert strips.count("<circle") == 2 and 'href="/submissions/2"' in strips
    timing = str(charts.timing_chart([charts.Spread("candidate", 100, 1.0, 1.1, 1.12, 1.5, 0.05, "#000")]))
    assert "1.1 ms" in timing and 'class="whisker"' in timing
    bar = str(charts.stacked_bar([charts.Share("passed", 3, "#0f0"), charts.Share("timeout", 1, "#f00")]))
    assert bar.count("<rect") == 2 and 'width="480"' in bar
    assert "no results yet" in str(charts.stacked_bar([]))


def test_log_ticks_are_round_and_few_whatever_the_spread():
    # Issue 18: from 0.013x to 82x every power of two was a tick ("0.0078125x" ... "128x"), labels overlapping.
    assert charts.log_ticks([0.013, 82]) == pytest.approx([0.01, 0.1, 1, 10, 100])
    assert charts.log_ticks([0.7, 1.3]) == [0.5, 1, 2]  # never narrower than 0.5x to 2x
    assert charts.log_ticks([0.3, 3.5]) == [0.25, 0.5, 1, 2, 4]
    assert charts.log_ticks([0.15, 9]) == pytest.approx([0.1, 1, 10])
    assert charts.log_ticks([1e-5, 1e5]) == pytest.approx([1e-6, 1e-3, 1, 1e3, 1e6])
    assert all(len(charts.log_ticks([lo, hi])) <= charts.MAX_LOG_TICKS
               for lo in (1e-4, 0.003, 0.07, 0.6) for hi in (1.5, 7, 33, 900, 2e4))
    assert [charts.speedup_label(t) for t in charts.log_ticks([0.013, 82])] == ["0.01×", "0.1×", "1×", "10×", "100×"]
