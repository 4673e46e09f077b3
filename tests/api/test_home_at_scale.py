"""The home page over many results: what it shows is what it showed before it was made faster (a stored rendering
of a varied set), and the Python work it does per stored result stays small."""

from __future__ import annotations

import json
import os
import random
import re
import sys
from pathlib import Path

from harness import demo
from harness.api import pages
from harness.problems import get_registry
from harness.schema import Flag
from harness.verdicts import Verdict

from ..db.factories import eval_result, seed

SNAPSHOT = Path(__file__).resolve().parents[1] / "fixtures" / "pages" / "home.json"
# Every switch of the page: device, precision, baseline, grouping, and sorting.
VARIANTS = ("/", "/?by=submitter&baseline=compile", "/?by=pair", "/?device=cpu", "/?precision=bf16",
            "/?sort=best_compile&order=asc", "/?sort=pass_rate&order=desc",
            "/?device=cpu&by=submitter&baseline=compile")


def flagged(result, *checks: str):
    return result.model_copy(update={"flags": [Flag(check=c, detail="seeded") for c in checks]})


def seed_varied(db) -> None:
    """The demo set (every verdict, queued and running submissions), and what the boards must leave out or rank
    apart: CPU and bf16 results, infra errors, a result for an older version of a problem, passed results with
    flags that keep them off the boards, equal speedups, and no torch.compile time."""
    with db.session() as s:
        demo.seed_demo(s, get_registry().all(), seed=11, attempts=(2, 5))
    rng = random.Random(5)
    problems = [(spec.id, spec.kernelbench_id) for spec in get_registry().all()]
    for i in range(60):
        problem, kb = problems[i % len(problems)]
        device = "cpu" if i % 4 == 1 else "cuda"
        r = eval_result(problem=problem, kb=kb, device=device, candidate_ms=round(rng.uniform(0.4, 3.0), 2),
                        eager_ms=2.0, compile_ms=None if i % 4 == 0 else 1.5,
                        max_rel_err=1.0 if i % 5 == 0 else 1e-6,
                        precision="bf16" if i % 7 == 0 else "fp32")
        if i % 9 == 0:
            r = flagged(r, "no_custom_kernel")
        elif i % 11 == 0:
            r = flagged(r, "timing_unreliable", "precision_below_fp32")
        elif i % 13 == 0:
            r = flagged(r, "precision_below_fp32")
        if i % 17 == 0:
            r = r.model_copy(update={"verdict": Verdict.infra_error})
        if i % 19 == 0:
            r = r.model_copy(update={"problem": r.problem.model_copy(update={"version": 0})})
        seed(db, r, submitter=f"team-{i % 4}", model=f"model-{i % 5}")
    for who in ("tie-a", "tie-b"):  # equal speedups: the earlier submission is the best
        seed(db, eval_result(problem=problems[1][0], kb=problems[1][1], candidate_ms=0.25, eager_ms=2.0),
             submitter=who, model="model-0")


def main_of(html: str) -> str:
    return html.split("<main>", 1)[1].split("</main>", 1)[0]


def render_all(client) -> dict[str, str]:
    out = {}
    for path in VARIANTS:
        r = client.get(path)
        assert r.status_code == 200
        out[path] = main_of(r.text)
    return out


def test_home_shows_what_it_showed_before_for_a_varied_set(client, db):
    seed_varied(db)
    pages = render_all(client)
    if os.environ.get("HARNESS_WRITE_SNAPSHOTS"):  # to record a deliberate change of the page
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(json.dumps(pages, indent=1, sort_keys=True) + "\n")
    expected = json.loads(SNAPSHOT.read_text())
    for path in VARIANTS:
        assert pages[path] == expected[path], path
    assert len(re.findall(r'<path class="series"', pages["/"])) >= 4


def python_calls_of_home_page(db) -> int:
    """Python function calls made while the home page's content is assembled (the second time: the first fills the
    process's caches)."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    with db.session() as s:
        for profile in (None, count):
            sys.setprofile(profile)
            try:
                pages.home_page(s, get_registry(), device=None, baseline="eager", by="model", sort="problem",
                                descending=False)
            finally:
                sys.setprofile(None)
    return calls


def test_home_page_work_per_stored_result_is_bounded(db):
    # Counted in calls, not milliseconds, so that a loaded machine cannot fail it. Building boards of whole rows
    # through pydantic, reading each row by name and decoding each row's flags took 34 calls a result; 15 now.
    specs = get_registry().all()
    per_step, counts = 100, []
    for _ in range(2):
        for i in range(per_step):
            spec = specs[i % len(specs)]
            seed(db, eval_result(problem=spec.id, kb=spec.kernelbench_id, candidate_ms=0.5 + i / per_step,
                                 max_rel_err=1.0 if i % 3 == 0 else 1e-6), submitter=f"team-{i % 4}",
                 model=f"model-{i % 5}")
        counts.append(python_calls_of_home_page(db))
    assert (counts[1] - counts[0]) / per_step <= 20
