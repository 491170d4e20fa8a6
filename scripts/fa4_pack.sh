#!/usr/bin/env bash
# FlashAttention-4 for the GPU session (issue 50), packed to travel with the device call: the attention
# probe's "flash-attn-4" candidate (backends/torch_cuda/attention_choice.py) runs where flash_attn.cute
# imports, and the bare H200 image has no FlashAttention and no network. Its CuTe DSL compiler is large:
# the packages' wheels take 87 MB, past the device tool's 64 MiB carry; unpacked and xz-compressed
# they take ~56 MiB, beside .whl/'s ~2 MB.
#
#   bash scripts/fa4_pack.sh            # -> .fa4/site-cp312.tar.xz (gitignored), ~3-4 min of xz on 2 cores
#   PYVER=3.11 OUT=/tmp/fa4 bash scripts/fa4_pack.sh   # this machine's Python, for scripts/fa4_compile.py
#
# Pinned: flash-attn-4 4.0.0b10 with nvidia-cutlass-dsl 4.4.2, whose base wheel holds the DSL's Python
# sources and its CUDA 12.9 compiler in one (the 4.8.1 base wheel the index here serves lacks
# cutlass.cute's sources), and the versions their requirements ask; cuda-python 12.9 (any >= 12.8 will
# do: the session keeps the image's own where it has one). scripts/gpu_session.sh unpacks the archive
# when it is there and the image's Python is CPython $PYVER (3.12 on the 2026-11 H200 image).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
OUT=${OUT:-.fa4}
PIP=${PIP:-.venv/bin/pip}
PACKAGES=(
    flash-attn-4==4.0.0b10 nvidia-cutlass-dsl==4.4.2 nvidia-cutlass-dsl-libs-base==4.4.2 quack-kernels==0.3.3
    apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 einops==0.8.2
    cuda-python==12.9.10 cuda-bindings==12.9.10 cuda-pathfinder==1.9.1
)
WORK=$(mktemp -d /tmp/fa4-pack.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$PIP" download --quiet --no-deps --pre --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version "$PYVER" -d "$WORK/wheels" "${PACKAGES[@]}"
mkdir -p "$WORK/site" "$OUT"
for wheel in "$WORK"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$WORK/site"; done
name=site-cp${PYVER/./}.tar.xz
tar -cf - -C "$WORK/site" . | xz -9e -T0 > "$WORK/$name"
mv "$WORK/$name" "$OUT/$name"  # whole or not at all
ls -l "$OUT/$name"
