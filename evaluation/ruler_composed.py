"""SpecPrefill over an H2O speculator (specprefill+h2o) in the selection protocol
(evaluation/ruler_protocol.py): its kept set without the main model. The speculator's H2O prompt
pass, look-ahead, scoring and selection run through core/methods/specprefill.speculate_and_select,
the code the method itself runs (speculative_prefill calls it, then prefills the kept tokens), on
the config the API would run (core/request.fit_to_prompt's clamp). Nothing is cached: the pass
depends on the whole config (its H2O sizes and layers, the scoring layers, the look-ahead), so
every candidate runs its own, and a rerun skips it through its record."""

from __future__ import annotations

import time

import numpy as np

from specfill.core import SpecPrefillConfig

from .ruler_tasks import RulerSample


def composed_selection(model, speculator, tokenizer, sample: RulerSample, config: SpecPrefillConfig) -> dict:
    """What `config` (a SpecPrefillConfig with speculator_prefill set) keeps of the sample's prompt:
    {"kept": positions [K] int64, "n_prompt": P, "speculator_s", "selection_s", "seconds"}."""
    from specfill.api import encode_prompt
    from specfill.core.methods.specprefill import speculate_and_select
    from specfill.core.plan import check_token_ids
    from specfill.core.request import fit_to_prompt
    from specfill.core.runtime import PrefillMethod
    from specfill.core.text_units import with_text_units

    ops = model.ops
    ids = np.asarray(check_token_ids(encode_prompt(tokenizer, sample.prompt), model.args.vocab_size), np.int64)
    spec_model, spec_step = model.speculator_model(speculator)
    method = with_text_units(PrefillMethod("specprefill", specprefill=config, speculator=speculator), tokenizer, ids)
    config = fit_to_prompt(method, len(ids), spec_model.args.max_position_embeddings).specprefill
    with ops.device_scope():
        started = time.perf_counter()
        _, selection, seconds = speculate_and_select(
            ops,
            spec_model,
            ids,
            config,
            stop_ids=frozenset(tokenizer.eos_token_ids),
            speculator_step_size=spec_step,
        )
        total = time.perf_counter() - started
    return {
        "kept": np.asarray(selection.kept, np.int64),
        "n_prompt": len(ids),
        "speculator_s": seconds["speculator"],
        "selection_s": seconds["selection"],
        "seconds": total,
    }
