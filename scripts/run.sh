#!/usr/bin/env bash
# The main command of README.md: set-up, build of what the main job needs
# (ddp-run, with the built-in backends and plugins; not the tests or
# benchmarks), then the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh ddp-run
exec ./build/ddp-run --nproc-per-node 2 experiments/wine_ddp.json
