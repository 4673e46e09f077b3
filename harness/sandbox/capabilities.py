"""What the platform lets the sandbox do, probed once by running the launcher itself; and the rule
that a worker does not run with less unless told to.

See docs/security.md for the table of platforms and the fallback.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.config import Settings
from harness.sandbox import cgroups, pause

log = logging.getLogger("harness.sandbox")

_HARNESS_ROOT = Path(__file__).resolve().parents[2]


class SandboxError(RuntimeError):
    """The confinement could not be set up: the harness's fault, never the submission's."""


class UnsafeSandbox(RuntimeError):
    """The platform cannot confine children as required, and unsafe mode was not allowed."""


@dataclass(frozen=True)
class Platform:
    root: bool
    netns: bool  # a new network namespace can be made (as root, or through a user namespace)
    mountns: bool  # as root: a mount namespace hiding the data dir and other evaluations
    user_switch: bool  # as root: children can run as sandbox uids
    cgroup: str | None  # "v2", "v1" or None
    pidns: bool = False  # as root, with the mount namespace: a PID (and IPC) namespace of the child's own
    freezer: str | None = None  # "v2", "v1" or None (the candidate's pause is then a ptrace-stop: pause.py)
    cores: str | None = None  # "v2", "v1" or None: a cpuset that holds a candidate to the cores it is given
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"network namespace {'yes' if self.netns else 'NO'}",
                 f"sandbox user {'yes' if self.user_switch else ('NO' if self.root else 'n/a (not root)')}",
                 f"mount namespace {'yes' if self.mountns else 'no'}",
                 f"pid namespace {'yes' if self.pidns else 'no'}",
                 f"cgroup {self.cgroup or 'NO (no memory limit, no pids limit for root children)'}",
                 f"freezer {self.freezer or 'no (candidates are paused by ptrace)'}",
                 f"cpuset {self.cores or 'no (the CPU times candidates on every core)'}"]
        return ", ".join(parts)


def _try_launch(cfg: dict) -> str | None:
    """Run the launcher with `cfg` on `true`; None when it worked, else why not."""
    r, w = os.pipe()
    try:
        proc = subprocess.run([sys.executable, "-s", "-m", "harness.sandbox.confine", str(w), json.dumps(cfg),
                               "--", "/bin/true"], pass_fds=(w,), capture_output=True, timeout=30,
                              env={"PYTHONPATH": str(_HARNESS_ROOT)})
        os.close(w)
        w = -1
        msg = os.read(r, 4000).decode(errors="replace")
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    return None if proc.returncode == 0 else (msg or f"exit {proc.returncode}")


@functools.cache
def platform() -> Platform:
    root = os.geteuid() == 0
    notes = []
    net_cfg = {"netns": True} if root else {"netns": True, "userns": True}
    why = _try_launch(net_cfg)
    netns = why is None
    if not netns:
        notes.append(f"no network namespace: {why}")
    mountns = user_switch = pidns = False
    if root:
        jailed = {"hide": [tempfile.gettempdir()], "keep": [], "netns": True, "user": {"uid": 65534, "gid": 65534}}
        why = _try_launch(jailed)
        mountns = user_switch = why is None
        if why:
            notes.append(f"no mount namespace / user switch: {why}")
        else:
            why = _try_launch({**jailed, "ipcns": True, "pidns": True})
            pidns = why is None
            if why:
                notes.append(f"no pid/ipc namespace: {why}")
    cgroup = cgroups.version()
    found = Platform(root=root, netns=netns, mountns=mountns, user_switch=user_switch, cgroup=cgroup,
                     pidns=pidns, freezer=cgroups.freezer_version(cgroup), cores=cgroups.cores_version(cgroup),
                     notes=tuple(notes))
    log.info("sandbox platform: %s%s", found.describe(), "".join(f"; {n}" for n in found.notes))
    return found


def check_safe(settings: Settings) -> Platform:
    """For a worker: the platform must isolate the network and (as root) switch users, or unsafe mode is
    explicitly allowed. Raises UnsafeSandbox otherwise."""
    p = platform()
    missing = []
    if settings.sandbox_network != "off" and not p.netns:
        missing.append("a network namespace")
    elif settings.sandbox_network == "off":
        missing.append("a network namespace (HARNESS_SANDBOX_NETWORK=off)")
    if p.root and settings.sandbox_user != "off" and not p.user_switch:
        missing.append("a sandbox user")
    elif p.root and settings.sandbox_user == "off":
        missing.append("a sandbox user (HARNESS_SANDBOX_USER=off)")
    if missing:
        why = "; ".join(missing)
        if not settings.allow_unsafe_sandbox:
            raise UnsafeSandbox(f"the sandbox lacks {why} ({p.describe()}). Submissions could reach the network "
                                "or the worker's secrets. Fix the platform, or run with --allow-unsafe-sandbox "
                                "(HARNESS_ALLOW_UNSAFE_SANDBOX=1) to accept that.")
        log.warning("UNSAFE SANDBOX (allowed explicitly): it lacks %s", why)
    if p.freezer is None:
        if pause.ptrace_capable():
            log.warning("no cgroup freezer: candidates are paused between their turns by ptrace-stops")
        else:
            log.error("no cgroup freezer and no ptrace (CAP_SYS_PTRACE, seccomp): candidates cannot be paused between "
                      "their turns, so every timed evaluation ends in infra_error; give the worker a writable cgroup "
                      "or ptrace")
    if p.user_switch and not p.pidns:
        log.warning("no pid/ipc namespace: children see the host's processes and share its SysV IPC; what a "
                    "sandbox uid leaves there is removed after each child")
    if p.cgroup is not None or p.freezer is not None:
        swept = cgroups.sweep_stale()
        if swept:
            log.warning("removed %d cgroups left by dead workers", len(swept))
    else:
        log.warning("no usable cgroup: children have rlimits but no host-memory limit%s",
                    "" if p.user_switch else " and (as root) no process-count limit")
    return p
