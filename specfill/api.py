"""The mlx-lm-style public API: load, generate, stream_generate — once for both backends."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generator, Sequence

import numpy as np

from specfill.core import H2OConfig, SpecPrefillConfig, TokenizerMismatchError
from specfill.core.checks import check_logits_finite
from specfill.core.decoding import LogitsProcessor
from specfill.core.request import GenerationRequest, build_request, prefill_method  # noqa: F401 (re-exported)
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, ProgressCallback

if TYPE_CHECKING:
    from specfill.core.backend import Backend
    from specfill.core.driver import CausalLM

DEFAULT_BACKEND_RULE = "mlx where MLX with Metal is importable (Apple silicon), else cuda (the torch backend)"


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
    from_draft: bool = False  # an accepted draft token (speculative decoding)
    drafted_tokens: int = 0  # draft proposals so far
    accepted_tokens: int = 0  # accepted proposals so far
    draft_seconds: float = 0.0  # time spent drafting so far
    verify_seconds: float = 0.0  # time the main model spent verifying drafts so far
    draft_skipped: str = ""  # why a draft model did not draft at all (its costs measured here say it cannot pay)
    distributed: str = ""  # "2 ranks, tensor" where the model is sharded over a group of processes
    compute: str = ""  # where, in what and on how many CPU threads it ran: "cpu, bfloat16, 2 threads"
    method: str = ""  # the prefill that ran: full, h2o, specprefill or specprefill+h2o ("auto" resolved)
    setup_seconds: float = 0.0  # one-time decode-step preparation (CUDA graph capture), not in generation_tps


def mlx_metal_available() -> bool:
    """True where MLX imports and has its Metal back-end (Apple silicon); False on MLX's Linux
    CPU build and where MLX is not installed. Imports mlx.core only, never a backend package."""
    try:
        import mlx.core as mx
    except ImportError:
        return False
    return bool(mx.metal.is_available())


def default_backend() -> str:
    """The backend used when none is named: see DEFAULT_BACKEND_RULE."""
    return "mlx" if mlx_metal_available() else "cuda"


def resolve_backend(backend: str | None) -> str:
    """`backend` by its one name ("torch" -> "cuda"), or the platform default for None."""
    from specfill.backends import canonical_name

    return default_backend() if backend is None else canonical_name(backend)


def get_backend(backend: str | None) -> Backend:
    """The Backend object (core/backend.py; None: the platform default), or a one-line error when the
    name is unknown. Its libraries are imported by its first call, which says when they are missing."""
    from specfill.backends import get_backend as registered

    return registered(resolve_backend(backend))


def choose_device(backend: str | None, device: str | None) -> tuple[str | None, str | None]:
    """The device to load `backend` (None: the default) on for a requested `device` (None: the
    backend's default), and the notice that goes with it: where the GPU the backend is for is missing,
    the default and that GPU both become "cpu" with a one-line notice (the CLI's generate and serve
    print it before loading); else `device` and None. The CPU fallback is decided here, once;
    BackendUnavailableError when the backend is unknown or not installed."""
    notice = get_backend(backend).cpu_fallback(device)
    return (device, None) if notice is None else ("cpu", notice)


def load(
    path: str | tuple[Any, Any] | None = None,
    backend: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    *,
    model_file: str | None = None,
    download: bool = False,
    group: Any = None,
    pipeline: bool = False,
) -> tuple[CausalLM, Any]:
    """(model, tokenizer) from a GGUF file, a Hugging Face / mlx-lm directory or a repo id.

    backend: "mlx" or "cuda"; None picks mlx where MLX with Metal is importable, else cuda.
    A path that does not exist locally and reads "owner/repo", "owner/repo:FILE.gguf" or
    "owner/repo:QUANT" resolves through huggingface_hub's cache (model_file names the GGUF file
    apart); download=True fetches it when not cached and HF_HUB_OFFLINE allows (core/io/hub.py).
    No path loads the bundled demo model (SmolLM2-135M-Instruct); "random:SHAPE" (e.g.
    "random:llama-1b") builds seeded random weights of a known shape, for benchmarks.
    group (mlx-lm's name; MLX only): an mx.distributed group (mx.distributed.init() under
    mlx.launch) of size > 1 shards an mlx-lm model over its ranks with mlx-lm's own code: tensor
    parallelism (Model.shard), or pipeline parallelism with pipeline=True (Model.model.pipeline);
    every rank calls load and generate alike (docs/backends.md, "Distributed (MLX)").
    """
    chosen = get_backend(backend)
    if isinstance(path, tuple):  # a (model, tokenizer) pair from mlx_lm.load: the backend adapts it
        resolved = path
    elif path is None:
        from specfill.core.io.demo_model import require_demo_model  # the demo run only

        resolved = str(require_demo_model())
    else:
        from specfill.core.io.hub import resolve_model  # a path or repo id given

        resolved = resolve_model(str(path), model_file, download)
    if group is None:
        model, tokenizer = chosen.load(resolved, dtype=dtype, device=device)
    else:
        model, tokenizer = chosen.load(resolved, dtype=dtype, device=device, group=group, pipeline=pipeline)
    if model.distributed is not None:
        model.distributed.collect(lambda: check_computes_finite(model, dtype))
    else:
        check_computes_finite(model, dtype)
    return model, tokenizer


def launched_group(backend: str | None) -> Any:
    """The process group this process was started in by its backend's launcher (mlx.launch, mpirun)
    when it has more than one rank, else None (the CLI's generate and serve pass it to load): the
    Backend object's launched_group (core/backend.py)."""
    return get_backend(backend).launched_group()


def check_computes_finite(model: CausalLM, dtype: str | None) -> None:
    """One token through the loaded model: a checkpoint that loads but computes NaN or Inf (finite
    weights whose products overflow float32, say) is a NonFiniteLogitsError here, not an end token
    later. Costs one decode step."""
    logits = model.prompt_logits([0], method=PrefillMethod(), info=GenerationInfo())
    check_logits_finite(bool(np.isfinite(logits).all()), model.args, where="a one-token check at load", dtype=dtype)


def load_speculator(
    speculator: Any,
    model: CausalLM,
    tokenizer: Any,
    dtype: str | None = None,
    device: str | None = None,
    role: str = "speculator",
) -> Any:
    """What a backend takes as speculator (or draft model: `role`): "self:K" as is, a loaded
    model as is, a (model, tokenizer) pair or a path after checking that its tokenizer equals the
    main one."""
    if isinstance(speculator, str) and speculator.startswith("self:"):
        return speculator
    if isinstance(speculator, str):
        speculator = load(speculator, backend=model.backend, dtype=dtype, device=device)
    if isinstance(speculator, tuple):
        spec_model, spec_tokenizer = speculator
        if spec_tokenizer.vocab_fingerprint() != tokenizer.vocab_fingerprint():
            raise TokenizerMismatchError(
                f"the {role}'s tokenizer differs from the main model's: they must share one vocabulary"
            )
        return spec_model
    return speculator


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Prompt text -> ids as mlx-lm encodes it: the tokenizer's special tokens (BOS) are added
    unless the text already starts with the BOS token (a chat template writing {{ bos_token }}),
    so a templated prompt never gets [bos, bos, ...]."""
    bos = None if tokenizer.bos_token_id is None else tokenizer.token_text(tokenizer.bos_token_id)
    return tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))


def load_request_models(
    request: GenerationRequest, model: CausalLM, tokenizer: Any, dtype: str | None = None, device: str | None = None
) -> GenerationRequest:
    """The request with its speculator and draft model loaded (load_speculator): paths become
    models on the main model's backend, checked against its tokenizer; "self:K" stays as is."""
    method, drafting = request.method, request.drafting
    if method.speculator is not None:
        method = replace(method, speculator=load_speculator(method.speculator, model, tokenizer, dtype, device))
    if drafting is not None and drafting.model is not None:
        drafting = replace(
            drafting, model=load_speculator(drafting.model, model, tokenizer, dtype, device, role="draft model")
        )
    return replace(request, method=method, drafting=drafting)


def stream_generate(
    model: CausalLM,
    tokenizer: Any,
    prompt: str | Sequence[int],
    max_tokens: int = 256,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    method: str | PrefillMethod = "full",
    h2o: H2OConfig | None = None,
    specprefill: SpecPrefillConfig | None = None,
    speculator: Any = None,
    auto_threshold: int | None = None,
    prompt_progress_callback: ProgressCallback | None = None,
    prefill_info: GenerationInfo | None = None,
    draft_model: Any = None,
    num_draft_tokens: int | None = None,
    reuse: KVState | None = None,
) -> Generator[GenerationResponse, None, None]:
    """Yield a GenerationResponse per generated token (the prompt is used as given: apply the
    chat template first if you want one, as with mlx-lm). top_k, min_p, *_penalty: core/sampling.py.

    method: "full", "h2o" (settings in `h2o`) or "specprefill" (settings in `specprefill`,
    speculator "self:K", a path, a (model, tokenizer) pair or a loaded model; a path is loaded on
    every call with the backend's default dtype and device, so pass a loaded one (see
    load_speculator) when generating repeatedly or to choose its dtype), or "auto" (full below
    the crossover length measured for this backend and device, or `auto_threshold` tokens).
    prefill_info: pass a GenerationInfo to receive what the prefill did (kept positions; H2O memory
    sets when its record_memory is set; timings; info.kv, the KV cache left behind).
    draft_model / num_draft_tokens (mlx-lm's names): speculative decoding with a draft model
    ("self:K", a path or a loaded model with the main model's tokenizer) proposing
    num_draft_tokens (default 3) per round; with method "specprefill", num_draft_tokens alone
    makes the speculator the draft, continuing from the prompt KV it already built.
    reuse: a KVState from an earlier generation's info.kv standing for a prefix of this prompt:
    only the rest is prefilled, with full attention, or with method "h2o" by H2O walked from the
    prefix (docs/methods.md, H2O from a reused prefix; see CausalLM.generate_step).
    Every setting is checked once, by core/request.build_request (the CLI and the server build
    the same request from their flags and fields).
    """
    request = build_request(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        top_k=top_k,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        method=method,
        h2o=h2o,
        specprefill=specprefill,
        speculator=speculator,
        auto_threshold=auto_threshold,
        draft_model=draft_model,
        num_draft_tokens=num_draft_tokens,
    )
    request = load_request_models(request, model, tokenizer)
    yield from stream_request(
        model,
        tokenizer,
        prompt,
        request,
        prompt_progress_callback=prompt_progress_callback,
        prefill_info=prefill_info,
        reuse=reuse,
    )


def stream_request(
    model: CausalLM,
    tokenizer: Any,
    prompt: str | Sequence[int],
    request: GenerationRequest,
    *,
    prompt_progress_callback: ProgressCallback | None = None,
    prefill_info: GenerationInfo | None = None,
    reuse: KVState | None = None,
    logits_processors: Sequence[LogitsProcessor] = (),
) -> Generator[GenerationResponse, None, None]:
    """stream_generate for a built request (core/request.py) whose models are loaded
    (load_request_models): the one generation path of the API, the CLI and the server.
    logits_processors: host-side (ids so far, float32 logits [vocab]) -> logits, before each
    token is chosen (core/decoding.token_chooser; the server's constrained decoding)."""
    shared = model.distributed
    processors = tuple(logits_processors)
    if shared is None:
        yield from _stream_request(
            model, tokenizer, prompt, request, prompt_progress_callback, prefill_info, reuse, processors
        )
        return
    request = shared.collect(lambda: shared.check_request(request))
    info = prefill_info if prefill_info is not None else GenerationInfo()
    info.distributed = shared.describe()
    steps = _stream_request(model, tokenizer, prompt, request, prompt_progress_callback, info, reuse, processors)
    try:
        while True:  # a rank that is gone ends this one with one line (DistributedError), not a traceback
            response = shared.collect(lambda: next(steps, None))
            if response is None:
                return
            yield replace(response, distributed=info.distributed)
    finally:
        steps.close()  # closed early (a stop string, a cancel): the driver's generator closes now too


def _stream_request(
    model: CausalLM,
    tokenizer: Any,
    prompt: str | Sequence[int],
    request: GenerationRequest,
    prompt_progress_callback: ProgressCallback | None,
    prefill_info: GenerationInfo | None,
    reuse: KVState | None,
    processors: tuple[LogitsProcessor, ...] = (),
) -> Generator[GenerationResponse, None, None]:
    ids = encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else prompt
    info = prefill_info if prefill_info is not None else GenerationInfo()
    detokenizer = tokenizer.streaming_detokenizer()
    start = time.perf_counter()
    first_at = None
    max_tokens = request.max_tokens
    # the driver checks the ids (core/runtime.check_token_ids) before it returns the steps
    steps = model.generate_step(
        ids,
        max_tokens=max_tokens,
        sampling=request.sampling,
        stop_ids=frozenset(tokenizer.eos_token_ids),
        method=request.method,
        info=info,
        progress=prompt_progress_callback,
        drafting=request.drafting,
        reuse=reuse,
        logits_processors=processors,
    )
    n_prompt = info.prompt_tokens
    compute = f"{model.device_name}, {str(model.dtype).rsplit('.', 1)[-1]}"
    if model.device_name == "cpu":
        threads = model.ops.compute_threads
        compute += f", {threads} thread{'s' if threads != 1 else ''}"
    for n, token in enumerate(steps, start=1):
        now = time.perf_counter()
        first_at = now if first_at is None else first_at
        stop = token in tokenizer.eos_token_ids
        finish = "stop" if stop else "length" if n == max_tokens else None
        text = "" if stop else detokenizer.add_token(token)
        if finish:
            text += detokenizer.finish()
        ttft, decode = first_at - start, info.decode
        setup = decode.seconds.get("setup", 0.0)  # graph capture: reported apart, never as decode speed
        yield GenerationResponse(
            text=text,
            token=token,
            prompt_tokens=n_prompt,
            prompt_tps=n_prompt / max(ttft, 1e-9),
            ttft=ttft,
            kept_tokens=info.kept_tokens,
            generation_tokens=n,
            generation_tps=(n - 1) / max(now - first_at - setup, 1e-9) if n > 1 else 0.0,
            peak_memory=model.peak_memory_gb(),
            finish_reason=finish,
            compute=compute,
            method=info.method,
            from_draft=bool(decode.from_draft and decode.from_draft[-1]),
            drafted_tokens=decode.drafted_tokens,
            accepted_tokens=decode.accepted_tokens,
            draft_seconds=decode.seconds.get("draft", 0.0),
            verify_seconds=decode.seconds.get("verify", 0.0),
            draft_skipped=decode.skipped,
            setup_seconds=setup,
        )
        if finish:
            return


def generate(
    model: CausalLM,
    tokenizer: Any,
    prompt: str | Sequence[int],
    max_tokens: int = 256,
    *,
    verbose: bool = False,
    **kwargs: Any,
) -> str:
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


def format_stats(last: GenerationResponse, requested: str = "") -> str:
    """The closing lines, as mlx-lm prints them, plus TTFT, the method and kept tokens (`requested`:
    the method asked for: "auto" is shown as "auto -> h2o")."""
    lines = [
        "=" * 10,
        f"Prompt: {last.prompt_tokens} tokens, {last.prompt_tps:.3f} tokens-per-sec",
        f"TTFT: {last.ttft:.3f} s",
    ]
    if last.method:
        asked = "auto -> " if requested == "auto" else ""
        lines.append(f"Method: {asked}{last.method}")
    if last.kept_tokens != last.prompt_tokens:
        lines.append(
            f"Kept: {last.kept_tokens}/{last.prompt_tokens} prompt tokens "
            f"({100.0 * last.kept_tokens / last.prompt_tokens:.1f}%)"
        )
    lines.append(f"Generation: {last.generation_tokens} tokens, {last.generation_tps:.3f} tokens-per-sec")
    if last.drafted_tokens:
        lines.append(
            f"Draft: {last.accepted_tokens}/{last.drafted_tokens} proposals accepted "
            f"({100.0 * last.accepted_tokens / last.drafted_tokens:.1f}%); drafting {last.draft_seconds:.3f} s, "
            f"verifying {last.verify_seconds:.3f} s"
        )
    elif last.draft_skipped:
        lines.append(f"Draft: {last.draft_skipped}")
    lines.append(f"Peak memory: {last.peak_memory:.3f} GB")
    if last.compute:
        lines.append(f"Compute: {last.compute}")
    if last.distributed:
        lines.append(f"Distributed: {last.distributed}")
    return "\n".join(lines)
