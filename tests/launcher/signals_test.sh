#!/usr/bin/env bash
# Signals to the ddp-run launcher stop the whole job: nothing outlives it.
#
#   signals_test.sh DDP_RUN EXPERIMENT CASE
#
# CASE:
#   sigint      SIGINT to the launcher's process group (Ctrl-C in a terminal)
#   sigterm     SIGTERM to the launcher alone (timeout, docker stop, SLURM)
#   sigkill     SIGKILL to the launcher alone: the ranks stop by themselves;
#               the launcher's stdout goes to a file, which must hold the
#               epoch lines rank 0 printed before (no block-buffered loss)
#   rendezvous  SIGTERM to the launcher while its ranks wait in the
#               rendezvous for a second node that never comes
#   grace       --kill-grace 1, rank 1 stopped (SIGSTOP) so that SIGTERM
#               cannot end it: SIGKILL after 1 s, and the launcher says so
#   starting    SIGTERM while the launcher still starts 128 ranks (on 2
#               cores that takes seconds): it starts no more, stops those it
#               started, and says so
#
# 2 ranks train experiments/wine_ddp.json "forever"; once they train (or
# wait), the signal is sent. Within the grace period (3 s, the default) plus 10 s
# (room for a loaded machine; the grace case shows the SIGKILL came):
# no rank process is left, no /dev/shm/ddp-* segment named after a rank's
# pid, no listening store port; the launcher exits with 128 + the signal
# (sigint, sigterm, rendezvous) and says which signal it received.
set -u
DDP_RUN=$1
EXPERIMENT=$2
CASE=$3

for tool in ss pgrep python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: $tool not found"
    exit 0
  fi
done
[[ -d /dev/shm ]] || { echo "SKIPPED: no /dev/shm"; exit 0; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-launcher-signals.XXXXXX")
launcher=""
ranks=()
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# A process that exists and is not a zombie (a zombie left to init counts as gone).
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != "Z" ]]
}

segments_of() {
  local pid
  for pid in "$@"; do
    ls /dev/shm 2>/dev/null | grep -E -- "^ddp-.*-${pid}-" | sed 's|^|/dev/shm/|'
  done
}

cleanup() {
  local pid
  for pid in "${ranks[@]}" $launcher; do
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
  done
  for pid in "${ranks[@]}"; do
    segments_of "$pid" | xargs -r rm -f
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

# Waits up to $1 seconds for the command in the remaining arguments to
# succeed (microseconds of EPOCHREALTIME: bash's SECONDS counts whole
# seconds, so a limit of 5 could end after 4).
wait_for() {
  local limit=$1
  shift
  local end=$((${EPOCHREALTIME/./} + limit * 1000000))
  until "$@"; do
    ((${EPOCHREALTIME/./} >= end)) && return 1
    sleep 0.1
  done
}

records_at_least() { [[ -f "$tmp/run/metrics.jsonl" ]] && (($(wc -l <"$tmp/run/metrics.jsonl") >= $1)); }
two_ranks() {
  mapfile -t ranks < <(pgrep -P "$launcher")
  ((${#ranks[@]} == 2))
}
port_listening() { [[ -n "$(ss -ltnH "sport = :$1" 2>/dev/null)" ]]; }
ranks_gone() {
  local pid
  for pid in "${ranks[@]}"; do alive "$pid" && return 1; done
  return 0
}
launcher_gone() { ! alive "$launcher"; }

# SIGPIPE ignored, as some parents (Python, some CI runners) leave it: a rank
# whose launcher is gone must not depend on its next console line to stop.
trap '' PIPE
# Job control: the launcher leads its own process group (as a command typed
# in a terminal does), and SIGINT is not ignored in it, as it would be in a
# background job of a script without job control.
set -m
args=(--nproc-per-node 2 "$EXPERIMENT" --set training.epochs=100000 --set training.save_every=0 --out "$tmp/run")
port=""
grace=3
case "$CASE" in
  sigint) signal=INT ;;
  sigterm | rendezvous) signal=TERM ;;
  grace)
    signal=TERM
    grace=1
    args+=(--kill-grace "$grace")
    ;;
  sigkill) signal=KILL ;;
  starting)
    signal=TERM
    args=(--nproc-per-node 128 "$EXPERIMENT" --set training.epochs=100000 --set training.save_every=0 --out "$tmp/run")
    ;;
  *)
    echo "unknown case '$CASE'"
    exit 2
    ;;
