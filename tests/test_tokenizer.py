"""core.io.tokenizer against transformers and sentencepiece: ids, decode, chat template, streaming,
vocabulary fingerprint, and errors."""

from __future__ import annotations

import json
import shutil

import pytest

from specfill.core.errors import ChatTemplateError, ModelLoadError
from specfill.core.io.gguf_tokenizer import end_of_generation_ids
from specfill.core.io.tokenizer import Tokenizer, load_tokenizer
from tests.fixtures.tiny_spm import train_tiny_spm, write_spm_gguf

PROMPTS = [
    "What is the capital of France?",
    "héllo wörld — naïve café 東京 Ελληνικά 🚀🇫🇷 👩‍👩‍👧",
    "In 2024, 3.14159 > 42;\n\n\tdef f(x):  return x**2",
    "<|im_start|>user\nhi<|im_end|>",
    "   leading spaces and trailing   ",
    "",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi 🚀"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Capital of France?"},
]


@pytest.fixture(scope="module")
def transformers_module():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="module")
def spm_files(tmp_path_factory):
    pytest.importorskip("sentencepiece")
    directory = tmp_path_factory.mktemp("spm")
    model = train_tiny_spm(directory)
    return model, write_spm_gguf(directory / "spm.gguf", model)


def test_tiny_bpe_gguf_and_directory_agree_with_transformers(tiny_checkpoint, transformers_module):
    from_gguf = load_tokenizer(tiny_checkpoint("llama", "gguf"))
    directory = tiny_checkpoint("llama", "safetensors")
    from_dir = load_tokenizer(directory)
    reference = transformers_module.AutoTokenizer.from_pretrained(directory)
    for text in PROMPTS:
        ids = reference.encode(text)
        assert from_gguf.encode(text) == from_dir.encode(text) == ids, text
        assert from_gguf.decode(ids) == from_dir.decode(ids) == reference.decode(ids) == text
    assert len(from_dir.encode("the capital")) < len("the capital")  # merges are in use
    assert from_gguf.bos_token_id == from_dir.bos_token_id == 1
    # the GGUF ends at <|endoftext|> (id 0) too, by llama.cpp's rule; the directory at what its files list (HF's)
    assert from_gguf.eos_token_ids == frozenset({2, 0}) and from_dir.eos_token_ids == frozenset({2})
    for generation in (True, False):
        expected = reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=generation)
        assert from_gguf.apply_chat_template(MESSAGES, add_generation_prompt=generation) == expected
        assert from_dir.apply_chat_template(MESSAGES, add_generation_prompt=generation) == expected
    assert from_gguf.vocab_fingerprint() == from_dir.vocab_fingerprint()


def test_sentencepiece_gguf_matches_sentencepiece(spm_files):
    import sentencepiece as spm

    model, gguf_path = spm_files
    reference = spm.SentencePieceProcessor(model_file=str(model))
    tok = load_tokenizer(gguf_path)
    texts = [t for t in PROMPTS if "<|" not in t] + ["  two  spaces\nnewline", " x", "zyxwvq"]
    for text in texts:
        ids = reference.encode(text)
        assert tok.encode(text) == [reference.bos_id(), *ids], text  # add_bos_token is set
        assert tok.encode(text, add_special_tokens=False) == ids, text
        assert tok.decode(ids) == reference.decode(ids), text
    byte_pieces = [tok.token_text(i) for i in tok.encode("🚀", add_special_tokens=False)]
    assert "<0xF0>" in byte_pieces  # byte fallback for a character the vocabulary lacks
    assert tok.bos_token_id == reference.bos_id() and tok.eos_token_ids == {reference.eos_id()}


