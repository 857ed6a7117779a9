"""Automatic mixed precision helpers for ``PyTorchTrialContext``.

Upstream semantics are CUDA AMP: on a CPU-only machine the scaler is created
disabled and autocast is a no-op, so CPU runs keep exact fp32 arithmetic
(we deliberately do not switch CPU runs to bfloat16).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch


def cuda_amp_available() -> bool:
    return torch.cuda.is_available()


def new_grad_scaler() -> Any:
    """The scaler ``experimental.use_amp()`` installs: CUDA AMP, disabled without CUDA
    (avoids torch's "CUDA not available" warning on CPU machines)."""
    return torch.amp.GradScaler("cuda", enabled=cuda_amp_available())


def cast_to_float32(value: Any) -> Any:
    """fp16/bf16 tensors (also inside dicts, lists and tuples) back to fp32, so
    losses and metrics computed from model outputs keep full precision."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if isinstance(value, dict):
        return {k: cast_to_float32(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(cast_to_float32(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(cast_to_float32(v) for v in value)
    return value


def autocast_callable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run under CUDA autocast, outputs cast back to fp32."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cuda", enabled=cuda_amp_available()):
            out = fn(*args, **kwargs)
        return cast_to_float32(out)

    return wrapper


def autocast_forward(model: torch.nn.Module) -> torch.nn.Module:
    """Patch the instance's ``forward`` (not the class, not the module tree), so
    ``state_dict()`` keys stay those of the plain model."""
    if not getattr(model, "_det_autocast", False):
        model.forward = autocast_callable(model.forward)
        model._det_autocast = True  # type: ignore[assignment]
    return model
