#!/usr/bin/env bash
# The GPU runs still owed when the 2026-11-23 session's device time ran out, stage by stage, each fitting one
# 10-minute device call (carry .whl/). Run them in this order, each call within the machine's 30 s idle time of
# the last, so builds and the bench survive between calls:
#   device-session.sh tests         gpu tests never run with the final code: the reference solutions of 75, 62
#                                   and 37, the sandbox user's CUDA run, worker health (about 5-6 minutes)
#   device-session.sh corpus        the adversarial corpus's exploits again (about 7.5 minutes): the last GPU run
#                                   predates the candidate's early start and 'construct' command
#   device-session.sh twins         the corpus's honest twins and the full-size PyTorch copies of 94, 30 and 88
#                                   (about 3-4 minutes)
#   device-session.sh bench-start   `harness bench throughput -n 32 --serial-n 6` in a session of its own
#                                   (setsid: it outlives the call), then waits for it up to 9 minutes
#   device-session.sh bench-wait    waits for it again (repeat until it prints "bench finished")
# Results land in $OUT: gpu-pytest.log (the test stages, through device-check.sh), throughput.json,
# throughput.txt, bench.log.
set -uo pipefail
here=$(dirname "$0")
case "${1:-}" in  # the test stages: device-check.sh's pytest mode, with these tests
  tests)
    exec bash "$here/device-check.sh" pytest \
      "tests/reference_solutions/test_reference_solutions.py::test_solution_passes_the_harness_at_full_size[level2/75]" \
      "tests/reference_solutions/test_reference_solutions.py::test_solution_passes_the_harness_at_full_size[level2/62]" \
      "tests/reference_solutions/test_reference_solutions.py::test_solution_passes_the_harness_at_full_size[level2/37]" \
      tests/sandbox/test_containment_gpu.py::test_the_sandbox_user_runs_cuda_code tests/service/test_worker_health.py ;;
  corpus)
    exec bash "$here/device-check.sh" pytest tests/sandbox/test_corpus.py -k exploit ;;
  twins)
    exec bash "$here/device-check.sh" pytest tests/sandbox/test_corpus.py -k "not exploit" \
      "tests/sandbox/test_runner_gpu.py::test_pure_pytorch_reference_copy_passes_at_full_size[level2/94]" \
      "tests/sandbox/test_runner_gpu.py::test_pure_pytorch_reference_copy_passes_at_full_size[level2/30]" \
      "tests/sandbox/test_runner_gpu.py::test_pure_pytorch_reference_copy_passes_at_full_size[level2/88]" ;;
esac
. "$here/device-env.sh"
export HARNESS_DATA_DIR=/tmp/kh-data
BENCH=/tmp/kh-bench
WAIT_S=${WAIT_S:-540}
BENCH_ARGS=${BENCH_ARGS:--n 32 --serial-n 6 --device cuda}  # what bench-start runs

bench_wait() {
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$WAIT_S" ]; do
    if [ -f "$BENCH/rc" ]; then
      cp "$BENCH/bench.log" "$OUT/throughput.txt"
      [ -f "$BENCH/throughput.json" ] && cp "$BENCH/throughput.json" "$OUT/"
      tail -c 200000 "$BENCH/stderr.log" > "$OUT/bench.log"
      cat "$OUT/throughput.txt"
      echo "bench finished: rc $(cat "$BENCH/rc")"
      return 0
    fi
    sleep 5
  done
  tail -c 2000 "$BENCH/stderr.log" | tr '\r' '\n' | tail -5
  echo "bench still running after $((SECONDS - t0)) s: call 'device-session.sh bench-wait' again within 30 s"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
case "${1:-}" in
  bench-start)
    rm -rf "$BENCH" && mkdir -p "$BENCH"
    # A session of its own: the device tool ends what a call leaves running, except such a one.
    setsid bash -c "python3 -m harness bench throughput $BENCH_ARGS --work-dir '$BENCH/work' \
      --json '$BENCH/throughput.json' > '$BENCH/bench.log' 2> '$BENCH/stderr.log'; echo \$? > '$BENCH/rc'" \
      < /dev/null > /dev/null 2>&1 &
    bench_wait
    ;;
  bench-wait)
    [ -d "$BENCH" ] || { echo "no bench here: the machine was given back since bench-start"; exit 1; }
    bench_wait
    ;;
  *) echo "usage: $0 tests|corpus|twins|bench-start|bench-wait"; exit 2 ;;
esac
