# shellcheck shell=bash
# Makes NVRTC (the CUDA run-time compiler) available without a GPU or a CUDA toolkit, so that
# `kernels/tests/nvrtc_compile.rs` really compiles the CUDA kernels to PTX in CI.
#
# Usage (from .ci/run or an interactive shell, at any working directory):
#
#     source .ci/nvrtc.sh            # or: . .ci/nvrtc.sh
#
# What it does:
#   1. creates the virtual environment `.venv-nvrtc` in the repository root (once; reused later),
#   2. installs the pinned wheel `nvidia-cuda-nvrtc-cu12==12.4.127` into it (skipped when that
#      exact version is already there), which ships `libnvrtc.so.12` (PTX `.version 8.4`,
#      loadable by CUDA 12.4+ drivers),
#   3. makes sure a `libnvrtc.so` name exists next to it (cudarc also tries `libnvrtc.so.12`,
#      the link is a belt-and-braces measure for other loaders),
#   4. prepends that folder to `LD_LIBRARY_PATH` and exports `PUSHPULL_REQUIRE_NVRTC=1`, so the
#      NVRTC test fails instead of skipping if the library still cannot be loaded.
#
# It is meant to be sourced, so it never calls `exit`; on failure it prints why and returns 1
# (a `.ci/run` with `set -e` then stops). Variables it reads: PYTHON (the interpreter used to
# create the venv, default python3), PUSHPULL_NVRTC_VENV (the venv folder, default
# <repo>/.venv-nvrtc). It exports PUSHPULL_NVRTC_LIB_DIR (the folder holding libnvrtc).

_pp_nvrtc_setup() {
    local repo venv py pin libdir lib
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
    venv="${PUSHPULL_NVRTC_VENV:-$repo/.venv-nvrtc}"
    py="${PYTHON:-python3}"
    pin="nvidia-cuda-nvrtc-cu12==12.4.127"

    if [ ! -x "$venv/bin/python" ]; then
        echo "nvrtc.sh: creating $venv" >&2
        "$py" -m venv "$venv" || { echo "nvrtc.sh: cannot create a venv with $py" >&2; return 1; }
    fi
    local installed
    installed="$("$venv/bin/python" -m pip show nvidia-cuda-nvrtc-cu12 2>/dev/null || true)"
    if [[ $'\n'"$installed"$'\n' != *$'\nVersion: 12.4.127\n'* ]]; then
        echo "nvrtc.sh: installing $pin" >&2
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$pin" \
            || { echo "nvrtc.sh: pip install $pin failed" >&2; return 1; }
    fi

    # The wheel puts the library under site-packages/nvidia/cuda_nvrtc/lib; find it rather than
    # guessing the python version in the path.
    local found
    found="$(find "$venv" -name 'libnvrtc.so.*' ! -name '*builtins*' \( -type f -o -type l \) 2>/dev/null || true)"
    lib="${found%%$'\n'*}"
    if [ -z "$lib" ]; then
        echo "nvrtc.sh: no libnvrtc.so* found under $venv after installing $pin" >&2
        return 1
    fi
    libdir="$(dirname "$lib")"
    # cudarc's loader tries libnvrtc.so, libnvrtc.so.12, ...; the wheel ships only the versioned
    # name, so add the unversioned one for anything that dlopens "libnvrtc.so".
    if [ ! -e "$libdir/libnvrtc.so" ]; then
        ln -s "$(basename "$lib")" "$libdir/libnvrtc.so" \
            || { echo "nvrtc.sh: cannot create $libdir/libnvrtc.so" >&2; return 1; }
    fi

    case ":${LD_LIBRARY_PATH:-}:" in
        *":$libdir:"*) ;;
        *) export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    esac
    export PUSHPULL_NVRTC_LIB_DIR="$libdir"
    export PUSHPULL_REQUIRE_NVRTC=1
    echo "nvrtc.sh: NVRTC from $libdir: $(cd "$libdir" && echo libnvrtc.so*)" >&2
}

_pp_nvrtc_setup
_pp_nvrtc_rc=$?
unset -f _pp_nvrtc_setup
if [ "$_pp_nvrtc_rc" -ne 0 ]; then
    unset _pp_nvrtc_rc
    return 1 2>/dev/null || false
fi
unset _pp_nvrtc_rc
