"""Which speculator should an agent's turn get? SpecPrefill's kept set for a new part read over a
cached prefix, with the speculator dense (SpecPrefill's default) or walked by H2O (the composition),
on RULER's samples placed as a turn of a coding agent's conversation: the selection protocol's
answer-span rule (research/speculator_depth/probe.HELD), the speculator alone (torch float32),
written as it goes.

    .venv/bin/python research/agent_turns/turn_selection.py RECORDS PASSES --out FILE
        [--prefix-tokens 8000] [--configs default,composition,composition_w32n1] [--tasks ...] [--indices 0,1]
    .venv/bin/python research/agent_turns/turn_selection.py --build 4000 --dtype bfloat16 --out FILE ...
    .venv/bin/python research/agent_turns/turn_selection.py --report FILE   # FILE.md from a finished FILE

The prefix: evaluation/agent_session's agent (its system prompt with --prefix-tokens of the project's
guide, its tools, its task and an assistant reply), rendered by the speculator's chat template and
prefilled densely once (the speculator's own KV of a cached conversation, as the prompt cache keeps
it). Each turn: a sample's chat prompt from its user message on (the ids of its saved pass, the
template's default system turn cut off), so the sample's context and question are the new part;
its answer spans moved with it. Each config runs speculate_and_select from the reused prefix, as a
server turn does (core/methods/specprefill.py, `reused` and `speculator_cache`). With --build N
(no RECORDS / PASSES) the samples are made here (evaluation/ruler_tasks.build_sample: seed 0, chat
prompts of at most N tokens, indices 0-3 or --indices), their answer spans the generator's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

TASK_ORDER = ("vt", "niah_multikey_2", "qa_1", "qa_2", "niah_multivalue")
MODELS = Path.home() / ".cache" / "specfill" / "models"
CONFIGS = {  # SpecPrefillConfig fields per arm
    "default": {},
    "composition": {"speculator_prefill": "h2o"},
    "composition_w32n1": {"speculator_prefill": "h2o", "query_window": 32, "neighbours": 1},
    "default_w32n1": {"query_window": 32, "neighbours": 1},
    "composition_w32": {"speculator_prefill": "h2o", "query_window": 32},
    "composition_w32n1_k02": {"speculator_prefill": "h2o", "query_window": 32, "neighbours": 1, "keep_ratio": 0.2},
    # nested speculators (core/methods/speculator_depth.py): the deeper half reads the 30% the first half ranks first
    "nested": {"deep_keep": 0.3, "deep_from": 0.5},
    "composition_w32_nested": {"speculator_prefill": "h2o", "query_window": 32, "deep_keep": 0.3, "deep_from": 0.5},
    "composition_w32_nested_k02": {
        "speculator_prefill": "h2o",
        "query_window": 32,
        "deep_keep": 0.3,
        "deep_from": 0.5,
        "keep_ratio": 0.2,
    },
}
# an arm that runs core/config.AUTO_COMPOSITION itself (what auto runs from AUTO_COMPOSITION_FROM tokens on)
AUTO_ARM = "auto_composition"


def agent_prefix(tokenizer, tokens: int) -> list[int]:
    """The agent's cached conversation: system prompt (rules and `tokens` of the project's guide), tools,
    task and the assistant's first reply, as the chat template renders them (no generation prompt)."""
    from specfill.evaluation.agent_session import SYSTEM, TASK, TOOLS, project_guide

    guide = tokenizer.decode(tokenizer.encode(project_guide(), add_special_tokens=False)[:tokens])
    messages = [
        {"role": "system", "content": f"{SYSTEM}\n\n# Project guide\n\n{guide}"},
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "I will read the files I need first."},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tools=TOOLS)
    return tokenizer.encode(text, add_special_tokens=False)


