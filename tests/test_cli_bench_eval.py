"""`specfill bench` and `specfill eval` on a tiny model: the files they write hold real rows."""

import json
from pathlib import Path

import pytest

from specfill.cli.main import main

pytest.importorskip("torch")


def test_bench_writes_json_markdown_and_plot(tiny_checkpoint, tmp_path, capsys):
    model = str(tiny_checkpoint("llama", "gguf"))
    code = main(
        [
            "bench",
            "--backends",
            "cuda",
            "--device",
            "cpu",
            "--model",
            model,
            "--lengths",
            "24,48",
            "--decode-tokens",
            "3",
            "--chunk-size",
            "8",
            "--batch-size",
            "16",
            "--h2o-local",
            "2",
            "--h2o-heavy",
            "2",
            "--speculator",
            "self:1",
            "--keep",
            "0.25",
            "--select-chunk",
            "4",
            # auto's calibration from these rows: the re-probe (14 of this test's 20 s) is
            # test_auto_method's to test
            "--save-crossover",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    # each row takes its own method's settings: no "do nothing with method" warning per row
    assert "do nothing with method" not in err
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["method"], r["prompt_tokens"]): r for r in data["rows"]}
    assert sorted(rows) == [(m, n) for m in ("full", "h2o", "specprefill") for n in (24, 48)]
    assert all(r["ttft_s"] > 0 and r["ttft_speedup_vs_full"] > 0 for r in rows.values())
    assert rows[("full", 48)]["ttft_speedup_vs_full"] == 1.0 and rows[("h2o", 48)]["kept_tokens"] == 48
    assert rows[("specprefill", 48)]["kept_tokens"] == 12 + 1  # 3 of 12 chunks of 4, plus the last token
    assert data["machine"]["cores"] >= 1 and data["machine"]["versions"]["torch"]
    assert "| cuda | full | 48 |" in (tmp_path / "bench.md").read_text()
    # each run's own peak (the CPU's resident-set high-water mark, reset before it on Linux)
    scope = "run" if Path("/proc/self/clear_refs").exists() else "process"
    assert all(r["peak_memory_gb"] > 0 and r["peak_memory_scope"] == scope for r in rows.values())
    assert "peak memory (GB)" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench_ttft.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_and_eval_report_every_unit_of_work(tiny_checkpoint):
    """What the CLI's progress bars count: bench generations (warm-ups too), eval cells and trials."""
    from specfill.core import H2OConfig, SpecPrefillConfig
    from specfill.evaluation.bench import BenchPlan, run_bench
    from specfill.evaluation.quality import EvalPlan, run_eval

    model = str(tiny_checkpoint("llama", "gguf"))
    h2o, spec = H2OConfig(8, 16, 2, 2, dense_tail=0), SpecPrefillConfig(keep_ratio=0.5, select_chunk=4)
    steps: list[tuple[int, str]] = []
    result = run_bench(
        BenchPlan(
            methods=("full", "h2o"), lengths=(24, 40), model=model, h2o=h2o, decode_tokens=2, repeats=2, device="cpu"
        ),
        log=lambda line: None,
        step=lambda *a: steps.append(a),
    )
    assert len(steps) == 2 * (1 + 2 * 2) and {total for total, _ in steps} == {10}
    assert steps[0][1] == "cuda warm-up full" and steps[-1][1] == "cuda h2o 40"
    # repeats run the methods in turn, round after round (the machine's drift falls on both alike)
    assert [label for _, label in steps[2:6]] == ["cuda full 24", "cuda h2o 24"] * 2
    for row in result["rows"]:
        assert len(row["ttft_runs_s"]) == 2 and row["ttft_s"] == min(row["ttft_runs_s"])
    steps.clear()
    run_eval(
        EvalPlan(
            model=model,
            perplexity_lengths=(30,),
            passkey_lengths=(50,),
            trials=3,
            keeps=(0.5,),
            speculator="self:1",
            h2o=h2o,
            specprefill=spec,
            device="cpu",
        ),
        log=lambda line: None,
        step=lambda *a: steps.append(a),
    )
    # perplexity: full and h2o; passkey: full, h2o, one keep, 3 trials each
    assert len(steps) == 2 + 3 * 3 and {total for total, _ in steps} == {11}
    assert steps[0][1] == "perplexity full 30" and steps[-1][1] == "passkey specprefill keep=0.5 50"


