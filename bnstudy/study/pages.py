"""Glue a chapter's findings into its page, by a fixed naming rule (:func:`glue_items`).

Numbers are glued as plain Python numbers for ``{glue:text}`key:.3f```; short text (at most :data:`BOLD_MAX_WORDS`
words) as bold Markdown for ``{glue:md}``, longer text plain; booleans as ``yes`` / ``no``; an interval as
``<key>_mean``, ``_ci_low``, ``_ci_high``; a dict or Series one key per entry (``<key>_<entry>``, plus ``_min`` /
``_max`` of a numeric Series). Nothing here decides anything: the values come from the tested findings functions.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections import Counter

import pandas as pd

from .inference import Interval, _slug  # one slug rule for glue keys and numbers-table keys


#: A glued string of at most this many words is a verdict and rendered bold; a longer one is prose, glued plain.
BOLD_MAX_WORDS = 6


def glue_items(key: str, value) -> list[tuple[str, object]]:
    """The ``(name, value)`` pairs :func:`glue_value` glues for ``value`` under ``key`` (no gluing). Raises
    ``TypeError`` for a value of a kind this module has no rule for."""
    from IPython.display import Markdown
    if isinstance(value, Interval):
        return [(f"{key}_{stat}", float(v)) for stat, v in (("mean", value.mean), ("ci_low", value.low),
                                                              ("ci_high", value.high))]
    if isinstance(value, bool):
        return [(key, Markdown("yes" if value else "no"))]
    if isinstance(value, numbers.Real):
        return [(key, float(value) if not isinstance(value, numbers.Integral) else int(value))]
    if isinstance(value, str):
        return [(key, Markdown(f"**{value}**" if len(value.split()) <= BOLD_MAX_WORDS else value))]
    if isinstance(value, (dict, pd.Series)):
        out = [item for k, v in value.items() for item in glue_items(f"{key}_{_slug(k)}", v)]
        if isinstance(value, pd.Series) and pd.api.types.is_numeric_dtype(value) and len(value):
            out += [(f"{key}_min", float(value.min())), (f"{key}_max", float(value.max()))]
        return out
    if isinstance(value, pd.DataFrame):
        return summary_items(key.rsplit("_", 1)[0], value)
    raise TypeError(f"glue_value: cannot glue {type(value).__name__} under {key!r}")


def glue_value(key: str, value) -> None:
    """Glue one value under ``key`` by the rules of this module."""
    from myst_nb import glue
    for name, v in glue_items(key, value):
        glue(name, v, display=False)


def glue_findings(prefix: str, findings, plain=()) -> None:
    """Glue every field of the dataclass ``findings`` as ``<prefix>_<field>``; ``plain``: fields glued plain, not bold.

    Raises ``TypeError`` if ``findings`` is not a dataclass, and ``ValueError`` naming the names and fields if two
    fields would glue the same name (a Series ``x``'s ``x_max`` beside a field ``x_max``).
    """
    if not dataclasses.is_dataclass(findings):
        raise TypeError(f"glue_findings needs a findings dataclass, got {type(findings).__name__}")
    items, owner, clashes = [], {}, []
    for f in dataclasses.fields(findings):
        for name, v in glue_items(f"{prefix}_{f.name}", getattr(findings, f.name)):
            if name in owner:
                clashes.append(f"{name} (fields {owner[name]!r} and {f.name!r})")
            owner.setdefault(name, f.name)
            items.append((name, v))
    if clashes:
        raise ValueError(f"glue_findings: {type(findings).__name__} glues these names twice: {', '.join(clashes)}; "
                         f"rename a field")
    from IPython.display import Markdown
    from myst_nb import glue
    for name, v in items:
        if (owner[name] in plain and isinstance(v, Markdown) and v.data.startswith("**")
                and v.data.endswith("**")):
            v = Markdown(v.data[2:-2])
        glue(name, v, display=False)


#: The columns of a claims table (:func:`bnstudy.study.inference.claims_table`) that :func:`glue_claims` glues.
CLAIM_FIELDS = ("estimate", "low", "high", "n", "p", "p_adjusted", "p_equivalence", "verdict")


def claims_items(prefix: str, claims: pd.DataFrame, clip: tuple | None = None) -> list[tuple[str, object]]:
    """The names and values :func:`glue_claims` glues: per claim ``<prefix>_<key>_<field>`` for :data:`CLAIM_FIELDS`,
    the verdict bold; interval ends cut to ``clip`` (``(low, high)``). Raises ``ValueError`` if ``claims`` is not a
    claims table or ``clip`` is not ``(low, high)`` with low <= high."""
    from IPython.display import Markdown

    if clip is not None and not (len(clip) == 2 and clip[0] <= clip[1]):
        raise ValueError(f"glue_claims: clip must be (low, high) with low <= high, got {clip!r}")
    if not isinstance(claims, pd.DataFrame):
        raise ValueError(f"glue_claims needs a claims table (a DataFrame), got {type(claims).__name__}")
    missing = [c for c in ("key",) + CLAIM_FIELDS if c not in claims.columns]
    if missing:
        raise ValueError(f"glue_claims needs a claims table (bnstudy.study.inference.claims_table); missing {missing}")
    out = []
    for r in claims.itertuples(index=False):
        for f in CLAIM_FIELDS:
            v = getattr(r, f)
            if f == "verdict":
                out.append((f"{prefix}_{r.key}_verdict", Markdown(f"**{v}**")))
                continue
            if clip is not None and f in ("low", "high") and v == v:
                v = min(max(float(v), clip[0]), clip[1])
            out.append((f"{prefix}_{r.key}_{f}", int(v) if f == "n" else float(v)))
    return out


def glue_claims(prefix: str, claims: pd.DataFrame, clip: tuple | None = None) -> None:
    """Glue a claims table by key (:func:`claims_items`)."""
    from myst_nb import glue
    for name, v in claims_items(prefix, claims, clip):
        glue(name, v, display=False)


def numbers_items(prefix: str, numbers: pd.DataFrame) -> list[tuple[str, object]]:
    """The names and values :func:`glue_numbers` glues: per row of a numbers table an interval (ends cut to the row's
    ``lowest`` / ``highest``) or a value, under ``<prefix>_<key>`` by :func:`glue_items`' rules. Raises
    ``ValueError`` if it is no numbers table, or naming the rows if two would glue one name."""
    from .inference import NUMBER_COLUMNS
    if not isinstance(numbers, pd.DataFrame) or set(NUMBER_COLUMNS) - set(numbers.columns):
        raise ValueError(f"glue_numbers needs a numbers table (bnstudy.study.inference.numbers_table, columns "
                         f"{list(NUMBER_COLUMNS)}), got {type(numbers).__name__}")
    out, owner, clashes = [], {}, []
    for r in numbers.itertuples(index=False):
        if r.n == r.n:
            iv = Interval(float(r.value), float(r.low), float(r.high), int(r.n)).clipped(r.lowest, r.highest)
            items = glue_items(f"{prefix}_{r.key}", iv)
        else:
            items = glue_items(f"{prefix}_{r.key}", r.value)
        for name, v in items:
            if name in owner:
                clashes.append(f"{name} (rows {owner[name]!r} and {r.key!r})")
            owner.setdefault(name, r.key)
            out.append((name, v))
    if clashes:
        raise ValueError(f"glue_numbers: these names would be glued twice: {', '.join(clashes)}; rename a row")
    return out


def glue_numbers(prefix: str, numbers: pd.DataFrame) -> None:
    """Glue a numbers table by derived keys (:func:`numbers_items`)."""
    from myst_nb import glue
    for name, v in numbers_items(prefix, numbers):
        glue(name, v, display=False)


def glue_chapter(prefix: str, claims: pd.DataFrame, numbers: pd.DataFrame, words: dict | None = None,
                 clip: tuple | None = None) -> None:
    """Glue a chapter's claims (:func:`claims_items`), numbers (:func:`numbers_items`) and sentences ``words``
    (``{name: Markdown}`` as ``<prefix>_<name>``). Raises ``ValueError`` if two of them would glue one name."""
    from IPython.display import Markdown
    from myst_nb import glue
    items = claims_items(prefix, claims, clip) + numbers_items(prefix, numbers) + \
        [(f"{prefix}_{k}", Markdown(v)) for k, v in (words or {}).items()]
    dup = sorted(n for n, count in Counter(n for n, _ in items).items() if count > 1)
    if dup:
        raise ValueError(f"glue_chapter: names glued twice (claims, numbers, words): {dup}")
    for name, v in items:
        glue(name, v, display=False)


def summary_items(prefix: str, summary: pd.DataFrame) -> list[tuple[str, float]]:
    """``(name, value)`` of a long summary (``group, metric, mean, ci_low, ci_high``): ``<prefix>_<metric>_<group>_<stat>``."""
    group = [c for c in summary.columns if c not in ("metric", "mean", "ci_low", "ci_high", "n_seeds")]
    if len(group) != 1:
        raise ValueError(f"a summary needs exactly one grouping column, got {group}")
    return [(f"{prefix}_{r['metric']}_{_slug(r[group[0]])}_{stat}", float(r[stat]))
            for _, r in summary.iterrows() for stat in ("mean", "ci_low", "ci_high")]


def _extra_text(name: str, value) -> str:
    """One ``extra`` entry of the run line: ``rows_from`` in words; anything else as ``, name=value``."""
    if name == "rows_from" and isinstance(value, dict):
        when = str(value.get("written") or "an unrecorded time").replace("T", " ").replace("+00:00", " UTC")
        w = value.get("workers")
        ran = f"{w} worker process{'es' if w != 1 else ''}" if w else "worker count not recorded"
        from .report import release_text
        rel = release_text(value.get("release"))
        return (f", analysing the rows{' of the ' + rel if rel else ''} computed by the run at git commit "
                f"{value.get('git_commit')} ({ran}; tables written {when}, main table sha256 {value.get('sha256')}...)")
    return f", {name}={value}"


def run_line(config, execution=None, width: int = 78, extra: dict | None = None) -> str:
    """The page's "Ran with" line for a chapter ``config`` (:func:`bnstudy.study.report.describe_run` of its
    ``describe()``), wrapped to ``width``; records the config's fields and ``extra`` for the tables' sidecars."""
    import torch

    from .config import Execution
    from .report import describe_run
    ex = execution or Execution()
    jobs = ex.n_jobs or (1 if torch.cuda.is_available() else (os.cpu_count() or 1))  # as run_sweep resolves it
    extra = dict(extra or {})
    # analysed rows: the worker count that matters is the run's (in rows_from), not this execution's
    workers = "" if "rows_from" in extra else f", {jobs} worker process{'es' if jobs != 1 else ''}"
    text = config.describe() + workers + "".join(_extra_text(k, v) for k, v in extra.items())
    return describe_run(text, {**config.asdict(), **extra, **({} if "rows_from" in extra else {"workers": jobs})},
                        width, run_threads=ex.threads)


# --- single values, Markdown and tables (moved from bnstudy.study.report: no import cycle) ---

def glue_number(key: str, value) -> float:
    """Glue ``value`` as a Python float under ``key`` (for ``{glue:text}`key:.3f```)."""
    from myst_nb import glue
    value = float(value)
    glue(key, value, display=False)
    return value


def glue_md(key: str, text: str) -> str:
    """Glue Markdown ``text`` under ``key`` (for ``{glue:md}`key```)."""
    from IPython.display import Markdown
    from myst_nb import glue
    glue(key, Markdown(text), display=False)
    return text


def glue_table(key: str, table: pd.DataFrame) -> pd.DataFrame:
    """Glue a DataFrame for a ``{glue:figure}`` the book numbers as a *table* (label it ``tbl-chNN-...``); cells are
    never cut. Returns ``table``."""
    from myst_nb import glue
    with pd.option_context("display.max_colwidth", None):
        glue(key, table, display=False)
    return table


def glue_p_texts(prefix: str, p_values: dict) -> None:
    """Glue each ``{name: p}`` as ``<prefix>_<name>``: :func:`p_text` as plain Markdown, for ``{glue:md}``."""
    from IPython.display import Markdown
    from myst_nb import glue

    from .report import p_text
    for name, p in p_values.items():
        glue(f"{prefix}_{name}", Markdown(p_text(p)), display=False)


def glue_values(prefix: str, values: dict) -> None:
    """Glue each ``{name: value}`` of ``values`` as ``<prefix>_<name>`` by :func:`glue_value`."""
    for name, v in values.items():
        glue_value(f"{prefix}_{name}", v)
