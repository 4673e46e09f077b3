"""Whether the exchange's device segments cross the sandbox on this host, found out before an evaluation relies on it.

Device segments (exchange.py on CUDA: the driver's VMM API, an fd) depend on the driver, the platform and the
confinement; where they fail, every CUDA evaluation would fail, and a failure to attach in the candidate's process
would read as the submission's. So on CUDA, with the setting `exchange_memory` at auto, the runner asks once per
process and device (`choose`, cached): the trusted process exports a small device segment holding a byte pattern
(`export`, its command `exchange_export`), a child started as the candidate is (the same jail: its sandbox uid and PID
namespace) attaches it, checks the pattern and writes another (`main`), and the trusted side checks that one
(`verify`). Any failure, of whatever kind, means host segments for this process and device, the reason logged and
recorded in each result (`Observations.exchange_memory`).

No torch at import: the runner (which has none) starts the probe; the two children import it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import Settings
from harness.evaluation.handles import Trusted
from harness.evaluation.protocol import Channel
from harness.sandbox import limits
from harness.sandbox.process import ChildProcess, scrubbed_env

log = logging.getLogger("harness.exchange_probe")

PROBE_BYTES = 1 << 20  # rounded up to the allocation granularity on CUDA (2 MiB on an H100)
_TIMEOUT_S = 120.0  # the confined child imports torch and makes its CUDA context
_REASON_CHARS = 600

# What each probe found, per (device, GPU, visible devices): None where the device path works, else why not.
_found: dict[tuple[str, ...], str | None] = {}


def choose(setting: str, device: str, key: tuple[str, ...], probe: Callable[[], str | None]) -> tuple[str, str]:
    """The trial segments' device ("cpu" or "cuda") for an evaluation on `device`, and what the result records of
    it. `probe` runs the probe (None: it passed; else why not); it is called once per `key` in this process."""
    if device != "cuda":
        return "cpu", "host"
    if setting == "host":
        return "cpu", "host (setting)"
    if setting == "device":
        return "cuda", "device (setting)"
    if key not in _found:
        try:
            failure = probe()
        except Exception as e:  # a probe that cannot run at all says the same as one that failed
            failure = f"{type(e).__name__}: {e}"
        _found[key] = failure[:_REASON_CHARS] if failure is not None else None
        if failure is None:
            log.info("exchange memory on %s: device (probe passed)", "/".join(key))
        else:
            log.warning("exchange memory on %s: host, the device probe failed: %s", "/".join(key), failure)
    failure = _found[key]
    return ("cuda", "device (probe passed)") if failure is None else ("cpu", f"host (device probe failed: {failure})")


def forget() -> None:
    """Probe again next time (tests)."""
    _found.clear()


@dataclass(frozen=True)
class Outcome:
    failure: str | None  # None: the segment crossed both ways
    child: dict[str, Any] = field(default_factory=dict)  # what the confined child reported (uid, PID namespace)


def run(trusted: Trusted, settings: Settings, home: Path, log_path: Path, extra_env: dict[str, str],
        device: str = "cuda", timeout_s: float = _TIMEOUT_S) -> Outcome:
    """One probe: a `device` segment exported by `trusted` (in step, between evaluations), attached by a child
    confined as the candidate is, bytes checked both ways. Never raises: a failure is the Outcome's."""
    home.mkdir(mode=0o700, exist_ok=True)
    proc: ChildProcess | None = None
    try:
        # Started first: it imports torch while the trusted side exports.
        proc = ChildProcess(__name__, [], cwd=home, env=scrubbed_env(extra_env, home), log_path=log_path,
                            kill_grace_s=settings.kill_grace_s,
                            jail=limits.jail(settings, untrusted=True, writable=[home]), fd_socket=True)
        exported = trusted.call({"cmd": "exchange_export", "device": device}, "exchange_exported", timeout_s)
        if "error" in exported:
            return Outcome(f"the trusted side could not export: {exported['error']}")
        try:
            fds = trusted.proc.receive_fds(1)
            try:
                proc.send_fds(fds)
            finally:
                for fd in fds:
                    os.close(fd)
            proc.send(json.dumps(exported["segment"]))
            child = proc.next_message(time.monotonic() + timeout_s).fields
        finally:  # the segment let go whatever the child did
            verified = trusted.call({"cmd": "exchange_verify"}, "exchange_verified", timeout_s)
        if "error" in child:
            return Outcome(f"a confined child could not attach it: {child['error']}", child)
        if not child.get("bytes_ok"):
            return Outcome("a confined child read other bytes than the trusted side wrote", child)
        if "error" in verified:
            return Outcome(f"the trusted side did not read the child's bytes back: {verified['error']}", child)
        return Outcome(None, child)
    except Exception as e:
        tail = proc.log_tail(2000).strip() if proc is not None else ""
        return Outcome(f"{type(e).__name__}: {e}" + (f" (child log: {tail})" if tail else ""))
    finally:
        if proc is not None:
            proc.reap()


# --- the two children's sides --------------------------------------------------------------------------------------

def pattern(nbytes: int, salt: int, device: str) -> Any:
    import torch

    return ((torch.arange(nbytes, device=device) * 7 + salt) % 251).to(torch.uint8)


def export(device: str, send_fds: Callable[[list[int]], None]) -> tuple[Any, dict[str, Any]]:
    """The trusted side: a segment on `device` with the pattern in its first half, its descriptor sent; the segment
    (None on failure) and the reply's fields."""
    import torch

    from harness.evaluation import exchange

    seg = None
    try:
        seg = exchange.create(PROBE_BYTES, device)
        half = seg.nbytes // 2
        seg.write(0, pattern(half, 0, device))
        if device == "cuda":
            torch.cuda.synchronize()
        fd = seg.shared_fd()
        try:
            send_fds([fd])
        finally:
            os.close(fd)
        return seg, {"segment": seg.spec("probe")}
    except Exception as e:
        if seg is not None:
            seg.close()
        return None, {"error": f"{type(e).__name__}: {e}"}


def verify(seg: Any) -> dict[str, Any]:
    """The trusted side: the pattern the child wrote in the second half, read back; the segment closed."""
    import torch

    if seg is None:
        return {"error": "no segment exported"}
    try:
        half = seg.nbytes // 2
        got = seg.read(half, half, torch.device(seg.device))
        return {} if torch.equal(got, pattern(half, 1, seg.device)) else {"error": "other bytes came back"}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        seg.close()


def main(argv: list[str] | None = None) -> None:
    """The confined child: the segment attached as the candidate's process attaches its own (exchange.attach)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--fd-socket", type=int, required=True)
    args = parser.parse_args(argv)
    chan = Channel(args.channel_fd)
    try:
        import torch

        from harness.evaluation import exchange

        link = exchange.FdLink(args.fd_socket)
        spec = json.loads(sys.stdin.readline())
        (fd,) = link.receive(1)
        seg = exchange.attach(spec, fd)
        half = seg.nbytes // 2
        ok = bool(torch.equal(seg.view(0, half), pattern(half, 0, seg.device)))
        seg.view(half, half).copy_(pattern(half, 1, seg.device))
        if seg.device == "cuda":
            torch.cuda.synchronize()
        chan.send("attached", bytes_ok=ok, uid=os.getuid(), pidns=os.readlink("/proc/self/ns/pid"))
    except BaseException as e:
        chan.send("attached", error=f"{type(e).__name__}: {e}")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
