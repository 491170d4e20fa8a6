"""Peers on the machine at hand (issue 26, item 4): llama.cpp, mlx-lm and specfill's methods on
both backends, the same prompt token ids for all, TTFT and the first greedy tokens compared.

    flock /work/model.lock .venv/bin/python research/peers/peer_table.py \\
        ~/.cache/specfill/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --speculator ~/.cache/specfill/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --lengths 2048

Each system runs in its own process, one after another (memory, and no system timed while another
holds the cores): llama.cpp through llama-cpp-python on the GGUF as is (Q4_K_M, flash attention,
all threads; skipped with the reason when llama_cpp is not installed: it builds from source, see
docs/results.md), mlx-lm 0.32's own model on MLX's CPU device in float32 (the GGUF dequantized by
specfill and written as an mlx-lm directory), and specfill full / H2O / SpecPrefill keep 0.1 on the
torch backend (float32, CPU) and on MLX (float32, CPU). MLX runs with OpenBLAS preloaded. TTFT:
one warm-up on 256 tokens, then the prompt once; the first 8 greedy tokens are compared with
specfill torch full's. Writes research/peers/results/peers.{json,md}; load average before and after each.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
FIRST = 8  # greedy tokens compared
SYSTEMS = ["llama.cpp", "mlx-lm", "cuda:full", "cuda:h2o", "cuda:specprefill", "mlx:full", "mlx:h2o",
           "mlx:specprefill"]


def prompt_ids(gguf: str, n: int) -> list[int]:
    """The first n tokens of the fixed evaluation text, by the model's own tokenizer."""
    from specfill.core.io.tokenizer import load_tokenizer
    text = (ROOT / "evaluation" / "data" / "gpl3_gfdl13.txt").read_text()
    ids = load_tokenizer(gguf).encode(text * (1 + n // 3000), add_special_tokens=False)
    if len(ids) < n:
        raise SystemExit(f"the evaluation text has {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def run_llama_cpp(gguf: str, ids: list[int]) -> tuple[float, list[int]]:
    from llama_cpp import Llama
    llm = Llama(model_path=gguf, n_ctx=len(ids) + 64, n_batch=512, n_threads=os.cpu_count(), flash_attn=True,
                verbose=False, logits_all=False)
    llm.eval(ids[:256])
    llm.reset()
    start = time.perf_counter()
    llm.eval(ids)
    tokens = [last_argmax(llm)]
    ttft = time.perf_counter() - start
    for _ in range(FIRST - 1):
        llm.eval(tokens[-1:])
        tokens.append(last_argmax(llm))
    return ttft, tokens


def last_argmax(llm) -> int:
    """Greedy token from the last evaluated position: without logits_all, llama-cpp-python keeps no
    scores, and llama.cpp's output buffer holds one row (the batch's last token)."""
    import numpy as np
    return int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).argmax())


def run_mlx_lm(gguf: str, ids: list[int]) -> tuple[float, list[int]]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    sys.path.insert(0, str(ROOT / "research" / "adapter_speed"))
    from bench_adapter_prefill import mlx_lm_directory  # research/adapter_speed/bench_adapter_prefill.py
    from specfill.backends.mlx import load
    own, _ = load(gguf, dtype="float32", device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        lm, _ = load_model(mlx_lm_directory(own, Path(tmp) / "mlx-lm"))
    del own
    lm.set_dtype(mx.float32)
    with mx.stream(mx.cpu):
        for _ in generate_step(mx.array(ids[:256]), lm, max_tokens=1):
            pass
        start, tokens, ttft = time.perf_counter(), [], 0.0
        for token, _ in generate_step(mx.array(ids), lm, max_tokens=FIRST):
            tokens.append(int(token))
            ttft = ttft or time.perf_counter() - start
    return ttft, tokens


def run_specfill(backend: str, method: str, gguf: str, speculator: str, ids: list[int]) -> tuple[float, list[int], int]:
    from specfill.api import load, load_speculator, stream_generate
    model, tokenizer = load(gguf, backend=backend, dtype="float32", device="cpu")
    spec = load_speculator(speculator, model, tokenizer, dtype="float32", device="cpu") \
        if method == "specprefill" else None
    settings = {"method": method, "speculator": spec}
    list(stream_generate(model, tokenizer, ids[:256], 1, **settings))
    out = list(stream_generate(model, tokenizer, ids, FIRST, **settings))
    return out[0].ttft, [r.token for r in out], out[-1].kept_tokens


def one(system: str, options: argparse.Namespace, n: int) -> dict:
    """Run `system` in this process: {"ttft_s", "first_tokens", "kept"} or {"skipped": reason}."""
    ids = prompt_ids(options.gguf, n)
    if system == "llama.cpp":
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            return {"skipped": "llama_cpp (llama-cpp-python) is not installed here"}
        ttft, tokens = run_llama_cpp(options.gguf, ids)
        return {"ttft_s": ttft, "first_tokens": tokens, "kept": n, "dtype": "GGUF quant as stored"}
    if system == "mlx-lm":
        ttft, tokens = run_mlx_lm(options.gguf, ids)
        return {"ttft_s": ttft, "first_tokens": tokens, "kept": n, "dtype": "float32"}
    backend, method = system.split(":")
    ttft, tokens, kept = run_specfill(backend, method, options.gguf, options.speculator, ids)
    return {"ttft_s": ttft, "first_tokens": tokens, "kept": kept, "dtype": "float32"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("--speculator", required=True, help="the SpecPrefill speculator's GGUF")
    parser.add_argument("--lengths", default="2048")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one system, print JSON
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--merge", action="store_true",
                        help="keep the earlier peers.json rows of the systems and lengths not run now")
    options = parser.parse_args(argv)
    if options.one:
        system, n = options.one.rsplit("@", 1)
        print("RESULT " + json.dumps(one(system, options, int(n))), flush=True)
        return 0
    from peer_report import write_report  # research/peers/peer_report.py
    rows = []
    for n in [int(x) for x in options.lengths.split(",")]:
        for system in options.systems.split(","):
            env = dict(os.environ, **({"LD_PRELOAD": OPENBLAS} if system.startswith("mlx") and Path(OPENBLAS).exists() else {}))
            before = os.getloadavg()
            done = subprocess.run([sys.executable, __file__, options.gguf, "--speculator", options.speculator,
                                   "--one", f"{system}@{n}"], env=env, capture_output=True, text=True)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            result = json.loads(line[7:]) if line else {"skipped": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
            rows.append({"system": system, "prompt_tokens": n, **result, "load_before": before,
                         "load_after": os.getloadavg()})
            print(json.dumps(rows[-1]), flush=True)
    earlier = options.out / "peers.json"
    if options.merge and earlier.is_file():
        ran = {(row["system"], row["prompt_tokens"]) for row in rows}
        rows = [row for row in json.loads(earlier.read_text())["rows"] if (row["system"], row["prompt_tokens"]) not in ran] + rows
        rows.sort(key=lambda row: (row["prompt_tokens"], SYSTEMS.index(row["system"]) if row["system"] in SYSTEMS else 99))
    for path in write_report(rows, options, options.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
