#!/usr/bin/env bash
# Installs the Debian packages the project needs (only those missing), then
# configures and builds into build/. Safe to run again: it does nothing that
# is already done. Used by both commands in README.md.
#
# Usage: setup.sh [TARGET ...]   the targets to build (default: all of them);
#                                run.sh asks for ddp-run alone, test.sh for all
#        setup.sh --packages-only   install the packages, build nothing
#                                   (scripts/package.sh builds its own tree)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev nlohmann-json3-dev libfmt-dev catch2 libcli11-dev
  libopenblas0-pthread    # without it LibTorch falls back to the reference BLAS (16x slower MLP steps)
  python3-torch python3-sklearn   # references and data sources for the benchmarks
  python3-jsonschema              # tests/schema: experiments/ checked against ddp-run --schema
  python3-matplotlib              # scripts/ddp-plot: PNGs of run folders and benchmark records
  pybind11-dev python3-dev        # python/ddp_torch: the backend "ddp" of torch.distributed
  fortunes                        # a text corpus: /usr/share/games/fortunes (experiments/char_gpt.json)
  openmpi-bin iproute2            # cluster tests: mpirun, and two hosts in network namespaces
  slurm-wlm munge                 # cluster test: a SLURM cluster on this machine (tests/cluster/slurm_test.sh)
  etcd-server etcd-client         # the store on etcd (--rdzv-backend etcd); its tests start their own etcd
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -q
  $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

[ "${1:-}" = "--packages-only" ] && exit 0

# ccache: keeps rebuilds of LibTorch-heavy files cheap; PCH needs sloppiness.
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
jobs=$(nproc)
mkdir -p build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${DDP_CMAKE_ARGS:-} > build/configure.log 2>&1 || {
  cat build/configure.log; echo "setup: cmake configure failed (log above, in build/configure.log)"; exit 1; }
grep -E "✓|✗" build/configure.log || true
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$jobs" "${targets[@]}"
