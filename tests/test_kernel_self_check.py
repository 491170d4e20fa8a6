"""First-use kernel self-check with fallback (core/self_check.py), on both backends.

Neither Triton-on-GPU nor Metal runs here, so the kernels' availability is patched and a failing
kernel builder or a wrong kernel is injected; the MLX case also runs the real Metal kernel, which
fails on MLX's CPU build exactly as a Metal compile error would. The Triton interpreter runs the
real Triton kernels through the auto path in a subprocess.
"""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from specfill.core import BackendUnavailableError, ConfigError, SpecfillWarning
from specfill.core.self_check import KERNEL_SELF_CHECK, kernels_env, kernels_setting

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch):
    monkeypatch.delenv("SPECFILL_KERNELS", raising=False)
    KERNEL_SELF_CHECK.reset()
    yield
    KERNEL_SELF_CHECK.reset()


def _one_warning(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    messages = [str(w.message) for w in caught if issubclass(w.category, SpecfillWarning)]
    return result, messages


# --- torch ---------------------------------------------------------------------------------


@pytest.fixture
def torch_kernels(monkeypatch):
    """Auto mode picks the 'Triton' kernel on CPU tensors; returns a setter for the kernel."""
    from specfill.backends.torch_cuda.kernels import dispatch

    monkeypatch.setattr(dispatch, "kernel_unavailable_reason", lambda device, dtype: None)
    monkeypatch.setattr(dispatch, "kernel_device_auto", lambda device: True)
    calls = []

    def install(make_kernel):
        def fetch(name):
            calls.append(name)
            return make_kernel(name)

        monkeypatch.setattr(dispatch, "triton_kernel", fetch)

    return install, calls


def _twin_kernel(name, wrong=False):
    from specfill.backends.torch_cuda.kernels import attention_scores_twin, inter_attention_twin, intra_attention_twin
    from specfill.core.stages import AttentionState, IntraResult

    def flash(q, k, v, scale, chunk, with_colsum):
        r = (
            intra_attention_twin(q, k, v, chunk, scale, with_colsum=with_colsum)
            if chunk is not None
            else inter_attention_twin(q, k, v, scale, with_colsum=with_colsum)
        )
        if wrong:
            r = IntraResult(AttentionState(r.state.m, r.state.l, r.state.o + 0.1), r.colsum)
        return r

    def scoring(queries, keys, scale, query_start=None):
        probs = attention_scores_twin(queries, keys, scale, query_start=query_start)
        return probs.flip(-1) if wrong else probs

    return flash if name == "flash_attention" else scoring


def _torch_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 33, 16, generator=g).to(dtype)
    k = torch.randn(2, 33, 16, generator=g).to(dtype)
    return q, k, k.flip(1).contiguous()


def test_torch_compile_error_falls_back_with_one_warning(torch_kernels):
    from specfill.backends.torch_cuda.kernels import intra_attention, intra_attention_twin

    install, _ = torch_kernels

    def broken(name):
        def kernel(*args):
            raise RuntimeError("triton.CompilationError: at 12:4: unsupported tile\n  more detail")

        return kernel

    install(broken)
    q, k, v = _torch_inputs()
    result, messages = _one_warning(lambda: intra_attention(q, k, v, 8, 0.25))
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "'phase-1 intra attention'" in messages[0] and "compile or launch error" in messages[0]
    assert "float32, D=16, G=2" in messages[0] and "torch twin" in messages[0]
    want = intra_attention_twin(q, k, v, 8, 0.25)
    assert torch.equal(result.state.o, want.state.o) and torch.equal(result.colsum, want.colsum)
    _, again = _one_warning(lambda: intra_attention(q, k, v, 8, 0.25))
    assert again == []  # warned once; the twin from then on
    with pytest.raises(RuntimeError, match="CompilationError"):  # forced: fails loudly
        intra_attention(q, k, v, 8, 0.25, use_kernel=True)


def test_torch_wrong_kernel_falls_back_per_kernel(torch_kernels):
    from specfill.backends.torch_cuda.kernels import attention_scores, attention_scores_twin, inter_attention

    install, calls = torch_kernels
    install(lambda name: _twin_kernel(name, wrong=True))
    queries, keys = torch.randn(2, 3, 4, 16), torch.randn(2, 2, 20, 16)
    probs, messages = _one_warning(lambda: attention_scores(queries, keys, 0.25))
    assert len(messages) == 1 and "'speculative-prefill scoring'" in messages[0]
    assert "probs differs from the twin" in messages[0] and "float32 tolerance" in messages[0]
    assert torch.equal(probs, attention_scores_twin(queries, keys, 0.25))
    q, k, v = _torch_inputs()
    _, messages = _one_warning(lambda: inter_attention(q, k, v, 0.25))
    assert len(messages) == 1 and "'phase-2 inter attention'" in messages[0] and "o differs" in messages[0]
    assert calls == ["scoring_softmax", "flash_attention"]  # only the self-checks ran the kernels
    assert [v.passed for v in KERNEL_SELF_CHECK.verdicts()] == [False, False]


