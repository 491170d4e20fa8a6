"""Errors that users see as one line (the CLI prints `str(err)` and exits 2)."""


class SpecfillError(Exception):
    """Base class: a problem with the user's input or set-up, not a bug in specfill."""


class ConfigError(SpecfillError, ValueError):
    """An invalid method setting (S, B, L, H, keep, look-ahead, pooling, ...)."""


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
