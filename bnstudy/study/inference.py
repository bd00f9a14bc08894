"""The book's statistical inference, in one place: paired differences, t intervals, family corrections,
equivalence, one-sided tests, bootstrap intervals, rank correlation, and the one verdict vocabulary.

Every chapter's findings use these functions and no others, so the same numbers get the same verdict on
every page. The conventions, decided once (the glossary page, ``book/glossary.md``, states them for readers):

* **Replications are seeds.** Within a seed every condition sees the same data stream and head init, so a
  comparison is the per-seed difference ``condition - reference`` (:func:`paired_differences`). Missing
  data: a seed enters a comparison only if both conditions have a finite value; the others are dropped and
  ``n`` says how many remain.
* **Intervals** are Student's t intervals of the mean (:func:`t_interval`, on
  :meth:`scipy.stats.ttest_1samp`'s ``confidence_interval``).
* **Families.** ``m`` comparisons printed together are one family (:class:`Family`): their printed intervals
  are Bonferroni intervals at confidence ``1 - alpha/m``, and their equivalence tests run at ``alpha/m``.
* **One verdict per claim.** A claim's verdict is read off its printed family interval (:func:`decide`), and
  every count ("k of m cells show a direction", "k of m conditions below the line") counts those printed
  verdicts (:func:`count_kinds`, :func:`count_verdicts`, :func:`count_one_sided`), so a cell never reads
  "higher" in a count and "not decided" in its table or figure. Holm's step-down adjusted p-values
  (:func:`holm`, on ``statsmodels.stats.multitest.multipletests``) are still reported beside a p-value, as a
  p-value only: they decide nothing.
* **Equivalence** is the two one-sided tests (TOST; Schuirmann 1987) against ``±margin`` at level ``alpha``
  (:func:`tost_p`, on ``statsmodels.stats.weightstats.DescrStatsW.ttost_mean``): equivalent exactly when the
  ``1 - 2 alpha`` t interval lies inside ``(-margin, margin)``.
* **One-sided tests** are one-sided t tests (``scipy.stats.ttest_1samp(alternative=...)``), never a halved or
  doubled two-sided p.
* **Degenerate samples.** Fewer than two values: no interval, no test, verdict "too few seeds". Zero spread
  (every seed the same difference ``d``): the interval is ``[d, d]``, the two-sided p is 0 when ``d != 0``
  and 1 when ``d == 0``, and the TOST p is 0 when ``|d| < margin``, else 1 (scipy and statsmodels return NaN
  or warn there; these are the limits as the spread goes to 0).

The verdict vocabulary (:data:`VERDICT_KINDS`, :func:`decide`): a direction shown (``"<higher word>"`` or
``"<lower word>"``, e.g. "pinned lower": the family interval excludes zero), ``"equivalent within ±m"``
(TOST at the family level, when no direction is shown), ``"not decided"`` (neither), ``"too few seeds"``
(fewer than two values), and for identities of the code, which are checks and not findings,
``"exact, checked =="`` / ``"not exact"`` (:func:`exact_check`). A direction takes precedence over
equivalence: an effect can be shown and still be smaller than the margin, and the printed estimate says how
large it is.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import string
import warnings
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

__all__ = [
    "Interval", "Family", "Claim", "VERDICT_KINDS", "paired_differences", "t_interval", "two_sided_p",
    "one_sided_p", "tost_p", "holm", "bootstrap_interval", "rank_correlation", "decide", "exact_check",
    "claims_table", "is_verdict", "equivalent_text", "decide_interval", "bootstrap_distribution",
    "percentile_interval", "intersection_union_p", "at_resolution", "MIN_BOOTSTRAP_UNITS", "count_verdicts",
]

#: Every verdict kind a page may print (:func:`decide`, :func:`exact_check`), in the glossary's order.
VERDICT_KINDS = ("higher", "lower", "equivalent", "not decided", "too few seeds", "exact", "not exact")
NOT_DECIDED = "not decided"
TOO_FEW = "too few seeds"
EXACT = "exact, checked =="
NOT_EXACT = "not exact"
MIN_N = 2
#: The fewest resampling units (seeds) a bootstrap interval is computed from (:func:`bootstrap_interval`,
#: :func:`percentile_interval` callers): two seeds have 3 distinct resamples and three 10, too few for a
#: percentile interval to mean anything; as for a rank correlation (:func:`rank_correlation` needs 4 pairs).
MIN_BOOTSTRAP_UNITS = 4


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values (seeds) and its ``confidence`` interval ``[low, high]``; ``low``/``high`` are
    NaN when ``n < 2``. Unpacks as ``(mean, low, high)``."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies entirely above or below zero (False when there is no interval)."""
        return bool(self.low > 0 or self.high < 0)

    def clipped(self, low: float, high: float) -> "Interval":
        """The interval cut to what the quantity allows (e.g. ``-1, 1`` for a difference of accuracies):
        for printing; tests use the unclipped one."""
        c = lambda v: v if math.isnan(v) else min(max(v, low), high)  # noqa: E731
        return dataclasses.replace(self, low=c(self.low), high=c(self.high))

    def __iter__(self):
        return iter((self.mean, self.low, self.high))


