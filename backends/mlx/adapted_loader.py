"""Loading mlx-lm models into specfill: an mlx-lm directory of an architecture specfill has no model
file for, or a (model, tokenizer) pair from `mlx_lm.load`, becomes a CausalLM whose layers' attention
the adapter runs (adapted.py) and whose everything else is mlx-lm's own code.

Routing (loader.load, which imports this module only for such a model): a directory whose
config.json names a model_type of specfill's own families (llama, mistral, qwen2, qwen3,
gemma3_text) loads into specfill's model as before; any other model_type that mlx-lm ships a model
file for loads through mlx-lm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specfill.backends.tokenizer_source import tokenizer_directory
from specfill.core.driver import CausalLM
from specfill.core.errors import ModelLoadError, quote
from specfill.core.io.tokenizer import load_tokenizer

from .adapted import AdaptedOps, adapt


def _tokenizer_source(tokenizer: Any) -> Path:
    """The directory an mlx-lm TokenizerWrapper (or the Hugging Face tokenizer inside it) was read
    from: specfill reads its own tokenizer from there."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    inner = tokenizer._tokenizer if isinstance(tokenizer, TokenizerWrapper) else tokenizer
    return tokenizer_directory(inner, "pass mlx_lm.load's pair or load the model from its directory")


def load_adapted(
    source: str | Path | tuple[nn.Module, Any],
    dtype: mx.Dtype | None,
    device: mx.Device,
    prefill_step_size: int,
    *,
    architecture: str | None = None,
) -> tuple[CausalLM, Any]:
    """(CausalLM, specfill Tokenizer) from an mlx-lm directory or an (mlx-lm model, tokenizer) pair.

    dtype None: float32 on CPU (MLX's CPU half paths are slow), the model's own on the GPU; a
    dtype casts every floating parameter (quantized weights stay quantized). architecture: the
    directory's model_type that routed it here (loader.py), for errors."""
    if isinstance(source, tuple):
        lm, directory = source[0], _tokenizer_source(source[1])
    else:
        directory = Path(source)
        from mlx_lm.utils import load_model  # mlx-lm's import pulls in transformers: only here

        try:
            lm, _ = load_model(directory)
        except Exception as err:  # mlx-lm raises ValueError, KeyError, FileNotFoundError, ...
            raise ModelLoadError(
                f"{quote(directory)}: unsupported architecture {architecture!r} for specfill's own "
                f"models, and mlx-lm could not load it: {str(err).splitlines()[0][:200]}"
            ) from None
    if not isinstance(lm, nn.Module):
        raise ModelLoadError(f"expected an mlx-lm model (mlx.nn.Module), got {type(lm).__name__}")
    wanted = dtype if dtype is not None else (mx.float32 if device.type == mx.DeviceType.cpu else None)
    with mx.stream(device):
        if wanted is not None:
            lm.set_dtype(wanted)
        mx.eval(lm.parameters())
        model = adapt(lm)
    quantized = any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in lm.named_modules())
    ops = AdaptedOps(device, quantized=quantized)
    return CausalLM(model, ops, prefill_step_size=prefill_step_size), load_tokenizer(directory)