def test_torch_good_kernel_is_used_after_its_check(torch_kernels):
    from specfill.backends.torch_cuda.kernels import intra_attention

    install, calls = torch_kernels
    install(_twin_kernel)
    q, k, v = _torch_inputs(torch.float16)
    _, messages = _one_warning(lambda: [intra_attention(q, k, v, 8, 0.25) for _ in range(3)])
    assert messages == [] and calls == ["flash_attention"] * 4  # one check, then three launches
    (verdict,) = KERNEL_SELF_CHECK.verdicts()
    assert verdict.passed and (verdict.backend, verdict.dtype, verdict.shape_class) == ("cuda", "float16", "D=16, G=2")


def test_kernels_setting_reads_the_environment(monkeypatch, torch_kernels):
    from specfill.backends.torch_cuda.kernels import choose_kernel

    install, calls = torch_kernels
    install(_twin_kernel)
    x = torch.zeros(1, 2, 16)
    monkeypatch.setenv("SPECFILL_KERNELS", "off")
    assert kernels_setting() is False and choose_kernel(None, x) is False
    assert kernels_setting(True) is True  # an explicit choice wins
    with kernels_env("on"):
        assert kernels_setting() is True
    assert os.environ["SPECFILL_KERNELS"] == "off"  # restored
    monkeypatch.setenv("SPECFILL_KERNELS", "sometimes")
    with pytest.raises(ConfigError, match="SPECFILL_KERNELS='sometimes' is not one of auto, on, off"):
        choose_kernel(None, x)
    assert calls == []


def test_cli_kernels_option_and_variable_agree(tmp_path, monkeypatch, capsys):
    from specfill.cli.main import main

    monkeypatch.setenv("SPECFILL_KERNELS", "off")
    assert main(["conformance", "--backend", "cuda", "--dtype", "float32", "--out", str(tmp_path)]) == 0
    assert "kernels ops twins" in capsys.readouterr().out
    monkeypatch.setenv("SPECFILL_KERNELS", "bogus")
    assert main(["conformance", "--backend", "cuda", "--out", str(tmp_path)]) == 2
    assert "SPECFILL_KERNELS='bogus'" in capsys.readouterr().err
    assert (
        main(["conformance", "--backend", "cuda", "--dtype", "float32", "--kernels", "off", "--out", str(tmp_path)])
        == 0
    )  # the option wins over the variable
    assert os.environ["SPECFILL_KERNELS"] == "bogus"


INTERPRETER_CODE = """
import warnings, torch
from specfill.backends.torch_cuda.kernels import dispatch, intra_attention, attention_scores
from specfill.core.self_check import KERNEL_SELF_CHECK
dispatch.kernel_device_auto = lambda device: True
warnings.simplefilter("error")
q = torch.randn(4, 20, 16)
intra_attention(q, q[:2], q[:2], 8, 0.25)
attention_scores(torch.randn(1, 2, 4, 16), q[None, :2], 0.25)
print([(v.kernel, v.passed) for v in KERNEL_SELF_CHECK.verdicts()])
"""


