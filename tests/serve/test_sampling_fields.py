"""Sampling fields through the openai client (issue 25 item 6): top_k, min_p and the penalties give
the library's text, fields specfill lacks are refused by name, range errors name the right param."""

from __future__ import annotations

import openai
import pytest

from specfill.api import generate, load
from specfill.evaluation.serve_process import client

PROMPT = "5 9 2 7 7 1 3"
FIELDS = {"top_k": 4, "min_p": 0.05, "repetition_penalty": 1.4, "presence_penalty": 1.5, "frequency_penalty": 0.3}


@pytest.fixture(scope="module")
def tiny_local():
    """The tiny server's model, loaded here (random weights from a fixed seed: the same model)."""
    return load("random:tiny-llama", backend="cuda", device="cpu")


def test_fields_give_the_librarys_text(tiny_server, tiny_local):
    c = client(tiny_server)
    for temperature, seed in ((0.0, None), (0.9, 17)):
        reply = c.completions.create(
            model=tiny_server.model,
            prompt=PROMPT,
            max_tokens=10,
            temperature=temperature,
            seed=seed,
            presence_penalty=FIELDS["presence_penalty"],
            frequency_penalty=FIELDS["frequency_penalty"],
            extra_body={k: FIELDS[k] for k in ("top_k", "min_p", "repetition_penalty")},
        )
        local = generate(*tiny_local, PROMPT, 10, temperature=temperature, seed=seed, **FIELDS)
        assert reply.choices[0].text == local, temperature
        assert len(set(local.split())) > 2  # the penalties keep it from repeating one token
    plain = c.completions.create(model=tiny_server.model, prompt=PROMPT, max_tokens=10).choices[0].text
    assert plain == generate(*tiny_local, PROMPT, 10)
    assert plain != generate(*tiny_local, PROMPT, 10, presence_penalty=1.5)  # the field has an effect


def test_top_k_one_is_greedy(tiny_server):
    c = client(tiny_server)
    greedy = c.completions.create(model=tiny_server.model, prompt=PROMPT, max_tokens=8).choices[0].text
    top1 = (
        c.completions.create(
            model=tiny_server.model, prompt=PROMPT, max_tokens=8, temperature=1.5, seed=3, extra_body={"top_k": 1}
        )
        .choices[0]
        .text
    )
    assert top1 == greedy


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"typical_p": 0.5}, "typical_p"),
        ({"repeat_penalty": 1.2}, "repeat_penalty"),
        ({"mirostat": 2}, "mirostat"),
        ({"min_tokens": 4}, "min_tokens"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"presence_penalty": 9}, "presence_penalty"),
        ({"method": "specprefill", "keep_ratio": 0}, "keep_ratio"),
        ({"method": "specprefill", "keep_ratio": "x"}, "keep_ratio"),
        ({"method": "h2o", "h2o_chunk_size": 0}, "h2o_chunk_size"),
        ({"top_k": 2, "num_draft_tokens": 2}, "num_draft_tokens"),
    ],
)
def test_refusals_name_the_field(tiny_server, extra, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client(tiny_server).completions.create(model=tiny_server.model, prompt="1 2", max_tokens=2, extra_body=extra)
    error = refused.value.body
    assert error["param"] == param and param in error["message"], error
    assert ".int" not in error["message"] and ".float" not in error["message"]


def test_neutral_values_are_accepted(tiny_server):
    reply = client(tiny_server).completions.create(
        model=tiny_server.model,
        prompt="1 2",
        max_tokens=2,
        presence_penalty=0,
        frequency_penalty=0,
        extra_body={"typical_p": 1.0, "top_k": 0, "repetition_penalty": 1.0, "ignore_eos": False},
    )
    assert reply.usage.completion_tokens == 2
