"""Constrained decoding: a ReplyGrammar's automaton (json_grammar.py) as a mask over the
tokenizer's vocabulary, and the logits processors that apply it during decoding (ConstrainedReply:
the whole reply; LazyReply: each call from its opening on, the text around the calls free).

Each token's text is decoded once per tokenizer (Vocabulary). A mask is the tokens whose whole
text the automaton can read from the current state: the tokens sorted by text form an implicit
trie, walked from the state with the automaton's steps (memoised by (state, character)), a
prefix range at a time (bisect), so a state that takes a few characters (a key, a ':', a digit)
looks at a few ranges only. In a string's text every token without a quote, backslash or control
character fits (a precomputed boolean array, cut by length where maxLength counts); only the
others are walked; in a Qwen3-Coder parameter's text every token without a new line fits, the
others are walked. Masks are cached per automaton state (states are hashable), so a state seen
before costs a dictionary lookup. Special tokens (the tokenizer's added special tokens) fit only
where the grammar has their text literally (a call's markers: `</tool_call>`, harmony's
`<|message|>`), never inside a JSON string; EOS fits once the grammar is complete, and then alone.

A quick check on a synthetic vocabulary of 150,000 tokens (random 1-8 character words, 5% with a
quote, brace or new line), on one shared CPU core: the vocabulary table ~1.3 s once per server;
a string-text state's mask ~50 ms the first time, a structural state's 0.1-5 ms; a state seen
before ~0.01 ms, plus applying the mask (np.where over the logits, ~0.5 ms) per decode step.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from .json_grammar import Lit, State
from .reply_grammar import Automaton, ReplyGrammar, automaton

QUOTED = re.compile(r'["\\\x00-\x1f]')  # what ends or escapes a JSON string's text, or may not be in it
MASKS_KEPT = 256  # masks cached per constraint (a 150K vocabulary: 150 KB each)
STEPS_KEPT = 1 << 20  # memoised automaton steps per constraint before the memo starts over


class Vocabulary:
    """Each token's text, sorted for the walk; special tokens and EOS apart.

    texts: by id ("" for a token that never fits); special: ids of special tokens (markers);
    eos: the ids that end the reply."""

    def __init__(self, texts: Sequence[str], special: Sequence[int], eos: Sequence[int]):
        self.size = len(texts)
        self.texts = list(texts)
        self.specials = specials = frozenset(special)
        normal = sorted((t, i) for i, t in enumerate(texts) if t and i not in specials)
        self.strings = [t for t, _ in normal]
        self.ids = [i for _, i in normal]
        self.lengths = np.zeros(self.size, dtype=np.int64)
        for t, i in normal:
            self.lengths[i] = len(t)
        # free text (reply_grammar's Automaton.in_text): (the tokens that fit whole, the others,
        # sorted for the walk) in a JSON string, and in a Qwen3-Coder parameter's text
        self.free_text = {
            "json": self._split(normal, lambda t: QUOTED.search(t) is not None),
            "xml": self._split(normal, lambda t: "\n" in t),
        }
        self.special = [(texts[i], i) for i in sorted(specials) if i < self.size and texts[i]]
        self.eos = sorted(int(i) for i in eos if 0 <= int(i) < self.size)

    def _split(
        self, normal: list[tuple[str, int]], walked: Callable[[str], bool]
    ) -> tuple[np.ndarray, list[str], list[int]]:
        """(a mask of the tokens `walked` leaves out, the strings and ids of those it takes)."""
        taken = [(t, i) for t, i in normal if walked(t)]
        fits = np.zeros(self.size, dtype=bool)
        fits[self.ids] = True
        fits[[i for _, i in taken]] = False
        return fits, [t for t, _ in taken], [i for _, i in taken]


def token_texts(tokenizer: Any) -> tuple[list[str], list[int]]:
    """(each token's text as the detokenizer writes it after other text, the special tokens' ids).
    A token is decoded after "a" (then cut), so a SentencePiece word start keeps its space."""
    backend = tokenizer.backend
    size = tokenizer.vocab_size
    anchor = backend.encode("a", add_special_tokens=False).ids
    if len(anchor) == 1 and backend.decode(anchor) == "a":
        texts = backend.decode_batch([[anchor[0], i] for i in range(size)], skip_special_tokens=False)
        texts = [t[1:] if t.startswith("a") else t for t in texts]
    else:
        texts = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    special = [i for i, token in backend.get_added_tokens_decoder().items() if token.special]
    return texts, special


def _end(strings: list[str], prefix: str, ch: str, lo: int, hi: int) -> int:
    """The end of the range of strings[lo:hi] that start with prefix + ch."""
    return hi if ord(ch) == 0x10FFFF else bisect_left(strings, prefix + chr(ord(ch) + 1), lo, hi)


class TokenConstraint:
    """One automaton over one vocabulary: the mask of each state (cached) and the state after a token."""

    def __init__(self, machine: Automaton, vocab: Vocabulary):
        self.machine = machine
        self.vocab = vocab
        self.masks: OrderedDict[State, np.ndarray | None] = OrderedDict()
        self.steps: dict[tuple[State, str], State] = {}

    def step(self, state: State, ch: str) -> State:
        key = (state, ch)
        following = self.steps.get(key)
        if following is None:
            if len(self.steps) >= STEPS_KEPT:
                self.steps.clear()
            following = self.steps[key] = self.machine.step(state, ch)
        return following

    def literal(self, state: State, text: str) -> State:
        """The state after `text` read by literal text only (how a special token may fit)."""
        for ch in text:
            state = self.machine.step(frozenset(c for c in state if c and isinstance(c[-1][0], Lit)), ch)
            if not state:
                break
        return state

    def advance(self, state: State, token: int) -> State:
        """The state after the chosen token (empty: the reply is complete, or left the grammar)."""
        vocab = self.vocab
        text = vocab.texts[token] if 0 <= token < vocab.size else ""
        if token in vocab.eos or not text:
            return frozenset()
        if token in vocab.specials:
            return self.literal(state, text)
        for ch in text:
            state = self.step(state, ch)
            if not state:
                break
        return state

    def mask(self, state: State) -> np.ndarray | None:
        """The tokens that fit in `state` (None: no constraint: the reply is done or left the grammar)."""
        if not state:
            return None
        if state in self.masks:
            self.masks.move_to_end(state)
            return self.masks[state]
        vocab = self.vocab
        allowed = np.zeros(vocab.size, dtype=bool)
        found: list[int] = []
        text, room = self.machine.in_text(state)
        if text is not None:
            fits, strings, ids = vocab.free_text[text]
            allowed |= fits if room is None else fits & (vocab.lengths <= room)
            self._walk(strings, ids, state, found)
        else:
            self._walk(vocab.strings, vocab.ids, state, found)
        found += [i for text, i in vocab.special if self.literal(state, text)]
        if self.machine.complete(state):
            found += vocab.eos
        allowed[found] = True
        mask: np.ndarray | None = allowed
        if not allowed.any():  # the vocabulary cannot go on: end the reply where it can, else let it be
            mask = None if not vocab.eos else np.isin(np.arange(vocab.size), vocab.eos)
        self.masks[state] = mask
        if len(self.masks) > MASKS_KEPT:
            self.masks.popitem(last=False)
        return mask

    def _walk(self, strings: list[str], ids: list[int], state: State, found: list[int]) -> None:
        """Append to `found` the ids of the strings the automaton reads whole from `state`."""
        stack = [(0, len(strings), 0, state)]
        while stack:
            lo, hi, depth, now = stack.pop()
            while lo < hi and len(strings[lo]) == depth:  # the prefix itself is a token: it fits
                found.append(ids[lo])
                lo += 1
            if lo >= hi:
                continue
            prefix = strings[lo][:depth]
            chars = self.machine.chars(now)
            if chars is not None:
                for ch in chars:
                    start = bisect_left(strings, prefix + ch, lo, hi)
                    end = _end(strings, prefix, ch, start, hi)
                    if start < end and (following := self.step(now, ch)):
                        stack.append((start, end, depth + 1, following))
                continue
            i = lo
            while i < hi:
                ch = strings[i][depth]
                end = _end(strings, prefix, ch, i, hi)
                if following := self.step(now, ch):
                    stack.append((i, end, depth + 1, following))
                i = end


class ConstrainedReply:
    """A logits processor in mlx-lm's shape, on the host: (the token ids so far, the prompt's
    included; float logits [vocab]) -> logits with the tokens that do not fit at -inf. The first
    call's ids are the prompt; each later call reads the ids chosen since."""

    def __init__(self, constraint: TokenConstraint):
        self.constraint = constraint
        self.state = constraint.machine.initial
        self.seen: int | None = None

    def __call__(self, tokens: Sequence[int], logits: np.ndarray) -> np.ndarray:
        if self.seen is None:
            self.seen = len(tokens)
        for token in tokens[self.seen :]:
            self.state = self.constraint.advance(self.state, int(token))
        self.seen = len(tokens)
        mask = self.constraint.mask(self.state)
        return logits if mask is None else np.where(mask, logits, -np.inf)


