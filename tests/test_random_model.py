"""random:SHAPE models: shapes, seeded weights, the id tokenizer, loading on both backends, the
benchmark on them and the GPU-session script's smoke run."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specfill.cli.main import main
from specfill.core import ModelLoadError
from specfill.core.io.random_model import RANDOM_SHAPES, random_model_args, random_weights
from specfill.core.io.tokenizer import load_tokenizer
from specfill.core.io.weights import load_weights
from specfill.core.models import expected_tensor_shapes

ROOT = Path(__file__).resolve().parents[1]


def test_llama_1b_shape_is_llama_3_2_1b():
    args = random_model_args("random:llama-1b")
    assert (
        args.num_hidden_layers,
        args.hidden_size,
        args.num_attention_heads,
        args.num_key_value_heads,
        args.head_dim,
        args.vocab_size,
    ) == (16, 2048, 32, 8, 64, 128256)
    assert args.rope_theta == 500000.0 and args.rope_scaling["rope_type"] == "llama3"
    assert args.tie_word_embeddings


@pytest.mark.parametrize("name", sorted(RANDOM_SHAPES))
def test_every_shape_builds_its_args(name):
    args = random_model_args("random:" + name)
    assert args.architecture == RANDOM_SHAPES[name]["model_type"]


def test_weights_are_seeded_and_complete():
    args, weights = load_weights("random:tiny-llama")
    assert {k: v.shape for k, v in weights.items()} == expected_tensor_shapes(args)
    again = random_weights(args, seed=0)
    assert all(np.array_equal(weights[k], again[k]) for k in weights)
    assert not np.array_equal(
        weights["model.embed_tokens.weight"], random_weights(args, seed=1)["model.embed_tokens.weight"]
    )
    assert np.all(weights["model.norm.weight"] == 1.0)
    assert 0.015 < weights["model.layers.0.mlp.up_proj.weight"].std() < 0.025


def test_unknown_shape_is_a_load_error_listing_the_known_ones(capsys):
    with pytest.raises(ModelLoadError, match="random:llama-1b"):
        load_weights("random:llama-70b")
    assert main(["generate", "--model", "random:nope", "--prompt", "1 2"]) == 2
    assert "unknown random-weight shape 'nope'" in capsys.readouterr().err


def test_id_tokenizer_round_trips_ids():
    tokenizer = load_tokenizer("random:tiny-llama")
    assert tokenizer.vocab_size == 512 and not tokenizer.eos_token_ids
    assert tokenizer.encode("5 17 300") == [5, 17, 300]
    assert tokenizer.decode([5, 17, 300]) == "5 17 300"
    assert tokenizer.encode("hello 9") == [0, 9]  # an unknown word reads as id 0


def test_both_backends_load_the_same_random_model():
    pytest.importorskip("torch")
    pytest.importorskip("mlx.core")
    from specfill.api import load, prefill_method
    from specfill.core.runtime import GenerationInfo

    logits = []
    for backend, device in (("cuda", "cpu"), ("mlx", None)):
        model, _ = load("random:tiny-llama", backend=backend, dtype="float32", device=device)
        logits.append(
            np.asarray(model.prompt_logits([5, 17, 300, 2], method=prefill_method("full"), info=GenerationInfo()))
        )
    assert logits[0].shape == (4, 512) and np.abs(logits[0] - logits[1]).max() < 1e-4


def test_bench_on_a_random_model_uses_random_ids(tmp_path, capsys):
    pytest.importorskip("torch")
    code = main(
        [
            "bench",
            "--backends",
            "cuda",
            "--device",
            "cpu",
            "--model",
            "random:tiny-llama",
            "--lengths",
            "40",
            "--methods",
            "full,specprefill",
            "--speculator",
            "self:1",
            "--select-chunk",
            "4",
            "--decode-tokens",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [(r["method"], r["prompt_tokens"]) for r in rows] == [("full", 40), ("specprefill", 40)]
    # keep 0.3 of 40 = three chunks of 4, plus the last token unless one of them holds it
    assert rows[1]["kept_tokens"] in (12, 13) and rows[0]["kept_tokens"] == 40


def test_a_random_model_speculates_for_another_of_its_vocabulary(tmp_path, capsys):
    """`--speculator random:SHAPE` is a separate model (as the GPU run's 1B for its 8B), checked
    against the main model's tokenizer like any speculator path."""
    pytest.importorskip("torch")
    common = ["bench", "--backends", "cuda", "--device", "cpu", "--dtype", "float32", "--lengths", "40"]
    common += ["--methods", "specprefill", "--select-chunk", "4", "--decode-tokens", "2", "--out", str(tmp_path)]
    assert main([*common, "--model", "random:tiny-llama", "--speculator", "random:tiny-llama-32k"]) == 0
    row = json.loads((tmp_path / "bench.json").read_text())["rows"][0]
    assert row["method"] == "specprefill" and row["kept_tokens"] in (12, 13)
    capsys.readouterr()
    assert main([*common, "--model", "random:tiny-llama", "--speculator", "random:smollm2-135m"]) == 2
    assert "the speculator's tokenizer differs" in capsys.readouterr().err


def test_llama_8b_shape_is_llama_3_1_8b_with_llama_1b_as_its_speculator():
    big, small = random_model_args("random:llama-8b"), random_model_args("random:llama-1b")
    assert (
        big.num_hidden_layers,
        big.hidden_size,
        big.intermediate_size,
        big.num_attention_heads,
        big.num_key_value_heads,
        big.head_dim,
    ) == (32, 4096, 14336, 32, 8, 128)
    assert not big.tie_word_embeddings and big.rope_scaling["factor"] == 8.0
    params = sum(int(np.prod(shape)) for shape in expected_tensor_shapes(big).values())
    assert 8.0e9 < params < 8.1e9  # Llama-3.1-8B's 8.03B
    assert big.vocab_size == small.vocab_size and big.max_position_embeddings == small.max_position_embeddings


def test_random_weights_are_drawn_on_the_torch_device():
    """random:SHAPE on a GPU is drawn there (no 32 GB of host float32 for an 8B shape): the same
    distribution as the NumPy draw, seeded, and a model that runs; the loader takes this path on
    a CUDA device (here the simulated one: CPU tensors on the CUDA branches)."""
    torch = pytest.importorskip("torch")
    from specfill.api import load, prefill_method
    from specfill.backends.torch_cuda.weights import random_transformer
    from specfill.core.runtime import GenerationInfo

    from .torch_cuda.simulated_gpu import simulated

    args = random_model_args("random:tiny-llama")
    model = random_transformer(args, torch.float32, "cpu")
    again, other = random_transformer(args, torch.float32, "cpu"), random_transformer(args, torch.float32, "cpu", 1)
    state, same, differs = model.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(state[k], same[k]) for k in state)
    up = "layers.0.mlp.up_proj.weight"
    assert not torch.equal(state[up], differs[up]) and 0.015 < float(state[up].std()) < 0.025
    assert torch.all(state["norm.weight"] == 1.0)
    assert state["layers.0.self_attn.qkv_proj.weight"].shape == (4 * 16 + 2 * 2 * 16, 64)

    with pytest.MonkeyPatch.context() as monkeypatch, simulated(monkeypatch):
        loaded, _ = load("random:tiny-llama", backend="cuda", dtype="float32", device="cpu")
        logits = loaded.prompt_logits([5, 17, 300, 2], method=prefill_method("full"), info=GenerationInfo())
    assert torch.equal(loaded.model.layers[0].mlp.up_proj.weight, state[up])
    assert np.isfinite(np.asarray(logits)).all() and np.asarray(logits).shape == (4, 512)


