"""specfill.core: the backend-neutral spec (configs, stage interfaces, NumPy reference).

Needs NumPy only; importing it never imports torch or mlx.
"""

from .config import H2OConfig, SpecPrefillConfig
from .errors import (
    BackendUnavailableError,
    ChatTemplateError,
    ConfigError,
    ModelLoadError,
    NonFiniteLogitsError,
    PromptTooLongError,
    SpecfillError,
    SpecfillWarning,
    TokenizerMismatchError,
)
from .stages import (
    AttentionState,
    H2OCarry,
    H2OLayerResult,
    H2OStages,
    InterResult,
    IntraResult,
    MemorySet,
    Selection,
    SpecPrefillStages,
    TokenScores,
)

__all__ = [
    "AttentionState",
    "BackendUnavailableError",
    "ChatTemplateError",
    "ConfigError",
    "H2OCarry",
    "H2OConfig",
    "H2OLayerResult",
    "H2OStages",
    "InterResult",
    "IntraResult",
    "MemorySet",
    "ModelLoadError",
    "NonFiniteLogitsError",
    "PromptTooLongError",
    "Selection",
    "SpecPrefillConfig",
    "SpecPrefillStages",
    "SpecfillError",
    "SpecfillWarning",
    "TokenScores",
    "TokenizerMismatchError",
]
