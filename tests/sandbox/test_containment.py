"""Hostile submissions against the real sandbox: each gets a verdict, the attack fails, the host is unaffected.

The fixtures (tests/fixtures/hostile/) raise `LEAK: ...` when an attack works, so a contained attack
on a correct model passes. Run as root (as CI does), the candidate has its own uid, network and mount
namespaces and cgroups; the tests that need one of those say so when the platform lacks it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.config import Settings
from harness.evaluation.runner import EvalOptions, evaluate
from harness.sandbox import capabilities, cgroups, limits
from harness.verdicts import Verdict

from ..conftest import FIXTURES, skip_or_fail

HOSTILE = FIXTURES / "hostile"


def _need(what: str) -> None:
    p = capabilities.platform()
    have = {"root": p.root, "netns": p.netns, "user": p.user_switch, "cgroup": p.cgroup is not None}[what]
    if not have:
        skip_or_fail("sandbox", f"the platform lacks {what}: {p.describe()}")


@pytest.fixture(scope="module")
def jail_settings(tmp_path_factory) -> Settings:
    root = tmp_path_factory.mktemp("contained")
    return Settings(data_dir=root / "data", scratch_dir=root / "scratch", timing_windows_cpu=3, window_ms_cpu=10.0,
                    window_fixed_cost_factor=0, correctness_trials=2, kill_grace_s=1.0, child_memory_mb=1536,
                    child_max_pids=256, child_disk_mb=64, compile_baseline="off")


def _run(registry, settings: Settings, name: str, **subs: object):
    text = (HOSTILE / name).read_text()
    for key, value in subs.items():
        text = text.replace(f"__{key.upper()}__", str(value))
    return evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), settings)


def _assert_contained(r) -> None:
    """A correct model whose attack failed: passed, or flagged by the static pre-check for trying."""
    assert r.verdict in (Verdict.passed, Verdict.flagged), r.message + r.log_excerpt
    assert r.verdict == Verdict.passed or r.message.startswith("correct"), r.message
    assert "LEAK" not in r.message + (r.observations.log_tail or "")


def _leftovers(settings: Settings) -> list[int]:
    """Live processes of sandbox uids that no jail holds. A uid held by a live jail (another evaluation on
    this host) is skipped; a free one is held while its processes are listed, so none can start meanwhile."""
    pids = []
    lock_dir = limits._uid_lock_dir()
    for uid in range(settings.sandbox_uid_base, settings.sandbox_uid_base + settings.sandbox_uid_count):
        fd = os.open(lock_dir / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        else:
            pids += limits.pids_of_uid(uid)
        finally:
            os.close(fd)
    return pids


def test_listing_a_uids_processes_survives_a_process_that_ends_meanwhile(monkeypatch):
    """A pid listed but gone by the time its status is read (a fork bomb's children die that way) is skipped,
    not an error: cleanup and the leftover check both rest on this listing."""
    real = os.listdir
    monkeypatch.setattr(limits.os, "listdir", lambda path: ["4194999999", "self", *real(path)])
    assert os.getpid() in limits.pids_of_uid(os.getuid())


def test_a_file_written_into_a_readable_tree_while_it_is_handed_over_stays_readable(tmp_path, monkeypatch):
    """The trusted side writes the exchange dir while the candidate's jail hands it to the sandbox group. A file that
    appeared between a chown pass and a separate chmod pass was made 0640 with root's group: the candidate could not
    read init.pt, and an honest submission got runtime_error (seen once on the CPU, two evaluations side by side)."""
    _need("root")
    tree = tmp_path / "exchange"
    tree.mkdir()
    (tree / "inputs_0.pt").write_bytes(b"x")
    real_walk = os.walk

    def walk_while_a_file_appears(path, *args, **kwargs):
        for i, listing in enumerate(real_walk(path, *args, **kwargs)):
            yield listing
            if i == 0:
                late = tree / "init.pt"
                late.write_bytes(b"y")
                late.chmod(0o644)

    monkeypatch.setattr(limits.os, "walk", walk_while_a_file_appears)
    limits._chown_tree(tree, 0, 4242, modes=(0o750, 0o640))
    st = (tree / "inputs_0.pt").stat()
    assert (st.st_gid, st.st_mode & 0o777) == (4242, 0o640)  # handed over: its group reads it
    st = (tree / "init.pt").stat()
    assert st.st_mode & 0o004, oct(st.st_mode)  # left as written: anyone reads it
    assert (tree.stat().st_gid, tree.stat().st_mode & 0o777) == (4242, 0o750)


def test_the_platform_probe_reports_what_it_found():
    p = capabilities.platform()
    assert p.describe()
    if p.root:
        _need("user")
        _need("netns")


def test_a_submission_cannot_connect_to_the_api_port_or_see_any_interface(registry, jail_settings):
    _need("netns")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        accepted: list[object] = []
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    accepted.append(server.accept())
                except OSError:
                    continue

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        r = _run(registry, jail_settings, "net_connect.py", port=server.getsockname()[1])
        stop.set()
        t.join(2)
    _assert_contained(r)
    assert not accepted
    assert "connect failed as it should" in (r.observations.log_tail or "")


def test_a_submission_reads_no_secret_and_runs_as_a_sandbox_uid(registry, jail_settings, monkeypatch):
    _need("user")
    monkeypatch.setenv("KH_SECRET_MARKER", "token-that-must-not-leak")
    data = jail_settings.data_dir
    data.mkdir(parents=True, exist_ok=True)
    db, token = data / "harness.db", data / "admin-token"
    db.write_text("KH_SECRET_MARKER sqlite")
    db.chmod(0o644)  # loose permissions: the mount namespace hides it anyway
    token.write_text("KH_SECRET_MARKER admin")
    other = data / "jobs" / "someone-else" / "submission.txt"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text("KH_SECRET_MARKER their source")
    r = _run(registry, jail_settings, "read_secrets.py", db=db, token=token, other=other)
    _assert_contained(r)
    log = r.observations.log_tail or ""
    assert f"uid {jail_settings.sandbox_uid_base}" in log or "uid 9" in log
    assert "groups []" in log


def test_a_sandbox_uid_without_a_passwd_entry_can_still_say_who_it_is(registry, jail_settings):
    # torch.compile's cache dir and the torch profiler (the kernel trace) call getpass.getuser().
    _need("user")
    r = _run(registry, jail_settings, "user_lookup.py")
    assert r.verdict == Verdict.passed, r.message + r.log_excerpt


def test_a_fork_bomb_ends_with_a_verdict_and_leaves_no_process(registry, jail_settings):
    _need("root")
    r = _run(registry, jail_settings, "fork_bomb.py")
    assert r.verdict in (Verdict.runtime_error, Verdict.timeout, Verdict.crashed), r.message
    assert not _leftovers(jail_settings)
    assert os.fork  # the host can still fork
    subprocess.run(["true"], check=True)
    leftover_cgroups = [d for d in cgroups.own_dirs().values() if d.exists()
                        for d in d.glob(f"kh-{os.getpid()}-*")]
    assert not leftover_cgroups


_SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _sysv(kind: str) -> list[dict[str, int]]:
    """The host's SysV IPC objects of one kind (shm, sem, msg), as /proc/sysvipc lists them."""
    lines = Path("/proc/sysvipc", kind).read_text().splitlines()
    names = lines[0].split()
    return [dict(zip(names, map(int, line.split()[:len(names)]), strict=False)) for line in lines[1:]]


def test_files_and_shared_memory_a_submission_leaves_do_not_outlive_its_evaluation(registry, jail_settings):
    _need("user")
    mark = uuid.uuid4().hex
    key = zlib.crc32(mark.encode()) & 0x7FFFFFFF
    r = _run(registry, jail_settings, "leave_behind.py", mark=mark)
    # It reaches SysV shared memory through ctypes, which the static pre-check names; it ran to the end all the same.
    assert r.verdict == Verdict.flagged and {f.check for f in r.flags} == {"static:ctypes"}, r.message + r.log_excerpt
    log = r.observations.log_tail or ""
    # The honest half: inside, each dir took the file and the segment was made.
    assert "wrote 100 bytes in ['/tmp', '/var/tmp', '/dev/shm'" in log, log
    assert "; shm segment -1" not in log, log
    assert not [d for d in _SHARED_DIRS if Path(d, f"kh-left-{mark}").exists()]
    assert not [s for s in _sysv("shm") if s["key"] == key]


def test_a_submission_sees_only_its_own_processes(registry, jail_settings):
    _need("user")
    mark = uuid.uuid4().hex
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", mark])
    try:
        r = _run(registry, jail_settings, "look_around.py", mark=mark)
    finally:
        host.kill()
        host.wait()
    _assert_contained(r)
    log = r.observations.log_tail or ""
    visible = int(log.split("visible pids: ")[1].split(";")[0])
    assert visible <= 5, log  # the namespace's init, the child, what the child itself started
    assert "parent 1" in log, log  # the namespace's init, not the evaluator


def test_the_launcher_ends_as_its_child_ended_and_leaves_nothing_running(jail_settings, tmp_path):
    """In a PID namespace the parent's pid is the launcher's, not the child's: the launcher must end with
    the child's exit code or signal (verdicts name them), and what the child left running ends with it."""
    _need("user")
    if not capabilities.platform().pidns:
        skip_or_fail("sandbox", f"the platform lacks a pid namespace: {capabilities.platform().describe()}")
    j = limits.jail(jail_settings, untrusted=True, writable=[tmp_path])
    j.setup()

    def launch(script: str, after_s: float = 0.5, kill: Callable[[int], None] | None = None) -> int:
        r, w = os.pipe()
        proc = subprocess.Popen([*j.launcher(w, tmp_path), "/bin/sh", "-c", script], pass_fds=(w,),
                                start_new_session=True)
        os.close(w)
        with os.fdopen(r, "rb") as status:
            assert status.read() == b""  # the exec happened
        if kill is not None:
            time.sleep(after_s)
            kill(proc.pid)
        return proc.wait(timeout=60)

    try:
        assert launch("exit 3") == 3
        assert launch("kill -XCPU $$") == -signal.SIGXCPU
        assert launch("kill -KILL $$") == -signal.SIGKILL
        # The parent's kill(): SIGTERM to the group first.
        assert launch("sleep 60", kill=lambda pid: os.killpg(pid, signal.SIGTERM)) == -signal.SIGTERM
        assert j.uid is not None
        assert launch("setsid sleep 300 & sleep 0.2; exit 0") == 0
        assert not limits.pids_of_uid(j.uid)  # the setsid sleeper ended with the child
        # The launcher alone SIGKILLed (as by a worker's death): the namespace ends with it.
        assert launch("setsid sleep 300 & sleep 60", kill=lambda pid: os.kill(pid, signal.SIGKILL)) == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while limits.pids_of_uid(j.uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not limits.pids_of_uid(j.uid)
    finally:
        j.cleanup()


def test_a_candidate_held_to_a_core_cannot_move_any_thread_off_it_and_is_let_go_after(jail_settings, tmp_path):
    """The CPU's one-core rounds hold the candidate by its cpuset (Jail.keep_to): a child that asks the scheduler
    for every core, from its main thread and from a new one, still runs on the one it is held to. Its honest twin,
    let go again, gets every core back."""
    _need("cgroup")
    if capabilities.platform().cores is None:
        skip_or_fail("sandbox", f"the platform has no cpuset: {capabilities.platform().describe()}")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nothing to hold a child away from")
    j = limits.jail(jail_settings, untrusted=True, writable=[tmp_path])
    j.setup()
    probe = ("import os, sys, threading\n"
             "for line in sys.stdin:\n"
             "    os.sched_setaffinity(0, range(os.cpu_count()))\n"
             "    seen = []\n"
             "    t = threading.Thread(target=lambda: (os.sched_setaffinity(0, range(os.cpu_count())),"
             " seen.append(sorted(os.sched_getaffinity(0)))))\n"
             "    t.start(); t.join()\n"
             "    print(sorted(os.sched_getaffinity(0)), seen[0], flush=True)\n")
    r, w = os.pipe()
    proc = subprocess.Popen([*j.launcher(w, tmp_path), sys.executable, "-c", probe], pass_fds=(w,),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as status:
            assert status.read() == b""
        assert proc.stdin is not None and proc.stdout is not None

        def ask() -> str:
            proc.stdin.write("where\n")
            proc.stdin.flush()
            return proc.stdout.readline().strip()

        assert j.keep_to([cores[-1]])
        assert ask() == f"[{cores[-1]}] [{cores[-1]}]"
        assert j.keep_to(None)
        assert ask() == f"{cores} {cores}"
    finally:
        proc.kill()
        proc.wait()
        j.cleanup()


def test_a_paused_candidate_stops_whole_a_process_that_left_its_group_included(jail_settings, tmp_path):
    """Between its turns in the timed rounds a candidate's processes are paused: its group, and what its jail holds
    beside (a setsid child, which a signal to the group would miss), so none of its work runs beside the trusted
    side's windows."""
    _need("user")
    from harness.sandbox.process import ChildProcess, scrubbed_env

    ticks = tmp_path / "ticks"
    root = str(Path(__file__).resolve().parents[2])
    proc = ChildProcess("tests.sandbox.ticker", [], cwd=Path(root), env=scrubbed_env(
        {"TICK_FILE": str(ticks), "TICK_ESCAPE": "1"}, tmp_path), log_path=tmp_path / "child.log", kill_grace_s=1.0,
        jail=limits.jail(jail_settings, untrusted=True, writable=[tmp_path]))

    def lines() -> list[str]:
        return ticks.read_text().split() if ticks.exists() else []

    try:
        deadline = time.monotonic() + 30
        while {"main", "thread", "escapee"} - set(lines()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {"main", "thread", "escapee"} <= set(lines()), (lines()[-5:], proc.log_tail())
        proc.pause()
        # Held by its jail's cgroup freezer where the host has one (a signal lifts no freezer), else a ptrace-stop.
        assert proc.pause_method == {"v2": "cgroup_freeze", "v1": "cgroup_v1_freezer", None: "ptrace"}[
            capabilities.platform().freezer]
        time.sleep(0.1)
        stopped = len(lines())
        time.sleep(0.5)
        assert len(lines()) == stopped
        proc.resume()
        time.sleep(0.5)
        assert {"main", "thread", "escapee"} <= set(lines()[stopped:])
    finally:
        proc.reap()  # continued first, then ended with all it left
    ended = len(lines())
    time.sleep(0.3)
    assert len(lines()) == ended


def test_cleanup_sweeps_what_a_sandbox_uid_left_in_shared_dirs_and_sysv_ipc(jail_settings, tmp_path):
    """What escaped the namespaces (or a platform without them) is removed by uid after the child; what
    belongs to anyone else stays."""
    _need("user")
    mark = uuid.uuid4().hex
    j = limits.jail(jail_settings, untrusted=True, writable=[tmp_path])
    j.setup()
    uid = j.uid
    assert uid is not None
    script = (f"head -c 100 /dev/zero > /var/tmp/kh-sweep-{mark} && mkdir /dev/shm/kh-sweep-{mark} && "
              f"head -c 100 /dev/zero > /dev/shm/kh-sweep-{mark}/f && ipcmk -M 4096 -p 0666 && ipcmk -S 1 && ipcmk -Q")
    subprocess.run(["/bin/sh", "-c", script], user=uid, group=uid, extra_groups=[], check=True,
                   capture_output=True, cwd="/")
    theirs = {k: [o for o in _sysv(k) if o["uid"] == uid] for k in ("shm", "sem", "msg")}
    assert all(theirs.values()), theirs
    root_file = Path("/var/tmp", f"kh-keep-{mark}")
    root_file.write_text("root's")
    root_shm = int(subprocess.run(["ipcmk", "-M", "4096"], check=True, capture_output=True, text=True)
                   .stdout.split()[-1])
    try:
        j.cleanup()
        assert not Path("/var/tmp", f"kh-sweep-{mark}").exists()
        assert not Path("/dev/shm", f"kh-sweep-{mark}").exists()
        assert not [o for k in ("shm", "sem", "msg") for o in _sysv(k) if o["uid"] == uid]
        assert root_file.read_text() == "root's"
        assert [o for o in _sysv("shm") if o["shmid"] == root_shm]
    finally:
        root_file.unlink()
        subprocess.run(["ipcrm", "-m", str(root_shm)], check=False)


def test_a_submission_deleting_outside_its_dirs_removes_nothing_of_ours(registry, jail_settings, tmp_path):
    _need("user")
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("still here")
    jail_settings.data_dir.mkdir(parents=True, exist_ok=True)
    (jail_settings.data_dir / "harness.db").write_text("db")
    r = _run(registry, jail_settings, "delete_outside.py", canary=canary, data=jail_settings.data_dir)
    _assert_contained(r)
    assert (canary / "keep.txt").read_text() == "still here"
    assert (jail_settings.data_dir / "harness.db").exists()


def test_a_200_gb_allocation_in_init_gets_a_verdict(registry, jail_settings):
    r = _run(registry, jail_settings, "alloc_200gb.py")
    assert r.verdict in (Verdict.runtime_error, Verdict.crashed), r.message


def test_touching_more_memory_than_the_cgroup_allows_kills_that_child_only(registry, jail_settings):
    _need("cgroup")
    r = _run(registry, jail_settings, "memory_touch.py", gib=3)
    assert r.verdict == Verdict.crashed, r.message + r.log_excerpt
    assert "SIGKILL" in r.message


def test_filling_the_disk_is_stopped_at_the_childs_share(registry, jail_settings):
    r = _run(registry, jail_settings, "disk_fill.py", files=40)
    assert r.verdict in (Verdict.crashed, Verdict.runtime_error), r.message
    assert "disk" in (r.observations.log_tail or "")
    assert "for its disk: the child wrote" in r.message, r.message
    scratch = jail_settings.scratch_dir
    assert scratch is not None and not list(scratch.glob("kh-eval-*")), "the scratch dir was not cleaned"


def test_a_child_over_its_disk_between_the_watchers_counts_is_caught_at_its_end(registry, jail_settings,
                                                                              monkeypatch):
    """The watcher counts every half second; a child can write past its share and be done in between (CI's disk
    did it in one). The count at its end gives the same verdict, and writes the same evidence into the log. Here the
    watcher never gets to count; the twin, under its share, passes."""
    from harness.sandbox.process import ChildProcess
    monkeypatch.setattr(ChildProcess, "disk_watch_interval_s", 3600.0)
    r = _run(registry, jail_settings, "disk_fill.py", files=12)
    assert r.verdict == Verdict.crashed, r.message
    assert "for its disk: the child wrote" in r.message, r.message
    assert "[harness] counted at its end: disk: the child wrote" in r.observations.log_tail, r.observations.log_tail
    honest = _run(registry, jail_settings, "disk_fill.py", files=2)
    assert honest.verdict == Verdict.passed, honest.message + honest.log_excerpt


def test_a_log_written_without_end_is_stopped_at_the_childs_share_of_log(registry, jail_settings):
    """Its stdout goes to a log on the harness's disk, outside its dirs: only RLIMIT_FSIZE (16 GiB) bounded it, and
    several evaluations' logs could fill the disk under the harness. Past its share of log (8 MiB here) it is killed,
    and the verdict says why; its twin writes 2 MiB and passes."""
    tight = jail_settings.model_copy(update={"child_log_mb": 8})
    r = _run(registry, tight, "log_flood.py", mb=400)
    assert r.verdict == Verdict.crashed, r.message
    assert "for its log: the child wrote" in r.message and "over its 8 MiB" in r.message, r.message
    assert r.job_dir is None or all(p.stat().st_size < 400 << 20 for p in Path(r.job_dir).glob("*.log"))
    _assert_contained(_run(registry, tight, "log_flood.py", mb=2))


def test_making_empty_files_without_end_is_stopped_at_the_childs_share_of_inodes(registry, jail_settings):
    """Empty files take inodes, not bytes: 200,000 of them are 800 MB at the 4 KiB a file the byte count charges,
    and two million fit in the default 8 GiB share. The watcher counts files and dirs too: past the child's share of
    them (5,000 here) it is killed, and the verdict says why. Its twin makes 300, as many as an honest build."""
    tight = jail_settings.model_copy(update={"child_disk_files": 5000, "child_disk_mb": 8192})
    r = _run(registry, tight, "inode_fill.py", files=200_000)
    assert r.verdict == Verdict.crashed, r.message
    assert "over its share of inodes" in r.message, r.message
    assert "more than 5000 files and dirs" in (r.observations.log_tail or "") + r.message
    _assert_contained(_run(registry, tight, "inode_fill.py", files=300))


def test_the_build_dir_keeps_only_its_builds_outputs_between_evaluations_of_one_text(registry, jail_settings):
    """A file a submission wrote into TORCH_EXTENSIONS_DIR at import was still there after its evaluation, and the
    next evaluation of the same text read it: a channel between evaluations. Once ModelNew is constructed the build
    dir holds only its build's outputs, as the harness's own read-only copies (a file kept open writes into a copy no
    one reads); the same text evaluated again finds its build ready (not rebuilt) and nothing else."""
    _need("user")
    settings = jail_settings.model_copy(update={"child_disk_mb": 8192, "child_memory_mb": 8192})  # a C++ build
    first = _run(registry, settings, "build_dir_channel.py")
    assert first.verdict == Verdict.passed, first.message + first.log_excerpt
    assert "cannot write after the build: PermissionError" in (first.observations.log_tail or "")
    (so,) = settings.builds_dir.glob("*/kh_test_channel/*.so")
    built_at, top = so.stat().st_mtime_ns, so.parent.parent
    kept = sorted(p.relative_to(top).as_posix() for p in top.rglob("*"))
    assert "channel.txt" not in kept and "late.txt" not in kept and "kh_test_channel/channel.txt" not in kept, kept
    assert all(p.stat().st_uid == os.geteuid() for p in so.parent.iterdir()), "the build's files are not the harness's"
    second = _run(registry, settings, "build_dir_channel.py")
    assert second.verdict == Verdict.passed, second.message + second.log_excerpt
    assert "LEAK" not in (second.observations.log_tail or ""), second.observations.log_tail
    assert so.stat().st_mtime_ns == built_at, "the same text's build was not found ready"


def test_opening_files_without_end_hits_the_open_files_limit(registry, jail_settings):
    r = _run(registry, jail_settings, "open_files.py")
    assert r.verdict == Verdict.runtime_error, r.message
    assert "Too many open files" in r.message + r.log_excerpt


def test_burning_cpu_at_import_is_ended_by_the_cpu_limit(registry, jail_settings):
    r = _run(registry, jail_settings.model_copy(update={"child_cpu_s": 6}), "cpu_burn.py")
    assert r.verdict in (Verdict.crashed, Verdict.timeout), r.message
    assert "SIGXCPU" in r.message or r.verdict == Verdict.timeout


def test_a_worker_refuses_an_unsafe_sandbox_unless_allowed(jail_settings):
    with pytest.raises(capabilities.UnsafeSandbox, match="allow-unsafe-sandbox"):
        capabilities.check_safe(jail_settings.model_copy(update={"sandbox_network": "off"}))
    capabilities.check_safe(jail_settings.model_copy(update={"sandbox_network": "off", "allow_unsafe_sandbox": True}))


def test_a_launcher_failure_is_the_harness_fault_not_the_submissions(registry, jail_settings, monkeypatch):
    monkeypatch.setattr(limits.Jail, "config", lambda self, cwd: {"cwd": "/nonexistent/kh"})
    r = _run(registry, jail_settings, "open_files.py")
    assert r.verdict == Verdict.infra_error, r.message
    assert "launcher" in r.message or "sandbox" in r.message


def test_uids_are_never_shared_between_live_jails(jail_settings, tmp_path):
    _need("user")
    a = limits.jail(jail_settings, untrusted=True, writable=[tmp_path])
    b = limits.jail(jail_settings, untrusted=True, writable=[tmp_path])
    a.setup()
    try:
        b.setup()
        try:
            assert a.uid is not None and b.uid is not None and a.uid != b.uid
            assert Path(tmp_path).stat().st_uid == b.uid
        finally:
            b.cleanup()
    finally:
        a.cleanup()
    assert a.uid is None and not a.cgroups


def test_cgroups_left_by_a_dead_worker_are_swept(jail_settings):
    _need("cgroup")
    pid = subprocess.Popen(["true"])  # a pid that is surely gone
    pid.wait()
    stale = [d / f"kh-{pid.pid}-deadbeef" for d in cgroups.own_dirs().values()
             if d.exists() and (d / "cgroup.procs").exists()]
    for d in stale:
        d.mkdir()
    swept = cgroups.sweep_stale()
    assert set(stale) <= set(swept) and not any(d.exists() for d in stale)


_BASE = (FIXTURES / "submissions" / "l75_pytorch_correct.py").read_text()


@pytest.mark.parametrize("text", [
    bytes(range(256)).decode("latin-1") * 4096,  # 1 MB of garbage
    _BASE.replace("import torch\n", "import torch\nx = '\x00'\n", 1),  # NUL bytes
    "```python\n" + _BASE + "\x00\n```",
    _BASE + "\nx = " + "(" * 100_000 + "1" + ")" * 100_000 + "\n",  # nested past the parser's limit
    _BASE + "\n" + "".join(" " * i + "if True:\n" for i in range(200)) + " " * 200 + "pass\n",
    _BASE + "\nx = " + "+".join(["1"] * 30_000) + "\n",  # an expression too deep for the compiler
], ids=["garbage-1mb", "nul", "fenced-nul", "nested-parens", "nested-blocks", "deep-expression"])
def test_hostile_texts_get_a_verdict(registry, jail_settings, text):
    r = evaluate(registry.get("level2/75"), text, EvalOptions(device="cpu", size="small"), jail_settings)
    assert r.verdict == Verdict.invalid_submission, r.message
    assert r.message


@pytest.mark.parametrize("command", [["worker", "--gpus", "none"], ["serve", "--open"]])
def test_the_worker_and_serve_commands_refuse_an_unsafe_sandbox(tmp_path, command):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.update(HARNESS_DATA_DIR=str(tmp_path / "data"), HARNESS_SANDBOX_NETWORK="off", HARNESS_PORT="0",
               PYTHONPATH=str(Path(__file__).parents[2]))
    p = subprocess.run([sys.executable, "-m", "harness", *command], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "--allow-unsafe-sandbox" in p.stderr and "network namespace" in p.stderr


def test_handing_a_tree_to_a_sandbox_uid_never_follows_links(jail_settings, tmp_path):
    _need("user")
    outside = tmp_path / "outside.txt"
    outside.write_text("root's")
    tree = tmp_path / "build"
    tree.mkdir()
    (tree / "link").symlink_to(outside)
    os.link(outside, tree / "hard")
    j = limits.jail(jail_settings, untrusted=True, writable=[tree])
    j.setup()
    try:
        assert tree.stat().st_uid == j.uid
        assert outside.stat().st_uid == 0
    finally:
        j.cleanup()


def test_a_problem_file_the_sandbox_user_cannot_read_is_an_infra_error_that_says_so(jail_settings, tmp_path):
    _need("user")
    from harness.problems import get_registry

    level = tmp_path / "kb" / "level2"
    level.mkdir(parents=True)
    builtin = Path(__file__).parents[2] / "harness/problems/kernelbench/level2/75_Gemm_GroupNorm_Min_BiasAdd.py"
    problem = level / builtin.name
    problem.write_text(builtin.read_text().replace("batch_size = 1024", "batch_size = 4").replace(
        "in_features = 8192", "in_features = 64").replace("out_features = 8192", "out_features = 64").replace(
        "num_groups = 512", "num_groups = 8"))
    problem.chmod(0o600)
    spec = get_registry(level).get("level2/75")
    assert spec.source_path == problem
    r = evaluate(spec, (FIXTURES / "submissions" / "l75_pytorch_correct.py").read_text(),
                 EvalOptions(device="cpu", timing=False), jail_settings)
    assert r.verdict == Verdict.infra_error and "world-readable" in r.message, r.message
    assert not _leftovers(jail_settings)
