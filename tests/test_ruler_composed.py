"""SpecPrefill over an H2O speculator in the selection protocol (evaluation/ruler_protocol.py,
ruler_passes.py): the candidates' "h2o_*" grammar, and `eval --candidates --selection-only`
recording what a `+h2o` candidate keeps without the main model, scored on the sample's saved H2O
pass: the same kept positions as `specprefill+h2o` through the API, one pass per speculator H2O
config shared by the candidates that have it, resumable."""

import json

import numpy as np
import pytest

from specfill.core import ConfigError, H2OConfig
from specfill.core.runtime import COMPOSED
from specfill.evaluation.ruler_protocol import expand_map, method_name, parse_candidate, resolve_candidates

H2O_SIZES = "h2o_chunk_size=128,h2o_batch_size=128,h2o_local=16,h2o_heavy=16"  # sparse at a 600-token prompt
# a two-layer speculator (self:2): a one-layer one's keys and queries come from the embeddings, H2O or not
A = f"a+h2o:keep_ratio=0.3,select_chunk=8,{H2O_SIZES}"
B = f"b+h2o:keep_ratio=0.3,select_chunk=8,{H2O_SIZES},h2o_dense_tail=0,h2o_layers=last-0.5,layers=first-1"
C = f"c+h2o:keep_ratio=0.15,select_chunk=8,neighbours=1,query_window=4,{H2O_SIZES}"  # A's speculator H2O


def test_h2o_keys_set_the_speculators_h2o():
    _, setting = parse_candidate("c:h2o_layers=last-0.67,h2o_memory_share=0.1,layers=first-0.5")
    assert setting.speculator_prefill == H2OConfig(layers="last-0.67", memory_share=0.1)
    assert setting.layers == "first-0.5" and method_name(setting) == COMPOSED
    _, plain = parse_candidate("c+h2o")
    assert plain.speculator_prefill == H2OConfig(layers="all")  # speculator_h2o(): every layer
    assert resolve_candidates([A, B])["a+h2o"] != resolve_candidates([A, B])["b+h2o"]
    with pytest.raises(ConfigError, match="speculator's H2O, not H2O's"):
        parse_candidate("h2o:h2o_local=8")
    with pytest.raises(ConfigError, match="need speculator_prefill=h2o"):
        parse_candidate("c:speculator_prefill=dense,h2o_local=8")
    with pytest.raises(ConfigError, match="bogus"):
        parse_candidate("c:h2o_bogus=1")


def test_selection_only_runs_the_composed_selection_like_the_api(tiny_checkpoint, tmp_path, capsys):
    from specfill.api import load, stream_generate
    from specfill.cli.main import main
    from specfill.core.runtime import GenerationInfo, PrefillMethod
    from specfill.evaluation.ruler_data import ruler_available
    from specfill.evaluation.ruler_tasks import build_sample

    if ruler_available() is not None:
        pytest.skip(ruler_available())
    model = str(tiny_checkpoint("llama", "gguf"))
    args = ["eval", "--backend", "cuda", "--device", "cpu", "--dtype", "float32", "--model", model]
    args += ["--speculator", "self:2", "--tasks", "niah_multivalue", "--ruler-lengths", "600", "--trials", "1"]
    args += ["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path), "--name", "sel", "--selection-only"]
    assert main([*args, "--candidates", A, B, C]) == 0, capsys.readouterr().err
    records = {r["setting"]: r for r in json.loads((tmp_path / "sel.json").read_text())["records"]}
    assert set(records) == {"a+h2o", "b+h2o", "c+h2o"}
    for r in records.values():
        assert r["kind"] == COMPOSED and r["score"] is None and r["ttft_s"] is None
        assert len(r["answer_kept"]) == 4 and 0 < r["kept_tokens"] < r["prompt_tokens"]
        assert r["speculator_s"] > 0 and r["map"]["n"] == r["prompt_tokens"]
    assert records["a+h2o"]["config"] != records["b+h2o"]["config"]
    assert records["a+h2o"]["map"] != records["b+h2o"]["map"]  # the speculator's H2O reached its pass
    assert records["a+h2o"]["speculator_s"] == records["c+h2o"]["speculator_s"]  # one pass, two candidates
    assert "| 600 | a+h2o |" in (tmp_path / "sel.md").read_text()  # in the frontier, recall against kept share
    assert (tmp_path / "sel_frontier.png").read_bytes()[:4] == b"\x89PNG"
    saved = sorted((tmp_path / "cache" / "passes").rglob("*.npz"))
    assert len(saved) == 2 and all("_h2o-" in p.name for p in saved)  # A and C share one, B has its own
    assert not (tmp_path / "cache" / "answers").exists()

    main_model, tokenizer = load(model, backend="cuda", dtype="float32", device="cpu")
    sample = build_sample(tokenizer, "niah_multivalue", 600, 0, 0, True)
    for name, setting in resolve_candidates([A, B, C]).items():
        info = GenerationInfo()
        method = PrefillMethod("specprefill", specprefill=setting, speculator="self:2")
        for _ in stream_generate(main_model, tokenizer, sample.prompt, 1, method=method, prefill_info=info):
            pass
        kept = np.flatnonzero(expand_map(records[name]["map"]))
        np.testing.assert_array_equal(kept, info.kept_positions)

    before = (tmp_path / "sel.json").read_text()
    assert main([*args, "--candidates", A, B, C]) == 0  # every record there: nothing run again
    assert (tmp_path / "sel.json").read_text() == before
    stamps = [p.stat().st_mtime_ns for p in saved]
    capsys.readouterr()
    d = f"d+h2o:keep_ratio=0.5,select_chunk=8,{H2O_SIZES}"  # a new candidate on A's pass: not run again
    assert main([*args, "--candidates", A, B, C, d]) == 0
    assert "speculator pass" not in capsys.readouterr().err
    assert [p.stat().st_mtime_ns for p in saved] == stamps
    records = {r["setting"]: r for r in json.loads((tmp_path / "sel.json").read_text())["records"]}
    assert records["d+h2o"]["speculator_s"] == records["a+h2o"]["speculator_s"]
    assert records["d+h2o"]["kept_tokens"] > records["a+h2o"]["kept_tokens"]