@dataclasses.dataclass(frozen=True)
class Family:
    """``m`` comparisons printed together, at overall level ``alpha``: Bonferroni intervals at
    :attr:`confidence` ``= 1 - alpha/m`` and equivalence tests at :attr:`level` ``= alpha/m``.

    Raises ``ValueError`` for ``m < 1`` or ``alpha`` outside (0, 0.5)."""

    m: int = 1
    alpha: float = 0.05

    def __post_init__(self):
        if int(self.m) != self.m or self.m < 1:
            raise ValueError(f"Family: m must be a positive integer (the number of comparisons), got {self.m!r}")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"Family: alpha must be in (0, 0.5), got {self.alpha!r}")

    @property
    def confidence(self) -> float:
        return 1 - self.alpha / self.m

    @property
    def level(self) -> float:
        return self.alpha / self.m


def _ttest(v: np.ndarray, null: float = 0.0, alternative: str = "two-sided"):
    """``scipy.stats.ttest_1samp`` without its "catastrophic cancellation" RuntimeWarning: differences that
    agree to ~1e-16 (float noise around an exact tie) are valid data, and a page must not print a warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Precision loss occurred in moment calculation",
                                category=RuntimeWarning)
        return sps.ttest_1samp(v, null, alternative=alternative)


def _values(values) -> np.ndarray:
    v = np.asarray(values, dtype=float).ravel()
    return v[np.isfinite(v)]


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def paired_differences(df: pd.DataFrame, value: str, column: str, condition, reference, on="seed"
                       ) -> pd.Series:
    """Per-``on`` (per-seed) difference ``value[column == condition] - value[column == reference]``, indexed
    by ``on``: the paired design's comparison. ``on``: a column, or a list of columns that together name a
    pair (e.g. ``["seed", "strength"]``). A seed missing either condition, or with a non-finite value, is left
    out (the one missing-data rule); duplicate ``(on, column)`` rows raise.

    Raises ``KeyError`` naming a missing column and ``ValueError`` if ``condition`` or ``reference`` never
    occurs in ``column`` or a seed has two rows of one condition."""
    on_cols = [on] if isinstance(on, str) else list(on)
    for c in (value, column, *on_cols):
        if c not in df.columns:
            raise KeyError(f"paired_differences: no column {c!r}; columns: {list(df.columns)}")
    present = set(df[column].unique())
    for name, x in (("condition", condition), ("reference", reference)):
        if x not in present:
            raise ValueError(f"paired_differences: {name} {x!r} does not occur in column {column!r} "
                             f"(values: {sorted(map(str, present))})")
    sub = df[df[column].isin([condition, reference])]
    if sub.duplicated([*on_cols, column]).any():
        raise ValueError(f"paired_differences: more than one row per ({on}, {column}); select the cell first")
    piv = sub.pivot(index=on, columns=column, values=value).astype(float)
    d = piv[condition] - piv[reference]
    return d[np.isfinite(d)].rename(f"{condition} - {reference}")


def t_interval(values, confidence: float = 0.95) -> Interval:
    """Mean and Student's t interval of ``values`` (one per seed; NaN dropped), on
    ``scipy.stats.ttest_1samp(values, 0).confidence_interval(confidence)``. Zero spread gives ``[mean,
    mean]``; fewer than two values give NaN ends.

    Raises ``ValueError`` for ``confidence`` outside (0, 1)."""
    _check_confidence(confidence)
    v = _values(values)
    if v.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, confidence)
    m = float(v.mean())
    if v.size < MIN_N:
        return Interval(m, float("nan"), float("nan"), int(v.size), confidence)
    if np.ptp(v) == 0:
        return Interval(m, m, m, int(v.size), confidence)
    ci = _ttest(v).confidence_interval(confidence)
    return Interval(m, float(ci.low), float(ci.high), int(v.size), confidence)


def two_sided_p(values) -> float:
    """Two-sided one-sample t test p-value of mean 0 (``scipy.stats.ttest_1samp``); NaN for fewer than two
    values, 0 or 1 for zero spread (mean != 0 or == 0)."""
    v = _values(values)
    if v.size < MIN_N:
        return float("nan")
    if np.ptp(v) == 0:
        return 0.0 if v[0] != 0 else 1.0
    return float(_ttest(v).pvalue)


def one_sided_p(values, alternative: str, null: float = 0.0) -> float:
    """One-sided one-sample t test p-value (``scipy.stats.ttest_1samp(values, null, alternative=...)``):
    ``alternative="greater"`` tests mean > ``null``, ``"less"`` mean < ``null``. NaN for fewer than two
    values; for zero spread 0 if the constant lies on the alternative's side, else 1.

    Raises ``ValueError`` for another ``alternative``."""
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    v = _values(values)
    if v.size < MIN_N:
        return float("nan")
    if np.ptp(v) == 0:
        side = v[0] > null if alternative == "greater" else v[0] < null
        return 0.0 if side else 1.0
    return float(_ttest(v, null, alternative).pvalue)


def tost_p(values, margin: float) -> float:
    """The TOST p-value for equivalence of the mean to 0 within ``(-margin, margin)`` (Schuirmann 1987; the
    larger of the two one-sided t tests' p-values, ``statsmodels`` ``DescrStatsW.ttost_mean(-margin,
    margin)``). Equivalent at level ``alpha`` when it is below ``alpha``. NaN for fewer than two values; for
    zero spread 0 if ``|constant| < margin``, else 1.

    Raises ``ValueError`` for a margin that is not positive."""
    if not margin > 0:
        raise ValueError(f"margin must be positive (the equivalence bound), got {margin!r}")
    v = _values(values)
    if v.size < MIN_N:
        return float("nan")
    if np.ptp(v) == 0:
        return 0.0 if abs(v[0]) < margin else 1.0
    from statsmodels.stats.weightstats import DescrStatsW

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        return float(DescrStatsW(v).ttost_mean(-margin, margin)[0])


def holm(pvalues) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values in the order given, on
    ``statsmodels.stats.multitest.multipletests(method="holm")``. NaN entries (comparisons with too few
    seeds) are not members of the family and stay NaN. ``pvalues``: a 1-D sequence.

    The adjusted values are statsmodels' (0.15) ``holm`` branch operation for operation (the same ``argsort``,
    products, running maximum, clip at 1 and unsort), so they are equal to ``multipletests``' bit for bit
    (tests/test_inference.py checks ``==`` on random families). It is inlined because ``multipletests`` ends
    its ``holm`` branch with ``gc.collect()``: a quarter of a second per call in a process holding torch and
    pandas, and most of a findings call's time."""
    p = np.asarray(pvalues, dtype=float).ravel()
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        pvals = p[ok]
        sortind = np.argsort(pvals)
        pvals = np.take(pvals, sortind)
        adjusted = np.maximum.accumulate(pvals * np.arange(len(pvals), 0, -1))
        adjusted[adjusted > 1] = 1
        unsorted = np.empty_like(adjusted)
        unsorted[sortind] = adjusted
        out[ok] = unsorted
    return out


