#!/usr/bin/env bash
# The project's gpu tests in one command on a GPU host, in two stages, each with a one-line summary.
#   scripts/gpu-suite.sh [part ...]      parts: corpus sandbox service solutions (default: all)
#   GPU_SUITE_STAGES="alone"             only the stages named (default: "alone verdicts")
# Every load_inline source the tests evaluate is built first, one per core and at the lowest CPU priority
# (scripts/build_cuda_sources.py); a test that needs a build waits for its lock.
# Stage "alone", beside the builds: the tests marked `alone` (the corpus's honest twins, the reference solutions,
# the full-size A/A copies: a speed or an unflagged pass), one evaluation at a time, since evaluations side by side
# disturb each other's timed windows (the builds run at nice 19: an evaluation's processes take the CPU first).
# Stage "verdicts", once the builds are done: the gpu tests of the parts chosen that judge verdicts, not speed,
# together in parallel processes (pytest-xdist, GPU_SUITE_WORKERS, default 8). Carried wheels in .whl/ are installed
# first (scripts/device-env.sh). Logs: $OUT/<stage>.log (with every test's seconds), and each corpus entry's verdict
# line in $OUT/corpus-verdicts.log.
set -uo pipefail
. "$(dirname "$0")/device-env.sh"
export HARNESS_DATA_DIR=${HARNESS_DATA_DIR:-/tmp/kh-data}
# One data dir for every stage and worker: the load_inline sources are built once, side by side.
export HARNESS_TEST_DATA_DIR=${HARNESS_TEST_DATA_DIR:-$HARNESS_DATA_DIR/tests}
export HARNESS_CORPUS_LOG="$OUT/corpus-verdicts.log"
workers=${GPU_SUITE_WORKERS:-8}
stages=" ${GPU_SUITE_STAGES:-alone verdicts} "
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(corpus sandbox service solutions)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
git log -1 --format='commit %h %s' 2>/dev/null || true

stage() {  # stage NAME PARALLEL MARKERS PYTEST-ARGS...
  local name=$1 parallel=$2 markers=$3 t0=$SECONDS rc
  shift 3
  local xdist=()
  [ "$parallel" = yes ] && [ "$workers" -gt 1 ] && xdist=(-n "$workers")
  python3 -m pytest -m "$markers" -q -p no:cacheprovider -rfE --durations=0 --durations-min=1 "${xdist[@]}" "$@" \
    > "$OUT/$name.log" 2>&1
  rc=$?
  printf 'stage %-9s rc %d in %4d s: %s\n' "$name" "$rc" $((SECONDS - t0)) "$(grep -E '(passed|failed|error)' "$OUT/$name.log" | tail -1)"
  grep -E '^(FAILED|ERROR) ' "$OUT/$name.log" | cut -c1-300  # which, in the summary too: logs may not come back
  return $rc
}

t0=$SECONDS
nice -n 19 python3 scripts/build_cuda_sources.py > "$OUT/builds.log" 2>&1 &
builds=$!
files=()
for p in "${parts[@]}"; do
  case "$p" in
    corpus) files+=(tests/evaluation/test_corpus.py) ;;
    sandbox) files+=($(ls tests/sandbox/test_*.py tests/evaluation/test_*.py | grep -v test_corpus.py)) ;;
    service) files+=(tests/service) ;;
    solutions) files+=(tests/reference_solutions) ;;
    *) echo "unknown part $p (corpus sandbox service solutions)"; exit 2 ;;
  esac
done
# The alone stage takes the tests that need no build first (the A/A copies, the pure-PyTorch corpus entries: the
# ordering is tests/conftest.py's), while the builds go on.
alone_files=()
for f in tests/evaluation/test_runner_gpu.py "${files[@]}"; do
  [[ " ${files[*]} " == *" $f "* ]] && [[ " ${alone_files[*]} " != *" $f "* ]] && alone_files+=("$f")
done
status=0
if [[ $stages == *" alone "* ]]; then stage alone no "gpu and alone" "${alone_files[@]}" || status=1; fi
wait $builds
printf 'stage %-9s rc %d in %4d s: %s\n' builds $? $((SECONDS - t0)) "$(head -1 "$OUT/builds.log")"
# Eight evaluations share the GPU there: each one's work is the other processes' work a reference window would
# wait for (HARNESS_GPU_IDLE_WAIT_S), so none waits; the alone stage keeps the wait, and tests what it catches.
if [[ $stages == *" verdicts "* ]]; then
  export HARNESS_GPU_IDLE_WAIT_S=0
  stage verdicts yes "gpu and not alone" "${files[@]}" || status=1
fi
[ -f "$HARNESS_CORPUS_LOG" ] && sort "$HARNESS_CORPUS_LOG" > "$OUT/corpus-verdicts.sorted.log"
exit $status
