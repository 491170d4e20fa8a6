"""The KV cache's books (core/ops.py's KVCache) against core/reference/kv_cache.py: the same writes,
trims and cuts and growth on both, then what each holds compared.

The script is what generation does to a cache: a prefill fills every layer; rejected drafts are
trimmed; a "self:K" draft writes into the first layers only and is trimmed there; a prefill stopped
after its first layer (a cancelled request) is cut back on every layer before the cache is reused;
a reused cache grows past its first capacity and keeps its slots; a copy of a prefix (the prompt
cache lending a shared prefix) holds those slots and its writes leave its source as it was.
"""

from __future__ import annotations

import numpy as np

from specfill.core.reference.kv_cache import ReferenceKVCache
from specfill.core.tolerances import round_to

from .adapter import ConformanceAdapter
from .cases import HEAD_DIM
from .results import Checker

LAYERS, KV_HEADS, CAPACITY = 3, 2, 12


def check_kv_cache(ad: ConformanceAdapter, ck: Checker) -> None:
    """The script on a cache of one head dim, then on one whose values are narrower (latent attention)."""
    _script(ad, ck, None, "")
    _script(ad, ck, HEAD_DIM // 2, "latent,Dv=D/2: ")


def _script(ad: ConformanceAdapter, ck: Checker, value_dim: int | None, prefix: str) -> None:
    rng = np.random.default_rng(11)
    got = ad.new_cache(LAYERS, KV_HEADS, HEAD_DIM, CAPACITY, value_dim)
    want = ReferenceKVCache(LAYERS, KV_HEADS, HEAD_DIM, CAPACITY, value_dim=value_dim)

    def write(layers: range, n: int, case: str) -> None:
        case = prefix + case
        for layer in layers:
            keys = round_to(rng.normal(size=(1, KV_HEADS, n, HEAD_DIM)), ck.dtype)
            values = round_to(rng.normal(size=(1, KV_HEADS, n, value_dim or HEAD_DIM)), ck.dtype)
            got_k, got_v = got.write(layer, keys, values)
            want_k, want_v = want.layers[layer].update_and_fetch(keys, values)
            ck.close("kv_cache.update_and_fetch.keys", f"{case},layer={layer}", got_k, want_k)
            ck.close("kv_cache.update_and_fetch.values", f"{case},layer={layer}", got_v, want_v)

    def books(case: str) -> None:
        case = prefix + case
        offsets = [layer.offset for layer in want.layers]
        ck.exact("kv_cache.offsets", case, got.offsets() == offsets, f"{got.offsets()} vs {offsets}")
        ck.exact("kv_cache.filled", case, got.filled == want.filled, f"{got.filled} vs {want.filled}")
        ck.close("kv_cache.keys", case, got.keys(want.filled), want.keys(want.filled))
        for layer in range(LAYERS):
            want_k = want.layer_keys(layer, want.filled)
            ck.close("kv_cache.layer_keys", f"{case},layer={layer}", got.layer_keys(layer, want.filled), want_k)

    write(range(LAYERS), 5, "prefill 5")
    books("prefill 5")
    got.trim(2)
    want.trim(2)
    books("trim 2 (rejected drafts)")
    write(range(2), 3, "a self:2 draft writes 3")
    got.trim(3, 2)
    want.trim(3, 2)
    books("trim 3 in the first 2 layers (the draft's writes)")
    write(range(1), 2, "a step stopped after layer 0")
    got.truncate(3)
    want.truncate(3)
    books("truncate to 3 (a cancelled step cut back)")
    ck.exact("kv_cache.capacity", prefix + "new", got.capacity >= CAPACITY, f"{got.capacity} < {CAPACITY}")
    got, want = got.grown(2 * CAPACITY), want.grown(2 * CAPACITY)
    ck.exact("kv_cache.capacity", prefix + "grown", got.capacity >= 2 * CAPACITY, f"{got.capacity} < {2 * CAPACITY}")
    books("grown to twice the capacity")
    write(range(LAYERS), CAPACITY, "past the first capacity")
    books("filled past the first capacity")
    source, reference = got, want
    got, want = got.copy(4, CAPACITY), want.copy(4, CAPACITY)
    books("a copy of the first 4 slots")
    ck.exact(
        "kv_cache.nbytes",
        prefix + "a copy of 4 slots",
        0 < got.nbytes < source.nbytes,
        f"{got.nbytes} bytes, its source's {source.nbytes}",
    )
    write(range(LAYERS), 3, "into the copy")
    books("the copy extended by 3")
    got, want = source, reference
    books("the copy's source, untouched by its writes")


KV_CACHE_CHECKS = {"kv_cache": check_kv_cache}
