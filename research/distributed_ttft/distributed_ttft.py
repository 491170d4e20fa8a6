"""TTFT of one model sharded over two ranks of this machine vs one process, per method, and the share
of it spent in communication (issue 39 item 4).

    nice -n 19 .venv/bin/python research/distributed_ttft/distributed_ttft.py \\
        --out research/distributed_ttft/results/NAME [--shape qwen2.5-0.5b] [--tokens 1024] [--model DIR --speculator DIR]

writes NAME.json and NAME.md (atomically). The same prompt (seeded random ids) runs with full prefill,
H2O and SpecPrefill in three set-ups: one process (no group), two ranks under `mlx.launch --backend
ring -n 2 --hosts 127.0.0.1` with tensor parallelism (mlx-lm's Model.shard) and with pipeline
parallelism (Model.model.pipeline). Every rank loads the model sharded (specfill.load(..., group=))
and the speculator whole (replicated, as specfill runs it).

The model: --model / --speculator (mlx-lm directories with tokenizer.json), or a model of a
published shape with seeded random weights built from its config (--shape; mlx-lm's own model
file, so it shards as the real one would; the timing does not depend on the weights' values, the
kept positions and memory sets do). The speculator of a built model: the same shape with a quarter
of the layers. GGUF files are not taken: mlx-lm's sharded load reads mlx-lm directories only.

Per method and set-up, each rank: a warm-up on the prompt's first tokens, then the timed run (a
barrier first, TTFT = wall time until stream_generate yields the first token), then the same run
instrumented: every mx.distributed collective (all_sum, all_gather, all_max, all_min, send, recv,
recv_like) wrapped in a timer that evaluates the collective's inputs BEFORE starting the clock (so
the lazily built compute feeding it is not counted) and evaluates its output before stopping it.
Communication = the sum of those intervals (transfer plus waiting for the other rank: imbalance is
counted as communication); its share is taken of the instrumented run's TTFT, since forcing those
evaluations serialises work the lazy graph could have overlapped (the instrumented TTFT is reported
beside the plain one). On one machine both ranks share its cores and its memory bandwidth, so
the ranks' compute does not add up: this measures what sharding costs, not what it gains (the
roofline, research/roofline/results/roofline_macs.md, predicts the gain over Thunderbolt 5).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {  # mlx-lm qwen2 configs (qwen2 has both Model.shard and pipeline)
    "qwen2.5-0.5b": dict(  # Qwen2.5-0.5B / Qwen2.5-Coder-0.5B's published config.json
        hidden_size=896,
        num_hidden_layers=24,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "tiny": dict(  # seconds: the smoke test's; the 0.5B's head counts (7 query / 1 KV per rank) and tying
        hidden_size=112,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
    ),
}
COMMON = dict(
    model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768, bos_token_id=None
)
KINDS = ("one", "tensor", "pipeline")
METHODS = ("full", "h2o", "specprefill")
COLLECTIVES = ("all_sum", "all_gather", "all_max", "all_min", "send", "recv", "recv_like")
WARMUP_TOKENS = 128


def build_model(directory: Path, shape: dict[str, Any], layers: int | None = None, seed: int = 0) -> Path:
    """An mlx-lm directory of a qwen2 model of `shape` (layers: override) with seeded random
    weights and a word-level tokenizer.json covering its vocabulary."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = {**COMMON, **shape}
    if layers is not None:
        config["num_hidden_layers"] = layers
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config["vocab_size"])}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.save(str(directory / "tokenizer.json"))
    return directory


