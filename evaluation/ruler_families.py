"""RULER's task families, their definitions reimplemented (RULER's generator scripts parse their
arguments at import and need nltk's downloaded punkt; the package's data and templates are read
instead, see ruler_data.py).

Each family draws a sample's random content once (keys, values, chain, question, depths as
fractions) from the sample's generator, then returns a Draft for any haystack size: the prompt
grows with the size while what is asked stays the same, so the size that fits a token length can
be found by bisection (ruler_tasks.fit_sample) and every method sees the same sample."""

from __future__ import annotations

import random
import string
import uuid
from dataclasses import dataclass, field
from typing import Callable

from .ruler_data import essay_words, qa_data, split_sentences, task_templates, word_list

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's 40 evenly spaced needle depths (%)
EXAMPLE_TOKENS = 470  # RULER's few-shot examples are generated for 500 tokens less the answer budget


@dataclass
class Draft:
    """A sample at one haystack size: the user's text, the answer prefix opening the reply, the
    expected strings, and the texts to mark in position maps ("needle": what the answer is read
    from: the queried needles, the chain's hops, QA's answer sentences; "other": distractor
    needles; "support": QA's gold documents)."""

    user: str
    prefix: str
    outputs: list[str]
    context: str
    marks: dict[str, list[str]] = field(default_factory=dict)


Render = Callable[[int], Draft]
Count = Callable[[str], int]


