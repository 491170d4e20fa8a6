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
    intro = (
        "There is an important piece of information hidden inside a lot of irrelevant text. "
        "Find it and memorize it. I will quiz you about it.\n"
    )
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
    prompt = passkey_prompt(tokenizer, n_tokens, depth, passkey)
    needle_at = prompt.index(f"The pass key is {passkey}.")
    needle_end = prompt.index(f"{passkey} is the pass key. ", needle_at) + len(f"{passkey} is the pass key.")
    return prompt, _token_spans(tokenizer, prompt, needle_at, needle_end, prompt.rindex("\nWhat is the pass key?"))


def _token_spans(tokenizer, prompt: str, needle_at: int, needle_end: int, question_at: int) -> dict[str, list[int]]:
    """Character offsets -> token spans [start, end) of the needle and of the question (to the end),
    as the prompt is encoded for generation (prefix lengths under the same BOS rule)."""
    from specfill.api import encode_prompt

    def position(char: int) -> int:
        return len(encode_prompt(tokenizer, prompt[:char])) if char else 0

    return {
        "needle": [position(needle_at), position(needle_end)],
        "question": [position(question_at), len(encode_prompt(tokenizer, prompt))],
    }


def passkey_trials(n_trials: int, seed: int = 0) -> list[tuple[float, int]]:
    """(depth, passkey) pairs spread evenly over depths, keys drawn from a seeded generator."""
    rng = random.Random(seed)
    return [((i + 0.5) / n_trials, rng.randint(10000, 99999)) for i in range(n_trials)]


MULTIKEY_NAMES = (
    "amber",
    "birch",
    "cobalt",
    "dune",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lagoon",
    "maple",
    "nectar",
    "onyx",
    "pepper",
    "quartz",
    "raven",
    "saffron",
    "tundra",
)


def multikey_trials(n_trials: int, needles: int = 4, seed: int = 0) -> list[dict]:
    """Per trial: `needles` distinct (name, 7-digit number) pairs at evenly spread depths (shifted per
    trial), and which of them the question asks for (cycling, so every depth slot is asked)."""
    rng = random.Random(seed)
    out = []
    for i in range(n_trials):
        names = rng.sample(MULTIKEY_NAMES, needles)
        shift = (i + 0.5) / n_trials / needles
        out.append(
            {
                "pairs": [(name, rng.randint(1_000_000, 9_999_999)) for name in names],
                "depths": [j / needles + shift for j in range(needles)],
                "asked": i % needles,
            }
        )
    return out


def multikey_prompt_spans(tokenizer, n_tokens: int, trial: dict) -> tuple[str, dict[str, list[int]], str]:
    """A multi-key needle prompt of about n_tokens tokens: the evaluation text as haystack with
    trial["pairs"] hidden as "The special magic number for NAME is NUMBER." at trial["depths"], and a
    question for one NAME (the others are distractors a sparse prefill must not confuse with it).
    Returns (prompt, token spans [start, end) of the asked needle and of the question, the answer)."""
    name, number = trial["pairs"][trial["asked"]]
    intro = "Some special magic numbers are hidden inside the following text. Memorize them.\n"
    needles = [f" The special magic number for {n} is {v}. " for n, v in trial["pairs"]]
    question = f"\nWhat is the special magic number for {name}? The special magic number for {name} is"
    budget = n_tokens - len(tokenizer.encode(intro + "".join(needles) + question, add_special_tokens=False))
    hay = tokenizer.decode(tokens_of_length(tokenizer, max(1, budget)))
    cuts = sorted(zip((int(len(hay) * d) for d in trial["depths"]), needles))
    parts, last = [intro], 0
    for cut, needle in cuts:
        space = hay.rfind(" ", last, cut)
        cut = space if space > last else max(last, cut)  # between words where there is room
        parts += [hay[last:cut], needle]
        last = cut
    prompt = "".join(parts + [hay[last:], question])
    asked = needles[trial["asked"]].strip()
    at = prompt.index(asked)
    return prompt, _token_spans(tokenizer, prompt, at, at + len(asked), prompt.rindex(question)), str(number)
