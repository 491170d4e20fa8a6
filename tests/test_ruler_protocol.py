"""The RULER selection protocol (evaluation/ruler_protocol.py, ruler_protocol_report.py): candidate
specs, the shared-pass scorer against the NumPy reference, causes, maps, the summary and frontier
rows, and `specfill eval --candidates` end to end (saved passes, the full-answer cache, resuming)."""

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig
from specfill.core.reference import REFERENCE
from specfill.core.reference.specprefill import speculative_selection
from specfill.evaluation.machine import timing_machine
from specfill.evaluation.ruler_protocol import (
    PassScores,
    SavedPass,
    candidate_grid,
    classify,
    compact_map,
    expand_map,
    parse_candidate,
    resolve_candidates,
)
from specfill.evaluation.ruler_protocol_report import frontier, markdown, summarize


def _record(setting, score, answer_kept, kept=100, ttft=10.0, index=0, task="vt"):
    return {
        "task": task,
        "tokens": 1000,
        "index": index,
        "setting": setting,
        "kind": "full" if setting == "full" else "specprefill",
        "score": score,
        "answer_kept": answer_kept,
        "kept_tokens": kept,
        "prompt_tokens": 1000,
        "ttft_s": ttft,
        "prediction": "x",
        "expected": ["A"],
    }


def test_losses_are_selection_when_an_answer_span_was_dropped_else_misread():
    records = [
        _record("full", 1.0, None, 1000, 100.0),
        _record("dropped", 0.4, [1.0, 0.2]),
        _record("kept", 0.4, [1.0, 0.9]),
        _record("as good", 1.0, [0.0]),
        _record("no full", 0.0, [0.0], index=1),
    ]
    classify(records)
    assert [r["cause"] for r in records] == [None, "selection", "misread", None, None]
    assert records[1]["full_score"] == 1.0 and records[4]["full_score"] is None


def test_selection_only_records_count_in_recall_and_the_frontier_averages_tasks():
    records = [
        _record("full", 1.0, None, 1000, 100.0),
        _record("full", 1.0, None, 1000, 100.0, index=1),
        _record("a", None, [0.25, 1.0], ttft=None),
        _record("a", 0.5, [1.0, 1.0], ttft=20.0, index=1),
        _record("full", 0.0, None, 1000, 50.0, task="qa_1"),
        _record("a", 1.0, [1.0], ttft=10.0, task="qa_1"),
    ]
    rows = {(r["task"], r["setting"]): r for r in summarize(records)}
    a = rows[("vt", "a")]
    assert records[2]["cause"] is None and records[3]["cause"] == "misread"
    assert a["samples"] == 2 and a["decoded"] == 1 and a["score"] == 50.0
    assert a["answer_recall"] == pytest.approx(0.625) and a["span_recall"] == pytest.approx(0.8125)
    assert a["all_spans_kept"] == 1 and a["speedup"] == pytest.approx(5.0) and rows[("vt", "full")]["speedup"] is None
    front = {r["setting"]: r for r in frontier(list(rows.values()))}
    assert front["a"]["score"] == pytest.approx(75.0) and front["a"]["tasks"] == 2
    # against full on the same samples: vt sample 1 only (sample 0 was not decoded), qa_1 sample 0
    assert front["a"]["vs_full_mean"] == pytest.approx((-50 + 100) / 2) and front["a"]["vs_full_worst"] == -50
    assert front["a"]["speedup"] == pytest.approx(np.sqrt(5.0 * 5.0))


XEON = {"cpu": "Xeon", "cpu_features": "amx_bf16", "torch_threads": 2}
EPYC = {"cpu": "EPYC", "cpu_features": "avx512_bf16", "torch_threads": 2}