def test_eval_writes_perplexity_and_passkey(tiny_checkpoint, tmp_path, capsys):
    model = str(tiny_checkpoint("llama", "gguf"))
    code = main(
        [
            "eval",
            "--backend",
            "cuda",
            "--device",
            "cpu",
            "--model",
            model,
            "--perplexity-lengths",
            "40",
            "--passkey-lengths",
            "60",
            "--trials",
            "20",
            "--chunk-size",
            "16",
            "--batch-size",
            "16",
            "--h2o-local",
            "4",
            "--h2o-heavy",
            "4",
            "--h2o-dense-tail",
            "0",
            "--speculator",
            "self:1",
            "--keeps",
            "0.5",
            "--select-chunk",
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "eval.json").read_text())
    ppl = {r["method"]: r for r in data["perplexity"]}  # W=0 is not the default: named in the label
    assert sorted(ppl) == ["full", "h2o W=0"] and all(1.0 < r["perplexity"] < 1e4 for r in ppl.values())
    assert ppl["full"]["vs_full_pct"] == 0.0 and ppl["h2o W=0"]["perplexity"] != ppl["full"]["perplexity"]
    passkey = {r["method"]: r for r in data["passkey"]}
    assert sorted(passkey) == ["full", "h2o W=0", "specprefill keep=0.5"]
    assert all(r["trials"] == 20 and 0.0 <= r["accuracy"] <= 1.0 for r in passkey.values())
    # the mid-depth trial's map, for every sparse method (20 trials: no trial at depth exactly 0.5)
    assert sorted(data["maps"]) == ["h2o W=0 @ 60", "specprefill keep=0.5 @ 60"]
    text = (tmp_path / "eval.md").read_text()
    assert "## Perplexity" in text and "## Passkey retrieval" in text
    assert (tmp_path / "eval_positions.png").read_bytes()[:4] == b"\x89PNG"  # kept / memory map
    assert (tmp_path / "eval_tradeoff.png").read_bytes()[:4] == b"\x89PNG"  # speed-up vs quality
    assert passkey["full"]["speedup_vs_full"] == 1.0 and passkey["h2o W=0"]["median_ttft_s"] > 0
    marks = data["map_marks"]["h2o W=0 @ 60"]
    assert 0 < marks["needle"][0] < marks["needle"][1] <= marks["question"][0] < marks["question"][1]
    assert abs(marks["question"][1] - passkey["h2o W=0"]["mean_prompt_tokens"]) < 2  # the mapped trial's length


def test_eval_sweeps_dense_tails_and_scoring_layers(tiny_checkpoint, tmp_path, capsys):
    model = str(tiny_checkpoint("llama", "gguf"))
    code = main(
        [
            "eval",
            "--backend",
            "cuda",
            "--device",
            "cpu",
            "--model",
            model,
            "--tasks",
            "passkey",
            "--passkey-lengths",
            "60",
            "--trials",
            "2",
            "--chunk-size",
            "16",
            "--batch-size",
            "16",
            "--h2o-local",
            "4",
            "--h2o-heavy",
            "4",
            "--h2o-dense-tail",
            "0,8",
            "--speculator",
            "self:2",
            "--keeps",
            "0.5",
            "--score-layers",
            "all,last-1",
            "--select-chunk",
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "eval.json").read_text())
    assert [r["method"] for r in data["passkey"]] == [
        "full",
        "h2o W=0",
        "h2o W=8",
        "specprefill keep=0.5 layers=all",
        "specprefill keep=0.5 layers=last-1",
    ]
    assert "full" in data["plan"]["defaults"] and "h2o W=8" not in data["plan"]["defaults"]
    assert main(["eval", "--score-layers", "middle-2"]) == 2


def test_eval_rejects_unknown_task(capsys):
    assert main(["eval", "--tasks", "mmlu"]) == 2
    assert "unknown task or method: mmlu" in capsys.readouterr().err


