#!/usr/bin/env bash
# KernelBench's problems at the files' own sizes on a GPU host, one bounded stretch at a time: each call adds rows to
# one selfcheck report and stops before its limit, so a run of all 250 is several calls of minutes each.
#   KB_DIR=path/to/KernelBench/KernelBench KB_JSON=kb-all.json scripts/kernelbench-gpu-run.sh [--sample level3/ ...]
# KB_LIMIT_S (default 540) bounds the call: a problem still running then is checked again by the next call
# (--resume keeps only finished rows). KB_GPUS (default all) is selfcheck's --gpus. The report is copied to $OUT
# after the call; the last rows and the totals so far are printed.
set -uo pipefail
. "$(dirname "$0")/device-env.sh"
export HARNESS_DATA_DIR=${HARNESS_DATA_DIR:-/tmp/kh-data}
: "${KB_DIR:?KB_DIR: a KernelBench folder (KernelBench/KernelBench, or one level of it)}"
json=${KB_JSON:-$OUT/kb-all.json}
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
timeout "${KB_LIMIT_S:-540}" python3 -m harness selfcheck --problems-dir "$KB_DIR" --device cuda \
  --gpus "${KB_GPUS:-all}" --json "$json" --resume "$@" > "$OUT/kb-run.log" 2>&1
echo "selfcheck rc $? (124: stopped at KB_LIMIT_S, resume with the same KB_JSON)"
[ "$json" = "$OUT/kb-all.json" ] || cp "$json" "$OUT/kb-all.json"
python3 - "$json" <<'PY'
import collections, json, sys
rows = json.load(open(sys.argv[1]))["rows"]
verdicts = collections.Counter(r["verdict"] for r in rows)
marked = sum("timing_unreliable" in r["flags"] for r in rows)
retimed = sum(bool(r.get("retimed")) for r in rows)
for r in rows[-10:]:
    s = r["speedup_vs_eager"]
    print(f"{r['problem']:12s} {r['verdict']:12s} {'-' if s is None else f'{s:.3f}x':8s} {r['eval_s']:6.1f} s "
          f"{','.join(r['flags'])}")
print(f"{len(rows)} rows: {dict(verdicts)}; {marked} marked timing_unreliable; {retimed} timed twice; "
      f"{sum(r['eval_s'] for r in rows) / 60:.1f} min of evaluations")
PY