def bootstrap_interval(data: Sequence, statistic: Callable, confidence: float = 0.95, n_resamples: int = 2000,
                       seed: int = 0, method: str = "percentile", min_units: int = MIN_BOOTSTRAP_UNITS) -> Interval:
    """A bootstrap interval of ``statistic`` over seeds (``scipy.stats.bootstrap``, paired resampling: the
    same seeds are drawn for every array in ``data``). ``data``: a tuple of equal-length 1-D arrays (one
    value per seed each); ``statistic(*arrays) -> float``. Seeded, so the interval is reproducible. The
    interval's ``mean`` is the statistic on the full sample. NaN ends for fewer than ``min_units`` seeds
    (:data:`MIN_BOOTSTRAP_UNITS`, 4) or a statistic that is constant over resamples.

    Raises ``ValueError`` for arrays of unequal length or ``confidence`` outside (0, 1)."""
    _check_confidence(confidence)
    arrays = tuple(np.asarray(a, dtype=float) for a in data)
    if len({len(a) for a in arrays}) != 1:
        raise ValueError(f"bootstrap_interval: data arrays differ in length: {[len(a) for a in arrays]}")
    n = len(arrays[0])
    est = float(statistic(*arrays)) if n else float("nan")
    if n < max(min_units, MIN_N):
        return Interval(est, float("nan"), float("nan"), n, confidence)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate resample distribution: NaN ends, reported as such
        res = sps.bootstrap(arrays, lambda *a: statistic(*a), paired=True, vectorized=False,
                            confidence_level=confidence, n_resamples=n_resamples, method=method,
                            rng=np.random.default_rng(seed))
    return Interval(est, float(res.confidence_interval.low), float(res.confidence_interval.high), n, confidence)


def bootstrap_distribution(n_units: int, statistic: Callable, n_resamples: int = 2000, seed: int = 0) -> np.ndarray:
    """The seeded bootstrap distribution over whole units (seeds) of ``statistic(idx)``, where ``idx`` is an int
    array of ``n_units`` resampled unit indices, drawn by ``scipy.stats.bootstrap`` exactly as
    :func:`bootstrap_interval` draws it (same generator, ``numpy.random.default_rng(seed)``). Shape
    ``(n_resamples,)`` for a scalar statistic, ``(k, n_resamples)`` for one returning ``k`` values: for what an
    interval alone does not give (the share of resamples with a property; several statistics on the same
    resamples). Pair with :func:`percentile_interval`.

    Raises ``ValueError`` for ``n_units < 1`` or ``n_resamples < 1``."""
    if int(n_units) != n_units or n_units < 1:
        raise ValueError(f"bootstrap_distribution: n_units must be a positive integer, got {n_units!r}")
    if int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"bootstrap_distribution: n_resamples must be a positive integer, got {n_resamples!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sps.bootstrap((np.arange(n_units, dtype=float),), lambda i: statistic(i.astype(int)), paired=True,
                            vectorized=False, n_resamples=int(n_resamples), method="percentile",
                            rng=np.random.default_rng(seed))
    return np.asarray(res.bootstrap_distribution, float)


def percentile_interval(distribution, confidence: float = 0.95, method: str = "linear") -> tuple[float, float]:
    """The ``confidence`` percentile interval ``(low, high)`` of a bootstrap distribution (1-D; NaN entries,
    resamples where the statistic is undefined, ignored; ``(nan, nan)`` if none is left), by
    ``numpy.quantile(..., method=method)``.

    Raises ``ValueError`` for ``confidence`` outside (0, 1)."""
    _check_confidence(confidence)
    v = np.asarray(distribution, float).ravel()
    v = v[~np.isnan(v)]
    if not len(v):
        return float("nan"), float("nan")
    a = (1 - confidence) / 2
    lo, hi = np.quantile(v, [a, 1 - a], method=method)
    return float(lo), float(hi)