def _smoke_env(tmp_path, **extra) -> dict:
    # BUDGET_S: the GPU shares sum to 560 s, so a setup slowed by a busy CPU would eat the machine
    # step's 15 s (its limit is what the later shares leave); 40 s more keeps it out of the way
    env = {"SMOKE": "1", "OUT": str(tmp_path), "PYTHON": sys.executable, "BUDGET_S": "600"}
    return {**os.environ, **env, **extra}


@pytest.mark.slow
def test_gpu_session_script_smoke_run(tmp_path):
    """The script a GPU session runs, end to end on the CPU with tiny random models (a separate
    speculator model, as the GPU run's 8B / 1B pair): every step, its timing, at most 8 files."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_session.sh")],
        env=_smoke_env(tmp_path),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all passed" in proc.stdout
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [
        "conformance-cuda.json",
        "conformance-cuda.md",
        "e2e.json",
        "exact.json",
        "exact.md",
        "exact_e2e.json",
        "exact_ttft.png",
        "hybrid.json",
        "hybrid.md",
        "hybrid.png",
        "kernel_tests.log",
        "machine.txt",
        "session.log",
        "ttft.json",
        "ttft.md",
        "ttft_ttft.png",
    ]
    log = (tmp_path / "session.log").read_text()
    # this checkout's own specfill/ (no core/) sits first on sys.path when Python runs from the
    # checkout; the first GPU run failed on it ("No module named 'specfill.core'"): the script's
    # linked package must win even so
    assert re.search(r"^specfill from /tmp/specfill-site\.\w+/specfill/__init__\.py$", log, re.M), log
    for step in ("machine", "bench", "exact", "hybrid", "kernels", "conformance"):
        assert f"{step}: start at" in log and re.search(rf"^{step}: \d+ s, exit 0$", log, re.M), log
    assert "torch" in (tmp_path / "machine.txt").read_text()
    assert json.loads((tmp_path / "conformance-cuda.json").read_text())["passed"] is True
    exact = json.loads((tmp_path / "exact.json").read_text())
    assert exact["plan"]["dtype"] == "float32"
    assert [(r["mode"], r["tokens_equal_eager"]) for r in exact["decode"]] == [("graphs", "8/8"), ("eager", "8/8")]
    assert " passed" in (tmp_path / "kernel_tests.log").read_text()
    result = json.loads((tmp_path / "ttft.json").read_text())
    rows = result["rows"]
    assert result["complete"] and result["roofline"]["name"] == "H100 SXM5"
    assert [(r["method"], r["prompt_tokens"]) for r in rows] == [
        (m, n) for n in (96, 48) for m in ("full", "h2o", "specprefill", "composition", "full-s32")
    ]  # the longest prompt first; the composition runs: `specfill bench --help` lists --speculator-prefill
    for r in rows:
        assert len(r["runs"]) == 2 and r["ttft_s"] == statistics.median(x["ttft_s"] for x in r["runs"])
        assert r["peak_gb"] > 0 and r["measured_over_predicted"] == pytest.approx(r["ttft_s"] / r["predicted_s"])
        assert r["error"] is None
    assert [(d["mode"], d["draft_tokens"]) for d in result["decode"]] == [
        ("graphs", 0),
        ("eager-static", 0),
        ("eager", 0),
        ("graphs", 4),
    ]
    assert result["decode"][3]["first_run_drafted"] > 0
    assert all(d["tokens_equal_eager"] == "8/8" for d in result["decode"][:3])  # greedy: the eager tokens
    e2e = json.loads((tmp_path / "e2e.json").read_text())
    assert e2e["decode_tokens_per_s"] > 0 and set(e2e["prefill_roofline_fraction"]) >= {"48", "96"}
    assert [r["step"] for r in rows if r["method"] == "full-s32"] == [32, 32]
    assert json.loads((tmp_path / "hybrid.json").read_text())["shape_name"] == "tiny"
    assert "| specprefill | 96 | 2 |" in (tmp_path / "ttft.md").read_text()


@pytest.fixture
def gpu_bench(monkeypatch):
    """scripts/gpu_bench.py's main in this process (argv -> exit code; the smoke run above runs it as
    a script): its SIGTERM handler is undone after the test."""
    pytest.importorskip("torch")
    import importlib
    import signal

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    module = importlib.import_module("gpu_bench")
    handler = signal.getsignal(signal.SIGTERM)
    yield lambda argv: module.run(module.parse_args(argv))
    signal.signal(signal.SIGTERM, handler)


@pytest.mark.filterwarnings("ignore:No artists with labels:UserWarning")  # a plot of no runs
def test_gpu_bench_out_of_time_keeps_a_row_saying_so(tmp_path, gpu_bench):
    """A budget the roofline says no run fits: every row says so, and the step still ends cleanly."""
    code = gpu_bench(
        ["--model", "random:tiny-llama", "--speculator", "self:1", "--lengths", "32", "--dtype", "float32"]
        + ["--device", "cpu", "--roofline", "h100", "--budget-s", "0", "--out", str(tmp_path), "--compose"]
    )
    assert code == 0
    result = json.loads((tmp_path / "ttft.json").read_text())
    assert result["rows"] and all(not r["runs"] and r["error"].startswith("out of time") for r in result["rows"])
    assert all(d["error"].startswith("out of time") for d in result["decode"])
    assert "out of time" in (tmp_path / "ttft.md").read_text()


def test_gpu_bench_runs_the_longest_prompt_first_and_a_shorter_one_after_it_ran_out(tmp_path, gpu_bench, monkeypatch):
    """The TTFT rows run longest prompt first (issue 50's acceptance lines are read there); a run the
    budget cannot afford at one length does not keep the method's shorter rows from running, and ttft.md
    reads shortest first."""
    import gpu_bench as module  # the fixture put scripts/ on the path

    priced = module.predicted_ttft
    monkeypatch.setattr(  # the longer prompt's run priced past any budget
        module,
        "predicted_ttft",
        lambda shapes, rates, kind, ns, n, kept: 1e6 if n == 64 else priced(shapes, rates, kind, ns, n, kept),
    )
    code = gpu_bench(
        ["--model", "random:tiny-llama", "--speculator", "self:1", "--lengths", "32,64", "--dtype", "float32"]
        + ["--device", "cpu", "--roofline", "h100", "--budget-s", "60", "--methods", "full", "--draft-tokens", "0"]
        + ["--repeats", "1", "--decode-tokens", "2", "--decode-modes", "eager", "--out", str(tmp_path)]
    )
    assert code == 0
    rows = json.loads((tmp_path / "ttft.json").read_text())["rows"]
    assert [(r["prompt_tokens"], bool(r["runs"])) for r in rows] == [(64, False), (32, True)]
    assert rows[0]["error"].startswith("out of time") and rows[1]["error"] is None
    table = (tmp_path / "ttft.md").read_text()
    assert table.index("| full | 32 |") < table.index("| full | 64 |")


@pytest.mark.filterwarnings("ignore:No artists with labels:UserWarning")  # a plot of no runs
def test_gpu_bench_reports_the_kernel_self_checks(tmp_path, gpu_bench):
    """e2e.json lists every first-use kernel self-check of the run and ttft.md says which failed (its
    torch twin ran): a fused kernel refused on the GPU must not pass for a measured one."""
    from specfill.core import SpecfillWarning
    from specfill.core.self_check import KERNEL_SELF_CHECK

    def broken():
        raise RuntimeError("no such GPU")

    KERNEL_SELF_CHECK.reset()
    try:
        with pytest.warns(SpecfillWarning, match="rms norm"):
            KERNEL_SELF_CHECK.passes("cuda", "rms norm", "bfloat16", "D=4096", "the torch twin", broken)
        code = gpu_bench(
            ["--model", "random:tiny-llama", "--speculator", "self:1", "--lengths", "32", "--dtype", "float32"]
            + ["--device", "cpu", "--roofline", "h100", "--budget-s", "0", "--out", str(tmp_path)]
        )
    finally:
        KERNEL_SELF_CHECK.reset()
    assert code == 0
    checks = json.loads((tmp_path / "e2e.json").read_text())["kernel_self_checks"]
    assert checks == [
        {
            "kernel": "rms norm",
            "dtype": "bfloat16",
            "shape": "D=4096",
            "passed": False,
            "reason": "compile or launch error: RuntimeError: no such GPU",
        }
    ]
    assert (
        "- self-check rms norm bfloat16 D=4096: FAILED (compile or launch error" in (tmp_path / "ttft.md").read_text()
    )


def test_gpu_bench_composition_row_is_the_one_auto_runs(gpu_bench):
    """--compose's row is core/config.AUTO_COMPOSITION (keep 0.1, window 32, one neighbour, H2O in
    every speculator layer), issue 50's composition, not `--speculator-prefill h2o` at keep 0.3."""
    import gpu_bench as module

    from specfill.cli.options import specprefill_config
    from specfill.core.config import AUTO_COMPOSITION

    method, flags = module.method_configs(compose=True)["composition"]
    assert method == "specprefill" and specprefill_config(flags) == AUTO_COMPOSITION


