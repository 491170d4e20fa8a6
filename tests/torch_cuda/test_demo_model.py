"""The real SmolLM2-135M-Instruct Q4_1 GGUF: our torch backend against HF transformers loading the
same GGUF (fp32), and the errors a bad model path gives."""

from __future__ import annotations

import pytest
import torch

from specfill.backends.torch_cuda import load
from specfill.core.errors import ModelLoadError, SpecfillError
from specfill.core.io.demo_model import require_demo_model
from specfill.core.runtime import GenerationInfo, PrefillMethod, SamplingConfig

pytestmark = pytest.mark.slow

PROMPT = (
    "The history of the lighthouse is a story about people, weather and the slow progress of "
    "engineering. The earliest known lighthouse, the Pharos of Alexandria, was built in the third "
    "century before the common era on a small island at the entrance of the harbour. Its keepers "
    "burned wood at the top of a tall stone tower, and sailors could see the fire from many miles "
    "away. For centuries afterwards most coastal lights were simple fires or candles, and they were "
    "often too dim to help ships in fog or heavy rain. Everything changed in the eighteenth and "
    "nineteenth centuries. Engineers learned to build towers on bare rocks in the open sea, mixing "
    "cements that could set under water and cutting granite blocks that locked together like the "
    "pieces of a puzzle. At the same time, oil lamps with hollow wicks gave a brighter and steadier "
    "flame, and curved mirrors gathered the light into a beam. In 1822 the French physicist "
    "Augustin Fresnel designed a lens made of concentric rings of glass prisms. It was thinner and "
    "lighter than a solid lens of the same power, and it could send a beam more than twenty miles "
    "across the water. Within a few decades Fresnel lenses were installed on coasts all over the "
    "world, each with its own pattern of flashes. Today most lighthouses are automatic, "
    "powered by electricity or by solar panels, and satellites guide the ships. Yet many towers "
    "still shine every night, and people travel long distances to visit them. Explain in one "
    "sentence why Fresnel's lens mattered:"
)


@pytest.fixture(scope="module")
def demo():
    """(our model, our tokenizer, HF model, prompt ids) or a skip when the GGUF is not cached."""
    try:
        path = require_demo_model()
    except ModelLoadError as err:
        pytest.skip(f"demo model not available: {err}")
    transformers = pytest.importorskip("transformers")
    model, tokenizer = load(path, dtype="float32", device="cpu")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    ids = tokenizer.encode(PROMPT)
    return model, tokenizer, hf.eval(), ids


def test_logits_match_transformers_on_the_same_gguf(demo):
    model, _, hf, ids = demo
    assert 280 <= len(ids) <= 340
    with torch.no_grad():
        expected = hf(torch.tensor([ids]), use_cache=False).logits
    logits = model(ids)
    assert logits.shape == expected.shape == (1, len(ids), 49152)
    assert (logits - expected).abs().max().item() <= 1e-3
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))  # top-1 agreement 100%


def test_greedy_32_tokens_match_transformers(demo):
    model, _, hf, ids = demo
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=32,
            do_sample=False,
            eos_token_id=[],
            pad_token_id=2,
        )
    expected = out[0, len(ids) :].tolist()
    ours = list(
        model.generate_step(
            ids,
            max_tokens=32,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=GenerationInfo(),
        )
    )
    assert len(expected) == 32 and ours == expected


def test_prompt_longer_than_the_context(demo):
    model, _, _, _ = demo
    with pytest.raises(
        SpecfillError, match="prompt of 8190 tokens plus max_tokens 8 exceeds the model's context of 8192 tokens"
    ):
        model.generate_step(
            [1] * 8190,
            max_tokens=8,
            sampling=SamplingConfig(),
            stop_ids=frozenset(),
            method=PrefillMethod(),
            info=GenerationInfo(),
        )


def test_missing_and_corrupt_files_are_load_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load(tmp_path / "absent.gguf", device="cpu")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ModelLoadError, match="bad magic"):
        load(bad, device="cpu")
    try:
        source = require_demo_model()
    except ModelLoadError:
        return
    truncated = tmp_path / "truncated.gguf"
    with open(source, "rb") as src:
        truncated.write_bytes(src.read(3_000_000))
    with pytest.raises(ModelLoadError):
        load(truncated, device="cpu")
    config_only = tmp_path / "hf_dir"
    config_only.mkdir()
    (config_only / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load(config_only, device="cpu")
