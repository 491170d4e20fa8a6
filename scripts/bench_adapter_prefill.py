"""Full prefill through the mlx-lm adapter against mlx-lm's own forward and specfill's own model,
on one GGUF checkpoint of an own family (MLX CPU, fp32): issue 21 item 5's first half.

The GGUF is loaded into specfill's own model (dequantized to float32), its parameters (Hugging
Face names, which are mlx-lm's) are written as an mlx-lm directory, and mlx-lm loads that. Each
timing: a prompt of N random ids prefilled in steps of 2048 into a fresh cache, cache evaluated,
best of `--repeats`. Writes results/adapter/prefill_<model>.json and prints a line per length.

    flock /work/model.lock env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        .venv/bin/python scripts/bench_adapter_prefill.py ~/.cache/specfill/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from specfill.backends.mlx import load
from specfill.backends.mlx.adapted import AdaptedOps, adapt
from specfill.core.driver import CausalLM
from specfill.core.methods.prefill import prefill
from specfill.evaluation.machine import describe_machine


def mlx_lm_directory(model: CausalLM, directory: Path) -> Path:
    """specfill's own model's float32 parameters and config as an mlx-lm (qwen2 / llama) directory."""
    args = model.args
    config = {"model_type": args.architecture, "hidden_size": args.hidden_size, "vocab_size": args.vocab_size,
              "intermediate_size": args.intermediate_size, "num_hidden_layers": args.num_hidden_layers,
              "num_attention_heads": args.num_attention_heads, "num_key_value_heads": args.num_key_value_heads,
              "rms_norm_eps": args.rms_norm_eps, "rope_theta": args.rope_theta,
              "max_position_embeddings": args.max_position_embeddings,
              "tie_word_embeddings": args.tie_word_embeddings}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.model.parameters())))
    return directory


def best(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("gguf")
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args()
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    own, _ = load(options.gguf, dtype="float32", device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        lm, _ = load_model(mlx_lm_directory(own, Path(tmp) / "mlx-lm"))
    lm.set_dtype(mx.float32)
    mx.eval(lm.parameters())
    ops = AdaptedOps(mx.Device(mx.cpu))
    rows = []
    with mx.stream(mx.cpu):
        for n in [int(x) for x in options.lengths.split(",")]:
            ids = mx.array(np.random.default_rng(0).integers(10, 1000, n).astype(np.int32))

            def library() -> None:
                cache = make_prompt_cache(lm)
                for start in range(0, n, 2048):
                    lm(ids[None, start:start + 2048], cache=cache)
                    mx.eval([c.state for c in cache])

            def through(model: CausalLM, model_ops) -> None:
                cache = model_ops.new_cache(model.model, n)
                prefill(model_ops, model.model, ids, 0, cache, step_size=2048)
                model_ops.settle([cache])

            t_lib = best(library, options.repeats)
            adapted = CausalLM(adapt(lm), ops)
            t_adapter = best(lambda: through(adapted, ops), options.repeats)
            t_own = best(lambda: through(own, own.ops), options.repeats)
            rows.append({"tokens": n, "mlx_lm_s": t_lib, "adapter_s": t_adapter, "own_s": t_own,
                         "adapter_over_mlx_lm": t_adapter / t_lib, "own_over_mlx_lm": t_own / t_lib})
            print(json.dumps(rows[-1]), flush=True)
    out = Path("results/adapter") / f"prefill_{Path(options.gguf).stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": Path(options.gguf).name, "dtype": "float32", "device": "MLX CPU",
                               "cpu": platform.processor() or platform.machine(), "load_average": os.getloadavg(),
                               "cpu_features": describe_machine()["cpu_features"],
                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
