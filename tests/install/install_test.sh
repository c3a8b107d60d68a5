#!/usr/bin/env bash
# ddp as another CMake project uses it:
#  1. `cmake --install` of this build into a fresh prefix puts the headers,
#     the generated config, the umbrella header, the libraries, ddp-run, the
#     data files and the package config where README.md says; every
#     #include "..." of an installed header resolves inside the prefix.
#  2. A consumer project (tests/install/consumer) finds the package with
#     find_package(ddp), builds against ddp::ddp and runs: collectives on one
#     rank, one DDP step against the plain step, the built-in plugins.
#  3. The example plugin (plugins/example) builds on its own against the
#     installed package, and the installed ddp-run trains with it, from a
#     folder outside the source tree, reading the installed data/wine.csv.
#  4. A project that add_subdirectory()s this source tree configures, and its
#     generated ddp/config.hpp names this source tree.
#  5. scripts/package.sh makes a .deb that depends on Debian's packages of
#     what ddp links (and on no CUDA); unpacked into a scratch root (dpkg -x),
#     the consumer builds against it and runs, and its ddp-run trains on its
#     own data files. The package's own build (minutes of compiling, a
#     build like any other) goes to $DDP_PACKAGE_BUILD_DIR when it is set:
#     scripts/test.sh makes it there in its build phase, and this test then
#     finds it built (package.sh builds only what changed) and packs it.
#
# Usage: install_test.sh <ddp build dir>
# Work files go to <build>/install_test (kept for a look after a failure;
# fixed paths, so that ccache serves the compiles of a rerun).
set -euo pipefail
build=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
work="$build/install_test"
prefix="$work/prefix"
rm -rf "$work"
mkdir -p "$work"
unset DDP_DATA_DIR

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fail() { echo "FAILED: $*"; exit 1; }
step() { echo "== $* (at $SECONDS s)"; }
# Runs a command with its output in $work/<name>.log, shown if it fails.
logged() {
  local name=$1; shift
  if ! "$@" > "$work/$name.log" 2>&1; then
    tail -40 "$work/$name.log"
    fail "$name: $* (log: $work/$name.log)"
  fi
}

