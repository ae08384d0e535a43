#!/usr/bin/env bash
# Installs the header-only cudnn-frontend C++ API that the cudnn backend
# compiles against (src/backends/cudnn; cmake/AttendCudnn.cmake finds it here):
# the PyPI wheel nvidia-cudnn-frontend carries the headers under include/.
# --no-deps: only the headers are used (its Python dependencies are large and
# unneeded); --target: no virtual environment, nothing system-wide. Pinned: the
# backend's rule table cites this release's support surface. Once; prints the
# include directory.
set -euo pipefail
version="${ATTEND_CUDNN_FRONTEND_VERSION:-1.32.0}"
dir="${ATTEND_CUDNN_FRONTEND_DIR:-$HOME/.cache/attend/cudnn-frontend}"
stamp="$dir/nvidia_cudnn_frontend-$version.dist-info"
if [[ ! -f "$dir/include/cudnn_frontend.h" || ! -d "$stamp" ]]; then
  echo "cudnn-frontend.sh: pip install nvidia-cudnn-frontend==$version (headers) into $dir" >&2
  rm -rf "$dir"
  "${ATTEND_PYTHON:-python3}" -m pip install -q --disable-pip-version-check --no-deps --target "$dir" \
    "nvidia-cudnn-frontend==$version"
fi
echo "$dir/include"
