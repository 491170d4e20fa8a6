"""How many tokens to draft each round: adapted to the running acceptance and to the step costs
measured during the run, so that drafting is never expected to be slower than plain decoding.

Model of a round with k drafts: each draft is accepted with probability a (the running
acceptance, drafts accepted / drafts judged, older rounds weighing less), so a round yields
E(k) = 1 + a + ... + a^k tokens (the main model's own token included) and costs k draft steps
plus one main-model pass over k + 1 tokens:

    rate(k) = E(k) / (k * draft_step + verify(k + 1)),   rate(0) = 1 / verify(1)

verify(1) is a plain decoding step. Each round takes the k in 0 .. min(max_k, last k + 1) with
the highest rate: k shrinks when acceptance falls, grows by one per round while the gain holds, and
is 0 (plain decoding) where even full acceptance could not pay ((k + 1) tokens cost more than k + 1
plain steps: the cost rule). The first round is a plain step (it measures verify(1)), the second
drafts max_k; a length seeded with costs kept from earlier decodes (draft_costs.py) chooses by the
rule from its first round, so a pair whose kept costs say drafting does not pay stops at once.
After a plain round chosen by the rule, drafting is tried again (k = 1) after PROBE_AFTER plain
rounds, the wait doubling each time the try does not pay.

Step costs are the least of the last few measured wall times (a shared machine only adds time); verify(T) for a
T not yet measured is
read off the line through the plain step and the largest T measured. With a sampling seed the
measured times are not used (the tokens would depend on timing): the costs stay at the priors below
and k follows the acceptance alone, so a seeded run repeats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ACCEPTANCE_MEMORY = 0.7  # per round: the weight left to earlier rounds in the acceptance estimate
COST_SAMPLES = 4  # a step cost is the least of its last 4 measurements (other jobs only add time)
PRIOR_ACCEPTANCE = (1.5, 2.0)  # (accepted, judged) before any round: acceptance 0.75 with weight 2
PRIOR_DRAFT_STEP = 0.3  # a draft step's cost in plain steps, before any is measured (or with a seed)
PROBE_AFTER = 4  # plain rounds chosen by the rule before drafting is tried again (doubles per failed try)


@dataclass
class DraftLength:
    """Chooses k for each round (`next`) and learns from each round (`record`).

    max_k: Drafting.num_tokens, the largest k (and the first drafting round's). adaptive False:
    always max_k (the fixed schedule). timed False: ignore measured times (a seeded run).
    trajectory: the k of every round, for reports.
    """

    max_k: int
    adaptive: bool = True
    timed: bool = True
    trajectory: list[int] = field(default_factory=list)
    accepted: float = PRIOR_ACCEPTANCE[0]
    judged: float = PRIOR_ACCEPTANCE[1]
    draft_step: float | None = None
    verify: dict[int, float] = field(default_factory=dict)  # tokens in a verify pass -> seconds
    samples: dict[int, list[float]] = field(default_factory=dict)  # the measurements behind draft_step (0), verify
    plain_rounds: int = 0  # plain rounds chosen by the rule since the last drafting round
    probe_after: int = PROBE_AFTER

    @property
    def acceptance(self) -> float:
        """The running probability that a draft is accepted."""
        return self.accepted / self.judged

    def next(self, room: int) -> int:
        """k for this round; room: tokens still to produce after this round's main-model token."""
        k = self._choose()
        k = max(0, min(k, room))
        self.trajectory.append(k)
        return k

    def _choose(self) -> int:
        if not self.adaptive:
            return self.max_k
        if not self.trajectory and 1 not in self.verify:
            return 0  # a plain step first: it measures verify(1)
        if self.draft_step is None:
            return self.max_k  # a draft step not measured yet (nor kept: draft_costs.CostBook.seed)
        last = self.trajectory[-1] if self.trajectory else self.max_k
        best = max(range(min(self.max_k, last + 1) + 1), key=self.rate)
        if best == 0 and last == 0 and self.plain_rounds >= self.probe_after:
            self.probe_after *= 2  # try one draft again; each try that ends in plain again waits longer
            return 1
        return best

    def rate(self, k: int) -> float:
        """Predicted tokens per second of a round drafting k tokens."""
        a = self.acceptance
        tokens = k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
        return tokens / (k * self._draft_step() + self._verify(k + 1))

    def _draft_step(self) -> float:
        if self.draft_step is None or not self.timed:
            return PRIOR_DRAFT_STEP * self._verify(1)
        return self.draft_step

    def _verify(self, tokens: int) -> float:
        """Seconds of a main-model pass over `tokens` tokens: measured, or on the line through the
        plain step and the largest measured count (1.0 before anything is measured, or with a seed)."""
        if not self.timed or 1 not in self.verify:
            return 1.0
        if tokens in self.verify:
            return self.verify[tokens]
        below = [t for t in self.verify if t < tokens]
        above = [t for t in self.verify if t > tokens]
        low = max(below)
        high = min(above) if above else max(self.verify)
        if high == low:
            return self.verify[low]
        slope = (self.verify[high] - self.verify[low]) / (high - low)
        return self.verify[low] + slope * (tokens - low)

    def record(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """What a round of k drafts did: `accepted` of them kept, its drafting and verify times."""
        self.verify[k + 1] = self._measured(k + 1, verify_seconds)
        if k == 0:
            self.plain_rounds += 1
            return
        self.plain_rounds = 0
        self.draft_step = self._measured(0, draft_seconds / k)
        self.accepted = ACCEPTANCE_MEMORY * self.accepted + accepted
        self.judged = ACCEPTANCE_MEMORY * self.judged + accepted + (1 if accepted < k else 0)
        if self.rate(k) >= self.rate(0):
            self.probe_after = PROBE_AFTER  # drafting pays again: a later stop waits the short time

    def _measured(self, key: int, seconds: float) -> float:
        """The cost of `key` (0: a draft step, T: a verify pass over T tokens) after a new measurement:
        the least of the recent ones, so a step slowed by another job does not stop drafting."""
        recent = self.samples.setdefault(key, [])
        recent.append(seconds)
        del recent[:-COST_SAMPLES]
        return min(recent)
