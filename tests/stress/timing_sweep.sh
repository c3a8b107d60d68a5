#!/usr/bin/env bash
# The tests that wait on other processes or threads (elastic recovery and
# rejoin, hung and killed ranks, signals, stragglers, timeouts), run ROUNDS
# times through ctest beside HOGS CPU-bound processes (issue 40: they must
# pass on a slow, busy machine, not on a fast one only). Prints each
# round's failures and a summary; exits 1 if any round failed.
#
#   tests/stress/timing_sweep.sh [BUILD=build] [ROUNDS=30] [HOGS=2] [JOBS=1] [REGEX]
# REGEX: only the ctest names it matches (default: all of them below).
set -uo pipefail
build=$(realpath "${1:-build}")
rounds=${2:-30}
hogs=${3:-2}
jobs=${4:-1}
# Every test that waits on time or on another process's progress.
pattern='elastic|min-ranks|straggler|hung rank 0|killed with SIGKILL|small collectives in the caller|missing rank'
pattern+='|disagree|killed in the middle of a recv|DDP_LOG_LEVEL=info|launcher.signal|built-ins is fast|etcd|EtcdStore|bench.faults'
pattern+='|hangs while rank 0 saves'
# In place under torchrun and SLURM: a rank killed, the others go on.
pattern+='|torchrun_store_modes|slurm_wine_ddp|mpirun_wine_ddp'
pattern=${5:-$pattern}
hog_pids=()
cleanup() { ((${#hog_pids[@]})) && kill "${hog_pids[@]}" 2>/dev/null; }
trap cleanup EXIT
for _ in $(seq 1 "$hogs"); do
  (while :; do :; done) &
  hog_pids+=($!)
done
cd "$build" || exit 2
count=$(ctest -N -R "$pattern" | sed -n 's/^Total Tests: //p')
echo "timing sweep: $count tests x $rounds rounds, $hogs CPU-bound processes beside them, ctest -j$jobs"
failed_rounds=0
declare -A failures=()
for round in $(seq 1 "$rounds"); do
  log=$(mktemp)
  started=$SECONDS
  if ctest -R "$pattern" -j "$jobs" --timeout 300 --output-on-failure > "$log" 2>&1; then
    echo "round $round: passed in $((SECONDS - started)) s"
  else
    failed_rounds=$((failed_rounds + 1))
    echo "round $round: FAILED in $((SECONDS - started)) s:"
    while IFS= read -r name; do
      echo "  $name"
      failures["$name"]=$((${failures["$name"]:-0} + 1))
    done < <(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (\(Failed\|Timeout\|SEGFAULT\|Exception\|Subprocess aborted\))$/\1 (\2)/p' "$log")
    cp "$log" "timing_sweep_round_$round.log"
    echo "  (log: $build/timing_sweep_round_$round.log)"
  fi
  rm -f "$log"
done
echo "timing sweep: $failed_rounds of $rounds round(s) failed"
for name in "${!failures[@]}"; do echo "  ${failures[$name]}x $name"; done
((failed_rounds == 0))
