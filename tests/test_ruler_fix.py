"""The RULER loss diagnosis (evaluation/ruler_fix.py, ruler_fix_report.py) on hand-made records:
causes, stored maps, setting specs and the summary rows."""
import numpy as np
import pytest

from specfill.core import ConfigError, H2OConfig, SpecPrefillConfig
from specfill.evaluation.ruler_fix import classify, compact_map, expand_map, parse_setting
from specfill.evaluation.ruler_fix_report import summarize


def _record(setting, score, answer_kept, kept=100, ttft=10.0, index=0):
    return {"task": "vt", "index": index, "setting": setting, "score": score, "answer_kept": answer_kept,
            "kept_tokens": kept, "prompt_tokens": 1000, "ttft_s": ttft, "prediction": "x", "expected": ["A"]}


def test_losses_are_selection_when_an_answer_span_was_dropped_else_misread():
    records = [_record("full", 1.0, None, 1000, 100.0), _record("dropped", 0.4, [1.0, 0.2]),
               _record("kept", 0.4, [1.0, 0.9]), _record("as good", 1.0, [0.0]), _record("no full", 0.0, [0.0], index=1)]
    classify(records)
    assert [r["cause"] for r in records] == [None, "selection", "misread", None, None]
    assert records[1]["full_score"] == 1.0 and records[4]["full_score"] is None


def test_selection_only_records_have_no_cause_but_count_in_recall():
    records = [_record("full", 1.0, None, 1000, 100.0), _record("a", None, [0.25, 1.0], ttft=None),
               _record("a", 0.5, [1.0, 1.0], ttft=20.0, index=0)]
    records[2]["index"] = 1
    rows = {r["setting"]: r for r in summarize(records)}
    assert records[1]["cause"] is None
    assert rows["a"]["samples"] == 2 and rows["a"]["decoded"] == 1 and rows["a"]["score"] == 50.0
    assert rows["a"]["answer_recall"] == pytest.approx(0.625) and rows["a"]["all_spans_kept"] == 1
    assert rows["a"]["speedup"] == pytest.approx(5.0) and rows["full"]["speedup"] is None


def test_maps_round_trip_as_runs_or_rounded_fractions():
    binary = np.zeros(20)
    binary[[0, 1, 2, 7, 19]] = 1.0
    stored = compact_map(binary.tolist())
    assert stored == {"n": 20, "runs": [[0, 3], [7, 8], [19, 20]]}
    np.testing.assert_array_equal(expand_map(stored), binary)
    shares = [0.0, 0.333, 1.0]
    np.testing.assert_allclose(expand_map(compact_map(shares)), [0.0, 0.33, 1.0])
    assert compact_map(None) is None


def test_setting_specs_build_the_configs_and_reject_bad_values():
    name, config = parse_setting("mass:keep_mass=0.5,mass_ceiling=0.3,lookahead_reduction=max,neighbours=1")
    assert name == "mass" and config == SpecPrefillConfig(keep_mass=0.5, mass_ceiling=0.3, lookahead_reduction="max",
                                                          neighbours=1)
    assert parse_setting("h2o share:memory_share=0.25") == ("h2o share", H2OConfig(memory_share=0.25))
    assert parse_setting("keep 0.1:") == ("keep 0.1", SpecPrefillConfig())
    with pytest.raises(ConfigError):
        parse_setting("bad:keep_mass=2")
