"""The tokenizer of a GGUF file or a HF directory, torch-free (the `tokenizers` library), with
the model's chat template and a streaming detokenizer.

`load_tokenizer(path)` takes the same path as `load_weights`. encode(add_special_tokens=True)
adds BOS/EOS exactly as the checkpoint asks (GGUF `tokenizer.ggml.add_bos_token`, or the
tokenizer.json post-processor / tokenizer_config.json flags).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, pre_tokenizers, processors

from .. import checks
from ..errors import ChatTemplateError, ModelLoadError, quote
from .chat_template import render_chat_template
from .gguf_file import existing_path
from .gguf_tokenizer import FIM_KEYS, end_of_generation_ids, tokenizer_from_gguf_metadata
from .random_model import is_random_model, random_model_args
from .weights import read_gguf_metadata, read_json_object


class Tokenizer:
    """Text <-> ids for one model. `backend` is the underlying tokenizers.Tokenizer."""

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        chat_template: str | None,
        name: str = "",
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        eos = [int(i) for i in eos_token_ids]
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self._eos_token_id = eos[0] if eos else None  # the one templates spell as eos_token
        self.chat_template = chat_template
        self.name = name

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], name: str = "") -> "Tokenizer":
        """From GGUF key/values as plain Python values (see weights.read_gguf_metadata); every
        key it reads is type-checked and every special id must name a token."""
        backend = tokenizer_from_gguf_metadata(meta)
        vocab = backend.get_vocab_size(with_added_tokens=True)

        def token_id(key: str) -> int | None:
            value = meta.get(key)
            return None if value is None else checks.integer(value, f"GGUF {key}", maximum=vocab - 1)

        def flag(key: str, default: bool) -> bool:
            return checks.flag(meta.get(key, default), f"GGUF {key}")

        bos = token_id("tokenizer.ggml.bos_token_id")

        def declared(*kinds: str) -> list[int]:
            return [i for k in kinds if (i := token_id(f"tokenizer.ggml.{k}_token_id")) is not None]

        ends = declared("eos", "eot", "eom")  # the first: the template's eos_token, add_eos_token's id
        by_text = end_of_generation_ids(meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type"))
        eos = list(dict.fromkeys([*ends, *declared(*FIM_KEYS), *by_text]))
        default_bos = meta.get("tokenizer.ggml.model") == "llama"  # llama.cpp's SPM default
        _set_special_token_insertion(
            backend,
            bos if flag("tokenizer.ggml.add_bos_token", default_bos) else None,
            ends[0] if ends and flag("tokenizer.ggml.add_eos_token", False) else None,
        )
        template = meta.get("tokenizer.chat_template")
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_ids=eos,
            name=name,
            chat_template=None if template is None else checks.text(template, "GGUF tokenizer.chat_template"),
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    @property
    def special_token_ids(self) -> frozenset[int]:
        """The control tokens: added tokens marked special (a GGUF's CONTROL type), the ones
        `skip_special_tokens` leaves out; user-defined added tokens are not among them."""
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt string for a conversation (encode it with add_special_tokens=False when
        the template writes BOS itself, as transformers does). tools: JSON schemas of functions
        ({"type": "function", "function": {...}}), given to the template as transformers gives them:
        `tools` is None when there are none (templates test `tools is not none`); messages may carry
        an assistant's `tool_calls` and a tool result's `tool_call_id`, which the template reads."""
        if not self.chat_template:
            model = f"model {self.name}" if self.name else "the model"
            raise ChatTemplateError(f"{model} has no chat template: pass a plain prompt instead of chat messages")
        specials = {"bos_token": self._text(self.bos_token_id), "eos_token": self._text(self._eos_token_id)}
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=specials,
            tools=None if tools is None else list(tools),
            **extra,
        )

    def vocab_fingerprint(self) -> str:
        """Hash of the id -> token map and of which ids are special. Two tokenizers with the
        same fingerprint give every id the same meaning, whatever file format they came from
        (merge lists are left out: a GGUF SentencePiece vocabulary stores none)."""
        digest = hashlib.sha256()
        vocab = self.backend.get_vocab(with_added_tokens=True)
        for token, index in sorted(vocab.items(), key=lambda item: item[1]):
            digest.update(f"{index}\t{token}\n".encode("utf-8", errors="surrogatepass"))
        special = sorted(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)
        digest.update(("special:" + ",".join(map(str, special))).encode())
        return digest.hexdigest()[:32]

    def streaming_detokenizer(
        self, skip_special_tokens: bool = False, hidden: frozenset[int] = frozenset()
    ) -> "StreamingDetokenizer":
        return StreamingDetokenizer(self, skip_special_tokens=skip_special_tokens, hidden=hidden)

    def _text(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)


