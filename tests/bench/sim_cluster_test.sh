#!/usr/bin/env bash
# ddp-bench on a simulated cluster (benchmarks/sim_cluster.hpp): hosts as
# network namespaces joined through a bridge by rate-limited links. The
# results must be verified, the links must hold the traffic to their rate,
# and nothing may outlive a run: not after a normal end, not after SIGTERM
# (the run ends through its teardown), not after SIGKILL (the next run
# removes what the killed one left).
#
# Needs root; prints "SKIPPED: <reason>" without it.
# Usage: sim_cluster_test.sh path/to/ddp-bench
set -euo pipefail
bench=$(realpath "${1:?usage: $0 path/to/ddp-bench}")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN
[ "$(id -u)" -eq 0 ] || { echo "SKIPPED: network namespaces need root"; exit 0; }
leftovers() { ip netns list 2>/dev/null | grep -c '^ddpsim' || true; }
[ "$(leftovers)" -eq 0 ] || fail "simulated-cluster namespaces exist before the test: $(ip netns list | grep ddpsim)"

echo "== 2 hosts x 1 rank over 1 Gbit/s links, verified"
rc=0
timeout -k 5 240 "$bench" collectives --hosts 2x1 --link 1gbit --ops allreduce --min-bytes 64K --max-bytes 4M \
  --warmup 1 --iters 3 --verify --impls gloo-tcp,gloo --json "$out/sim.json" >"$out/sim.log" 2>&1 || rc=$?
sed 's/^/  | /' "$out/sim.log"
if grep -q "^SKIPPED:" "$out/sim.log"; then grep "^SKIPPED:" "$out/sim.log"; exit 0; fi
[ "$rc" -eq 0 ] || fail "ddp-bench collectives --hosts 2x1 exited with $rc"
grep -q "# simulated cluster: 2 hosts x 1 ranks" "$out/sim.log" || fail "no simulated-cluster header"
python3 - "$out/sim.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
assert records and all(r["hosts"] == "2x1" and r["link"] == "1gbit" for r in records), records[:1]
big = [r for r in records if r["bytes"] == 4 << 20]
assert big, "no 4 MiB record"
for r in big:
    # 2 ranks: busbw = what each link carries per direction; 1 Gbit/s is 0.125 GB/s.
    assert r["busbw_gbps"] <= 0.125 * 1.15, f"{r['impl']} went faster than the link: {r['busbw_gbps']} GB/s"
    assert r["busbw_gbps"] >= 0.125 * 0.3, f"{r['impl']} far below the link: {r['busbw_gbps']} GB/s"
    print(f"{r['impl']}: {r['busbw_gbps']:.3f} GB/s at 4 MiB, {r['busbw_gbps'] / 0.125:.0%} of the link")
PY
[ "$(leftovers)" -eq 0 ] || fail "namespaces left after a normal end: $(ip netns list | grep ddpsim)"
echo "ok: verified, held to the link's rate, nothing left"

echo "== train-step on 2 hosts with each compression hook"
rc=0
timeout -k 5 240 "$bench" train-step --hosts 2x1 --link 1gbit --comm-hooks bf16,powersgd --steps 2 --warmup 1 \
  --repeats 1 --json "$out/step.json" >"$out/step.log" 2>&1 || rc=$?
sed 's/^/  | /' "$out/step.log"
[ "$rc" -eq 0 ] || fail "ddp-bench train-step --hosts 2x1 exited with $rc"
python3 - "$out/step.json" <<'PY'
import json, sys
records = {(r["impl"], r["world_size"]): r for r in json.load(open(sys.argv[1]))}
for impl in ("ddp", "ddp+bf16", "ddp+powersgd"):
    r = records[(impl, 2)]
    assert r["hosts"] == "2x1" and r["step_ms"] > 0, r
    assert r["comm_hook"] == {"ddp": "allreduce", "ddp+bf16": "bf16", "ddp+powersgd": "powersgd"}[impl], r
print("train-step records:", sorted(k[0] for k in records))
PY
grep -q "speed-up of powersgd over the exact allreduce at world 2 (2x1, 1gbit)" "$out/step.log" || fail "no speed-up line"
[ "$(leftovers)" -eq 0 ] || fail "namespaces left after train-step: $(ip netns list | grep ddpsim)"

# TMPDIR: the killed run's work folder lands in $out, removed at exit.
long_run() {
  TMPDIR="$out" "$bench" collectives --hosts 2x1 --link 1gbit --ops allreduce --min-bytes 64M --max-bytes 64M --warmup 50 \
    --iters 50 --impls gloo-tcp >"$out/$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    [ "$(leftovers)" -gt 0 ] && grep -q "running gloo-tcp" "$out/$1.log" && return 0
    sleep 0.1
  done
  sed 's/^/  | /' "$out/$1.log"
  fail "the long run did not start its cluster"
}

echo "== SIGTERM during a run"
long_run term
sleep 1
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
sed 's/^/  | /' "$out/term.log"
[ "$rc" -eq 143 ] || fail "ddp-bench exited $rc after SIGTERM, not 143 (128 + SIGTERM)"
grep -q "stopped by signal 15" "$out/term.log" || fail "the error does not name the signal"
[ "$(leftovers)" -eq 0 ] || fail "namespaces left after SIGTERM: $(ip netns list | grep ddpsim)"
echo "ok: exit $rc, the signal named, nothing left"

echo "== SIGKILL during a run, then another run"
long_run kill
kill -KILL "$pid"
wait "$pid" || true
sleep 0.5
echo "left by the killed run: $(leftovers) namespace(s)"
timeout -k 5 120 "$bench" collectives --hosts 2x1 --link none --ops allreduce --min-bytes 4K --max-bytes 4K \
  --warmup 1 --iters 2 --impls gloo-tcp >"$out/after.log" 2>&1 || { sed 's/^/  | /' "$out/after.log"; fail "the run after SIGKILL failed"; }
[ "$(leftovers)" -eq 0 ] || fail "namespaces left after the run that follows a SIGKILL: $(ip netns list | grep ddpsim)"
echo "PASSED: the next run removed what the killed one left"