def test_a_speed_up_divides_only_times_taken_on_one_machine():
    """Full prefill's records copied in from a run on another CPU (its answer cache) give no speed-up
    against a setting timed here, nor does a setting decoded on a pass timed elsewhere; named records
    on one machine do, and so do the unnamed records of a result whose runs were all on one machine
    (results written before records named theirs)."""
    xeon, epyc = timing_machine(XEON), timing_machine(EPYC)
    runs = [{"started": "2026-12-01T01:00:00Z", "machine": XEON}, {"started": "2026-12-04T19:00:00Z", "machine": EPYC}]
    full = {**_record("full", 1.0, None, 1000, 100.0), "measured": "2026-12-01T02:00:00Z"}  # the Xeon's, by its time
    here = {**_record("a", 1.0, [1.0], ttft=20.0), "speculator_s": 5.0, "timed_on": epyc, "pass_timed_on": epyc}
    moved = {**here, "setting": "b", "pass_timed_on": xeon}
    rows = {r["setting"]: r for r in summarize([full, here, moved], runs)}
    assert rows["a"]["speedup"] is None and rows["a"]["timed_apart"] == sorted([xeon, epyc])
    assert rows["b"]["timed_apart"] == sorted([xeon, epyc])
    rows = {r["setting"]: r for r in summarize([{**full, "timed_on": epyc}, here, moved], runs)}
    assert rows["a"]["speedup"] == pytest.approx(5.0) and rows["a"]["timed_apart"] is None
    assert rows["b"]["speedup"] is None  # its pass was timed on the Xeon
    unnamed = [_record("full", 1.0, None, 1000, 100.0), {**_record("a", 1.0, [1.0], ttft=20.0), "speculator_s": 5.0}]
    assert summarize(unnamed, runs[1:] * 2)[1]["speedup"] == pytest.approx(5.0)  # two runs, one machine
    assert summarize(unnamed, runs)[1]["timed_apart"] == ["None"]  # two machines: unknown
    text = "\n".join(markdown(summarize([full, here], runs), [full, here], []))
    assert "No speed-up for a at 1000 (1 task(s))" in text and xeon in text


def test_maps_round_trip_as_runs_or_rounded_fractions():
    binary = np.zeros(20)
    binary[[0, 1, 2, 7, 19]] = 1.0
    stored = compact_map(binary.tolist())
    assert stored == {"n": 20, "runs": [[0, 3], [7, 8], [19, 20]]}
    np.testing.assert_array_equal(expand_map(stored), binary)
    np.testing.assert_allclose(expand_map(compact_map([0.0, 0.333, 1.0])), [0.0, 0.33, 1.0])
    assert compact_map(None) is None


def test_candidate_specs_build_the_configs_and_reject_bad_ones():
    name, config = parse_candidate("mass:keep_mass=0.5,mass_ceiling=0.3,layer_reduction=mean,keep_last=64")
    assert name == "mass" and config == SpecPrefillConfig(
        keep_mass=0.5, mass_ceiling=0.3, layer_reduction="mean", keep_last=64
    )
    assert parse_candidate("h2o share:memory_share=0.25") == ("h2o share", H2OConfig(memory_share=0.25))
    assert parse_candidate("full") == ("full", None) and parse_candidate("sp:") == ("sp", SpecPrefillConfig())
    assert set(resolve_candidates(["defaults"])) == {"full", "h2o", "specprefill"}
    assert "mean 0.2" in resolve_candidates(["grid"])
    for bad in ("bad:keep_mass=2", "bad:no_such=1", "bad:keep_ratio", ":keep_ratio=0.2", "full:keep_ratio=0.2"):
        with pytest.raises(ConfigError):
            parse_candidate(bad)


