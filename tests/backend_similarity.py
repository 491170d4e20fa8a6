"""Line similarity of same-named modules in backends/mlx and backends/torch_cuda.

The array-library prefixes (`mx.`, `torch.`, `F.`, `nn.`) and the backends' type names are masked
first, so what remains measures duplicated orchestration, not shared vocabulary. Similarity is
difflib's ratio over logical lines (Python statements as the tokenizer ends them, tokens joined by
one space; comments, docstring-only statements and imports dropped: shared imports are shared
vocabulary, like the masked prefixes), so that a formatter's line breaks (a call's arguments one per
line, a closing bracket alone) count for nothing: 2 * matches / total.
usage: python tests/backend_similarity.py [--max 0.30]   (exit 1 if a pair is above --max)
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MASKS = [
    (re.compile(r"\b(mx|torch|F|nn|np|tl)\."), "ARR."),
    (re.compile(r"\b(mx\.array|torch\.Tensor|mx\.Dtype|torch\.dtype)\b"), "ARRAY"),
    (re.compile(r"\b(MLX|Torch)"), "B"),
]


def code_lines(path: Path) -> list[str]:
    """The module's logical lines with library prefixes masked (comments and docstrings dropped)."""
    lines, statement = [], []
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type in skip:
            continue
        if token.type != tokenize.NEWLINE:
            statement.append(token.string)
            continue
        line = " ".join(statement)
        statement = []
        if len(line.split(" ")) == 1 and line[:1] in "\"'rRbBuUfF":  # a docstring alone
            continue
        if line.startswith(("import ", "from ")):
            continue
        for pattern, repl in MASKS:
            line = pattern.sub(repl, line)
        lines.append(line)
    return lines


def similarity(a: Path, b: Path) -> float:
    la, lb = code_lines(a), code_lines(b)
    return difflib.SequenceMatcher(None, la, lb, autojunk=False).ratio() if la or lb else 0.0


def pairs() -> list[tuple[str, float]]:
    mlx, torch_dir = ROOT / "backends" / "mlx", ROOT / "backends" / "torch_cuda"
    out = []
    for path in sorted(mlx.rglob("*.py")):
        rel = path.relative_to(mlx)
        other = torch_dir / rel
        if other.exists():
            out.append((str(rel), similarity(path, other)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=float, default=None, help="fail if a pair is above this")
    args = parser.parse_args()
    worst = 0.0
    for name, ratio in pairs():
        print(f"{ratio:6.1%}  {name}")
        worst = max(worst, ratio)
    return 1 if args.max is not None and worst > args.max else 0


if __name__ == "__main__":
    sys.exit(main())
