"""`specfill bench`'s drafting modes: --draft-tokens (decode speed with and without drafting) and
--draft-ratios (drafting against plain decoding end to end)."""

import json

import pytest

from specfill.cli.main import main

pytest.importorskip("torch")


def test_bench_draft_tokens_writes_the_drafting_rows(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """`bench --draft-tokens` with the platform's default backend: every row keeps the greedy text."""
    monkeypatch.setattr("specfill.api.mlx_metal_available", lambda: False)  # the default is then cuda
    model = str(tiny_checkpoint("llama", "gguf"))
    code = main(
        [
            "bench",
            "--device",
            "cpu",
            "--model",
            model,
            "--lengths",
            "40",
            "--decode-tokens",
            "6",
            "--draft-tokens",
            "2",
            "--draft-model",
            model,
            "--speculator",
            "self:1",
            "--select-chunk",
            "4",
            "--out",
            str(tmp_path),
            "--name",
            "drafting",
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = json.loads((tmp_path / "drafting.json").read_text())["rows"]
    assert [(r["method"], r["k"]) for r in rows] == [("full", 0), ("full", 2), ("specprefill", 0), ("specprefill", 2)]
    assert all(r["identical"] for r in rows) and rows[1]["accepted"] == rows[1]["drafted"]  # itself drafts
    # the warm-up wrote the pair's cost book: a draft as costly as the main model may be skipped, and says so;
    # a decode that did not skip may still draft nothing (the seeded adaptive length can price k=0 from the
    # first round on a loaded machine), so only "skipped => nothing drafted" is the invariant
    assert not rows[1]["skipped"] or rows[1]["drafted"] == 0
    assert rows[3]["drafted"] > 0  # the speculator: never skipped
    assert (tmp_path / "drafting_decode.png").stat().st_size > 0


def test_bench_draft_ratios_writes_the_table_as_it_goes(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """`bench --draft-ratios` (evaluation/drafting_ratios.py): a row per dtype, prompt kind, reply
    length and run, the last run judged; the table is on disk after every row."""
    monkeypatch.setattr("specfill.api.mlx_metal_available", lambda: False)  # the default is then cuda
    import specfill.evaluation.drafting_ratios as ratios

    written = []
    original = ratios.write_drafting_ratios
    monkeypatch.setattr(
        "specfill.cli.bench.write_drafting_ratios",
        lambda result, *a: written.append(len(result["rows"])) or original(result, *a),
    )
    model = str(tiny_checkpoint("llama", "gguf"))
    (tmp_path / "code.txt").write_text("def f(x):\n    return x + 1\n" * 20)
    (tmp_path / "prose.txt").write_text("The ferry ran twice a week in winter. " * 20)
    args = ["bench", "--device", "cpu", "--model", model, "--draft-model", model, "--lengths", "40"]
    args += ["--draft-ratios", "--reply-tokens", "3,6", "--out", str(tmp_path)]
    args += ["--ratio-prompts", f"code={tmp_path / 'code.txt'},prose={tmp_path / 'prose.txt'}"]
    assert main(args) == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "drafting_ratios.json").read_text())
    rows = data["rows"]
    assert [(r["dtype"], r["prompt"], r["reply_tokens"], r["run"]) for r in rows[:4]] == [
        ("float32", "code", 3, 1),
        ("float32", "code", 3, 2),
        ("float32", "code", 6, 1),
        ("float32", "code", 6, 2),
    ]
    assert len(rows) == 16 and {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    assert [r["judged"] for r in rows[:2]] == [False, True] and all(r["speedup"] > 0 for r in rows)
    assert all(r["identical"] for r in rows if r["dtype"] == "float32")  # greedy drafting is plain greedy
    assert written[:3] == [1, 2, 3] and written[-1] == 16  # rewritten after every row, then at the end
    table = (tmp_path / "drafting_ratios.md").read_text()
    assert "| float32 | code | 3 | **2** |" in table and "Judged rows: 8; least speedup" in table
    assert not list(tmp_path.glob("*.partial"))
    assert main(args[:-1] + ["code=/nonexistent/prompt.txt"]) == 2
    assert "cannot read --ratio-prompts file" in capsys.readouterr().err
