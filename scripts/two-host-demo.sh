#!/usr/bin/env bash
# Two hosts in miniature: one PostgreSQL queue, two `harness worker` processes in network namespaces of their
# own, a submitter queueing a folder of KernelBench generations with `harness eval-dir --via-queue`.
#
#   kh-db  (PostgreSQL; the submitter)  10.231.1.1 ── veth ── 10.231.1.2  kh-w1 (worker 1)
#                                       10.231.2.1 ── veth ── 10.231.2.2  kh-w2 (worker 2)
#
# Each worker sees only its loopback and its veth: the database is all it can reach, as on a second host with
# nothing installed but the harness. Every address lies inside the namespaces made here; nothing is routed
# to or from the machine's own network. Then it checks, from the database and from the two workers' own logs,
# that every job was claimed once, evaluated once and has one result.
#
# Needs root (ip netns, veth) and PostgreSQL's server binaries (scripts/ci-system-deps.sh); runs the harness
# of this checkout's .venv on the CPU. The jobs are real evaluations by the real evaluator: REAL of them
# pure-PyTorch submissions that import torch and run (about 6 s each on one core), the rest replies with no
# code, which the harness rejects (invalid_submission) without starting a process.
#
#   sudo bash scripts/two-host-demo.sh                 # 100 jobs, 20 of them full evaluations
#   JOBS=100 REAL=100 sudo bash scripts/two-host-demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
JOBS=${JOBS:-100}
REAL=${REAL:-20}
HARNESS=${HARNESS:-$REPO/.venv/bin/harness}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
TAG=${TAG:-kh$$}  # namespace names: several demos may run side by side
NS_DB=$TAG-db NS_W1=$TAG-w1 NS_W2=$TAG-w2
WORK=$(mktemp -d /tmp/kh-two-host.XXXXXX)
PW=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')

