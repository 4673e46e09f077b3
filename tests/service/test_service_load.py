"""The service under an RL loop's load, CI-sized: locust users (benchmarks/locustfile.py) submit level2/62 attempts
one after another and poll them, against a live `harness serve --no-worker` whose queue limit they soon reach,
through benchmarks/service_load.py (the full-size run is that script's; README, Under load).

Nothing answers 5xx, every 202's submission is stored once with its client's text, nothing is stored unanswered,
and the 99th percentile of the submit latency stays under a bound a loaded 2-core machine meets (see the test).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _service_load():
    spec = importlib.util.spec_from_file_location("service_load", REPO / "benchmarks" / "service_load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["service_load"] = module
    spec.loader.exec_module(module)
    return module


def test_rl_clients_get_fast_answers_no_5xx_and_no_lost_or_duplicated_submission(tmp_path):
    service_load = _service_load()
    figures = service_load.run_load(tmp_path / "load", clients=32, duration=15, wait_s=0.2, worker=False,
                                    queue_limit=50)
    print("\nLOAD", figures)
    submit = figures["endpoints"]["submit"]
    statuses = figures["status_counts"]["submit"]
    assert set(statuses) <= {"202", "429"}, statuses
    assert all(set(c) <= {"200"} for name, c in figures["status_counts"].items() if name != "submit"), figures
    assert statuses.get("202") == figures["accepted"] == figures["stored"] == 50  # the queue limit, exactly
    assert statuses.get("429", 0) > 100, "the run never reached the queue limit it is meant to exercise"
    assert figures["lost"] == figures["duplicated"] == figures["unanswered_but_stored"] == 0, figures
    assert figures["submissions_with_other_than_one_job"] == 0, figures
    # 32 clients pausing 0.2 s on the 2-core VM, at load averages of 5-6 from other work: p99 109, 167 and 321 ms
    # (359 and 609 ms with a second load run beside it); 814 ms in a whole suite on a day the VM ran the same forward
    # at half its usual speed (cpu_core_speed.py). The pool deadlock that 64 clients once met (every 429 parsed and
    # written first) stalled requests for 30 s: the longest answer catches that on a host of any speed, the p99 a
    # tail grown several times over.
    assert submit["p99_ms"] < 1500, submit
    assert submit["max_ms"] < 20_000, submit
