#!/usr/bin/env bash
# Issue 42: hosts lost on a simulated cluster (ddp-bench faults): 3 hosts
# of 1 rank on 1 Gbit/s links, the store on etcd on the service node,
# --min-ranks 1, distributed.timeout_s 3. Each part runs the unfailed job
# first, as the reference.
#
# PART lost: for each fault (a host killed, one killed while the others
# wait in its collective, a link cut past the timeout, a second host killed
# during the recovery, a host killed and then started again as a
# replacement) the job goes on in place: the survivors exit 0, every
# optimizer step is recorded once, the world ends at 2 (1 after two hosts,
# 3 with the replacement), the final test accuracy is within 0.05 of the
# unfailed run's, and no victim exits 0. The cut host's ranks are decided
# out before the link returns, and say so when it does; the replacement's
# launcher exits 0. The link (cut for 11 s) again under --max-restarts 1
# instead of --min-ranks: every node restarts, and the job goes on from
# its newest checkpoint at the full world. First, the command's errors: one line,
# exit 1.
#
# PART slow (issue 42, item 3): a host whose link drops to 10 Mbit/s stays
# while its collectives fit the timeout, and the straggler report names it
# with its rank; under a model whose gradients outlast the timeout through
# that link, the recovery's probe finds it and leaves it out; on 2 hosts
# the job stops after 3 timeouts at one step, with a checkpoint.
#
# Two parts, two ctest entries, so that neither nears the 120 s that issue
# 40 allows one test. Prints "SKIPPED: <reason>" without root or etcd.
#
# Usage: faults_test.sh DDP_BENCH lost|slow
set -euo pipefail
bench=$(realpath -e "${1:?usage: $0 DDP_BENCH lost|slow}")
part=${2:?usage: $0 DDP_BENCH lost|slow}
case $part in
  # The link stays cut 11 s, past 2 timeouts and a restart: the cut host's
  # restarted rank must wait for the store, and the others for it.
  lost) faults=host,collective,link,recovery,replace restarts=(--restarts 1 --restart-faults link --cut-s 11) ;;
  slow) faults=slow,slow-timeout restarts=() ;;
  *) echo "faults_test.sh: unknown part '$part' (known: lost, slow)"; exit 2 ;;
esac
python=/usr/bin/python3
work=$(mktemp -d /tmp/ddp-faults-test-XXXXXX)
# A failure keeps the hosts' logs (the etcd data goes): a fault that
# misbehaves one run in many must be readable afterwards. KEEP_WORK=1
# keeps every run's.
keep_or_clean() {
  local rc=$?
  rm -rf "$work"/runs/etcd "$work"/stops/etcd
  if [ "$rc" = 0 ] && [ -z "${KEEP_WORK:-}" ]; then rm -rf "$work"; else echo "faults_test.sh: logs kept in $work"; fi
}
trap keep_or_clean EXIT
fail() { echo "FAILED: $*"; exit 1; }
unset DDP_FAULT_INJECT DDP_FAULT_RECOVERY MASTER_ADDR MASTER_PORT RANK WORLD_SIZE

expect_error() {  # WHAT ARGS... : exits 1 with one "ddp-bench faults: error:" line naming WHAT
  local what=$1 out code=0
  shift
  out=$("$bench" faults "$@" 2>&1) || code=$?
  [ "$code" = 1 ] || fail "ddp-bench faults $*: exit $code, expected 1: $out"
  grep -q "^ddp-bench faults: error: .*$what" <<< "$out" || fail "ddp-bench faults $*: no error naming '$what': $out"
  echo "  $*: $(grep "error:" <<< "$out")"
}
if [ "$part" = lost ]; then
echo "== errors: one line, exit 1"
expect_error "unknown fault" --faults power
expect_error "need 3 hosts" --hosts 2x1 --faults recovery
expect_error "min-ranks 3" --hosts 3x1 --min-ranks 3
expect_error "need 3 hosts" --hosts 2x1 --faults slow
expect_error "unknown profile" --slow-link 5mbit
expect_error "not one a restart meets" --restarts 1 --restart-faults replace
fi

