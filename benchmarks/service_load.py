"""The service under an RL loop's load, and its pages with many results stored.

    python benchmarks/service_load.py --clients 64 --duration 600 --json docs/results/service-load-<sha>.json

1. Pages: on SQLite and on PostgreSQL (a throwaway server, as the test suite starts one), `--results` finished
   submissions stored through the queue path a worker takes (create, claim, complete; demo results over the six
   problems), then each page asked for several times from a live `harness serve --no-worker`.
2. Load: on the SQLite data dir of step 1, `harness serve --no-worker --open` and one worker slot beside it
   (`harness worker --gpus none`, one CPU slot evaluating at the problems' small sizes, at nice 10: its evaluations
   stand for a GPU host's, which would not share the API's cores), and `--clients` locust users
   (benchmarks/locustfile.py) submitting one after another for `--duration` seconds.
   Then: every accepted submission (its 202's id) is in the database with the text its client sent, once; no
   stored submission of the run went unanswered; the worker took the run's jobs in the queue's documented order
   (one problem, one priority: oldest first); and the percentiles per endpoint from every request.

Prints the figures and writes them as JSON with the machine, the versions and the load average before and after
(the run shares the machine with whatever else runs there; the figures say how loaded it was).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.config import Settings  # noqa: E402
from harness.db.models import Job, Submission  # noqa: E402
from harness.db.session import Database  # noqa: E402
from harness.demo import MODELS, demo_result, store  # noqa: E402
from harness.problems import get_registry  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(data_dir: Path, database_url: str | None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HARNESS_DATA_DIR": str(data_dir), "CUDA_VISIBLE_DEVICES": "",
           **extra}
    if database_url:
        env["HARNESS_DATABASE_URL"] = database_url
    return env


def start_server(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    with open(log, "a") as out:
        cmd = [sys.executable, "-m", "harness", "serve", "--no-worker", "--open", "--port", str(port)]
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=5).status_code in (200, 503):
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"harness serve exited ({proc.returncode}); see {log}")
        time.sleep(0.3)
    stop(proc)
    raise RuntimeError(f"harness serve did not answer in 120 s; see {log}")


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def seed_results(settings: Settings, n: int) -> tuple[float, int]:
    """n finished submissions with graded results, as a worker stores them; returns (seconds, one submission id)."""
    registry = get_registry()
    specs = registry.all()
    rng = random.Random(7)  # noqa: S311 - made-up results, not secrets
    db = Database(settings)
    t0 = time.perf_counter()
    sid = 0
    try:
        with db.session() as s:
            for i in range(n):
                m = MODELS[i % len(MODELS)]
                spec = specs[i % len(specs)]
                outcome = "passed" if rng.random() < m.pass_rate else "wrong_answer"
                text, result = demo_result(rng, spec, outcome, model=m.model, attempt=i, skill=m.skill)
                sid = store(s, spec, text, result, submitter=f"{m.submitter}-{i % 8}", model=m.model)
    finally:
        db.dispose()
    return time.perf_counter() - t0, sid


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(p / 100 * len(values)) - 1))]


def _summary(seconds: list[float]) -> dict[str, float]:
    return {"n": len(seconds), **{f"p{p}_ms": round(1000 * _pct(seconds, p), 1) for p in (50, 95, 99)},
            "max_ms": round(1000 * max(seconds), 1)}


def time_pages(base: str, sid: int, repeats: int) -> dict[str, dict[str, float]]:
    pages = {"home (leaderboards, html)": "/", "problem page (ranked results, html)": "/problems/level2/62",
             "leaderboard (api)": "/api/leaderboard?problem=level2/62", "submission list (api)": "/api/submissions",
             "submission page (html)": f"/submissions/{sid}", "submission (api)": f"/api/submissions/{sid}"}
    out = {}
    with httpx.Client(base_url=base, timeout=120) as c:
        for name, path in pages.items():
            r = c.get(path)  # first answer apart: it fills the process's caches (templates, the registry)
            if r.status_code != 200:
                raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")
            first = r.elapsed.total_seconds()
            runs = []
            for _ in range(repeats):
                t = time.perf_counter()
                c.get(path).raise_for_status()
                runs.append(time.perf_counter() - t)
            out[name] = {"path": path, "first_ms": round(1000 * first, 1),
                         "median_ms": round(1000 * statistics.median(runs), 1),
                         "max_ms": round(1000 * max(runs), 1), "n": repeats}
    return out


def pages_on(label: str, data_dir: Path, database_url: str | None, n: int, repeats: int) -> dict:
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(data_dir=data_dir, database_url=database_url)
    seed_s, sid = seed_results(settings, n)
    print(f"{label}: stored {n} results in {seed_s:.0f} s", flush=True)
    server, base = start_server(_env(data_dir, database_url), data_dir / "serve-pages.log")
    try:
        pages = time_pages(base, sid, repeats)
    finally:
        stop(server)
    for name, f in pages.items():
        print(f"  {label:10} {name:38} median {f['median_ms']:7.1f} ms  max {f['max_ms']:7.1f} ms", flush=True)
    return {"results": n, "stored_s": round(seed_s, 1), "pages": pages}


def run_load(data_dir: Path, clients: int, duration: int, wait_s: float, worker: bool,
             queue_limit: int | None = None) -> dict:
    """The load phase; its figures and checks. `queue_limit`: HARNESS_MAX_QUEUED_PER_TOKEN (None: the default)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = _env(data_dir, None, **({"HARNESS_MAX_QUEUED_PER_TOKEN": str(queue_limit)} if queue_limit else {}))
    server, base = start_server(env, data_dir / "serve-load.log")
    procs = []
    record = data_dir / "requests.jsonl"
    db = Database(Settings(data_dir=data_dir), migrate_now=False)
    with db.session() as s:
        first_id = (s.query(Submission.id).order_by(Submission.id.desc()).limit(1).scalar() or 0) + 1
    db.dispose()
    try:
        if worker:
            with open(data_dir / "worker.log", "a") as out:
                procs.append(subprocess.Popen(["nice", "-n", "10", sys.executable, "-m", "harness", "worker",
                                               "--gpus", "none", "--compile-workers", "0"],
                                              env={**env, "HARNESS_ALLOW_UNSAFE_SANDBOX": "1"}, stdout=out,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        locust = [sys.executable, "-m", "locust", "-f", str(REPO / "benchmarks" / "locustfile.py"), "--headless",
                  "-u", str(clients), "-r", str(clients), "-t", f"{duration}s", "-H", base, "--only-summary",
                  "--stop-timeout", "30", "--loglevel", "WARNING"]
        t0, cpu0 = time.monotonic(), cpu_seconds(server.pid)
        with open(data_dir / "locust.log", "w") as out:
            subprocess.run(locust, env={**env, "KH_LOAD_RECORD": str(record), "KH_LOAD_WAIT_S": str(wait_s)},
                           check=False, timeout=duration + 180, stdout=out, stderr=subprocess.STDOUT)
        wall, server_cpu = time.monotonic() - t0, cpu_seconds(server.pid) - cpu0
    finally:
        for p in procs:
            stop(p)
        stop(server)
    figures = check_run(data_dir, record, first_id)
    served = sum(sum(c.values()) for c in figures["status_counts"].values())
    # The server's CPU per answer: what a request costs it, whatever else the machine runs meanwhile.
    return {"wall_s": round(wall, 1), "requests_per_s": round(served / wall, 1), "server_cpu_s": round(server_cpu, 1),
            "server_cpu_ms_per_request": round(1000 * server_cpu / max(served, 1), 2), **figures}


def check_run(data_dir: Path, record: Path, first_id: int) -> dict:
    per_endpoint: dict[str, list[float]] = defaultdict(list)
    statuses: dict[str, Counter] = defaultdict(Counter)
    accepted: dict[int, list[str]] = defaultdict(list)
    for line in record.read_text().splitlines():
        row = json.loads(line)
        if "accepted" in row:
            accepted[row["accepted"]].append(row["marker"])
        else:
            per_endpoint[row["endpoint"]].append(row["s"])
            statuses[row["endpoint"]][str(row["status"])] += 1
    db = Database(Settings(data_dir=data_dir), migrate_now=False)
    try:
        with db.session() as s:
            subs = dict(s.query(Submission.id, Submission.text).filter(Submission.id >= first_id).all())
            jobs = s.query(Job.id, Job.submission_id, Job.status, Job.attempts, Job.claimed_at).filter(
                Job.submission_id >= first_id).all()
    finally:
        db.dispose()
    # Lost: a 202's id with no row, or a row with another client's text (each text carries its marker).
    lost = [sid for sid, markers in accepted.items()
            if sid not in subs or not re.search(rf"[Aa]ttempt {re.escape(markers[0])}\b", subs[sid])]
    duplicated = [sid for sid, markers in accepted.items() if len(markers) > 1]
    unanswered = sorted(set(subs) - set(accepted))  # stored, but its client never saw the 202
    jobs_per_sub = Counter(j.submission_id for j in jobs)
    claimed = sorted((j for j in jobs if j.claimed_at is not None and j.attempts == 1), key=lambda j: j.claimed_at)
    out_of_order = sum(1 for a, b in itertools.pairwise(claimed) if b.id < a.id)
    return {
        "endpoints": {name: _summary(v) for name, v in sorted(per_endpoint.items())},
        "status_counts": {name: dict(c) for name, c in sorted(statuses.items())},
        "accepted": len(accepted), "stored": len(subs), "lost": len(lost), "duplicated": len(duplicated),
        "unanswered_but_stored": len(unanswered),
        "submissions_with_other_than_one_job": sum(1 for sid in subs if jobs_per_sub[sid] != 1),
        "jobs_by_status": dict(Counter(j.status for j in jobs)),
        "order": {"claimed_first_attempts": len(claimed), "claimed_before_an_older_job": out_of_order,
                  "rule": "one problem, one priority: a slot takes the oldest ready job (README, Run the service)"},
    }


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("fastapi", "starlette", "uvicorn", "sqlalchemy", "pydantic", "psycopg", "locust", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    out["harness_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                           text=True).stdout.strip()
    return out


def _machine() -> dict[str, object]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    return {"host": platform.node(), "cpus": os.cpu_count(), "cpu": cpu, "os": platform.platform(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=int, default=600, help="seconds of load")
    ap.add_argument("--wait", type=float, default=0.0, help="seconds each client pauses between requests")
    ap.add_argument("--results", type=int, default=10_000, help="results stored before the pages are timed")
    ap.add_argument("--repeats", type=int, default=5, help="times each page is asked for")
    ap.add_argument("--no-worker", action="store_true", help="no worker: the queue fills and stays full")
    ap.add_argument("--queue-limit", type=int, help="HARNESS_MAX_QUEUED_PER_TOKEN (default: the service's)")
    ap.add_argument("--no-pages", action="store_true", help="the load only, on a data dir with no results")
    ap.add_argument("--no-load", action="store_true", help="the pages only")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--workdir", type=Path, help="keep the data dirs and logs here (default: a temp dir, removed)")
    args = ap.parse_args()
    figures: dict = {"benchmark": "service_load", "machine": _machine(), "versions": _versions(),
                     "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "uptime_before": _uptime(),
                     "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="kh-load-") as tmp:
        root = args.workdir or Path(tmp)
        figures["pages"] = {}
        if not args.no_pages:
            figures["pages"]["sqlite"] = pages_on("sqlite", root / "sqlite", None, args.results, args.repeats)
        if not args.no_pages and not args.no_postgres:
            sys.path.insert(0, str(REPO / "tests"))
            from postgres_server import PostgresServer, find_bindir

            bindir = find_bindir()
            if bindir is None:
                raise SystemExit("no PostgreSQL server binaries (bash scripts/ci-system-deps.sh); or --no-postgres")
            pg = PostgresServer.start(bindir)
            try:
                figures["versions"]["postgresql"] = subprocess.run([str(bindir / "postgres"), "--version"],
                                                                   capture_output=True, text=True).stdout.strip()
                figures["pages"]["postgresql"] = pages_on("postgresql", root / "pg", pg.create_database(),
                                                          args.results, args.repeats)
            finally:
                pg.stop()
        if not args.no_load:
            print(f"load: {args.clients} clients for {args.duration} s", flush=True)
            figures["load"] = {"clients": args.clients, "duration_s": args.duration, "wait_s": args.wait,
                               "worker": None if args.no_worker else "harness worker --gpus none (1 CPU slot, nice 10)",
                               "database": "sqlite", "stored_before": 0 if args.no_pages else args.results,
                               "queue_limit": args.queue_limit or Settings().max_queued_per_token,
                               **run_load(root / "sqlite", args.clients, args.duration, args.wait, not args.no_worker,
                                          args.queue_limit)}
    figures["uptime_after"] = _uptime()
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
