"""Argument checks shared by the public functions: one rule, one message shape.

Every check raises with a message ``"<function>: <parameter> must be <what is allowed>, got <what came>"``:
``TypeError`` when the value has the wrong type, ``ValueError`` when the type is right and the value is
not (a negative count, an unknown choice, an empty list of names). ``bool`` is never accepted as an
integer or a number, and a ``str`` never as an iterable of items.
"""

from __future__ import annotations

import itertools
import numbers
import os
import sys
from typing import Any, Iterable

import torch
from torch import nn


def require_pandas():
    """pandas, imported on first use: the practitioner's library needs only torch and numpy; its tables (an
    audit's ``report()``, ``diff``, ``compare_statistics``...) are pandas DataFrames.

    Raises ``ImportError`` saying what to install when pandas is missing."""
    try:
        import pandas
    except ImportError as e:  # pragma: no cover - exercised in the bare-environment test
        raise ImportError("this bnstudy call returns a table, which needs pandas: pip install pandas "
                          "(or bnstudy[study], the book's machinery)") from e
    return pandas


class LazyPandas:
    """A stand-in for the ``pandas`` module that imports it on first attribute access (:func:`require_pandas`),
    so importing the library never needs pandas."""

    def __getattr__(self, name):
        return getattr(require_pandas(), name)


def describe(value: Any) -> str:
    """A short account of ``value`` for an error message: the repr of a small scalar or string, else the type."""
    if value is None or isinstance(value, (bool, numbers.Number)) or (isinstance(value, str) and len(value) <= 40):
        return repr(value)
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _where(fn: str) -> str:
    return f"{fn}: " if fn else ""


def check_module(fn: str, param: str, value: Any) -> nn.Module:
    if not isinstance(value, nn.Module):
        raise TypeError(f"{_where(fn)}{param} must be an nn.Module, got {describe(value)}")
    return value


def check_int(fn: str, param: str, value: Any, minimum: int = 1, allow_none: bool = False,
              what: str | None = None) -> int | None:
    """An integer ``>= minimum`` (or None when ``allow_none``)."""
    if value is None and allow_none:
        return None
    allowed = what or ("a positive integer" if minimum == 1 else f"an integer >= {minimum}")
    if allow_none and what is None:
        allowed += " or None"
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{_where(fn)}{param} must be {allowed}, got {describe(value)}")
    if value < minimum:
        raise ValueError(f"{_where(fn)}{param} must be {allowed}, got {value!r}")
    return int(value)


def check_number(fn: str, param: str, value: Any, minimum: float | None = None, maximum: float | None = None,
                 strict_minimum: bool = False, allow_none: bool = False) -> float | None:
    """A finite real number in ``[minimum, maximum]`` (``(minimum, maximum]`` with ``strict_minimum``)."""
    if value is None and allow_none:
        return None
    lo = "" if minimum is None else (f" > {minimum}" if strict_minimum else f" >= {minimum}")
    hi = "" if maximum is None else f" <= {maximum}"
    allowed = f"a finite number{lo}{' and' if lo and hi else ''}{hi}" + (" or None" if allow_none else "")
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{_where(fn)}{param} must be {allowed}, got {describe(value)}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")) or (minimum is not None and (v <= minimum if strict_minimum
                                                                                else v < minimum)) \
            or (maximum is not None and v > maximum):
        raise ValueError(f"{_where(fn)}{param} must be {allowed}, got {value!r}")
    return v


