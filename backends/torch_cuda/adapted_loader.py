"""Loading transformers models into specfill: a transformers directory (or a repo id in the Hugging
Face cache, resolved to its snapshot directory by core/io/hub.py) of an architecture specfill has
no model file for becomes a CausalLM whose layers' attention the adapter runs (adapted.py) and
whose everything else is transformers' own code.

Routing (torch_cuda.load): a directory whose config.json names a model_type of specfill's own
families (llama, mistral, qwen2, qwen3, gemma3_text) loads into specfill's model as before; any
other model_type that the installed transformers knows loads with AutoModelForCausalLM.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from specfill.core.adapted import foreign_model_type
from specfill.core.driver import CausalLM
from specfill.core.errors import ModelLoadError, quote
from specfill.core.io.tokenizer import Tokenizer, load_tokenizer


def transformers_model_type(path: str | Path) -> str | None:
    """The model_type of a directory that should load through transformers (None: specfill's own
    loader: not a directory, no readable config.json, one of specfill's own families, transformers
    not installed or not knowing the type)."""
    model_type = foreign_model_type(path)
    if model_type is None or importlib.util.find_spec("transformers") is None:
        return None
    from transformers import CONFIG_MAPPING

    return model_type if model_type in CONFIG_MAPPING else None


def load_adapted(path: str | Path, dtype: torch.dtype, device: torch.device, prefill_step_size: int,
                 use_kernels: bool | None = None) -> tuple[CausalLM, Tokenizer]:
    """(CausalLM, specfill Tokenizer) from a transformers directory: AutoModelForCausalLM reads
    it in `dtype` (offline: no download here), moved to `device`, then adapted."""
    from transformers import AutoModelForCausalLM

    from .adapted import AdaptedOps, adapt  # here: `specfill generate` on an own family never imports it

    directory = Path(path)
    try:
        lm = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    except Exception as err:  # transformers raises ValueError, OSError, KeyError, ...
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ModelLoadError(f"{quote(directory)}: unsupported architecture {transformers_model_type(directory)!r} "
                             f"for specfill's own models, and transformers could not load it: {first}") from None
    lm = lm.to(device)
    model = adapt(lm)
    ops = AdaptedOps(device, dtype, use_kernels)
    return CausalLM(model, ops, prefill_step_size=prefill_step_size), load_tokenizer(directory)
