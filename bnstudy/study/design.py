"""One generic check of a chapter's parameters (issue 33): each value against the type of its default, plus a few
one-line domain rules per chapter, instead of a hand-written ``__post_init__`` per chapter.

A chapter's ``Config`` subclasses :class:`ChapterConfig` and declares, as data, ``PARAMETERS`` (``{parameter:
default}`` in run-line order, :data:`REQUIRED`: no default), ``PROFILES``, ``NORMALIZE`` (``{parameter: function}``
for a parameter with its own spelling, such as ``seeds``) and ``RULES`` (:class:`Rule`). Every other parameter is
checked against its default's type (:func:`check_like`), a list's values unrepeated unless in ``REPEATS_OK``.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Callable, ClassVar

from .config import check_choice, check_float, check_int, check_sequence, seeds_label


@dataclasses.dataclass(frozen=True)
class Rule:
    """A one-line domain rule: ``holds(config)`` must be true, else ``ValueError("<name> must be <what>, got
    <value>")``; ``what`` is a string or a function of the config returning one."""

    name: str
    what: str | Callable[[object], str]
    holds: Callable[[object], bool]


def check_like(name: str, value, like):
    """``value`` checked against the type of ``like`` and returned in that type (a list as a tuple; ``like is None``:
    anything). Raises ``ValueError`` naming ``name``, what it must be and what was given."""
    if like is None:
        return value
    if isinstance(like, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
        return value
    if isinstance(like, numbers.Integral):
        return check_int(name, value)
    if isinstance(like, numbers.Real):
        return check_float(name, value)
    if isinstance(like, str):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        return value
    if isinstance(like, tuple):
        item = like[0] if like else 0.0
        return check_sequence(name, value, lambda n, v: check_like(n, v, item))
    return value


class _Required:
    def __repr__(self):
        return "REQUIRED"


#: A parameter's default in :attr:`Parameters.PARAMETERS` when it has none: the caller must give it.
REQUIRED = _Required()


class Parameters:
    """A frozen set of parameters declared as data: ``PARAMETERS`` maps each name to its default, in order. Built
    from keyword arguments, checked by ``__post_init__``; equal, hashed and printed by :meth:`asdict`, as the frozen
    dataclass it replaces. Raises ``ValueError`` naming unknown parameters and the allowed ones, ``TypeError`` for a
    missing required one, :class:`dataclasses.FrozenInstanceError` on assignment."""

    PARAMETERS: ClassVar[dict] = {}

    def __init_subclass__(cls, **kwargs):
        """Refuses fields declared as annotations (a ``@dataclass`` subclass would bypass every check)."""
        super().__init_subclass__(**kwargs)
        fields = [n for n, a in vars(cls).get("__annotations__", {}).items() if not str(a).startswith("ClassVar")]
        if fields:
            raise TypeError(f"{cls.__qualname__} declares fields {fields}; declare parameters as data in "
                            f"PARAMETERS = dict(name=default, ...) (bnstudy.study.design.Parameters)")

    def __init__(self, **values):
        names = self.PARAMETERS
        self._refuse_unknown(values)
        missing = [n for n, d in names.items() if d is REQUIRED and n not in values]
        if missing:
            raise TypeError(f"{type(self).__name__}() missing required parameters {missing}")
        for name, default in names.items():
            object.__setattr__(self, name, values.get(name, default))
        self.__post_init__()

    def __post_init__(self):
        pass

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def _set(self, name, value):
        object.__setattr__(self, name, value)

    def _refuse_unknown(self, given) -> None:
        unknown = sorted(set(given) - set(self.PARAMETERS))
        if unknown:
            raise ValueError(f"unknown {type(self).__name__} parameters {unknown}; allowed: {sorted(self.PARAMETERS)}")

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        """The parameters' names, in order."""
        return tuple(cls.PARAMETERS)

    def asdict(self) -> dict:
        """``{name: value}`` in ``PARAMETERS`` order (tuples kept)."""
        return {n: getattr(self, n) for n in self.PARAMETERS}

    def replace(self, **changes):
        """A copy with ``changes`` applied (checked again). Unknown names raise ``ValueError``."""
        self._refuse_unknown(changes)
        return type(self)(**{**self.asdict(), **changes})

    @classmethod
    def create(cls, **kwargs):
        """Build from keyword arguments; unknown names raise ``ValueError`` listing the allowed ones."""
        return cls(**kwargs)

    def __eq__(self, other):
        return type(other) is type(self) and self.asdict() == other.asdict()

    def __hash__(self):
        return hash((type(self).__qualname__, *self.asdict().values()))

    def __repr__(self):
        return f"{type(self).__qualname__}({', '.join(f'{k}={v!r}' for k, v in self.asdict().items())})"


class ChapterConfig(Parameters):
    """Base of a chapter's frozen ``Config``: its ``PARAMETERS``, the generic check of every one (:func:`check_like`
    against its default, or the class's ``NORMALIZE``), then its ``RULES`` in order."""

    PROFILES: ClassVar[dict] = {}
    NORMALIZE: ClassVar[dict] = {}
    RULES: ClassVar[tuple] = ()
    #: List parameters that may repeat a value (by default none may: the same cells would run twice).
    REPEATS_OK: ClassVar[tuple] = ()

    def __post_init__(self):
        for name, default in self.PARAMETERS.items():
            value = getattr(self, name)
            if name == "profile":
                check_choice("profile", value, tuple(self.PROFILES))
            elif name in self.NORMALIZE:
                self._set(name, self.NORMALIZE[name](value))
            else:
                self._set(name, check_like(name, value, None if default is REQUIRED else default))
            value = getattr(self, name)
            if isinstance(value, tuple) and name not in self.REPEATS_OK and len(set(value)) != len(value):
                raise ValueError(f"{name} must not repeat a value, got {list(value)}")
        for rule in self.RULES:
            if not rule.holds(self):
                what = rule.what(self) if callable(rule.what) else rule.what
                raise ValueError(f"{rule.name} must be {what}, got {_shown(getattr(self, rule.name))}")

    def describe(self) -> str:
        """The resolved parameters for the run line: ``profile=full, 10 seeds (0-9), n_tasks=[2, 4], steps=300, ...``
        (floats ``:g``, an empty list left out)."""
        parts = []
        for name, v in self.asdict().items():
            if name == "seeds":
                parts.append(seeds_label(v))
            elif isinstance(v, tuple):
                if v:
                    parts.append(f"{name}={[float(f'{x:g}') if isinstance(x, float) else x for x in v]}")
            else:
                parts.append(f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}")
        return ", ".join(parts)


def _shown(v):
    """A rejected value as a refusal shows it: a tuple as a list, a long one (seeds 0..999) cut to its ends."""
    if not isinstance(v, tuple):
        return v
    if len(v) <= 12:
        return list(v)
    return f"[{', '.join(map(repr, v[:5]))}, ..., {', '.join(map(repr, v[-2:]))}] ({len(v)} values)"