def test_gpu_bench_variants_run_their_own_flags(tmp_path, gpu_bench):
    """--variant rows parse `specfill bench` flags (their config reaches the run: keep 0.1 keeps fewer
    tokens than keep 0.5) and --methods keeps the named rows only, full among them for the speed-ups."""
    code = gpu_bench(
        ["--model", "random:tiny-llama", "--speculator", "random:tiny-llama-32k", "--lengths", "96"]
        + ["--repeats", "1", "--decode-tokens", "2", "--dtype", "float32", "--device", "cpu", "--roofline", "h100"]
        + ["--budget-s", "120", "--out", str(tmp_path)]
        + ["--variant", "keep-0.1=specprefill:--keep 0.1", "--variant", "keep-0.5=specprefill:--keep 0.5"]
        + ["--variant", "h2o-all=h2o:--h2o-layers all", "--methods", "full,keep-0.1,keep-0.5,h2o-all"]
    )
    assert code == 0
    rows = {r["method"]: r for r in json.loads((tmp_path / "ttft.json").read_text())["rows"]}
    assert list(rows) == ["full", "keep-0.1", "keep-0.5", "h2o-all"]
    assert rows["keep-0.1"]["kept_tokens"] < rows["keep-0.5"]["kept_tokens"] < 96
    assert rows["h2o-all"]["kind"] == "h2o" and rows["h2o-all"]["speedup_vs_full"] > 0
    assert all(r["predicted_s"] and r["error"] is None for r in rows.values())
    # each row's prefill parts, timed by the run, beside the roofline's price of the same work
    assert set(rows["full"]["parts"]) == set(rows["h2o-all"]["parts"]) == {"prefill"}
    parts = rows["keep-0.1"]["parts"]  # the look-ahead's static steps run (eagerly) here: their setup is a part
    assert set(parts) == {"speculator", "speculator_pass", "lookahead_setup", "selection", "main_prefill"}
    assert parts["lookahead_setup"]["predicted_s"] is None  # no roofline prices a capture
    look_ahead = parts["speculator"]["measured_s"] - parts["speculator_pass"]["measured_s"]
    assert 0 < parts["lookahead_setup"]["measured_s"] < look_ahead
    within = {"speculator_pass", "lookahead_setup"}  # parts of speculator
    for r in rows.values():
        assert sum(p["measured_s"] for name, p in r["parts"].items() if name not in within) <= r["ttft_s"]
        assert all(p["measured_s"] > 0 for p in r["parts"].values())
        assert all(p["predicted_s"] > 0 for name, p in r["parts"].items() if name != "lookahead_setup")
    assert "| keep-0.1 | 96 | main_prefill |" in (tmp_path / "ttft.md").read_text()


