"""SpecPrefill's text units (SpecPrefillConfig.select_units "text"): where a prompt's own segments
start, from its tokens' text, so the selection keeps or drops pieces whose boundaries follow the
prompt's lines and paragraphs rather than fixed chunks that cut across them (issue 47: the 1.5B
misread HotpotQA contexts cut into 32-token pieces across documents).

The rule (pure, on the tokens' texts):
- a line ends after a token whose text holds a line break;
- a paragraph ends after a line that is blank or whose break is doubled ("\\n\\n": a blank line
  follows), and at the prompt's end;
- a unit is a paragraph, when it holds at most `max_tokens` tokens; a longer paragraph is cut
  between lines, whole lines packed into units of at most max_tokens; a line longer than that
  alone is cut every max_tokens tokens.
SpecPrefill's text units hold at most select_chunk tokens (max_tokens): chunks whose boundaries
follow the text, so a unit never runs across a paragraph's end or a line that does not fit it
(larger units, whole paragraphs up to 8 chunks, lost variable-tracking chains on the selection
proxy: research/selection_units).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from .config import SpecPrefillConfig
from .runtime import PrefillMethod


def _lines(pieces: Sequence[str]) -> list[tuple[int, int, bool]]:
    """(start, end, ends_paragraph) of each line of the tokens' texts, in order."""
    lines, start = [], 0
    for i, piece in enumerate(pieces):
        if "\n" in piece:
            blank = not "".join(pieces[start : i + 1]).strip()
            lines.append((start, i + 1, blank or "\n\n" in piece))
            start = i + 1
    if start < len(pieces):
        lines.append((start, len(pieces), True))
    elif lines:
        lines[-1] = (lines[-1][0], lines[-1][1], True)
    return lines


def text_unit_starts(pieces: Sequence[str], max_tokens: int) -> tuple[int, ...]:
    """The start of every text unit of a prompt whose tokens' texts are `pieces` (the module's
    rule), ascending from 0; () for an empty prompt."""
    if max_tokens < 1:
        raise ValueError(f"a text unit holds at least one token, got max_tokens={max_tokens}")
    starts: list[int] = []
    unit_start, unit_open = 0, False
    for start, end, ends_paragraph in _lines(pieces):
        if unit_open and end - unit_start > max_tokens:  # the line does not fit the open unit
            unit_open = False
        if not unit_open:
            starts.append(start)
            unit_start, unit_open = start, True
        while end - unit_start > max_tokens:  # a line longer than a unit: cut every max_tokens
            unit_start += max_tokens
            starts.append(unit_start)
        if ends_paragraph:
            unit_open = False
    return tuple(starts)


def token_pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's own text (tokenizer.decode of the one id; a byte of a multi-byte character
    decodes to a replacement mark, which holds no line break), each id decoded once."""
    texts: dict[int, str] = {}
    pieces = []
    for token in ids:
        token = int(token)
        if token not in texts:
            texts[token] = tokenizer.decode([token])
        pieces.append(texts[token])
    return pieces


def with_text_units(method: PrefillMethod, tokenizer: Any, ids: Sequence[int]) -> PrefillMethod:
    """`method` with its SpecPrefill config's unit_starts filled from the prompt `ids` when it
    selects text units and none are given (the front end's step: it has the tokenizer)."""
    if method.specprefill is None:
        return method
    config = with_text_units_config(method.specprefill, tokenizer, ids)
    return method if config is method.specprefill else replace(method, specprefill=config)


def with_text_units_config(config: SpecPrefillConfig, tokenizer: Any, ids: Sequence[int]) -> SpecPrefillConfig:
    """`config` with the unit starts of the prompt `ids` when it selects text units and has none
    (with_text_units' step on a config; the same config otherwise)."""
    if config.select_units != "text" or config.unit_starts:
        return config
    starts = text_unit_starts(token_pieces(tokenizer, ids), config.select_chunk)
    return replace(config, unit_starts=starts or (0,))
