"""The one generation path: a loaded model, a built request (core/request.py) and a prompt -> a
GenerationResponse per token; and the statistics printed after them. The API's Session
(specfill/api.py), `specfill generate` and the server's engine run every generation through
stream_request."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Generator, Sequence

from specfill.core.decoding import LogitsProcessor
from specfill.core.plan import checked_ids, resolve_method
from specfill.core.request import GenerationRequest
from specfill.core.runtime import GenerationInfo, KVState, ProgressCallback
from specfill.core.text_units import with_text_units

if TYPE_CHECKING:
    from specfill.core.driver import CausalLM


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
    calibration_seconds: float = 0.0  # auto's calibration measured in this request: in ttft, not in prompt_tps


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Prompt text -> ids as mlx-lm encodes it: the tokenizer's special tokens (BOS) are added
    unless the text already starts with the BOS token (a chat template writing {{ bos_token }}),
    so a templated prompt never gets [bos, bos, ...]."""
    bos = None if tokenizer.bos_token_id is None else tokenizer.token_text(tokenizer.bos_token_id)
    return tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))


def calibrate_for_prompt(
    model: CausalLM,
    tokenizer: Any,
    ids: Sequence[int],
    request: GenerationRequest,
    announce: Callable[[str], None],
) -> None:
    """`specfill generate --method auto`: the calibrations stream_request's choice of method reads for
    the prompt `ids` (encode_prompt's: pass the same ids to stream_request), measured now where none is
    kept (`announce` gets a line before each), so that the wait is said and is not counted in the time
    to first token. It takes stream_request's steps to the method (the ids checked, their text units):
    the same calibration keys. A request on a model sharded over ranks calibrates in stream_request,
    where every rank's step is collected."""
    if model.distributed is not None or request.method.name != "auto":
        return
    ids = checked_ids(ids, request.max_tokens, model.args)  # a prompt the request refuses is refused first
    resolve_method(model, with_text_units(request.method, tokenizer, ids), len(ids), announce=announce)


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
    hidden_tokens: frozenset[int] = frozenset(),
) -> Generator[GenerationResponse, None, None]:
    """stream_generate for a built request (core/request.py) whose models are loaded (Session.prepare):
    the one generation path of the API's Session, the CLI and the server.
    logits_processors: host-side (ids so far, float32 logits [vocab]) -> logits, before each
    token is chosen (core/decoding.token_chooser; the server's constrained decoding).
    hidden_tokens: ids whose response text is "" (the server's control tokens: serve/reply_text.py)."""
    shared = model.distributed
    processors = tuple(logits_processors)
    if shared is None:
        yield from _stream_request(
            model, tokenizer, prompt, request, prompt_progress_callback, prefill_info, reuse, processors, hidden_tokens
        )
        return
    request = shared.collect(lambda: shared.check_request(request))
    info = prefill_info if prefill_info is not None else GenerationInfo()
    info.distributed = shared.describe()
    steps = _stream_request(
        model, tokenizer, prompt, request, prompt_progress_callback, info, reuse, processors, hidden_tokens
    )
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
    hidden_tokens: frozenset[int] = frozenset(),
) -> Generator[GenerationResponse, None, None]:
    ids = encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else prompt
    info = prefill_info if prefill_info is not None else GenerationInfo()
    detokenizer = tokenizer.streaming_detokenizer(hidden=hidden_tokens)
    start = time.perf_counter()
    first_at = None
    max_tokens = request.max_tokens
    method = with_text_units(request.method, tokenizer, ids)  # select_units text: the prompt's units, timed
    # the driver checks the ids (core/plan.check_token_ids) before it returns the steps
    steps = model.generate_step(
        ids,
        max_tokens=max_tokens,
        sampling=request.sampling,
        stop_ids=frozenset(tokenizer.eos_token_ids),
        method=method,
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
        calibration = info.seconds.get("auto_calibration", 0.0)  # once per machine: never as prefill speed
        yield GenerationResponse(
            text=text,
            token=token,
            prompt_tokens=n_prompt,
            prompt_tps=n_prompt / max(ttft - calibration, 1e-9),
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
            calibration_seconds=calibration,
        )
        if finish:
            return


def format_stats(last: GenerationResponse, requested: str = "") -> str:
    """The closing lines, as mlx-lm prints them, plus TTFT, the method and kept tokens (`requested`:
    the method asked for: "auto" is shown as "auto -> h2o")."""
    lines = [
        "=" * 10,
        f"Prompt: {last.prompt_tokens} tokens, {last.prompt_tps:.3f} tokens-per-sec",
        f"TTFT: {last.ttft:.3f} s",
    ]
    if last.calibration_seconds:
        lines[-1] += f" ({last.calibration_seconds:.1f} s of it auto's calibration on this machine, kept for later)"
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