def _random_value(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":  # one of RULER's adjective-noun pairs
        return f"{rng.choice(word_list('adjectivelist.txt'))}-{rng.choice(word_list('nounlist.txt'))}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _insert(items: list[str], inserts: list[str], fractions: list[float]) -> list[str]:
    """items with inserts[i] placed at relative position fractions[i] (sorted ascending)."""
    out = list(items)
    for j, (frac, text) in enumerate(zip(fractions, inserts)):
        out.insert(int(frac * len(items)) + j, text)
    return out


def niah(rng: random.Random, p: dict, n_tokens: int, count: Count) -> tuple[Render, int, int]:
    """Needles "One of the special magic <values> for <key> is: <value>." in a haystack (essay,
    repeated noise, or other needles); num_needle_q keys asked, every value of each expected."""
    nk, nv, nq = max(p["num_needle_k"], p["num_needle_q"]), p["num_needle_v"], p["num_needle_q"]
    keys = [_random_value(rng, p["type_needle_k"]) for _ in range(nk)]
    values = [[_random_value(rng, p["type_needle_v"]) for _ in range(nv)] for _ in range(nk)]
    needles = [
        NEEDLE.format(type_needle_v=p["type_needle_v"], key=k, value=v) for k, vs in zip(keys, values) for v in vs
    ]
    rng.shuffle(needles)
    asked = rng.sample(range(nk), nq)
    answers = [v for i in asked for v in values[i]]
    query = ", ".join(keys[i] for i in asked[:-1]) + ", and " + keys[asked[-1]] if nq > 1 else keys[asked[0]]
    spec = task_templates()["niah"]
    template, prefix, kind = spec["template"], spec["answer_prefix"], p["type_needle_v"]
    if nq * nv == 1:  # RULER's singular wording
        for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template, prefix = template.replace(old, new), prefix.replace(old, new)
        kind = kind[:-1]
    depths = sorted(rng.sample(DEPTHS, len(needles)))
    fractions = sorted(rng.random() for _ in needles)
    haystack = p["type_haystack"]
    cap = min(len(essay_words()), n_tokens) if haystack == "essay" else max(2, n_tokens // 8)
    distractors = (
        [
            NEEDLE.format(
                type_needle_v=p["type_needle_v"],
                key=_random_value(rng, p["type_needle_k"]),
                value=_random_value(rng, p["type_needle_v"]),
            )
            for _ in range(cap)
        ]
        if haystack == "needle"
        else []
    )
    asked_needles = [s for s in needles if any(f"for {keys[i]} is:" in s for i in asked)]

    def render(size: int) -> Draft:
        if haystack == "essay":
            sentences = split_sentences(" ".join(essay_words()[:size]))
            cuts = [0] + [int(len(sentences) * d / 100) for d in depths] + [len(sentences)]
            pieces = []
            for i in range(1, len(cuts)):
                pieces.append(" ".join(sentences[cuts[i - 1] : cuts[i]]))
                if i - 1 < len(needles):
                    pieces.append(needles[i - 1])
            context = " ".join(pieces)
        else:
            context = "\n".join(
                _insert([NOISE] * size if haystack == "repeat" else distractors[:size], needles, fractions)
            )
        return Draft(
            template.format(type_needle_v=kind, context=context, query=query),
            prefix.format(type_needle_v=kind, query=query),
            answers,
            context,
            {"needle": asked_needles, "other": [s for s in needles if s not in asked_needles]},
        )

    return render, 1, cap


def _chain(rng: random.Random, letters: int, hops: int) -> tuple[list[str], list[str]]:
    """(variables, statements) of one chain "VAR A = 12345", "VAR B = VAR A ", ... (hops + 1 names)."""
    names: list[str] = []
    while len(names) < hops + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        names += [name] if name not in names else []
    return names, [f"VAR {names[0]} = {rng.randint(10000, 99999)}"] + [
        f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)
    ]


def _vt_text(names: list[str], statements: list[str], fractions: list[float], size: int) -> tuple[str, str, str]:
    """(task text, answer prefix, context) of one chain among `size` noise lines."""
    spec = task_templates()["variable_tracking"]
    context = " ".join(_insert([NOISE + "\n"] * size, statements, fractions)).replace(". \n", ".\n")
    value = statements[0].split("=")[-1].strip()
    return (
        spec["template"].format(context=context, query=value),
        spec["answer_prefix"].format(num_v=len(names), query=value),
        context,
    )


def variable_tracking(rng: random.Random, p: dict, n_tokens: int, count: Count) -> tuple[Render, int, int]:
    """One chain of num_hops assignments hidden in noise; every variable of the chain expected.
    A few-shot example (three-letter names, its answer written out, ~470 tokens) opens the prompt."""
    ex_names, ex_statements = _chain(rng, 3, min(10, p["num_hops"]))
    ex_fractions = sorted(rng.random() for _ in ex_statements)
    names, statements = _chain(rng, 5, p["num_hops"])
    fractions = sorted(rng.random() for _ in statements)

    def example(size: int) -> str:
        text, prefix, _ = _vt_text(ex_names, ex_statements, ex_fractions, size)
        return text + prefix + " ".join(ex_names)

    ex_size = bisect_size(lambda s: count(example(s)), EXAMPLE_TOKENS, 1, EXAMPLE_TOKENS // 8)
    shot = example(ex_size)

    def render(size: int) -> Draft:
        text, prefix, context = _vt_text(names, statements, fractions, size)
        return Draft(shot + "\n\n" + text, prefix, names, context, {"needle": statements})

    return render, 1, max(2, n_tokens // 8)


def common_words(rng: random.Random, p: dict, n_tokens: int, count: Count) -> tuple[Render, int, int]:
    """A numbered list where num_cw words repeat freq_cw times and the rest freq_ucw times (6 and
    1 below 4096 tokens, as RULER does); the num_cw common words expected. A worked example of
    the same task (40 or 20 words) opens the prompt."""
    pool = sorted(set(word_list("nounlist.txt") + word_list("adjectivelist.txt") + word_list("verblist.txt")))
    spec, num_cw = task_templates()["common_words_extraction"], p["num_cw"]
    small = n_tokens < 4096
    example_shape, (often, rarely) = ((20, 3, 1), (6, 1)) if small else ((40, 10, 3), (p["freq_cw"], p["freq_ucw"]))

    def listing(words: list[str], repeats: tuple[int, int], seed: float) -> str:
        listed = words[:num_cw] * repeats[0] + words[num_cw:] * repeats[1]
        random.Random(seed).shuffle(listed)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed))

    ex_words = rng.sample(pool, example_shape[0])
    shot = (
        spec["template"].format(context=listing(ex_words, example_shape[1:], rng.random()), query="")
        + spec["answer_prefix"]
        + " "
        + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ex_words[:num_cw]))
    )
    cap = min(len(pool), num_cw + n_tokens // (2 * rarely))
    words, seed = rng.sample(pool, cap), rng.random()

    def render(size: int) -> Draft:
        context = listing(words[:size], (often, rarely), seed)
        return Draft(
            shot + "\n" + spec["template"].format(context=context, query=""),
            spec["answer_prefix"],
            words[:num_cw],
            context,
            {},
        )

    return render, num_cw + 1, cap


def qa(rng: random.Random, p: dict, n_tokens: int, count: Count) -> tuple[Render, int, int]:
    """A SQuAD or HotpotQA question over its gold documents among distractors (SQuAD: the same
    article's other paragraphs first, then any); any of the question's answers counts. Marked:
    the gold documents' sentences holding an answer ("needle"; the documents when none does, as
    for HotpotQA's yes / no questions) and the gold documents ("support")."""
    questions, docs = qa_data(p["dataset"])
    q = questions[rng.randrange(len(questions))]
    cap = min(len(docs), len(q["context"]) + max(1, n_tokens // 20))
    taken = set(q["context"]) | set(q["more"])
    extra = [i for i in rng.sample(range(len(docs)), min(len(docs), cap + len(taken))) if i not in taken]
    order = q["context"] + rng.sample(q["more"], len(q["more"])) + extra
    seed, spec = rng.random(), task_templates()["qa"]
    gold = [docs[d] for d in q["context"]]
    answer_sentences = [
        s for doc in gold for s in split_sentences(doc) if any(a.lower() in s.lower() for a in q["outputs"])
    ] or gold  # yes / no: the documents

    def render(size: int) -> Draft:
        chosen = order[:size]
        random.Random(seed).shuffle(chosen)
        context = "\n\n".join(f"Document {i + 1}:\n{docs[d]}" for i, d in enumerate(chosen))
        return Draft(
            spec["template"].format(context=context, query=q["query"]),
            spec["answer_prefix"],
            list(q["outputs"]),
            context,
            {"needle": answer_sentences, "support": gold},
        )

    return render, len(q["context"]), min(cap, len(order))


def bisect_size(tokens: Callable[[int], int], n_tokens: int, low: int, high: int) -> int:
    """The largest size in [low, high] whose prompt holds at most n_tokens tokens (low when even
    low does not fit; the caller checks); tokens(size) grows with size."""
    if tokens(low) > n_tokens:
        return low
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if tokens(mid) <= n_tokens else (low, mid - 1)
    return low


FAMILIES: dict[str, Callable[..., tuple[Render, int, int]]] = {
    "niah": niah,
    "variable_tracking": variable_tracking,
    "common_words_extraction": common_words,
    "qa": qa,
}
