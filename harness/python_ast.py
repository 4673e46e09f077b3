"""`ast.parse` for a process with threads (the API's request pool, a worker's compile threads).

CPython 3.11 keeps the AST constructor's recursion counter in interpreter-wide state. When a thread
switch lands inside the conversion (a collection running a finalizer or a weakref callback, as SQLAlchemy
registers, is enough), a second `ast.parse` moves the first one's counter, and the first raises
`SystemError: AST constructor recursion depth mismatch` on a source that parses. One lock around every
parse of the harness keeps two conversions from overlapping; parsing is C code that holds the GIL, so the
lock costs no parallelism. Handing every parse to one parser thread instead was slower here (`extract` of
level2/62 sources on 1, 8 and 40 threads: 4,000-6,000 calls/s against 5,300-7,500 with the lock, 0.17 against
0.15 ms alone), though fairer under heavy contention (p99 18-20 ms against 37-40 ms with 40 threads parsing
nothing else); the API parses only what it accepts, so its parses rarely meet.
"""

from __future__ import annotations

import ast
import threading

_PARSE_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """`ast.parse(source)`, one at a time in this process. Raises what ast.parse raises."""
    with _PARSE_LOCK:
        return ast.parse(source)
