#!/usr/bin/env bash
# The store on etcd (ddp-run --rdzv-backend etcd), and a host lost with it
# gone nowhere: two "hosts" (two ddp-run launchers, --nnodes 2, each in a
# session of its own) train wine on 2 + 2 ranks, in place on --min-ranks 2,
# against an etcd of the test's own:
#   1. unfailed: both launchers exit 0 (the reference);
#   2. node 0's host dies at optimizer step 9 (DDP_FAULT_INJECT=0@9:host:
#      SIGKILL to its launcher and both its ranks at once, so nobody marks
#      them dead): node 1 carries on in place, exit 0, with every optimizer
#      step done once, world 4 then 2, and the final test accuracy within
#      0.05 of the reference; nothing of node 0 is left running;
#   2b. the same, then node 0's command started again on its "host": a
#      replacement node 0, whose ranks join at a step boundary (world 2 ->
#      4); the writer (rank 0) stays on node 1, and both launchers exit 0;
#   3. a rank of node 1 killed: node 1's own launcher marks it dead in the
#      store (elastic/dead/3 in etcd), and both nodes finish with exit 0;
#   4. what ddp-run says to an etcd command line that lacks something, and
#      to a node started again under the id of a job that is over.
# Prints "SKIPPED: <reason>" without etcd (Debian's etcd-server).
#
# Usage: etcd_hosts_test.sh DDP_RUN
set -euo pipefail
ddp_run=$(realpath -e "${1:?usage: $0 DDP_RUN}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=/usr/bin/python3
if [ ! -x /usr/bin/etcd ]; then
  echo "SKIPPED: /usr/bin/etcd is not installed (Debian's etcd-server; scripts/setup.sh installs it)"
  exit 0
fi
work=$(mktemp -d /tmp/ddp-etcd-hosts-XXXXXX)
etcd_pid=
cleanup() {
  set +e
  [ -n "$etcd_pid" ] && { kill -KILL "$etcd_pid"; wait "$etcd_pid"; } 2>/dev/null
  for f in "$work"/*.sid; do [ -f "$f" ] && pkill -KILL -s "$(cat "$f")" 2>/dev/null; done
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap 'rc=$?; cleanup; exit $rc' EXIT
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK DDP_FAULT_INJECT
export DDP_STORE_TOKEN=etcd-hosts-test-$$
fail() { echo "FAILED: $*"; exit 1; }
free_port() { $python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

client=$(free_port) peer=$(free_port)
/usr/bin/etcd --name t --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$client" \
  --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "t=http://127.0.0.1:$peer" \
  --log-level error > "$work/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 100); do
  $python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$client/health', timeout=1)" 2>/dev/null && break
  sleep 0.1
done
echo "etcd at 127.0.0.1:$client (pid $etcd_pid)"

experiment=("$repo/experiments/wine_baseline.json" --set training.epochs=12 --set training.eval_every=1
  --set training.log_every=1 --set training.save_every=0 --set distributed.timeout_s=5)
# start_node K NAME ID STEM [FAULT]: node K's launcher in the background,
# in a session of its own (one simulated host), with DDP_FAULT_INJECT=FAULT;
# its log, session id and exit code in $work/STEM.{log,sid,rc}.
start_node() {
  local k=$1 name=$2 id=$3 stem=$4 fault=${5:-}
  (
    [ -n "$fault" ] && export DDP_FAULT_INJECT="$fault"
    rc=0
    # (setsid does not fork here: timeout's child leads no process group.)
    timeout -k 5 180 setsid bash -c 'echo $$ > "$0"; exec "$@"' "$work/$stem.sid" \
      "$ddp_run" --nnodes 2 --node-rank "$k" --nproc-per-node 2 --rdzv-backend etcd \
      --rdzv-endpoint "127.0.0.1:$client" --rdzv-id "$id" --min-ranks 2 --max-restarts 0 \
      "${experiment[@]}" --out "$work/$name" > "$work/$stem.log" 2>&1 < /dev/null || rc=$?
    echo "$rc" > "$work/$stem.rc"
  ) &
}

# run_hosts NAME ID FAULT [NODE]: both launchers, DDP_FAULT_INJECT=FAULT on
# node NODE (0 by default); their exit codes in $work/NAME.node<K>.rc.
run_hosts() {
  local name=$1 id=$2 fault=$3 faulty=${4:-0} k pids=()
  for k in 0 1; do
    start_node "$k" "$name" "$id" "$name.node$k" "$([ "$k" = "$faulty" ] && echo "$fault")"
    pids+=($!)
  done
  wait "${pids[@]}"  # not etcd
}

echo "== 1. unfailed, 2 hosts x 2 ranks, the store on etcd"
run_hosts plain job-plain ""
for k in 0 1; do
  [ "$(cat "$work/plain.node$k.rc")" = 0 ] || { tail -30 "$work/plain.node$k.log"; fail "node $k of the unfailed run exited $(cat "$work/plain.node$k.rc")"; }
done
# The job's keys are in etcd (they outlive the job by the run's lease).
keys=$(ETCDCTL_API=3 /usr/bin/etcdctl --endpoints "127.0.0.1:$client" get --prefix /ddp/job-plain/ --keys-only)
grep -q "^/ddp/job-plain/run$" <<< "$keys" && grep -q "^/ddp/job-plain/kv/elastic/" <<< "$keys" ||
  { echo "$keys" | head; fail "etcd holds no keys of the job under /ddp/job-plain/"; }
echo "etcd holds $(grep -c . <<< "$keys") keys of the job under /ddp/job-plain/"

echo "== 2. node 0's host killed at step 9 (its launcher and both ranks, SIGKILL)"
run_hosts killed job-killed "0@9:host"
rc0=$(cat "$work/killed.node0.rc") rc1=$(cat "$work/killed.node1.rc")
echo "node 0 exited $rc0, node 1 exited $rc1"
[ "$rc1" = 0 ] || { tail -40 "$work/killed.node1.log"; fail "node 1 exited $rc1, expected 0"; }
[ "$rc0" = 137 ] || { tail -20 "$work/killed.node0.log"; fail "node 0 exited $rc0, expected 137 (SIGKILL)"; }
# (Zombies aside: a container's init may not reap the orphans at once.)
left=$(ps -o pid=,stat=,args= -s "$(cat "$work/killed.node0.sid")" | awk '$2 !~ /^Z/' || true)
[ -z "$left" ] || fail "processes of node 0's session are still running: $left"
$python "$repo/tests/cluster/run_checks.py" elastic "$work/killed" --worlds 4,2 --first 9 --like "$work/plain" ||
  fail "the run that lost a host differs from the unfailed one (above)"
grep -q "lost rank id(s) 0, 1\|lost rank id(s) 0,1" "$work/killed/train.log" "$work/killed.node1.log" ||
  { grep -h "elastic" "$work/killed.node1.log" | tail; fail "node 1 did not say it lost rank ids 0 and 1"; }

echo "== 2b. node 0's host killed at step 9, then node 0's command started again: a replacement node 0"
# The members wait after step 12 until both of the replacement's ranks ask
# to join (DDP_FAULT_AWAIT_JOIN=12:2), so the job is still running when
# they come, and they are admitted together.
export DDP_FAULT_AWAIT_JOIN=12:2
start_node 0 replaced job-replaced replaced.node0.first "0@9:host"
first0=$!
start_node 1 replaced job-replaced replaced.node1.first
first1=$!
wait "$first0"  # node 0's host is gone
for _ in $(seq 600); do  # node 1 trains on at world 2
  [ -f "$work/replaced/steps.jsonl" ] && grep -q '"world_size":2' "$work/replaced/steps.jsonl" && break
  sleep 0.1
done
grep -q '"world_size":2' "$work/replaced/steps.jsonl" || fail "node 1 did not train on at world 2 after node 0's host died"
start_node 0 replaced job-replaced replaced.node0.again
again0=$!
wait "$first1" "$again0"
unset DDP_FAULT_AWAIT_JOIN
rc_first=$(cat "$work/replaced.node0.first.rc")
rc1=$(cat "$work/replaced.node1.first.rc")
rc_again=$(cat "$work/replaced.node0.again.rc")
echo "node 0 exited $rc_first, its replacement $rc_again, node 1 $rc1"
[ "$rc_first" = 137 ] || fail "the first node 0 exited $rc_first, expected 137 (SIGKILL)"
[ "$rc1" = 0 ] || { tail -30 "$work/replaced.node1.first.log"; fail "node 1 exited $rc1, expected 0"; }
[ "$rc_again" = 0 ] || { tail -30 "$work/replaced.node0.again.log"; fail "the replacement node 0 exited $rc_again, expected 0"; }
grep -q "replaces a lost one" "$work/replaced.node0.again.log" ||
  { head -5 "$work/replaced.node0.again.log"; fail "the replacement node 0 did not say it replaces a lost one"; }
grep -q "rank id(s) 0,1 joined; world 2 -> 4" "$work/replaced/train.log" ||
  { grep elastic "$work/replaced/train.log"; fail "train.log does not say rank ids 0,1 joined"; }
# The writer stayed on node 1 (a joiner never takes rank 0): the epoch lines
# and the end are in node 1's log only.
grep -q "^done:\|\] done:" "$work/replaced.node1.first.log" || fail "node 1's log has no done: line (the writer left it)"
! grep -q "epoch [0-9]*/12" "$work/replaced.node0.again.log" || fail "the replacement node 0 wrote epoch lines: it took over the writing"
$python "$repo/tests/cluster/run_checks.py" elastic "$work/replaced" --worlds 4,2,4 --like "$work/plain" ||
  fail "the run whose node 0 was replaced differs from the unfailed one (above)"

echo "== 3. a rank of node 1 killed at step 9: node 1's own launcher marks it dead in the store"
run_hosts rank job-rank "3@9" 1
for k in 0 1; do
  [ "$(cat "$work/rank.node$k.rc")" = 0 ] || { tail -30 "$work/rank.node$k.log"; fail "node $k exited $(cat "$work/rank.node$k.rc"), expected 0"; }
done
dead=$(ETCDCTL_API=3 /usr/bin/etcdctl --endpoints "127.0.0.1:$client" get --print-value-only /ddp/job-rank/kv/elastic/dead/3)
[ "$dead" = 1 ] || fail "etcd holds '$dead' at /ddp/job-rank/kv/elastic/dead/3: node 1's launcher did not mark rank 3 dead"
grep -q "ddp-run: rank 3 (pid [0-9]*) .*the others carry on" "$work/rank.node1.log" ||
  { tail -20 "$work/rank.node1.log"; fail "node 1's launcher did not report rank 3's death"; }
grep -h "elastic: generation 1" "$work/rank.node0.log" "$work/rank.node1.log" | head -1 | cut -c1-160

echo "== 4. etcd command lines that lack something"
expect_usage() {  # expect_usage TEXT ARGS...: exit 2 and TEXT on one line
  local text=$1 rc=0 out
  shift
  out=$("$ddp_run" "$@" "${experiment[@]}" --out "$work/usage" 2>&1) || rc=$?
  [ "$rc" = 2 ] || { echo "$out"; fail "ddp-run $* exited $rc, expected 2"; }
  grep -qF -- "$text" <<< "$out" || { echo "$out"; fail "ddp-run $*: no '$text'"; }
}
expect_usage "needs --rdzv-id" --rdzv-backend etcd --rdzv-endpoint "127.0.0.1:$client"
expect_usage "needs --rdzv-endpoint" --rdzv-backend etcd --rdzv-id x
expect_usage "use letters, digits" --rdzv-backend etcd --rdzv-endpoint "127.0.0.1:$client" --rdzv-id "a/b"
expect_usage "drop --master-addr" --rdzv-backend etcd --rdzv-endpoint "127.0.0.1:$client" --rdzv-id x --master-addr 127.0.0.1
# Node 1 of a job that finished (its keys still in etcd) started again
# under the same id: not a replacement for a lost node, and it says so.
expect_usage "a new job needs a new --rdzv-id" --nnodes 2 --node-rank 1 --nproc-per-node 2 --rdzv-backend etcd \
  --rdzv-endpoint "127.0.0.1:$client" --rdzv-id job-rank --min-ranks 2
echo "PASSED"
