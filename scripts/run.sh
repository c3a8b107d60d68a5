#!/usr/bin/env bash
# The main command of README.md: set-up, build, then the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./build/ddp-run --nproc-per-node 2 experiments/wine_ddp.json