def intersection_union_p(pvalues) -> float:
    """The p-value of an intersection-union test (Berger 1982): a claim that holds only if *every* component
    claim holds (e.g. "every batch from b on loses less than the tolerance") is shown at level ``alpha`` when
    every component test is, so its p-value is the largest component p. No multiplicity correction is needed
    among the components. NaN if any component p is NaN (a component with too few seeds cannot be shown) or
    there is none."""
    p = np.asarray(pvalues, dtype=float).ravel()
    if not p.size or np.isnan(p).any():
        return float("nan")
    return float(p.max())


def at_resolution(values, decimals: int = 12) -> np.ndarray:
    """``values`` rounded to ``decimals`` decimals: the documented float tolerance for differences of quantities
    measured on a grid (accuracies are counts over a test set: ``(0.1 + 0.2) - 90/300`` is ``5.6e-17`` in floats, and a
    zero-spread sample of such artefacts would otherwise be a "direction shown"). Apply it to differences before
    :func:`decide` when both sides are on a grid coarser than ``10**-decimals``."""
    return np.round(np.asarray(values, dtype=float), decimals)


def rank_correlation(x, y, confidence: float = 0.95) -> tuple[float, Interval, float]:
    """Spearman's rank correlation ``rho`` of paired ``x``, ``y`` (``scipy.stats.spearmanr``; pairs with a
    NaN dropped), its interval by Fisher's z with the standard error ``sqrt(1.06 / (n - 3))`` of Fieller,
    Hartley and Pearson (1957), clipped to [-1, 1], and its two-sided p-value. Returns ``(rho, interval,
    p)``; NaN for fewer than 4 pairs or a constant input.

    Raises ``ValueError`` for inputs of unequal length."""
    _check_confidence(confidence)
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if len(x) != len(y):
        raise ValueError(f"rank_correlation: x and y differ in length ({len(x)} vs {len(y)})")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(x)
    nan = float("nan")
    if n < 4 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return nan, Interval(nan, nan, nan, n, confidence), nan
    res = sps.spearmanr(x, y)
    rho, p = float(res.statistic), float(res.pvalue)
    if abs(rho) == 1:
        return rho, Interval(rho, rho, rho, n, confidence), p
    z, se = math.atanh(rho), math.sqrt(1.06 / (n - 3))
    q = float(sps.norm.ppf((1 + confidence) / 2))
    return rho, Interval(rho, math.tanh(z - q * se), math.tanh(z + q * se), n, confidence), p


def equivalent_text(margin: float) -> str:
    """The equivalence verdict's words: ``"equivalent within ±0.02"`` (``margin`` as given, up to 3
    significant digits)."""
    return f"equivalent within \u00b1{margin:.3g}"


@dataclasses.dataclass(frozen=True)
class Claim:
    """One comparison a page states: its ``key`` (the glue key's stem), the estimate and family interval
    (``low``, ``high``, NaN with too few seeds), ``n`` seeds, the two-sided ``p``, the TOST ``p_equivalence``
    (NaN without a margin), the ``margin``, the family's ``confidence``, the verdict's ``kind`` (one of
    :data:`VERDICT_KINDS`) and its printed ``verdict`` text. ``p_adjusted`` (Holm) is filled in by
    :func:`claims_table`."""

    key: str
    estimate: float
    low: float
    high: float
    n: int
    p: float
    p_equivalence: float
    margin: float
    confidence: float
    kind: str
    verdict: str
    p_adjusted: float = float("nan")

    @property
    def interval(self) -> Interval:
        return Interval(self.estimate, self.low, self.high, self.n, self.confidence)


def decide(values, key: str = "", *, margin: float | None = None, family: Family = Family(),
           higher: str = "higher", lower: str = "lower") -> Claim:
    """The verdict on per-seed differences ``values`` (condition - reference; NaN dropped), in the book's
    one vocabulary, at ``family``'s level:

    1. fewer than 2 values: ``"too few seeds"``;
    2. the family interval (confidence ``family.confidence``) excludes 0: a direction shown, the word
       ``higher`` (interval above 0) or ``lower`` (below), e.g. ``higher="train mode higher"``;
    3. ``margin`` given and the TOST p below ``family.level``: ``"equivalent within ±margin"``;
    4. otherwise ``"not decided"``.

    Raises ``ValueError`` for a non-positive ``margin``."""
    if margin is not None and not margin > 0:
        raise ValueError(f"margin must be positive or None, got {margin!r}")
    v = _values(values)
    iv = t_interval(v, family.confidence)
    p = two_sided_p(v)
    pe = tost_p(v, margin) if margin is not None else float("nan")
    if iv.n < MIN_N:
        kind, text = TOO_FEW, TOO_FEW
    elif iv.low > 0:
        kind, text = "higher", higher
    elif iv.high < 0:
        kind, text = "lower", lower
    elif margin is not None and pe < family.level:
        kind, text = "equivalent", equivalent_text(margin)
    else:
        kind, text = NOT_DECIDED, NOT_DECIDED
    return Claim(key=key, estimate=iv.mean, low=iv.low, high=iv.high, n=iv.n, p=p, p_equivalence=pe,
                 margin=float("nan") if margin is None else float(margin), confidence=family.confidence,
                 kind=kind, verdict=text)


