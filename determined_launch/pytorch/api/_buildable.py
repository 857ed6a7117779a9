"""A trial class that seed 002 builds without its data-loader methods.

Apart from ``trial.py`` because the context's seed-002 functions (``seed002.py``) need it, and
``trial.py`` imports the context: here it depends on neither.
"""

from __future__ import annotations

from typing import Any

_LOADER_METHODS = frozenset({"build_training_data_loader", "build_validation_data_loader"})


def _no_loader(name: str) -> Any:
    def method(self: Any) -> Any:
        raise TypeError(
            f"{type(self).__name__} defines no {name}(): pass the data to "
            f"context.train(trial, train_data, val_data), or define {name}()"
        )

    method.__name__ = name
    return method


def buildable_class(trial_cls: type) -> type:
    """``trial_cls``, or, when only the ``build_*_data_loader`` methods are
    missing (seed 002 passes the loaders to ``context.train``), a subclass of
    the same name that supplies them; anything else abstract stays abstract."""
    missing: frozenset[str] = getattr(trial_cls, "__abstractmethods__", frozenset())
    if not missing or not missing <= _LOADER_METHODS:
        return trial_cls
    namespace: dict[str, Any] = {name: _no_loader(name) for name in missing}
    namespace["__module__"] = trial_cls.__module__
    namespace["__qualname__"] = trial_cls.__qualname__  # checkpoints name the user's class
    return type(trial_cls.__name__, (trial_cls,), namespace)
