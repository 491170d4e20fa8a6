"""Drafting with a separate draft model, decided before its prompt prefill from costs measured here.

A draft model must read the whole prompt before it drafts a token (`drafting.prepare_draft`); the
adaptive draft length (draft_length.py) stops drafting once the measured step costs say it cannot
pay, but by then that prefill is spent: on a CPU where a 0.5B draft step costs half a 1.5B step
(fp32, AVX2), a 64-token reply ran at 0.82x of plain decoding although only 13% of its rounds drafted.

So the costs a drafted decode measured are kept per machine, like `auto`'s crossover
(core/crossover.py: same directory, same machine description, never a file measured elsewhere),
under a key of the CPU, backend, device, dtype, threads and both models' shapes:
    plain_step (s, one main-model decode step), draft_step (s), verify {T: s} (a main pass over T
    tokens), prefill_per_token (s per prompt token of the draft model's prefill), acceptance (its
    runs' accepted / drafted, the latest weighing half).
The book also keeps the lengths of the pair's last REPLY_MEMORY replies (tokens, and whether a stop
ended them), skipped decodes included: a reply that ends early must not pay a prefill it cannot earn
back. The next decode with that pair first predicts, with draft_length's round model at that acceptance,
    drafted = prefill_per_token * prompt_tokens + (n - 1) / max_k rate(k)
    plain   = (n - 1) * plain_step
for the expected reply length n = mean over the kept replies of min(max_tokens, tokens) for one a stop
ended and max_tokens for one cut at its limit (it showed no early end); max_tokens when none is kept.
Both sides are linear in n, so comparing them at the mean compares the expected times. It decodes
plainly, without the draft's prefill, when drafted >= plain (info.decode.skipped says why).
Where it drafts, the kept costs are the draft length's first measurements (`seed`), so one slow
first verify of a shape does not price longer drafts out for a whole decode. Only an adaptive run
skips (a fixed schedule drafts as asked); a seeded sampling run never reads the clock, so it has
no book; every other run updates it, `Drafting(adaptive=False)` included.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from ..crossover import calibration_key, calibration_path, write_calibration
from ..models import ModelArgs
from .draft_length import DraftLength

ACCEPTANCE_WEIGHT = 2.0  # judged drafts the remembered acceptance counts for in the prediction
COSTS = ("plain_step", "draft_step", "prefill_per_token", "acceptance")
REPLY_MEMORY = 8  # replies whose lengths the expected reply length is taken over


def cost_key(
    *, backend: str, device: str, dtype: str, threads: int, main: ModelArgs, draft: ModelArgs
) -> dict[str, Any]:
    """Everything the step costs depend on: crossover.calibration_key with method "drafting" and
    the draft model's shape as the method's configuration."""
    key = calibration_key(
        backend=backend,
        device=device,
        dtype=dtype,
        threads=threads,
        model_shape=asdict(main),
        method="drafting",
        method_config={"draft_shape": asdict(draft)},
    )
    return json.loads(json.dumps(key))  # as it reads back from the file (tuples become lists)


def fill(length: DraftLength, costs: dict[str, Any]) -> None:
    """Kept costs as `length`'s measurements: each the one sample of its kind so far."""
    for tokens, seconds in {**costs["verify"], 1: costs["plain_step"]}.items():
        length.samples[tokens], length.verify[tokens] = [seconds], seconds
    length.samples[0], length.draft_step = [costs["draft_step"]], costs["draft_step"]