class StreamingDetokenizer:
    """Turns ids arriving one at a time into text pieces whose concatenation equals
    decode(all ids but the hidden ones). Text is held back while it ends in an incomplete UTF-8
    sequence (U+FFFD); each step decodes only the ids since the last complete piece.
    hidden: ids that write no text (the server's control tokens: serve/reply_text.py)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False, hidden: frozenset[int] = frozenset()):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._hidden = hidden
        self.ids: list[int] = []  # the ids that write text
        self._prefix = 0  # start of the decode window (its text was emitted already)
        self._read = 0  # ids before this have been emitted

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def add_token(self, token_id: int) -> str:
        """The text that became printable with this id ('' while a character is incomplete, or for
        a hidden id)."""
        if token_id in self._hidden:
            return ""
        self.ids.append(int(token_id))
        done = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(done) :]

    def finish(self) -> str:
        """Whatever is still held back (an incomplete character decodes to U+FFFD)."""
        done = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return text[len(done) :]


def _set_special_token_insertion(backend: BackendTokenizer, bos_id: int | None, eos_id: int | None) -> None:
    """A post-processor adding BOS before and/or EOS after the text (plain text if neither)."""
    pieces = [(backend.id_to_token(i), i) for i in (bos_id, eos_id) if i is not None]
    single = " ".join(
        ([f"{pieces[0][0]}:0"] if bos_id is not None else [])
        + ["$A:0"]
        + ([f"{backend.id_to_token(eos_id)}:0"] if eos_id is not None else [])
    )
    pair = single + " $B:1"
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=pieces)


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json spells a special token as a string or as {"content": ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any, what: str, vocab: int) -> list[int]:
    """A token id or a list of them (config.json / generation_config.json eos_token_id)."""
    if value is None:
        return []
    return [checks.integer(v, what, maximum=vocab - 1) for v in (value if isinstance(value, list) else [value])]


def _hf_chat_template(directory: Path, config: Mapping[str, Any]) -> str | None:
    """chat_template.jinja, else tokenizer_config.json's chat_template (a string or a list of
    named templates: the "default" one), else chat_template.json."""
    if (directory / "chat_template.jinja").is_file():
        try:
            return (directory / "chat_template.jinja").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ModelLoadError(f"cannot read {directory / 'chat_template.jinja'}: {err}") from None
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if template is None and (directory / "chat_template.json").is_file():
        template = read_json_object(directory / "chat_template.json").get("chat_template")
    return template if isinstance(template, str) else None


def _from_hf_directory(directory: Path) -> Tokenizer:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(
            f"{quote(directory)} has no tokenizer.json (a sentencepiece-only tokenizer.model is not supported)"
        )
    try:
        backend = BackendTokenizer.from_file(str(path))
    except Exception as err:  # the Rust library raises plain Exception for any parse error
        raise ModelLoadError(f"cannot read {quote(path)}: {str(err).splitlines()[0]}") from None
    config = (
        read_json_object(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").is_file() else {}
    )
    model_config = read_json_object(directory / "config.json") if (directory / "config.json").is_file() else {}
    generation = (
        read_json_object(directory / "generation_config.json")
        if (directory / "generation_config.json").is_file()
        else {}
    )

    def token_id(key: str) -> int | None:
        text = _token_content(config.get(key))
        return None if text is None else backend.token_to_id(text)

    vocab = backend.get_vocab_size(with_added_tokens=True)
    bos = token_id("bos_token")
    if bos is None:
        bos = next(iter(_ids(model_config.get("bos_token_id"), "config.json bos_token_id", vocab)), None)
    eos = [
        i
        for i in [
            token_id("eos_token"),
            *_ids(generation.get("eos_token_id"), "generation_config.json eos_token_id", vocab),
            *_ids(model_config.get("eos_token_id"), "config.json eos_token_id", vocab),
        ]
        if i is not None
    ]
    eos = list(dict.fromkeys(eos))  # keep order: the tokenizer's own eos first
    if "add_bos_token" in config or "add_eos_token" in config:  # the flags override the file
        _set_special_token_insertion(
            backend,
            bos if config.get("add_bos_token") else None,
            eos[0] if eos and config.get("add_eos_token") else None,
        )
    return Tokenizer(
        backend,
        bos_token_id=bos,
        eos_token_ids=eos,
        chat_template=_hf_chat_template(directory, config),
        name=directory.name,
    )


def id_tokenizer(vocab_size: int, name: str = "") -> Tokenizer:
    """The tokenizer of random-weight models: text is space-separated ids (an unknown word reads
    as id 0), no BOS/EOS, no chat template."""
    backend = BackendTokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token="0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend, bos_token_id=None, eos_token_ids=(), chat_template=None, name=name)


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer of a GGUF file or of a HF model directory (tokenizer.json); for
    "random:NAME" ids written as text (see core.io.random_model)."""
    if is_random_model(path):
        return id_tokenizer(random_model_args(path).vocab_size, name=str(path))
    path = existing_path(path)
    if path.is_dir():
        return _from_hf_directory(path)
    return Tokenizer.from_gguf_metadata(read_gguf_metadata(path), name=path.name)
