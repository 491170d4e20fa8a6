"""Cross-backend parity: the same weights and prompt on two backends, compared stage by stage."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specfill.api import open as open_session
from specfill.api import prefill_method
from specfill.core import H2OConfig, SpecPrefillConfig
from specfill.core.runtime import GenerationInfo

from .machine import describe_machine, machine_line
from .texts import tokens_of_length


@dataclass(frozen=True)
class ParityPlan:
    backends: tuple[str, str] = ("mlx", "cuda")
    model: str | None = None
    prompt_tokens: int = 512
    h2o: H2OConfig = field(default_factory=lambda: H2OConfig(chunk_size=128, batch_size=256, local=32, heavy=32))
    specprefill: SpecPrefillConfig = field(default_factory=lambda: SpecPrefillConfig(keep_ratio=0.3))
    speculator: str = "self:8"
    generate_tokens: int = 24
    dtype: str = "float32"
    num_draft_tokens: int = 3  # the drafted run: SpecPrefill's speculator as the draft


def jaccard(a, b) -> float:
    sa, sb = set(np.asarray(a).ravel().tolist()), set(np.asarray(b).ravel().tolist())
    return len(sa & sb) / max(1, len(sa | sb))


def compare_logits(a: np.ndarray, b: np.ndarray) -> dict:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return {"max_abs_diff": float(np.abs(a - b).max()), "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean())}


def compare_memory_sets(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> list[dict]:
    """Per layer: mean Jaccard over (chunk, KV head) memory sets, and what differs."""
    layers = []
    for layer, (sets_a, sets_b) in enumerate(zip(a, b)):
        pairs = [(ra, rb) for ma, mb in zip(sets_a, sets_b) for ra, rb in zip(np.asarray(ma), np.asarray(mb))]
        differing = [
            (c, h, sorted(set(ra.tolist()) ^ set(rb.tolist()))[:6])
            for c, (ma, mb) in enumerate(zip(sets_a, sets_b))
            for h, (ra, rb) in enumerate(zip(np.asarray(ma), np.asarray(mb)))
            if not np.array_equal(ra, rb)
        ]
        layers.append(
            {
                "layer": layer,
                "jaccard": float(np.mean([jaccard(x, y) for x, y in pairs])) if pairs else 1.0,
                "identical": not differing and len(sets_a) == len(sets_b),
                "differing": differing[:8],
            }
        )
    return layers


def run_parity(plan: ParityPlan) -> dict:
    runs = {}
    for backend in plan.backends:
        session = open_session(plan.model, backend=backend, dtype=plan.dtype, speculator=plan.speculator)
        model = session.model
        ids = tokens_of_length(session.tokenizer, plan.prompt_tokens)
        full, h2o = prefill_method("full"), prefill_method("h2o", h2o=plan.h2o)
        spec = prefill_method("specprefill", specprefill=plan.specprefill, speculator=session.speculator)
        h2o_info, spec_info = GenerationInfo(record_memory=True), GenerationInfo()
        runs[backend] = {
            "device": model.device_name,
            "full_logits": np.asarray(model.prompt_logits(ids, method=full, info=GenerationInfo())),
            "h2o_logits": np.asarray(model.prompt_logits(ids, method=h2o, info=h2o_info)),
            "memory_sets": h2o_info.memory_sets or [],
            "text": "".join(r.text for r in session.stream(ids, max_tokens=plan.generate_tokens)),
        }
        drafted = list(
            session.stream(
                ids,
                max_tokens=plan.generate_tokens,
                method=spec,
                prefill_info=spec_info,
                num_draft_tokens=plan.num_draft_tokens,
            )
        )
        runs[backend]["drafted_text"] = "".join(r.text for r in drafted)
        runs[backend]["accepted"] = [drafted[-1].accepted_tokens, drafted[-1].drafted_tokens]
        runs[backend]["kept"] = list(spec_info.kept_positions or [])
        del model, session
    a, b = (runs[name] for name in plan.backends)
    kept_a, kept_b = set(a["kept"]), set(b["kept"])
    return {
        "plan": {
            **{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(plan).items()},
            "h2o": vars(plan.h2o),
            "specprefill": asdict(plan.specprefill),
            "model": plan.model or "demo (SmolLM2-135M-Instruct Q4_1)",
        },
        "machine": describe_machine(),
        "devices": {name: runs[name]["device"] for name in plan.backends},
        "full_logits": compare_logits(a["full_logits"], b["full_logits"]),
        "h2o_logits": compare_logits(a["h2o_logits"], b["h2o_logits"]),
        "h2o_memory_sets": compare_memory_sets(a["memory_sets"], b["memory_sets"]),
        "specprefill_kept": {
            "jaccard": jaccard(a["kept"], b["kept"]),
            "count": [len(kept_a), len(kept_b)],
            "only_" + plan.backends[0]: sorted(kept_a - kept_b)[:32],
            "only_" + plan.backends[1]: sorted(kept_b - kept_a)[:32],
        },
        "text": {plan.backends[0]: a["text"], plan.backends[1]: b["text"], "identical": a["text"] == b["text"]},
        "drafted_text": {
            plan.backends[0]: a["drafted_text"],
            plan.backends[1]: b["drafted_text"],
            "identical": a["drafted_text"] == b["drafted_text"],
            "accepted_of_drafted": {name: runs[name]["accepted"] for name in plan.backends},
        },
    }


def write_parity(result: dict, out_dir: str | os.PathLike, name: str = "parity") -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = result["plan"]["backends"]
    memory = result["h2o_memory_sets"]
    devices = result["devices"]
    lines = [
        f"# Parity: {names[0]} vs {names[1]}",
        "",
        f"Machine: {machine_line(result['machine'])}.",
        f"Devices: {names[0]} on {devices[names[0]]}, {names[1]} on {devices[names[1]]} "
        "(the cuda backend is the torch backend; without a GPU it runs on the CPU).",
        f"Model: {result['plan']['model']}, {result['plan']['dtype']}, prompt {result['plan']['prompt_tokens']} "
        f"tokens; H2O S={result['plan']['h2o']['chunk_size']} L={result['plan']['h2o']['local']} "
        f"H={result['plan']['h2o']['heavy']}; SpecPrefill {result['plan']['speculator']} keep "
        f"{result['plan']['specprefill']['keep_ratio']}.",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| full logits max abs diff | {result['full_logits']['max_abs_diff']:.3g} |",
        f"| full logits top-1 agreement | {100 * result['full_logits']['top1_agreement']:.2f}% |",
        f"| H2O logits max abs diff | {result['h2o_logits']['max_abs_diff']:.3g} |",
        f"| H2O logits top-1 agreement | {100 * result['h2o_logits']['top1_agreement']:.2f}% |",
        f"| H2O memory sets identical (layers) | {sum(m['identical'] for m in memory)}/{len(memory)} |",
        f"| H2O memory-set Jaccard (min over layers) | {min((m['jaccard'] for m in memory), default=1.0):.4f} |",
        f"| SpecPrefill kept-token Jaccard | {result['specprefill_kept']['jaccard']:.4f} |",
        f"| generated text identical | {result['text']['identical']} |",
        f"| SpecPrefill + drafting (k={result['plan']['num_draft_tokens']}) text identical | "
        f"{result['drafted_text']['identical']} |",
    ]
    differing = [m for m in memory if not m["identical"]]
    if differing:
        lines += ["", "Layers whose memory sets differ (chunk, KV head, differing positions):", ""]
        lines += [f"- layer {m['layer']}: Jaccard {m['jaccard']:.4f}; {m['differing']}" for m in differing]
    lines += ["", "Generated text:", ""] + [f"- {n}: {result['text'][n]!r}" for n in names]
    accepted = result["drafted_text"]["accepted_of_drafted"]
    lines += ["", "SpecPrefill then speculative decoding with the speculator as draft (accepted / drafted):", ""]
    lines += [f"- {n} ({accepted[n][0]}/{accepted[n][1]}): {result['drafted_text'][n]!r}" for n in names]
    paths = [out / f"{name}.json", out / f"{name}.md"]
    for path, text in ((paths[0], json.dumps(result, indent=1) + "\n"), (paths[1], "\n".join(lines) + "\n")):
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        os.replace(partial, path)
    return paths
