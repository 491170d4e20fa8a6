"""A reply's reasoning read apart from its answer, as llama.cpp's server (`reasoning_content`) and vLLM's
reasoning parsers do: the text between the thinking tags the chat template teaches (`<think>` ...
`</think>`: Qwen3 / 3.5 / 3.6, DeepSeek-R1, GLM 4.5+, MiniMax M2, Kimi K2 Thinking; `[THINK]` ...
`[/THINK]`: Magistral) becomes Thought pieces, the rest is the reply's content, read for tool calls
as before. A reply is reasoning from its start when the prompt ends inside an open tag (a template
whose generation prompt writes `<think>\\n`), or when its first text is the opening tag; reasoning
ends at the closing tag. Tags later in the answer are content, as in llama.cpp. White space around
the reasoning and before the answer is dropped. A request's `reasoning_format: "none"` (llama.cpp's
field) leaves the reasoning in the content, tags and all.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tool_calls import held

TAGS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))


@dataclass(frozen=True)
class Thought:
    """Reasoning text, as it streams."""

    text: str


@dataclass(frozen=True)
class Reasoning:
    """How a reply's reasoning is marked (open, close), and whether the prompt left it open."""

    open: str
    close: str
    started: bool = False

    def after(self, prompt: str) -> Reasoning:
        """This for a reply that follows `prompt` (the rendered chat prompt, without a forced start)."""
        return Reasoning(self.open, self.close, prompt.rfind(self.open) > prompt.rfind(self.close))

    def closing(self, prompt: str) -> str:
        """What closes the reasoning `prompt` left open with none written, as a template with thinking
        off writes it (Qwen3's `<think>\n\n</think>\n\n`)."""
        return ("\n" if prompt.endswith("\n") else "") + self.close + "\n\n"


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's reasoning_effort
# gpt-oss's template says "Reasoning: low / medium / high": the other efforts as the nearest of those
HARMONY_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def effort_variables(template: str | None, effort: str | None) -> dict[str, object]:
    """The chat template's variables for a client's reasoning effort (chat's reasoning_effort; the
    Anthropic and Responses routes translate theirs into it), where the template reads them: Qwen3's
    enable_thinking (off for "none"), gpt-oss's reasoning_effort. None: the template's own default."""
    if effort is None or not template:
        return {}
    out: dict[str, object] = {}
    if "enable_thinking" in template:
        out["enable_thinking"] = effort != "none"
    if "reasoning_effort" in template and effort != "none":
        out["reasoning_effort"] = HARMONY_EFFORT[effort]
    return out


def detect_reasoning(template: str | None) -> Reasoning | None:
    """The thinking tags a chat template writes (its closing tag is the sign), or None."""
    return next((Reasoning(o, c) for o, c in TAGS if template and c in template), None)


class ReasoningSplitter:
    """Thought pieces and content text (str) from a reply fed in pieces."""

    def __init__(self, reasoning: Reasoning):
        self.tags = reasoning
        self.mode = "thought" if reasoning.started else "start"  # start, thought, answer (white space), content
        self.buffer = ""
        self.thought = False  # whether reasoning text was handed out (white space before it is dropped)

    def feed(self, text: str) -> list[Thought | str]:
        self.buffer += text
        out: list[Thought | str] = []
        while self._step(out):
            pass
        return out

    @property
    def inside(self) -> bool:
        """Whether the reply is inside its reasoning now."""
        return self.mode == "thought"

    def finish(self) -> list[Thought | str]:
        out: list[Thought | str] = []
        text, self.buffer = self.buffer, ""
        if self.mode == "thought":  # cut short (max_tokens, a stop string): what it thought so far
            self._think(text.rstrip(), out)
        elif self.mode in ("start", "content") and text:
            out.append(text)
        self.mode = "content"
        return out

    def _think(self, text: str, out: list[Thought | str]) -> None:
        text = text if self.thought else text.lstrip()
        if text:
            out.append(Thought(text))
            self.thought = True

    def _step(self, out: list[Thought | str]) -> bool:
        """Read what can be read; True when the mode changed and there is more to look at."""
        text = self.buffer
        if self.mode == "content":
            if text:
                out.append(text)
            self.buffer = ""
            return False
        if self.mode == "start":
            head = text.lstrip()
            if head.startswith(self.tags.open):
                self.buffer, self.mode = head[len(self.tags.open) :].lstrip(), "thought"
                return True
            if self.tags.open.startswith(head):  # white space, or the tag's start: not known yet
                return False
            self.mode = "content"
            return True
        if self.mode == "answer":
            self.buffer = text.lstrip()
            if self.buffer:
                self.mode = "content"
            return bool(self.buffer)
        at = text.find(self.tags.close)  # thought
        if at >= 0:
            self._think(text[:at].rstrip(), out)
            self.buffer, self.mode = text[at + len(self.tags.close) :], "answer"
            return True
        # held back: the closing tag's start, and the white space before it (it may end the reasoning)
        cut = len(text[: len(text) - held(text, self.tags.close)].rstrip())
        self._think(text[:cut], out)
        self.buffer = text[cut:]
        return False
