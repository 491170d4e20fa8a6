"""`specfill generate` on a tiny model, and every bad input as one line with exit code 2."""

import json
import shutil
import subprocess
import sys

import pytest

from specfill.backends import torch_cuda
from specfill.cli.main import main
from specfill.core import probe
from specfill.core.backend import Backend

pytest.importorskip("torch")


def run_cli(capsys, *args):
    code = main(["generate", "--backend", "cuda", "--device", "cpu", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_streams_text_and_prints_statistics(tiny_checkpoint, capsys):
    code, out, err = run_cli(
        capsys,
        "--model",
        str(tiny_checkpoint("llama", "gguf")),
        "--prompt",
        "def main():",
        "--max-tokens",
        "5",
        "--seed",
        "1",
    )
    assert code == 0, err
    assert out.startswith("==========\n")
    for line in ("Prompt: ", "TTFT: ", "Generation: ", "Peak memory: "):
        assert line in out
    assert "tokens-per-sec" in out


def test_generate_runs_specprefill_over_an_h2o_speculator(tiny_checkpoint, capsys):
    """--speculator-prefill h2o: the statistics name the composition (auto would say auto -> it)."""
    model = str(tiny_checkpoint("llama", "gguf"))
    args = ["--model", model, "--prompt", "one two three four five six", "--max-tokens", "3"]
    spec = ["--method", "specprefill", "--speculator", "self:1"]
    code, out, err = run_cli(capsys, *args, *spec, "--speculator-prefill", "h2o")
    assert code == 0, err
    assert "Method: specprefill+h2o\n" in out
    code, out, err = run_cli(capsys, *args, *spec, "--speculator-prefill", "dense")
    assert code == 0 and "Method: specprefill\n" in out, err
    code, out, err = run_cli(capsys, *args, "--method", "auto", "--auto-threshold", "1", "--speculator", "self:1")
    assert code == 0 and "Method: auto -> specprefill\n" in out, err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "/nonexistent/model.gguf"], "does not exist"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--keep", "0", "--method", "specprefill", "--speculator", "self:1"], "keep ratio"),
        (["--keep", "abc"], "--keep must be a number"),
        (["--chunk-size", "0", "--method", "h2o"], "chunk_size"),
        (["--temp", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--max-tokens", "1000000"], "exceeds the model's context"),
        (["--method", "specprefill"], "needs --speculator"),
        (["--method", "specprefill", "--speculator", "self:1", "--speculator-prefill", "x"], "speculator_prefill"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "cannot read --prompt-file"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny_checkpoint, capsys, args, message):
    model = ["--model", str(tiny_checkpoint("llama", "gguf"))] if "--model" not in args else []
    prompt = [] if "--prompt-file" in args else ["--prompt", "hi"]
    code, out, err = run_cli(capsys, *model, *prompt, *args)
    assert code == 2, (out, err)
    assert err.startswith("specfill: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_corrupt_model_file(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 100)
    code, _, err = run_cli(capsys, "--model", str(bad), "--prompt", "hi")
    assert code == 2 and err.startswith("specfill: error: ") and err.count("\n") == 1


def test_unknown_and_missing_backends(capsys, monkeypatch):
    assert main(["generate", "--backend", "tpu", "--prompt", "hi"]) == 2
    assert "unknown backend 'tpu'" in capsys.readouterr().err
    missing = Backend(name="cuda", extra="cuda", loader_module="specfill_missing_backend_module")
    monkeypatch.setattr(torch_cuda, "BACKEND", missing)
    assert main(["generate", "--backend", "cuda", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "backend 'cuda' needs 'specfill_missing_backend_module', which is not installed" in err, err
    assert err.count("\n") == 1


def test_speculator_with_another_tokenizer_is_rejected(tiny_checkpoint, tmp_path, capsys):
    main_model = tiny_checkpoint("llama", "safetensors")
    other = shutil.copytree(main_model, tmp_path / "other")
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[100:102]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # same size, different meaning
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    code, _, err = run_cli(
        capsys, "--model", str(main_model), "--prompt", "hi", "--method", "specprefill", "--speculator", str(other)
    )
    assert code == 2 and "tokenizer differs" in err, err


def test_usage_errors_are_one_line_too():
    proc = subprocess.run(
        [sys.executable, "-m", "specfill.cli.main", "generate", "--max-tokens", "many"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "invalid int value" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cuda", "mlx"])
def test_demo_model_with_only_a_prompt(backend, capsys):
    """No --model: the bundled demo model answers on either backend."""
    from specfill.core import ModelLoadError
    from specfill.core.io.demo_model import require_demo_model

    try:
        require_demo_model()
    except ModelLoadError as why:
        pytest.skip(str(why))
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    assert (
        main(["generate", "--backend", backend, "--prompt", "What is the capital of France?", "--max-tokens", "12"])
        == 0
    )
    assert "Paris" in capsys.readouterr().out


def test_threads_sets_torchs_cpu_threads(tiny_checkpoint, capsys):
    import torch

    before = torch.get_num_threads()
    try:
        code = main(
            [
                "--threads",
                "1",
                "generate",
                "--backend",
                "cuda",
                "--device",
                "cpu",
                "--model",
                str(tiny_checkpoint("llama", "gguf")),
                "--prompt",
                "hi",
                "--max-tokens",
                "2",
                "--dtype",
                "float32",
            ]
        )
        assert code == 0 and "Compute: cpu, float32, 1 thread\n" in capsys.readouterr().out
        assert torch.get_num_threads() == before  # the command's threads end with it
        torch.set_num_threads(2)
        assert main(["generate", "-t", "0", "--prompt", "hi"]) == 2
        assert "--threads must be >= 1" in capsys.readouterr().err
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_progress_bar_covers_the_whole_time_to_first_token(tmp_path, monkeypatch):
    """SpecPrefill's bar runs through the speculator's pass, the look-ahead and the main prefill
    (each stage its share of the expected work, never 100% before the main prefill) and clears its
    line before the answer: stdout and stderr into one buffer, as a terminal shows them."""
    import functools
    import io
    import re

    from specfill.cli import progress

    monkeypatch.setattr(
        progress, "tqdm", functools.partial(progress.tqdm, mininterval=0, miniters=1)
    )  # every update drawn
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    (tmp_path / "prompt.txt").write_text("word " * 1500)
    args = ["--model", "random:tiny-llama", "--prompt-file", str(tmp_path / "prompt.txt"), "--dtype", "float32"]
    method = ["--method", "specprefill", "--speculator", "self:1", "--max-tokens", "2"]
    assert main(["generate", "--backend", "cuda", "--device", "cpu", *args, *method]) == 0
    text = screen.getvalue()
    frames = [f for f in text.split("\r") if "prefill" in f and "%|" in f]
    shown = [
        (m.group(1) or "prefill", int(m.group(2)))
        for m in (re.match(r"prefill(?:: (\w+))?:\s+(\d+)%", f) for f in frames)
    ]
    stages = [stage for stage, _ in shown]
    assert {"speculator", "lookahead", "main_prefill"} <= set(stages), stages
    percents = [p for _, p in shown]
    assert percents == sorted(percents) and percents[-1] == 100
    assert max(p for stage, p in shown if stage != "main_prefill") < 100
    cleared, answer = text.rsplit("\r", 2)[1:]
    assert cleared.strip() == "" and "Prompt: 1500 tokens" in answer  # the bar's line is cleared first


def test_cli_auto_threshold_needs_method_auto(capsys):
    assert main(["generate", "--auto-threshold", "100", "--prompt", "hi"]) == 2
    assert "auto_threshold (--auto-threshold) goes with method auto" in capsys.readouterr().err


def test_cli_auto_says_its_calibration_and_keeps_it_out_of_the_ttft(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """`specfill generate --method auto`: a calibration still to be measured is announced on stderr and
    run before the clock (the TTFT printed is the method's); one kept is read back without a word."""
    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.setattr(probe, "CANDIDATE_LENGTHS", (1040, 1080))
    table, lengths = {1040: (1.0, 0.5), 1080: (2.0, 1.0)}, []  # probe._measure's (full s, sparse s), the lengths asked
    monkeypatch.setattr(probe, "_measure", lambda lm, method, length, cached=0: lengths.append(length) or table[length])
    model = str(tiny_checkpoint("llama", "safetensors"))

    def generate(numbers: int) -> int:
        prompt = " ".join(str(5 + i % 300) for i in range(numbers))
        argv = ["generate", "--backend", "cuda", "--model", model, "--dtype", "float32", "--method", "auto"]
        return main([*argv, "--chunk-size", "256", "--prompt", prompt, "--max-tokens", "1", "--ignore-chat-template"])

    assert generate(330) == 0  # ~1,100 tokens
    out, err = capsys.readouterr()
    assert "specfill: auto: timing h2o against full prefill on this machine, from 1040 tokens" in err
    assert "specfill: auto: calibrated in" in err and "Method: auto -> h2o" in out
    assert "of it auto's calibration" not in out  # measured before the clock: none in the request
    assert lengths == [1040, 1040, 1080]  # the warm-up, then each length: before the generation
    assert generate(330) == 0
    out, err = capsys.readouterr()
    assert "auto:" not in err and "Method: auto -> h2o" in out and lengths == [1040, 1040, 1080]
    monkeypatch.setenv("SPECFILL_CALIBRATION_DIR", str(tmp_path / "elsewhere"))  # nothing kept there
    assert generate(1200) == 2  # past the tiny model's context: refused before any calibration
    assert "exceeds the model's context" in capsys.readouterr().err and lengths == [1040, 1040, 1080]


def test_cli_auto_with_a_speculator_reads_every_methods_flags(tiny_checkpoint, capsys):
    """auto weighs H2O and, with a speculator, SpecPrefill: none of their flags is 'unused' then (the CLI
    once warned that --speculator does nothing with --method auto, while auto ran SpecPrefill with it)."""
    model = str(tiny_checkpoint("llama", "safetensors"))
    argv = ["generate", "--backend", "cuda", "--model", model, "--method", "auto", "--prompt", "1 2 3"]
    assert main([*argv, "--speculator", "self:1", "--keep", "0.5", "--chunk-size", "16", "--max-tokens", "1"]) == 0
    assert "nothing with" not in capsys.readouterr().err
    assert main([*argv, "--keep", "0.5", "--max-tokens", "1"]) == 0
    assert "--keep does nothing with --method auto without --speculator" in capsys.readouterr().err
