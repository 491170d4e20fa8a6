"""The command-line cases of issue #17 in-process: every bad setting or hostile model is one
`specfill: error:` line and exit 2; clamps and settings that do nothing give exit 0 and one
warning line. (scripts/fuzz_inputs.py runs the same cases as subprocesses on both backends.)"""

from __future__ import annotations

import io
import sys

import pytest

from specfill.cli.main import main
from tests.fixtures.cli_cases import MODEL_CASES, SETTINGS, cli_args, cli_files
from tests.fixtures.fuzz_run import corpus

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return cli_files(tmp_path_factory.mktemp("cli"))


def run(capsys, monkeypatch, args, stdin=b""):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if not line.startswith("specfill: no CUDA GPU")]


def check(code, out, err, exit_code, word):
    assert code == exit_code, (out, err)
    assert not any("Traceback" in line for line in err)
    if exit_code == 2:
        assert len(err) == 1 and err[0].startswith("specfill: error: ") and word in err[0], err
    else:
        warnings = [line for line in err if line.startswith("specfill: warning: ")]
        assert len(warnings) == (1 if word else 0) and word in "".join(warnings), err
        assert out.startswith("==========")


@pytest.mark.parametrize("case", SETTINGS, ids=[c.name for c in SETTINGS])
def test_settings(capsys, monkeypatch, files, case):
    code, out, err = run(capsys, monkeypatch, cli_args(case, files, "cuda"), case.stdin)
    check(code, out, err, case.exit_code, case.word)


@pytest.mark.slow
def test_hostile_models(capsys, monkeypatch, tmp_path):
    written = {}
    for name, write in corpus(tmp_path / "corpus", seed=17, archs=("llama",), n_flips=0, n_cuts=0):
        if name in MODEL_CASES:
            folder = tmp_path / f"case{len(written)}"
            folder.mkdir()
            written[name] = write(folder)
    assert sorted(written) == sorted(MODEL_CASES)
    for name, path in written.items():
        code, out, err = run(
            capsys,
            monkeypatch,
            [
                "generate",
                "--backend",
                "cuda",
                "--device",
                "cpu",
                "--model",
                path,
                "--prompt",
                "hello",
                "--max-tokens",
                "2",
            ],
        )
        check(code, out, err, 2, MODEL_CASES[name])
