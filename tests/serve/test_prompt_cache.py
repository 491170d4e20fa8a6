"""The multi-turn prompt cache on the demo model: after a SpecPrefill turn, the next turn reuses a
dense KV rebuilt in idle time and answers exactly as a dense run of both turns (greedy)."""

from __future__ import annotations

import http.client
import json

import pytest

from specfill.evaluation.serve_process import client
from tests.serve.harness import wait_rebuilt

pytestmark = pytest.mark.slow

SENTENCES = [
    "The harbour master counted eleven blue boats at dawn.",
    "A copper kettle whistled in the empty kitchen.",
    "Marta planted forty tulip bulbs along the northern fence.",
    "The night train to Vienna left four minutes late.",
    "Seven crows argued loudly over a crust of rye bread.",
    "Old Tomas repaired the clock tower with a borrowed ladder.",
    "The secret password for the archive is juniper falcon.",
    "Rain fell on the glass roof of the botanical garden.",
    "A chess tournament in the library drew ninety players.",
    "The baker sold out of cinnamon rolls before nine.",
    "Fog rolled over the hills and hid the lighthouse.",
    "Nobody remembered who had painted the red door.",
]
TEXT = "\n".join(f"Line {i}: {s}" for i, s in enumerate(SENTENCES * 2, 1))  # ~400 tokens
TURN1 = {"role": "user", "content": f"Here is a text.\n\n{TEXT}\n\nWhat is this text about? Answer briefly."}
TURN2 = {"role": "user", "content": "Quote line 7 of the text verbatim."}


def chat(c, messages, **fields):
    r = c.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=messages, max_tokens=24, temperature=0, extra_body=fields
    )
    return r.choices[0].message.content, r.model_extra["specfill"], r.usage


def test_turn_two_after_specprefill_equals_dense_run(demo_server):
    c = client(demo_server, timeout=300)
    reply1, stats1, _ = chat(c, [TURN1], method="specprefill", keep_ratio=0.1)
    assert stats1["prefill_method"] == "specprefill" and stats1["kept_tokens"] < stats1["prompt_tokens"] / 4
    state = wait_rebuilt(demo_server, 60)
    assert state["prompt_cache"]["pending_tokens"] == 0 and state["prompt_cache"]["completed_tokens"] > 0
    two_turns = [TURN1, {"role": "assistant", "content": reply1}, TURN2]
    reply2, stats2, usage2 = chat(c, two_turns, method="specprefill", keep_ratio=0.1)
    # SpecPrefill from the reused prefix (docs/methods.md): the new part is one selection chunk, all kept
    assert stats2["prefill_method"] == "specprefill" and stats2["kept_tokens"] == stats2["prompt_tokens"]
    assert (
        stats2["cached_tokens"] >= stats1["prompt_tokens"]
        and usage2.prompt_tokens_details.cached_tokens == stats2["cached_tokens"]
    )
    dense, stats_dense, _ = chat(c, two_turns, method="full", prompt_cache="off")
    assert stats_dense["cached_tokens"] == 0 and stats_dense["kept_tokens"] == stats_dense["prompt_tokens"]
    assert reply2 == dense
    # a long new part: only its kept tokens are prefilled, over the whole cached conversation
    reply2_turn = {"role": "assistant", "content": reply2}
    turn3 = {"role": "user", "content": f"Another text.\n\n{TEXT}\n\nQuote its line 7 verbatim."}
    three = [*two_turns, reply2_turn, turn3]
    _, stats3, _ = chat(c, three, method="specprefill", keep_ratio=0.1)
    assert stats3["prefill_method"] == "specprefill" and stats3["cached_tokens"] >= stats2["prompt_tokens"]
    new = stats3["prompt_tokens"] - stats3["cached_tokens"]
    assert stats3["cached_tokens"] < stats3["kept_tokens"] < stats3["cached_tokens"] + new / 3
    assert "speculator" in stats3["prefill_seconds"]
    # the exact policy rebuilds it densely from its dense prefix, not from the conversation's start
    assert demo_server.health()["prompt_cache"]["pending_tokens"] <= new + 24
    wait_rebuilt(demo_server, 60)


def test_approximate_reuses_sparse_cache_and_exact_refuses_it(demo_server):
    """approximate: the SpecPrefill cache is extended as it is (no rebuild); an exact request on
    that conversation prefills all of it densely (but a dense prefix another conversation shares)
    and matches the dense run."""
    c = client(demo_server, timeout=300)
    text = "\n".join(f"Line {i}: {s}" for i, s in enumerate(SENTENCES[::-1] * 2, 1))  # shares no prefix with TEXT
    turn1 = {"role": "user", "content": f"Read this.\n\n{text}\n\nWhat is this text about? Answer in one sentence."}
    reply1, stats1, _ = chat(c, [turn1], method="specprefill", keep_ratio=0.1, prompt_cache="approximate")
    assert demo_server.health()["prompt_cache"]["pending_tokens"] == 0  # nothing to rebuild
    two_turns = [turn1, {"role": "assistant", "content": reply1}, TURN2]
    _, approx, _ = chat(c, two_turns, prompt_cache="approximate")
    assert approx["cached_tokens"] >= stats1["prompt_tokens"] and approx["prefill_method"] == "full"
    exact, stats_exact, _ = chat(c, two_turns, prompt_cache="exact")
    # at most the chat template's system prompt, shared with other conversations: not the sparse one
    assert stats_exact["cached_tokens"] < approx["cached_tokens"] / 4 and stats_exact["prefill_method"] == "full"
    dense, _, _ = chat(c, two_turns, prompt_cache="off")
    assert exact == dense


def test_progress_counts_cached_tokens(demo_server):
    c = client(demo_server, timeout=300)
    first = [{"role": "user", "content": "Name three colours of the rainbow." + " Please." * 40}]
    reply = c.chat.completions.create(model=demo_server.model, messages=first, max_tokens=8).choices[0].message.content
    wait_rebuilt(demo_server, 60)
    chunks = list(
        c.chat.completions.create(
            model=demo_server.model,
            messages=first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And three more?"}],
            max_tokens=4,
            stream=True,
            extra_body={"return_progress": True},
        )
    )
    progress = [ch.model_extra["prompt_progress"] for ch in chunks if "prompt_progress" in ch.model_extra]
    final = next(ch.model_extra["specfill"] for ch in chunks if "specfill" in ch.model_extra)
    assert final["cached_tokens"] > 40
    assert progress[-1]["processed"] == progress[-1]["total"] == final["prompt_tokens"]
    assert all(p["cache"] == final["cached_tokens"] for p in progress)


def test_cancelled_turn_keeps_the_conversation(demo_server):
    """A client gone during turn 2 leaves turn 1's cached KV in place for its retry."""
    c = client(demo_server, timeout=300)
    first = [{"role": "user", "content": "Describe a quiet harbour town." + " In detail." * 30}]
    reply = c.chat.completions.create(model=demo_server.model, messages=first, max_tokens=8).choices[0].message.content
    two_turns = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Go on, at length."}]
    connection = http.client.HTTPConnection("127.0.0.1", demo_server.port, timeout=60)
    connection.request(
        "POST",
        "/v1/chat/completions",
        headers={"Content-Type": "application/json"},
        body=json.dumps({"messages": two_turns, "max_tokens": 2000, "stream": True}),
    )
    response = connection.getresponse()
    assert [response.readline() for _ in range(4)][-1]
    connection.close()
    retry = c.chat.completions.create(model=demo_server.model, messages=two_turns, max_tokens=2)
    assert retry.model_extra["specfill"]["cached_tokens"] > 60
