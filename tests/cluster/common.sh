# Sourced by the cluster tests (after `set -euo pipefail`) with the path of
# ddp-run as $1: sets ddp_run, here, repo, experiment and checks, defines
# fail and skip, and clears every variable that could decide the rank
# layout, so that only what the test sets does.
ddp_run=$(realpath "${1:?usage: $0 path/to/ddp-run}")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
experiment=$repo/experiments/wine_ddp.json
checks="python3 $here/run_checks.py"

fail() { echo "FAILED: $*" >&2; exit 1; }
skip() { echo "SKIPPED: $*"; exit 0; }

command -v python3 >/dev/null || fail "python3 not found"

unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK NODE_RANK MASTER_ADDR MASTER_PORT \
  DDP_RUN_LAUNCHED DDP_RESTART DDP_STORE_TOKEN GLOO_SOCKET_IFNAME
for v in $(compgen -e | grep -E '^(SLURM_|OMPI_|PMIX_)' || true); do unset "$v"; done

# The reference every cluster test compares with: the same job as two local
# ranks (ddp-run --nproc-per-node 2), into folder $1; its log goes to $1.log.
run_one_host_reference() {
  local out=$1 rc=0
  timeout -k 10 240 "$ddp_run" --nproc-per-node 2 "$experiment" --out "$out" </dev/null >"$out.log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { sed 's/^/  | /' "$out.log"; fail "ddp-run --nproc-per-node 2 exited with $rc"; }
}
