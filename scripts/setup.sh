#!/usr/bin/env bash
# Installs everything meshtrain's build, main job, tests and benchmarks need (Debian 12, as root).
# Idempotent: packages already present are skipped by apt-get; safe to run on every invocation.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ninja-build
  libdnnl-dev                      # GEMM (oneDNN)
  libopenmpi-dev openmpi-bin       # ProcessGroup backend and mpirun
  librandom123-dev                        # Philox counter-based RNG (header-only)
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libfmt-dev libspdlog-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libsentencepiece-dev     # tokenizers: GPT-2's pre-tokenising regex, SentencePiece
  protobuf-compiler libprotobuf-dev   # TensorBoard event records (train/tensorboard_event.proto)
  libboost-dev                        # Boost.CRC: the records' CRC32C (header-only)
  python3 python3-torch python3-numpy   # PyTorch reference tests and bench (/usr/bin/python3)
  python3-pip                           # installs PYDEPS below
  python3-sentencepiece                 # export tokenizer test: SentencePiece models and ids
  python3-matplotlib                    # bench/plot_scaling.py (bench/scaling_bench.sh's PNG)
  slurmctld slurmd slurm-client munge   # the one-node Slurm of tests/e2e/slurm_job.sh
  iproute2 util-linux                   # the multi-host test bed (tests/multihost: ip netns, unshare)
  python3-sentencepiece                 # tokenizer reference test (tests/reference/tokenizer_reference.py)
)

# Python packages the reference tests import beyond Debian's: Hugging Face transformers'
# MixtralSparseMoeBlock (tests/reference/moe_reference.py). transformers 4.36.2 is a version
# that runs on Debian's torch 1.13. The list is its whole dependency closure, pinned, installed
# with --no-deps into the repository's ignored .pydeps/ (the CTest test sets PYTHONPATH), so pip
# never brings its own numpy: pip's numpy breaks Debian's torch; Debian's numpy is used.
# tiktoken (its deps regex and requests are above) is the GPT-2 reference of
# tests/reference/tokenizer_reference.py, with tokenizers (Hugging Face's byte-level BPE).
# tensorboard + protobuf + absl-py: the closure of TensorBoard's own EventAccumulator (the
# TensorBoard round-trip test, tests/e2e/tensorboard.sh); the server's grpcio, werkzeug,
# markdown, pillow and tensorboard-data-server are not imported by it.
PYDEPS=(
  tensorboard==2.20.0 protobuf==6.33.5 absl-py==2.1.0
  transformers==4.36.2 tokenizers==0.15.2 safetensors==0.8.0 huggingface-hub==0.36.2
  hf-xet==1.8.0 filelock==4.3.1 fsspec==2026.9.0 packaging==26.4 pyyaml==6.0.4
  regex==2026.11.19 requests==2.34.2 certifi==2026.10.19.post1 charset-normalizer==3.5.3
  idna==3.20 urllib3==2.8.0 tqdm==4.70.1 typing-extensions==4.16.0
  tiktoken==0.14.0
)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

# Idempotent: skipped when .pydeps holds exactly these pins (its .pins stamp).
install_pydeps() {
  local dir="$ROOT/.pydeps"
  if [[ -f "$dir/.pins" && "$(cat "$dir/.pins")" == "${PYDEPS[*]}" ]]; then
    echo "setup: .pydeps up to date (${#PYDEPS[@]} pinned packages)"
    return
  fi
  echo "setup: installing ${PYDEPS[*]} into $dir"
  rm -rf "$dir"
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-warn-script-location --target "$dir" "${PYDEPS[@]}"
  echo "${PYDEPS[*]}" >"$dir/.pins"
}

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  install_pydeps
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# munge's and slurmd's install scripts start their services and fail the install when that
# fails (no slurm.conf, no systemd in a container). The tests start their own daemons, so
# services are kept from starting while installing (policy-rc.d's 101 = "not allowed"), unless
# the machine already has such a policy.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  own_policy=1
fi
status=0
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" || status=$?
if ((own_policy)); then $SUDO rm -f "$policy"; fi
((status == 0)) || exit "$status"
install_pydeps