@dataclass(frozen=True)
class CostBook:
    """The remembered costs of one (machine, main model, draft model) pair; max_k: Drafting.num_tokens."""

    key: dict[str, Any]
    max_k: int

    def read(self) -> dict[str, Any] | None:
        """The costs measured here before, or None (none yet, unreadable, or another machine's)."""
        try:
            data = json.loads(calibration_path(self.key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        costs = data.get("costs") if isinstance(data, dict) and data.get("key") == self.key else None
        if not isinstance(costs, dict) or not isinstance(costs.get("verify"), dict):
            return None
        if (
            not all(type(costs.get(name)) in (int, float) and 0 <= costs[name] < math.inf for name in COSTS)
            or costs["plain_step"] <= 0
        ):
            return None
        try:
            costs["verify"] = {int(t): float(s) for t, s in costs["verify"].items() if 0 < float(s) < math.inf}
            costs["replies"] = [(int(t), bool(stop)) for t, stop in costs.get("replies", []) if int(t) > 0]
        except (TypeError, ValueError):
            return None
        return costs

    def expected_tokens(self, max_tokens: int, costs: dict[str, Any] | None = None) -> float:
        """The reply length to expect for a request of max_tokens: the kept replies' mean of
        min(max_tokens, tokens) (one a stop ended) or max_tokens (one cut at its limit)."""
        replies = (costs if costs is not None else self.read() or {}).get("replies") or []
        if not replies:
            return float(max_tokens)
        return sum(min(max_tokens, t) if stop else max_tokens for t, stop in replies) / len(replies)

    def skip_reason(self, prompt_tokens: int, new_tokens: int) -> str:
        """Why drafting would not pay for this decode ("" when it would, or when nothing is known)."""
        costs = self.read()
        if costs is None or new_tokens < 2:
            return ""
        length = DraftLength(self.max_k)
        fill(length, costs)
        length.accepted, length.judged = costs["acceptance"] * ACCEPTANCE_WEIGHT, ACCEPTANCE_WEIGHT
        best = max(length.rate(k) for k in range(1, self.max_k + 1))
        expected = self.expected_tokens(new_tokens, costs)
        drafted = costs["prefill_per_token"] * prompt_tokens + max(expected - 1, 0.0) / best
        plain = max(expected - 1, 0.0) * costs["plain_step"]
        if drafted < plain:
            return ""
        return (
            f"drafting skipped: the step costs measured on this machine (draft step {costs['draft_step']:.3g} s, "
            f"plain step {costs['plain_step']:.3g} s, acceptance {costs['acceptance']:.2f}) predict, for the "
            f"{expected:.0f} tokens expected, {drafted:.1f} s with the draft model's prompt prefill against "
            f"{plain:.1f} s plain"
        )

    def note_reply(self, tokens: int, stopped: bool) -> None:
        """Keep the length of a reply decoded plainly because drafting was skipped (its costs stay)."""
        costs = self.read()
        if costs is not None:
            costs["replies"] = (costs["replies"] + [(tokens, stopped)])[-REPLY_MEMORY:]
            self._write(costs)

    def noting_reply(self, tokens: Iterator[int], max_tokens: int, stop_ids: frozenset[int]) -> Iterator[int]:
        """`tokens` of a decode that skipped drafting, its reply's length noted before the last one
        is yielded (a reader stops at it) or when closed early (a stop string: an early end)."""
        produced = 0
        for token in tokens:
            produced += 1
            if token in stop_ids or produced == max_tokens:
                self.note_reply(produced, token in stop_ids)
                yield token
                return
            try:
                yield token
            except GeneratorExit:
                self.note_reply(produced, True)
                raise

    def _write(self, costs: dict[str, Any]) -> None:
        costs = {**costs, "verify": {str(t): round(s, 6) for t, s in sorted(costs["verify"].items())}}
        costs["replies"] = [[t, int(stop)] for t, stop in costs["replies"]]
        write_calibration(self.key, {"key": self.key, "costs": costs})

    def seed(self, length: DraftLength) -> None:
        """Start `length` from the kept step costs as its first measurements (a round's own times
        join them, the least of the last few counting), so that one slow first pass of a shape does
        not price longer drafts out for the whole decode. The acceptance starts at its prior."""
        costs = self.read()
        if costs is not None:
            fill(length, costs)

    def remember(
        self,
        length: DraftLength,
        prefill_seconds: float,
        prompt_tokens: int,
        drafted: int,
        accepted: int,
        reply: tuple[int, bool] | None = None,
    ) -> None:
        """Keep what a timed decode measured (costs it did not measure stay as they were); reply:
        its length in tokens and whether a stop (not max_tokens) ended it."""
        old = self.read() or {}
        plain_step = length.verify.get(1, old.get("plain_step"))
        draft_step = length.draft_step if length.draft_step is not None else old.get("draft_step")
        if plain_step is None or draft_step is None:
            return  # a plain step and a draft step are the least a prediction needs
        acceptance = accepted / drafted if drafted else old.get("acceptance", 0.0)
        if drafted and "acceptance" in old:
            acceptance = 0.5 * old["acceptance"] + 0.5 * acceptance
        verify = {**old.get("verify", {}), **{t: s for t, s in length.verify.items() if t > 1}}
        replies = old.get("replies", []) + ([reply] if reply is not None else [])
        costs = {
            "plain_step": plain_step,
            "draft_step": draft_step,
            "verify": verify,
            "prefill_per_token": prefill_seconds / max(prompt_tokens, 1),
            "acceptance": round(acceptance, 4),
            "replies": replies[-REPLY_MEMORY:],
        }
        self._write(costs)
