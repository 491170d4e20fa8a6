"""A process that writes prompt-store entries without end, for the SIGKILL trials
(tests/serve/test_prompt_store_faults.py): the store's own write path (serve/prompt_store.py) over
the NumPy reference KV cache (core/reference/kv_cache.py), whose content follows from its tokens
alone, so a reader can tell every file's KV from what was written."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import numpy as np

from specfill.core.reference.kv_cache import ReferenceKVCache
from specfill.core.runtime import KVState
from specfill.serve.prompt_cache import Entry
from specfill.serve.prompt_store import PromptStore

NAME = "reference:store-writer"
LAYERS, HEADS, HEAD_DIM = 2, 4, 64  # 4 KiB of keys and values per slot (float32)


class ReferenceModel:
    """What the store reads of a model (its identity, a new cache), over the reference cache."""

    backend = "reference"
    dtype = "float32"
    model = None
    args = SimpleNamespace(
        num_hidden_layers=LAYERS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        vocab_size=1000,
        max_position_embeddings=4096,
    )

    def __init__(self) -> None:
        self.ops = self

    def new_cache(self, model: Any, slots: int) -> ReferenceKVCache:
        return ReferenceKVCache(LAYERS, HEADS, HEAD_DIM, slots, np.float32)


def content(tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The keys and values [layers, heads, slots, head_dim] a conversation's file holds."""
    seed = int.from_bytes(hashlib.sha256(repr(tokens).encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    shape = (LAYERS, HEADS, len(tokens), HEAD_DIM)
    return rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)


def entry(tokens: list[int]) -> Entry:
    keys, values = content(tokens)
    cache = ReferenceKVCache(LAYERS, HEADS, HEAD_DIM, len(tokens), np.float32)
    for i, layer in enumerate(cache.layers):
        layer.k[0], layer.v[0], layer.offset = keys[i], values[i], len(tokens)
    return Entry(tokens, KVState(cache, len(tokens)), exact=True)


def conversation(rng: np.random.Generator) -> list[int]:
    """One of a few hundred conversations (some written again: a file replaced in place), of 16 to
    256 tokens (64 KiB to 1 MiB)."""
    n = int(rng.integers(0, 300))
    return np.random.default_rng(n).integers(4, 1000, 16 + n % 241).tolist()


def write_forever(directory: str, seed: int, max_bytes: int, ready: Any) -> None:
    """Open a store on `directory` (bounded by `max_bytes`: its oldest files are deleted as it
    writes), set `ready`, then write entries until killed."""
    store = PromptStore(directory, ReferenceModel(), NAME, max_bytes)
    rng = np.random.default_rng(seed)
    ready.set()
    while True:
        path, _ = store.write(entry(conversation(rng)))
        store.evict(keep=path)  # as the prompt cache does after each write