def decide_interval(iv: Interval, key: str = "", *, p: float = float("nan"), higher: str = "higher",
                    lower: str = "lower") -> Claim:
    """The verdict on an interval that is not a t interval of per-seed values (a rank correlation's Fisher-z
    interval, a bootstrap interval), by :func:`decide`'s rule: a direction where ``iv`` excludes 0 (``higher``
    above, ``lower`` below), ``"not decided"`` where it spans 0, ``"too few seeds"`` where it has no ends (NaN).
    ``p``: the interval's two-sided p-value if it has one (a bootstrap has none: NaN, so it is not a member of
    a Holm family in :func:`claims_table`). No equivalence verdict: that needs TOST on per-seed values."""
    if math.isnan(iv.low) or math.isnan(iv.high):
        kind, text = TOO_FEW, TOO_FEW
    elif iv.low > 0:
        kind, text = "higher", higher
    elif iv.high < 0:
        kind, text = "lower", lower
    else:
        kind, text = NOT_DECIDED, NOT_DECIDED
    nan = float("nan")
    return Claim(key=key, estimate=iv.mean, low=iv.low, high=iv.high, n=iv.n, p=float(p), p_equivalence=nan,
                 margin=nan, confidence=iv.confidence, kind=kind, verdict=text)


def exact_check(values, expected: float = 0.0, key: str = "") -> Claim:
    """An identity of the code checked with ``==`` (e.g. a pinned backbone's buffers change by exactly 0):
    ``"exact, checked =="`` when every value equals ``expected``, else ``"not exact"``; the estimate is the
    largest ``|value - expected|``; with no values at all, nothing was checked: ``"too few seeds"`` (never a
    failed check). Not a finding: the page states it as a check."""
    v = np.asarray(values, dtype=float).ravel()
    dev = float(np.max(np.abs(v - expected))) if v.size else float("nan")
    ok = bool(v.size) and bool(np.all(v == expected))
    nan = float("nan")
    kind, verdict = ("exact", EXACT) if ok else ("not exact", NOT_EXACT) if v.size else (TOO_FEW, TOO_FEW)
    return Claim(key=key, estimate=dev, low=nan, high=nan, n=int(v.size), p=nan, p_equivalence=nan, margin=nan,
                 confidence=nan, kind=kind, verdict=verdict)


def claims_table(claims: Iterable[Claim], family: str | None = None) -> pd.DataFrame:
    """The claims as a table (one row per :class:`Claim`: ``key, estimate, low, high, n, p, p_adjusted,
    p_equivalence, margin, confidence, kind, verdict``), ``p_adjusted`` Holm over the claims given (one
    family; NaN p-values, from too few seeds or exact checks, are not members). ``family``: a name for the
    family, put in a first column ``family`` (tables of several families are concatenated from one call each).

    Raises ``ValueError`` on a duplicate key."""
    rows = [dataclasses.asdict(c) for c in claims]
    cols = [f.name for f in dataclasses.fields(Claim)]
    df = pd.DataFrame(rows, columns=cols)
    if df["key"].duplicated().any():
        raise ValueError(f"claims_table: duplicate keys {sorted(df.loc[df['key'].duplicated(), 'key'])}")
    df["p_adjusted"] = holm(df["p"].to_numpy(dtype=float))
    order = ["key", "estimate", "low", "high", "n", "p", "p_adjusted", "p_equivalence", "margin", "confidence",
             "kind", "verdict"]
    df = df[order]
    if family is not None:
        df.insert(0, "family", family)
    return df


def count_kinds(table: pd.DataFrame, alpha: float = 0.05) -> pd.Series:
    """The kind each row of a claims table (:func:`claims_table`) counts as in the book's counts (index as
    ``table``): its printed kind, the verdict its family interval earned (:func:`decide`). One verdict per claim:
    a count never shows a direction that the row's printed interval does not (Holm's ``p_adjusted`` decides
    nothing). ``alpha`` is accepted for the callers' signature and unused: the family's level is already in the
    printed interval.

    Raises ``KeyError`` if ``table`` lacks ``kind``."""
    if "kind" not in table.columns:
        raise KeyError("count_kinds: the claims table has no column 'kind'")
    return pd.Series(list(table["kind"]), index=table.index, dtype=object)


def count_verdicts(table: pd.DataFrame, alpha: float = 0.05) -> dict:
    """The book's counts ("k of m cells show a direction") over a claims table (:func:`claims_table`): each row
    counts as its printed verdict (:func:`count_kinds`), so the count and the verdicts it counts always agree.
    Returns ``{kind: count}`` over :data:`VERDICT_KINDS` (zeros included) plus ``"m"``, the rows.

    Raises ``KeyError`` if ``table`` lacks ``kind``; ``ValueError`` on a kind outside :data:`VERDICT_KINDS`."""
    out = dict.fromkeys(VERDICT_KINDS, 0)
    for kind in count_kinds(table, alpha):
        if kind not in out:
            raise ValueError(f"count_verdicts: {kind!r} is not a verdict kind ({VERDICT_KINDS})")
        out[kind] += 1
    out["m"] = len(table)
    return out


def count_one_sided(table: pd.DataFrame, alternative: str, alpha: float = 0.05) -> int:
    """The book's count for a one-sided question ("k of m conditions shown below / above the line") over a
    claims table: the rows whose printed verdict shows that direction (``kind`` ``"lower"`` for
    ``alternative="less"``, ``"higher"`` for ``"greater"``), the same verdicts the table prints (one verdict per
    claim; a one-sided Holm p below ``alpha`` no longer counts a row whose family interval spans zero).

    Raises ``ValueError`` for another ``alternative`` and ``KeyError`` if ``kind`` is missing."""
    if alternative not in ("less", "greater"):
        raise ValueError(f"count_one_sided: alternative must be 'less' or 'greater', got {alternative!r}")
    kind = "lower" if alternative == "less" else "higher"
    return int((count_kinds(table, alpha) == kind).sum())


