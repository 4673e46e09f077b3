#!/usr/bin/env bash
# The project's gpu tests in one command on a GPU host, stage by stage, each with a one-line summary.
#   scripts/gpu-suite.sh [stage ...]      stages: corpus sandbox service solutions (default: all, in that order)
# The exploits of the corpus, and the sandbox and service tests, run in parallel processes (pytest-xdist,
# GPU_SUITE_WORKERS, default 6): they judge verdicts, not speed. What must pass unflagged (the corpus's honest
# twins, the reference solutions) runs alone on the GPU, since evaluations side by side disturb each other's
# timed windows. Carried wheels in .whl/ are installed first (scripts/device-env.sh). Logs: $OUT/<stage>.log, and
# each corpus entry's verdict line in $OUT/corpus-verdicts.log. Before any stage, every load_inline source the
# tests evaluate is built, one per core (scripts/build_cuda_sources.py).
set -uo pipefail
. "$(dirname "$0")/device-env.sh"
export HARNESS_DATA_DIR=${HARNESS_DATA_DIR:-/tmp/kh-data}
# One data dir for every stage and worker: the load_inline sources are built once, side by side, before any stage.
export HARNESS_TEST_DATA_DIR=${HARNESS_TEST_DATA_DIR:-$HARNESS_DATA_DIR/tests}
export HARNESS_CORPUS_LOG="$OUT/corpus-verdicts.log"
workers=${GPU_SUITE_WORKERS:-6}
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(corpus sandbox service solutions)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
git log -1 --format='commit %h %s' 2>/dev/null || true

stage() {  # stage NAME PARALLEL PYTEST-ARGS...
  local name=$1 parallel=$2 t0=$SECONDS rc
  shift 2
  local xdist=()
  [ "$parallel" = yes ] && [ "$workers" -gt 1 ] && xdist=(-n "$workers")
  python3 -m pytest -m gpu -q -p no:cacheprovider -rfE "${xdist[@]}" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  printf 'stage %-9s rc %d in %4d s: %s\n' "$name" "$rc" $((SECONDS - t0)) "$(grep -E '(passed|failed|error)' "$OUT/$name.log" | tail -1)"
  return $rc
}

t0=$SECONDS
python3 scripts/build_cuda_sources.py > "$OUT/builds.log" 2>&1
printf 'stage %-9s rc %d in %4d s: %s\n' builds $? $((SECONDS - t0)) "$(head -1 "$OUT/builds.log")"
status=0
for s in "${stages[@]}"; do
  case "$s" in
    corpus) stage exploits yes tests/sandbox/test_corpus.py -k exploit || status=1
            stage twins no tests/sandbox/test_corpus.py -k "not exploit" || status=1 ;;
    sandbox) stage sandbox yes tests/sandbox --ignore=tests/sandbox/test_corpus.py || status=1 ;;
    service) stage service yes tests/service || status=1 ;;
    solutions) stage solutions no tests/reference_solutions || status=1 ;;
    *) echo "unknown stage $s (corpus sandbox service solutions)"; exit 2 ;;
  esac
done
[ -f "$HARNESS_CORPUS_LOG" ] && sort "$HARNESS_CORPUS_LOG" > "$OUT/corpus-verdicts.sorted.log"
exit $status
