#!/usr/bin/env bash
# Makes ddp's Debian package (README.md, "Install the package"): installs
# what is missing (setup.sh), configures a build of its own for it, for /usr,
# with the CPU backends only and without tests or benchmarks (the package's
# conditions: cmake/Package.cmake), builds it and runs `cpack -G DEB`.
# Prints the .deb's path last. Safe to run again.
#
# Usage: scripts/package.sh [BUILD_DIR]   (default: build-deb)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-deb}
./scripts/setup.sh --packages-only
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
mkdir -p "$dir"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DDDP_WITH_NCCL=OFF \
  -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCHMARKS=OFF > "$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log"; echo "package: cmake configure failed (log above, in $dir/configure.log)" >&2; exit 1; }
grep -q "cpack -G DEB: offered" "$dir/configure.log" || {
  grep "cpack -G DEB" "$dir/configure.log" >&2 || true
  echo "package: this build cannot make the Debian package (the line above says why)" >&2; exit 1; }
cmake --build "$dir" -j "$(nproc)"
rm -f "$dir"/ddp_*.deb
(cd "$dir" && cpack -G DEB) > "$dir/cpack.log" 2>&1 || {
  cat "$dir/cpack.log"; echo "package: cpack failed (log above, in $dir/cpack.log)" >&2; exit 1; }
deb=$(find "$dir" -maxdepth 1 -name 'ddp_*.deb' | head -1)
[ -n "$deb" ] || { echo "package: cpack wrote no ddp_*.deb into $dir (see $dir/cpack.log)" >&2; exit 1; }
echo "$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")"
