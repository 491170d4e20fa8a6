"""RULER's tasks (Hsieh et al. 2024, github.com/NVIDIA/RULER) for any model and prompt length:
samples fitted to a token length with the model's tokenizer, and RULER's scoring.

A sample's length is its prompt's tokens (chat template and answer prefix included) and stays
at or under the asked length (RULER counts the answer budget in too; the prompt is what TTFT
depends on). Samples are seeded by (seed, task, length, index): every method sees the same ones."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from specfill.core import ConfigError

from .ruler_families import FAMILIES, bisect_size

# name -> (family, parameters), RULER's synthetic.yaml settings
RULER_TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    **{
        name: (
            "niah",
            {
                "type_haystack": hay,
                "type_needle_k": k,
                "type_needle_v": v,
                "num_needle_k": nk,
                "num_needle_v": nv,
                "num_needle_q": nq,
            },
        )
        for name, (hay, k, v, nk, nv, nq) in {
            "niah_single_1": ("repeat", "words", "numbers", 1, 1, 1),
            "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
            "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
            "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
            "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
            "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
            "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
            "niah_multiquery": ("essay", "words", "numbers", 1, 1, 4),
        }.items()
    },
    "vt": ("variable_tracking", {"num_chains": 1, "num_hops": 4}),
    "cwe": ("common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    "qa_1": ("qa", {"dataset": "squad"}),
    "qa_2": ("qa", {"dataset": "hotpotqa"}),
}
# what `--tasks ruler` runs: the set (multi-key / multi-value / multi-query needles, a
# chain, aggregation, QA on two datasets)
DEFAULT_RULER_TASKS = ("niah_multikey_1", "niah_multivalue", "niah_multiquery", "vt", "cwe", "qa_1", "qa_2")
METRIC = {"qa": "part"}  # RULER: QA scores any expected string; the others the share found


@dataclass(frozen=True)
class RulerSample:
    """One prompt as fed to the model, with what scores it. spans: kind -> token spans [start,
    end) in the prompt ("needle": what the answer is read from; "other": distractor needles;
    "question": from the context's end to the prompt's end)."""

    task: str
    index: int
    prompt: str
    outputs: tuple[str, ...]
    metric: str
    max_tokens: int
    tokens: int
    spans: dict[str, list[list[int]]]


def wrap_prompt(tokenizer, user: str, prefix: str, chat: bool) -> str:
    """The user's text in the model's chat template (when `chat` and it has one) with RULER's
    answer prefix opening the reply; else the text and the prefix as one string."""
    if chat and tokenizer.chat_template:
        return (
            tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True)
            + prefix.lstrip()
        )
    return user + prefix


def _wrapped(tokenizer, draft, chat: bool) -> str:
    return wrap_prompt(tokenizer, draft.user, draft.prefix, chat)


def build_sample(tokenizer, task: str, n_tokens: int, index: int, seed: int = 0, chat: bool = True) -> RulerSample:
    """Sample `index` of `task` with the largest haystack whose prompt holds at most n_tokens
    tokens; ConfigError when even the smallest does not fit."""
    from specfill.api import encode_prompt

    if task not in RULER_TASKS:
        raise ConfigError(f"unknown RULER task {task!r} (known: {', '.join(RULER_TASKS)})")
    family, params = RULER_TASKS[task]
    rng = random.Random(f"{seed}:{task}:{n_tokens}:{index}")
    count = lambda text: len(encode_prompt(tokenizer, text))  # noqa: E731
    render, low, high = FAMILIES[family](rng, params, n_tokens, count)
    size = bisect_size(lambda s: count(_wrapped(tokenizer, render(s), chat)), n_tokens, low, high)
    draft = render(size)
    prompt = wrap_prompt(tokenizer, draft.user, draft.prefix, chat)
    tokens = count(prompt)
    if tokens > n_tokens:
        raise ConfigError(f"{n_tokens} tokens is too short for RULER task {task} (its smallest prompt holds {tokens})")
    budget = int(_template_value(family, "tokens_to_generate"))
    return RulerSample(
        task,
        index,
        prompt,
        tuple(draft.outputs),
        METRIC.get(family, "all"),
        budget,
        tokens,
        token_spans(tokenizer, prompt, draft.context, draft.marks),
    )


def _template_value(family: str, key: str) -> Any:
    from .ruler_data import task_templates

    return task_templates()[family][key]


def token_spans(tokenizer, prompt: str, context: str, marks: dict[str, list[str]]) -> dict[str, list[list[int]]]:
    """Token spans [start, end) of each marked text (its first occurrence after the prompt's
    context begins) and of the question, as the prompt is encoded (prefix lengths)."""
    from specfill.api import encode_prompt

    position = lambda char: len(encode_prompt(tokenizer, prompt[:char])) if char else 0  # noqa: E731
    start = prompt.rfind(context)
    spans: dict[str, list[list[int]]] = {}
    for kind, texts in marks.items():
        for text in texts:
            at = prompt.find(text.strip(), start)
            if at >= 0:
                spans.setdefault(kind, []).append([position(at), position(at + len(text.strip()))])
    spans["question"] = [[position(start + len(context)), len(encode_prompt(tokenizer, prompt))]]
    return spans


def score(prediction: str, outputs: tuple[str, ...] | list[str], metric: str) -> float:
    """RULER's per-sample score in [0, 1], case-insensitive substring matching: "all" the share
    of expected strings found in the prediction (NIAH, variable tracking, words), "part" 1 when
    any is found (QA)."""
    found = [ref.lower() in prediction.lower() for ref in outputs]
    return float(any(found)) if metric == "part" else sum(found) / len(found)


def task_family(task: str) -> str:
    return RULER_TASKS[task][0]


def expand_tasks(names: list[str] | tuple[str, ...]) -> list[str]:
    """`ruler` -> the default RULER set; other names kept (order kept, duplicates dropped)."""
    out: list[str] = []
    for name in names:
        for task in DEFAULT_RULER_TASKS if name == "ruler" else (name,):
            out += [task] if task not in out else []
    return out
