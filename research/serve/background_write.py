"""What an agent's next turn waits for when the prompt cache writes the last turn to disk, before and
after the background writes (serve/prompt_cache.py `background`).

A conversation of N tokens is kept in the prompt cache with a disk store; the server writes it once
it has been quiet for WRITE_AFTER_S, and an agent whose tool ran longer than that sends its next turn
(here 64 new tokens) while the write runs. Before: the write runs on the worker, so the turn waits
for all of it, then prefills. After: the worker copies the KV (KVCache.copy) and the writer thread
writes the copy while the turn prefills beside it (the two share the CPU). Per N this measures, on
the real model: the synchronous write (store.write + evict, the worker's wait before), the copy
(the worker's wait after), the turn's prefill alone and beside the background write, and the
background write's own time. The KV is random data of the model's shape (a write's and a prefill's
time do not depend on the values; a real prefill of 32K would take half an hour here).

    .venv/bin/python research/serve/background_write.py --tokens 4096,16384,32768 \
        --out research/serve/results/background_write
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from specfill import load
from specfill.core.runtime import GenerationInfo, KVState, PrefillMethod, SamplingConfig
from specfill.evaluation.machine import describe_machine, machine_line
from specfill.serve.prompt_cache import Entry, PromptCache
from specfill.serve.prompt_store import PromptStore

MODELS = Path.home() / ".cache" / "specfill" / "models"
MAIN = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
NEW_TOKENS = 64  # the next turn's new part (a short tool result)


def conversation(model, n: int, seed: int) -> Entry:
    """An exact conversation of n tokens whose KV holds random data of the model's shape."""
    rng = np.random.default_rng(seed)
    cache = model.ops.new_cache(model.model, n + NEW_TOKENS + 8)
    shape = (cache.k.shape[0], cache.k.shape[2], n, cache.k.shape[4])
    cache.fill(
        {
            "keys": torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(cache.k.dtype),
            "values": torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(cache.v.dtype),
            "positions": torch.arange(n, dtype=torch.int64),
        }
    )
    ids = rng.integers(4, model.args.vocab_size, n).tolist()
    return Entry(ids, KVState(cache, n), exact=True)


def next_turn(model, entry: Entry, seed: int) -> float:
    """Seconds to the first token of NEW_TOKENS more tokens over a copy of the conversation's KV."""
    new = np.random.default_rng(seed).integers(4, model.args.vocab_size, NEW_TOKENS).tolist()
    reuse = KVState(entry.kv.cache.copy(entry.kv.slots, entry.kv.slots + NEW_TOKENS + 8), entry.kv.slots)
    started = time.perf_counter()
    steps = model.generate_step(
        entry.tokens + new,
        max_tokens=1,
        sampling=SamplingConfig(),
        stop_ids=frozenset(),
        method=PrefillMethod("full"),
        info=GenerationInfo(),
        reuse=reuse,
    )
    next(iter(steps))
    return time.perf_counter() - started


def one(model, n: int, repeats: int, directory: Path) -> dict:
    rows: dict[str, list[float]] = {"sync_write_s": [], "copy_s": [], "turn_alone_s": [], "turn_beside_s": [],
                                    "background_write_s": []}
    entry = conversation(model, n, n)
    next_turn(model, entry, 0)  # warm
    for r in range(repeats):
        for path in directory.iterdir():
            path.unlink()
        store = PromptStore(directory, model, "random-kv", None)
        sync = PromptCache(None, model.args.max_position_embeddings, None, store)
        sync.entries.append(entry)
        started = time.perf_counter()
        sync.idle_step(model)  # the write, on the worker (what a turn arriving waited for)
        rows["sync_write_s"].append(time.perf_counter() - started)
        assert sync.saved == 1
        entry.path, entry.unsaved = None, False
        rows["turn_alone_s"].append(next_turn(model, entry, r + 1))
        for path in directory.iterdir():
            path.unlink()
        background = PromptCache(None, model.args.max_position_embeddings, None, store, background=True)
        background.entries.append(entry)
        started = time.perf_counter()
        background.idle_step(model)  # the copy here; the write on the writer thread
        rows["copy_s"].append(time.perf_counter() - started)
        rows["turn_beside_s"].append(next_turn(model, entry, r + 1))
        background.settle()
        rows["background_write_s"].append(time.perf_counter() - started)
        assert background.saved == 1
        background.writes.writer.shutdown()
        entry.path, entry.unsaved = None, False
    median = {k: round(statistics.median(v), 3) for k, v in rows.items()}
    return {
        "tokens": n,
        "kv_gb": round(entry.kv.cache.k[:, :, :, :n].nbytes * 2 / 1e9, 3),
        **median,
        "before_s": round(median["sync_write_s"] + median["turn_alone_s"], 3),
        "after_s": round(median["copy_s"] + median["turn_beside_s"], 3),
        "runs": {k: [round(x, 3) for x in v] for k, v in rows.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(MAIN))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", default="4096,16384,32768")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="the store's directory (default: a temporary one)")
    p.add_argument("--out", default="research/serve/results/background_write")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load(args.model, backend="cuda", device="cpu", dtype=args.dtype)
    machine = describe_machine()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for n in [int(t) for t in args.tokens.split(",")]:
            rows.append(one(model, n, args.repeats, Path(directory)))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "runs"}), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"model": args.model, "dtype": args.dtype, "threads": args.threads, "new_tokens": NEW_TOKENS,
              "machine": machine, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        f"# The next turn while the prompt cache writes the last one: {Path(args.model).name} ({args.dtype}, torch CPU, "
        f"{args.threads} threads)",
        "",
        f"Machine: {machine_line(machine)}. Written by research/serve/background_write.py: a conversation of N tokens "
        f"(random KV of the model's shape), its disk write, and a next turn of {NEW_TOKENS} new tokens arriving as the "
        f"write starts; medians of {args.repeats}.",
        "",
        "before: the worker writes (sync write), then the turn prefills (alone); after: the worker copies the KV, the "
        "writer thread writes the copy while the turn prefills beside it.",
        "",
        "| tokens | KV (GB) | sync write (s) | copy (s) | turn alone (s) | turn beside the write (s) | background write (s) | "
        "turn's wait + TTFT before (s) | after (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']} | {r['kv_gb']} | {r['sync_write_s']} | {r['copy_s']} | {r['turn_alone_s']} | "
            f"{r['turn_beside_s']} | {r['background_write_s']} | {r['before_s']} | {r['after_s']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
