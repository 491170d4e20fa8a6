"""What one process (a rank under mlx.launch, or the one-process reference) runs through the public
API on a loaded model: every method and feature, each as {"tokens": [...], ...} or {"error": line}.
The same code runs sharded and unsharded, so the two runs' results compare key by key."""

from __future__ import annotations

from typing import Any

import numpy as np

import specfill
from specfill.api import format_stats, load_speculator
from specfill.core.config import H2OConfig, SpecPrefillConfig
from specfill.core.errors import ConfigError
from specfill.core.runtime import GenerationInfo

PROMPT = [int(t) for t in np.random.default_rng(0).integers(3, 320, 64)]  # no BOS / EOS ids
MAX_TOKENS = 8
H2O = H2OConfig(chunk_size=8, batch_size=64, local=2, heavy=3, dense_tail=0, layers="all")
SPEC = SpecPrefillConfig(keep_ratio=0.5, lookahead=2, select_chunk=4, pool_kernel=3)


def _run(
    model: Any, tokenizer: Any, prompt: list[int], info: GenerationInfo | None = None, **options: Any
) -> dict[str, Any]:
    try:
        responses = list(specfill.stream_generate(model, tokenizer, prompt, MAX_TOKENS, prefill_info=info, **options))
    except ConfigError as err:
        return {"error": str(err)}
    last = responses[-1]
    return {
        "tokens": [r.token for r in responses],
        "stats": format_stats(last),
        "drafted": last.drafted_tokens,
        "distributed": last.distributed,
    }


def run_scenarios(model: Any, tokenizer: Any, speculator_dir: str, kind: str | None) -> dict[str, Any]:
    """Every scenario's result (kind: "tensor", "pipeline", or None for one process)."""
    speculator = load_speculator(speculator_dir, model, tokenizer)
    out: dict[str, Any] = {"full": _run(model, tokenizer, PROMPT)}
    info = GenerationInfo(record_memory=True)
    out["h2o"] = _run(model, tokenizer, PROMPT, info, method="h2o", h2o=H2O)
    out["h2o"]["memory_sets"] = [[np.asarray(m).tolist() for m in layer] for layer in info.memory_sets]
    out["h2o"]["info_distributed"] = info.distributed
    info = GenerationInfo()
    out["specprefill"] = _run(
        model, tokenizer, PROMPT, info, method="specprefill", specprefill=SPEC, speculator=speculator
    )
    out["specprefill"]["kept_positions"] = [int(p) for p in info.kept_positions]
    out["spec_self"] = _run(model, tokenizer, PROMPT, method="specprefill", specprefill=SPEC, speculator="self:1")
    out["draft"] = _run(model, tokenizer, PROMPT, draft_model=speculator, num_draft_tokens=2)
    out["draft_self"] = _run(model, tokenizer, PROMPT, draft_model="self:1", num_draft_tokens=2)
    first = GenerationInfo()
    out["reuse_first"] = _run(model, tokenizer, PROMPT, first)
    longer = PROMPT + out["reuse_first"]["tokens"] + PROMPT[:9]
    out["reuse"] = _run(model, tokenizer, longer, reuse=first.kv)
    out["sampled"] = _run(model, tokenizer, PROMPT, temperature=0.9)
    out["auto"] = _run(model, tokenizer, PROMPT, method="auto", h2o=H2O)
    return out
