"""The rote reasoning model of run 16 (codex_run16_rote_thinker.md): the serve tests' rote checkpoint with a
Qwen3-style think block and a call to Codex's exec_command."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: tests.fixtures

from specfill.evaluation.soak_cases import CHATML_TOOLS
from tests.fixtures.tiny_tokenizer import EOS_TOKEN
from tests.fixtures.tool_model import write_rote_checkpoint

template = CHATML_TOOLS.replace(
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}",
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.reasoning_content %}"
    "{{- '\\n<think>\\n' + message.reasoning_content + '\\n</think>\\n' }}{%- endif %}",
).replace("{{- '<|im_start|>assistant\\n' }}{%- endif %}", "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")
assert "<think>" in template
HEAD, ARGS = '\n{"name": "exec_command", "arguments": ', '{"cmd": "cat service.toml"}}\n'
reply = {
    "Ċ": "Hmm, read the file.",
    "Hmm, read the file.": "</think>",
    "</think>": "<tool_call>",
    "<tool_call>": HEAD,
    HEAD: ARGS,
    ARGS: "</tool_call>",
    "</tool_call>": EOS_TOKEN,
}
path = write_rote_checkpoint(
    Path("/tmp/codexthink/model"),
    template,
    reply,
    ("<tool_call>", "</tool_call>", "<think>", "</think>"),
    ("Hmm, read the file.", HEAD, ARGS),
)
config = json.loads((path / "config.json").read_text())
config["max_position_embeddings"] = 65536  # Codex's first prompt is ~24K tokens in the tiny byte-level vocabulary
(path / "config.json").write_text(json.dumps(config, indent=2))
print(path)