def check_bool(fn: str, param: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{_where(fn)}{param} must be True or False, got {describe(value)}")
    return value


def check_str(fn: str, param: str, value: Any, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{_where(fn)}{param} must be a string, got {describe(value)}")
    if nonempty and not value:
        raise ValueError(f"{_where(fn)}{param} must be a non-empty string, got ''")
    return value


def check_choice(fn: str, param: str, value: Any, choices: Iterable) -> Any:
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{_where(fn)}{param}={describe(value)} is not allowed; choose one of {choices}")
    return value


def check_callable(fn: str, param: str, value: Any, what: str, allow_none: bool = True) -> Any:
    if value is None and allow_none:
        return None
    if not callable(value):
        raise TypeError(f"{_where(fn)}{param} must be {what}{' or None' if allow_none else ''}, got "
                        f"{describe(value)}")
    return value


def check_iterable(fn: str, param: str, value: Any, what: str) -> Any:
    """An iterable that is not a string, bytes or a single tensor (the usual slips for "a list of ...")."""
    if isinstance(value, (str, bytes, torch.Tensor)) or value is None:
        hint = "; wrap one tensor in a list: [x]" if isinstance(value, torch.Tensor) else ""
        raise TypeError(f"{_where(fn)}{param} must be {what}, got {describe(value)}{hint}")
    # Asked of the type, not by calling iter(): that would start a DataLoader's worker processes.
    if not (hasattr(type(value), "__iter__") or hasattr(type(value), "__getitem__")):
        raise TypeError(f"{_where(fn)}{param} must be {what}, got {describe(value)}")
    return value


def check_device(fn: str, param: str, value: Any, allow_none: bool = True, holds_values: bool = False) -> Any:
    """A ``torch.device`` or device string (or None when ``allow_none``). With ``holds_values`` (a place to copy
    tensors to), also one this torch build and machine can allocate on, and not ``'meta'`` (which holds no
    values): ``ValueError`` otherwise, e.g. ``'cuda'`` on a CPU-only build, decided by allocating an empty
    tensor there as torch would."""
    if value is None and allow_none:
        return None
    if isinstance(value, str):
        try:
            torch.device(value)
        except (RuntimeError, ValueError):
            raise ValueError(f"{_where(fn)}{param}={value!r} is not a device; give e.g. 'cpu' or 'cuda:0'") from None
    elif not isinstance(value, torch.device):
        raise TypeError(f"{_where(fn)}{param} must be a torch.device, a device string such as 'cpu'"
                        f"{' or None' if allow_none else ''}, got {describe(value)}")
    if holds_values:
        allowed = "'cpu' or a device this machine has" + (" (or None: each tensor on its own device)"
                                                          if allow_none else "")
        if torch.device(value).type == "meta":
            raise ValueError(f"{_where(fn)}{param}={str(value)!r} holds no values (a 'meta' tensor has a shape and "
                             f"no data), so nothing could be compared; give {allowed}")
        try:
            torch.empty(0, device=value)
        except Exception as e:  # noqa: BLE001 - torch says AssertionError or RuntimeError, by build and device
            raise ValueError(f"{_where(fn)}{param}={str(value)!r} is not available on this machine (torch: "
                             f"{type(e).__name__}: {e}); give {allowed}") from None
    return value


def check_materialized(fn: str, param: str, model: nn.Module) -> nn.Module:
    """``model`` with no parameter or buffer on the ``'meta'`` device and none of a lazy module still uninitialised
    (``nn.LazyBatchNorm2d`` before its first forward pass): such tensors have no values, so there is nothing to copy,
    compare or run. Raises ``ValueError`` naming the first few."""
    named = list(itertools.chain(model.named_parameters(remove_duplicate=False),
                                 model.named_buffers(remove_duplicate=False)))
    lazy = [n for n, t in named if t is not None and nn.parameter.is_lazy(t)]
    if lazy:
        shown = ", ".join(map(repr, lazy[:3])) + (f" and {len(lazy) - 3} more" if len(lazy) > 3 else "")
        raise ValueError(f"{_where(fn)}{param} has lazy modules still uninitialised ({shown}); run one forward pass "
                         "on a batch of the right shape first (it sets their shapes)")
    meta = [n for n, t in named if t is not None and t.device.type == "meta"]
    if meta:
        shown = ", ".join(map(repr, meta[:3])) + (f" and {len(meta) - 3} more" if len(meta) > 3 else "")
        raise ValueError(f"{_where(fn)}{param} must hold its values, got a {type(model).__name__} with tensors on "
                         f"the 'meta' device ({shown}), which have a shape and no data; materialise it first "
                         "(model.to_empty(device='cpu') and load its weights)")
    return model


def has_tensor(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is a tensor or a tuple/list/dict holding one (a model input a forward can use)."""
    if isinstance(value, torch.Tensor):
        return True
    if depth > 4:
        return False
    if isinstance(value, (tuple, list)):
        return any(has_tensor(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(has_tensor(v, depth + 1) for v in value.values())
    return False


def check_model_input(fn: str, param: str, value: Any, allow_none: bool = False) -> Any:
    """A model input: a tensor, or a tuple (unpacked into several inputs), list or dict holding tensors."""
    if value is None and allow_none:
        return None
    if not has_tensor(value):
        raise TypeError(f"{_where(fn)}{param} must be the model's input: a tensor, or a tuple (several inputs), "
                        f"list or dict of tensors{' (or None)' if allow_none else ''}, got {describe(value)}")
    return value


def module_names(fn: str, param: str, model: nn.Module, modules: Any) -> list[str]:
    """Qualified names inside ``model`` for ``modules``: one qualified name, one module object of ``model``,
    or a non-empty list (any iterable) of those. ``""`` or ``model`` itself is the whole model.

    Raises ``TypeError`` for another type, ``ValueError`` for an empty list (it would select nothing, a
    silent no-op) or a name or object that is not in ``model`` (listing names it has).
    """
    if isinstance(modules, (str, nn.Module)):
        items = [modules]
    else:
        what = "a qualified module name, a module of the model, or a list of those"
        check_iterable(fn, param, modules, what)
        items = list(modules)
    known = dict(model.named_modules(remove_duplicate=False))
    examples = [k for k in known if k][:6]
    if not items:
        raise ValueError(f"{_where(fn)}{param} is empty, which selects no module; give qualified names such as "
                         f"{examples}")
    by_id: dict = {}
    for n, m in known.items():
        by_id.setdefault(id(m), n)
    out = []
    for p in items:
        if isinstance(p, nn.Module):
            if id(p) not in by_id:
                raise ValueError(f"{_where(fn)}{param}: the {type(p).__name__} object given is not a module of the "
                                 f"model ({type(model).__name__})")
            out.append(by_id[id(p)])
        elif isinstance(p, str):
            if p not in known:
                raise ValueError(f"{_where(fn)}{param}={p!r} is not a module of the model ({type(model).__name__}); "
                                 f"choose qualified names such as {examples}")
            out.append(p)
        else:
            raise TypeError(f"{_where(fn)}{param} must hold qualified module names (str) or modules of the model, "
                            f"got an item {describe(p)}")
    return out


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called from here that points at the first frame outside this
    package and torch: the user's line (``model(x)``, ``with FreezeAudit(...)``, their own ``forward``),
    not a hook inside ``torch/nn/modules/module.py`` or ``sys:1``. Python 3.12's ``skip_file_prefixes``
    does the same; this works on 3.10 and 3.11."""
    frame = sys._getframe(1)  # the caller of user_stacklevel, i.e. the function that calls warnings.warn
    level = 1
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not (name.startswith(_PACKAGE_DIR) or name.startswith(_TORCH_DIR)):
            return level
        frame = frame.f_back
        level += 1
    return 1
