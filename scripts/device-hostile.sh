#!/usr/bin/env bash
# On a GPU host (an H100, say): every hostile fixture through the real sandbox on CUDA, each verdict
# printed, the GPU health-checked after each (as a worker does after a fault), then the gpu-marked
# containment and worker-health tests. Results in $OUT (hostile.txt, hostile.json, gpu-hostile-tests.log).
set -uo pipefail
. "$(dirname "$0")/../scripts/device-env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
id; uname -r
python3 scripts/hostile_verdicts.py --device cuda --json "$OUT/hostile.json" 2>"$OUT/hostile.stderr" | tee "$OUT/hostile.txt"
rc=${PIPESTATUS[0]}
python3 -m pytest -m gpu -q -p no:cacheprovider tests/sandbox/test_containment_gpu.py tests/service/test_worker_health.py \
  2>&1 | tee "$OUT/gpu-hostile-tests.log"
exit $rc
