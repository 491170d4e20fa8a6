"""The torch backend's own sampler: greedy, or temperature / top-p on the device (no host copy per
token). Settings beyond those go through core/sampling.py's host sampler instead."""

from __future__ import annotations

import torch

from specfill.core.runtime import SamplingConfig


def make_generator(sampling: SamplingConfig, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


def sample(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """One token [1] from float32 logits [vocab]: argmax at temperature 0, else temperature then
    nucleus (smallest set of tokens whose probability reaches top_p)."""
    if sampling.temperature == 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly more likely tokens
        sorted_probs = sorted_probs.masked_fill(before >= sampling.top_p, 0.0)
        return order[torch.multinomial(sorted_probs, 1, generator=generator)]
    return torch.multinomial(probs, 1, generator=generator)
