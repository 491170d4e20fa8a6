"""The soak's requests (evaluation/soak.py): valid ones on every generation route, each named so that a
quiet run can record its greedy answer first, and a corpus of hostile bodies with what each must get.

A Case is one request body for one route. Valid cases are greedy (temperature 0): under load each
must answer the same text as in the quiet run. Hostile cases carry an expectation: "4xx" (the server
must refuse it), or "any" (it may answer or refuse it, as long as it is not a 5xx: a NUL character
inside a string, a float temperature of 1e308, a 2 MB body of spaces around a valid request).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
ROUTES = (CHAT, COMPLETIONS, MESSAGES, RESPONSES)
ROUTE_NAMES = {CHAT: "chat", COMPLETIONS: "completions", MESSAGES: "messages", RESPONSES: "responses"}

# A Qwen2.5-style ChatML template that renders tools (Hermes <tool_call> format): the demo model
# (SmolLM2, which speaks ChatML) is served with it so that its tool requests run (its own template
# renders no tools); the serve tests' rote tool model uses it too (tests/fixtures/tool_model.py).
CHATML_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class Case:
    """One request: a route and its body (a dict sent as JSON, or raw bytes)."""

    name: str
    route: str
    data: dict[str, Any] | None = None
    raw: bytes | None = None
    expect: str = "2xx"  # "2xx" (a valid request), "4xx" (must be refused), "any" (anything but a 5xx)
    long: bool = False  # a prompt of several prefill steps
    content_length: int | None = None  # a Content-Length larger than the body: the client hangs up mid-body
    tags: tuple[str, ...] = field(default=())

    @property
    def stream(self) -> bool:
        return bool(self.data and self.data.get("stream") is True)

    def body(self) -> bytes:
        return self.raw if self.raw is not None else json.dumps(self.data).encode()

    def with_fields(self, suffix: str, **fields: Any) -> Case:
        """The same request with some fields set (a stream, another max_tokens, sampling), renamed."""
        assert self.data is not None
        return replace(self, name=f"{self.name}/{suffix}", data={**self.data, **fields})


def _function(name: str, description: str, **properties: str) -> dict[str, Any]:
    props = {k: {"type": "string", "description": v} for k, v in properties.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }


TOOLS = [
    _function("get_weather", "The current weather in a city", city="the city's name"),
    _function("read_file", "Read a file of the repository", path="the file's path"),
]
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
WEATHER = "What is the weather in Paris right now?"
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def _chat(*turns: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in turns]


def valid_cases(max_tokens: int, medium: str, long: str, responses: bool) -> list[Case]:
    """Greedy requests on every route, each whole and streamed: plain text, a conversation, tool calls
    (auto, required, named, a tool result), JSON output, H2O and SpecPrefill on a medium prompt (prompt
    cache off: a sparse prefill differs from the dense one a cached conversation is rebuilt to), and
    one long prompt (whole only: it costs seconds). medium / long: texts of a few hundred and about a
    thousand tokens."""
    greedy = {"max_tokens": max_tokens, "temperature": 0}
    colours = _chat(("user", "Name three colours."))
    talk = _chat(
        ("system", "You are a terse assistant."),
        ("user", "What is the capital of France?"),
        ("assistant", "Paris."),
        ("user", "And of Italy?"),
    )
    weather = _chat(("user", WEATHER))
    result = [
        *weather,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees."},
    ]
    cases = [
        Case("chat/colours", CHAT, {"messages": colours, **greedy}),
        Case("chat/conversation", CHAT, {"messages": talk, **greedy}),
        Case("chat/tools-auto", CHAT, {"messages": weather, "tools": TOOLS, **greedy}, tags=("tools",)),
        Case(
            "chat/tools-required",
            CHAT,
            {"messages": weather, "tools": TOOLS, "tool_choice": "required", **greedy},
            tags=("tools",),
        ),
        Case(
            "chat/tools-named",
            CHAT,
            {
                "messages": weather,
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                **greedy,
            },
            tags=("tools",),
        ),
        Case("chat/tool-result", CHAT, {"messages": result, "tools": TOOLS, **greedy}, tags=("tools",)),
        Case("chat/json", CHAT, {"messages": colours, "response_format": {"type": "json_object"}, **greedy}),
        Case(
            "chat/h2o",
            CHAT,
            {
                "messages": _chat(("user", medium + "\n\nWhat is this text about?")),
                "method": "h2o",
                "prompt_cache": "off",
                **greedy,
            },
        ),
        Case("completions/story", COMPLETIONS, {"prompt": "Once upon a time", **greedy}),
        Case("completions/count", COMPLETIONS, {"prompt": "1, 2, 3, 4,", "stop": ["10"], **greedy}),
        Case(
            "completions/specprefill",
            COMPLETIONS,
            {"prompt": medium + "\n\nIn short,", "method": "specprefill", "prompt_cache": "off", **greedy},
        ),
        Case("messages/colours", MESSAGES, {"messages": colours, **greedy}),
        Case(
            "messages/conversation",
            MESSAGES,
            {"system": talk[0]["content"], "messages": talk[1:], **greedy},
        ),
        Case(
            "messages/tools",
            MESSAGES,
            {"messages": weather, "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}, **greedy},
            tags=("tools",),
        ),
        Case(
            "messages/tool-result",
            MESSAGES,
            {
                "messages": [
                    *weather,
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 degrees."}],
                    },
                ],
                "tools": ANTHROPIC_TOOLS,
                **greedy,
            },
            tags=("tools",),
        ),
    ]
    if responses:
        reply = {"max_output_tokens": max_tokens, "temperature": 0}
        cases += [
            Case("responses/colours", RESPONSES, {"input": "Name three colours.", **reply}),
            Case(
                "responses/conversation",
                RESPONSES,
                {"instructions": talk[0]["content"], "input": talk[1:], **reply},
            ),
            Case(
                "responses/tools",
                RESPONSES,
                {"input": WEATHER, "tools": RESPONSES_TOOLS, "tool_choice": "required", **reply},
                tags=("tools",),
            ),
        ]
    streamed = [c.with_fields("stream", stream=True) for c in cases]
    whole = [replace(c, name=f"{c.name}/whole") for c in cases]
    tail = "\n\nSummarise the text above in one sentence."
    return (
        whole
        + streamed
        + [Case("chat/long/whole", CHAT, {"messages": _chat(("user", long + tail)), **greedy}, long=True)]
    )


def long_stream(long: str, max_tokens: int, tag: str, route: str = CHAT) -> Case:
    """A streamed long prompt with prefill progress events (hung up on at the first one); `tag`
    starts the prompt so that no earlier conversation covers it (a real prefill, never the cache)."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0, "stream": True, "return_progress": True}
    if route == CHAT:
        body["messages"] = _chat(("user", f"{tag}\n{long}\n\nSummarise the text above."))
    else:
        body["prompt"] = f"{tag}\n{long}\n\nIn short,"
    return Case(f"{ROUTE_NAMES[route]}/long-progress", route, body, long=True)


