"""Decode speed with and without speculative decoding (core/methods/drafting.py), in one run.

Per prefill method and draft size k (k = 0: plain decoding): TTFT, decode tokens/s, end-to-end
seconds (TTFT + decode), acceptance, and whether the greedy text equals k = 0's (it must).
With full prefill the draft is `draft` (a path or self:K); with SpecPrefill the speculator
drafts from the prompt KV it already built.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from specfill.api import Session, prefill_method
from specfill.api import open as open_session
from specfill.core import SpecPrefillConfig
from specfill.prompts import read_prompt_file

from .machine import describe_machine, machine_line
from .plots import plot_decode_speed
from .texts import tokens_of_length


@dataclass(frozen=True)
class DraftingPlan:
    backend: str = "cuda"
    model: str | None = None
    draft: str = "self:8"
    speculator: str = "self:8"
    methods: tuple[str, ...] = ("full", "specprefill")
    draft_tokens: tuple[int, ...] = (2, 4, 6)
    prompt_tokens: int = 1000
    decode_tokens: int = 128
    specprefill: SpecPrefillConfig = field(default_factory=SpecPrefillConfig)
    dtype: str | None = None
    device: str | None = None
    prompt_file: str | None = None  # the prompt's text (its first prompt_tokens tokens); None: the eval text


def _one(session: Session, ids, method, plan: DraftingPlan, draft, k: int) -> dict:
    kwargs = {} if k == 0 else {"num_draft_tokens": k, "draft_model": draft}
    steps = list(session.stream(ids, max_tokens=plan.decode_tokens, method=method, **kwargs))
    last = steps[-1]
    decode_s = (last.generation_tokens - 1) / last.generation_tps if last.generation_tps else 0.0
    return {
        "k": k,
        "ttft_s": last.ttft,
        "decode_tps": last.generation_tps,
        "total_s": last.ttft + decode_s,
        "generated": last.generation_tokens,
        "drafted": last.drafted_tokens,
        "accepted": last.accepted_tokens,
        "acceptance": last.accepted_tokens / last.drafted_tokens if last.drafted_tokens else None,
        "skipped": last.draft_skipped,  # the draft's cost book said it cannot pay (core/methods/draft_costs.py)
        "tokens": [r.token for r in steps],
    }


def run_drafting_bench(plan: DraftingPlan, log: Callable[[str], None] = print) -> dict:
    session = open_session(
        plan.model, backend=plan.backend, dtype=plan.dtype, device=plan.device, speculator=plan.speculator, notify=log
    )
    model, tokenizer, speculator = session.model, session.tokenizer, session.speculator
    draft = session.load_speculator(plan.draft, "draft model")  # not the session's: k = 0 runs undrafted
    if plan.prompt_file is None:
        ids = tokens_of_length(tokenizer, plan.prompt_tokens)
    else:
        ids = tokenizer.encode(read_prompt_file(plan.prompt_file))[: plan.prompt_tokens]
    rows = []
    for name in plan.methods:
        method = prefill_method(name, specprefill=plan.specprefill, speculator=speculator)
        _one(session, ids[:64], method, DraftingPlan(decode_tokens=4), draft if name == "full" else None, 2)
        runs = [_one(session, ids, method, plan, draft if name == "full" else None, k) for k in (0, *plan.draft_tokens)]
        base = runs[0]
        for row in runs:
            row.update(
                method=name,
                identical=row["tokens"] == base["tokens"],
                decode_vs_plain=row["decode_tps"] / base["decode_tps"],
                total_vs_plain=base["total_s"] / row["total_s"],
            )
        for row in runs:
            del row["tokens"]
            rows.append(row)
            log(
                f"{name:<11} k={row['k']}: TTFT {row['ttft_s']:.2f} s, decode {row['decode_tps']:.2f} tok/s "
                f"({row['decode_vs_plain']:.2f}x), accepted {row['accepted']}/{row['drafted']}, same text "
                f"{row['identical']}"
            )
    return {
        "plan": {
            **vars(plan),
            "methods": list(plan.methods),
            "draft_tokens": list(plan.draft_tokens),
            "specprefill": asdict(plan.specprefill),
            "model": plan.model or "demo (SmolLM2-135M-Instruct Q4_1)",
        },
        "machine": describe_machine(),
        "device": model.device_name,
        "rows": rows,
    }


def write_drafting(result: dict, out_dir: str | os.PathLike, name: str = "drafting") -> list[Path]:
    """<name>.json, <name>.md and <name>_decode.png in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = result["plan"]
    lines = [
        "# Speculative decoding: decode speed with and without a draft",
        "",
        f"Machine: {machine_line(result['machine'])}; device {result['device']}.",
        f"Model: {plan['model']}; draft with full prefill: {plan['draft']}; SpecPrefill speculator (the draft "
        f"after SpecPrefill): {plan['speculator']}, keep {plan['specprefill']['keep_ratio']}; prompt "
        f"{plan['prompt_tokens']} tokens ({plan.get('prompt_file') or 'the evaluation text'}), "
        f"{plan['decode_tokens']} new tokens, greedy.",
        "",
        "| prefill | k | TTFT (s) | decode tok/s | vs plain | end-to-end (s) | vs plain | accepted / drafted | "
        "same text |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['method']} | {r['k']} | {r['ttft_s']:.2f} | {r['decode_tps']:.2f} | {r['decode_vs_plain']:.2f}x "
            f"| {r['total_s']:.1f} | {r['total_vs_plain']:.2f}x | {r['accepted']}/{r['drafted']} | {r['identical']} |"
        )
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}_decode.png"]
    for path, text in ((paths[0], json.dumps(result, indent=1) + "\n"), (paths[1], "\n".join(lines) + "\n")):
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        os.replace(partial, path)
    title = (
        f"Decode tok/s vs draft tokens k: {plan['model']}, {plan['dtype'] or 'default dtype'}, "
        f"{result['device']}, {result['machine'].get('torch_threads', '?')} threads"
    )
    plot_decode_speed(result["rows"], paths[2], title)
    return paths
