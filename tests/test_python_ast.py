"""Parsing on many threads at once, as the API's request threads and a worker's compile threads do."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from harness.submission import extract

SOURCE = (Path(__file__).resolve().parents[1] / "reference_solutions"
          / "level2_62_matmul_groupnorm_leakyrelu_sum.py").read_text()


class _Finalized:
    """Cyclic garbage whose finalizer runs Python code: the collector runs it in whichever thread allocates,
    possibly in the middle of building an AST, and the GIL can pass to another thread there (SQLAlchemy's
    weakref callbacks do the same in the API process)."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


def test_extract_on_many_threads_at_once_never_fails_on_a_source_that_parses():
    # With ast.parse unguarded, CPython 3.11 raised SystemError("AST constructor recursion depth mismatch") here
    # within the first second in each of several runs on a 2-core machine (1-3 of 1,600 calls).
    errors: list[BaseException] = []
    deadline = time.monotonic() + 3
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible

    def work() -> None:
        while time.monotonic() < deadline and not errors:
            _Finalized()
            try:
                assert extract(SOURCE).source == SOURCE
            except BaseException as e:  # any failure is the finding
                errors.append(e)

    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, repr(errors[0])


def test_the_harness_parses_only_through_the_lock():
    """A new `ast.parse(` elsewhere would bring the race back on the threads it runs on."""
    harness = Path(__file__).resolve().parents[1] / "harness"
    unguarded = [str(p.relative_to(harness)) for p in harness.rglob("*.py")
                 if p.name != "python_ast.py" and "ast.parse(" in p.read_text().replace("python_ast.parse(", "")]
    assert unguarded == []
