"""tqdm progress bars on stderr: long prefills (shown only when the prefill is long), and the
units of work of bench / eval runs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable

from tqdm import tqdm

if TYPE_CHECKING:
    from specfill.core.runtime import GenerationInfo

MIN_TOKENS_FOR_BAR = 1024


class PrefillProgressBar:
    """Pass `update` as prompt_progress_callback (and the GenerationInfo given as prefill_info as
    `info`); `close` after the first token, before printing it: the bar's line is cleared, so the
    answer starts on a line of its own.

    With `info` the bar covers the whole time to first token: it shows info.prefill_done (every
    prefill stage weighted by its expected work: SpecPrefill's speculator pass, look-ahead, scoring
    and main prefill, core/methods/prefill.py StageProgress) on the prompt's scale, the running stage
    as its label; without, the prompt tokens read."""

    def __init__(self, desc: str = "prefill", info: GenerationInfo | None = None) -> None:
        self.desc = desc
        self.info = info
        self.bar: tqdm | None = None

    def update(self, processed: int, total: int) -> None:
        if self.bar is None:
            if total < MIN_TOKENS_FOR_BAR:
                return
            self.bar = tqdm(total=total, desc=self.desc, unit="tok", file=sys.stderr, leave=False)
        if self.info is not None and self.info.step is not None:
            processed = round(total * self.info.prefill_done)
            stage = self.info.step.stage
            self.bar.set_description_str(self.desc if stage == "prefill" else f"{self.desc}: {stage}", refresh=False)
        self.bar.update(max(0, processed - self.bar.n))

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


def run_written(
    desc: str, run: Callable[[WorkProgressBar, Callable[[dict], Any]], dict], write: Callable[[dict], list]
) -> int:
    """A long run under a WorkProgressBar (run(bar, save): `save` writes a partial result, marked so,
    after each finished unit), then its final result written by `write` and the files printed."""
    with WorkProgressBar(desc) as bar:
        result = run(bar, write)
    for path in write(result):
        print(path)
    return 0