def test_fingerprint_tells_vocabularies_apart(tiny_checkpoint, spm_files, tmp_path):
    bpe = load_tokenizer(tiny_checkpoint("qwen3", "safetensors"))
    assert load_tokenizer(tiny_checkpoint("qwen2", "gguf")).vocab_fingerprint() == bpe.vocab_fingerprint()
    assert load_tokenizer(spm_files[1]).vocab_fingerprint() != bpe.vocab_fingerprint()
    changed = tmp_path / "changed"
    shutil.copytree(tiny_checkpoint("qwen3", "safetensors"), changed)
    data = json.loads((changed / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    token = next(t for t, i in vocab.items() if i == 100)
    vocab["X" + token] = vocab.pop(token)  # one token spelled differently, same ids otherwise
    data["model"]["merges"] = [
        m for m in data["model"]["merges"] if token not in ("".join(m) if isinstance(m, list) else m.replace(" ", ""))
    ]
    (changed / "tokenizer.json").write_text(json.dumps(data))
    assert load_tokenizer(changed).vocab_fingerprint() != bpe.vocab_fingerprint()


STREAM_TEXTS = ["héllo wörld 東京 🚀🇫🇷 👩‍👩‍👧 done", "plain ascii, with  spaces\nand lines", "🚀"]


def _stream(tok, ids):
    stream = tok.streaming_detokenizer()
    pieces = [stream.add_token(i) for i in ids]
    return pieces, "".join(pieces) + stream.finish()


@pytest.mark.parametrize("vocabulary", ["byte-level BPE", "sentencepiece"])
def test_streaming_detokenizer_equals_decode(tiny_checkpoint, request, vocabulary):
    if vocabulary == "sentencepiece":
        tok = load_tokenizer(request.getfixturevalue("spm_files")[1])
    else:
        tok = load_tokenizer(tiny_checkpoint("llama", "gguf"))
    for text in STREAM_TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        pieces, streamed = _stream(tok, ids)
        assert streamed == tok.decode(ids) == text
        assert "\ufffd" not in "".join(pieces)
    # a 4-byte emoji as byte tokens: nothing printable until its last byte arrives
    pieces, _ = _stream(tok, tok.encode("🚀", add_special_tokens=False))
    assert len(pieces) > 1 and pieces[:-1] == [""] * (len(pieces) - 1) and pieces[-1] == "🚀"


def test_streaming_detokenizer_flushes_an_incomplete_character(tiny_checkpoint):
    tok = load_tokenizer(tiny_checkpoint("llama", "gguf"))
    broken = tok.encode("🚀", add_special_tokens=False)[:2]  # cut mid-character
    pieces, streamed = _stream(tok, broken)
    assert pieces == ["", ""] and streamed == tok.decode(broken)


def test_chat_template_errors_and_sandbox(tiny_checkpoint):
    tok = load_tokenizer(tiny_checkpoint("llama", "gguf"))
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.apply_chat_template(MESSAGES)
    cases = {
        "{{ raise_exception('roles must alternate') }}": "roles must alternate",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}": "unsafe",
        "{% set _ = messages.append({'role': 'x'}) %}": "unsafe",
        "{% for m in messages %}": "invalid Jinja",
        "{{ messages[0]['content'] + 1 }}": "failed to render",
    }
    for template, words in cases.items():
        tok.chat_template = template
        with pytest.raises(ChatTemplateError, match=words):
            tok.apply_chat_template(MESSAGES)
    tok.chat_template = "{{ strftime_now('%Y') | length }} {{ messages[1] | tojson }}"
    assert tok.apply_chat_template(MESSAGES) == '4 {"role": "user", "content": "Hi 🚀"}'
    with pytest.raises(ChatTemplateError, match="message 0"):
        tok.apply_chat_template(["just a string"])


def test_tokenizer_load_errors(tmp_path, tiny_checkpoint):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(tmp_path / "absent")
    directory = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), directory)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        load_tokenizer(directory)
    (directory / "tokenizer.json").write_text("{broken")
    with pytest.raises(ModelLoadError, match="cannot read .*tokenizer.json"):
        load_tokenizer(directory)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError, match="bad magic"):
        load_tokenizer(bad)
    import gguf

    for model, words in ((None, "has no tokenizer"), ("bert", "tokenizer model 'bert'")):
        path = tmp_path / f"{model}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        if model is not None:
            writer.add_tokenizer_model(model)
            writer.add_token_list(["a", "b"])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(ModelLoadError, match=words):
            load_tokenizer(path)


