#!/usr/bin/env bash
# Coverage-guided fuzzing of every file parser (docs/testing.md, "Fuzzing"): installs clang 14
# and its libFuzzer runtime when missing (Debian 12, as root), builds build-fuzz/ with
# MESHTRAIN_FUZZ=ON (clang, libFuzzer, ASan + UBSan), then runs each target of tests/fuzz for
# --seconds N (default 600: the documented 10-minute run; CI passes a short time) on its seed
# corpus and regression inputs. New corpus entries go to a scratch folder, not into the
# repository. Exits non-zero when any target finds a crash, a sanitizer report, an uncaught
# exception, a hang or an allocation past the limit, printing the input that triggered it.
#   scripts/fuzz.sh [--seconds N] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=600
targets=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    -h | --help) sed -n '2,9p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done

# clang-14 and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes); the parsers' libraries
# come from scripts/setup.sh's list, installed here too so this script runs on its own.
packages=(clang-14 libclang-rt-14-dev cmake ninja-build pkg-config libfmt-dev
  nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev libpcre2-dev libsentencepiece-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
start=$SECONDS
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMESHTRAIN_FUZZ=ON "${launcher[@]}" >/dev/null
cmake --build build-fuzz --parallel "$(nproc)"
echo "fuzz: build took $((SECONDS - start)) s"
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cd tests/fuzz && ls -1 ./*_fuzz.cpp | sed 's|^\./||; s|\.cpp$||')
fi

# Findings (crash-*, leak-*, timeout-*, oom-*) land in out/fuzz/<target>/ (ignored by git);
# the grown corpus in out/fuzz/<target>/corpus, which later runs start from as well.
# -rss_limit_mb / -malloc_limit_mb 2048: an input that makes a parser allocate more is a
# finding (unbounded allocation), as is one that takes over -timeout seconds.
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0"
export UBSAN_OPTIONS ASAN_OPTIONS
failed=()
for target in "${targets[@]}"; do
  out="$root/out/fuzz/$target"
  mkdir -p "$out/corpus"
  regressions="$root/tests/fuzz/regressions/$target"
  dirs=("$out/corpus" "$root/tests/fuzz/corpus/$target")
  [[ -d $regressions ]] && dirs+=("$regressions")
  # Each regression input alone first: a run on given files ends with LeakSanitizer's check,
  # which fuzzing from a corpus applies only to new inputs.
  if [[ -d $regressions ]] && ! build-fuzz/tests/fuzz/"$target" "$regressions"/* \
    >"$out/regressions.txt" 2>&1; then
    failed+=("$target")
    tail -n 60 "$out/regressions.txt"
    echo "fuzz: $target FAILS A REGRESSION INPUT of $regressions (see above)"
    continue
  fi
  echo "fuzz: $target for $seconds s"
  if ! build-fuzz/tests/fuzz/"$target" -max_total_time="$seconds" -rss_limit_mb=2048 \
    -malloc_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$out/" "${dirs[@]}" >"$out/log.txt" 2>&1; then
    failed+=("$target")
    tail -n 60 "$out/log.txt"
    echo "fuzz: $target FOUND A PROBLEM; input: $(ls -t "$out"/{crash,leak,timeout,oom,slow-unit}-* 2>/dev/null | head -n 1)"
  fi
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|cov: ' \
    "$out/log.txt" | tail -n 4 | sed "s|^|fuzz: $target: |" || true
done
echo "fuzz: ${#targets[@]} targets in $((SECONDS - start)) s"
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]} (reproduce: build-fuzz/tests/fuzz/<target> <input>)"
  exit 1
fi