def test_real_triton_kernels_pass_their_self_check_in_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env.pop("SPECFILL_KERNELS", None)
    out = subprocess.run([sys.executable, "-c", INTERPRETER_CODE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("[('phase-1 intra attention', True), ('speculative-prefill scoring', True)]")


# --- mlx -----------------------------------------------------------------------------------


@pytest.fixture
def mlx_kernels(monkeypatch):
    mx = pytest.importorskip("mlx.core")
    from specfill.backends.mlx.kernels import dispatch

    monkeypatch.setattr(dispatch, "metal_available", lambda: True)
    return mx


def test_mlx_metal_compile_error_falls_back_with_one_warning(mlx_kernels):
    """The real Metal kernel on MLX's CPU build raises like a Metal compile error would."""
    mx = mlx_kernels
    from specfill.backends.mlx.kernels import intra, intra_attention

    q = mx.array(np.random.default_rng(0).standard_normal((4, 33, 16)).astype(np.float32))
    k = q[:2]
    result, messages = _one_warning(lambda: intra_attention(q, k, k, 8, 0.25))
    assert len(messages) == 1 and "mlx kernel 'phase-1 intra attention' (float32, D=16, G=2)" in messages[0]
    assert "compile or launch error" in messages[0] and "MLX-ops twin" in messages[0]
    want = intra.intra_attention_twin(q, k, k, 8, 0.25)
    assert np.array_equal(np.asarray(result.state.o), np.asarray(want.state.o))
    _, again = _one_warning(lambda: intra_attention(q, k, k, 8, 0.25))
    assert again == []
    with pytest.raises(RuntimeError):  # forced: the Metal error itself, loudly
        mx.eval(intra_attention(q, k, k, 8, 0.25, use_kernel=True).state.o)


def test_mlx_wrong_kernel_falls_back(mlx_kernels, monkeypatch):
    mx = mlx_kernels
    from specfill.backends.mlx.kernels import inter, inter_attention, scoring
    from specfill.core.stages import AttentionState, InterResult

    def wrong_inter(q, k_mem, v_mem, scale):
        r = inter.inter_attention_twin(q, k_mem, v_mem, scale)
        return InterResult(AttentionState(r.state.m, r.state.l * 1.01, r.state.o), r.colsum)

    monkeypatch.setattr(inter, "inter_attention_kernel", wrong_inter)
    monkeypatch.setattr(
        scoring,
        "attention_scores_kernel",
        lambda queries, keys, scale: scoring.attention_scores_twin(queries, keys, scale) * 0.5,
    )
    q = mx.array(np.random.default_rng(1).standard_normal((6, 9, 32)).astype(np.float16))
    result, messages = _one_warning(lambda: inter_attention(q, q[:2], q[:2], 0.2))
    assert len(messages) == 1 and "'phase-2 inter attention' (float16, D=32, G=3)" in messages[0]
    assert "l differs from the twin" in messages[0]
    want = inter.inter_attention_twin(q, q[:2], q[:2], 0.2)
    assert np.array_equal(np.asarray(result.state.l), np.asarray(want.state.l))
    _, messages = _one_warning(lambda: scoring.attention_scores(q[None, :2].swapaxes(1, 2), q[None, :2], 0.2))
    assert len(messages) == 1 and "'speculative-prefill scoring'" in messages[0]


def test_mlx_forced_without_metal_is_one_clear_error(monkeypatch):
    mx = pytest.importorskip("mlx.core")
    from specfill.backends.mlx.kernels import intra_attention

    if mx.metal.is_available():
        pytest.skip("this MLX has Metal")
    q = mx.zeros((2, 4, 16))
    monkeypatch.setenv("SPECFILL_KERNELS", "on")
    with pytest.raises(BackendUnavailableError, match="Metal"):
        intra_attention(q, q, q, 2, 0.25)


# --- whole prompts: the right answer with one warning per failing kernel ---------------------


def _both_methods(backend, path, monkeypatch, device=None):
    from specfill import load, stream_generate
    from specfill.core.config import H2OConfig, SpecPrefillConfig

    kwargs = {"device": device} if device else {}
    model, tokenizer = load(path, backend=backend, dtype="float32", **kwargs)
    ids = list(np.random.default_rng(5).integers(0, model.args.vocab_size, 70))
    h2o = H2OConfig(chunk_size=16, batch_size=32, local=4, heavy=4)
    spec = SpecPrefillConfig(keep_ratio=0.25, lookahead=3, select_chunk=8)

    def tokens():
        return (
            [r.token for r in stream_generate(model, tokenizer, ids, 4, method="h2o", h2o=h2o)],
            [
                r.token
                for r in stream_generate(
                    model, tokenizer, ids, 4, method="specprefill", specprefill=spec, speculator="self:1"
                )
            ],
        )

    got, messages = _one_warning(tokens)
    monkeypatch.setenv("SPECFILL_KERNELS", "off")
    return got, tokens(), messages


def test_mlx_model_falls_back_per_kernel_with_the_right_answer(mlx_kernels, tiny_checkpoint, monkeypatch):
    got, want, messages = _both_methods("mlx", tiny_checkpoint("llama", "gguf"), monkeypatch)
    assert got == want
    assert sorted(m.split("'")[1] for m in messages) == [
        "phase-1 intra attention",
        "phase-2 inter attention",
        "speculative-prefill scoring",
    ]


def test_torch_model_falls_back_per_kernel_with_the_right_answer(torch_kernels, tiny_checkpoint, monkeypatch):
    install, _ = torch_kernels
    install(lambda name: _twin_kernel(name, wrong=True))
    got, want, messages = _both_methods("cuda", tiny_checkpoint("llama", "gguf"), monkeypatch, device="cpu")
    assert got == want
    assert sorted(m.split("'")[1] for m in messages) == [
        "phase-1 intra attention",
        "phase-2 inter attention",
        "speculative-prefill scoring",
    ]
