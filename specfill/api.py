"""The mlx-lm-style public API: load, generate, stream_generate — once for both backends."""
from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from specfill.core import (BackendUnavailableError, ConfigError, H2OConfig, SpecPrefillConfig,
                           TokenizerMismatchError)
from specfill.core.io.demo_model import require_demo_model
from specfill.core.guards import check_logits_finite
from specfill.core.runtime import CausalLM, PrefillInfo, PrefillMethod, ProgressCallback, SamplingConfig
from specfill.settings import check_sampling, fit_to_prompt, prompt_ids, warn_unused

BACKENDS = {"cuda": "specfill.backends.torch_cuda", "torch": "specfill.backends.torch_cuda",
            "mlx": "specfill.backends.mlx"}


@dataclass(frozen=True)
class GenerationResponse:
    """One streamed step, as mlx-lm's: `text` is the new text since the previous response."""

    text: str
    token: int
    prompt_tokens: int
    prompt_tps: float
    ttft: float  # seconds from the call to the first generated token
    kept_tokens: int  # prompt tokens the main model prefilled (all of them for full and H2O)
    generation_tokens: int
    generation_tps: float
    peak_memory: float  # GB
    finish_reason: str | None  # "stop", "length", or None while streaming


def backend_module(backend: str) -> Any:
    """The backend package, or a one-line error when it is unknown or not installed."""
    if backend not in BACKENDS:
        raise BackendUnavailableError(f"unknown backend {backend!r} (choose from mlx, cuda)")
    try:
        return importlib.import_module(BACKENDS[backend])
    except ModuleNotFoundError as err:
        extra = "mlx" if backend == "mlx" else "cuda"
        raise BackendUnavailableError(f"backend {backend!r} needs {err.name!r}, which is not installed "
                                      f"(pip install 'specfill[{extra}]')") from None


def load(path: str | None = None, backend: str = "cuda", dtype: str | None = None,
         device: str | None = None) -> tuple[CausalLM, Any]:
    """(model, tokenizer) from a GGUF file or a Hugging Face / mlx-lm directory.

    No path loads the bundled demo model (SmolLM2-135M-Instruct); "random:SHAPE" (e.g.
    "random:llama-1b") builds seeded random weights of a known shape, for benchmarks.
    """
    module = backend_module(backend)
    model, tokenizer = module.load(str(path) if path is not None else str(require_demo_model()), dtype=dtype,
                                   device=device)
    check_computes_finite(model, dtype)
    return model, tokenizer


def check_computes_finite(model: CausalLM, dtype: str | None) -> None:
    """One token through the loaded model: a checkpoint that loads but computes NaN or Inf (finite
    weights whose products overflow float32, say) is a NonFiniteLogitsError here, not an end token
    later. Costs one decode step."""
    logits = model.prompt_logits([0], method=PrefillMethod(), info=PrefillInfo())
    check_logits_finite(bool(np.isfinite(logits).all()), model.args, where="a one-token check at load",
                        dtype=dtype)


def load_speculator(speculator: Any, model: CausalLM, tokenizer: Any, dtype: str | None = None,
                    device: str | None = None) -> Any:
    """What a backend takes as speculator: "self:K" as is, a loaded model as is, a
    (model, tokenizer) pair or a path after checking that its tokenizer equals the main one."""
    if isinstance(speculator, str) and speculator.startswith("self:"):
        return speculator
    if isinstance(speculator, str):
        speculator = load(speculator, backend=model.backend, dtype=dtype, device=device)
    if isinstance(speculator, tuple):
        spec_model, spec_tokenizer = speculator
        if spec_tokenizer.vocab_fingerprint() != tokenizer.vocab_fingerprint():
            raise TokenizerMismatchError("the speculator's tokenizer differs from the main model's: "
                                         "speculative prefill needs identical vocabularies")
        return spec_model
    return speculator


def prefill_method(method: str = "full", *, h2o: H2OConfig | None = None,
                   specprefill: SpecPrefillConfig | None = None, speculator: Any = None) -> PrefillMethod:
    """The PrefillMethod for a method name, with default configs where none is given."""
    if method == "h2o":
        return PrefillMethod("h2o", h2o=h2o or H2OConfig())
    if method == "specprefill":
        if speculator is None:
            raise ConfigError("speculative prefill needs a speculator: a loaded model or 'self:K'")
        return PrefillMethod("specprefill", specprefill=specprefill or SpecPrefillConfig(), speculator=speculator)
    return PrefillMethod(method)


