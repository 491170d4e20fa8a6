"""The torch adapter against the transformers versions it meets: 5.24 here (the dev install), 5.17
on the GPU image (2026-11-29 H200 session: a Qwen3.5 hybrid was refused there by the self-check
because its forward took the cache by another keyword). Each API difference is decided in one
place (adapted.cache_keyword, adapted._has_state, adapted._stepwise); these tests drive both
spellings with stand-ins, since only one transformers is installed."""

from __future__ import annotations

import torch
from torch import nn

from specfill.backends.torch_cuda.adapted import _stepwise, cache_keyword


class _Before(nn.Module):  # transformers < 5.20: forward(..., past_key_values=...)
    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
        return past_key_values


class _After(nn.Module):  # transformers >= 5.20: forward(..., cache=...)
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return cache


def test_the_cache_keyword_is_the_one_the_forward_names():
    assert cache_keyword(_Before()) == "past_key_values"
    assert cache_keyword(_After()) == "cache"


class _OldCache:  # 5.17's Cache: has_previous_state(layer), no get_recurrent_state
    def __init__(self, has: bool):
        self.has = has

    def has_previous_state(self, layer_idx=None, state_idx=None):
        return self.has


class _NewCache:  # 5.24's: get_recurrent_state(layer)
    def __init__(self, has: bool):
        self.state = torch.zeros(1) if has else None

    def get_recurrent_state(self, layer_idx, state_idx=0):
        return self.state


class _Mixer(nn.Module):
    """Records the lengths of the steps it is called with; returns its input doubled."""

    def __init__(self, keyword: str):
        super().__init__()
        self.layer_idx, self.calls = 3, []
        self.keyword = keyword

    def run(self, hidden_states, cache, attention_mask):
        self.calls.append((hidden_states.shape[1], None if attention_mask is None else attention_mask.shape[1]))
        return hidden_states * 2


class _OldMixer(_Mixer):
    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
        return self.run(hidden_states, cache_params, attention_mask)


class _NewMixer(_Mixer):
    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        return self.run(hidden_states, cache, attention_mask)


def test_a_stepwise_mixer_continues_a_state_token_by_token_in_either_api():
    x = torch.arange(12.0).reshape(1, 4, 3)
    mask = torch.ones(1, 4)
    for mixer, keyword, cache_type in ((_OldMixer("cache_params"), "cache_params", _OldCache),
                                       (_NewMixer("cache"), "cache", _NewCache)):  # fmt: skip
        run = _stepwise(mixer, mixer.forward)
        out = run(x, **{keyword: cache_type(True)}, attention_mask=mask)
        assert torch.equal(out, x * 2) and mixer.calls == [(1, 1)] * 4  # a state: token by token
        mixer.calls.clear()
        run(x, **{keyword: cache_type(False)}, attention_mask=mask)
        assert mixer.calls == [(4, 4)]  # no state yet: the whole-sequence path
        mixer.calls.clear()
        run(x, cache_type(True))  # the cache passed by position
        assert mixer.calls == [(1, None)] * 4


def test_a_hybrids_mlp_and_moe_blocks_are_stateless_as_5_17_names_them(monkeypatch):
    """5.17's get_layer_types_and_kwargs names a hybrid's MLP / MoE blocks "mlp" / "moe" (5.24:
    "dummy") and returns one kwargs dict for every layer (5.24: a list)."""
    from types import SimpleNamespace

    import transformers.cache_utils

    from specfill.backends.torch_cuda.adapted_probe import check_layer_kinds

    kinds = ["full_attention", "linear_attention", "mlp", "moe"]
    monkeypatch.setattr(transformers.cache_utils, "get_layer_types_and_kwargs", lambda text: (kinds, {}))
    ours, states = check_layer_kinds(SimpleNamespace(num_hidden_layers=4), "nemotron_h")
    assert ours == ["attention", "recurrent", "stateless", "stateless"] and states == [1, 1, 1, 1]


def test_the_load_self_check_compares_with_transformers_eager_attention():
    """transformers 5.17 ran Gemma 2 through SDPA by default, which dropped its logit soft-cap: the
    self-check compared specfill's (capped) attention with that and refused the model (0.74 off).
    Here a model default that drops the cap as 5.17's did stands in (5.24's SDPA refuses a
    soft-cap): the check's reference is the eager forward, so the model still loads."""
    from transformers import AttentionInterface
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    from specfill.backends.torch_cuda.adapted import adapt
    from specfill.backends.torch_cuda.adapted_probe import implementation, model_configs
    from tests.adapters.torch_archs import build

    def capless(module, query, key, value, attention_mask, softcap=None, **kwargs):
        return eager_attention_forward(module, query, key, value, attention_mask, softcap=None, **kwargs)

    AttentionInterface.register("specfill_test_capless", capless)
    lm = build("gemma2")
    ids = torch.arange(3, 9)[None]
    with torch.no_grad(), implementation(model_configs(lm), "specfill_test_capless"):
        dropped = lm(input_ids=ids, use_cache=False).logits
    with torch.no_grad():
        eager = lm(input_ids=ids, use_cache=False).logits
    assert float((dropped - eager).abs().max()) > 0.1  # the cap matters on this model
    for config in model_configs(lm):  # the model's own default drops the cap, as 5.17's SDPA did
        config._attn_implementation_internal = "specfill_test_capless"
    adapt(lm)  # no ModelLoadError
