"""On a CUDA host (root, so the harness confines its children): does the exchange's device memory cross the sandbox?

    PYTHONPATH=$PWD python scripts/exchange_gpu_check.py

(a) The exchange probe (harness/evaluation/exchange_probe.py, as the runner runs it on auto): a trusted process
    exports device memory (exchange.create on cuda: the driver's VMM API, an fd), passed by SCM_RIGHTS to a child
    started through the harness's own confinement (its sandbox uid, PID namespace), which checks the bytes written
    there and writes its own, checked by the trusted side.
(b) One evaluation of level2/75 (its reference solution) through harness.evaluation.runner.evaluate on cuda with each
    exchange memory (HARNESS_EXCHANGE_MEMORY host, then device; one build cache, so only the first compiles): verdict,
    timing, the exchange memory the result records, and whether any .pt file was written under the scratch or data dir.
Prints PASS/FAIL lines; exits 1 on a FAIL.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def check_transfer() -> bool:
    from harness.config import Settings
    from harness.evaluation import exchange_probe
    from harness.evaluation.handles import Trusted
    from harness.sandbox import capabilities, limits
    from harness.sandbox.process import ChildProcess, scrubbed_env

    work = Path(tempfile.mkdtemp(prefix="kh-gpucheck-"))
    # Dirs of its own, made: the launcher hides the data dir from the child, so it must exist (the default,
    # ~/.local/share/kernelharness, need not on a fresh host).
    settings = Settings(data_dir=work / "data", scratch_dir=work / "scratch")
    settings.data_dir.mkdir()
    settings.scratch_dir.mkdir()
    home = work / "trusted"
    home.mkdir()
    proc = ChildProcess("harness.evaluation.trusted", [], cwd=home, env=scrubbed_env({}, home),
                        log_path=work / "trusted.log", kill_grace_s=5, jail=limits.jail(settings, untrusted=False),
                        fd_socket=True)
    try:
        proc.next_message(time.monotonic() + 120)
        t0 = time.monotonic()
        outcome = exchange_probe.run(Trusted(proc, 120), settings, work / "probe", work / "probe.log", {})
        seconds = time.monotonic() - t0
        proc.send({"cmd": "exit"})
    finally:
        proc.reap()
    f = outcome.child
    print(f"child: {f}  parent uid {os.getuid()} pidns {os.readlink('/proc/self/ns/pid')}; "
          f"user switch {capabilities.platform().user_switch}, pid namespace {capabilities.platform().pidns}; "
          f"probe {seconds:.2f} s")
    print(f"{'PASS' if outcome.failure is None else 'FAIL'} (a) the probe: device memory both ways across the "
          f"sandbox{'' if outcome.failure is None else ': ' + outcome.failure}")
    if outcome.failure is not None:
        print((work / "probe.log").read_text(errors="replace")[-4000:])
    other = bool(f) and f.get("uid") != os.getuid() and f.get("pidns") != os.readlink("/proc/self/ns/pid")
    print(f"{'PASS' if other else 'FAIL'} (a) the child ran in another uid ({f.get('uid')}) and PID namespace "
          f"({f.get('pidns')})")
    return outcome.failure is None and other


_EVAL_DATA = Path(tempfile.mkdtemp(prefix="kh-gpucheck-eval-"))  # both modes': the second finds the build


def check_evaluation(mode: str) -> bool:
    from harness.config import Settings
    from harness.evaluation.runner import EvalOptions, evaluate
    from harness.problems.registry import find_problem, get_registry

    data = _EVAL_DATA
    settings = Settings(data_dir=data / "data", scratch_dir=data / "scratch", exchange_memory=mode)
    spec = find_problem(get_registry(), "level2/75")
    text = next((ROOT / "reference_solutions").glob("level2_75_*.py")).read_text()
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for dirpath, _, files in os.walk(data):
                seen.update(os.path.join(dirpath, n) for n in files if n.endswith(".pt"))
            time.sleep(0.005)

    threading.Thread(target=watch, daemon=True).start()
    t0 = time.monotonic()
    r = evaluate(spec, text, EvalOptions(device="cuda"), settings)
    wall = time.monotonic() - t0
    stop.set()
    c = r.observations.candidate_timing
    e = r.observations.eager_timing
    print(f"evaluation ({mode}): verdict {r.verdict.value}: {r.message[:300]}; exchange memory "
          f"{r.observations.exchange_memory}")
    print(f"evaluation: wall {wall:.1f} s; candidate median {getattr(c, 'median_ms', None)} ms, eager median "
          f"{getattr(e, 'median_ms', None)} ms; phases {r.observations.phases}")
    print(f"evaluation: .pt files written: {sorted(seen) or 'none'}")
    ok = r.verdict.value in ("passed", "flagged")
    print(f"{'PASS' if ok else 'FAIL'} (b) level2/75 on cuda, exchange memory {mode}: {r.verdict.value}")
    used = (r.observations.exchange_memory or "").startswith(mode)
    print(f"{'PASS' if used else 'FAIL'} (b) the result records {mode} exchange memory: "
          f"{r.observations.exchange_memory}")
    print(f"{'PASS' if not seen else 'FAIL'} (b) no .pt file written ({len(seen)})")
    if not ok:
        print(r.log_excerpt[-4000:])
    return ok and used and not seen


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    results = []
    for name, check in (("transfer", check_transfer), ("evaluation host", lambda: check_evaluation("host")),
                        ("evaluation device", lambda: check_evaluation("device"))):
        t0 = time.monotonic()
        try:
            results.append(check())
        except Exception as e:  # a check that cannot run is a FAIL with its reason
            import traceback

            print(f"FAIL {name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            results.append(False)
        print(f"{name}: {time.monotonic() - t0:.1f} s")
    print("PASS all" if all(results) else "FAIL some")
    sys.exit(0 if all(results) else 1)
