"""`specfill bench` and `specfill eval` on a tiny model: the files they write hold real rows."""
import json

import pytest

from specfill.cli.main import main

pytest.importorskip("torch")


def test_bench_writes_json_markdown_and_plot(tiny_checkpoint, tmp_path, capsys):
    model = str(tiny_checkpoint("llama", "gguf"))
    code = main(["bench", "--backends", "cuda", "--device", "cpu", "--model", model, "--methods", "full",
                 "--lengths", "24,48", "--decode-tokens", "3", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = data["rows"]
    assert [(r["method"], r["prompt_tokens"]) for r in rows] == [("full", 24), ("full", 48)]
    assert all(r["ttft_s"] > 0 and r["kept_tokens"] == r["prompt_tokens"] and r["ttft_speedup_vs_full"] == 1.0
               for r in rows)
    assert data["machine"]["cores"] >= 1 and data["machine"]["versions"]["torch"]
    assert "| cuda | full | 48 |" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench_ttft.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_writes_perplexity_and_passkey(tiny_checkpoint, tmp_path, capsys):
    model = str(tiny_checkpoint("llama", "gguf"))
    code = main(["eval", "--backend", "cuda", "--device", "cpu", "--model", model, "--methods", "full",
                 "--perplexity-lengths", "40", "--passkey-lengths", "60", "--trials", "2", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "eval.json").read_text())
    (ppl,) = data["perplexity"]
    assert ppl["method"] == "full" and ppl["tokens"] == 40 and 1.0 < ppl["perplexity"] < 1e4
    (passkey,) = data["passkey"]
    assert passkey["trials"] == 2 and 0.0 <= passkey["accuracy"] <= 1.0
    text = (tmp_path / "eval.md").read_text()
    assert "## Perplexity" in text and "## Passkey retrieval" in text


def test_eval_rejects_unknown_task(capsys):
    assert main(["eval", "--tasks", "mmlu"]) == 2
    assert "unknown task or method: mmlu" in capsys.readouterr().err
