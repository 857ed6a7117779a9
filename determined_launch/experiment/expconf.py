"""Determined's experiment config: read by :mod:`determined_launch.expconf`,
one reader below every layer, because ``det-launch --config`` and the legacy
runner (``python -m determined_launch.pytorch --config``) check the same file
the same way. This name stays for the experiment layer's imports."""

from determined_launch.expconf import (
    ASHA_MODES,
    SEARCHERS,
    UNITS,
    ConfigError,
    ExperimentConfig,
    SearcherConfig,
    ignored_lines,
    load,
    parse,
)

__all__ = ["ASHA_MODES", "SEARCHERS", "UNITS", "ConfigError", "ExperimentConfig",
           "SearcherConfig", "ignored_lines", "load", "parse"]
