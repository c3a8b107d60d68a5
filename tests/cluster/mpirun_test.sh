#!/usr/bin/env bash
# OpenMPI: `mpirun -np 2 ddp-run experiments/wine_ddp.json` with no MASTER_*
# variables. Each rank takes its rank from OMPI_COMM_WORLD_*, the master is
# 127.0.0.1 (all ranks on one node) and the port comes from the job id. The
# job must finish with test_accuracy >= 0.94 and a checkpoint, and train
# exactly as `ddp-run --nproc-per-node 2` does.
#
# In place under mpirun (issue 42): `--min-ranks` without `mpirun
# --enable-recovery` is refused at start (mpirun would abort every rank at
# the first death); with it, `mpirun -np 4` and rank 2 killed after step 7,
# the other three train on to the end: every step once, world 4 then 3, and
# no rank left running.
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
echo "== mpirun -np 2 ddp-run --min-ranks 1 without --enable-recovery: refused at start"
rc=0
timeout -k 10 120 mpirun "${mpi_args[@]}" "$ddp_run" "$experiment" --min-ranks 1 --out "$work/refused" \
  </dev/null >"$work/refused.log" 2>&1 || rc=$?
head -20 "$work/refused.log" | sed 's/^/  | /'
[ "$rc" -ne 0 ] || fail "--min-ranks under mpirun without --enable-recovery was not refused"
grep -q "under mpirun without --enable-recovery.*HINT: mpirun --enable-recovery" "$work/refused.log" ||
  fail "the refusal does not name mpirun --enable-recovery"
[ ! -e "$work/refused/steps.jsonl" ] || fail "the refused job trained"

echo "== mpirun --enable-recovery -np 4 ddp-run --min-ranks 2, rank 2 killed after step 7"
rc=0
DDP_FAULT_INJECT=2@7 timeout -k 10 240 mpirun --oversubscribe --enable-recovery -np 4 "$ddp_run" "$experiment" \
  --min-ranks 2 --set distributed.timeout_s=10 --out "$work/elastic" </dev/null >"$work/elastic.log" 2>&1 || rc=$?
grep -v "epoch [0-9]*/" "$work/elastic.log" | tail -40 | sed 's/^/  | /' || true
echo "mpirun: exit $rc"
[ "$rc" -eq 0 ] || fail "mpirun exited with $rc, expected 0 (with --enable-recovery, OpenMPI 4 ends the job with the survivors' status)"
grep -q "elastic: generation 1: lost rank id(s) 2; world 4 -> 3" "$work/elastic/train.log" ||
  fail "the others did not go on without rank 2 in place"
$checks elastic "$work/elastic" --worlds 4,3 --first 7 || fail "the in-place job's records"
$checks final "$work/elastic" --min-accuracy 0.94 || fail "the in-place job's results"
! pgrep -f "$work/elastic" >/dev/null || fail "a rank of the in-place job is still running"
echo "PASSED: mpirun ran the job on ranks from OpenMPI, identical to ddp-run --nproc-per-node 2; --min-ranks is refused without --enable-recovery and recovers in place with it"
