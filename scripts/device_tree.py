"""What a device-tool call sends, and room for the GPU session's packages in one call (issue 50).

A device call (the `run` tool) sends the working tree (tracked files present in it, untracked files git
does not ignore) and the carried paths, at most 64 MiB in all. The tracked tree is ~47 MiB today, ~41 of
it results/, which nothing on the GPU reads but the AOT matrix (results/gpu/aot/, tests/torch_cuda_kernels/
test_aot.py). FlashAttention-4's pack (scripts/fa4_pack.sh, ~52 MiB) then travels in four calls, one part
each. Held out of the tree, results/ leaves room for the whole pack and the wheels in the session's call:

    python3 scripts/device_tree.py size --carry .whl .fa4   # MiB that would travel, against 64
    python3 scripts/device_tree.py bytes                    # the tree's bytes alone, a bare number
    python3 scripts/device_tree.py hold                     # results/ (but gpu/aot) -> .device_hold/
    ... the device call, carry [".whl", ".fa4"] ...
    python3 scripts/device_tree.py restore                  # back, checked against git

`hold` moves tracked files only, into the gitignored .device_hold/ (which travels only when carried),
and refuses while a hold is in place or results/ has uncommitted changes, so that `restore` puts back
exactly what git has. `restore` refuses to overwrite a file that came back meanwhile, and puts back a hold
cut short as well (a session that finds .device_hold/ restores it before anything else).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

LIMIT_MIB = 64
HOLD = ".device_hold"
HELD = "results"
KEEP = ("results/gpu/aot/",)  # read on the GPU: tests/torch_cuda_kernels/test_aot.py


def _git(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=root, check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def travelling(root: Path, carry: list[str]) -> int:
    """Bytes a call sends: tracked files present, untracked ones git does not ignore, the carried paths."""
    files = _git(root, "ls-files", "-z") + _git(root, "ls-files", "-z", "-o", "--exclude-standard")
    tree = sum((root / f).stat().st_size for f in files if (root / f).is_file())
    return tree + sum(_bytes(root / c) for c in carry if (root / c).exists())


def held_files(root: Path) -> list[str]:
    return [f for f in _git(root, "ls-files", "-z", "--", HELD) if not f.startswith(KEEP)]


def hold(root: Path) -> int:
    store = root / HOLD
    if store.exists():
        raise SystemExit(f"device_tree: {HOLD}/ exists: a hold is in place (restore it first)")
    if _git(root, "status", "--porcelain", "-z", "--", HELD):
        raise SystemExit(f"device_tree: {HELD}/ has uncommitted changes: commit them before holding it out")
    if not _ignored(root, f"{HOLD}/results"):
        raise SystemExit(f"device_tree: {HOLD}/ is not gitignored: it would travel")
    moved = 0
    for f in held_files(root):
        source, target = root / f, store / f
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
            moved += 1
    _prune(root / HELD)
    return moved


def restore(root: Path) -> int:
    store = root / HOLD
    if not store.exists():
        raise SystemExit(f"device_tree: no {HOLD}/: nothing is held")
    pending = [p for p in store.rglob("*") if p.is_file()]
    clash = [p.relative_to(store) for p in pending if (root / p.relative_to(store)).exists()]
    if clash:
        raise SystemExit(f"device_tree: {len(clash)} held files are back in the tree already, e.g. {clash[0]}")
    for p in pending:
        target = root / p.relative_to(store)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(p, target)
    _prune(store)
    store.rmdir()
    if _git(root, "status", "--porcelain", "-z", "--", HELD):
        raise SystemExit(f"device_tree: {HELD}/ differs from git after the restore (git status)")
    return len(pending)


def _prune(folder: Path) -> None:
    """Remove the empty folders under `folder`, deepest first (the files moved out of them)."""
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(d.iterdir()):
            d.rmdir()


def _ignored(root: Path, path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=root).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("size", "bytes", "hold", "restore"))
    parser.add_argument("--carry", nargs="*", default=[], help="paths the call carries (size)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    root = args.root
    if args.action == "hold":
        print(f"device_tree: held {hold(root)} files of {HELD}/ in {HOLD}/")
    elif args.action == "restore":
        print(f"device_tree: restored {restore(root)} files of {HELD}/")
    sent = travelling(root, args.carry)
    if args.action == "bytes":  # the bare figure (scripts/fa4_pack.sh sizes its parts by it)
        print(sent)
        return 0
    state = "held" if (root / HOLD).exists() else "in the tree"
    print(
        f"device_tree: a call sends {sent / 2**20:.1f} MiB of {LIMIT_MIB} ({HELD}/ {state}"
        f"{', carrying ' + ' '.join(args.carry) if args.carry else ''})"
    )
    return 0 if sent <= LIMIT_MIB * 2**20 else 1


if __name__ == "__main__":
    sys.exit(main())
