"""Per-child cgroups (v2, or the v1 memory and pids hierarchies), made under this process's own.

A child's cgroup counts every descendant, even one that left the process group, so the memory and
process limits bind them all, cleanup can find and kill them, and its freezer pauses them all
(pause.py). Names are kh-<worker pid>-<random>: a starting worker removes those whose worker is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import uuid
from pathlib import Path

from harness.config import Settings

log = logging.getLogger("harness.sandbox")

_CGROUP = Path("/sys/fs/cgroup")


def own_dirs() -> dict[str, Path]:
    """controller -> this process's cgroup dir: {"unified": ...} on v2, {"memory": ..., "pids": ...} on v1 (with
    "freezer", "cpuacct" and "cpuset" where mounted; "unified" too on a hybrid host)."""
    dirs: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            v2 = _CGROUP / rel if (_CGROUP / "cgroup.controllers").exists() else _CGROUP / "unified" / rel
            dirs["unified"] = v2
        for c in controllers.split(","):
            if c in ("memory", "pids", "freezer", "cpuacct", "cpuset"):
                dirs[c] = _CGROUP / c / rel
    return dirs


def version() -> str | None:
    dirs = own_dirs()
    probe = f"kh-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    v2 = dirs.get("unified")
    if v2 is not None:
        try:
            controllers = (v2 / "cgroup.controllers").read_text().split()
        except OSError:
            controllers = []
        if {"memory", "pids"} <= set(controllers):
            with contextlib.suppress(OSError):
                (v2 / probe).mkdir()
                ok = (v2 / probe / "memory.max").exists() and (v2 / probe / "pids.max").exists()
                (v2 / probe).rmdir()
                if ok:
                    return "v2"
    if "memory" in dirs and "pids" in dirs:
        try:
            for c in ("memory", "pids"):
                (dirs[c] / probe).mkdir()
                (dirs[c] / probe).rmdir()
            return "v1"
        except OSError:
            return None
    return None


def freezer_version(limits: str | None) -> str | None:
    """Which freezer can hold a child: "v1" (the freezer controller) where the host's limits are v1 and it has one,
    else "v2" where a cgroup of this process's can be made in the unified hierarchy (its `cgroup.freeze` and
    `cpu.stat` need no controller, so a hybrid host without a v1 freezer has them too), else "v1" where that can be
    made; None where neither. v1's frozen tasks are not woken by signals; v2's are, for the kernel to freeze them
    again (pause.py)."""
    dirs = own_dirs()
    probe = f"kh-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    order = [("v2", "unified", "cgroup.freeze"), ("v1", "freezer", "freezer.state")]
    for version, key, state in order[::-1] if limits == "v1" else order:
        if key not in dirs:
            continue
        with contextlib.suppress(OSError):
            (dirs[key] / probe).mkdir()
            try:
                if (dirs[key] / probe / state).exists():
                    return version
            finally:
                (dirs[key] / probe).rmdir()
    return None


def create_freezer(version: str, made: list[Path]) -> tuple[Path, Path | None, list[Path]]:
    """The freezer of one child whose cgroups are `made`, and its CPU clock file (None: no cgroup counts its CPU),
    and the cgroups made for them (to join and remove with the rest). A v2 child cgroup is its own freezer."""
    dirs = own_dirs()
    name = made[0].name if made else f"kh-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if version == "v2":
        v2, new_v2 = _unified_child(made)
        return v2, v2 / "cpu.stat", new_v2
    new = []
    try:
        for c in ("freezer", "cpuacct"):
            if c in dirs:
                (dirs[c] / name).mkdir()
                new.append(dirs[c] / name)
    except OSError:
        for cg in new:
            remove(cg)
        raise
    clock = dirs["cpuacct"] / name / "cpuacct.usage" if "cpuacct" in dirs else None
    return dirs["freezer"] / name, clock, new


def cores_version(limits: str | None) -> str | None:
    """Which cgroup can hold a child to the cores it is given (`keep_to`): "v2" where the host's limits are v2 and
    a child cgroup there gets `cpuset.cpus` (the cpuset controller on in this cgroup's subtree_control), "v1" where a
    cpuset hierarchy is mounted and a cgroup can be made in it; None where neither."""
    dirs = own_dirs()
    probe = f"kh-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    key = "unified" if limits == "v2" else "cpuset"
    if key not in dirs:
        return None
    with contextlib.suppress(OSError):
        (dirs[key] / probe).mkdir()
        try:
            if (dirs[key] / probe / "cpuset.cpus").exists():
                return "v2" if key == "unified" else "v1"
        finally:
            (dirs[key] / probe).rmdir()
    return None


def create_cores(version: str, made: list[Path]) -> tuple[Path, list[Path]]:
    """The cgroup whose cpuset holds one child whose cgroups are `made`, with every core and memory node of this
    process's own, and the cgroups made for it (to join and remove with the rest). A v2 child cgroup is its own."""
    if version == "v2":
        return _unified_child(made)
    parent = own_dirs()["cpuset"]
    cg = parent / (made[0].name if made else f"kh-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    cg.mkdir()
    try:
        for name in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset starts empty: no task may join it until both are set
            (cg / name).write_text((parent / name).read_text().strip() or "0")
    except OSError:
        remove(cg)
        raise
    return cg, [cg]


def keep_to(cg: Path, cores: list[int] | None) -> bool:
    """Hold the processes of `cg` (a cpuset cgroup, `create_cores`) to `cores`, or give them every core of this
    process's cgroup again (None): no process inside can move off them, whatever it asks of the scheduler. False
    where the kernel refused."""
    try:
        value = (",".join(str(c) for c in cores) if cores is not None else
                 (cg.parent / "cpuset.cpus").read_text().strip() or (cg.parent / "cpuset.cpus.effective").read_text()
                 .strip())
        (cg / "cpuset.cpus").write_text(value)
        return True
    except OSError:
        return False


def _unified_child(made: list[Path]) -> tuple[Path, list[Path]]:
    """The child's v2 cgroup among `made`, else one made now (named as `made`'s are), and what was made for it."""
    unified = own_dirs()["unified"]
    v2 = next((cg for cg in made if cg.parent == unified), None)
    if v2 is not None:
        return v2, []
    v2 = unified / (made[0].name if made else f"kh-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    v2.mkdir()
    return v2, [v2]


def thaw(cg: Path) -> None:
    """Let a frozen cgroup's processes run (v1's frozen ones cannot even die until then)."""
    for state, value in (("cgroup.freeze", "0"), ("freezer.state", "THAWED")):
        if (cg / state).exists():
            with contextlib.suppress(OSError):
                (cg / state).write_text(value)


def create(settings: Settings, version: str) -> list[Path]:
    """The cgroups of one child, limits written; join them by writing a pid to each cgroup.procs."""
    s = settings
    name = f"kh-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    dirs = own_dirs()
    mem = str(s.child_memory_mb * 2**20) if s.child_memory_mb else None
    made: list[Path] = []
    try:
        if version == "v2":
            cg = dirs["unified"] / name
            cg.mkdir()
            made.append(cg)
            (cg / "pids.max").write_text(str(s.child_max_pids))
            if mem:
                (cg / "memory.max").write_text(mem)
                with contextlib.suppress(OSError):
                    (cg / "memory.swap.max").write_text("0")
        else:
            for c in ("pids", "memory"):
                cg = dirs[c] / name
                cg.mkdir()
                made.append(cg)
            (dirs["pids"] / name / "pids.max").write_text(str(s.child_max_pids))
            if mem:
                (dirs["memory"] / name / "memory.limit_in_bytes").write_text(mem)
    except OSError:
        for cg in made:
            remove(cg)
        raise
    return made


def procs(cg: Path) -> list[int]:
    """The processes in `cg` now (none where it cannot be read)."""
    try:
        return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def empty(cg: Path) -> None:
    thaw(cg)
    for _ in range(50):
        try:
            pids = [int(x) for x in (cg / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            return
        if (cg / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (cg / "cgroup.kill").write_text("1")
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def remove(cg: Path) -> None:
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)  # the last killed processes are still being reaped
    log.warning("cgroup %s could not be removed", cg)


def sweep_stale() -> list[Path]:
    """Remove the cgroups of children whose worker died (kh-<pid>-*, that pid gone), killing what is left."""
    swept = []
    for d in own_dirs().values():
        for cg in d.glob("kh-*-*"):
            try:
                pid = int(cg.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
                empty(cg)
                remove(cg)
                swept.append(cg)
    return swept
