"""MLX backend tests: tiny models on MLX's CPU backend (Metal on a Mac), transformers as the
reference. torch runs on one thread: the machine is shared and the models are tiny."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    torch.set_num_threads(1)


def prompt_ids(length: int, *, vocab: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, length).tolist()


@pytest.fixture(scope="session")
def transformers_logits() -> Callable[..., np.ndarray]:
    """transformers_logits(hf_dir, ids, position_ids=None) -> float32 logits [T, vocab] from
    transformers' own model of a safetensors directory (models cached per directory)."""
    models: dict[Path, object] = {}

    def run(directory: Path, ids: list[int], position_ids: list[int] | None = None) -> np.ndarray:
        if directory not in models:
            models[directory] = transformers.AutoModelForCausalLM.from_pretrained(
                str(directory), dtype=torch.float32
            ).eval()
        kwargs = {}
        if position_ids is not None:  # an explicit mask stops transformers from reading
            # non-consecutive positions as packed sequences
            kwargs = {
                "position_ids": torch.tensor([position_ids]),
                "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            }
        with torch.no_grad():
            out = models[directory](torch.tensor([ids]), use_cache=False, **kwargs)
        return out.logits[0].numpy()

    return run
