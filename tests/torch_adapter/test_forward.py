"""Full prefill and decoding through the adapter equal transformers' own model (fp32, CPU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specfill.backends.torch_cuda.ops import TorchOps
from specfill.core.adapted import AdaptedArgs
from specfill.core.runtime import GenerationInfo, PrefillMethod

from tests.torch_adapter.archs import HONOURED, MOE, REFUSED, build
from tests.torch_adapter.support import adapted, assert_close, greedy, prompt

ALL = sorted(HONOURED) + sorted(REFUSED)


def own_logits(lm: torch.nn.Module, ids: list[int], positions: list[int] | None = None) -> np.ndarray:
    """transformers' own forward (its default attention), every position's logits [T, vocab]."""
    with torch.no_grad():
        extra = {} if positions is None else {"position_ids": torch.tensor([positions])}
        return lm(torch.tensor([ids]), **extra).logits[0].float().numpy()


def test_the_set_covers_twelve_model_types_and_four_mixtures_of_experts():
    assert len(HONOURED) >= 12 and len([a for a in MOE if a in HONOURED]) >= 4


@pytest.mark.parametrize("arch", ALL)
def test_full_prefill_equals_the_transformers_forward(arch):
    """Every position's logits, in two prefill steps (the second attends to the cache), over a
    prompt longer than the sliding windows (8) of mixtral, starcoder2, exaone4, gpt_oss, gemma2."""
    lm = build(arch)
    ids = prompt(40, seed=1)
    want = own_logits(lm, ids)
    model = adapted(lm, prefill_step_size=24)
    assert isinstance(model.args, AdaptedArgs) and model.args.num_hidden_layers == 2
    got = model.prompt_logits(ids, method=PrefillMethod(), info=GenerationInfo())
    assert_close(got, want, f"{arch} prefill")


@pytest.mark.parametrize("arch", ALL)
def test_greedy_decoding_equals_transformers_with_its_own_cache(arch):
    lm = build(arch)
    ids = prompt(20, seed=2)
    with torch.no_grad():
        out = lm(torch.tensor([ids]), use_cache=True)
        want = []
        for _ in range(6):
            want.append(int(out.logits[0, -1].argmax()))
            out = lm(torch.tensor([[want[-1]]]), cache=out.past_key_values, use_cache=True)
    assert greedy(adapted(lm), ids, 6) == want


@pytest.mark.parametrize("arch", ALL)
def test_a_step_at_gapped_positions_equals_transformers_at_those_position_ids(arch):
    """SpecPrefill's kept tokens at their original positions: a prefill step at gapped per-token
    positions gives transformers' own logits for the same position_ids (and, where RoPE turns
    q and k, other logits than at consecutive positions). transformers slides its windows by
    slot, specfill by position (kept tokens keep their distances): windows here outspan the gaps."""
    extra = HONOURED[arch] if arch in HONOURED else REFUSED[arch][0]
    lm = build(arch, {**extra, "sliding_window": 64} if "sliding_window" in extra else None)
    ids = prompt(9, seed=3)
    positions = [0, 1, 3, 6, 7, 19, 20, 26, 30]
    model = adapted(lm)
    ops: TorchOps = model.ops
    with torch.inference_mode():
        cache = ops.new_cache(model.model, 12)
        got = ops.forward(model.model, ops.tokens(np.array(ids)), np.array(positions), cache, None, 0).numpy()
    want = own_logits(lm, ids, positions)
    assert_close(got, want, f"{arch} gapped positions")
    assert np.abs(want - own_logits(lm, ids)).max() > 1e-4, "positions reach the attention"


def test_the_adapted_model_still_runs_as_transformers_outside_specfill():
    lm = build("qwen3_moe")
    ids = prompt(10, seed=4)
    want = own_logits(lm, ids)
    model = adapted(lm)
    greedy(model, ids, 2)
    assert lm.config._attn_implementation != "specfill"
    np.testing.assert_array_equal(own_logits(lm, ids), want)