def stream_generate(model: CausalLM, tokenizer: Any, prompt: str | Sequence[int], max_tokens: int = 256, *,
                    temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                    method: str | PrefillMethod = "full", h2o: H2OConfig | None = None,
                    specprefill: SpecPrefillConfig | None = None, speculator: Any = None,
                    prompt_progress_callback: ProgressCallback | None = None,
                    prefill_info: PrefillInfo | None = None) -> Iterator[GenerationResponse]:
    """Yield a GenerationResponse per generated token (the prompt is used as given: apply the
    chat template first if you want one, as with mlx-lm).

    method: "full", "h2o" (settings in `h2o`) or "specprefill" (settings in `specprefill`,
    speculator "self:K", a path, a (model, tokenizer) pair or a loaded model; a path is loaded on
    every call with the backend's default dtype and device, so pass a loaded one (see
    load_speculator) when generating repeatedly or to choose its dtype).
    prefill_info: pass a PrefillInfo to receive what the prefill did (kept positions; H2O memory
    sets when its record_memory is set; timings).
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    check_sampling(temperature, top_p, seed)
    ids = prompt_ids(tokenizer.encode(prompt) if isinstance(prompt, str) else prompt, model.args.vocab_size)
    if not isinstance(method, PrefillMethod):
        warn_unused(method, h2o=h2o, specprefill=specprefill, speculator=speculator)
    if speculator is not None:
        speculator = load_speculator(speculator, model, tokenizer)
    plan = method if isinstance(method, PrefillMethod) else prefill_method(
        method, h2o=h2o, specprefill=specprefill, speculator=speculator)
    plan = fit_to_prompt(plan, len(ids), model.args.max_position_embeddings)
    info = prefill_info if prefill_info is not None else PrefillInfo()
    info.prompt_tokens = info.kept_tokens = len(ids)
    detokenizer = tokenizer.streaming_detokenizer()
    start = time.perf_counter()
    first_at = None
    steps = model.generate_step(ids, max_tokens=max_tokens, sampling=SamplingConfig(temperature, top_p, seed),
                                stop_ids=frozenset(tokenizer.eos_token_ids), method=plan, info=info,
                                progress=prompt_progress_callback)
    for n, token in enumerate(steps, start=1):
        now = time.perf_counter()
        if first_at is None:
            first_at = now
        stop = token in tokenizer.eos_token_ids
        finish = "stop" if stop else "length" if n == max_tokens else None
        text = "" if stop else detokenizer.add_token(token)
        if finish:
            text += detokenizer.finish()
        ttft = first_at - start
        yield GenerationResponse(
            text=text, token=token, prompt_tokens=len(ids), prompt_tps=len(ids) / max(ttft, 1e-9), ttft=ttft,
            kept_tokens=info.kept_tokens, generation_tokens=n,
            generation_tps=(n - 1) / (now - first_at) if n > 1 else 0.0,
            peak_memory=model.peak_memory_gb(), finish_reason=finish)
        if finish:
            return


def generate(model: CausalLM, tokenizer: Any, prompt: str | Sequence[int], max_tokens: int = 256, *,
             verbose: bool = False, **kwargs: Any) -> str:
    """The whole generated text; verbose streams it to stdout with mlx-lm-style statistics."""
    text, last = [], None
    for last in stream_generate(model, tokenizer, prompt, max_tokens, **kwargs):
        text.append(last.text)
        if verbose:
            print(last.text, end="", flush=True)
    if verbose and last is not None:
        print()
        print(format_stats(last), file=sys.stdout)
    return "".join(text)


def format_stats(last: GenerationResponse) -> str:
    """The closing lines, as mlx-lm prints them, plus TTFT and kept tokens."""
    lines = ["=" * 10,
             f"Prompt: {last.prompt_tokens} tokens, {last.prompt_tps:.3f} tokens-per-sec",
             f"TTFT: {last.ttft:.3f} s"]
    if last.kept_tokens != last.prompt_tokens:
        lines.append(f"Kept: {last.kept_tokens}/{last.prompt_tokens} prompt tokens "
                     f"({100.0 * last.kept_tokens / last.prompt_tokens:.1f}%)")
    lines += [f"Generation: {last.generation_tokens} tokens, {last.generation_tps:.3f} tokens-per-sec",
              f"Peak memory: {last.peak_memory:.3f} GB"]
    return "\n".join(lines)