@pytest.mark.slow
def test_demo_tokenizer_matches_transformers(transformers_module):
    from specfill.core.io.demo_model import require_demo_model

    try:
        path = require_demo_model()
    except ModelLoadError as err:
        pytest.skip(f"demo model not downloaded ({err})")
    pytest.importorskip("torch")  # transformers reads GGUF files through torch
    tok = load_tokenizer(path)
    reference = transformers_module.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in PROMPTS + ["a" * 50 + " !!!???", "The capital of France is Paris."]:
        ids = reference.encode(text)
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == reference.decode(ids)
        assert _stream(tok, ids)[1] == reference.decode(ids)
    assert tok.encode("What is the capital of France?") == [1780, 314, 260, 3575, 282, 4649, 47]
    for generation in (True, False):
        assert tok.apply_chat_template(MESSAGES, add_generation_prompt=generation) == reference.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=generation
        )
    # <|im_end|> declared; <|endoftext|> and <reponame> (its fill-in-the-middle repository token) by their text
    assert tok.bos_token_id == 1 and tok.eos_token_ids == {2, 0, 4}
    assert tok.token_text(1) == "<|im_start|>" and tok.vocab_size == 49152


def test_directory_flags_generation_config_and_template_file(tmp_path, tiny_checkpoint):
    directory = tmp_path / "flags"
    shutil.copytree(tiny_checkpoint("llama", "safetensors"), directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(dict(config, add_bos_token=True)))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (directory / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    tok = load_tokenizer(directory)
    assert tok.encode("the") == [1, *tok.encode("the", add_special_tokens=False)]
    assert tok.eos_token_ids == {0, 2}
    assert tok.apply_chat_template([{"role": "user", "content": "hey"}]) == "<|im_start|>hey"


def test_gguf_ends_where_llama_cpp_ends(tiny_checkpoint):
    """A GGUF declares one end id; the tokens llama.cpp ends generation on by their text end it too (Qwen2.5's
    GGUFs declare <|im_end|>; its models also end with <|endoftext|>, and went on writing past it before)."""
    from specfill.core.io.weights import read_gguf_metadata

    meta = dict(read_gguf_metadata(tiny_checkpoint("llama", "gguf")))
    tokens = list(meta["tokenizer.ggml.tokens"])
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert Tokenizer.from_gguf_metadata(meta).eos_token_ids == {0, 2}
    # the declared id stays first: the template's eos_token and add_eos_token's id
    meta["tokenizer.ggml.add_eos_token"] = True
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.encode("hi")[-1] == 2 and tok.apply_chat_template([{"role": "user", "content": "x"}]).count("<|im_end|>")
    # a vocabulary without those texts ends at its declared id alone
    renamed = {**meta, "tokenizer.ggml.tokens": ["<|eos0|>", *tokens[1:2], "<|eos2|>", *tokens[3:]]}
    assert Tokenizer.from_gguf_metadata(renamed).eos_token_ids == {2}
    # a declared fill-in-the-middle separator ends it too (llama.cpp: fim_pad / fim_rep / fim_sep)
    assert Tokenizer.from_gguf_metadata({**renamed, "tokenizer.ggml.fim_sep_token_id": 7}).eos_token_ids == {2, 7}


def test_end_of_generation_texts_and_their_exceptions():
    assert end_of_generation_ids(["a", "<|eot_id|>", "b", "<|end_of_text|>", "<|eom_id|>"]) == [1, 3, 4]
    assert end_of_generation_ids(["<end_of_turn>", "<|im_end|>x", "end"]) == [0]  # whole texts only
    assert end_of_generation_ids(["<|end|>", "<|user|>"]) == [0]  # Phi-3: <|end|> ends a reply
    # a coder model completing a file ends at its fill-in-the-middle pad, repository and file-separator tokens
    assert end_of_generation_ids(["<|fim_prefix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]) == [1, 2, 3]
    # only added tokens (control 3, user-defined 4) count: Qwen's vocabulary has "</s>" as a plain piece (type 1)
    assert end_of_generation_ids(["</s>", "<|endoftext|>"], [1, 3]) == [1]
    assert end_of_generation_ids(["</s>", "<|endoftext|>"], [3, 4]) == [0, 1]
    # gpt-oss's harmony: <|end|> closes one message of a reply (analysis, then final); <|return|> / <|call|> end it
    harmony = ["<|start|>", "<|end|>", "<|message|>", "<|return|>", "<|call|>", "<|channel|>"]
    assert end_of_generation_ids(harmony) == [3, 4]
    assert end_of_generation_ids(["<|end|>", "<|calls|>", "<|flush|>"]) == [1, 2]  # Solar Open, likewise
    assert end_of_generation_ids(["</s>", "<|tool_response>", "<turn|>"]) == [1, 2]  # Gemma 4: </s> is no end