class LazyReply:
    """ConstrainedReply's lazy form (ReplyGrammar.lazy; llama.cpp's lazy grammars): the logits pass
    unchanged while the reply is free. Once the reply's text has `trigger` (the grammar's start: the
    format's call opening, maybe split over tokens or inside one with more text after it), the text
    after it is read by the automaton and each later token is masked as ConstrainedReply masks it,
    until the call is complete: then the reply is free again (text, EOS, or another call). When the
    text after the trigger in its own token already leaves the grammar, that call stays free."""

    def __init__(self, constraint: TokenConstraint, trigger: str):
        self.constraint = constraint
        self.trigger = trigger
        self.state: State | None = None  # None: free
        self.tail = ""  # the free text's last len(trigger) - 1 characters (a trigger split over tokens)
        self.seen: int | None = None

    def __call__(self, tokens: Sequence[int], logits: np.ndarray) -> np.ndarray:
        if self.seen is None:
            self.seen = len(tokens)
        for token in tokens[self.seen :]:
            self._read(int(token))
        self.seen = len(tokens)
        mask = None if self.state is None else self.constraint.mask(self.state)
        return logits if mask is None else np.where(mask, logits, -np.inf)

    def _read(self, token: int) -> None:
        constraint = self.constraint
        if self.state is not None:  # in a call
            self.state = self._open(constraint.advance(self.state, token))
            return
        vocab = constraint.vocab
        text = self.tail + (vocab.texts[token] if 0 <= token < vocab.size else "")
        at = text.find(self.trigger)
        if at < 0:
            self.tail = text[max(0, len(text) - len(self.trigger) + 1) :]
            return
        after = text[at + len(self.trigger) :]
        self.state = self._open(constraint.machine.feed(constraint.machine.initial, after))
        self.tail = after[max(0, len(after) - len(self.trigger) + 1) :] if self.state is None else ""

    def _open(self, state: State) -> State | None:
        """`state` while the call goes on; None once it is complete or left the grammar."""
        return state if state and not self.constraint.machine.complete(state) else None


class Constraints:
    """The constraints of one tokenizer: its vocabulary (built on first use) and the last grammars'
    masks, so that requests with the same tools share them."""

    def __init__(self, tokenizer: Any, kept: int = 16):
        self.tokenizer = tokenizer
        self.kept = kept
        self.vocab: Vocabulary | None = None
        self.built: OrderedDict[ReplyGrammar, TokenConstraint] = OrderedDict()

    def processor(self, grammar: ReplyGrammar) -> ConstrainedReply | LazyReply:
        """The grammar's logits processor (LazyReply for a lazy one; a lazy grammar shares its masks
        with the same grammar's eager form: tool_choice auto and "required" over the same tools)."""
        if self.vocab is None:
            texts, special = token_texts(self.tokenizer)
            self.vocab = Vocabulary(texts, special, sorted(self.tokenizer.eos_token_ids))
        eager = replace(grammar, lazy=False)
        if eager not in self.built:
            self.built[eager] = TokenConstraint(automaton(eager), self.vocab)
            if len(self.built) > self.kept:
                self.built.popitem(last=False)
        self.built.move_to_end(eager)
        constraint = self.built[eager]
        return LazyReply(constraint, grammar.start) if grammar.lazy else ConstrainedReply(constraint)