rc=0
timeout -k 5 280 "$bench" faults --hosts 3x1 --link 1gbit --faults "$faults" ${restarts[@]+"${restarts[@]}"} --timeout-s 3 --time-limit 60 --json "$work/faults.json" \
  --keep "$work/runs" > "$work/out.log" 2>&1 || rc=$?
cat "$work/out.log"
if grep -q "^SKIPPED:" "$work/out.log"; then exit 0; fi
[ "$rc" = 0 ] || fail "ddp-bench faults exited $rc"

$python - "$work/faults.json" "$part" <<'PY' || fail "the records above are not what the faults should give"
import json, sys
all_records = json.load(open(sys.argv[1]))
records = {r["fault"]: r for r in all_records if r["recovery"] == "in-place"}
restarted = {r["fault"]: r for r in all_records if r["recovery"] == "restart"}
ok = True
def check(cond, what):
    global ok
    if not cond:
        print("  not so:", what)
        ok = False
part = sys.argv[2]
expected = ["host", "collective", "link", "recovery", "replace"] if part == "lost" else ["slow", "slow-timeout"]
check(sorted(records) == sorted(["none"] + expected), f"one record per fault: {sorted(records)}")
ref = records["none"]
check(ref["exit_codes"] == [0, 0, 0] and ref["final_world"] == 3, f"the unfailed run: {ref}")
if part == "lost":
    for name, world in (("host", 2), ("collective", 2), ("link", 2), ("recovery", 1), ("replace", 3)):
        r = records[name]
        check(r["exit_code"] == 0, f"{name}: the survivors exited {r['exit_codes']}")
        check(r["steps_once"], f"{name}: steps 1..N once ({r['steps']} recorded, {r['steps_lost']} twice)")
        check(r["final_world"] == world, f"{name}: final world {r['final_world']}, expected {world}")
        check(abs(r["test_accuracy"] - ref["test_accuracy"]) <= 0.05,
              f"{name}: test accuracy {r['test_accuracy']} against {ref['test_accuracy']}")
        check(isinstance(r["recovered_s"], (int, float)) and r["recovered_s"] > 0, f"{name}: recovered_s {r['recovered_s']}")
        check(all(c != 0 for c in r["victim_exit_codes"]), f"{name}: a victim exited 0: {r['victim_exit_codes']}")
    # A lost host marks nothing dead (its launcher went with it, and this is
    # another host by its name): the others leave it out once its heartbeat
    # stands still, not after the whole settle time.
    for name in ("host", "collective", "link", "recovery", "replace"):
        check(records[name]["decided_by"] == "heartbeat", f"{name}: decided by {records[name]['decided_by']}, not the heartbeat")
    check(records["host"]["victim_exit_codes"] == [137], f"host: the victim's launcher {records['host']['victim_exit_codes']}, not SIGKILL")
    check(records["recovery"]["victim_exit_codes"] == [137, 137], f"recovery: {records['recovery']['victim_exit_codes']}")
    replace = records["replace"]
    check(replace["replacement_exit_code"] == 0, f"replace: the replacement's launcher exited {replace['replacement_exit_code']}")
    check(isinstance(replace["rejoined_s"], (int, float)), f"replace: no step at world 3 after the replacement: {replace['rejoined_s']}")
    link = records["link"]
    check(link["recovered_s"] >= 3, f"link: recovered in {link['recovered_s']} s, before the 3 s timeout could pass")
    check(link["recovered_s"] < link["cut_s"], f"link: recovered in {link['recovered_s']} s, not before the link came back ({link['cut_s']} s)")
    check("left out" in link["victim_line"], f"link: the cut host said {link['victim_line']!r}")
    # The same cut under --max-restarts 1: every node restarts when it sees
    # the failure, the cut one once its link is back, and they meet again
    # (a restarted rank waits for the others' as for the master, not for
    # the 3 s timeout); the steps since the last checkpoint are done twice.
    again = restarted.get("link")
    check(again is not None and again["outcome"] == "recovered" and again["exit_codes"] == [0, 0, 0]
          and again["final_world"] == 3 and again["restarts"] == 1 and again["recovered_s"] >= 3,
          f"link under --max-restarts 1: {again}")
    if again:
        check(isinstance(again["test_accuracy"], (int, float))
              and abs(again["test_accuracy"] - ref["test_accuracy"]) <= 0.05,
              f"link restarted: accuracy {again['test_accuracy']}")
