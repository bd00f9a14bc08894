"""Intervals and paired effects over seeds: the statistics every chapter's findings use.

Intervals are 95% Student's t intervals over seeds (the seeds are the independent
replications; within a seed the conditions are paired, so comparisons are per-seed
differences). With one value, or all values equal, an interval collapses to the mean.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps


# The one Interval class (bnstudy.inference); this module is being folded into bnstudy.inference (issue 24).
from .inference import Interval  # noqa: E402


def mean_ci(values, confidence: float = 0.95) -> Interval:
    """Mean and Student-t interval of ``values`` (e.g. one value per seed).

    Raises ``ValueError`` for an empty input or a confidence outside (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("mean_ci needs at least one value")
    m = float(v.mean())
    if len(v) < 2 or v.std() == 0:
        return Interval(m, m, m, len(v))
    half = float(sps.sem(v) * sps.t.ppf((1 + confidence) / 2, len(v) - 1))
    return Interval(m, m - half, m + half, len(v))


def summarize(df: pd.DataFrame, by, columns, confidence: float = 0.95) -> pd.DataFrame:
    """Mean and interval over seeds of ``columns`` per group ``by``: a long table with columns
    ``by..., metric, mean, ci_low, ci_high, n_seeds``."""
    recs = []
    by_cols = [by] if isinstance(by, str) else list(by)
    for key, g in df.groupby(by_cols, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        for col in columns:
            iv = mean_ci(g[col], confidence)
            recs.append(dict(zip(by_cols, key), metric=col, mean=iv.mean, ci_low=iv.low, ci_high=iv.high,
                             n_seeds=iv.n))
    return pd.DataFrame(recs)


def paired(df: pd.DataFrame, value: str, column: str, a, b, on="seed") -> pd.Series:
    """Per-``on`` difference ``value[column == a] - value[column == b]`` (a paired design).

    Raises ``ValueError`` if ``a`` or ``b`` is missing for some ``on`` value.
    """
    piv = df.pivot(index=on, columns=column, values=value)
    for x in (a, b):
        if x not in piv.columns or piv[x].isna().any():
            raise ValueError(f"paired: {column}={x!r} is missing for some {on}")
    return piv[a] - piv[b]


def verdict(ok: bool) -> str:
    """The word a chapter prints for a checked claim: ``"holds"`` or ``"does not hold"``."""
    return "holds" if ok else "does not hold"


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given (NaN entries are left out and stay NaN).

    Holm (1979), "A simple sequentially rejective multiple test procedure". ``pvalues``: a 1-D sequence.
    """
    p = np.asarray(pvalues, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    running, k = 0.0, len(order)
    for i, j in enumerate(order):
        running = max(running, min(1.0, (k - i) * p[j]))
        out[j] = running
    return out