def new_conversation(medium: str, max_tokens: int, tag: str, turns: int) -> Case:
    """A conversation no other request shares (`tag` in its first message), `turns` user turns long:
    the prompt cache keeps it, evicting the least recently used ones past --cache-memory."""
    messages = [{"role": "system", "content": f"Session {tag}. You answer in one line."}]
    for turn in range(turns):
        messages += _chat(("user", f"Question {turn + 1} about this text:\n{medium}"), ("assistant", "Noted."))
    messages.append({"role": "user", "content": "What did I ask you about?"})
    return Case("chat/new-conversation", CHAT, {"messages": messages, "max_tokens": max_tokens, "temperature": 0})


def _hostile(name: str, route: str, body: dict[str, Any] | bytes, expect: str = "4xx", **extra: Any) -> Case:
    name = f"hostile/{ROUTE_NAMES[route]}/{name}"
    if isinstance(body, bytes):
        return Case(name, route, raw=body, expect=expect, **extra)
    return Case(name, route, body, expect=expect, **extra)


def hostile_cases(responses: bool) -> list[Case]:
    """Bodies a server meets from broken or malicious clients, each with what it must get."""
    msg = _chat(("user", "Name three colours."))
    ok = {"messages": msg, "max_tokens": 4}
    deep = b"[" * 100_000 + b"]" * 100_000
    bad_tool = {"type": "function", "function": {"name": "x", "parameters": {"type": "nonsense"}}}
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(400):  # under json's own limit, past any recursive check's
        schema = {"type": "object", "properties": {"a": schema}}
    deep_call = {"id": "c", "type": "function", "function": {"name": "x", "arguments": "[" * 5000 + "]" * 5000}}
    cases = [
        # malformed JSON, invalid UTF-8, NUL bytes
        _hostile("truncated-json", CHAT, json.dumps(ok).encode()[:-7]),
        _hostile("not-json", CHAT, b"hello there"),
        _hostile("empty-body", CHAT, b""),
        _hostile("json-array", COMPLETIONS, b'["prompt", 1]'),
        _hostile("json-null", MESSAGES, b"null"),
        _hostile("deeply-nested-json", CHAT, b'{"messages": ' + deep + b"}"),
        _hostile("deeply-nested-json", MESSAGES, b'{"messages": ' + deep + b"}"),
        _hostile("invalid-utf8", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe\xc3("}]}'),
        _hostile("invalid-utf8", MESSAGES, b"\xff\xfe\x00\x00"),
        _hostile("nul-byte-raw", COMPLETIONS, b'{"prompt": "a\x00b", "max_tokens": 2}'),
        _hostile("nul-char-in-text", CHAT, {"messages": _chat(("user", "a\u0000b")), "max_tokens": 2}, "any"),
        _hostile("nul-char-in-model", COMPLETIONS, {"model": "x\u0000y", "prompt": "a", "max_tokens": 2}),
        _hostile(
            "lonely-surrogate", CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}', "any"
        ),
        # wrong types
        _hostile("messages-string", CHAT, {"messages": "hello"}),
        _hostile("max-tokens-string", CHAT, {"messages": msg, "max_tokens": "5"}),
        _hostile("stream-string", COMPLETIONS, {"prompt": "a", "stream": "yes"}),
        _hostile("temperature-string", MESSAGES, {"messages": msg, "max_tokens": 4, "temperature": "hot"}),
        _hostile("stop-number", CHAT, {"messages": msg, "stop": 5}),
        _hostile("tools-object", CHAT, {"messages": msg, "tools": {"name": "x"}}),
        _hostile("content-number", MESSAGES, {"messages": [{"role": "user", "content": 5}], "max_tokens": 4}),
        _hostile("prompt-object", COMPLETIONS, {"prompt": {"text": "a"}}),
        # huge and negative numbers
        _hostile("max-tokens-huge", CHAT, {"messages": msg, "max_tokens": 10**30}),
        _hostile("max-tokens-float", CHAT, {"messages": msg, "max_tokens": 1e30}),
        _hostile("max-tokens-negative", MESSAGES, {"messages": msg, "max_tokens": -1}),
        _hostile("temperature-huge", CHAT, {"messages": msg, "max_tokens": 2, "temperature": 1e308}, "any"),
        _hostile(
            "temperature-overflow", CHAT, b'{"messages": [{"role": "user", "content": "a"}], "temperature": 1e999}'
        ),
        _hostile("top-p-negative", CHAT, {"messages": msg, "top_p": -1}),
        _hostile("seed-negative", COMPLETIONS, {"prompt": "a", "seed": -1}),
        _hostile("seed-huge", COMPLETIONS, {"prompt": "a", "seed": 2**80}),
        _hostile("token-id-huge", COMPLETIONS, {"prompt": [1, 10**12]}),
        _hostile("token-id-negative", COMPLETIONS, {"prompt": [-1, 2]}),
        _hostile("keep-ratio-negative", CHAT, {"messages": msg, "method": "specprefill", "keep_ratio": -1}),
        _hostile("chunk-size-huge", CHAT, {"messages": msg, "method": "h2o", "h2o_chunk_size": 10**12}),
        # multi-MB bodies
        _hostile("prompt-2mb", COMPLETIONS, {"prompt": "word " * 400_000, "max_tokens": 2}),
        _hostile(
            "spaces-2mb",
            CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2' + b" " * 2_000_000 + b"}",
            "any",
        ),
        _hostile("hangup-mid-body", CHAT, json.dumps(ok).encode(), "any", content_length=100_000),
        # unknown roles and content parts, file: URLs
        _hostile("unknown-role", CHAT, {"messages": _chat(("wizard", "x"))}),
        # a system-role message inside messages is Claude Code's and accepted (docs/serve.md): a made-up role is not
        _hostile("unknown-role", MESSAGES, {"messages": _chat(("wizard", "x")), "max_tokens": 4}),
        _hostile("no-role", CHAT, {"messages": [{"content": "x"}]}),
        _hostile(
            "unknown-part",
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "hologram", "data": "x"}]}]},
        ),
        _hostile(
            "file-url-image",
            CHAT,
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}
                ]
            },
        ),
        _hostile(
            "file-url-image",
            MESSAGES,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}],
                    }
                ],
                "max_tokens": 4,
            },
        ),
        _hostile(
            "file-url-document",
            MESSAGES,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "url", "url": "file:///etc/shadow"}}],
                    }
                ],
                "max_tokens": 4,
            },
        ),
        # bad tool schemas
        _hostile("tool-schema-type", CHAT, {"messages": msg, "tools": [bad_tool]}),
        _hostile(
            "tool-schema-string",
            CHAT,
            {"messages": msg, "tools": [{"type": "function", "function": {"name": "x", "parameters": "{}"}}]},
        ),
        _hostile("tool-no-function", CHAT, {"messages": msg, "tools": [{"type": "function"}]}),
        _hostile("tool-name-spaces", CHAT, {"messages": msg, "tools": [_function("rm -rf /", "x", a="b")]}),
        _hostile("tool-duplicate", CHAT, {"messages": msg, "tools": [TOOLS[0], TOOLS[0]]}),
        _hostile(
            "tool-choice-unknown",
            CHAT,
            {"messages": msg, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        ),
        _hostile(
            "tool-schema-type",
            MESSAGES,
            {"messages": msg, "max_tokens": 4, "tools": [{"name": "x", "input_schema": {"type": 5}}]},
        ),
        _hostile(
            "tool-schema-deep",
            CHAT,
            {"messages": msg, "tools": [{"type": "function", "function": {"name": "x", "parameters": schema}}]},
        ),
        _hostile(
            "response-format-deep",
            CHAT,
            {
                "messages": msg,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            },
        ),
        _hostile(
            "tool-call-deep-arguments",
            CHAT,
            {"messages": [*msg, {"role": "assistant", "tool_calls": [deep_call]}, *msg], "max_tokens": 2},
            "any",
        ),
        _hostile(
            "tool-call-bad-arguments",
            CHAT,
            {
                "messages": [
                    *msg,
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "x", "arguments": 7}}],
                    },
                ]
            },
            "any",  # arguments that are not a string: the template writes what it is given
        ),
        _hostile(
            "response-format-schema",
            CHAT,
            {
                "messages": msg,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}},
            },
        ),
    ]
    if responses:
        cases += [
            _hostile("truncated-json", RESPONSES, b'{"input": "a'),
            _hostile("input-number", RESPONSES, {"input": 5}),
            _hostile("max-output-negative", RESPONSES, {"input": "a", "max_output_tokens": -3}),
            _hostile("unknown-item", RESPONSES, {"input": [{"type": "hologram"}]}),
            _hostile(
                "file-url-image",
                RESPONSES,
                {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}]},
            ),
            _hostile(
                "tool-schema-type",
                RESPONSES,
                {"input": "a", "tools": [{"type": "function", "name": "x", "parameters": {"type": "nonsense"}}]},
            ),
        ]
    return cases