def user_turn_start(ids: np.ndarray, im_start: int, im_end: int) -> int:
    """Where the sample's chat prompt's first user message starts (after the template's system turn)."""
    ends = np.flatnonzero(ids == im_end)
    start = int(ends[0]) + 2 if len(ends) else 0  # <|im_end|> "\n"
    if not start or ids[start] != im_start:
        raise ValueError("the sample's prompt does not open with a system turn")
    return start


def report(result: dict) -> str:
    """The Markdown summary: per config and task, the samples whose answer spans were all kept; the
    mean pass seconds and kept share of the new part."""
    rows, configs = result["rows"], list(result["configs"])
    tasks = [t for t in TASK_ORDER if any(r["task"] == t for r in rows)]
    lines = [
        f"# Agent turns: which speculator? ({result['machine'].get('cpu', '')}, torch {result.get('dtype', 'float32')})",
        "",
        f"Written by research/agent_turns/turn_selection.py. The 0.5B speculator's pass over each RULER "
        f"{'/'.join(sorted({str(r['tokens']) for r in rows}))}-token sample "
        f"placed as a turn after the agent's cached {result['prefix_tokens']}-token conversation (its own dense KV "
        f"of it, {result['prefix_s']:.0f} s once); spans kept: the sample's answer spans each at least half kept.",
        "",
        "| config | " + " | ".join(tasks) + " | all | mean pass (s) | kept share of the new part |",
        "|---" * (len(tasks) + 4) + "|",
    ]
    for name in configs:
        mine = [r for r in rows if r["config"] == name]
        per_task = [
            f"{sum(r['all_kept'] for r in mine if r['task'] == t)}/{sum(r['task'] == t for r in mine)}" for t in tasks
        ]
        passes = np.mean([r["parts_s"]["speculator"] for r in mine])
        kept = np.mean([r["kept_share_of_new"] for r in mine])
        held = sum(r["all_kept"] for r in mine)
        spelled = "core/config.AUTO_COMPOSITION" if name == AUTO_ARM else json.dumps(CONFIGS[name])
        lines.append(f"| {name} (`{spelled}`) | " + " | ".join(per_task) + f" | {held}/{len(mine)} "
                     f"| {passes:.1f} | {kept:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--report":
        path = Path(sys.argv[2])
        path.with_suffix(".md").write_text(report(json.loads(path.read_text())))
        return 0
    from specfill import api
    from specfill.core.config import AUTO_COMPOSITION, SpecPrefillConfig
    from specfill.core.methods.specprefill import run_speculator, speculate_and_select
    from specfill.evaluation.machine import describe_machine
    from specfill.evaluation.ruler_passes import SavedPass
    from specfill.evaluation.ruler_protocol import write_atomic

    sys.path.insert(0, str(Path(__file__).parents[1] / "speculator_depth"))
    from probe import HELD

    p = argparse.ArgumentParser()
    p.add_argument("records", type=Path, nargs="?")
    p.add_argument("passes", type=Path, nargs="?")
    p.add_argument("--build", type=int, default=None, help="make the samples here, at most N tokens each")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prefix-tokens", type=int, default=8000)
    p.add_argument("--configs", default="default,composition,composition_w32n1")
    p.add_argument("--tasks", default=",".join(TASK_ORDER))
    p.add_argument("--indices", default=None, help="only these sample indices (e.g. 1,3)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--room", type=int, default=8192, help="cache slots after the prefix (the longest turn + look-ahead)"
    )
    args = p.parse_args(argv)
    if (args.build is None) == (args.records is None or args.passes is None):
        p.error("give RECORDS and PASSES, or --build N")
    spec, tokenizer = api.load(
        str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), backend="cuda", dtype=args.dtype
    )
    ops, model, step = spec.ops, spec.model, spec.prefill_step_size
    stop_ids = frozenset(tokenizer.eos_token_ids)
    im_start, im_end = (tokenizer.encode(t, add_special_tokens=False)[0] for t in ("<|im_start|>", "<|im_end|>"))
    configs = {
        name: AUTO_COMPOSITION if name == AUTO_ARM else SpecPrefillConfig(**CONFIGS[name])
        for name in args.configs.split(",")
    }

    tasks = args.tasks.split(",")
    indices = None if args.indices is None else {int(i) for i in args.indices.split(",")}
    if args.build is not None:
        from specfill.api import encode_prompt
        from specfill.evaluation.ruler_tasks import build_sample

        samples, built = {}, {}  # (task, tokens, index) -> the sample's spans, its prompt's ids
        for task in tasks:
            for index in sorted(indices) if indices is not None else range(4):
                sample = build_sample(tokenizer, task, args.build, index)
                samples[task, args.build, index] = sample.spans
                built[task, args.build, index] = np.asarray(encode_prompt(tokenizer, sample.prompt), np.int64)
    else:
        data = json.loads(args.records.read_text())
        samples = {}
        for r in data["records"]:
            samples.setdefault((r["task"], r["tokens"], r["index"]), r["spans"])
    wanted = [k for k in samples if k[0] in tasks and (indices is None or k[2] in indices)]
    order = sorted(wanted, key=lambda k: (TASK_ORDER.index(k[0]), k[2]))

    prefix = np.asarray(agent_prefix(tokenizer, args.prefix_tokens), np.int64)
    began = time.perf_counter()
    with ops.device_scope():
        cache = run_speculator(
            ops, model, prefix, lookahead=0, stop_ids=stop_ids, step_size=step, extra_slots=args.room
        ).cache  # room for every turn: no regrowth
    prefix_s = time.perf_counter() - began
    print(f"prefix {len(prefix)} tokens: {prefix_s:.0f} s", flush=True)
    result = {
        "machine": describe_machine(),
        "prefix_tokens": len(prefix),
        "prefix_s": prefix_s,
        "dtype": args.dtype,
        "configs": {name: repr(c) for name, c in configs.items()},
        "rows": [],
    }
    for task, tokens, index in order:
        if args.build is not None:
            ids = built[task, tokens, index]
        else:
            path = next(iter(sorted(args.passes.glob(f"{task}_{tokens}_0_{index}_chat*.npz"))), None)
            if path is None:
                print(f"no pass for {task} {index}", file=sys.stderr)
                continue
            ids = SavedPass.load(path).ids
        start = user_turn_start(ids, im_start, im_end)
        turn = np.concatenate([prefix, ids[start:]])
        shift = len(prefix) - start
        spans = [(a + shift, b + shift) for a, b in samples[task, tokens, index].get("needle", [])]
        for name, config in configs.items():
            with ops.device_scope():
                run, selection, seconds = speculate_and_select(
                    ops,
                    model,
                    turn,
                    config,
                    stop_ids=stop_ids,
                    speculator_step_size=step,
                    reused=len(prefix),
                    speculator_cache=(cache, len(prefix)),
                )
            row = np.zeros(len(turn))
            row[selection.kept] = 1.0
            shares = [float(row[a:b].mean()) if b > a else 0.0 for a, b in spans]
            result["rows"].append(
                {
                    "config": name,
                    "task": task,
                    "tokens": tokens,
                    "index": index,
                    "new_tokens": len(turn) - len(prefix),
                    "parts_s": seconds,
                    "lookahead": run.lookahead,
                    "kept_share_of_new": float(row[len(prefix) :].mean()),
                    "answer_kept": shares,
                    "all_kept": all(s >= HELD for s in shares),
                }
            )
            print(
                f"{task} {index} {name}: pass {seconds['speculator']:.0f} s, kept "
                f"{row[len(prefix) :].mean():.2f}, spans {[round(s, 2) for s in shares]}",
                flush=True,
            )
            write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    for name in configs:
        rows = [r for r in result["rows"] if r["config"] == name]
        held = sum(r["all_kept"] for r in rows)
        passes = sum(r["parts_s"]["speculator"] for r in rows)
        print(f"{name}: {held}/{len(rows)} samples' spans kept, passes {passes:.0f} s")
    write_atomic(args.out.with_suffix(".md"), report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
