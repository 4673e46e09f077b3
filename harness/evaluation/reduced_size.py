"""A problem's reduced size for the CPU where its file names none (a KernelBench folder's problems have only
`default`, at which a level2 reference alone reached 14.6 GB on a CPU).

It is chosen by the size probe (`size_probe`, the same search `selfcheck` runs): the file's own size constants are
halved until one forward pass of the reference fits a small time budget. The choice depends on this machine's speed,
so it is made once per problem file and kept in the data dir: `eval`, `eval-dir` and the service's workers sharing a
data dir run a problem at the same size, and every result records the constants it set (`ProblemRef.overrides`).
No torch here: the probe is a child process.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import artifacts
from harness.config import Settings
from harness.problems.spec import ProblemSpec, SizeVariant
from harness.sandbox.process import ChildExited, ChildProcess, Deadline, scrubbed_env

SMALL = "small"  # the size name every problem answers to on the CPU
FORWARD_BUDGET_S = 0.02  # one forward pass of the reference at the reduced size, as selfcheck sizes problems
SIZING_TIME_LIMIT_S = 180.0

_lock = threading.Lock()  # flock does not exclude a process's own threads (a worker's slots asking at once)


class SizingFailed(RuntimeError):
    """No reduced size could be found for a problem (the harness's trouble, never a submission's)."""


def probe(path: Path, *, device: str = "cpu", budget_s: float = FORWARD_BUDGET_S,
          time_limit_s: float = SIZING_TIME_LIMIT_S, threads: int | None = None) -> dict[str, Any]:
    """Run the size probe on a problem file: its `sized` fields (ok, overrides, size, forward_s), or
    {"ok": False, "error": ...}."""
    with tempfile.TemporaryDirectory(prefix="harness-size-") as tmp:
        home = Path(tmp)
        child = ChildProcess("harness.evaluation.size_probe", [], cwd=home, env=scrubbed_env({}, home),
                             log_path=home / "probe.log", kill_grace_s=2.0)
        try:
            request: dict[str, Any] = {"path": str(path.resolve()), "device": device, "budget_s": budget_s,
                                       "time_limit_s": time_limit_s}
            if threads is not None:
                request["threads"] = threads
            child.send(request)
            msg = child.next_message(time.monotonic() + time_limit_s + 60)
            if msg.event == "sized":
                return msg.fields
            return {"ok": False, "error": f"the size probe failed: {msg.fields.get('error')}"}
        except Deadline:
            return {"ok": False, "error": f"the size probe found no size in {time_limit_s:g} s"}
        except ChildExited:
            return {"ok": False, "error": f"the size probe exited: {child.log_tail(600).strip()[-600:]}"}
        finally:
            child.reap()


def small_variant(spec: ProblemSpec, settings: Settings) -> SizeVariant:
    """The problem's own `small` size, else the one chosen for its file on this data dir (chosen now if none was)."""
    if SMALL in spec.sizes:
        return spec.sizes[SMALL]
    digest = hashlib.sha256(spec.source_path.read_bytes()).hexdigest()[:24]
    path = artifacts.reduced_size_path(settings, f"{digest}-{FORWARD_BUDGET_S:g}")
    # One choice per file, across processes too (eval beside a worker on one data dir): the first chooses, the
    # others wait for it and read its choice.
    with _lock, open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            sized = probe(spec.source_path)
            if not sized.get("ok"):
                raise SizingFailed(f"no reduced CPU size found for {spec.id}: {sized.get('error')}")
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"problem": spec.id, "overrides": sized["overrides"], "size": sized["size"],
                                       "forward_s": sized.get("forward_s")}))
            tmp.replace(path)
        kept = json.loads(path.read_text())
    return SizeVariant(overrides=kept["overrides"])


def with_small(spec: ProblemSpec, settings: Settings) -> ProblemSpec:
    """The spec with a `small` size, reduced for the CPU where the file names none."""
    if SMALL in spec.sizes:
        return spec
    return spec.model_copy(update={"sizes": {**spec.sizes, SMALL: small_variant(spec, settings)}})
