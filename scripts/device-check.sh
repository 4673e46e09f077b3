#!/usr/bin/env bash
# On a GPU host with a preinstalled CUDA torch (an H100, say): install carried wheels if any, then
# run the gpu-marked tests and one full-size evaluation of level2/75. Logs land in $OUT (or ./device-out).
#   device-check.sh [all|tests|eval75]   or   device-check.sh pytest tests/evaluation/test_corpus.py -k twin
set -uo pipefail
. "$(dirname "$0")/../scripts/device-env.sh"
export HARNESS_DATA_DIR=/tmp/kh-data
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
what=${1:-all}
if [ "$what" = pytest ]; then  # device-check.sh pytest <pytest args>: a chosen part of the gpu tests
  shift
  python3 -m pytest -m gpu -s -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu-pytest.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "$what" = all ] || [ "$what" = tests ]; then
  python3 -m pytest -m gpu -s -q -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu-tests.log"
fi
if [ "$what" = all ] || [ "$what" = eval75 ]; then
  python3 -m harness eval --problem level2/75 --submission tests/fixtures/submissions/l75_pytorch_correct.py \
    --device cuda --json > "$OUT/eval75.json" 2> "$OUT/eval75.stderr"
  python3 -c "import sys; from harness.cli.eval import render; from harness.schema import EvalResult
print(render(EvalResult.model_validate_json(open(sys.argv[1]).read())))" "$OUT/eval75.json" | tee "$OUT/eval75.txt"
fi