_EQUIV = re.compile(r"^equivalent within \u00b1\d+(\.\d+)?(e-?\d+)?$")


def is_verdict(text: str, directions: Iterable[str] = ()) -> bool:
    """Whether ``text`` is a word of the verdict vocabulary: ``"not decided"``, ``"too few seeds"``,
    ``"exact, checked =="``, ``"not exact"``, ``"equivalent within ±m"``, or one of the page's declared
    direction words ``directions`` (e.g. ``"pinned lower"``)."""
    return text in (NOT_DECIDED, TOO_FEW, EXACT, NOT_EXACT) or bool(_EQUIV.match(text)) or text in set(directions)


# --- questions as data: a chapter's claims from a declarative list (issue 33) -------------------------------------

#: Level selectors a :class:`Question`'s ``at`` may give instead of a value: resolved over the levels of that
#: column in the whole table the question reads (not after its other selections), so that "the strongest shift"
#: is one level for every claim of a page.
SELECTORS = ("min", "max", "min_positive")


@dataclasses.dataclass(frozen=True)
class Question:
    """One question a chapter asks of its rows, as data; :func:`ask` turns a list of them into a claims table.

    ``key``: the claim key, with ``{column}`` fields filled from the levels of ``each`` (``"gap_k{n_tasks}"``).
    ``condition`` may be a tuple: one claim per condition, its key's ``{condition}`` field filled (a condition
    added to the tuple, the design's list, is asked with no new code).
    A comparison (``exact`` is ``None``): per pair (``pair``, usually the seed), ``value`` of the rows whose
    ``by`` column is ``condition`` minus ``reference_value`` (default ``value``) of those whose ``by`` is
    ``reference``, decided by :func:`decide` at ``margin`` (``None``: no equivalence verdict) in the family of
    every comparison of the :func:`ask` call, the direction worded ``"<words> higher"`` / ``"<words> lower"``
    (``words=""``: ``higher`` / ``lower``). An exact check (``exact`` a number, :func:`exact_check`): the
    selected ``value`` (or, with ``reference``, the paired differences) must equal ``exact`` everywhere.

    ``at``: ``{column: level}`` selecting rows: a level, a tuple of levels, or a selector of :data:`SELECTORS`
    (``"max"``: the table's largest level of that column; ``"min_positive"``: its smallest level above 0, else its
    smallest). ``table``: which table given to :func:`ask` the question reads. ``optional``: a design may lack what
    the question looks at (a level of ``at``, or any row there): it then makes one claim with no values ("too few
    seeds"; the page says there was nothing to check) instead of raising. Raises ``ValueError`` for an
    unknown selector or a key whose fields ``each`` does not name."""

    key: str
    condition: object = None
    reference: object = None
    value: str = "accuracy"
    reference_value: str | None = None
    at: dict = dataclasses.field(default_factory=dict)
    each: tuple = ()
    table: str = "main"
    by: str = "condition"
    pair: tuple = ("seed",)
    margin: float | None = None
    words: str = ""
    exact: float | None = None
    optional: bool = False

    def __post_init__(self):
        for name in ("each", "pair"):  # a single column given as a string: one column, not its letters
            v = getattr(self, name)
            if isinstance(v, str):
                object.__setattr__(self, name, (v,))
            elif not isinstance(v, (tuple, list)):
                raise ValueError(f"Question {self.key!r}: {name} must be a column name or a tuple of them, got {v!r}")
        if not isinstance(self.at, dict):
            raise ValueError(f"Question {self.key!r}: at must be a dict {{column: level}}, got {self.at!r}")
        for col, level in self.at.items():
            if isinstance(level, str) and level.lower().startswith(("min", "max")) and level not in SELECTORS:
                raise ValueError(f"Question {self.key!r}: at[{col!r}]={level!r} is not a selector; allowed: "
                                 f"{list(SELECTORS)}")
            if not (isinstance(level, (str, numbers.Number, bool, tuple, list)) or level is None) or \
                    isinstance(level, (tuple, list)) and any(v in SELECTORS for v in level):
                raise ValueError(f"Question {self.key!r}: at[{col!r}] must be a level, a tuple of levels or one of "
                                 f"{list(SELECTORS)}, got {level!r}")
        try:
            parsed = [f for _, f, _, _ in string.Formatter().parse(self.key) if f is not None]
        except ValueError as e:
            raise ValueError(f"Question {self.key!r}: the key is not a valid format string ({e})") from None
        fields = set(parsed)
        several = isinstance(self.condition, (tuple, list))
        allowed = set(self.each) | ({"condition"} if several else set())
        if fields - allowed:
            raise ValueError(f"Question {self.key!r}: key fields {sorted(fields - allowed)} are not in "
                             f"each={list(self.each)}" + ("" if several else " (nor is condition a tuple)"))
        if several and "condition" not in fields:
            raise ValueError(f"Question {self.key!r}: with several conditions the key needs a {{condition}} field")
        if self.exact is None and (self.condition is None or self.reference is None):
            raise ValueError(f"Question {self.key!r}: a comparison needs condition and reference (or give exact=)")
        if self.margin is not None and not (isinstance(self.margin, numbers.Real) and self.margin > 0):
            raise ValueError(f"Question {self.key!r}: margin must be a positive number or None, got {self.margin!r}")


