"""The public API, once for both backends: `open` -> Session (one loaded model and its generations:
the request path of the API, `specfill generate` and the server's loading), and mlx-lm's functions
load, generate and stream_generate, which go through a Session too."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Generator, Sequence

import numpy as np

from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig, TokenizerMismatchError
from specfill.core.checks import check_logits_finite
from specfill.core.decoding import LogitsProcessor
from specfill.core.request import GenerationRequest, build_request, prefill_method  # noqa: F401 (re-exported)
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, ProgressCallback
from specfill.generation import (  # noqa: F401 (re-exported: the generation path's names as the API has them)
    GenerationResponse,
    encode_prompt,
    format_stats,
    stream_request,
)

if TYPE_CHECKING:
    from specfill.core.backend import Backend
    from specfill.core.driver import CausalLM

DEFAULT_BACKEND_RULE = "mlx where MLX with Metal is importable (Apple silicon), else cuda (the torch backend)"


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
    loaded: dict[str, Any] | None = None,
) -> Any:
    """What a backend takes as speculator (or draft model: `role`): "self:K" as is, a loaded
    model as is, a (model, tokenizer) pair or a path after checking that its tokenizer equals the
    main one. loaded: path -> (model, tokenizer) loaded before (a Session's), a path loaded once."""
    if isinstance(speculator, str) and speculator.startswith("self:"):
        return speculator
    if isinstance(speculator, str):
        loaded = {} if loaded is None else loaded
        if speculator not in loaded:
            loaded[speculator] = load(speculator, backend=model.backend, dtype=dtype, device=device)
        speculator = loaded[speculator]
    if isinstance(speculator, tuple):
        spec_model, spec_tokenizer = speculator
        if spec_tokenizer.vocab_fingerprint() != tokenizer.vocab_fingerprint():
            raise TokenizerMismatchError(
                f"the {role}'s tokenizer differs from the main model's: they must share one vocabulary"
            )
        return spec_model
    return speculator


@dataclass
class Session:
    """One loaded model and what its generations share: the dtype and device it was loaded with, a
    speculator and a draft model loaded once, and the one generation path (generation.stream_request).
    Made by `open`; Session(model, tokenizer) wraps a model loaded otherwise (stream_generate does).

    stream(prompt, **settings) takes stream_generate's keywords (max_tokens, method, h2o, ...), or a
    request built already (core/request.build_request, as the CLI builds it from its flags)."""

    model: CausalLM
    tokenizer: Any
    dtype: str | None = None
    device: str | None = None
    speculator: Any = None  # for methods specprefill and auto when the settings name none
    draft_model: Any = None  # drafts (speculative decoding) when the settings name no draft model
    notice: str | None = None  # why it runs on the CPU (choose_device), None where it does not fall back
    loaded: dict[str, Any] = field(default_factory=dict, repr=False)  # path -> (model, tokenizer), loaded once

    @property
    def leads(self) -> bool:
        """Whether this process reports: the only one, or rank 0 of those a model is sharded over."""
        shared = self.model.distributed
        return shared is None or shared.rank == 0

    def request(self, **settings: Any) -> GenerationRequest:
        """build_request(**settings) with this session's speculator and draft model where the settings
        name none, its models loaded (prepare)."""
        named = settings.get("method") in ("specprefill", "auto")  # the methods a speculator serves
        if self.speculator is not None and named and settings.get("speculator") is None:
            settings["speculator"] = self.speculator
        if self.draft_model is not None and settings.get("draft_model") is None:
            settings["draft_model"] = self.draft_model
        return self.prepare(build_request(**settings))

    def load_speculator(self, speculator: Any, role: str = "speculator") -> Any:
        """A speculator or draft model (`role`) for this session's model: load_speculator in its dtype
        and on its device, a path loaded once per session."""
        return load_speculator(speculator, self.model, self.tokenizer, self.dtype, self.device, role, self.loaded)

    def prepare(self, request: GenerationRequest) -> GenerationRequest:
        """The request with its speculator and draft model loaded (self.load_speculator: paths become
        models on the main model's backend, checked against its tokenizer; "self:K" stays as is)."""
        method, drafting = request.method, request.drafting
        if method.speculator is not None:
            method = replace(method, speculator=self.load_speculator(method.speculator))
        if drafting is not None and drafting.model is not None:
            drafting = replace(drafting, model=self.load_speculator(drafting.model, "draft model"))
        return replace(request, method=method, drafting=drafting)

    def stream(
        self,
        prompt: str | Sequence[int],
        request: GenerationRequest | None = None,
        *,
        prompt_progress_callback: ProgressCallback | None = None,
        prefill_info: GenerationInfo | None = None,
        reuse: KVState | None = None,
        logits_processors: Sequence[LogitsProcessor] = (),
        hidden_tokens: frozenset[int] = frozenset(),
        **settings: Any,
    ) -> Generator[GenerationResponse, None, None]:
        """A GenerationResponse per generated token (stream_generate's, which see for the keywords);
        `prompt` as given (text gets the BOS rule of encode_prompt, no chat template); hidden_tokens:
        ids that write no text (stream_request's)."""
        if request is not None and settings:
            raise ConfigError(f"give a built request or settings, not both (settings given: {', '.join(settings)})")
        request = self.request(**settings) if request is None else self.prepare(request)
        yield from stream_request(
            self.model,
            self.tokenizer,
            prompt,
            request,
            prompt_progress_callback=prompt_progress_callback,
            prefill_info=prefill_info,
            reuse=reuse,
            logits_processors=logits_processors,
            hidden_tokens=hidden_tokens,
        )

    def generate(
        self, prompt: str | Sequence[int], request: GenerationRequest | None = None, *, verbose: bool = False, **kw: Any
    ) -> str:
        """The whole generated text; verbose streams it to stdout with mlx-lm-style statistics."""
        text, last = [], None
        for last in self.stream(prompt, request, **kw):
            text.append(last.text)
            if verbose:
                print(last.text, end="", flush=True)
        if verbose and last is not None:
            print()
            print(format_stats(last), file=sys.stdout)
        return "".join(text)


def open(
    path: str | tuple[Any, Any] | None = None,
    *,
    backend: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    speculator: Any = None,
    draft_model: Any = None,
    model_file: str | None = None,
    download: bool = False,
    pipeline: bool = False,
    prefill_step_size: int | None = None,
    notify: Callable[[str], None] | None = None,
) -> Session:
    """A Session of the model at `path` (load's paths; None: the demo model) on `backend` (None: the
    platform rule, DEFAULT_BACKEND_RULE), on `device` (choose_device: the CPU, with a notice, where the
    backend's GPU is missing; `notify` gets the notice before the model loads, session.notice keeps it),
    sharded over the ranks its launcher started (launched_group: mlx.launch; pipeline: by layers, else by
    heads), with `speculator` and `draft_model` ("self:K", a path or a loaded model) loaded once beside it.
    prefill_step_size: tokens per full-prefill step of the model and a loaded speculator (None: the
    backend's, core/backend.DEFAULT_PREFILL_STEP_SIZE, longer on a CUDA GPU with room for it:
    backends/torch_cuda/loader.device_prefill_step)."""
    name = resolve_backend(backend)
    device, notice = choose_device(name, device)  # unknown or not installed: one clear error
    if notice is not None and notify is not None:
        notify(notice)
    if path is None and model_file is not None:
        raise ConfigError("--model-file (API: model_file=) needs --model owner/repo (API: a repo id path)")
    if prefill_step_size is not None and (not isinstance(prefill_step_size, int) or prefill_step_size < 1):
        raise ConfigError(f"prefill_step_size must be an integer >= 1, got {prefill_step_size!r}")
    group = launched_group(name)  # under mlx.launch: the model is sharded over the ranks
    if pipeline and group is None:
        raise ConfigError(
            "--pipeline (API: pipeline=True) shards the model over the ranks mlx.launch starts: "
            "run under mlx.launch with more than one rank"
        )
    model, tokenizer = load(
        path, name, dtype, device, model_file=model_file, download=download, group=group, pipeline=pipeline
    )
    session = Session(model, tokenizer, dtype, device, notice=notice)
    if speculator is not None:
        session.speculator = session.load_speculator(speculator)
    if draft_model is not None:
        session.draft_model = session.load_speculator(draft_model, "draft model")
    if prefill_step_size is not None:  # progress and cancellation granularity too (the server's)
        each: Any
        for each in (model, session.speculator, session.draft_model):
            if each is not None and not isinstance(each, str):  # "self:K" steps as the model does
                each.prefill_step_size = prefill_step_size
    return session


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
    every call with the backend's default dtype and device, so open a Session (`open`: loaded once)
    or pass a loaded one (see load_speculator) when generating repeatedly), or "auto" (full below
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
    session = Session(model, tokenizer)  # a path speculator or draft model is loaded by this call
    yield from session.stream(
        prompt, request, prompt_progress_callback=prompt_progress_callback, prefill_info=prefill_info, reuse=reuse
    )


def generate(
    model: CausalLM,
    tokenizer: Any,
    prompt: str | Sequence[int],
    max_tokens: int = 256,
    *,
    verbose: bool = False,
    **kwargs: Any,
) -> str:
    """The whole generated text; verbose streams it to stdout with mlx-lm-style statistics (Session.generate)."""
    return Session(model, tokenizer).generate(prompt, max_tokens=max_tokens, verbose=verbose, **kwargs)
