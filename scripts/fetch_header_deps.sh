#!/usr/bin/env bash
# Unpacks the Debian packages that a build on a machine without package
# access needs (headers, and fmt's library) into .deps/, for
# benchmarks/gpu_check.sh. Runs here, where Debian's archive is reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
apt-get download nlohmann-json3-dev libfmt-dev libfmt9 catch2 libcli11-dev > /dev/null
for deb in *.deb; do dpkg -x "$deb" ..; done
echo "unpacked into .deps/usr: $(ls ../usr/include | tr '\n' ' ')"
