"""Tiny random transformers models and the same weights as our torch backend sees them.

Imported by the tests of this folder (`from tests.torch_cuda.tiny_torch_models import ...`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specfill.backends.torch_cuda import from_weights  # noqa: E402
from specfill.core.driver import CausalLM  # noqa: E402
from specfill.core.io.weights import norms_as_multipliers  # noqa: E402
from specfill.core.models import ModelArgs  # noqa: E402

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
ARCH_CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    # head_dim != hidden / heads, as in real Qwen3 checkpoints
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
    # every layer slides over 8 positions: prompts of 48 tokens cross it
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    # 3 layers: sliding, global, sliding (window 8), local RoPE base 10^4, global 10^6,
    # query scale 1/sqrt(20) != 1/sqrt(head_dim)
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "num_hidden_layers": 3,
            "head_dim": 24,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "query_pre_attn_scalar": 20,
            "rms_norm_eps": 1e-6,
        },
    ),
}


@dataclass
class TinyModel:
    hf: Any  # the transformers model, fp32, eval
    args: ModelArgs
    weights: dict[str, np.ndarray]

    def ours(self, dtype: Any = None, step: int = 2048, device: str = "cpu") -> CausalLM:
        dtype = dtype or torch.float32
        return from_weights(self.args, self.weights, dtype=dtype, device=device, prefill_step_size=step)

    def hf_logits(self, ids: list[int], positions: list[int] | None = None) -> Any:
        kwargs = {} if positions is None else {"position_ids": torch.tensor([positions])}
        # An explicit mask: without one, transformers reads jumps in position_ids as the
        # boundaries of packed sequences and stops attention across them.
        mask = torch.ones(1, len(ids), dtype=torch.long)
        with torch.no_grad():
            return self.hf(torch.tensor([ids]), attention_mask=mask, use_cache=False, **kwargs).logits.float()

    def hf_greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            out = self.hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return out[0, len(ids) :].tolist()


def randomize(model: Any, seed: int) -> None:
    """Every parameter random (HF initialises norms to 1 and biases to 0, which would hide bugs
    in how they are loaded)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.15 * noise)


def make_tiny(arch: str, seed: int = 0, **overrides: Any) -> TinyModel:
    config_name, model_name, extra = ARCH_CONFIGS[arch]
    config = getattr(transformers, config_name)(**{**TINY, **extra, **overrides})
    torch.manual_seed(seed)
    hf = getattr(transformers, model_name)(config).float().eval()
    randomize(hf, seed)
    weights = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    args = ModelArgs.from_hf_config(config.to_dict())
    norms_as_multipliers(args, weights)  # as the loader does: Gemma's x * (1 + w)
    return TinyModel(hf, args, weights)


def prompt_ids(n: int, vocab: int = 128, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()