def _level(table: pd.DataFrame, column: str, level, key: str):
    if isinstance(level, str) and level in SELECTORS:
        levels = sorted(table[column].dropna().unique())
        if not levels:
            raise ValueError(f"ask: question {key!r}: column {column!r} has no levels to take {level!r} of")
        if not all(isinstance(v, numbers.Real) for v in levels):
            raise ValueError(f"ask: question {key!r}: {level!r} needs a numeric column; {column!r} holds "
                             f"{levels[:5]}")
        if level == "min_positive":
            positive = [v for v in levels if v > 0]
            return positive[0] if positive else levels[0]
        return levels[0] if level == "min" else levels[-1]
    present = set(table[column].dropna().unique())
    missing = [v for v in (level if isinstance(level, (tuple, list)) else (level,)) if v not in present]
    if missing and present:  # an empty table has no levels to check against: it asks nothing (too few seeds)
        raise ValueError(f"ask: question {key!r}: {column}={missing[0]!r} does not occur in the table; its levels: "
                         f"{sorted(present, key=str)[:12]}")
    return level


def _select(table: pd.DataFrame, at: dict, key: str) -> pd.DataFrame:
    keep = np.ones(len(table), dtype=bool)
    for col, level in at.items():
        if col not in table.columns:
            raise KeyError(f"ask: question {key!r}: no column {col!r} to select on; columns: {list(table.columns)}")
        level = _level(table, col, level, key)
        keep &= table[col].isin(level).to_numpy() if isinstance(level, (tuple, list)) else \
            (table[col] == level).to_numpy()
    return table[keep]


def _question_values(q: Question, sel: pd.DataFrame, condition, table_rows: int = 1) -> np.ndarray | pd.Series:
    if not len(sel):
        if not table_rows:  # an empty table: nothing to ask, a claim with no values ("too few seeds")
            return np.array([], dtype=float)
        raise ValueError(f"no rows where it looks ({q.at or 'the whole table'})")
    if q.reference is None:
        return sel[q.value].to_numpy(dtype=float)
    ref_value = q.reference_value or q.value
    x = sel[sel[q.by].isin([condition, q.reference])]
    x = x.assign(_v=np.where(x[q.by] == condition, x[q.value], x[ref_value]))
    if not len(x):
        raise ValueError(f"neither {q.by}={condition!r} nor {q.by}={q.reference!r} occurs where it looks "
                         f"({q.at or 'the whole table'})")
    return paired_differences(x, "_v", q.by, condition, q.reference, on=list(q.pair) if len(q.pair) > 1
                              else q.pair[0])


def ask(tables, questions: Iterable[Question], alpha: float = 0.05, family: str | None = None) -> pd.DataFrame:
    """A chapter's claims table (:func:`claims_table`) from its questions as data: every comparison of
    ``questions`` (each :class:`Question` expanded over the levels of its ``each`` columns, in sorted order) is a
    member of one :class:`Family` at ``alpha`` (``m`` = their number: Bonferroni intervals, equivalence at
    ``alpha / m``, Holm-adjusted p), decided by :func:`decide`; the exact checks follow, by
    :func:`exact_check`. ``tables``: a DataFrame (the table ``"main"``) or ``{name: DataFrame}``. ``family``: the
    family's name, put in a first column ``family`` (:func:`claims_table`).

    A new condition or level in the rows needs no code: a question whose ``each`` ranges over it asks it too.
    Raises ``KeyError`` for a table or column the questions name that is missing, ``ValueError`` for a
    condition or reference that never occurs where a question looks (naming the question) or a duplicate key."""
    if not isinstance(tables, (pd.DataFrame, dict)):
        raise TypeError(f"ask: tables must be a DataFrame or {{name: DataFrame}}, got {type(tables).__name__}")
    tables = {"main": tables} if isinstance(tables, pd.DataFrame) else dict(tables)
    comparisons, checks = [], []
    for q in questions:
        if q.table not in tables:
            raise KeyError(f"ask: question {q.key!r} reads table {q.table!r}; tables given: {sorted(tables)}")
        table = tables[q.table]
        if not isinstance(table, pd.DataFrame):
            raise TypeError(f"ask: table {q.table!r} must be a pandas DataFrame, got {type(table).__name__}")
        needed = [q.value, *q.each, *([q.by, *q.pair, q.reference_value or q.value] if q.reference is not None else [])]
        missing = [c for c in dict.fromkeys(needed) if c not in table.columns]
        if missing:
            raise KeyError(f"ask: question {q.key!r} reads columns {missing} that table {q.table!r} lacks; columns: "
                           f"{list(table.columns)}")
        try:
            t = _select(table, q.at, q.key)
        except ValueError:
            if not q.optional:
                raise
            t = table.iloc[:0]
        if q.optional and not len(t):
            (comparisons if q.exact is None else checks).append((q, q.key.format(**dict.fromkeys(q.each, "none")),
                                                                 np.array([], dtype=float)))
            continue
        if q.each and t[list(q.each)].isna().any().any():
            raise ValueError(f"ask: question {q.key!r}: a missing value in {list(q.each)} (each level makes a key)")
        groups = [((), t)] if not q.each else [
            (k if isinstance(k, tuple) else (k,), g) for k, g in t.groupby(list(q.each), sort=True)]
        if not groups and len(table):
            raise ValueError(f"ask: question {q.key!r}: no rows where it looks ({q.at})")
        several = isinstance(q.condition, (tuple, list))
        for cond in (q.condition if several else (q.condition,)):
            for levels, sel in groups:
                fields = {c: (int(v) if float(v).is_integer() else v) if isinstance(v, numbers.Real)
                          and not isinstance(v, (bool, np.bool_)) else v for c, v in zip(q.each, levels)}
                key = q.key.format(**fields, **({"condition": cond} if several else {}))
                try:
                    values = _question_values(q, sel, cond, len(table))
                except ValueError as e:
                    raise ValueError(f"ask: question {key!r}: {e}") from None
                (comparisons if q.exact is None else checks).append((q, key, values))
    fam = Family(max(len(comparisons), 1), alpha)
    words = lambda q: dict(higher=f"{q.words} higher".strip(), lower=f"{q.words} lower".strip())  # noqa: E731
    claims = [decide(v, key, margin=q.margin, family=fam, **words(q)) for q, key, v in comparisons]
    return claims_table(claims + [exact_check(v, q.exact, key) for q, key, v in checks], family=family)


