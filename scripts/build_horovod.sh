#!/usr/bin/env bash
# Build and install Horovod 0.28.1 with PyTorch + Gloo support against torch 2.13.
#
# Why a script: `pip install horovod==0.28.1` fails against torch 2.13. Horovod's
# CMake files ask for C++14 while torch's headers need C++17, and pip's build
# isolation hides the installed torch from the build. So we fetch the sdist
# with pip, switch CMAKE_CXX_STANDARD 14 -> 17, and build without isolation.
#
# The wheel is cached outside the repository, keyed by the Horovod version,
# torch version and Python tag, so CI builds it once (~150 s on 2 cores) and
# later runs only install it. Idempotent: exits early when horovod already
# imports with torch support.
#
# Environment:
#   PYTHON              interpreter to build for (default: python3)
#   DET_LAUNCH_CACHE    cache root (default: ~/.cache/determined_launch)
#   HOROVOD_VERSION     default 0.28.1
#   MAKEFLAGS / HOROVOD_BUILD_JOBS  parallelism (default: nproc)
#   HOROVOD_GPU_OPERATIONS  e.g. NCCL for a GPU build (part of the cache key)
#   HOROVOD_SKIP_IMPORT_CHECK=1  skip the final import check (GPU builds on
#                       a machine without a GPU driver cannot load Horovod)
set -euo pipefail

PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE=${DET_LAUNCH_CACHE:-$HOME/.cache/determined_launch}

if "$PYTHON" - <<'PY' 2>/dev/null; then
import horovod.torch as hvd  # noqa: F401  (fails when torch support is missing)
from horovod.common.util import gloo_built
raise SystemExit(0 if gloo_built() else 1)
PY
    echo "build_horovod: horovod with torch+gloo already installed; nothing to do"
    exit 0
fi

TORCH_VERSION=$("$PYTHON" -c 'import torch; print(torch.__version__.replace("+", "_"))')
PY_TAG=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
VARIANT=${HOROVOD_GPU_OPERATIONS:+-gpu-$HOROVOD_GPU_OPERATIONS}
WHEEL_DIR="$CACHE/wheels/horovod-${HOROVOD_VERSION}-torch-${TORCH_VERSION}-${PY_TAG}${VARIANT}"
mkdir -p "$WHEEL_DIR"

wheel=$(ls "$WHEEL_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
    # A C++17 compiler, make and cmake; on Debian as root, install them.
    missing=()
    command -v c++ >/dev/null || missing+=(g++)
    command -v make >/dev/null || missing+=(make)
    command -v cmake >/dev/null || missing+=(cmake)
    if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "build_horovod: apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    command -v c++ >/dev/null && command -v make >/dev/null || {
        echo "build_horovod: needs a C++ compiler (g++) and make" >&2
        exit 1
    }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "build_horovod: downloading horovod==$HOROVOD_VERSION sdist"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
        --dest "$work" "horovod==$HOROVOD_VERSION"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
        grep -q 'CMAKE_CXX_STANDARD 14' "$f" || {
            echo "build_horovod: $f: no 'CMAKE_CXX_STANDARD 14' to patch" >&2
            exit 1
        }
        sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$f"
    done
    # Build-time needs of the sdist's setup.py; torch must already be installed
    # (it is imported by the build, which is why build isolation is off).
    "$PYTHON" -m pip install --quiet wheel packaging cloudpickle psutil pyyaml
    command -v cmake >/dev/null || "$PYTHON" -m pip install --quiet "cmake>=3.13,<4"
    echo "build_horovod: building wheel (several minutes)"
    start=$(date +%s)
    (
        cd "$src"
        export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
            HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
        export MAKEFLAGS=${MAKEFLAGS:--j${HOROVOD_BUILD_JOBS:-$(nproc)}}
        "$PYTHON" -m pip wheel --no-deps --no-build-isolation --wheel-dir "$work/dist" .
    )
    echo "build_horovod: wheel built in $(( $(date +%s) - start )) s"
    cp "$work"/dist/horovod-"$HOROVOD_VERSION"-*.whl "$WHEEL_DIR"/
    wheel=$(ls "$WHEEL_DIR"/horovod-"$HOROVOD_VERSION"-*.whl | head -n1)
fi

echo "build_horovod: installing $wheel"
# --no-deps for torch: horovod's own deps (cloudpickle, psutil, pyyaml, packaging) only.
"$PYTHON" -m pip install --quiet --no-deps "$wheel"
"$PYTHON" -m pip install --quiet cloudpickle psutil pyyaml packaging
if [ "${HOROVOD_SKIP_IMPORT_CHECK:-0}" = 1 ]; then
    echo "build_horovod: installed (import check skipped)"
    exit 0
fi
"$PYTHON" - <<'PY'
import horovod
import horovod.torch  # noqa: F401
from horovod.common.util import gloo_built

if not gloo_built():
    raise SystemExit("build_horovod: Horovod was built without gloo")
print("build_horovod: ok", horovod.__version__)
PY