@pytest.mark.parametrize("windows", [(None, None, None), (None, 40, None)])
@pytest.mark.parametrize("saved_window", [1, 6])
def test_shared_pass_scoring_selects_what_the_reference_selects(windows, saved_window):
    """PassScores (per-layer softmax, pooling, head reduction once per sample) keeps exactly the
    tokens speculative_selection keeps, for every grid candidate and the options it does not use,
    from a pass holding the prompt's last query only or its last 6 (query windows 1 to 6)."""
    rng = np.random.default_rng(3)
    n_l, n_q, hq, hkv, p, d = 3, 8 + saved_window, 4, 2, 300, 16
    saved = SavedPass(
        rng.standard_normal((n_l, n_q, hq, d)).astype(np.float32),
        rng.standard_normal((n_l, hkv, p, d)).astype(np.float32),
        np.arange(p),
        1.0,
        d**-0.5,
        windows,
        saved_window,
    )
    scores = PassScores(saved)
    configs = list(candidate_grid().values()) + [
        SpecPrefillConfig(lookahead=3, pool_kernel=1, select_chunk=8),
        SpecPrefillConfig(layers="last-1"),
        SpecPrefillConfig(keep_ratio=0.05, token_floor=100, keep_first=7, keep_last=9),
    ]
    if saved_window > 1:
        configs += [SpecPrefillConfig(query_window=6), SpecPrefillConfig(query_window=3, lookahead=2)]
    for config in configs:
        config = replace(config, layers="last-2") if config.layers == "last-16" else config
        first = saved_window - config.query_window
        _, expected = speculative_selection(
            saved.queries[:, first : saved_window + config.lookahead].astype(np.float64),
            saved.keys.astype(np.float64),
            config,
            saved.scale,
            REFERENCE,
            windows if any(windows) else (),
            n_window=config.query_window,
        )
        np.testing.assert_array_equal(scores.select(config).kept, expected.kept)
    if saved_window == 1:
        with pytest.raises(ConfigError, match="query window 4 exceeds the saved pass's 1"):
            scores.select(SpecPrefillConfig(query_window=4))


def test_a_saved_pass_round_trips(tmp_path):
    saved = SavedPass(
        np.ones((1, 2, 2, 4), np.float32), np.zeros((1, 1, 5, 4), np.float32), np.arange(5), 1.5, 0.5, (None, 7)
    )
    saved.save(tmp_path / "p.npz")
    back = SavedPass.load(tmp_path / "p.npz")
    assert back.windows == (None, 7) and back.seconds == 1.5 and back.scale == 0.5 and back.n_window == 1
    assert back.timed_on == ""  # not said: a pass timed before passes named their machine
    np.testing.assert_array_equal(back.queries, saved.queries)
    assert [p.name for p in tmp_path.iterdir()] == ["p.npz"]  # nothing left half-written