# --- the numbers table: a chapter's descriptive numbers, flat (issue 33: no records) -------------------------------

#: Columns of a numbers table: ``value`` (a number, a bool or a short text; the mean of an interval), ``low`` /
#: ``high`` / ``n`` (an interval's ends and its number of seeds; ``n`` is NaN for a plain value) and ``lowest`` /
#: ``highest``, what the quantity allows (``0, 1`` for an accuracy; the page prints interval ends cut to them).
NUMBER_COLUMNS = ("key", "value", "low", "high", "n", "lowest", "highest")


def _slug(v) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", str(v)).strip("_").lower()


def numbers_table(values: dict, bounds: Callable[[str], tuple] | None = None) -> pd.DataFrame:
    """A flat numbers table (:data:`NUMBER_COLUMNS`) from ``{key: value}``: a value is a number, a bool, a text
    or an :class:`Interval`, or a dict of those, flattened to ``<key>_<entry>`` (entries slugged, as glue keys
    are). ``bounds(key)``: ``(lowest, highest)`` the quantity under that top-level key allows (default
    ``(-inf, inf)``). Raises ``ValueError`` on a key that two entries flatten to, ``TypeError`` on a list."""
    rows, inf = [], float("inf")

    def add(key, v, lo_hi):
        if isinstance(v, dict):
            for k, x in v.items():
                add(f"{key}_{_slug(k)}", x, lo_hi)
        elif isinstance(v, Interval):
            rows.append((key, float(v.mean), float(v.low), float(v.high), v.n, *lo_hi))
        elif isinstance(v, (bool, np.bool_, str)) or isinstance(v, numbers.Real):
            rows.append((key, v.item() if isinstance(v, np.generic) else v, math.nan, math.nan, math.nan, *lo_hi))
        else:
            raise TypeError(f"numbers_table: {key!r} holds a {type(v).__name__} ({v!r}); give a number, a bool, a "
                            f"text, an Interval or a dict of those, one value per key")

    for key, v in values.items():
        if not (isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_]+", key)):
            raise ValueError(f"numbers_table: key {key!r} must be letters, digits and underscores (it becomes a glue "
                             f"key)")
        lo_hi = bounds(key) if bounds else (-inf, inf)
        if not (isinstance(lo_hi, tuple) and len(lo_hi) == 2 and lo_hi[0] <= lo_hi[1]):
            raise ValueError(f"numbers_table: bounds({key!r}) must be (lowest, highest), got {lo_hi!r}")
        add(key, v, lo_hi)
    table = pd.DataFrame(rows, columns=list(NUMBER_COLUMNS))
    table["value"] = pd.Series([r[1] for r in rows], dtype=object)  # ints stay ints (a page prints 3, not 3.0)
    dup = table["key"][table["key"].duplicated()]
    if len(dup):
        raise ValueError(f"numbers_table: keys given twice: {sorted(set(dup))}")
    return table


def number(table: pd.DataFrame, key: str):
    """One entry of a numbers table: its value, or an :class:`Interval` where the row is one. Raises ``KeyError``
    naming the key (and a few of the table's keys) if it is not there."""
    hit = table.index[table["key"] == key]
    if not len(hit):
        raise KeyError(f"number: no {key!r} in the numbers table (keys such as {list(table['key'][:5])})")
    r = table.loc[hit[0]]
    if r["n"] == r["n"]:
        return Interval(float(r["value"]), float(r["low"]), float(r["high"]), int(r["n"]))
    return r["value"]


def with_numbers(table: pd.DataFrame, values: dict) -> pd.DataFrame:
    """A copy of the numbers table with the entries of ``values`` (flattened as :func:`numbers_table` does)
    replacing those of the same key, each keeping its row's ``lowest`` / ``highest``: for tests that flip one
    finding. Raises ``KeyError`` for a key the table does not have."""
    new = numbers_table(values)
    unknown = sorted(set(new["key"]) - set(table["key"]))
    if unknown:
        raise KeyError(f"with_numbers: no {unknown} in the numbers table")
    out = table.copy()
    for r in new.itertuples(index=False):
        i = out.index[out["key"] == r.key][0]
        out.loc[i, ["value", "low", "high", "n"]] = [r.value, r.low, r.high, r.n]
    return out
