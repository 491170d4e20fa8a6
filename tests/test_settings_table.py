"""The one table of settings (core/request.SETTINGS, issue 35 item 2): every config field has a CLI
flag and a server field or a reason why not, the front ends' names and defaults are the table's,
every check names its field, and docs/usage.md shows the table as generated."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specfill.cli.main import build_parser
from specfill.core import ConfigError
from specfill.core.request import ALIASES, CLI, CONFIGS, PRIVATE, SERVER, SETTINGS, markdown_table, settings_of

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ("H2OConfig", "SpecPrefillConfig", "SamplingConfig")  # flags at their fields' defaults


def options(command: str) -> dict[str, object]:
    """flag -> argparse action of a subcommand's parser."""
    sub = build_parser([command])._subparsers._group_actions[0].choices[command]
    return {flag: action for action in sub._actions for flag in action.option_strings}


def test_every_field_is_public_or_private_with_a_reason():
    fields = {(config.__name__, f.name) for config in CONFIGS for f in dataclasses.fields(config)}
    assert {(s.config, s.field) for s in SETTINGS} == fields
    for s in SETTINGS:
        for front, public in ((CLI, s.cli), (SERVER, s.server)):
            assert public or PRIVATE.get((s.config, s.field, front)), (
                f"{s.config}.{s.field}: no {front} name, no reason"
            )
    stale = [key for key in (*ALIASES, *((c, f) for c, f, _ in PRIVATE)) if key not in fields]
    assert not stale, stale


def test_public_names_are_unique():
    flags = [flag for s in SETTINGS for flag in dict.fromkeys(s.cli) if not (s.field == "keep_tokens")]
    assert len(flags) == len(set(flags)), flags  # --keep: keep_ratio and keep_tokens share it
    servers = [s.server for s in SETTINGS if s.server]
    assert len(servers) == len(set(servers)), servers


def test_cli_flags_are_the_tables():
    generate, serve = options("generate"), options("serve")
    for s in SETTINGS:
        for flag in s.cli:
            assert flag in generate, (s.config, s.field, flag)
            action = generate[flag]
            assert action.option_strings[0] == s.cli[0]
            if flag != "--keep":
                assert action.help.startswith(s.help), flag
            if s.config in GENERATED and flag != "--keep":  # --num-draft-tokens: none given, no drafting
                assert action.default == s.default, (flag, action.default)
    for s in (*settings_of("H2OConfig"), *settings_of("SpecPrefillConfig")):  # the server's defaults too
        assert all(flag in serve for flag in s.cli), s.field
    for flag in ("--top-k", "--min-p", "--repetition-penalty", "--presence-penalty", "--frequency-penalty"):
        assert flag in serve
    sweep = options("eval")
    assert sweep["--h2o-dense-tail"].default == [64] and sweep["--score-layers"].default == ["all"]


def test_server_fields_are_the_tables():
    pytest.importorskip("pydantic")
    from specfill.serve.protocol import ChatRequest, CompletionRequest, MethodFields, PrefillFields, SamplingSettings

    method_configs = ("H2OConfig", "SpecPrefillConfig")
    for model, configs in (
        (MethodFields, method_configs),
        (PrefillFields, (*method_configs, "PrefillMethod", "Drafting")),  # method, auto_threshold, num_draft_tokens
        (SamplingSettings, ("SamplingConfig",)),
    ):
        assert set(model.model_fields) == {s.server for config in configs for s in settings_of(config) if s.server}
    for s in SETTINGS:
        if s.server:
            assert s.server in ChatRequest.model_fields and s.server in CompletionRequest.model_fields, s.server


BAD = {int: "x", float: "x", str: "no-such-value"}


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.kind in BAD], ids=lambda s: f"{s.config}.{s.field}")
def test_every_check_names_its_field(setting):
    """A bad value of any checked field is a ConfigError carrying that field and its config, which
    the server turns into the request field at fault (specfill/serve/plan._field_at_fault)."""
    config = next(c for c in CONFIGS if c.__name__ == setting.config)
    with pytest.raises(ConfigError) as err:
        config(**{setting.field: BAD[setting.kind]})
    assert (err.value.config, err.value.field) == (setting.config, setting.field), str(err.value)


METHOD_OF = {"H2OConfig": "h2o", "SpecPrefillConfig": "specprefill", "PrefillMethod": "auto"}


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.server], ids=lambda s: s.server)
def test_the_server_names_the_field_at_fault(setting):
    """Every request field of the table, given a value its check refuses: a 400 naming that field."""
    pytest.importorskip("pydantic")
    from specfill.serve.errors import RequestError
    from specfill.serve.plan import ServerDefaults, build_plan
    from specfill.serve.protocol import CompletionRequest, parse_data

    bad = {int: -1, float: -5.0, str: "no-such-value"}[setting.kind]
    body = {"prompt": "1 2", "method": METHOD_OF.get(setting.config, "full"), setting.server: bad}
    with pytest.raises(RequestError) as refused:
        request = parse_data(body, CompletionRequest)
        build_plan("completion", request, [1, 2, 3], ServerDefaults("tiny", speculator="self:1"), 64)
    assert (refused.value.status, refused.value.param) == (400, setting.server), refused.value.message
    assert setting.server in refused.value.message or setting.field in refused.value.message


def test_docs_show_the_generated_table():
    text = (ROOT / "docs" / "usage.md").read_text()
    start = "<!-- settings table: generated by core/request.markdown_table() -->\n"
    shown = text[text.index(start) + len(start) : text.index("\n<!-- end of settings table -->")]
    assert shown == markdown_table(), "docs/usage.md: paste core/request.markdown_table() between the markers"
