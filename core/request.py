"""One generation request, built and checked in one place: the API, the CLI and the server each
translate their input (keywords, flags, HTTP fields) into `build_request`, and the driver runs
what comes out (CausalLM.generate_step with its parts).

Every setting has one field here (or in the config it lives in: H2OConfig, SpecPrefillConfig,
SamplingConfig, Drafting, PrefillMethod, each checking its own values) and one check. What
needs the model or the prompt (token ids inside the vocabulary, the context, the speculator's
backend, vocabulary and context, the clamps of SpecPrefill settings to the prompt) is checked by
the driver, once, when it runs the request; `fit_to_prompt` below is that clamp.

Clamps (to the prompt, once its length is known):
- look-ahead N: to what the speculator's context holds after the prompt, with a notice (the
  backends stop there anyway; the notice says so instead of silently decoding thousands of steps);
- select_chunk: to the prompt length, and pool_kernel: to 2 * prompt - 1, both silently: beyond
  those the whole prompt is one selection chunk / every pooling window covers the whole prompt,
  so the selection is the same and no buffer the size of the setting is allocated.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

from .config import H2OConfig, MAX_SETTING, SpecPrefillConfig
from .errors import ConfigError, SpecfillWarning
from .runtime import Drafting, PrefillMethod, SamplingConfig, check_drafting

DEFAULT_NUM_DRAFT_TOKENS = 3  # mlx-lm's default


@dataclass(frozen=True)
class GenerationRequest:
    """What one generation needs besides its prompt: built by `build_request` only.

    max_tokens: tokens to generate (>= 1). sampling: the sampler's settings. method: which
    prefill, with its config and speculator ("self:K", a loaded model, or a path the API loads).
    drafting: speculative decoding (None: plain decoding); its model likewise.
    """

    max_tokens: int
    sampling: SamplingConfig
    method: PrefillMethod
    drafting: Drafting | None = None


def build_request(*, max_tokens: Any = 256, temperature: Any = 0.0, top_p: Any = 1.0, seed: Any = None,
                  top_k: Any = 0, min_p: Any = 0.0, repetition_penalty: Any = 1.0, presence_penalty: Any = 0.0,
                  frequency_penalty: Any = 0.0, method: str | PrefillMethod = "full", h2o: H2OConfig | None = None,
                  specprefill: SpecPrefillConfig | None = None, speculator: Any = None,
                  auto_threshold: Any = None, draft_model: Any = None,
                  num_draft_tokens: Any = None) -> GenerationRequest:
    """The request for these settings (the keywords of specfill.generate), or one ConfigError
    naming the setting at fault; a SpecfillWarning for settings that do nothing."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_SETTING:
        raise ConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    sampling = SamplingConfig(temperature, top_p, seed, top_k=top_k, min_p=min_p, presence_penalty=presence_penalty,
                              repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty)
    if sampling.temperature == 0 and (sampling.top_p != 1.0 or sampling.seed is not None):
        warnings.warn("top_p and seed do nothing with temperature 0 (greedy decoding)", SpecfillWarning, stacklevel=3)
    plan = method if isinstance(method, PrefillMethod) else prefill_method(
        method, h2o=h2o, specprefill=specprefill, speculator=speculator, auto_threshold=auto_threshold)
    drafting = None
    if draft_model is not None or num_draft_tokens is not None:
        drafting = Drafting(draft_model, DEFAULT_NUM_DRAFT_TOKENS if num_draft_tokens is None else num_draft_tokens)
        check_drafting(drafting, None, sampling)
        if draft_model is None and plan.name != "specprefill":
            raise ConfigError("num_draft_tokens without a draft model drafts with the SpecPrefill speculator: "
                              "use method specprefill or give a draft model")
    return GenerationRequest(max_tokens, sampling, plan, drafting)


def prefill_method(method: str = "full", *, h2o: H2OConfig | None = None,
                   specprefill: SpecPrefillConfig | None = None, speculator: Any = None,
                   auto_threshold: Any = None) -> PrefillMethod:
    """The PrefillMethod for a method name, with default configs where none is given; one warning
    naming settings given for another method. "auto": full prefill below the crossover length
    calibrated on this machine (or `auto_threshold`), above it speculative prefill when a
    speculator is given, else H2O (core/crossover.py)."""
    if auto_threshold is not None and method != "auto":
        raise ConfigError("auto_threshold (--auto-threshold) goes with method auto (--method auto)")
    if method not in ("auto", "h2o", "specprefill"):
        _warn_unused(method, h2o=h2o, specprefill=specprefill, speculator=speculator)
        return PrefillMethod(method)
    if method == "h2o":
        _warn_unused(method, h2o=None, specprefill=specprefill, speculator=speculator)
        return PrefillMethod("h2o", h2o=h2o or H2OConfig())
    if method == "specprefill":
        _warn_unused(method, h2o=h2o, specprefill=None, speculator=None)
        if speculator is None:
            raise ConfigError("speculative prefill needs --speculator (API: speculator=): a model path, a loaded "
                              "model, or 'self:K' (the main model's first K layers)")
        return PrefillMethod("specprefill", specprefill=specprefill or SpecPrefillConfig(), speculator=speculator)
    return PrefillMethod("auto", h2o=h2o or H2OConfig(), specprefill=specprefill or SpecPrefillConfig(),
                         speculator=speculator, auto_threshold=auto_threshold)


def _warn_unused(method: str, *, h2o: Any, specprefill: Any, speculator: Any) -> None:
    """One warning naming the settings given for another method than `method`."""
    unused = ([] if h2o is None else ["H2O settings"]) + ([] if specprefill is None else ["SpecPrefill settings"]) \
        + ([] if speculator is None else ["a speculator"])
    if unused:
        warnings.warn(f"{' and '.join(unused)} do nothing with method {method!r}", SpecfillWarning, stacklevel=4)


def fit_to_prompt(plan: PrefillMethod, n_prompt: int, speculator_context: int) -> PrefillMethod:
    """The SpecPrefill settings clamped to an n_prompt-token prompt (see the module docstring)."""
    if plan.name != "specprefill" or plan.specprefill is None or n_prompt < 1:
        return plan
    config = plan.specprefill
    changes: dict[str, int] = {}
    if config.lookahead > speculator_context - n_prompt >= 0:
        changes["lookahead"] = speculator_context - n_prompt
        warnings.warn(f"look-ahead {config.lookahead} clamped to {speculator_context - n_prompt}: the speculator's "
                      f"context of {speculator_context} tokens holds the {n_prompt}-token prompt and no more",
                      SpecfillWarning, stacklevel=4)
    if config.select_chunk > n_prompt:
        changes["select_chunk"] = n_prompt
    if config.pool_kernel > 2 * n_prompt - 1:
        changes["pool_kernel"] = 2 * n_prompt - 1
    return replace(plan, specprefill=replace(config, **changes)) if changes else plan

