#!/usr/bin/env bash
# torchrun (torch.distributed.run) starts ranks_test.py, which imports
# ddp_torch itself: the backend "ddp" under PyTorch's own launcher.
# (Debian's torch 1.13 needs --redirects 1 --tee 1: an enum bug in torchrun.)
# Usage: torchrun_test.sh <dir holding the built ddp_torch package>
set -euo pipefail
export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}"
python=/usr/bin/python3
"$python" -c "import torch.distributed.run" 2> /dev/null || { echo "SKIPPED: $python has no torch.distributed.run"; exit 0; }
port=$("$python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
exec timeout -k 5 120 "$python" -m torch.distributed.run --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 \
  --master_port "$port" --redirects 1 --tee 1 "$(dirname "$0")/ranks_test.py"
