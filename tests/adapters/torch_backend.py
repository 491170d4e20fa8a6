"""The transformers side of the adapter tests (specfill.backends.torch_cuda.adapted): an adapted
CausalLM of a transformers model, transformers' own forward and decoding to compare with, and the
backend's expectations.

Tolerance: the adapter and transformers both compute in float32 on the CPU, with the same
projections, norms and RoPE (transformers' own code); only the attention itself differs (specfill's
against torch's SDPA as transformers calls it), so logits agree to float32 rounding: observed
max |diff| <= 3e-7 on logits of max |logit| ~ 0.5-10.
"""

from __future__ import annotations

import numpy as np
import torch

from specfill.backends.torch_cuda import load
from specfill.backends.torch_cuda.adapted import AdaptedModel, adapt, cache_keyword
from specfill.backends.torch_cuda.model import Transformer as OwnModel
from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core.driver import CausalLM
from tests.adapters import torch_table as table
from tests.adapters.torch_archs import HONOURED, LATENT, MOE, REFUSED, TERMS, build, save_directory

__all__ = [
    "AdaptedModel",
    "HONOURED",
    "LATENT",
    "MOE",
    "OwnModel",
    "REFUSED",
    "TERMS",
    "build",
    "load",
    "save_directory",
    "table",
]

NAME, CLI_BACKEND = "torch", "cuda"
# the refusal test's cases: H2O and the SpecPrefill speculator (the main pass runs refused layers:
# test_transformers_only.py)
REFUSAL_NAMES = ("H2O", "speculator")
# the CLI's refusal case: (architecture, its config, what the refused method says)
CLI_REFUSAL = ("olmo", REFUSED["olmo"][0], "H2O cannot run on olmo: layer 0 (dynamic RoPE (OlmoAttention))")
FAMILIES = {  # the families the project has model files for, as the own-family tests write them
    "llama": {},
    "mistral": dict(sliding_window=8),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": {},
    "gemma3_text": dict(query_pre_attn_scalar=16, sliding_window=8, num_hidden_layers=6),  # 5 sliding, 1 global
}


def adapted(lm: torch.nn.Module, prefill_step_size: int = 2048) -> CausalLM:
    """The transformers model `lm` adapted, as specfill's CausalLM on the CPU in float32."""
    return CausalLM(adapt(lm), TorchOps(torch.device("cpu"), torch.float32), prefill_step_size=prefill_step_size)


def to_numpy(a: torch.Tensor) -> np.ndarray:
    return a.detach().float().numpy().copy()


def own_logits(lm: torch.nn.Module, ids: list[int], positions: list[int] | None = None) -> np.ndarray:
    """transformers' own forward (its default attention), every position's logits [T, vocab]."""
    with torch.no_grad():
        extra = {} if positions is None else {"position_ids": torch.tensor([positions])}
        return lm(torch.tensor([ids]), **extra).logits[0].float().numpy()


def own_greedy(lm: torch.nn.Module, ids: list[int], max_tokens: int, positions: bool = False) -> list[int]:
    """Greedy tokens from transformers' own model and its own cache; `positions`: each decode step
    at explicit position_ids (transformers 5.24's MiniMaxCache counts its first layer's keys, none on
    a lightning-attention layer 0, so without them its decode steps run at position 0)."""
    with torch.no_grad():
        out = lm(torch.tensor([ids]), use_cache=True)
        tokens = []
        for i in range(max_tokens):
            tokens.append(int(out.logits[0, -1].argmax()))
            at = {"position_ids": torch.tensor([[len(ids) + i]])} if positions else {}
            at[cache_keyword(lm)] = out.past_key_values  # `cache` or, before transformers 5.20, `past_key_values`
            out = lm(torch.tensor([[tokens[-1]]]), use_cache=True, **at)
    return tokens


def library_pair(directory) -> tuple:
    """The (model, tokenizer) pair transformers loads from a directory (float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(directory)
