"""generate_step on a tiny model: greedy tokens equal transformers' greedy generate; stop ids,
max_tokens, progress and GenerationInfo; seeded temperature / top-p sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from specfill.backends.mlx import load
from specfill.core.driver import CausalLM
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig
from tests.mlx.conftest import prompt_ids

GREEDY = SamplingConfig()


@pytest.fixture(scope="module")
def llama(tiny_checkpoint):
    directory = tiny_checkpoint("llama", "safetensors", seed=5)
    model, _ = load(directory, dtype="float32", device="cpu", prefill_step_size=16)
    return model, directory


def run(model, ids, *, max_tokens=10, sampling=GREEDY, stop_ids=frozenset(), info=None, progress=None) -> list[int]:
    return list(
        model.generate_step(
            ids,
            max_tokens=max_tokens,
            sampling=sampling,
            stop_ids=stop_ids,
            method=PrefillMethod(),
            info=info or GenerationInfo(),
            progress=progress,
        )
    )


def test_greedy_tokens_equal_transformers_generate(llama):
    model, directory = llama
    assert isinstance(model, CausalLM) and model.backend == "mlx"
    ids = prompt_ids(37, vocab=model.args.vocab_size, seed=21)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    with torch.no_grad():
        expected = (
            hf.eval()
            .generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)[
                0, len(ids) :
            ]
            .tolist()
        )
    assert run(model, ids, max_tokens=12) == expected


def test_stop_ids_max_tokens_progress_and_info(llama):
    model, _ = llama
    ids = prompt_ids(40, vocab=model.args.vocab_size, seed=22)
    seen: list[tuple[int, int]] = []
    info = GenerationInfo()
    tokens = run(model, ids, max_tokens=6, info=info, progress=lambda done, total: seen.append((done, total)))
    assert len(tokens) == 6
    assert seen == [(16, 40), (32, 40), (40, 40)]  # prefill steps of 16
    assert (info.prompt_tokens, info.kept_tokens, info.kept_positions) == (40, 40, None)
    stop_at = tokens[2]
    first = tokens.index(stop_at)
    assert run(model, ids, max_tokens=6, stop_ids=frozenset({stop_at})) == tokens[: first + 1]
    assert run(model, ids, max_tokens=0) == []


def test_seeded_sampling_repeats_and_tiny_top_p_is_greedy(llama):
    model, _ = llama
    ids = prompt_ids(20, vocab=model.args.vocab_size, seed=23)
    hot = SamplingConfig(temperature=1.5, seed=7)
    first = run(model, ids, max_tokens=12, sampling=hot)
    assert run(model, ids, max_tokens=12, sampling=hot) == first
    assert first != run(model, ids, max_tokens=12)  # 12 samples at T=1.5 are not all the argmax
    nucleus_of_one = SamplingConfig(temperature=1.0, top_p=1e-6, seed=1)
    assert run(model, ids, max_tokens=8, sampling=nucleus_of_one) == run(model, ids, max_tokens=8)


def test_prompt_logits_full_equals_call_and_fills_info(llama):
    model, _ = llama
    ids = prompt_ids(19, vocab=model.args.vocab_size, seed=24)
    info = GenerationInfo()
    logits = model.prompt_logits(ids, method=PrefillMethod(), info=info)
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    np.testing.assert_array_equal(logits, np.asarray(model(ids)[0]))
    assert (info.prompt_tokens, info.kept_tokens) == (19, 19)
