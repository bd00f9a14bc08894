"""Glue a chapter's findings into its page: every field of a findings dataclass, by a fixed naming rule.

:func:`glue_findings` walks a findings object (see each experiment module's ``findings``)
and glues every value under ``<prefix>_<field>`` so that prose can cite it:

* numbers: ``{glue:text}`ch01_chance:.2f```;
* verdict words and other text: ``{glue:md}`ch01_f2_chance``` (rendered bold);
* booleans: ``yes`` / ``no`` (as text, for ``{glue:md}``);
* intervals (:class:`bnstudy.analysis.Interval`): ``<key>_mean``, ``<key>_ci_low``, ``<key>_ci_high``;
* dicts and :class:`pandas.Series`: one key per entry, ``<key>_<entry>`` (entry names slugged),
  plus ``<key>_min`` / ``<key>_max`` for numeric series;
* a long summary table with columns ``metric, mean, ci_low, ci_high`` and one grouping column:
  ``<prefix>_<metric>_<group>_<stat>``.

Nothing here decides anything: the values come from the tested findings functions.
"""

from __future__ import annotations

import dataclasses
import numbers
import re

import pandas as pd

from .analysis import Interval


def _slug(v) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", str(v)).strip("_").lower()


def glue_value(key: str, value) -> None:
    """Glue one value under ``key`` by the rules of this module."""
    from IPython.display import Markdown
    from myst_nb import glue
    if isinstance(value, Interval):
        for stat, v in (("mean", value.mean), ("ci_low", value.low), ("ci_high", value.high)):
            glue(f"{key}_{stat}", float(v), display=False)
    elif isinstance(value, bool):
        glue(key, Markdown("yes" if value else "no"), display=False)
    elif isinstance(value, numbers.Real):
        glue(key, float(value) if not isinstance(value, numbers.Integral) else int(value), display=False)
    elif isinstance(value, str):
        glue(key, Markdown(f"**{value}**"), display=False)
    elif isinstance(value, dict):
        for k, v in value.items():
            glue_value(f"{key}_{_slug(k)}", v)
    elif isinstance(value, pd.Series):
        for k, v in value.items():
            glue_value(f"{key}_{_slug(k)}", v)
        if pd.api.types.is_numeric_dtype(value) and len(value):
            glue(f"{key}_min", float(value.min()), display=False)
            glue(f"{key}_max", float(value.max()), display=False)
    elif isinstance(value, pd.DataFrame):
        glue_summary(key.rsplit("_", 1)[0], value)
    else:
        raise TypeError(f"glue_value: cannot glue {type(value).__name__} under {key!r}")


def glue_summary(prefix: str, summary: pd.DataFrame) -> None:
    """Glue a long summary (``group, metric, mean, ci_low, ci_high``) as ``<prefix>_<metric>_<group>_<stat>``."""
    from myst_nb import glue
    group = [c for c in summary.columns if c not in ("metric", "mean", "ci_low", "ci_high", "n_seeds")]
    if len(group) != 1:
        raise ValueError(f"glue_summary needs exactly one grouping column, got {group}")
    for _, r in summary.iterrows():
        for stat in ("mean", "ci_low", "ci_high"):
            glue(f"{prefix}_{r['metric']}_{_slug(r[group[0]])}_{stat}", float(r[stat]), display=False)


def glue_findings(prefix: str, findings) -> None:
    """Glue every field of the dataclass ``findings`` as ``<prefix>_<field>`` (see the module docstring)."""
    if not dataclasses.is_dataclass(findings):
        raise TypeError(f"glue_findings needs a findings dataclass, got {type(findings).__name__}")
    for f in dataclasses.fields(findings):
        glue_value(f"{prefix}_{f.name}", getattr(findings, f.name))


def run_line(config, execution=None, width: int = 78) -> str:
    """The page's "Ran with" line for a chapter ``config`` (its ``describe()``), then the git commit,
    device, torch and the threads each run used (``execution.threads``, default 1); wrapped to ``width``.
    Also records the config's fields for the JSON sidecars of the chapter's tables."""
    from .config import Execution
    from .report import describe_run
    ex = execution or Execution()
    return describe_run(config.describe(), config.asdict(), width, run_threads=ex.threads)
