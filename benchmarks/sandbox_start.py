"""Cost of starting one confined child, side by side: the launcher as it was (network + mount namespace,
sandbox uid), the launcher with the PID and IPC namespaces and private shared dirs, and bubblewrap with
the same namespaces (as root, where it cannot give the child a uid of its own). Each start runs
`/bin/true` (the child's own start is the same in every case); the rounds interleave the variants so that
a busy host slows them alike. Then the cost of the sweep after a child. Run as root:

    python benchmarks/sandbox_start.py [--rounds 21]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.config import Settings
from harness.sandbox import capabilities, limits, sweep


def _launch(cfg: dict) -> float:
    r, w = os.pipe()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-s", "-m", "harness.sandbox.confine", str(w), json.dumps(cfg), "--",
                             "/bin/true"], pass_fds=(w,), start_new_session=True)
    os.close(w)
    failure = os.read(r, 4000)
    code = proc.wait()
    elapsed = time.perf_counter() - t0
    os.close(r)
    if failure or code != 0:
        raise SystemExit(f"launch failed ({code}): {failure.decode(errors='replace')}")
    return elapsed


def _bwrap(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    p = capabilities.platform()
    if not (p.user_switch and p.pidns):
        raise SystemExit(f"needs root with a sandbox user and a pid namespace: {p.describe()}")
    root = Path(tempfile.mkdtemp(prefix="kh-bench-"))
    settings = Settings(data_dir=root / "data", scratch_dir=root / "scratch")
    home = root / "scratch" / "home"
    home.mkdir(parents=True)
    j = limits.jail(settings, untrusted=True, writable=[home])
    j.setup()
    try:
        new = j.config(home)
        shared = {str(d) for d in sweep.shared_dirs()}
        old = {k: v for k, v in new.items() if k not in ("pidns", "ipcns")}
        old["hide"] = [h for h in new["hide"] if h not in shared or h == str(Path(tempfile.gettempdir()).resolve())]
        variants = {"launcher before (net + mount ns, uid)": lambda: _launch(old),
                    "launcher now (+ pid, ipc ns, private shared dirs)": lambda: _launch(new)}
        bwrap = shutil.which("bwrap")
        if bwrap:
            argv = [bwrap, "--dev-bind", "/", "/", "--unshare-net", "--unshare-ipc", "--unshare-pid", "--proc", "/proc",
                    "--die-with-parent", *[a for d in sorted(shared) for a in ("--tmpfs", d)], "/bin/true"]
            variants["bwrap (same namespaces, no uid switch)"] = lambda: _bwrap(argv)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, run in variants.items():
                times[name].append(run())
        sweeps = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            sweep.sweep_uid(j.uid or 0)
            sweeps.append(time.perf_counter() - t0)
    finally:
        j.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{os.uname().nodename}, {os.cpu_count()} cores, kernel {os.uname().release}, {args.rounds} rounds")
    for name, ts in times.items():
        print(f"{name:52s} median {statistics.median(ts) * 1e3:6.1f} ms  (min {min(ts) * 1e3:.1f}, "
              f"max {max(ts) * 1e3:.1f})")
    print(f"{'sweep of one uid (shared dirs + SysV IPC)':52s} median {statistics.median(sweeps) * 1e3:6.1f} ms  "
          f"(min {min(sweeps) * 1e3:.1f}, max {max(sweeps) * 1e3:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
