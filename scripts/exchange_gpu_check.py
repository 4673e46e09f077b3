"""On a CUDA host (root, so the harness confines its children): does the exchange's device memory cross the sandbox?

    PYTHONPATH=$PWD python scripts/exchange_gpu_check.py

(a) A buffer of device memory made here (exchange.create on cuda: the driver's VMM API, an fd) is passed by SCM_RIGHTS
    to a child started through the harness's own confinement (its sandbox uid, PID namespace), which checks the bytes
    written here and writes its own, checked here.
(b) One evaluation of level2/75 (its reference solution) through harness.evaluation.runner.evaluate on cuda: verdict,
    timing, and whether any .pt file was written under the scratch or data dir.
Prints PASS/FAIL lines; exits 1 on a FAIL.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NBYTES = 4 << 20


def child(argv: list[str]) -> None:
    """The confined side: --channel-fd N --fd-socket M (as ChildProcess starts a module)."""
    import torch

    from harness.evaluation import exchange
    from harness.evaluation.protocol import Channel

    chan = Channel(int(argv[argv.index("--channel-fd") + 1]))
    link = exchange.FdLink(int(argv[argv.index("--fd-socket") + 1]))
    try:
        spec = json.loads(sys.stdin.readline())
        (fd,) = link.receive(1)
        seg = exchange.attach(spec, fd)
        half = seg.nbytes // 2
        want = (torch.arange(half, device="cuda") % 251).to(torch.uint8)
        got_ok = bool(torch.equal(seg.view(0, half), want))
        seg.view(half, half).copy_(255 - want)
        torch.cuda.synchronize()
        chan.send("checked", bytes_ok=got_ok, uid=os.getuid(), pidns=os.readlink("/proc/self/ns/pid"),
                  pid=os.getpid())
    except BaseException as e:
        chan.send("checked", error=f"{type(e).__name__}: {e}")
    sys.stdout.flush()
    os._exit(0)


def check_transfer() -> bool:
    import torch

    from harness.config import Settings
    from harness.evaluation import exchange
    from harness.sandbox import capabilities, limits
    from harness.sandbox.process import ChildProcess, scrubbed_env

    settings = Settings()
    home = Path(tempfile.mkdtemp(prefix="kh-gpucheck-"))
    seg = exchange.create(NBYTES, "cuda")
    half = seg.nbytes // 2
    want = (torch.arange(half, device="cuda") % 251).to(torch.uint8)
    seg.write(0, want)
    torch.cuda.synchronize()
    jail = limits.jail(settings, untrusted=True, writable=[home], visible=[ROOT / "scripts"])
    proc = ChildProcess("scripts.exchange_gpu_check", ["--child"], cwd=home, env=scrubbed_env({}, home),
                        log_path=home / "child.log", kill_grace_s=5, jail=jail, fd_socket=True)
    try:
        fd = seg.shared_fd()
        proc.send_fds([fd])
        os.close(fd)
        proc.send(json.dumps(seg.spec("check")))
        msg = proc.next_message(time.monotonic() + 120)
    finally:
        proc.reap()
    f = msg.fields
    print(f"child: {f}  parent uid {os.getuid()} pidns {os.readlink('/proc/self/ns/pid')}; "
          f"user switch {capabilities.platform().user_switch}, pid namespace {capabilities.platform().pidns}")
    if "error" in f:
        print(f"FAIL (a) the child could not import the buffer: {f['error']}\n{proc.log_tail()}")
        return False
    back = torch.equal(seg.read(half, half, torch.device("cuda")), 255 - want)
    other = f["uid"] != os.getuid() and f["pidns"] != os.readlink("/proc/self/ns/pid")
    ok = bool(f["bytes_ok"]) and back
    print(f"{'PASS' if ok else 'FAIL'} (a) bytes both ways: parent->child {f['bytes_ok']}, child->parent {back}")
    print(f"{'PASS' if other else 'FAIL'} (a) the child ran in another uid ({f['uid']}) and PID namespace "
          f"({f['pidns']})")
    seg.close()
    return ok and other


def check_evaluation() -> bool:
    from harness.config import Settings
    from harness.evaluation.runner import EvalOptions, evaluate
    from harness.problems.registry import find_problem, get_registry

    data = Path(tempfile.mkdtemp(prefix="kh-gpucheck-eval-"))
    settings = Settings(data_dir=data / "data", scratch_dir=data / "scratch")
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
    print(f"evaluation: verdict {r.verdict.value}: {r.message[:300]}")
    print(f"evaluation: wall {wall:.1f} s; candidate median {getattr(c, 'median_ms', None)} ms, eager median "
          f"{getattr(e, 'median_ms', None)} ms; phases {r.observations.phases}")
    print(f"evaluation: .pt files written: {sorted(seen) or 'none'}")
    ok = r.verdict.value in ("passed", "flagged")
    print(f"{'PASS' if ok else 'FAIL'} (b) level2/75 on cuda: {r.verdict.value}")
    print(f"{'PASS' if not seen else 'FAIL'} (b) no .pt file written ({len(seen)})")
    if not ok:
        print(r.log_excerpt[-4000:])
    return ok and not seen


if __name__ == "__main__":
    if "--child" in sys.argv:
        child(sys.argv)
    results = []
    for check in (check_transfer, check_evaluation):
        try:
            results.append(check())
        except Exception as e:  # a check that cannot run is a FAIL with its reason
            import traceback

            print(f"FAIL {check.__name__}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            results.append(False)
    print("PASS all" if all(results) else "FAIL some")
    sys.exit(0 if all(results) else 1)
