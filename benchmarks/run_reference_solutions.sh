#!/usr/bin/env bash
# Produce reference_solutions/RESULTS.md on a GPU host (an H100 with torch preinstalled, no network).
#   benchmarks/run_reference_solutions.sh bench   [problems...]  -> $OUT/bench.json    (one process: eager,
#                                                                  compile, max-autotune, addmm floor, solution,
#                                                                  profiler kernel times)
#   benchmarks/run_reference_solutions.sh harness [problems...]  -> $OUT/harness-<ids>.json (5 evaluations each
#                                                                  through the harness: verdicts, speedup spread)
#   python benchmarks/tensor_core_solutions.py --json $OUT/tensor-cores.json   -> the 3xTF32 design through the
#                                                                  harness, and its chunk sweep
#   python benchmarks/render_results.py bench.json harness-*.json [--probe probe.txt] \
#       --tensor-cores tensor-cores-h100-<commit>.json --floors floors-h100.json > reference_solutions/RESULTS.md
# Each GPU stage is a command of its own, under 10 minutes on an H100.
set -uo pipefail
. "$(dirname "$0")/../scripts/device-env.sh"
export HARNESS_DATA_DIR=${HARNESS_DATA_DIR:-/tmp/kh-data}
stage=$1; shift
case "$stage" in
  bench)
    # Build the six extensions in parallel first (one process each), so the benchmark's imports are no-ops.
    TORCH_CUDA_ARCH_LIST=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
    export TORCH_CUDA_ARCH_LIST
    for f in reference_solutions/level2_*.py; do
      python3 -c "import importlib.util as u,sys; s=u.spec_from_file_location('m',sys.argv[1]); s.loader.exec_module(u.module_from_spec(s))" "$f" > "$OUT/build-$(basename "$f" .py).log" 2>&1 &
    done
    wait
    python3 benchmarks/reference_solutions_gpu.py "$@" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
    ;;
  harness)
    name=$(echo "${*:-all}" | tr ' ' '-')
    python3 benchmarks/reference_solutions_harness.py "$@" --repeats 5 --json "$OUT/harness-$name.json" 2>&1 | tee "$OUT/harness-$name.log"
    ;;
  *) echo "usage: $0 bench|harness [problems...]"; exit 2 ;;
esac
