"""method="auto": full prefill below the crossover length, the sparse method above it."""
import json

import pytest

from specfill.api import load, prefill_method, stream_generate
from specfill.cli.main import main
from specfill.core import ConfigError, H2OConfig
from specfill.core.crossover import FALLBACK_CROSSOVER, auto_threshold, crossovers_from_rows, merge_crossovers
from specfill.core.runtime import PrefillInfo, PrefillMethod

ROWS = [{"backend": "cuda", "device": "cpu", "method": m, "prompt_tokens": n, "ttft_speedup_vs_full": s}
        for m, n, s in [("h2o", 512, 1.0), ("h2o", 1024, 0.95), ("h2o", 2048, 1.04), ("h2o", 4096, 1.2),
                        ("specprefill", 512, 1.3), ("specprefill", 2048, 2.5),
                        ("full", 512, 1.0)]] + [
    {"backend": "mlx", "device": "cpu", "method": "h2o", "prompt_tokens": 4096, "ttft_speedup_vs_full": 0.9}]


def test_crossover_is_the_shortest_length_from_which_the_sparse_method_always_wins():
    entries = {(e["backend"], e["method"]): e["crossover_tokens"] for e in crossovers_from_rows(ROWS, "x.json")}
    assert entries == {("cuda", "h2o"): 2048, ("cuda", "specprefill"): 512, ("mlx", "h2o"): None}


def test_threshold_from_the_file_then_fallback(tmp_path, monkeypatch):
    path = merge_crossovers(tmp_path / "crossover.json", crossovers_from_rows(ROWS, "x.json"), {"line": "m"})
    merge_crossovers(path, [{"backend": "cuda", "device": "cpu", "method": "h2o", "crossover_tokens": 3000}], {})
    monkeypatch.setenv("SPECFILL_CROSSOVER", str(path))
    assert auto_threshold("cuda", "cpu", "h2o")[0] == 3000  # replaced, the others kept
    assert auto_threshold("cuda", "cpu", "specprefill")[0] == 512
    assert auto_threshold("mlx", "cpu", "h2o")[0] is None  # measured: never faster
    value, source = auto_threshold("cuda", "cuda:0 (GPU)", "h2o")  # no measurement for this device
    assert value == FALLBACK_CROSSOVER and "fallback" in source
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="crossover file"):
        auto_threshold("cuda", "cpu", "h2o")


def test_auto_runs_full_below_and_the_sparse_method_above_the_threshold(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFILL_CROSSOVER", str(tmp_path / "none.json"))  # no file: the fallback
    model, tok = load(str(tiny_checkpoint("llama", "safetensors")), backend="cuda", device="cpu")
    h2o = H2OConfig(chunk_size=8, batch_size=8, local=2, heavy=2)
    ids = list(range(5, 45))
    for threshold, speculator, want in ((41, None, "full"), (40, None, "h2o"), (10, "self:1", "specprefill"),
                                        (None, None, "full")):
        info = PrefillInfo()
        list(stream_generate(model, tok, ids, 1, method=prefill_method("auto", h2o=h2o, speculator=speculator,
                                                                       auto_threshold=threshold), prefill_info=info))
        assert info.method == want, (threshold, speculator)
    with pytest.raises(ConfigError, match="auto threshold"):
        PrefillMethod("auto", auto_threshold=0)


def test_cli_auto_threshold_needs_method_auto(capsys):
    assert main(["generate", "--auto-threshold", "100", "--prompt", "hi"]) == 2
    assert "--auto-threshold goes with --method auto" in capsys.readouterr().err


def test_crossover_file_written_by_bench_is_valid_json(tmp_path):
    path = merge_crossovers(tmp_path / "c.json", crossovers_from_rows(ROWS, "x.json"), {"line": "m"})
    assert len(json.loads(path.read_text())["entries"]) == 3
