#!/usr/bin/env bash
# Runs the collective tests and `ddp-bench collectives --verify` many times on
# both gloo paths (shared memory and TCP) and counts failures, to find what
# fails once in fifty. Not a ctest test (it takes long); run it before
# resolving a change to the backends, and report the counts.
#
#   tests/stress/collectives_loop.sh BUILD_DIR [ROUNDS=50]
#
# Each failing round's output is kept in $DDP_STRESS_LOG_DIR (default
# /tmp/ddp-stress) as <what>-<round>.log; the summary lists them.
# DDP_STRESS_TESTS narrows the Catch2 test spec (default: the collective and
# multi-process tests, ~4 min a round on 2 cores; world size 4 as threads on
# 2 cores takes most of it).
set -uo pipefail
build="${1:?usage: collectives_loop.sh BUILD_DIR [ROUNDS]}"
rounds="${2:-50}"
logs="${DDP_STRESS_LOG_DIR:-/tmp/ddp-stress}"
mkdir -p "$logs"
trap 'echo "collectives_loop: interrupted"; summary; exit 130' INT TERM
tests="$build/tests/ddp_tests"
bench="$build/benchmarks/ddp-bench"
[ -x "$tests" ] || { echo "collectives_loop: $tests not built" >&2; exit 2; }

declare -A failures runs
run_one() {  # name round command...
  local name="$1" round="$2"
  shift 2
  runs[$name]=$(( ${runs[$name]:-0} + 1 ))
  if ! timeout 600 "$@" > "$logs/$name-$round.log" 2>&1; then
    failures[$name]=$(( ${failures[$name]:-0} + 1 ))
    echo "collectives_loop: $name failed in round $round: $logs/$name-$round.log"
  else
    rm -f "$logs/$name-$round.log"
  fi
}

status=0
summary() {
  echo "collectives_loop: ${done_rounds:-0} of $rounds rounds in $(( $(date +%s) - start )) s"
  for name in "${!runs[@]}"; do
    echo "  $name: ${failures[$name]:-0} failed of ${runs[$name]}"
    [ "${failures[$name]:-0}" -eq 0 ] || status=1
  done
}

start=$(date +%s)
for round in $(seq 1 "$rounds"); do
  for shm in 1 0; do
    path=$([ "$shm" = 1 ] && echo shm || echo tcp)
    run_one "tests-$path" "$round" env DDP_GLOO_SHM=$shm "$tests" "${DDP_STRESS_TESTS:-[collectives],[multiprocess]}"
  done
  if [ -x "$bench" ]; then
    run_one "bench-verify" "$round" "$bench" collectives --impls gloo,gloo-tcp --verify --warmup 1 --iters 3 \
      --max-bytes 4M
  fi
  leftover=$(ls /dev/shm 2>/dev/null | grep -c '^ddp-' || true)
  [ "$leftover" -eq 0 ] || echo "collectives_loop: round $round left $leftover /dev/shm/ddp-* entries"
  done_rounds=$round
done

summary
exit $status