else:
    # The slow host: kept, and named; or, past the timeout, found and left out.
    slow = records["slow"]
    check(slow["exit_codes"] == [0, 0, 0] and slow["final_world"] == 3 and slow["steps_once"],
          f"slow: exits {slow['exit_codes']}, world {slow['final_world']}, steps once {slow['steps_once']}")
    check(abs(slow["test_accuracy"] - ref["test_accuracy"]) <= 0.05, f"slow: test accuracy {slow['test_accuracy']}")
    check(slow["named"] and "straggler: host " in slow["straggler_line"], f"slow: the report said {slow['straggler_line']!r}")
    check(slow["step_ms_slowed"] > slow["step_ms_before"], f"slow: steps of {slow['step_ms_slowed']} ms slowed, {slow['step_ms_before']} before")
    late = records["slow-timeout"]
    check(late["exit_code"] == 0 and late["final_world"] == 2 and late["steps_once"],
          f"slow-timeout: survivors exited {late['exit_codes']}, world {late['final_world']}, steps once {late['steps_once']}")
    check(all(c != 0 for c in late["victim_exit_codes"]), f"slow-timeout: the slow host's launcher exited {late['victim_exit_codes']}")
    check(late["decided_by"] == "probe", f"slow-timeout: decided by {late['decided_by']}, not the probe of the links")
    check("left out" in late["victim_line"] and "distributed.timeout_s" in late["victim_line"],
          f"slow-timeout: the slow host said {late['victim_line']!r}")
    check(late["recovered_s"] >= 3, f"slow-timeout: recovered in {late['recovered_s']} s, before the 3 s timeout could pass")
print("records: " + "; ".join(f"{r['fault']} ({r['recovery']}) {r['recovered_s'] or 0:.3f} s -> world {r['final_world']}"
                             for r in all_records))
if part == "slow":
    print("slow:", records["slow"]["straggler_line"])
sys.exit(0 if ok else 1)
PY
if [ "$part" = slow ]; then
# Two hosts: the probe cannot tell whose link it is; after 3 timeouts at
# one step the job stops, with a checkpoint, instead of looping.
rc=0
timeout -k 5 120 "$bench" faults --hosts 2x1 --faults slow-timeout --timeout-s 2 --epochs 8 --at-step 3 \
  --time-limit 60 --json "$work/stops.json" --keep "$work/stops" > "$work/stops.log" 2>&1 || rc=$?
cat "$work/stops.log"
[ "$rc" = 0 ] || fail "ddp-bench faults --hosts 2x1 --faults slow-timeout exited $rc"
$python - "$work/stops.json" <<'PY' || fail "slow-timeout on 2 hosts did not stop as it should"
import json, sys
r = {r["fault"]: r for r in json.load(open(sys.argv[1]))}["slow-timeout"]
# Every launcher exits 5 (kExitStalled): stopped with a checkpoint, no rank restarted.
ok = r["outcome"] == "stopped" and r["exit_codes"] == [5, 5] and r["steps_once"]
ok = ok and "timed out 3 times in a row" in r["stopped_line"] and "saved " in r["stopped_line"]
ok = ok and "HINT: --resume with a larger distributed.timeout_s" in r["stopped_line"]
print("stopped:", r["exit_codes"], r["stopped_line"])
sys.exit(0 if ok else 1)
PY
fi
# Nothing of the cluster is left (its namespaces carry ddpsim<pid>).
left=$(ip netns list | grep -c "^ddpsim" || true)
[ "$left" = 0 ] || fail "$left simulated-cluster namespace(s) left: $(ip netns list | grep ddpsim | head -3)"

echo "PASSED"
