#!/usr/bin/env bash
# End-to-end on a GPU host: `harness serve` (SQLite, embedded worker), submit over HTTP, read verdicts back.
# Wheels for what the host lacks are carried in .whl/ and .whl-svc/ (not committed; see README).
set -uo pipefail
. "$(dirname "$0")/../scripts/device-env.sh"
export HARNESS_DATA_DIR=/tmp/kh-serve
PORT=8123
python3 -m harness serve --port $PORT > "$OUT/serve.log" 2>&1 &
SERVE=$!
for i in $(seq 90); do curl -sf http://127.0.0.1:$PORT/healthz >/dev/null && break; sleep 1; done
TOKEN=$(cat $HARNESS_DATA_DIR/admin-token)
sub() { python3 -c 'import json,sys; print(json.dumps({"problem": sys.argv[1], "submitter": "smoke", "model": sys.argv[3], "source": open(sys.argv[2]).read()}))' "$@" | curl -sS -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' --data-binary @- http://127.0.0.1:$PORT/api/submissions; echo; }
echo "POST level2/75 pure PyTorch:"; sub level2/75 tests/fixtures/submissions/l75_pytorch_correct.py pytorch-eager-copy
echo "POST level2/30 CUDA load_inline:"; sub level2/30 tests/fixtures/submissions/l30_cuda_correct.py cuda-inline
for i in $(seq 300); do q=$(curl -s http://127.0.0.1:$PORT/healthz); echo "$q" | grep -q '"queued":0,"compiling":0,"running":0' && break; sleep 2; done
echo "healthz: $q"
for id in 1 2; do
  echo "GET /api/submissions/$id"
  curl -s http://127.0.0.1:$PORT/api/submissions/$id | tee "$OUT/submission-$id.json" | python3 -c "import json,sys; d=json.load(sys.stdin); r=d['result'] or {}; p=r.get('provenance') or {}; print(' ', d['problem'] if 'problem' in d else '', d['status'], d['verdict'], r.get('device'), p.get('device_name'), 'speedup vs eager', r.get('speedup_vs_eager'), 'vs compile', r.get('speedup_vs_compile')); print(' ', r.get('message'))"
done
curl -s "http://127.0.0.1:$PORT/api/leaderboard?problem=level2/75" > "$OUT/leaderboard.json"
kill -TERM $SERVE; wait $SERVE; echo "serve exit $?"
