"""A reply's text from its tokens, as vLLM (`skip_special_tokens`, on by default) and llama.cpp's server
write it: a control token the model writes (a turn's opening such as <|im_start|>, a role header, a
fill-in-the-middle marker) leaves no text, except the markers the reply is read back by, llama.cpp's
"preserved tokens": the texts of the chat template's tool-call format (tool_parsers.ToolFormat.texts)
and the reasoning tags. gpt-oss's harmony replies keep every control token: their channels are the
reply's structure, which the server hands on as text. The end-of-generation ids write no text either
way. A request's `skip_special_tokens: false` (vLLM's field) keeps every other control token. A stop
string is still looked for in a hidden token's own text (engine.StopMatcher.word).
"""

from __future__ import annotations

from typing import Any

from .reasoning import TAGS
from .tool_parsers import detect_format


def hidden_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids that write no text in a reply: the end ids, and the control tokens that are not a marker
    of the tokenizer's chat template's tool-call format or a reasoning tag (none in a harmony reply)."""
    ends = frozenset(tokenizer.eos_token_ids)
    fmt = detect_format(tokenizer.chat_template)
    if fmt is not None and fmt.messages:
        return ends
    read = (*(tag for pair in TAGS for tag in pair), *(fmt.texts if fmt is not None else ()))
    hidden = set(ends)
    for token in tokenizer.special_token_ids:
        text = tokenizer.token_text(token)
        if text is not None and not any(text in marker for marker in read):
            hidden.add(token)
    return frozenset(hidden)
