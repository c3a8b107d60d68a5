#!/usr/bin/env bash
# Measures what a newcomer waits for, with ccache off, on a fresh clone of
# this checkout's HEAD (or of the commit given with --rev):
#
#   first-epoch   ./scripts/run.sh from the clone, until its first "epoch"
#                 line (set-up, configure, build of what run.sh needs, run;
#                 wine_ddp prints every 10th of its 100 epochs, all of them
#                 within a second)
#   configure     cmake's configure step in a new build folder
#   cold-all      the cold build of every target (tests, benchmarks) in a
#                 new build folder of that clone
#   incr-parallel touch framework/parallel/ddp.cpp, rebuild ddp-run
#   incr-gloo     touch backends/gloo/process_group_gloo.cpp, rebuild ddp-run
#   slowest       the 10 slowest compiles of cold-all, precompiled headers
#                 included (ninja's log)
#
# Usage: scripts/build-times.sh [--rev REV] [--runs N] [--json FILE]
#                               [--skip-first-epoch] [--skip-cold-all] [--keep]
# Needs the Debian packages that scripts/setup.sh installs (it installs
# them itself through run.sh when missing, and that time is counted).
# Every step's output goes to the work folder's *.log; a failed step is
# named with the log to read, and the script exits non-zero, keeping all.
# After a success only the logs stay (--keep: the clones and builds too,
# ~2 GB a run).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
rev=HEAD runs=1 json="" skip_epoch=0 skip_all=0 keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rev) rev="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --skip-first-epoch) skip_epoch=1; shift ;;
    --skip-cold-all) skip_all=1; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "build-times: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$runs" in ''|*[!0-9]*|0) echo "build-times: --runs '$runs': expected a positive integer" >&2; exit 2 ;; esac
commit=$(git -C "$here" rev-parse --verify "$rev^{commit}" 2>/dev/null) || {
  echo "build-times: --rev '$rev' is not a commit of $here" >&2; exit 2; }

work=$(mktemp -d /tmp/ddp-build-times.XXXXXX)
echo "build-times: commit ${commit:0:10}, work folder $work"
export CCACHE_DISABLE=1
# Stopped (Ctrl-C, SIGTERM): the run.sh being timed, in a session of its
# own, is stopped too.
on_stop() {
  [ -f "$work/run.pid" ] && kill -TERM -- "-$(cat "$work/run.pid")" 2>/dev/null
  echo "build-times: stopped; logs in $work" >&2
  exit 130
}
trap on_stop INT TERM
results=()   # "name seconds" pairs, one per measurement

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
record() { results+=("$1 $2"); printf '  %-14s %8.1f s\n' "$1" "$2"; }

fresh_clone() {  # $1: folder
  git clone -q --no-hardlinks "$here" "$1"
  git -C "$1" checkout -q "$commit"
}

# ./scripts/run.sh until its first epoch line; the run is then stopped.
first_epoch() {  # $1: clone folder, $2: log
  local t0 t1 pid line=""
  t0=$(now)
  ( cd "$1" && exec setsid ./scripts/run.sh ) > "$2" 2>&1 &
  pid=$!
  echo "$pid" > "$work/run.pid"   # for the trap below, should we be stopped
  while kill -0 "$pid" 2>/dev/null; do
    if grep -qE '^epoch [0-9]+/' "$2"; then line=1; break; fi
    sleep 0.5
  done
  t1=$(now)
  # The line may have come just before the run ended.
  [ -n "$line" ] || ! grep -qE '^epoch [0-9]+/' "$2" || line=1
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -f "$work/run.pid"
  if [ -z "$line" ]; then
    echo "build-times: run.sh ended without an epoch line; see $2" >&2; exit 1
  fi
  elapsed "$t0" "$t1"
}

timed() {  # $1: log, rest: command
  local log="$1" t0 t1; shift
  t0=$(now)
  "$@" > "$log" 2>&1 || { echo "build-times: '$*' failed; see $log" >&2; exit 1; }
  t1=$(now)
  elapsed "$t0" "$t1"
}

slowest=""
for r in $(seq 1 "$runs"); do
  echo "run $r of $runs:"
  src="$work/clone-$r"
  fresh_clone "$src"
  if [ "$skip_epoch" = 0 ]; then
    t=$(first_epoch "$src" "$work/run-$r.log")
    record first-epoch "$t"
  fi
  if [ "$skip_all" = 0 ]; then
    cfg=(cmake -S "$src" -B "$src/build-all" -G Ninja -DCMAKE_BUILD_TYPE=Release)
    t=$(timed "$work/configure-all-$r.log" "${cfg[@]}")
    record configure "$t"
    t=$(timed "$work/build-all-$r.log" cmake --build "$src/build-all" -j "$(nproc)")
    record cold-all "$t"
    # ninja's log: start and end in ms of each output of the last build.
    slowest=$(awk -F'\t' 'NR > 1 && $4 ~ /\.(o|gch)$/ { printf "%8.1f s  %s\n", ($2 - $1) / 1000, $4 }' \
      "$src/build-all/.ninja_log" | sort -rn | head -10)
    bdir="$src/build-all"
  else
    bdir="$src/build"   # run.sh's, or a new one
    [ -f "$bdir/build.ninja" ] ||
      timed "$work/configure-$r.log" cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
    timed "$work/build-run-$r.log" cmake --build "$bdir" --target ddp-run > /dev/null
  fi
  touch "$src/framework/parallel/ddp.cpp"
  t=$(timed "$work/incr-parallel-$r.log" cmake --build "$bdir" --target ddp-run)
  record incr-parallel "$t"
  touch "$src/backends/gloo/process_group_gloo.cpp"
  t=$(timed "$work/incr-gloo-$r.log" cmake --build "$bdir" --target ddp-run)
  record incr-gloo "$t"
done
if [ -n "$slowest" ]; then
  echo "10 slowest translation units of the last cold-all build:"
  echo "$slowest"
fi

if [ -n "$json" ]; then
  {
    printf '{"commit": "%s", "cores": %s, "runs": [' "$commit" "$(nproc)"
    sep=""
    for e in "${results[@]}"; do printf '%s{"step": "%s", "seconds": %s}' "$sep" "${e% *}" "${e#* }"; sep=", "; done
    printf '], "slowest": ['
    sep=""
    while read -r s _ f; do [ -n "$f" ] && printf '%s{"unit": "%s", "seconds": %s}' "$sep" "$f" "$s" && sep=", "; done <<< "$slowest"
    printf ']}\n'
  } > "$json"
  echo "build-times: wrote $json"
fi

if [ "$keep" = 0 ]; then
  rm -rf "$work"/clone-*
  echo "build-times: logs in $work (the clones removed; --keep keeps them)"
fi