def test_parity_writes_agreement_report(tiny_checkpoint, tmp_path, capsys):
    pytest.importorskip("mlx.core")
    model = str(tiny_checkpoint("qwen2", "safetensors"))
    code = main(
        [
            "parity",
            "--backends",
            "mlx,cuda",
            "--model",
            model,
            "--prompt-tokens",
            "40",
            "--chunk-size",
            "8",
            "--batch-size",
            "16",
            "--h2o-local",
            "2",
            "--h2o-heavy",
            "2",
            "--speculator",
            "self:1",
            "--keep",
            "0.25",
            "--select-chunk",
            "4",
            "--generate-tokens",
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "parity.json").read_text())
    assert data["full_logits"]["max_abs_diff"] < 1e-4 and data["full_logits"]["top1_agreement"] == 1.0
    assert data["h2o_logits"]["max_abs_diff"] < 1e-4
    assert len(data["h2o_memory_sets"]) == 2 and all(layer["identical"] for layer in data["h2o_memory_sets"])
    assert data["specprefill_kept"]["jaccard"] == 1.0 and data["specprefill_kept"]["count"][0] > 0
    assert data["text"]["identical"] is True
    assert "| H2O memory sets identical (layers) | 2/2 |" in (tmp_path / "parity.md").read_text()
    import torch

    torch_device = "cuda:0 (" if torch.cuda.is_available() else "cpu"
    assert data["devices"]["cuda"].startswith(torch_device) and data["devices"]["mlx"] in ("cpu", "gpu (Metal)")
    assert f"cuda on {data['devices']['cuda']}" in (tmp_path / "parity.md").read_text()


def test_parity_needs_two_backends(capsys):
    assert main(["parity", "--backends", "cuda"]) == 2
    assert "two different backends" in capsys.readouterr().err