def method_options(name: str, tokens: int, speculator: Any) -> dict[str, Any]:
    """stream_generate's options for a method at this prompt length: H2O with four chunks over the
    prompt (its defaults' 1024-token chunk would leave a 1K prompt dense) in every layer;
    SpecPrefill at its defaults with the replicated speculator."""
    from specfill.core.config import H2OConfig, SpecPrefillConfig

    if name == "full":
        return {}
    if name == "h2o":
        chunk = max(8, tokens // 4)
        memory = max(1, chunk // 8)
        config = H2OConfig(
            chunk_size=chunk,
            batch_size=4 * chunk,
            local=memory,
            heavy=memory,
            dense_tail=min(64, chunk // 4),
            layers="all",
        )
        return {"method": "h2o", "h2o": config}
    return {"method": "specprefill", "specprefill": SpecPrefillConfig(), "speculator": speculator}


class Collectives:
    """mx.distributed's collectives wrapped in timers while active (see the module's docstring)."""

    def __init__(self) -> None:
        import mlx.core as mx

        self.mx = mx
        self.seconds, self.calls, self.bytes, self.active = 0.0, 0, 0, False
        self.original = {name: getattr(mx.distributed, name) for name in COLLECTIVES if hasattr(mx.distributed, name)}
        for name, function in self.original.items():
            setattr(mx.distributed, name, self._timed(function))

    def _timed(self, function: Any) -> Any:
        mx = self.mx

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return function(*args, **kwargs)
            inputs = [a for a in args if isinstance(a, mx.array)]
            if inputs:
                mx.eval(*inputs)
            start = time.perf_counter()
            out = function(*args, **kwargs)
            mx.eval(out)
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.bytes += int(out.nbytes)
            return out

        return timed

    def reset(self) -> None:
        self.seconds, self.calls, self.bytes = 0.0, 0, 0


def _first_token_seconds(model: Any, tokenizer: Any, prompt: list[int], options: dict[str, Any]) -> float:
    import specfill

    start = time.perf_counter()
    for _ in specfill.stream_generate(model, tokenizer, prompt, 1, **options):
        return time.perf_counter() - start
    raise RuntimeError("stream_generate yielded no token")


def rank_run(kind: str, model_dir: str, speculator_dir: str, tokens: int, out_dir: str, dtype: str) -> int:
    """One rank (or the one process): every method warm, timed, then instrumented -> rank{r}.json."""
    import mlx.core as mx
    import numpy as np

    import specfill
    from specfill.api import load_speculator

    collectives = Collectives()  # before loading: mlx-lm's layers look the functions up at call time
    group = mx.distributed.init(strict=kind != "one")
    if kind == "one":
        model, tokenizer = specfill.load(model_dir, backend="mlx", dtype=dtype)
    else:
        model, tokenizer = specfill.load(
            model_dir, backend="mlx", dtype=dtype, group=group, pipeline=kind == "pipeline"
        )
    speculator = load_speculator(speculator_dir, model, tokenizer, dtype=dtype)
    vocab = json.loads(Path(model_dir, "config.json").read_text())["vocab_size"]
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, vocab, tokens)]
    barrier = collectives.original["all_sum"]

    def wait_for_all() -> None:
        if group.size() > 1:
            mx.eval(barrier(mx.array(1.0), group=group, stream=mx.cpu))

    rows = []
    for name in METHODS:
        options = method_options(name, tokens, speculator)
        warm = method_options(name, min(tokens, WARMUP_TOKENS), speculator)
        _first_token_seconds(model, tokenizer, prompt[:WARMUP_TOKENS], warm)
        wait_for_all()
        ttft = _first_token_seconds(model, tokenizer, prompt, options)
        wait_for_all()
        collectives.reset()
        collectives.active = True
        instrumented = _first_token_seconds(model, tokenizer, prompt, options)
        collectives.active = False
        rows.append(
            {
                "method": name,
                "ttft_s": ttft,
                "instrumented_ttft_s": instrumented,
                "communication_s": collectives.seconds,
                "communication_share": collectives.seconds / instrumented,
                "collective_calls": collectives.calls,
                "collective_bytes": collectives.bytes,
            }
        )
        print(f"{kind} rank {group.rank()}: {rows[-1]}", flush=True)
    result = {"kind": kind, "rank": group.rank(), "size": group.size(), "dtype": dtype, "rows": rows}
    Path(out_dir, f"{kind}_rank{group.rank()}.json").write_text(json.dumps(result))
    return 0


def free_port_pair() -> int:
    """A port p with p and p + 1 free on 127.0.0.1 (the ring listens on one port per rank)."""
    for _ in range(50):
        port = random.randint(20000, 60000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair on 127.0.0.1")


def ring_command(launcher: Path, script: list[str], ranks: int = 2, env: dict[str, str] | None = None) -> list[str]:
    """mlx.launch's command line running `script` (a Python file and its arguments) on `ranks` ring
    ranks on 127.0.0.1 with this interpreter ("--": the script's options are not the launcher's)."""
    command = [str(launcher), "--backend", "ring", "-n", str(ranks), "--hosts", "127.0.0.1"]
    command += ["--starting-port", str(free_port_pair()), "--python", sys.executable]
    for key, value in (env or {}).items():
        command += ["--env", f"{key}={value}"]
    return [*command, "--", *script]


def _command(kind: str, args: list[str]) -> list[str]:
    script = [str(Path(__file__).resolve()), "--rank-run", kind, *args]
    if kind == "one":
        return [sys.executable, *script]
    return ring_command(Path(sys.executable).parent / "mlx.launch", script)


def run_setups(
    model_dir: Path,
    speculator_dir: Path,
    tokens: int,
    kinds: tuple[str, ...] = KINDS,
    limit_s: float = 1800.0,
    dtype: str = "float32",
) -> dict:
    """Every set-up's ranks' results, {kind: [rank results]}; a set-up that fails raises with its output."""
    got: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            command = _command(kind, [str(model_dir), str(speculator_dir), str(tokens), tmp, dtype])
            print(f"running {kind}: {' '.join(command)}", flush=True)
            done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s)
            files = sorted(Path(tmp).glob(f"{kind}_rank*.json"))
            if done.returncode != 0 or not files:
                raise RuntimeError(f"{kind} failed (status {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
            got[kind] = [json.loads(f.read_text()) for f in files]
    return got


def summarize(setups: dict[str, list[dict]]) -> list[dict]:
    """One row per set-up and method: rank 0's figures, the slowest rank's TTFT, the ratio to one process."""
    one = {r["method"]: r["ttft_s"] for r in setups["one"][0]["rows"]} if "one" in setups else {}
    rows = []
    for kind, ranks in setups.items():
        for index, method in enumerate(METHODS):
            first = ranks[0]["rows"][index]
            slowest = max(r["rows"][index]["ttft_s"] for r in ranks)
            rows.append(
                {
                    "kind": kind,
                    "ranks": ranks[0]["size"],
                    **first,
                    "slowest_rank_ttft_s": slowest,
                    "vs_one_process": slowest / one[method] if method in one else None,
                    "communication_share_by_rank": [r["rows"][index]["communication_share"] for r in ranks],
                }
            )
    return rows


def markdown(result: dict) -> str:
    lines = [
        f"# Distributed TTFT on this machine: {result['model']} at {result['tokens']} tokens "
        f"({result['dtype']}), 2 ranks vs 1 process",
        "",
        f"Machine: {result['machine']}. Launch: `mlx.launch --backend ring -n 2 --hosts 127.0.0.1` (both ranks on "
        "this machine's cores: sharding's cost, not its gain). Speculator: "
        f"{result['speculator']} (replicated). Method: research/distributed_ttft/distributed_ttft.py (its docstring says how "
        "communication is timed: every mx.distributed collective, inputs evaluated before the clock starts).",
        "",
        "| set-up | method | TTFT rank 0 (s) | slowest rank (s) | vs 1 process | instrumented TTFT (s) | "
        "communication (s) | share (rank 0 / 1) | collectives | MB moved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ratio = "-" if r["vs_one_process"] is None else f"{r['vs_one_process']:.2f}x"
        shares = " / ".join(f"{100 * s:.0f}%" for s in r["communication_share_by_rank"])
        lines.append(
            f"| {r['kind']} | {r['method']} | {r['ttft_s']:.2f} | {r['slowest_rank_ttft_s']:.2f} | {ratio} | "
            f"{r['instrumented_ttft_s']:.2f} | {r['communication_s']:.3f} | {shares} | {r['collective_calls']} | "
            f"{r['collective_bytes'] / 1e6:.1f} |"
        )
    lines += [
        "",
        "vs 1 process: the slowest rank's TTFT over the one process's (above 1: slower). Share: communication "
        "over the instrumented run's TTFT on each rank.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-run"]:
        kind, model_dir, speculator_dir, tokens, out_dir, dtype = argv[1:7]
        return rank_run(kind, model_dir, speculator_dir, int(tokens), out_dir, dtype)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results stem: writes STEM.json and STEM.md")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--model", type=Path, help="an mlx-lm directory instead of a built --shape")
    parser.add_argument("--speculator", type=Path, help="its speculator (an mlx-lm directory; with --model)")
    parser.add_argument("--limit-s", type=float, default=1800.0, help="per set-up (each launch)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    args = parser.parse_args(argv)
    if (args.model is None) != (args.speculator is None):
        parser.error("--model and --speculator go together")
    if args.tokens < 16:
        parser.error("--tokens must be at least 16")
    from specfill.evaluation.machine import describe_machine
    from specfill.evaluation.ruler_protocol import write_atomic

    with tempfile.TemporaryDirectory() as built:
        if args.model is None:
            shape = SHAPES[args.shape]
            model_dir = build_model(Path(built, "model"), shape)
            spec_layers = max(1, shape["num_hidden_layers"] // 4)
            speculator_dir = build_model(Path(built, "speculator"), shape, layers=spec_layers, seed=1)
            names = (f"{args.shape} shape, random weights", f"{args.shape} shape with {spec_layers} layers")
        else:
            model_dir, speculator_dir = args.model, args.speculator
            names = (str(args.model), str(args.speculator))
        setups = run_setups(model_dir, speculator_dir, args.tokens, KINDS, args.limit_s, args.dtype)
    info = describe_machine()
    result = {
        "model": names[0],
        "speculator": names[1],
        "tokens": args.tokens,
        "dtype": args.dtype,
        "machine": f"{info['cpu']}, {info['cores']} cores, load {os.getloadavg()[0]:.2f} after the run",
        "setups": setups,
        "rows": summarize(setups),
    }
    stem = args.out.parent / args.out.name  # "qwen0.5b_1k": a dot in the stem is no suffix
    json_path, md_path = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".md")
    write_atomic(json_path, json.dumps(result, indent=1) + "\n")
    write_atomic(md_path, markdown(result))
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