esac
if [[ "$CASE" == rendezvous ]]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  args+=(--nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port")
fi
"$DDP_RUN" "${args[@]}" >"$tmp/stdout.txt" 2>"$tmp/stderr.txt" &
launcher=$!
set +m

if [[ "$CASE" == starting ]]; then
  some_ranks() { (($(pgrep -c -P "$launcher") >= 4)); }
  job_gone() { ! pgrep -f -- "$tmp/run" >/dev/null; }
  wait_for 30 some_ranks || { echo "FAIL: the launcher did not start 4 ranks"; cat "$tmp/stderr.txt"; exit 1; }
  kill -TERM "$launcher"
  # Its 3 s grace, then the reaping of up to 128 half-started ranks, with
  # room for a loaded machine: a launcher that ignores the signal still fails.
  if wait_for 15 launcher_gone; then
    wait "$launcher"
    code=$?
    ((code == 143)) || fail "the launcher exited with $code, expected 143 (128 + SIGTERM)"
  else
    fail "the launcher still runs 15 s after SIGTERM while starting ranks"
  fi
  wait_for 15 job_gone || fail "processes of the job still run 15 s after SIGTERM: $(pgrep -f -- "$tmp/run" | head -5)"
  grep -q "received SIGTERM while starting ranks; stopped the [0-9]* of 128 started" "$tmp/stderr.txt" ||
    fail "the launcher does not say that it stopped starting ranks; it said: $(tail -2 "$tmp/stderr.txt")"
  grep "^ddp-run: received" "$tmp/stderr.txt"
  if ((failures > 0)); then
    pkill -KILL -f -- "$tmp/run"
    exit 1
  fi
  echo "PASS: $CASE"
  exit 0
fi

if ! wait_for 30 two_ranks; then
  echo "FAIL: the launcher did not start 2 ranks; its output:"
  cat "$tmp/stdout.txt" "$tmp/stderr.txt"
  exit 1
fi
if [[ "$CASE" == rendezvous ]]; then
  # Rank 0 serves the store; the ranks then wait for node 1.
  if ! wait_for 30 port_listening "$port"; then
    echo "FAIL: rank 0 does not listen on $port"
    cat "$tmp/stdout.txt" "$tmp/stderr.txt"
    exit 1
  fi
  sleep 1
else
  # Training: 20 epoch records (rank 0 printed the line of epoch 10), and
  # a moment for the launcher to forward it.
  if ! wait_for 60 records_at_least 20; then
    echo "FAIL: no training within 60 s; output:"
    cat "$tmp/stdout.txt" "$tmp/stderr.txt"
    exit 1
  fi
  # The launcher forwards rank 0's line of epoch 10 (the sigkill case checks it reached the file).
  wait_for 30 grep -q '^epoch 10/100000' "$tmp/stdout.txt" || fail "rank 0's 'epoch 10/100000' line is not in the launcher's stdout"
  port=$(grep -o 'master [0-9.]*:[0-9]*' "$tmp/stdout.txt" | head -1 | sed 's/.*://')
  [[ -n "$port" ]] || fail "no 'master HOST:PORT' in the launcher's output"
fi
echo "launcher $launcher, ranks ${ranks[*]}, store port ${port:-?}; sending SIG$signal"
# Stopped, every thread of it: a SIGTERM that reaches a thread still
# running would end the process at once.
all_threads_stopped() {
  local state
  for state in $(cat /proc/"$1"/task/*/stat 2>/dev/null | awk '{print $3}'); do
    [[ "$state" == T ]] || return 1
  done
}
if [[ "$CASE" == grace ]]; then
  kill -STOP "${ranks[1]}"
  wait_for 10 all_threads_stopped "${ranks[1]}" || fail "rank 1 (${ranks[1]}) does not stop on SIGSTOP"
fi

if [[ "$CASE" == sigint ]]; then
  kill -INT -- "-$launcher"
else
  kill "-$signal" "$launcher"
fi
start=$(date +%s.%N)

# The grace period, and room for a loaded machine to reap the ranks.
settle=$((grace + 10))
if ! wait_for $settle ranks_gone; then
  left=()
  for pid in "${ranks[@]}"; do alive "$pid" && left+=("$pid"); done
  fail "rank processes ${left[*]} still run $settle s after SIG$signal to the launcher"
else
  echo "ranks gone $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after SIG$signal"
fi
if [[ "$CASE" != sigkill ]]; then
  if wait_for $settle launcher_gone; then
    wait "$launcher"
    code=$?
    case $signal in INT) expected=130 ;; TERM) expected=143 ;; esac
    ((code == expected)) || fail "the launcher exited with $code, expected $expected (128 + SIG$signal)"
    grep -q "received SIG$signal" "$tmp/stderr.txt" || fail "the launcher does not say that it received SIG$signal"
    if [[ "$CASE" == grace ]]; then
      grep -q "1 of them with SIGKILL" "$tmp/stderr.txt" || fail "the launcher does not say that it sent SIGKILL"
    fi
  else
    fail "the launcher still runs $settle s after SIG$signal"
  fi
else
  wait "$launcher" 2>/dev/null
fi
left=$(segments_of "${ranks[@]}")
[[ -z "$left" ]] || fail "shared-memory segments of the ranks are left: $left"
if [[ -n "$port" ]] && port_listening "$port"; then
  fail "the store port $port still listens"
fi
if [[ "$CASE" == sigkill ]]; then
  # What rank 0 printed before the launcher died reached the file.
  grep -q "^epoch 10/100000" "$tmp/stdout.txt" ||
    fail "the launcher's redirected stdout lost rank 0's 'epoch 10/100000' line; it holds: $(head -c 600 "$tmp/stdout.txt")"
fi
grep "^ddp-run: received" "$tmp/stderr.txt"
if ((failures > 0)); then
  echo "--- launcher stdout (tail)"
  tail -5 "$tmp/stdout.txt"
  echo "--- launcher stderr (tail)"
  tail -5 "$tmp/stderr.txt"
  exit 1
fi
echo "PASS: $CASE"
