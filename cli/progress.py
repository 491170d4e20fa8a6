"""A tqdm progress bar on stderr for long prefills (shown only when the prefill is long)."""
from __future__ import annotations

import sys

from tqdm import tqdm

MIN_TOKENS_FOR_BAR = 1024


class PrefillProgressBar:
    """Pass `update` as prompt_progress_callback; `close` after the first token."""

    def __init__(self, desc: str = "prefill") -> None:
        self.desc = desc
        self.bar: tqdm | None = None

    def update(self, processed: int, total: int) -> None:
        if self.bar is None:
            if total < MIN_TOKENS_FOR_BAR:
                return
            self.bar = tqdm(total=total, desc=self.desc, unit="tok", file=sys.stderr, leave=False)
        self.bar.update(processed - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
