#!/usr/bin/env bash
# OpenMPI: `mpirun -np 2 ddp-run experiments/wine_ddp.json` with no MASTER_*
# variables. Each rank takes its rank from OMPI_COMM_WORLD_*, the master is
# 127.0.0.1 (all ranks on one node) and the port comes from the job id. The
# job must finish with test_accuracy >= 0.94 and a checkpoint, and train
# exactly as `ddp-run --nproc-per-node 2` does.
#
# Usage: mpirun_test.sh path/to/ddp-run
set -euo pipefail
source "$(dirname "$0")/common.sh"

command -v mpirun >/dev/null || fail "mpirun not found (scripts/setup.sh installs openmpi-bin)"

mpi_args=(--oversubscribe -np 2)
if [ "$(id -u)" -eq 0 ]; then
  # OpenMPI refuses root unless told twice.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-mpirun-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "== mpirun ${mpi_args[*]} ddp-run $(basename "$experiment")"
start=$SECONDS
rc=0
timeout -k 10 240 mpirun "${mpi_args[@]}" "$ddp_run" "$experiment" --out "$work/mpi" </dev/null >"$work/mpi.log" 2>&1 || rc=$?
sed 's/^/  | /' "$work/mpi.log"
echo "mpirun: exit $rc after $((SECONDS - start)) s"
[ "$rc" -eq 0 ] || fail "mpirun exited with $rc"

# Each rank says where its layout came from (ddp-run's start-up line).
ports=()
for r in 0 1; do
  line=$(grep -E "rank $r of 2 \(openmpi\).*local rank $r of 2.*store at 127\.0\.0\.1:[0-9]+ .*port from the OpenMPI job id" \
    "$work/mpi.log" | head -n1) ||
    fail "no start-up line for rank $r from OpenMPI (expected 'rank $r of 2 (openmpi) ... store at 127.0.0.1:PORT (... port from the OpenMPI job id ...)')"
  ports+=("$(sed -E 's/.*store at 127\.0\.0\.1:([0-9]+).*/\1/' <<<"$line")")
  grep -q "gloo: rank $r listens on 127.0.0.1" "$work/mpi.log" || fail "rank $r did not report its gloo address"
done
[ "${ports[0]}" = "${ports[1]}" ] || fail "ranks derived different ports: ${ports[*]}"
[ "${ports[0]}" -ge 20000 ] && [ "${ports[0]}" -le 31999 ] || fail "derived port ${ports[0]} is outside 20000..31999"
echo "ok: both ranks from OMPI_COMM_WORLD_*, master 127.0.0.1:${ports[0]} derived from the job"

$checks final "$work/mpi" --min-accuracy 0.94 || fail "the mpirun job's results"

echo "== the same job by ddp-run --nproc-per-node 2"
run_one_host_reference "$work/local"
$checks same "$work/mpi" "$work/local" || fail "mpirun and ddp-run trained differently"
echo "PASSED: mpirun ran the job on ranks from OpenMPI, identical to ddp-run --nproc-per-node 2"