[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
BIN=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
[ -x "$BIN/pg_ctl" ] || { echo "PostgreSQL server binaries missing: bash scripts/ci-system-deps.sh" >&2; exit 2; }
PGUSER_SYS=$(id -u postgres >/dev/null 2>&1 && echo postgres || echo nobody)
# PostgreSQL refuses to run as root; in the database's namespace (ip netns exec needs root, so it goes first).
as_pg() {
    (cd "$WORK" && ip netns exec "$NS_DB" \
        setpriv --reuid="$(id -u "$PGUSER_SYS")" --regid="$(id -g "$PGUSER_SYS")" --clear-groups -- "$@")
}

PIDS=()
cleanup() {
    set +e
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
    [ -f "$WORK/pg/data/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$WORK/pg/data" -m fast -w stop >/dev/null
    for ns in "$NS_W1" "$NS_W2" "$NS_DB"; do ip netns del "$ns" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '\n== %s\n' "$*"; }

say "network: namespaces $NS_DB, $NS_W1, $NS_W2; a veth pair from each worker to the database"
for ns in "$NS_DB" "$NS_W1" "$NS_W2"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
for i in 1 2; do
    w=$([ "$i" = 1 ] && echo "$NS_W1" || echo "$NS_W2")
    ip link add "$TAG-d$i" netns "$NS_DB" type veth peer name "$TAG-w$i" netns "$w"
    ip -n "$NS_DB" addr add "10.231.$i.1/24" dev "$TAG-d$i"
    ip -n "$w" addr add "10.231.$i.2/24" dev "$TAG-w$i"
    ip -n "$NS_DB" link set "$TAG-d$i" up
    ip -n "$w" link set "$TAG-w$i" up
done
echo "what worker 1 sees (addresses, routes): its loopback and a link to the database, nothing else"
ip -n "$NS_W1" -brief addr
ip -n "$NS_W1" route

say "PostgreSQL in $NS_DB on 10.231.1.1 and 10.231.2.1 (password auth), as $PGUSER_SYS"
chmod 755 "$WORK"
mkdir -p "$WORK/pg"
chown "$PGUSER_SYS" "$WORK/pg"
as_pg "$BIN/initdb" -D "$WORK/pg/data" -U postgres --auth-local=trust --auth-host=reject --no-sync >/dev/null
# The workers' subnets only, by password; everything else is rejected.
echo "host harness harness 10.231.0.0/16 scram-sha-256" >> "$WORK/pg/data/pg_hba.conf"
as_pg "$BIN/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/server.log" -w \
    -o "-c listen_addresses=10.231.1.1,10.231.2.1 -k $WORK/pg -c max_connections=100" start >/dev/null
as_pg "$BIN/psql" -h "$WORK/pg" -U postgres -q -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE harness LOGIN PASSWORD '$PW'" -c "CREATE DATABASE harness OWNER harness"

say "a folder of $JOBS generations: $REAL real pure-PyTorch evaluations, the rest replies without code"
FOLDER=$WORK/run/two-host-demo
mkdir -p "$FOLDER"
"$PYTHON" - "$FOLDER" "$JOBS" "$REAL" <<'EOF'
import sys
from pathlib import Path
folder, jobs, real = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
subs = Path("tests/fixtures/submissions")
# (problem, fixture): correct ones pass; the others are the seed mistakes the harness must catch.
kinds = [(30, "l30_pytorch_correct.py"), (75, "l75_pytorch_correct.py"), (30, "l30_guessed_hardtanh.py"),
         (30, "l30_raises.py")]
for i in range(jobs):
    if i < real:
        number, name = kinds[i % len(kinds)]
        text = (subs / name).read_text()
    else:
        number, text = 75, f"Sorry, I cannot write kernel #{i}; try a smaller problem.\n"
    (folder / f"level_2_problem_{number}_sample_{i}_kernel.py").write_text(text)
EOF
ls "$FOLDER" | wc -l

say "two workers, one per namespace, each with its own data dir (build cache, logs), as on two hosts"
for i in 1 2; do
    w=$([ "$i" = 1 ] && echo "$NS_W1" || echo "$NS_W2")
    # A hostname of its own too (UTS namespace): worker ids read host1:<pid>:..., host2:<pid>:...
    ip netns exec "$w" unshare --uts env HARNESS_DATA_DIR="$WORK/host$i" sh -c 'hostname "$0"; exec "$@"' \
        "host$i" "$HARNESS" worker --gpus none --exit-when-idle 15 \
        --database-url "postgresql://harness:$PW@10.231.$i.1/harness" >"$WORK/worker$i.log" 2>&1 &
    PIDS+=($!)
done

say "the submitter (in $NS_DB): harness eval-dir --via-queue, which waits for the workers' results"
start=$(date +%s)
ip netns exec "$NS_DB" env HARNESS_DATA_DIR="$WORK/submitter" COLUMNS=120 \
    "$HARNESS" eval-dir "$FOLDER" --via-queue --model demo-llm --submitter demo \
    --database-url "postgresql://harness:$PW@10.231.1.1/harness" >"$WORK/eval-dir.out" 2>&1
echo "all $JOBS jobs finished in $(( $(date +%s) - start )) s"

for pid in "${PIDS[@]}"; do wait "$pid"; done  # the workers exit when idle
PIDS=()
for i in 1 2; do echo "worker $i: $(tail -1 "$WORK/worker$i.log")"; done
[ -z "${KEEP:-}" ] || echo "logs and report kept in $WORK"

say "checks, from the database"
ip netns exec "$NS_DB" "$PYTHON" - "postgresql://harness:$PW@10.231.1.1/harness" "$JOBS" <<'EOF'
import sys
from sqlalchemy import func, select
from harness.config import Settings
from harness.db.models import Job, Result
from harness.db.session import Database
db = Database(Settings(database_url=sys.argv[1]), migrate_now=False)
jobs = int(sys.argv[2])
with db.session() as s:
    rows = s.execute(select(Job.status, Job.attempts, Job.worker_id)).all()
    results = s.execute(select(Result.job_id, func.count()).group_by(Result.job_id)).all()
    verdicts = dict(s.execute(select(Result.verdict, func.count()).group_by(Result.verdict)).all())
per_worker: dict[str, int] = {}
for _, _, w in rows:
    per_worker[w] = per_worker.get(w, 0) + 1
print(f"jobs {len(rows)}, done {sum(st == 'done' for st, _, _ in rows)}, "
      f"claimed more than once {sum(a != 1 for _, a, _ in rows)}")
print(f"results {sum(n for _, n in results)} for {len(results)} jobs; jobs with more than one {sum(n > 1 for _, n in results)}")
print("verdicts", verdicts)
for w, n in sorted(per_worker.items()):
    print(f"  {n:3d} jobs finished by {w}")
ok = (len(rows) == jobs and all(st == "done" and a == 1 for st, a, _ in rows) and len(results) == jobs
      and all(n == 1 for _, n in results) and len(per_worker) == 2)
sys.exit(0 if ok else 1)
EOF

say "checks, from the workers' own logs (claims each worker made)"
grep -ho "job [0-9]* (submission" "$WORK"/worker[12].log | awk '{print $2}' | sort > "$WORK/claims"
echo "claims logged: $(wc -l < "$WORK/claims"), distinct jobs: $(sort -u "$WORK/claims" | wc -l)," \
     "by worker 1: $(grep -c " claimed$" "$WORK/worker1.log"), by worker 2: $(grep -c " claimed$" "$WORK/worker2.log")"
[ "$(wc -l < "$WORK/claims")" -eq "$JOBS" ] && [ "$(sort -u "$WORK/claims" | wc -l)" -eq "$JOBS" ]
echo "OK: $JOBS jobs, two workers on two network namespaces, one PostgreSQL queue, no job claimed twice"