def test_gpu_bench_reports_h2o_walk_graphs_per_row(tmp_path, gpu_bench, monkeypatch):
    """Each H2O row says how many batches were captured and replayed (e2e.json `walk_graphs`: the totals
    and why they were refused), and an --eager-walk variant runs its batches as they come. CUDA graphs
    need a GPU: here TorchOps records with the CPU recorder of tests/torch_cuda/test_walk_graph.py."""
    from specfill.backends.torch_cuda import walk_graph
    from specfill.backends.torch_cuda.ops import TorchOps
    from tests.torch_cuda.test_walk_graph import Recorder

    init = TorchOps.__init__
    monkeypatch.setattr(TorchOps, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "walk_graphs": True}))
    monkeypatch.setattr(walk_graph, "CudaWalkCapture", Recorder)
    h2o = "--h2o-layers all --chunk-size 16 -b 64 --h2o-local 4 --h2o-heavy 4"
    code = gpu_bench(
        ["--model", "random:tiny-llama", "--speculator", "self:1", "--lengths", "96", "--repeats", "1"]
        + ["--decode-tokens", "2", "--dtype", "float32", "--device", "cpu", "--roofline", "h100"]
        + ["--budget-s", "120", "--out", str(tmp_path), "--methods", "full,h2o-all,h2o-eager"]
        + ["--variant", f"h2o-all=h2o:{h2o}", "--variant", f"h2o-eager=h2o:{h2o} --eager-walk"]
    )
    assert code == 0
    result = json.loads((tmp_path / "ttft.json").read_text())
    rows = {r["method"]: r for r in result["rows"]}
    graphed, eager = rows["h2o-all"]["walk_graphs"], rows["h2o-eager"]["walk_graphs"]
    assert graphed["captured"] > 0 and graphed["replayed"] > 0 and graphed["refused"] is None, graphed
    assert eager["captured"] == eager["replayed"] == 0 and rows["h2o-eager"]["ttft_s"] > 0
    assert rows["full"]["walk_graphs"]["captured"] == 0
    totals = json.loads((tmp_path / "e2e.json").read_text())["walk_graphs"]
    assert totals["captured"] >= graphed["captured"] and totals["refused"] is None