step "cmake --install $build --prefix $prefix"
logged install cmake --install "$build" --prefix "$prefix"
# lib/, or lib/<multiarch> for a /usr prefix (GNUInstallDirs).
config=$(find "$prefix" -path '*/cmake/ddp/ddpConfig.cmake' | head -1)
[ -n "$config" ] || fail "no ddpConfig.cmake under $prefix"
lib=$(dirname "$(dirname "$(dirname "$config")")")
lib=${lib#"$prefix/"}
for f in include/ddp/ddp.hpp include/ddp/config.hpp \
         include/ddp/framework/comm/process_group.hpp include/ddp/framework/parallel/ddp.hpp \
         include/ddp/framework/experiment/plugin_registry.hpp include/ddp/framework/launch/distributed.hpp \
         include/ddp/backends/builtin.hpp include/ddp/plugins/builtin.hpp \
         $lib/libddp_comm.a $lib/libddp_train.a $lib/libddp_kernels.a $lib/libddp_plugins.a bin/ddp-run \
         share/ddp/data/wine.csv share/ddp/experiments/wine_baseline.json share/ddp/experiments/wine_ddp.json \
         $lib/cmake/ddp/ddpConfigVersion.cmake $lib/cmake/ddp/ddpTargets.cmake; do
  [ -f "$prefix/$f" ] || fail "not installed: $prefix/$f"
done
# Every header of framework/, backends/ and plugins/ is installed, and every
# project include of an installed header resolves inside the prefix.
(cd "$repo" && find framework backends plugins -name '*.hpp') | while IFS= read -r h; do
  [ -f "$prefix/include/ddp/$h" ] || fail "header not installed: $h"
done
missing=$(find "$prefix/include/ddp" -name '*.hpp' -print0 | xargs -0 grep -ho '^#include "[^"]*"' |
  sed 's/^#include "\(.*\)"/\1/' | sort -u | while IFS= read -r inc; do
    [ -f "$prefix/include/ddp/$inc" ] || [ -f "$prefix/include/$inc" ] || echo "$inc"
  done)
[ -z "$missing" ] || fail "installed headers include files that were not installed: $missing"
grep -q "DDP_SOURCE_DIR \"$repo\"" "$build/generated/ddp/config.hpp" ||
  fail "$build/generated/ddp/config.hpp: DDP_SOURCE_DIR is not $repo"
echo "ok: installed files"

step "consumer: find_package(ddp), ddp::ddp, #include <ddp/ddp.hpp>"
logged consumer-configure cmake -S "$repo/tests/install/consumer" -B "$work/consumer" "${generator[@]}" \
  "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
logged consumer-build cmake --build "$work/consumer"
out=$("$work/consumer/ddp_consumer" 2>&1) || { echo "$out"; fail "ddp_consumer exited with an error"; }
echo "$out"
if grep -q "^SKIPPED:" <<< "$out"; then exit 0; fi
grep -q "^all checks passed" <<< "$out" || fail "ddp_consumer did not pass its checks"

step "example plugin: built alone against the installed ddp, loaded by the installed ddp-run"
logged plugin-configure cmake -S "$repo/plugins/example" -B "$work/plugin" "${generator[@]}" \
  "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
logged plugin-build cmake --build "$work/plugin"
plugin="$work/plugin/libddp_example_plugin.so"
[ -f "$plugin" ] || fail "no $plugin"
if nm -D --defined-only "$plugin" | grep -q "PluginRegistry3add"; then
  fail "$plugin defines ddp's PluginRegistry (it must take ddp's symbols from ddp-run)"
fi
mkdir -p "$work/run"
cat > "$work/run/linear.json" <<JSON
{"plugins": ["$plugin"],
 "dataset": {"name": "wine"}, "model": {"name": "linear"}, "optimizer": {"name": "adam", "lr": 0.05},
 "loss": {"name": "cross_entropy"}, "training": {"epochs": 2, "threads": 1}}
JSON
(cd "$work/run" && "$prefix/bin/ddp-run" linear.json --out out > "$work/ddp-run.log" 2>&1) ||
  { tail -20 "$work/ddp-run.log"; fail "installed ddp-run failed with the example plugin"; }
[ -f "$work/run/out/metrics.jsonl" ] || fail "no $work/run/out/metrics.jsonl"
grep -q "\"$prefix/share/ddp/data/wine.csv\"" "$work/run/out/config.json" ||
  { cat "$work/run/out/config.json"; fail "the installed ddp-run did not read the installed data/wine.csv"; }
echo "ok: installed ddp-run trained model.linear from the plugin on $prefix/share/ddp/data/wine.csv"

step "add_subdirectory($repo): configure only"
mkdir -p "$work/subdir-src"
cat > "$work/subdir-src/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(ddp_subdir_consumer LANGUAGES CXX)
add_subdirectory("$repo" ddp)
add_executable(app "$repo/tests/install/consumer/main.cpp")
target_link_libraries(app PRIVATE ddp::ddp)
CMAKE
logged subdir-configure cmake -S "$work/subdir-src" -B "$work/subdir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
config="$work/subdir/ddp/generated/ddp/config.hpp"
[ -f "$config" ] || fail "no $config"
grep -q "DDP_SOURCE_DIR \"$repo\"" "$config" || fail "$config: DDP_SOURCE_DIR is not $repo"
grep -q "DDP_BINARY_DIR \"$work/subdir/ddp\"" "$config" || fail "$config: DDP_BINARY_DIR is not $work/subdir/ddp"
echo "ok: add_subdirectory configures; ddp/config.hpp names $repo"

step "scripts/package.sh: the .deb, unpacked into a scratch root"
# Its own build tree (for /usr, CPU backends only): what a user packages.
# scripts/test.sh packed it moments ago: that .deb is used as it is when
# its build has nothing to do and no file of the source tree is newer (a
# repack is 15-25 s of configure and compression); otherwise packed anew.
deb=
if [ -n "${DDP_PACKAGE_BUILD_DIR:-}" ]; then
  made=$(find "$DDP_PACKAGE_BUILD_DIR" -maxdepth 1 -name 'ddp_*.deb' 2>/dev/null | head -1)
  if [ -n "$made" ] && command -v ninja > /dev/null &&
     ninja -C "$DDP_PACKAGE_BUILD_DIR" -n 2>/dev/null | grep -q "^ninja: no work to do" &&
     [ -z "$(cd "$repo" && git ls-files -z 2>/dev/null | xargs -0 -r find 2>/dev/null -maxdepth 0 -newer "$made" | head -1)" ] &&
     [ -n "$(cd "$repo" && git ls-files 2>/dev/null | head -1)" ]; then
    deb=$made
    echo "ok: $deb is up to date with its build and the source tree (packed by scripts/package.sh before)"
  fi
fi
if [ -z "$deb" ]; then
  logged package "$repo/scripts/package.sh" "${DDP_PACKAGE_BUILD_DIR:-$work/deb-build}"
  deb=$(tail -1 "$work/package.log")
fi
[ -f "$deb" ] || fail "scripts/package.sh did not end with the path of a .deb (log: $work/package.log)"
[ "$(dpkg-deb -f "$deb" Package)" = ddp ] || fail "$deb: Package is not ddp"
depends=$(dpkg-deb -f "$deb" Depends)
for d in "libtorch-dev (>= 1" "libtorch-dev (<< " nlohmann-json3-dev libfmt-dev libgloo-dev libtorch1; do
  grep -qF "$d" <<< "$depends" || fail "$deb: Depends ($depends) lacks $d"
done
grep -q 'cuda\|nccl' <<< "$depends" && fail "$deb: Depends ($depends) names CUDA or NCCL"
# What it depends on is here, in a version that satisfies it, as
# `apt-get install ./ddp_*.deb` would ensure.
IFS=',' read -ra clauses <<< "$depends"
for clause in "${clauses[@]}"; do
  clause=$(sed 's/^ *//; s/ *$//' <<< "$clause")
  name=${clause%% *}
  name=${name%%:*}
  have=$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null | sed -n 's/^install ok installed //p')
  [ -n "$have" ] || fail "$deb depends on $name, which is not installed here"
  if [[ "$clause" =~ \((<<|<=|=|>=|>>)\ ([^\)]*)\) ]]; then
    op=${BASH_REMATCH[1]} want=${BASH_REMATCH[2]}
    case "$op" in '<<') op=lt ;; '<=') op=le ;; '=') op=eq ;; '>=') op=ge ;; '>>') op=gt ;; esac
    dpkg --compare-versions "$have" "$op" "$want" || fail "$deb wants $clause; $name $have is installed"
  fi
