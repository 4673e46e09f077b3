"""Before an evaluation: the target a fresh child sees, and the build dirs keyed by it, warmed on the CPU. No torch.

Compiling a submission's `load_inline` code takes tens of seconds of CPU and running it milliseconds of GPU, so a
worker's compile pool imports queued submissions in children that see no GPU (`precompile`), into the build dir that
their evaluation on the slot's target (`probe_device`) will use: a hash of the source and of what the target's build
depends on (`build_inputs`). Each build dir is used under its lock, as its last build left it, and sealed to its
outputs when the build is done (`sealed_when_built`, sandbox/builds.py). The runner starts the candidate's process
under the same lock and environment (`build_env`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import artifacts
from harness.config import Settings, get_settings
from harness.evaluation import windows
from harness.evaluation.handles import Trusted, TrustedFailed
from harness.sandbox import builds as build_dirs
from harness.sandbox import limits
from harness.sandbox.process import ChildExited, ChildProcess, Deadline, scrubbed_env
from harness.schema import Provenance
from harness.submission import InvalidSubmission, extract

log = logging.getLogger("harness.prebuild")

PROBE_TIMEOUT_S = 120.0  # a fresh trusted child: torch imported, the device probed


def build_inputs(target: Provenance) -> dict[str, str | None]:
    """What a build dir's key takes from its target (artifacts.build_key's keyword arguments)."""
    return {"arch": target.compute_capability or "cpu", "torch_version": target.torch_version,
            "cuda_version": target.cuda_version, "python": target.python_version}


def build_env(source: str, target: Provenance, settings: Settings, home: Path,
              extra_env: dict[str, str], shared: bool = True) -> tuple[Path, dict[str, str]]:
    """The build dir for this source on this target, and the environment a build there needs. `shared` False: a build
    dir in `home`, this process's alone, whatever the settings' build cache."""
    key = artifacts.build_key(source, **build_inputs(target))
    builds = artifacts.build_dir(settings, key) if settings.build_cache and shared else home / "build"
    builds.mkdir(exist_ok=True)
    env = {"TORCH_EXTENSIONS_DIR": str(builds), "MAX_JOBS": str(max(1, (os.cpu_count() or 2)))}
    if target.compute_capability:
        env["TORCH_CUDA_ARCH_LIST"] = target.compute_capability  # build for this GPU only
    env.update(windows.timing_env())  # as the trusted side's (Evaluation.start): the two time alike
    env.update(extra_env)
    return builds, env


def probe_device(device: str = "auto", settings: Settings | None = None,
                 extra_env: dict[str, str] | None = None) -> Provenance:
    """What a fresh child sees: device, GPU, torch/CUDA/Python versions. A worker asks once per slot."""
    settings = settings or get_settings()
    extra_env = extra_env or {}
    with artifacts.scratch_dir(settings) as work:
        proc = ChildProcess("harness.evaluation.trusted", [], cwd=work, env=scrubbed_env(extra_env, work),
                            log_path=work / "probe.log", kill_grace_s=settings.kill_grace_s)
        try:
            proc.next_message(time.monotonic() + PROBE_TIMEOUT_S)
            probed = Trusted(proc, PROBE_TIMEOUT_S).call({"cmd": "probe", "device": device}, "probed")
            return Provenance(started_at=datetime.now(timezone.utc), **probed)
        except (Deadline, ChildExited) as e:
            raise RuntimeError(f"probing device {device!r} failed: {e}\n{proc.log_tail()}") from None
        except TrustedFailed as e:
            raise RuntimeError(f"probing device {device!r} failed: {e}") from None
        finally:
            with contextlib.suppress(ChildExited):
                proc.send({"cmd": "exit"})
            proc.reap()


@dataclass
class PrecompileResult:
    ok: bool
    seconds: float
    log_tail: str


def precompile(text: str, target: Provenance, settings: Settings | None = None, *, timeout_s: float = 600.0,
               extra_env: dict[str, str] | None = None) -> PrecompileResult:
    """Warm the build cache for a submission on a CPU, ahead of its GPU evaluation.

    Imports the submission (which runs its load_inline builds) in a fresh child that sees no GPU,
    into the build dir its evaluation on `target` will use. The outcome decides nothing: a
    submission that needs the GPU at import fails here and simply compiles in its evaluation.
    """
    settings = settings or get_settings()
    t0 = time.monotonic()
    try:
        source = extract(text).source
    except InvalidSubmission as e:
        return PrecompileResult(False, 0.0, str(e))
    with artifacts.scratch_dir(settings) as home:
        builds, env = build_env(source, target, settings, home, {"CUDA_VISIBLE_DEVICES": "", **(extra_env or {})})
        (home / "submission.py").write_text(source)
        finished = False
        with artifacts.exclusive_build_dir(builds), sealed_when_built(builds, settings):
            proc = ChildProcess("harness.evaluation.child", ["--compile-only", str(home / "submission.py")], cwd=home,
                                env=scrubbed_env(env, home), log_path=home / "precompile.log",
                                kill_grace_s=settings.kill_grace_s,
                                jail=limits.jail(settings, untrusted=True, writable=[home, builds]))
            try:
                while True:
                    msg = proc.next_message(proc.started_at + timeout_s)
                    if msg.event in ("imported", "error"):
                        finished = msg.event == "imported"
                        break
            except (Deadline, ChildExited):
                pass
            finally:
                proc.reap()
        return PrecompileResult(finished, time.monotonic() - t0, proc.log_tail(4096))


def precompile_all(texts: list[str], target: Provenance, settings: Settings, workers: int | None = None,
                   **kw: Any) -> list[PrecompileResult]:
    """`precompile` each text, `workers` side by side (default: one per core), each in a child of its own; the
    results in the order of `texts`."""
    with ThreadPoolExecutor(max_workers=max(1, workers or os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda text: precompile(text, target, settings, **kw), texts))


@contextlib.contextmanager
def sealed_when_built(builds: Path, settings: Settings):
    """Within a build dir's lock: the dir as its last build left it (anything else there emptied, to be built again),
    then sealed when the build is done: its outputs only, read-only to the candidate (sandbox/builds.py). A dir of
    the evaluation's own (no build cache) outlives nothing: it is left as it is."""
    if not settings.build_cache:
        yield
        return
    build_dirs.restore(builds)
    try:
        yield
    finally:
        try:
            build_dirs.seal(builds)
        except OSError as e:  # what cannot be sealed is emptied at the next use (no manifest: restore empties it)
            log.warning("build dir %s could not be sealed (%s): it is emptied at its next use", builds, e)
            with contextlib.suppress(OSError):
                artifacts.build_manifest(builds).unlink()