def test_eval_candidates_end_to_end_saves_passes_caches_full_answers_and_resumes(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    """`eval --candidates`: a selection-only run saves one speculator pass per sample and records
    what each SpecPrefill candidate kept; a decoding run reuses those passes, computes full
    prefill's answers once (a second run's come from the cache) and adds H2O; a rerun skips
    every recorded (sample, candidate); the report, frontier and plots are written."""
    from specfill.cli.main import main
    from specfill.evaluation.ruler_data import ruler_available

    if ruler_available() is not None:
        pytest.skip(ruler_available())
    model = str(tiny_checkpoint("llama", "gguf"))
    common = [
        "eval",
        "--backend",
        "cuda",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--model",
        model,
        "--speculator",
        "self:1",
        "--tasks",
        "niah_multivalue",
        "--ruler-lengths",
        "600",
        "--trials",
        "2",
        "--answer-tokens",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path),
    ]
    spec = ["a:keep_ratio=0.2,select_chunk=8,layer_reduction=mean", "b:keep_ratio=0.3,select_chunk=8"]
    assert main([*common, "--name", "sel", "--selection-only", "--candidates", *spec]) == 0, capsys.readouterr().err
    sel = json.loads((tmp_path / "sel.json").read_text())
    assert len(sel["records"]) == 4 and all(r["score"] is None and len(r["answer_kept"]) == 4 for r in sel["records"])
    passes = list((tmp_path / "cache" / "passes").rglob("*.npz"))
    assert len(passes) == 2
    stamps = [p.stat().st_mtime_ns for p in passes]

    h2o = "h2o:chunk_size=128,batch_size=128,local=16,heavy=16"
    composed = "specprefill+h2o:keep_ratio=0.3,select_chunk=8"  # its own (H2O) pass, through the API
    spec = [*spec, composed]
    select = PassScores.select

    def slow_select(self, config):  # the NumPy reference's selection, made slow: timed apart, not in the TTFT
        time.sleep(0.3)
        return select(self, config)

    monkeypatch.setattr(PassScores, "select", slow_select)
    assert main([*common, "--name", "dec", "--candidates", "full", h2o, *spec]) == 0, capsys.readouterr().err
    monkeypatch.setattr(PassScores, "select", select)
    assert [p.stat().st_mtime_ns for p in passes] == stamps  # the saved passes were reused
    dec = json.loads((tmp_path / "dec.json").read_text())
    assert len(dec["records"]) == 10 and all(r["score"] is not None for r in dec["records"])
    assert {r["kind"] for r in dec["records"] if r["setting"] == "specprefill+h2o"} == {"specprefill+h2o"}
    assert not any(r.get("cached") for r in dec["records"])
    assert len(list((tmp_path / "cache" / "answers").rglob("*.json"))) == 2
    here = timing_machine(dec["runs"][-1]["machine"])  # every time taken here, the saved passes' too
    assert {r["timed_on"] for r in dec["records"]} == {here}
    on_pass = [r for r in dec["records"] if r["setting"] in ("a", "b")]
    assert {r["pass_timed_on"] for r in on_pass} == {here}
    assert all(r["reference_selection_s"] >= 0.3 > r["ttft_s"] - r["speculator_s"] for r in on_pass)
    assert SavedPass.load(passes[0]).timed_on == here

    assert main([*common, "--name", "dec2", "--candidates", "full"]) == 0
    again = json.loads((tmp_path / "dec2.json").read_text())["records"]
    full = {r["index"]: r for r in dec["records"] if r["setting"] == "full"}
    assert all(r["cached"] and r["prediction"] == full[r["index"]]["prediction"] for r in again)
    import torch

    if not torch.cuda.is_available():  # no --device: the CUDA backend's CPU fallback, the same cache as --device cpu
        default = [a for a in common if a not in ("--device", "cpu")]
        assert main([*default, "--name", "dec3", "--candidates", "full"]) == 0
        assert all(r["cached"] for r in json.loads((tmp_path / "dec3.json").read_text())["records"])

    before = (tmp_path / "dec.json").read_text()
    assert main([*common, "--name", "dec", "--candidates", "full", h2o, *spec]) == 0
    capsys.readouterr()
    assert (tmp_path / "dec.json").read_text() == before  # every record there: nothing run again
    text = (tmp_path / "dec.md").read_text()
    assert "## Frontier" in text and "| 600 | a |" in text
    for png in ("dec_frontier.png", "dec_tradeoff_600.png", "sel_frontier.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_the_composition_is_a_candidate_that_runs_its_own_pass():
    from specfill.core.runtime import COMPOSED
    from specfill.evaluation.ruler_passes import pass_path
    from specfill.evaluation.ruler_protocol import method_name, on_saved_pass, selected_alone

    name, setting = parse_candidate("specprefill+h2o:keep_ratio=0.2")
    assert setting.keep_ratio == 0.2 and setting.speculator_prefill.layers == "all"
    assert method_name(setting) == COMPOSED and not on_saved_pass(setting)  # decoded: through the API
    assert on_saved_pass(setting, selection_only=True)  # selection only: on its saved H2O pass
    _, dense = parse_candidate("specprefill+h2o:speculator_prefill=dense")
    assert dense.speculator_prefill is None and on_saved_pass(dense)
    # a nested speculator's selection is its own pass's, never a saved (whole) pass's
    nested = SpecPrefillConfig(layers="first-1", deep_keep=0.3)
    assert not on_saved_pass(nested) and not on_saved_pass(nested, selection_only=True)
    assert not selected_alone(nested) and selected_alone(dense) and method_name(nested) == "specprefill"
    # one pass per speculator prefill: the dense pass keeps its old name, H2O passes one per H2OConfig
    _, other = parse_candidate("c+h2o:keep_ratio=0.1,query_window=32,h2o_layers=last-0.67")
    _, same = parse_candidate("d+h2o:keep_ratio=0.3,neighbours=1")
    paths = {s: pass_path(Path("p"), "x", c) for s, c in [("d", dense), ("h", setting), ("o", other), ("s", same)]}
    assert paths["d"] == Path("p/x.npz") and paths["h"] == paths["s"] != paths["o"]
    assert paths["h"].name.startswith("x_h2o-")
    assert method_name(parse_candidate("h2o")[1]) == "h2o" and method_name(None) == "full"


def test_eval_candidates_errors_are_one_line(capsys):
    from specfill.cli.main import main

    assert main(["eval", "--tasks", "vt", "--model", "x.gguf", "--candidates", "bad:keep_ratio=7"]) == 2
    assert main(["eval", "--tasks", "vt", "--model", "x.gguf", "--selection-only"]) == 2
    assert main(["eval", "--tasks", "perplexity", "--model", "x.gguf", "--candidates", "full"]) == 2
    err = capsys.readouterr().err
    assert "keep ratio" in err and "--candidates" in err and "Traceback" not in err
    # a nested speculator's candidate has no saved pass to be scored on: refused, not skipped in silence
    nested = [
        "eval",
        "--tasks",
        "vt",
        "--model",
        "x.gguf",
        "--selection-only",
        "--candidates",
        "n+h2o:deep_keep=0.3,deep_from=0.5",
    ]
    assert main(nested) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'n+h2o'" in err and "deep_keep" in err and "Traceback" not in err


def test_a_selection_only_run_loads_the_speculator_alone(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """`--selection-only` with a speculator file opens that file alone (no main model: it only
    scores), and its saved pass is the one a run with the main model beside it saves."""
    import specfill.api
    from specfill.cli.main import main
    from specfill.evaluation.ruler_data import ruler_available
    from specfill.evaluation.ruler_passes import SavedPass

    if ruler_available() is not None:
        pytest.skip(ruler_available())
    model, speculator = (str(tiny_checkpoint("llama", "gguf", seed=s)) for s in (0, 1))
    opened, real_open = [], specfill.api.open

    def counted_open(path, **kw):
        opened.append((str(path), kw.get("speculator")))
        return real_open(path, **kw)

    monkeypatch.setattr(specfill.api, "open", counted_open)
    common = ["eval", "--backend", "cuda", "--device", "cpu", "--dtype", "float32", "--model", model]
    common += ["--speculator", speculator, "--tasks", "niah_multivalue", "--ruler-lengths", "600", "--trials", "1"]
    common += ["--out", str(tmp_path), "--candidates", "a:keep_ratio=0.2,select_chunk=8"]
    cache = ["--cache-dir", str(tmp_path / "alone")]
    assert main([*common, *cache, "--name", "sel", "--selection-only"]) == 0, capsys.readouterr().err
    assert opened == [(speculator, None)]
    cache = ["--cache-dir", str(tmp_path / "beside")]
    assert main([*common, *cache, "--name", "dec", "--answer-tokens", "2"]) == 0, capsys.readouterr().err
    assert opened[1:] == [(model, speculator)]
    alone, beside = (next((tmp_path / c / "passes").rglob("*.npz")) for c in ("alone", "beside"))
    a, b = SavedPass.load(alone), SavedPass.load(beside)
    assert np.array_equal(a.ids, b.ids)
    for name in vars(a):
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y), name
