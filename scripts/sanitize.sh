#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run: configures build-asan/ with
# MESHTRAIN_SANITIZE=ON, builds meshtrain, the unit tests and the dist tests (not the
# benchmarks), and runs the unit tests and the one-host dist tests at np 2 through CTest. Any
# sanitizer report (memory error, leak, undefined behaviour) makes its test fail and the script
# exit non-zero. Flags, options, suppressions and the tests run: docs/testing.md, "Sanitizers".
# Extra arguments go to every ctest call (e.g. -R Allocator).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_SANITIZE=ON \
  "${launcher[@]}" >/dev/null
cmake --build build-asan --parallel "$(nproc)" --target meshtrain unit_tests dist_tests

# Every report is fatal (ASan halts by default; UB is built -fno-sanitize-recover, and
# halt_on_error says so again). Each option's reason: docs/testing.md, "Sanitizers".
asan="halt_on_error=1:detect_leaks=1:strict_init_order=1:check_initialization_order=1"
# Not detect_stack_use_after_return: under it GCC 12's 64-byte-aligned stack temporaries
# (AVX-512 targets) sit 32-byte aligned in ASan's fake frames and their vmovdqa64 faults
# (docs/testing.md, "Sanitizers").
asan+=":strict_string_checks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0"

cd build-asan
start=$SECONDS
# The unit group (with its fixture prepare_data: `meshtrain prepare` runs sanitized too).
ASAN_OPTIONS="$asan" ctest --output-on-failure --timeout 900 -j 2 -L unit "$@"
# One-host dist tests under mpirun. Open MPI's libraries lack frame pointers, so only the slow
# unwinder gives leak stacks that reach them (and tests/sanitize/lsan.supp); it costs up to
# 15× on malloc-heavy code, so the unit group keeps the fast one.
ASAN_OPTIONS="$asan:fast_unwind_on_malloc=0" \
  ctest --output-on-failure --timeout 1800 -j 1 -R '^dist\.np2$' "$@"
echo "sanitize: unit + dist.np2 under ASan + UBSan passed in $((SECONDS - start)) s"
