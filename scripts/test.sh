#!/usr/bin/env bash
# The test command of README.md: set-up, build, then every test through ctest.
# It reports the two parts' times apart (issue 40: the ctest part in at most
# 10 minutes on a 2-core machine at the default -j2). DDP_TEST_JOBS sets
# ctest's parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
./scripts/setup.sh
# The Debian package's own tree (for /usr, CPU only), which ctest's
# install test packs and installs: built here, with the rest of the build.
./scripts/package.sh build/package > build/package.log 2>&1 || {
  tail -30 build/package.log; echo "test.sh: scripts/package.sh failed (log: build/package.log)"; exit 1; }
export DDP_PACKAGE_BUILD_DIR=$PWD/build/package
built=$(date +%s)
echo "test.sh: set-up and build took $((built - started)) s"
cd build
status=0
ctest --output-on-failure --timeout 300 -j "${DDP_TEST_JOBS:-2}" || status=$?
echo "test.sh: set-up and build $((built - started)) s, ctest $(($(date +%s) - built)) s (exit $status)"
exit $status