def test_a_stopped_bench_or_eval_keeps_the_finished_rows(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """Long runs save every finished row / cell (marked partial), so a stop loses only the current one."""
    from specfill.evaluation import bench, quality

    model = str(tiny_checkpoint("llama", "gguf"))
    real_run, calls = bench._one_run, []

    def stop_on_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # 2 warm-ups, the full row, then a stop during the h2o row
            raise KeyboardInterrupt
        return real_run(*args, **kwargs)

    monkeypatch.setattr(bench, "_one_run", stop_on_fourth)
    code = main(
        [
            "bench",
            "--backends",
            "cuda",
            "--device",
            "cpu",
            "--model",
            model,
            "--lengths",
            "24",
            "--methods",
            "full,h2o",
            "--chunk-size",
            "8",
            "--batch-size",
            "16",
            "--h2o-local",
            "2",
            "--h2o-heavy",
            "2",
            "--decode-tokens",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 130
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["complete"] is False and [r["method"] for r in data["rows"]] == ["full"]
    assert "Partial:" in (tmp_path / "bench.md").read_text()

    real_trial = quality.retrieval_trial
    trials = []

    def stop_on_third_trial(*args, **kwargs):
        trials.append(1)
        if len(trials) == 3:
            raise KeyboardInterrupt
        return real_trial(*args, **kwargs)

    monkeypatch.setattr(quality, "retrieval_trial", stop_on_third_trial)
    code = main(
        [
            "eval",
            "--backend",
            "cuda",
            "--device",
            "cpu",
            "--model",
            model,
            "--tasks",
            "perplexity,passkey",
            "--methods",
            "full",
            "--perplexity-lengths",
            "30",
            "--passkey-lengths",
            "50",
            "--trials",
            "3",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 130
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["complete"] is False and len(data["perplexity"]) == 1 and len(data["passkey"]) == 0
    assert "Partial:" in (tmp_path / "eval.md").read_text()
    capsys.readouterr()


def test_multikey_prompts_hide_every_pair_and_ask_one(tiny_checkpoint):
    """Distinct names and numbers, needles in depth order, the asked needle's token span holds its
    number, and the question comes last; every method sees the same prompts (seeded by length)."""
    from specfill.api import encode_prompt, load
    from specfill.evaluation.quality import retrieval_prompts

    _, tokenizer = load(str(tiny_checkpoint("llama", "gguf")), backend="cuda", device="cpu")
    prompts = retrieval_prompts(tokenizer, "multikey", 300, 4)
    assert prompts == retrieval_prompts(tokenizer, "multikey", 300, 4)
    asked_depths = [depth for *_, depth in prompts]
    assert asked_depths == sorted(asked_depths) and asked_depths[0] < 0.3 < 0.7 < asked_depths[-1]
    for prompt, spans, answer, _ in prompts:
        assert prompt.count("The special magic number for") == 5 and prompt.count(answer) == 1
        ids = encode_prompt(tokenizer, prompt)
        needle = tokenizer.decode(ids[spans["needle"][0] : spans["needle"][1]])
        assert answer in needle.replace(" ", "")
        assert spans["needle"][1] <= spans["question"][0] < spans["question"][1] == len(ids)
        assert "What is the special magic number" in tokenizer.decode(ids[spans["question"][0] :])
        assert 250 <= len(ids) <= 330


def test_eval_multikey_task_writes_its_table(tiny_checkpoint, tmp_path, capsys):
    model = str(tiny_checkpoint("llama", "gguf"))
    code = main(
        [
            "eval",
            "--backend",
            "cuda",
            "--device",
            "cpu",
            "--model",
            model,
            "--tasks",
            "passkey,multikey",
            "--methods",
            "full,h2o",
            "--passkey-lengths",
            "120",
            "--trials",
            "2",
            "--chunk-size",
            "16",
            "--batch-size",
            "16",
            "--h2o-local",
            "4",
            "--h2o-heavy",
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "eval.json").read_text())
    assert [r["method"] for r in data["multikey"]] == ["full", "h2o"] and len(data["passkey"]) == 2
    assert data["multikey"][0]["vs_full_points"] == 0.0 and data["multikey"][1]["speedup_vs_full"] > 0
    assert "multikey h2o @ 120" in data["maps"] and "h2o @ 120" in data["maps"]
    assert "## Multi-key needle" in (tmp_path / "eval.md").read_text()
    assert (tmp_path / "eval_tradeoff.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_ruler_tasks_end_to_end(tiny_checkpoint, tmp_path, capsys):
    """`eval --tasks` with RULER's tasks: one row per (task, method), the same samples for every
    method, the per-sample records, the table and both plots."""
    from specfill.evaluation.ruler_data import ruler_available

    if ruler_available() is not None:
        pytest.skip(ruler_available())
    model = str(tiny_checkpoint("llama", "gguf"))
    code = main(
        [
            "eval",
            "--backend",
            "cuda",
            "--device",
            "cpu",
            "--model",
            model,
            "--tasks",
            "niah_multivalue,niah_single_1",
            "--ruler-lengths",
            "600",
            "--trials",
            "2",
            "--chunk-size",
            "128",
            "--batch-size",
            "128",
            "--h2o-local",
            "16",
            "--h2o-heavy",
            "16",
            "--speculator",
            "self:1",
            "--keeps",
            "0.3",
            "--select-chunk",
            "8",
            "--answer-tokens",
            "3",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "eval.json").read_text())
    rows = {(r["task"], r["method"]): r for r in data["ruler"]}
    methods = ["full", "h2o", "specprefill keep=0.3"]
    assert sorted(rows) == sorted((t, m) for t in ("niah_multivalue", "niah_single_1") for m in methods)
    assert all(r["samples"] == 2 and 0 <= r["score"] <= 100 and r["mean_prompt_tokens"] <= 600 for r in rows.values())
    assert rows[("niah_single_1", "full")]["speedup_vs_full"] == 1.0
    samples = [r for r in data["ruler_samples"] if r["task"] == "niah_multivalue"]
    assert len(samples) == 6 and len({(r["index"], r["prompt_tokens"]) for r in samples}) == 2  # shared samples
    spec = [r for r in samples if r["method"].startswith("specprefill")]
    assert all(r["kept_tokens"] < r["prompt_tokens"] and len(r["needle_kept"]) == 4 for r in spec)
    assert "| niah_single_1 | 600 | h2o | 2 |" in (tmp_path / "eval.md").read_text()
    assert (tmp_path / "eval_ruler_tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "eval_ruler_positions.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_ruler_without_its_data_is_one_clear_error(monkeypatch, capsys):
    monkeypatch.setattr("specfill.cli.eval.ruler_available", lambda: "RULER's tasks need the 'ruler' extra: ...")
    assert main(["eval", "--tasks", "vt", "--model", "x"]) != 0
    err = capsys.readouterr().err
    assert "'ruler' extra" in err and "Traceback" not in err
