"""Prompts for benchmarks and evaluation: a fixed English text and passkey-retrieval prompts."""
from __future__ import annotations

import random
from importlib import resources

PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def eval_text() -> str:
    """GPL-3 + GFDL-1.3, verbatim: ~9.5K words of English available without a network."""
    return resources.files("specfill.evaluation").joinpath("data/gpl3_gfdl13.txt").read_text(encoding="utf-8")


def tokens_of_length(tokenizer, n_tokens: int) -> list[int]:
    """Exactly n_tokens ids of the evaluation text, repeated if it is too short."""
    ids = tokenizer.encode(eval_text(), add_special_tokens=False)
    out: list[int] = []
    while len(out) < n_tokens:
        out.extend(ids)
    return out[:n_tokens]


def passkey_prompt(tokenizer, n_tokens: int, depth: float, passkey: int) -> str:
    """A prompt of about n_tokens tokens hiding `passkey` at relative depth (0 = start, 1 = end)."""
    intro = ("There is an important piece of information hidden inside a lot of irrelevant text. "
             "Find it and memorize it. I will quiz you about it.\n")
    needle = f"The pass key is {passkey}. Remember it. {passkey} is the pass key. "
    question = "\nWhat is the pass key? The pass key is"
    budget = n_tokens - len(tokenizer.encode(intro + needle + question, add_special_tokens=False))
    filler_tokens = len(tokenizer.encode(PASSKEY_FILLER, add_special_tokens=False))
    repeats = max(0, budget // filler_tokens)
    before = int(round(repeats * depth))
    return intro + PASSKEY_FILLER * before + needle + PASSKEY_FILLER * (repeats - before) + question


def passkey_prompt_spans(tokenizer, n_tokens: int, depth: float, passkey: int) -> tuple[str, dict[str, list[int]]]:
    """passkey_prompt and the token spans [start, end) of its needle and its question, as the
    prompt is encoded for generation (prefix lengths under the same BOS rule)."""
    from specfill.api import encode_prompt

    prompt = passkey_prompt(tokenizer, n_tokens, depth, passkey)
    needle_at = prompt.index(f"The pass key is {passkey}.")
    needle_end = prompt.index(f"{passkey} is the pass key. ", needle_at) + len(f"{passkey} is the pass key.")
    question_at = prompt.rindex("\nWhat is the pass key?")

    def position(char: int) -> int:
        return len(encode_prompt(tokenizer, prompt[:char])) if char else 0

    total = len(encode_prompt(tokenizer, prompt))
    return prompt, {"needle": [position(needle_at), position(needle_end)], "question": [position(question_at), total]}


def passkey_trials(n_trials: int, seed: int = 0) -> list[tuple[float, int]]:
    """(depth, passkey) pairs spread evenly over depths, keys drawn from a seeded generator."""
    rng = random.Random(seed)
    return [((i + 0.5) / n_trials, rng.randint(10000, 99999)) for i in range(n_trials)]
