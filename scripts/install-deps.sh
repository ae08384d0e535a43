#!/usr/bin/env bash
# Installs the Debian packages attend needs:
#   install-deps.sh          everything: build, test and benchmark (the test command)
#   install-deps.sh core     the library and the CLI only (the main job)
# Idempotent: does nothing when everything is already installed.
# (scripts/test-hardening.sh adds clang, compiler-rt, libomp and llvm for its
# sanitizer and fuzz builds; the default path does not need them.)
set -euo pipefail
set_name="${1:-all}"

# The library and `attend run/select/tune`: a compiler, CMake, and two
# header-only libraries. OpenMP comes with g++ (libgomp).
core=(
  cmake g++ make
  libcli11-dev                   # command-line parsing
  nlohmann-json3-dev             # the autotune cache file (JSON)
)
extras=(
  pkg-config
  libgtest-dev libgmock-dev      # GoogleTest / GoogleMock
  libbenchmark-dev               # Google Benchmark
  libopenblas-dev                # sgemm baseline for benchmarks
  libdnnl-dev                    # oneDNN: the bf16 GEMM baseline for benchmarks
  libopenmpi-dev openmpi-bin     # context parallelism (src/parallel/ MPI engine, its tests)
  # The Python package (python/): its extension builds with pybind11 for
  # /usr/bin/python3 (no libtorch); the tests use Debian's torch 1.13 there, and
  # python3-venv for the PyTorch 2.x and pip-install environments.
  python3-dev python3-venv python3-torch pybind11-dev python3-pytest python3-numpy
)
case "$set_name" in
  core) packages=("${core[@]}") ;;
  all) packages=("${core[@]}" "${extras[@]}") ;;
  *) echo "install-deps.sh: unknown set '$set_name' (expected core or all)" >&2; exit 2 ;;
esac

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
