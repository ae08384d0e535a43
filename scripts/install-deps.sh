#!/usr/bin/env bash
# Installs the Debian packages attend needs to build, test and benchmark.
# Idempotent: does nothing when everything is already installed.
# (scripts/test-hardening.sh adds clang, compiler-rt, libomp and llvm for its
# sanitizer and fuzz builds; the default path does not need them.)
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libgtest-dev libgmock-dev      # GoogleTest / GoogleMock
  libbenchmark-dev               # Google Benchmark
  libopenblas-dev                # sgemm baseline for benchmarks
  libcli11-dev                   # command-line parsing
  libopenmpi-dev openmpi-bin     # context parallelism (src/parallel/ MPI engine, its tests)
  nlohmann-json3-dev             # the autotune cache file (JSON)
  # The Python package (python/): its extension builds with pybind11 for
  # /usr/bin/python3 (no libtorch); the tests use Debian's torch 1.13 there, and
  # python3-venv for the PyTorch 2.x and pip-install environments.
  python3-dev python3-venv python3-torch pybind11-dev python3-pytest python3-numpy
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
