"""One rank of a distributed check, run by mlx.launch (tests/mlx_distributed/launch.py):
  rank_run.py MODEL_DIR SPECULATOR_DIR KIND OUT_DIR [--pair] [--die RANK]
loads MODEL_DIR sharded over the launched group (KIND: tensor or pipeline; --pair: mlx_lm.load's
unsharded (model, tokenizer) pair handed to specfill.load, else the directory), runs every scenario of
scenarios.py and writes OUT_DIR/rank{r}.json. --die RANK: that rank exits right after loading
(os._exit) and the others generate: they must end with one DistributedError line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.* imports

import mlx.core as mx

from specfill.core.errors import SpecfillError
from tests.mlx_distributed.scenarios import run_scenarios


def main() -> int:
    model_dir, speculator_dir, kind, out_dir = sys.argv[1:5]
    options = sys.argv[5:]
    die = int(options[options.index("--die") + 1]) if "--die" in options else None
    group = mx.distributed.init(strict=True)
    import specfill

    source = model_dir
    if "--pair" in options:
        from mlx_lm import load as mlx_lm_load

        source = mlx_lm_load(model_dir)
    try:
        model, tokenizer = specfill.load(source, backend="mlx", group=group, pipeline=kind == "pipeline")
        if die is not None:
            if group.rank() == die:
                os._exit(3)
            list(specfill.stream_generate(model, tokenizer, list(range(3, 60)), 64))
            print(f"rank {group.rank()}: generated without its peer", flush=True)
            return 0
        results = run_scenarios(model, tokenizer, speculator_dir, kind)
    except SpecfillError as err:
        print(f"specfill: error: {err}", file=sys.stderr, flush=True)
        return 2
    results.update(rank=group.rank(), size=group.size())
    Path(out_dir, f"rank{group.rank()}.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
