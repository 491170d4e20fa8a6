"""MLX backend: Llama/Mistral/Qwen2/Qwen3/Gemma 3 on Apple silicon (Metal), or MLX's CPU backend elsewhere, with
H2O two-phase prefill and speculative prefill stages.

    model, tokenizer = load(path)      # GGUF file, Hugging Face or mlx-lm directory
    logits = model([1, 2, 3])          # mx.array [1, T, vocab] float32

The model runtime:
  loader.py       load(): device and dtype resolution, checkpoint -> model + tokenizer; the
                  package's BACKEND (core/backend.py) calls it
  weights.py      GGUF (quantized layers kept), safetensors and mlx-lm directories -> arrays
  model.py        the Llama/Mistral/Qwen2/Qwen3/Gemma 3 modules; rope.py (explicit positions); cache.py
  ops.py          the ops protocol of core/ops.py on mx.arrays (the methods and the generation
                  driver are written once, in core/methods/ and core/driver.py)

The sparse prefill stages:
  kernels/intra.py    phase-1 intra attention of all chunks at once + key column sums
  kernels/inter.py    phase-2 attention to the gathered memory set + slot column sums
  kernels/scoring.py  speculator scoring: softmax of each scoring query over the prompt keys
  kernels/state.py    the (m, l, o) online-softmax state and its exact merge
  method_ops.py       memory sets, score accumulation, gathers, pooling, reductions (plain MLX ops)
  conformance.py      the adapter `specfill conformance --backend mlx` drives

Each kernels/ module holds a Metal kernel (built once through `mx.fast.metal_kernel`), an
MLX-ops twin with the same semantics, and a dispatcher that takes the kernel where Metal exists
(use_kernel=None), or as forced. Importing this package does not import mlx, so torch-only
installs can still import `specfill.backends`; `load` says what is missing.
"""

from __future__ import annotations

from specfill.core.backend import Backend

__all__ = ["load"]

# What the API, the CLI and the server ask of this backend (core/backend.py); loader.py implements it.
BACKEND = Backend(
    name="mlx", extra="mlx", loader_module="specfill.backends.mlx.loader", distributed=True, threaded_writes=False
)
load = BACKEND.load
