"""A forward pass in both modes: how the audit and the lints call a model (:func:`resolve_forward`,
:func:`call_forward`) and what changes between train and eval mode (:func:`lint_forward_modes`)."""

from __future__ import annotations

import inspect
import itertools
import warnings
from typing import Any, Callable

import torch
from torch import nn

from .._checks import check_bool, check_callable, check_model_input, check_module, check_str
from ..freeze import is_pinned
from .codes import Lint, _emit, _label, _lint


def _is_dropout(m: nn.Module) -> bool:
    return isinstance(m, nn.modules.dropout._DropoutNd)


def _required_positional(fn) -> int | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sum(1 for p in sig.parameters.values()
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)


def _required_keyword_only(fn) -> list[str]:
    """The keyword-only parameters without a default of ``fn`` (of a module's ``forward``); [] when unreadable."""
    target = fn.forward if isinstance(fn, nn.Module) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY and p.default is p.empty]


def _callable_name(fn) -> str:
    if isinstance(fn, nn.Module):
        return f"{type(fn).__name__}.forward"
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def output_signature(out: Any) -> str:
    """The structure of a forward's return value without sizes: ``Tensor``, ``dict(logits, aux)``,
    ``AuxOutputs(logits, aux_logits)``, ``tuple(Tensor, Tensor)``..."""
    if isinstance(out, torch.Tensor):
        return "Tensor"
    if isinstance(out, dict):
        return "dict(" + ", ".join(map(str, out)) + ")"
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return f"{type(out).__name__}(" + ", ".join(out._fields) + ")"
    if isinstance(out, (tuple, list)):
        return f"{type(out).__name__}(" + ", ".join(output_signature(v) for v in out) + ")"
    return type(out).__name__


def refuse_keyword_only(where: str, param: str, fn: Callable) -> None:
    """Raise ``TypeError`` when ``fn`` (the model, a submodule or a callable the input runs through) has required
    keyword-only parameters: an input is passed positionally (a tuple unpacked, a dict as one argument), so no
    ``param`` can supply them. The message says how: a ``forward`` callable that supplies them."""
    needed = _required_keyword_only(fn)
    if needed:
        example = ", ".join(f"{k}=..." for k in needed)
        raise TypeError(f"{where}: {param} cannot be run through {_callable_name(fn)}, which requires the keyword-only "
                        f"argument{'s' if len(needed) > 1 else ''} {', '.join(map(repr, needed))}: {param} must be "
                        "positional input (a tensor; a tuple, unpacked into several arguments; a list or a dict, "
                        f"passed as one argument). Pass forward=lambda x: model(x, {example}) so that {param} is x "
                        "alone")


def _input_words(x: Any, depth: int = 0) -> str:
    """``"a float64 tensor of shape (8, 5) on cpu"``, or the same for each item of a tuple, list or dict."""
    if isinstance(x, torch.Tensor):
        return f"a {str(x.dtype).removeprefix('torch.')} tensor of shape {tuple(x.shape)} on {x.device}"
    if depth < 2 and isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of [" + ", ".join(_input_words(v, depth + 1) for v in x) + "]"
    if depth < 2 and isinstance(x, dict):
        return "a dict of {" + ", ".join(f"{k!r}: {_input_words(v, depth + 1)}" for k, v in x.items()) + "}"
    return f"a {type(x).__name__}"


def _tensors(x: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if depth < 4 and isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v, depth + 1)]
    if depth < 4 and isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v, depth + 1)]
    return []


def run_input(where: str, param: str, fn: Callable, x: Any, model: nn.Module, mode: str = "eval") -> Any:
    """``call_forward(fn, x)``; when torch (or the model) refuses ``x``, raise ``TypeError`` (a floating tensor of
    ``x`` in another dtype than the model's parameters, or torch's error is about a dtype) or ``ValueError`` (its
    shape, device or values) naming
    ``where`` and ``param``, with what ``x`` was, what the model holds and what it raised (chained)."""
    try:
        return call_forward(fn, x)
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as e:
        place = next(((t.device, t.dtype) for t in itertools.chain(model.parameters(), model.buffers())
                      if t.is_floating_point() and not nn.parameter.is_lazy(t)), None)
        floats = [t for t in _tensors(x) if t.is_floating_point()]
        dtype = (place is not None and any(t.dtype != place[1] for t in floats)) or any(
            w in str(e) for w in ("dtype", "scalar type"))
        held = (f"its parameters are {str(place[1]).removeprefix('torch.')} on {place[0]}" if place is not None
                else "it has no floating parameters")
        raise (TypeError if dtype else ValueError)(
            f"{where}: {param} must be an input {_callable_name(fn)} runs in {mode} mode ({held}), got "
            f"{_input_words(x)}; it raised {type(e).__name__}: {e}") from e


