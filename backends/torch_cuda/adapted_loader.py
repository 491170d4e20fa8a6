"""Loading transformers models into specfill: a transformers directory (or a repo id in the Hugging
Face cache, resolved to its snapshot directory by core/io/hub.py) of an architecture specfill has
no model file for becomes a CausalLM whose layers' attention the adapter runs (adapted.py) and
whose everything else is transformers' own code.

Routing (loader.load, which imports this module only for such a model): a directory whose config.json names a
model_type of specfill's own
families (llama, mistral, qwen2, qwen3, gemma3_text) loads into specfill's model as before; any
other model_type that the installed transformers knows loads with AutoModelForCausalLM. A GGUF
file of another architecture than specfill's own (llama, qwen2, qwen3, gemma3) loads through
transformers' GGUF support (`gguf_file=`: dequantized to `dtype`), its tokenizer by specfill's
GGUF reader.
"""

from __future__ import annotations

import io
import warnings
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any, Iterator

import torch

from specfill.backends.tokenizer_source import tokenizer_directory
from specfill.core.driver import CausalLM
from specfill.core.errors import ModelLoadError, quote
from specfill.core.io.tokenizer import Tokenizer, load_tokenizer

from .ops import TorchOps


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' log records below errors, its progress bars, and what it writes to stderr
    itself (the GGUF conversion's tqdm bar) are dropped: specfill says what went wrong in one line
    (a load report listing missing weights, a config dump or a warning came before it)."""
    from transformers.utils import logging

    shown, level = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        with redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(level)
        if shown:
            logging.enable_progress_bar()


def _from_pretrained(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' model of a directory, or of a GGUF file (`gguf_file=` beside its folder),
    without transformers' output (specfill's CLI prints its own progress). A checkpoint without
    some of the model's weights is refused (transformers would initialise them at random)."""
    from transformers import AutoModelForCausalLM

    with _quiet_transformers():
        if path.is_file():
            lm, info = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=dtype, local_files_only=True, output_loading_info=True
            )
        else:
            lm, info = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, local_files_only=True, output_loading_info=True
            )
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ValueError(f"{len(missing)} weights are missing from the checkpoint ({', '.join(missing[:3])}, ...)")
    return lm


def _tokenizer_source(tokenizer: Any) -> Path:
    """The directory a transformers tokenizer was read from: specfill reads its own tokenizer there."""
    return tokenizer_directory(
        tokenizer, "pass transformers' (model, AutoTokenizer.from_pretrained(dir)) or load the directory"
    )


def load_pair(
    pair: tuple[Any, Any],
    dtype: torch.dtype,
    device: torch.device,
    prefill_step_size: int,
    use_kernels: bool | None = None,
) -> tuple[CausalLM, Tokenizer]:
    """(CausalLM, specfill Tokenizer) from a (transformers model, its tokenizer) pair, any family
    (specfill's own five included: the adapter then runs transformers' model). The model is moved
    to `device` and `dtype` in place."""
    from transformers import PreTrainedModel

    from .adapted import adapt

    lm, tokenizer = pair
    if not isinstance(lm, PreTrainedModel):
        raise ModelLoadError(f"expected a transformers model (PreTrainedModel), got {type(lm).__name__}")
    directory = _tokenizer_source(tokenizer)
    model = adapt(lm.to(device=device, dtype=dtype))
    return CausalLM(model, TorchOps(device, dtype, use_kernels), prefill_step_size=prefill_step_size), load_tokenizer(
        directory
    )


def load_adapted(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    prefill_step_size: int,
    use_kernels: bool | None = None,
    *,
    architecture: str | None = None,
) -> tuple[CausalLM, Tokenizer]:
    """(CausalLM, specfill Tokenizer) from a transformers directory or a GGUF file:
    AutoModelForCausalLM reads it in `dtype` (offline: no download here), moved to `device`, then
    adapted; the tokenizer is specfill's own reader's (tokenizer.json, or the GGUF's metadata).
    architecture: the model_type or GGUF architecture that routed it here (loader.py), for errors."""
    from .adapted import adapt  # here: `specfill generate` on an own family never imports it

    path = Path(path)
    try:
        lm = _from_pretrained(path, dtype)
    except Exception as err:  # transformers raises ValueError, OSError, KeyError, ...
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ModelLoadError(
            f"{quote(path)}: unsupported architecture {architecture!r} for specfill's own models, and "
            f"transformers could not load it: {first}"
        ) from None
    model = adapt(lm.to(device))
    ops = TorchOps(device, dtype, use_kernels)
    return CausalLM(model, ops, prefill_step_size=prefill_step_size), load_tokenizer(path)
