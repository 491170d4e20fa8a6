"""scripts/device_tree.py: results/ held out of a device call's tree and put back exactly (issue 50)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("device_tree", ROOT / "scripts" / "device_tree.py")
assert _spec is not None and _spec.loader is not None
device_tree = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_tree)


def _repo(tmp_path: Path) -> Path:
    files = {
        "core.py": b"x" * 100,
        "results/eval/big.json": b"y" * 5000,
        "results/gpu/h200/e2e.json": b"z" * 3000,
        "results/gpu/aot/aot_matrix.json": b"m" * 700,
        ".gitignore": b"/.device_hold/\n/.fa4/\n",
    }
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    (tmp_path / ".fa4").mkdir()
    (tmp_path / ".fa4" / "part00").write_bytes(b"p" * 2000)

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True, capture_output=True
        )

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "init")
    return tmp_path


def test_hold_leaves_the_aot_matrix_and_restore_puts_back_what_git_has(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    whole = device_tree.travelling(root, [])
    assert device_tree.travelling(root, [".fa4"]) == whole + 2000
    assert device_tree.hold(root) == 2
    assert not (root / "results/eval").exists() and (root / "results/gpu/aot/aot_matrix.json").exists()
    assert (root / ".device_hold/results/eval/big.json").stat().st_size == 5000
    assert device_tree.travelling(root, [".fa4"]) == whole - 8000 + 2000
    with pytest.raises(SystemExit, match="a hold is in place"):
        device_tree.hold(root)
    assert device_tree.restore(root) == 2
    assert not (root / ".device_hold").exists()
    assert device_tree.travelling(root, []) == whole
    with pytest.raises(SystemExit, match="nothing is held"):
        device_tree.restore(root)


def test_hold_refuses_uncommitted_results_and_restore_refuses_to_overwrite(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (root / "results/eval/big.json").write_bytes(b"changed")
    with pytest.raises(SystemExit, match="uncommitted changes"):
        device_tree.hold(root)
    subprocess.run(["git", "checkout", "-q", "--", "results"], cwd=root, check=True)
    device_tree.hold(root)
    (root / "results/eval").mkdir(parents=True)
    (root / "results/eval/big.json").write_bytes(b"new")
    with pytest.raises(SystemExit, match="back in the tree already"):
        device_tree.restore(root)
    assert (root / ".device_hold/results/eval/big.json").exists()  # nothing moved on a refusal


def test_the_size_line_and_its_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _repo(tmp_path)
    assert device_tree.main(["size", "--root", str(root), "--carry", ".fa4"]) == 0
    assert "MiB of 64 (results/ in the tree, carrying .fa4)" in capsys.readouterr().out
    (root / ".fa4" / "part01").write_bytes(b"\0" * (65 * 2**20))
    assert device_tree.main(["size", "--root", str(root), "--carry", ".fa4"]) == 1


def test_bytes_prints_the_bare_figure_fa4_pack_sizes_its_parts_by(tmp_path: Path, capsys) -> None:
    root = _repo(tmp_path)
    assert device_tree.main(["bytes", "--root", str(root)]) == 0
    assert capsys.readouterr().out.strip() == str(device_tree.travelling(root, []))