def resolve_forward(model: nn.Module, forward: Callable | nn.Module | None, where: str) -> Callable:
    """The one ``forward`` convention of :class:`FreezeAudit` and :func:`lint_forward_modes`: ``None`` (call
    ``model``), a module or any callable taking the input (``model.backbone``, ``model.forward_a``,
    ``lambda x: ...``). The old ``lint_forward_modes`` form ``forward(model, example)`` (two required positional
    parameters) still works with a ``DeprecationWarning``. Raises ``TypeError`` for anything else."""
    check_str("resolve_forward", "where", where)
    check_module(where, "model", model)
    if forward is None:
        return model
    if isinstance(forward, nn.Module):
        return forward
    if not callable(forward):
        raise TypeError(f"{where}: forward must be None, an nn.Module or a callable taking the input, got "
                        f"{type(forward).__name__}")
    if _required_positional(forward) == 2:
        warnings.warn(f"{where}: forward(model, example) is deprecated; pass a callable of the input alone "
                      "(e.g. model.forward_a or lambda x: model(x)), as FreezeAudit takes it", DeprecationWarning,
                      stacklevel=3)
        return lambda x: forward(model, x)
    return forward


def call_forward(fn: Callable, x: Any) -> Any:
    """``fn(*x)`` for a tuple ``x`` (several inputs), else ``fn(x)``: how the audit calls a forward on a probe."""
    check_callable("call_forward", "fn", fn, "a callable (a module or a function of the input)", allow_none=False)
    return fn(*x) if isinstance(x, tuple) else fn(x)


def lint_forward_modes(model: nn.Module, example: Any, forward: Callable | nn.Module | None = None,
                       warn: bool = True) -> list[Lint]:
    """Run ``forward(example)`` once after ``model.train()`` and once after ``model.eval()``, and compare.

    Lints ``forward_changes_with_mode`` when the return value's structure
    (:func:`output_signature`) differs between the modes (torchvision's
    Inception v3 returns auxiliary logits only in train mode; its detection
    models return a loss dict in train mode), and ``dropout_present``
    (information) naming the dropout layers that ``model.eval()`` turns off.
    ``forward`` follows :class:`FreezeAudit`'s convention (:func:`resolve_forward`:
    None for ``model``, a submodule, or a callable of the input; the old
    ``forward(model, example)`` is deprecated). A tuple ``example`` is unpacked.
    ``model`` ends as it started: every buffer is copied back, every train/eval
    flag restored, the global RNG forked; the passes run under
    ``torch.no_grad()``. Costs a copy of the buffers and two forward passes.
    Raises ``TypeError`` naming ``example`` when the forward requires keyword-only arguments (pass a ``forward``
    that supplies them) or when it refuses ``example`` in a dtype other than the model's, ``ValueError`` when it
    refuses it otherwise (shape, device; torch's error chained), with ``model`` restored.
    """
    check_module("lint_forward_modes", "model", model)
    check_model_input("lint_forward_modes", "example", example)
    check_bool("lint_forward_modes", "warn", warn)
    call = resolve_forward(model, forward, "lint_forward_modes")
    refuse_keyword_only("lint_forward_modes", "example", call)
    flags = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers() if b is not None and not nn.parameter.is_lazy(b)]
    sigs = {}
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for mode in (True, False):
                model.train(mode)
                sigs[mode] = output_signature(run_input("lint_forward_modes", "example", call, example, model,
                                                        "train" if mode else "eval"))
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        for m, flag in flags:
            m.training = flag
    lints = []
    if sigs[True] != sigs[False]:
        lints.append(_lint("forward_changes_with_mode", "",
                           f"{type(model).__name__}.forward returns {sigs[True]} after model.train() but "
                           f"{sigs[False]} after model.eval(): a loop that puts the whole model in eval mode "
                           "trains on a different output (a missing term raises, or is silently dropped)"))
    drops = [n for n, m in model.named_modules() if _is_dropout(m) and not is_pinned(m)]
    if drops:
        lints.append(_lint("dropout_present", drops[0] if len(drops) == 1 else "",
                           f"model.eval() turns off dropout in {', '.join(map(_label, drops))}"))
    _emit(lints, warn)
    return lints
