"""A chat template that writes BOS itself must not get a second one (mlx-lm's encoding rule)."""

import json
import shutil

import pytest

from specfill.api import encode_prompt, load, stream_generate
from specfill.core.io.tokenizer import load_tokenizer
from specfill.core.runtime import GenerationInfo


@pytest.fixture()
def bos_checkpoint(tmp_path, tiny_checkpoint):
    """The tiny llama checkpoint with add_bos_token set and a template that writes {{ bos_token }}."""
    directory = tmp_path / "bos"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(dict(config, add_bos_token=True)))
    (directory / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    return directory


def test_templated_prompt_gets_one_bos_and_plain_text_still_gets_its_bos(bos_checkpoint):
    tok = load_tokenizer(bos_checkpoint)
    prompt = tok.apply_chat_template([{"role": "user", "content": "the cat"}])
    bos = tok.bos_token_id
    assert tok.encode(prompt)[:2] == [bos, bos]  # what encoding with specials would give
    ids = encode_prompt(tok, prompt)
    assert ids[0] == bos and ids[1] != bos and ids == tok.encode(prompt, add_special_tokens=False)
    assert encode_prompt(tok, "the cat") == tok.encode("the cat") == [bos, *tok.encode("the cat", False)]


def test_stream_generate_prefills_a_single_bos(bos_checkpoint):
    model, tok = load(str(bos_checkpoint), backend="cuda", device="cpu")
    prompt = tok.apply_chat_template([{"role": "user", "content": "the cat"}])
    info = GenerationInfo()
    list(stream_generate(model, tok, prompt, 2, prefill_info=info))
    assert info.prompt_tokens == len(tok.encode(prompt)) - 1 == len(encode_prompt(tok, prompt))
