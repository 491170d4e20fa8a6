"""Which ranking of text units keeps RULER's answers (issue 47 item 3), on the selection protocol's
saved speculator passes (no model runs): for each saved pass, the default config's importance,
then each variant's kept set, and the share of each answer span it keeps (as the protocol's
answer_kept). A study, not product: the winner goes into core/methods/selection.py.

    python research/selection_units/variants.py PASS_DIR MODEL.gguf [--out FILE.json]

PASS_DIR: the saved passes of `specfill eval --candidates` (~/.cache/specfill/eval/passes/<speculator>-...);
results/variants_4k.{json,txt}: the pair, fp32, the frontier set at 4K (6 samples x 5 tasks), keep 0.3.
results/8chunk_units_*: the protocol run of the first rule (text units up to 8 chunks), before this study.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from specfill.evaluation.ruler_passes import PassScores, SavedPass
from specfill.evaluation.ruler_run import span_shares
from specfill.evaluation.ruler_tasks import build_sample
from specfill.core import SpecPrefillConfig
from specfill.core.io.tokenizer import load_tokenizer
from specfill.core.methods.selection import select_tokens
from specfill.core.text_units import text_unit_starts, token_pieces


def units_kept(importance, bounds, budget, score):
    """Units ranked by `score` (ties to the earlier), best first until they hold `budget` tokens."""
    scores = np.array([score(importance[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])
    ranked = np.lexsort((np.arange(len(scores)), -scores))
    kept, held = np.zeros(len(importance)), 0
    for u in ranked:
        if held >= budget:
            break
        kept[bounds[u] : bounds[u + 1]] = 1
        held += bounds[u + 1] - bounds[u]
    kept[-1] = 1
    return kept


def variants(importance, ids, tokenizer, config):
    n = len(importance)
    budget = math.ceil(n * config.keep_ratio - 1e-9)
    pieces = token_pieces(tokenizer, ids)
    out = {}
    chunks = np.zeros(n)
    chunks[select_tokens(importance, config).kept] = 1
    out["chunks"] = chunks
    for size in (1, 2, 4):
        bounds = np.append(text_unit_starts(pieces, size * config.select_chunk), n)
        out[f"text{size} mean"] = units_kept(importance, bounds, budget, np.mean)
        out[f"text{size} peak"] = units_kept(importance, bounds, budget, np.max)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("passes", type=Path)
    parser.add_argument("model")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    config = SpecPrefillConfig()
    rows, tally = [], {}
    for path in sorted(args.passes.glob("*.npz")):
        parts = path.stem.split("_")
        task, length, seed, index = "_".join(parts[:-4]), int(parts[-4]), int(parts[-3]), int(parts[-2])
        saved = SavedPass.load(path)
        sample = build_sample(tokenizer, task, length, index, seed, parts[-1] == "chat")
        importance = PassScores(saved).importance(config)
        for name, row in variants(importance, [int(i) for i in saved.ids], tokenizer, config).items():
            shares = span_shares(row, sample.spans.get("needle", []))
            kept = bool(shares) and min(shares) >= 0.5
            rows.append(
                {"task": task, "index": index, "variant": name, "kept_share": float(row.mean()), "answer_kept": shares}
            )
            t = tally.setdefault((task, name), [0, 0, 0.0, 0.0])
            t[0] += kept
            t[1] += 1
            t[2] += float(np.mean(shares)) if shares else 0.0
            t[3] += float(row.mean())
    for (task, name), (k, n, recall, share) in sorted(tally.items()):
        print(f"{task:16s} {name:18s} answer kept {k}/{n}  span recall {recall / n:.3f}  kept share {share / n:.3f}")
    if args.out:
        args.out.write_text(json.dumps({"config": "SpecPrefillConfig() keep 0.3", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
