#!/usr/bin/env bash
# The test command of README.md: set-up, build, then every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cd build
ctest --output-on-failure --timeout 900 -j "${DDP_TEST_JOBS:-2}"
