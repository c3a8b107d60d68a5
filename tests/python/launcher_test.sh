#!/usr/bin/env bash
# python3 -m ddp_torch.run, the launcher of ddp_torch: a failed rank stops
# the others and its exit code is the launcher's, with a line naming it; a
# missing script is refused at once; torchrun's environment reaches ranks.
# Usage: launcher_test.sh <dir holding the built ddp_torch package>
set -uo pipefail
export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}"
python=/usr/bin/python3
work=$(mktemp -d /tmp/ddp-torch-run-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

cat > "$work/env.py" <<'PY'
import os, sys, time
import ddp_torch  # imported by the launcher already: a second import is harmless
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
print(" ".join(f"{k}={os.environ[k]}" for k in keys), "args=" + ",".join(sys.argv[1:]), flush=True)
if os.environ["RANK"] == "1" and "fail" in sys.argv:
    sys.exit(3)
if "fail" in sys.argv:
    time.sleep(60)  # stopped by the launcher when rank 1 fails
PY
out=$(timeout 60 "$python" -m ddp_torch.run --nproc-per-node 2 "$work/env.py" a b 2>&1) || fail "exit $?: $out"
echo "$out"
grep -q "^RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=[0-9]* args=a,b$" <<< "$out" ||
  fail "rank 0's environment"
grep -q "^RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 " <<< "$out" || fail "rank 1's environment"

start=$SECONDS
out=$(timeout 60 "$python" -m ddp_torch.run --nproc-per-node 2 --kill-grace 2 "$work/env.py" fail 2>&1)
status=$?
echo "$out"
[ "$status" -eq 3 ] || fail "a rank that exited with 3: the launcher exited with $status"
grep -q "ddp_torch.run: rank 1 (pid [0-9]*) exited with code 3; stopping the other 1 rank(s)" <<< "$out" ||
  fail "no line naming rank 1"
[ $((SECONDS - start)) -lt 30 ] || fail "the other rank was not stopped promptly ($((SECONDS - start)) s)"

out=$("$python" -m ddp_torch.run --nproc-per-node 2 "$work/missing.py" 2>&1)
status=$?
[ "$status" -eq 2 ] || fail "a missing script: exit $status"
grep -q "no script $work/missing.py" <<< "$out" || fail "a missing script: $out"
echo "ok: ddp_torch.run"
