"""tqdm progress bars on stderr: long prefills (shown only when the prefill is long), and the
units of work of bench / eval runs."""

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


class WorkProgressBar:
    """`step(total, label)` after each unit of work; `log` prints a line above the bar."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.bar: tqdm | None = None

    def step(self, total: int, label: str) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.desc, unit="run", file=sys.stderr, leave=False)
        self.bar.set_postfix_str(label, refresh=False)
        self.bar.update(1)

    def log(self, line: str) -> None:
        tqdm.write(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "WorkProgressBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
