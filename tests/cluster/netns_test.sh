#!/usr/bin/env bash
# Two hosts, each with its own address: two network namespaces joined by a
# veth pair, one rank in each, the master in the first, started by hand with
# --nnodes 2 --node-rank K. The job must run to the end and train exactly as
# the same job on one host (ddp-run --nproc-per-node 2); Gloo must listen on
# the veth address that reaches the master, not on loopback.
#
# Needs root (ip netns); prints "SKIPPED: <reason>" without it or where the
# kernel refuses network namespaces.
#
# Usage: netns_test.sh path/to/ddp-run
set -euo pipefail
source "$(dirname "$0")/common.sh"

[ "$(id -u)" -eq 0 ] || skip "network namespaces need root (ip netns add)"
command -v ip >/dev/null || fail "ip not found (scripts/setup.sh installs iproute2)"

# Names unique to this run; a subnet picked from the pid (inside fresh
# namespaces it cannot clash with the host's networks anyway).
ns1=ddp-host1-$$
ns2=ddp-host2-$$
veth1=ddpa$$
veth2=ddpb$$
net=10.213.$(($$ % 250 + 1))
addr1=$net.1
addr2=$net.2
port=29500

work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-netns-test.XXXXXX")
pids=()
cleanup() {
  local p ns
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in "$ns1" "$ns2"; do
    if ip netns list 2>/dev/null | grep -qw "$ns"; then
      # Whatever still runs inside our namespaces is ours (ranks a launcher left behind).
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
      ip netns delete "$ns" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

if ! err=$(ip netns add "$ns1" 2>&1); then
  skip "cannot create a network namespace here: $err"
fi
ip netns add "$ns2"
if ! err=$(ip link add "$veth1" netns "$ns1" type veth peer name "$veth2" netns "$ns2" 2>&1); then
  skip "cannot create a veth pair here: $err"
fi
ip -n "$ns1" addr add "$addr1/24" dev "$veth1"
ip -n "$ns2" addr add "$addr2/24" dev "$veth2"
for ns in "$ns1" "$ns2"; do ip -n "$ns" link set lo up; done
ip -n "$ns1" link set "$veth1" up
ip -n "$ns2" link set "$veth2" up
echo "hosts: $ns1 ($veth1 $addr1, the master) and $ns2 ($veth2 $addr2)"

echo "== two hosts: ddp-run --nnodes 2 --node-rank K --nproc-per-node 1 --master-addr $addr1"
token=netns-test-$$-$RANDOM
node() {  # node rank, namespace, log
  ip netns exec "$2" env DDP_STORE_TOKEN="$token" timeout -k 10 240 "$ddp_run" \
    --nnodes 2 --node-rank "$1" --nproc-per-node 1 --master-addr "$addr1" --master-port "$port" \
    "$experiment" --out "$work/two-hosts" </dev/null >"$3" 2>&1
}
start=$SECONDS
node 0 "$ns1" "$work/host1.log" & pids+=($!)
node 1 "$ns2" "$work/host2.log" & pids+=($!)
rc0=0; rc1=0
wait "${pids[0]}" || rc0=$?
wait "${pids[1]}" || rc1=$?
pids=()
for h in 1 2; do echo "-- host$h"; sed 's/^/  | /' "$work/host$h.log"; done
echo "two hosts: exit $rc0 / $rc1 after $((SECONDS - start)) s"
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || fail "the two-host job failed (exit $rc0 on $ns1, $rc1 on $ns2)"

# Gloo binds to the interface that routes to the master: the veth address.
grep -q "gloo: rank 0 listens on $addr1" "$work/host1.log" || fail "rank 0 does not listen on $addr1"
grep -q "gloo: rank 1 listens on $addr2" "$work/host2.log" || fail "rank 1 does not listen on $addr2"
if grep -q "listens on 127\." "$work/host1.log" "$work/host2.log"; then fail "a rank listens on loopback"; fi
echo "ok: gloo listens on $addr1 (rank 0) and $addr2 (rank 1)"

# All of rank 1's traffic crossed the veth pair: it is the only way out of $ns2.
tx=$(ip netns exec "$ns2" cat "/sys/class/net/$veth2/statistics/tx_bytes")
rx=$(ip netns exec "$ns2" cat "/sys/class/net/$veth2/statistics/rx_bytes")
echo "veth $veth2: $tx bytes sent, $rx bytes received"
[ "$tx" -gt 1000000 ] && [ "$rx" -gt 1000000 ] || fail "too little traffic over the veth pair for 500 allreduces"

$checks final "$work/two-hosts" --min-accuracy 0.94 || fail "the two-host job's results"

echo "== one host: ddp-run --nproc-per-node 2"
run_one_host_reference "$work/one-host"
$checks same "$work/two-hosts" "$work/one-host" || fail "two hosts and one host trained differently"
echo "PASSED: two hosts over $addr1/$addr2 ran the job to the end, identical to one host"