def test_gpu_bench_refuses_an_unknown_variant_or_row(tmp_path, gpu_bench):
    for extra, message in (
        (["--variant", "x=sparse:--keep 0.1"], "expected NAME=METHOD[:FLAGS]"),
        (["--methods", "full,nope"], "--methods: no row named nope"),
    ):
        argv = ["--model", "random:tiny-llama", "--speculator", "self:1", "--lengths", "32", "--device", "cpu"]
        with pytest.raises(SystemExit) as refused:  # any other exception fails here: no traceback
            gpu_bench([*argv, "--out", str(tmp_path), *extra])
        assert message in str(refused.value.code)


def test_gpu_bench_reads_issue_50s_acceptance_lines(monkeypatch):
    """e2e.json's `acceptance`: each line of issue 50 with its figure, bound and verdict, read off the rows
    (a row missing: not measured, never a pass)."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_bench_report as report

    def row(method, n, ttft, predicted, speedup):
        return {
            "method": method,
            "prompt_tokens": n,
            "ttft_s": ttft,
            "predicted_s": predicted,
            "measured_over_predicted": ttft / predicted,
            "speedup_vs_full": speedup,
        }

    rows = [
        row("full", 32768, 1.0, 0.75, 1.0),  # 1.33x its roofline: holds
        row("full", 131008, 9.8, 6.4, 1.0),  # 1.53x: does not
        row("h2o", 131008, 8.0, 4.86, 9.8 / 8.0),  # 1.225x against 0.8 x 6.4 / 4.86 = 1.053x: holds
        row("specprefill", 131008, 4.0, 2.37, 9.8 / 4.0),  # 2.45x: does not
    ]
    rows[-1]["parts"] = {"speculator_pass": {"measured_s": 2.5, "predicted_s": 1.4}}
    decode = [
        {"mode": "graphs", "draft_tokens": 0, "decode_tps": 151.0, "prompt_tokens": 8192},
        {"mode": "graphs", "draft_tokens": 4, "decode_tps": 300.0, "prompt_tokens": 8192},
    ]
    lines = report.acceptance({"rows": rows, "decode": decode})
    verdicts = {a["line"].split(":")[0].split(" (")[0]: a["holds"] for a in lines}
    assert verdicts == {
        "decode tok/s": True,
        "full prefill at 32768": True,
        "full prefill at 131008": False,
        "specprefill at 131008": False,
        "composition at 131008": None,
        "h2o at 131008": True,
    }
    h2o = next(a for a in lines if a["line"].startswith("h2o"))
    assert h2o["bound"] == pytest.approx(0.8 * 6.4 / 4.86)
    assert "| composition at 131008: speed-up vs full >= 4 | - | 4 | not measured |  |" in report.acceptance_lines(
        {"rows": rows, "decode": decode}
    )
    # what a missed line needs: full at 1.5 x its roofline; SpecPrefill at full / 2.5 = 3.92 s, which with its
    # other parts as measured (4.0 - 2.5 s) leaves its speculator's pass 2.42 s
    needs = {a["line"].split(":")[0]: a["needs"] for a in lines}
    assert needs["full prefill at 131008"] == "TTFT <= 9.6 s (ran 9.8)"
    assert needs["specprefill at 131008"] == (
        "TTFT <= 3.92 s (ran 4); its speculator pass <= 2.42 s (ran 2.5), the rest as measured"
    )
    assert needs["full prefill at 32768"] == needs["h2o at 131008"] == needs["composition at 131008"] == ""