done
root="$work/debroot"
dpkg -x "$deb" "$root"
for f in usr/bin/ddp-run usr/bin/ddp-plot usr/include/ddp/ddp.hpp usr/share/ddp/data/wine.csv; do
  [ -e "$root/$f" ] || fail "$deb does not hold /$f"
done
# ddp_torch (issue 43), where this build made it: where /usr/bin/python3
# finds it, and it imports from there and registers the backend "ddp".
if [ -f "$build/python/ddp_torch/__init__.py" ]; then
  pkg="$root/usr/lib/python3/dist-packages"
  ls "$pkg"/ddp_torch/_C*.so > /dev/null 2>&1 || fail "$deb does not hold /usr/lib/python3/dist-packages/ddp_torch/_C*.so"
  PYTHONPATH="$pkg" /usr/bin/python3 -c "import ddp_torch, torch.distributed as d; assert 'DDP' in d.Backend._plugins" ||
    fail "ddp_torch from $deb does not import"
  echo "ok: $(basename "$deb") holds ddp_torch, which imports and registers the backend \"ddp\""
fi
grep -q 'DDP_INSTALL_DATA_DIR "/usr/share/ddp"' "$root/usr/include/ddp/install_dirs.hpp" ||
  fail "$deb: its libraries look for data elsewhere than /usr/share/ddp ($(grep DDP_INSTALL_DATA_DIR "$root/usr/include/ddp/install_dirs.hpp"))"
readelf -d "$root/usr/bin/ddp-run" | grep -qi 'cudart\|nccl' && fail "$deb: ddp-run needs CUDA or NCCL libraries"
debconfig=$(find "$root/usr" -path '*/cmake/ddp/ddpConfig.cmake' | head -1)
[ -n "$debconfig" ] || fail "$deb holds no ddpConfig.cmake"
echo "ok: $(basename "$deb"): Depends: $depends"
logged deb-consumer-configure cmake -S "$repo/tests/install/consumer" -B "$work/deb-consumer" "${generator[@]}" \
  "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$root/usr"
grep -q "^ddp_DIR:PATH=$root/usr/" "$work/deb-consumer/CMakeCache.txt" ||
  fail "the consumer did not find ddp under $root/usr ($(grep '^ddp_DIR' "$work/deb-consumer/CMakeCache.txt"))"
logged deb-consumer-build cmake --build "$work/deb-consumer"
out=$("$work/deb-consumer/ddp_consumer" 2>&1) || { echo "$out"; fail "ddp_consumer (built against the .deb) failed"; }
grep -q "^all checks passed" <<< "$out" || fail "ddp_consumer (built against the .deb) did not pass its checks"
mkdir -p "$work/deb-run"
(cd "$work/deb-run" && "$root/usr/bin/ddp-run" "$root/usr/share/ddp/experiments/wine_baseline.json" \
  --set training.epochs=2 --out out > "$work/deb-ddp-run.log" 2>&1) ||
  { tail -20 "$work/deb-ddp-run.log"; fail "ddp-run from the .deb failed"; }
grep -q "\"$root/usr/share/ddp/data/wine.csv\"" "$work/deb-run/out/config.json" ||
  { cat "$work/deb-run/out/config.json"; fail "ddp-run from the .deb did not read its own data/wine.csv"; }
echo "ok: the consumer builds against the .deb's files and passes; its ddp-run trains on its wine.csv"
echo "PASSED"
