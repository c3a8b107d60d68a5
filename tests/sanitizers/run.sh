#!/usr/bin/env bash
# Builds the tests with a sanitizer and runs them, so that memory errors,
# undefined behaviour and data races found once stay found.
#
#   tests/sanitizers/run.sh address [catch2 test spec...]   # ASan + UBSan, build-asan/
#   tests/sanitizers/run.sh thread  [catch2 test spec...]   # TSan, build-tsan/
#
# Without a test spec it runs the unit and multi-process tests: every Catch2
# test of ddp_tests. The ranks that tests start (ddp-run, workers) are built
# with the same sanitizer and inherit its options, so a report in any rank
# fails its test. LibTorch itself is not instrumented; what it reports about
# itself is suppressed in tests/sanitizers/*.supp, with the reason there.
set -euo pipefail
kind="${1:-address}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
case "$kind" in
  address) build="$root/build-asan" ;;
  thread) build="$root/build-tsan" ;;
  *) echo "sanitizers: unknown kind '$kind' (address, thread)" >&2; exit 2 ;;
esac

export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_SANITIZE="$kind" \
    -DDDP_BUILD_BENCHMARKS=OFF ${DDP_CMAKE_ARGS:-} > "$build.configure.log" 2>&1 || {
    cat "$build.configure.log"; echo "sanitizers: configure failed" >&2; exit 1; }
fi
start=$(date +%s)
cmake --build "$build" -j "${DDP_SANITIZE_JOBS:-$(nproc)}" --target ddp_tests ddp-run
echo "sanitizers: $kind build took $(( $(date +%s) - start )) s"

# halt_on_error: the first report fails the process (and so the test).
# allocator_may_return_null: an allocation too big to make fails as it would
# without ASan (std::bad_alloc), which the out-of-memory tests expect.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:allocator_may_return_null=1:abort_on_error=0:exitcode=86:detect_stack_use_after_return=0:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$here/ubsan.supp:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:exitcode=86:second_deadlock_stack=1:suppressions=$here/tsan.supp:${TSAN_OPTIONS:-}"

start=$(date +%s)
cd "$build/tests"
status=0
./ddp_tests "$@" || status=$?
echo "sanitizers: $kind tests took $(( $(date +%s) - start )) s, exit code $status"
exit $status
