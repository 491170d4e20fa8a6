#!/usr/bin/env bash
# FlashAttention-4 for the GPU session (issue 50), packed to travel with the device calls: the attention
# probe's "flash-attn-4" candidate (backends/torch_cuda/attention_choice.py) runs where flash_attn.cute
# imports, and the H200 image has no FlashAttention and no network. Its CuTe DSL compiler is large: the
# packages take ~53 MiB unpacked and xz-compressed, and a device call carries at most 64 MiB together
# with the working tree (~47 MiB of it tracked files), so the archive travels in parts of PART_MIB (what
# the working tree leaves, unless given), one a call (the device keeps a call's carried files for the next while it stays warm),
# or all in one call with results/ held out of the tree (scripts/device_tree.py), joined and
# checked against its sha256 by scripts/gpu_session.sh, which unpacks it for the image's CPython.
#
#   bash scripts/fa4_pack.sh     # -> .fa4/site-cp312.tar.xz.partNN + .sha256 (gitignored); ~4 min of xz
#   PYVER=3.11 OUT=/tmp/fa4 WITH_CUDA_PYTHON=1 PART_MIB=0 bash scripts/fa4_pack.sh   # whole, for this
#       machine's Python (scripts/fa4_compile.py; here cuda-python is not installed)
#
# Pinned: flash-attn-4 4.0.0b10 with nvidia-cutlass-dsl 4.4.2, whose base wheel holds the DSL's Python
# sources and its CUDA 12.9 compiler in one (the 4.8.1 base wheel the index here serves lacks
# cutlass.cute's sources), and the versions their requirements ask. The image has cuda-python's
# packages (cuda-bindings, cuda-pathfinder; the DSL asks cuda-python >= 12.8) and einops: left out
# unless WITH_CUDA_PYTHON=1.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
OUT=${OUT:-.fa4}
PIP=${PIP:-.venv/bin/pip}
# a part and the working tree that travels with it (tracked and untracked-not-ignored files) within the
# device tool's 64 MiB a call, less 2 MiB for .whl/ and growth: ~15 MiB beside today's ~47 MiB tree
tree=$(python3 scripts/device_tree.py bytes)
PART_MIB=${PART_MIB:-$(( (64 * 1048576 - tree) / 1048576 - 2 ))}
((PART_MIB >= 0)) || { echo "fa4_pack: the working tree ($tree bytes) leaves no room a call" >&2; exit 1; }
PACKAGES=(
    flash-attn-4==4.0.0b10 nvidia-cutlass-dsl==4.4.2 nvidia-cutlass-dsl-libs-base==4.4.2 quack-kernels==0.3.3
    apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
)
if [[ "${WITH_CUDA_PYTHON:-0}" == 1 ]]; then
    PACKAGES+=(einops==0.8.2 cuda-python==12.9.10 cuda-bindings==12.9.10 cuda-pathfinder==1.9.1)
fi
WORK=$(mktemp -d /tmp/fa4-pack.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$PIP" download --quiet --no-deps --pre --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version "$PYVER" -d "$WORK/wheels" "${PACKAGES[@]}"
mkdir -p "$WORK/site" "$WORK/out" "$OUT"
for wheel in "$WORK"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$WORK/site"; done
name=site-cp${PYVER/./}.tar.xz
tar -cf - -C "$WORK/site" . | xz -9e -T0 > "$WORK/out/$name"
if ((PART_MIB > 0)); then
    (cd "$WORK/out" && sha256sum "$name" > "$name.sha256" && split -b "${PART_MIB}M" -d -a 2 "$name" "$name.part" && rm "$name")
fi
rm -f "$OUT/$name" "$OUT/$name".part* "$OUT/$name.sha256"  # no part of an older pack left beside the new one
mv "$WORK"/out/* "$OUT"/
ls -l "$OUT"/"$name"*
