"""Errors that users see as one line (the CLI prints `str(err)` and exits 2; the server sends it).

Messages are built here once: `str()` of every SpecfillError escapes what is not printable (a
newline in a model path stays `\\n`), so no user-given text can split a message or forge a
second line; `quote` is how a message names a user-given path or string (escaped, as repr does).
"""

from __future__ import annotations

from os import PathLike


def one_line(text: str) -> str:
    """`text` with every non-printable character (newline, tab, escape, ...) written as repr does."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def quote(value: str | PathLike) -> str:
    """A user-given path or string as it appears in a message: quoted and escaped (`'a\\nb.gguf'`)."""
    return repr(str(value))


class SpecfillError(Exception):
    """Base class: a problem with the user's input or set-up, not a bug in specfill."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class ConfigError(SpecfillError, ValueError):
    """An invalid method setting (S, B, L, H, keep, look-ahead, pooling, ...).

    fields: the config fields the message is about, the one at fault first (`field`); config: the
    name of the config class that owns them ("H2OConfig", ...). core/request.SETTINGS maps the pair to
    the public names (CLI flag, request field), so a front end names the field without reading the
    message. Both are empty for errors about no single setting.
    """

    def __init__(self, message: str, *fields: str, config: str | None = None) -> None:
        super().__init__(message)
        self.fields: tuple[str, ...] = fields
        self.config = config

    @property
    def field(self) -> str | None:
        """The config field at fault (None: no single setting)."""
        return self.fields[0] if self.fields else None


class ModelLoadError(SpecfillError):
    """A model file or directory that is missing, corrupt, truncated or unsupported."""


class TokenizerMismatchError(SpecfillError):
    """The speculator's tokenizer differs from the main model's."""


class ChatTemplateError(SpecfillError, ValueError):
    """The model has no chat template, its template is broken, or it rejects the messages."""


class PromptTooLongError(SpecfillError):
    """The prompt (plus requested tokens) does not fit the model's context."""


class BackendUnavailableError(SpecfillError):
    """The requested backend, or a feature of it, is not installed or not built yet."""


class SpecfillWarning(UserWarning):
    """A setting was adjusted (e.g. clamped) rather than rejected."""


class NonFiniteLogitsError(SpecfillError):
    """The model computed NaN or Inf logits: broken weights or numerics, never a text to print."""
