"""A `tokenizers.Tokenizer` rebuilt from GGUF metadata (a GGUF carries no tokenizer.json).

gpt2 vocabularies -> byte-level BPE, split by the regex llama.cpp uses for `tokenizer.ggml.pre`;
llama (SentencePiece) vocabularies -> BPE with byte fallback whose merges are ranked by the
merged piece's score, which is how llama.cpp's SPM tokenizer picks the next pair to join.
Token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .. import checks
from ..errors import ModelLoadError, SpecfillWarning

CONTROL, USER_DEFINED, BYTE = 3, 4, 6
SPM_SPACE = "\u2581"

# Splits of published tokenizers (the same regexes their tokenizer.json files hold).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_PRE = ("default", "gpt-2", "gpt2", "mpt", "olmo", "jais")
_SINGLE_DIGIT_GPT2_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_SPLIT_PRE = {
    "llama3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "stablelm2": _QWEN2_SPLIT,
}
# llama.cpp matches whole vocabulary words before merging for Llama 3 (tokenizer.json's
# "ignore_merges": true).
_IGNORE_MERGES_PRE = ("llama3", "llama-bpe", "llama-v3")


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre in _SPLIT_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PRE[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre in _SINGLE_DIGIT_GPT2_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre not in _GPT2_PRE:
        warnings.warn(
            f"GGUF pre-tokenizer {pre!r} is not known to specfill: splitting text with "
            f"the GPT-2 regex, so some prompts may tokenize differently from llama.cpp",
            SpecfillWarning,
            stacklevel=3,
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _gpt2_tokenizer(meta: Mapping[str, Any], tokens: list[str]) -> Tokenizer:
    merges = meta.get("tokenizer.ggml.merges")
    if not merges:
        raise ModelLoadError("GGUF gpt2 tokenizer has no tokenizer.ggml.merges")
    checks.typed_list(merges, str, "GGUF tokenizer.ggml.merges")
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ModelLoadError(f"GGUF merge {merge!r} is not two tokens separated by a space")
        pairs.append((left, right))
    pre = checks.text(meta.get("tokenizer.ggml.pre", "default"), "GGUF tokenizer.ggml.pre")
    vocab = {token: index for index, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in _IGNORE_MERGES_PRE))
    tok.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Every split of a normal piece into two pieces of the vocabulary, best piece score first
    (ties: the earlier piece, then the shorter left part)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for index, piece in enumerate(tokens):
        if types[index] != 1 or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], index, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _spm_tokenizer(meta: Mapping[str, Any], tokens: list[str], types: list[int]) -> Tokenizer:
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None or len(checks.typed_list(scores, float, "GGUF tokenizer.ggml.scores")) != len(tokens):
        raise ModelLoadError("GGUF llama (SentencePiece) tokenizer needs one score per token")
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    if unk_id is not None:
        checks.integer(unk_id, "GGUF tokenizer.ggml.unknown_token_id", maximum=len(tokens) - 1)
    vocab = {token: index for index, token in enumerate(tokens)}
    model = models.BPE(
        vocab=vocab,
        merges=spm_merges(tokens, scores, types),
        byte_fallback=True,
        fuse_unk=True,
        unk_token=tokens[unk_id] if unk_id is not None else None,
    )
    tok = Tokenizer(model)
    add_prefix = checks.flag(meta.get("tokenizer.ggml.add_space_prefix", True), "GGUF tokenizer.ggml.add_space_prefix")
    # As sentencepiece and llama.cpp: "▁" before every text segment (even one starting with a
    # space, unlike Metaspace), then spaces -> "▁"; no pre-splitting.
    steps = [normalizers.Prepend(SPM_SPACE)] if add_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPM_SPACE)])
    steps = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok


# Which tokens end a reply in a GGUF file: llama.cpp's rule (its src/llama-vocab.cpp, read 2026-12-04). Besides the
# ids the file declares (eos / eot / eom, and the fill-in-the-middle pad / repo / file-separator ids), every
# token spelled as one of these ends generation, because converters declare one id where the model has
# several ends: Qwen2.5's GGUFs declare <|im_end|> while its instruct models may end with <|endoftext|> (their
# generation_config.json lists both; seen with Qwen2.5-Coder-1.5B under Claude Code, which went on writing
# after it), and a coder model completing a file ends with <|file_sep|> or <|fim_pad|>.
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>",
        "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "</s>", "<eos>", "<turn|>", "<|tool_response>", "<end_of_utterance>",
        "<|return|>", "<|call|>", "<|calls|>", "<|flush|>",  # gpt-oss's harmony; Solar Open
        # fill-in-the-middle: pad, repository name, file separator
        "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
    }
)  # fmt: skip
FIM_KEYS = ("fim_pad", "fim_rep", "fim_sep")  # tokenizer.ggml.<key>_token_id: declared ends besides eos / eot / eom


def end_of_generation_ids(tokens: Sequence[str], types: Sequence[int] | None = None) -> list[int]:
    """The ids of a GGUF vocabulary (its token texts and types in id order; no types: all added) that end
    generation by their text. Only added tokens (control or user-defined) count: Qwen's vocabulary has "</s>"
    as a plain piece (HTML), which llama.cpp would turn into an end. As in llama.cpp: where harmony's
    <|return|> and <|call|> (or Solar Open's <|calls|> and <|flush|>) exist, <|end|> closes one message of a
    reply and is not an end; where Gemma 4's <|tool_response> exists, </s> is not an end."""
    added = [True] * len(tokens) if types is None else [kind in (CONTROL, USER_DEFINED) for kind in types]
    found = {text: i for i, text in enumerate(tokens) if text in END_OF_GENERATION_TEXTS and added[i]}
    if {"<|return|>", "<|call|>"} <= found.keys() or {"<|calls|>", "<|flush|>"} <= found.keys():
        found.pop("<|end|>", None)
    if "<|tool_response>" in found:
        found.pop("</s>", None)
    return sorted(found.values())


def tokenizer_from_gguf_metadata(meta: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer a GGUF's `tokenizer.ggml.*` keys describe, with control tokens (type 3)
    added as special tokens and user-defined ones (type 4) as whole, non-special tokens."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise ModelLoadError("GGUF metadata has no tokenizer (tokenizer.ggml.model / tokens)")
    checks.typed_list(tokens, str, "GGUF tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    types = [1] * len(tokens) if types is None else checks.typed_list(types, int, "GGUF tokenizer.ggml.token_type")
    if len(types) != len(tokens):
        raise ModelLoadError(f"GGUF tokenizer has {len(tokens)} tokens but {len(types)} token types")
    if kind not in ("gpt2", "llama"):
        raise ModelLoadError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    try:
        tok = _gpt2_tokenizer(meta, tokens) if kind == "gpt2" else _spm_tokenizer(meta, tokens, types)
        tok.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t, kind_ in zip(tokens, types) if kind_ == CONTROL]
        )
        tok.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t, kind_ in zip(tokens, types) if kind_ == USER_DEFINED]
        )
    except ModelLoadError:
        raise
    except Exception as err:  # the Rust library raises plain Exception (e.g. a merge of unknown tokens)
        raise ModelLoadError(f"GGUF tokenizer is invalid: {str(err).splitlines()[0]!r}") from None
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ModelLoadError(
            f"GGUF tokenizer has duplicate tokens: {len(tokens)} entries, "
            f"{tok.get_vocab_size(with_added_tokens=True)} distinct"
        )
    return tok
