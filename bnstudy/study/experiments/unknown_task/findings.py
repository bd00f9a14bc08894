"""Chapter 6, what is claimed: the tidy tables, the claims table, every router cell's verdict, the findings
records the page glues, and the sentences chosen by the data.

From :func:`.run.run`'s results table: :func:`claims` (the page's comparisons and checks, a claims table
of :mod:`bnstudy.study.inference`), :func:`cell_tests` (every router cell's verdict), :func:`findings` (the descriptive
numbers beside them) and the tidy tables :func:`routing_table`, :func:`accuracy_table`, :func:`gap_table`. Every
interval, test and verdict comes from :mod:`bnstudy.study.inference`; every difference is condition minus the oracle.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ...inference import Family, Interval, Question, _slug, ask, count_verdicts, decide, holm, number, numbers_table, \
    one_sided_p, paired_differences, t_interval
from ...words import Note, claim, claim_text, count_word, counts_text, fmt_level, join, notes, verdict_md
from .run import CONDITIONS, FIRST_STRENGTH_GRID, HARD_ROUTERS, ROUTE_OK, ROUTERS, TASK_NAMES, \
    TEMPERATURE_TRIED_FIRST, TOST_MARGIN, Config

# --- tidy tables ---------------------------------------------------------------------------------------------------

KEYS = ["n_tasks", "strength", "inference_batch", "condition"]
#: Baselines whose accuracy does not depend on the inference batch size (no routing decision): the tidy tables
#: keep them at the smallest inference batch only.
BATCH_FREE = ("train_mode", "pinned")


def seed_means(df: pd.DataFrame) -> pd.DataFrame:
    """Per seed and cell: accuracy and routing accuracy averaged over the tasks (equal-sized evaluation sets).

    A task's missing value (NaN) makes its seed's mean NaN, so the paired comparisons leave that seed out (the
    engine's one missing-data rule) instead of averaging the condition over fewer tasks than its reference.
    Raises ``ValueError`` for a repeated (seed, cell, condition, task) row: a mean would hide it."""
    dup = df.duplicated(["seed"] + KEYS + ["task"])
    if dup.any():
        raise ValueError(f"seed_means: {int(dup.sum())} repeated (seed, {', '.join(KEYS)}, task) rows, e.g. "
                         f"{df.loc[dup, ['seed'] + KEYS + ['task']].iloc[0].to_dict()}; give each run once")
    return (df.groupby(["seed"] + KEYS, sort=False)[["routing_accuracy", "accuracy", "accuracy_routed_head"]]
            .mean(skipna=False).reset_index())


def _drop_batch_duplicates(t: pd.DataFrame) -> pd.DataFrame:
    b1 = t.inference_batch.min()
    return t[~(t.condition.isin(BATCH_FREE) & (t.inference_batch != b1))].reset_index(drop=True)


def routing_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy: ``seed, n_tasks, strength, inference_batch, condition, routing_accuracy`` for the four routers."""
    m = seed_means(df)
    return m[m.condition.isin(ROUTERS)][["seed"] + KEYS + ["routing_accuracy"]].reset_index(drop=True)


def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy: ``seed, n_tasks, strength, inference_batch, condition, accuracy, accuracy_routed_head`` (task means).

    ``train_mode`` and ``pinned`` (:data:`BATCH_FREE`) appear at the smallest inference batch only.
    """
    return _drop_batch_duplicates(seed_means(df)[["seed"] + KEYS + ["accuracy", "accuracy_routed_head"]])


def per_task_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and cell, means over seeds: ``n_tasks, strength, inference_batch, condition, task,
    routing_accuracy, accuracy, accuracy_routed_head, n_seeds`` (baselines at the smallest batch only)."""
    g = df.groupby(KEYS + ["task"], sort=True)
    out = g[["routing_accuracy", "accuracy", "accuracy_routed_head"]].mean()
    out["n_seeds"] = g["seed"].nunique()
    return _drop_batch_duplicates(out.reset_index())


def _diff(sel: pd.DataFrame, cond: str, ref: str, value: str = "accuracy", ref_value: str | None = None
          ) -> pd.Series:
    """Per-seed ``value(cond) - ref_value(ref)`` in one cell's seed means ``sel`` (:func:`bnstudy.study.inference.
    paired_differences`: a seed missing either, or non-finite, is left out)."""
    ref_value = ref_value or value
    x = sel[sel.condition.isin([cond, ref])]
    x = x.assign(_v=np.where(x.condition == cond, x[value], x[ref_value]))
    return paired_differences(x, "_v", "condition", cond, ref)


CELL = ["n_tasks", "strength", "inference_batch"]


def _gap_rows(m: pd.DataFrame, cond: str, ref: str, value: str = "accuracy", ref_value: str | None = None,
              **fixed) -> list[dict]:
    """Per cell of the seed means ``m`` where both occur: mean and 95% t interval of :func:`_diff`."""
    recs = []
    for key, sel in m.groupby(CELL):
        if not {cond, ref} <= set(sel.condition):
            continue
        iv = t_interval(_diff(sel, cond, ref, value, ref_value))
        recs.append(dict(zip(CELL, key), **fixed, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return recs


def gap_table(df: pd.DataFrame, reference: str = "oracle") -> pd.DataFrame:
    """Per cell: mean and 95% interval (Student t over seeds) of ``accuracy(condition) - accuracy(reference)``.

    Columns ``n_tasks, strength, inference_batch, condition, mean, ci_low, ci_high, n_seeds``;
    every condition except ``reference``; ``train_mode`` and ``pinned`` at the smallest inference batch only
    (they make no routing decision).
    """
    m = seed_means(df)
    recs = []
    for cond in [c for c in CONDITIONS if c != reference and c in set(m.condition)]:
        recs += _gap_rows(m, cond, reference, condition=cond)
    return _drop_batch_duplicates(pd.DataFrame(recs))


def routed_head_table(df: pd.DataFrame) -> pd.DataFrame:
    """The fully task-unknown case: per cell, paired ``accuracy_routed_head(router) - accuracy(oracle)``.

    The router picks the bank *and* the head (a misrouted sample is classified by another task's head).
    Columns as :func:`gap_table`, one row per router and cell.
    """
    m = seed_means(df)
    recs = []
    for r in ROUTERS:
        recs += _gap_rows(m, r, "oracle", "accuracy_routed_head", "accuracy", condition=r)
    return pd.DataFrame(recs)


def temperature_table(df: pd.DataFrame) -> pd.DataFrame:
    """The mixture at each temperature in ``df`` (``mixture`` and ``mixture_tau=...`` rows): per
    ``n_tasks, strength, temperature`` at the smallest inference batch, paired ``accuracy(mixture) -
    accuracy(oracle)``: ``mean, ci_low, ci_high, n_seeds``. Raises ``ValueError`` without temperatures."""
    if "temperature" not in df or df["temperature"].isna().all():
        raise ValueError("temperature_table needs mixture rows with a temperature column (run with this version)")
    b1 = df.inference_batch.min()
    d = df[(df.inference_batch == b1) & (df.condition.str.startswith("mixture") | (df.condition == "oracle"))]
    recs = []
    for tau in sorted(d.loc[d.condition.str.startswith("mixture"), "temperature"].unique()):
        sub = d[(d.condition == "oracle") | (d.temperature == tau)].assign(
            condition=lambda x: x.condition.where(x.condition == "oracle", "mixture"))
        recs += _gap_rows(seed_means(sub), "mixture", "oracle", temperature=float(tau))
    return pd.DataFrame(recs)[["n_tasks", "strength", "temperature", "mean", "ci_low", "ci_high", "n_seeds"]]


# --- claims: every verdict of the page, from bnstudy.study.inference ------------------------------------------------------

#: The page's direction words: the direction of *condition minus reference*, and the reference is the oracle (the
#: task's own bank) in every comparison of this page, so "router lower" reads "the router's accuracy is below the
#: oracle's" (:func:`bnstudy.study.inference.decide`'s ``higher`` / ``lower``).
DIRECTIONS = ("router lower", "router higher", "mixture lower", "mixture higher", "train mode lower",
              "train mode higher", "pinned lower", "pinned higher", "routed head lower", "routed head higher")
#: Overall level of every family on the page (:class:`bnstudy.study.inference.Family`).
ALPHA = 0.05


def _words(cond: str) -> dict:
    """The ``higher`` / ``lower`` words of :func:`bnstudy.study.inference.decide` for ``cond`` minus the oracle."""
    w = {"mixture": "mixture", "train_mode": "train mode", "pinned": "pinned", "routed": "routed head"}.get(
        cond, "router")
    return dict(higher=f"{w} higher", lower=f"{w} lower")


def cell_tests(df: pd.DataFrame, margin: float = TOST_MARGIN) -> pd.DataFrame:
    """Every router cell (task count, strength, inference batch, router) against the oracle (task's own head).

    Per cell, the verdict of :func:`bnstudy.study.inference.decide` on the paired per-seed differences
    ``accuracy(router) - accuracy(oracle)`` (tasks averaged within seed), every cell one member of one
    :class:`~bnstudy.study.inference.Family` of ``m`` = the number of cells (Bonferroni intervals, equivalence at
    ``0.05 / m``): ``estimate, low, high`` (the family interval), ``n``, ``p`` (two-sided), ``p_equivalence``
    (TOST at ``margin``), ``confidence``, ``kind``, ``verdict``; the same at ``margin / 2``:
    ``p_equivalence_half``, ``kind_half``, ``verdict_half``. Booleans ``equivalent``, ``equivalent_half``
    (the verdict is equivalence), ``below`` / ``above`` (a direction shown), and ``bound``, the largest absolute
    end of the family interval. Columns ``condition, n_tasks, strength, inference_batch`` first; one row per cell.
    """
    m = seed_means(df)
    diffs = []
    for (k, t, b), sel in m.groupby(CELL):
        for r in [r for r in ROUTERS if r in set(sel.condition)]:
            diffs.append(((r, int(k), float(t), int(b)), _diff(sel, r, "oracle")))
    fam = Family(max(len(diffs), 1), ALPHA)
    recs = []
    for (r, k, t, b), d in diffs:
        c = decide(d, margin=margin, family=fam, **_words(r))
        h = decide(d, margin=margin / 2, family=fam, **_words(r))
        recs.append(dict(condition=r, n_tasks=k, strength=t, inference_batch=b, estimate=c.estimate, low=c.low,
                         high=c.high, n=c.n, p=c.p, p_equivalence=c.p_equivalence,
                         p_equivalence_half=h.p_equivalence, confidence=c.confidence, kind=c.kind,
                         verdict=c.verdict, kind_half=h.kind, verdict_half=h.verdict))
    out = pd.DataFrame(recs)
    # Holm over the cells, for counts (bnstudy.study.inference.count_verdicts: the book's one counts rule)
    out["p_adjusted"] = holm(out["p"].to_numpy(dtype=float)) if len(out) else np.array([], dtype=float)
    out["equivalent"] = out.kind == "equivalent"
    out["equivalent_half"] = out.kind_half == "equivalent"
    out["below"], out["above"] = out.kind == "lower", out.kind == "higher"
    out["bound"] = np.maximum(out.low.abs(), out.high.abs())
    return out



def worst_cell(cells: pd.DataFrame, margin: float = TOST_MARGIN) -> pd.DataFrame:
    """The router cell with the most negative estimate (``cells``: :func:`cell_tests`; the cell
    :func:`findings` names in ``worst_*``) as a one-row claims table (:func:`bnstudy.study.inference.claims_table`'s
    columns), key ``worst_cell``: its estimate, family interval, ``p``, ``p_adjusted`` (Holm over the cells, as
    :func:`cell_tests` gives it), ``p_equivalence`` at ``margin`` and verdict; glued with
    :func:`bnstudy.study.pages.glue_claims` as ``ch06_worst_cell_<field>``. Raises ``ValueError`` without cells."""
    if not len(cells):
        raise ValueError("worst_cell needs at least one router cell (cell_tests of a table with routers)")
    w = cells.loc[[cells["estimate"].idxmin()]].assign(key="worst_cell", margin=float(margin))
    return w[["key", "estimate", "low", "high", "n", "p", "p_adjusted", "p_equivalence", "margin", "confidence",
              "kind", "verdict"]].reset_index(drop=True)

def _frame_parts(df: pd.DataFrame):
    m = seed_means(df[df.condition.isin(CONDITIONS)])
    strengths = sorted(m.strength.unique())
    batches = sorted(m.inference_batch.unique())
    positive = [t for t in strengths if t > 0]
    gentle = positive[0] if positive else strengths[0]
    return m, strengths, batches, gentle, sorted(m.n_tasks.unique())


def _at(m: pd.DataFrame, k, t, b) -> pd.DataFrame:
    return m[(m.n_tasks == k) & (m.strength == t) & (m.inference_batch == b)]


def _of(sel: pd.DataFrame, cond: str) -> pd.DataFrame:
    return sel[sel.condition == cond]


#: The page's questions, as data (:func:`bnstudy.study.inference.ask`): every comparison is condition minus the oracle
#: per seed in the seed means (tasks averaged within seed), one decision per sample (the smallest inference batch)
#: unless named, at margin :data:`TOST_MARGIN`, all of them one family; one claim per task count (``_k<n>``).
#: ``train_vs_oracle``, ``pinned_vs_oracle``, ``mixture_vs_oracle``: at the strongest shift; ``router_vs_oracle``:
#: ``nearest_first`` at the gentlest non-zero shift; ``routed_gentle_b1`` / ``_bmax``: fully task-unknown,
#: ``accuracy_routed_head(nearest_first) - accuracy(oracle)`` at the gentlest shift, per sample and at the largest
#: inference batch. Then the identities of the code (exact checks, not findings): ``oracle_exact``, task A's
#: logits under the oracle minus the source model's (``== 0`` in every run); ``train_is_last_bank``, with two
#: tasks, task B's accuracy under ``train_mode`` minus its oracle's (``== 0`` in every seed and cell: the shared
#: drifting statistics are its own bank); ``perfect_at_strong``, every hard router's routing accuracy at the
#: strongest shift (``== 1``, so those routers' gaps to the oracle are 0 by construction).
_STRONG_B1 = dict(strength="max", inference_batch="min")
_GENTLE_B1 = dict(strength="min_positive", inference_batch="min")
_VS_ORACLE = dict(reference="oracle", each=("n_tasks",), table="means", margin=TOST_MARGIN)
QUESTIONS = (
    Question("train_vs_oracle_k{n_tasks}", "train_mode", at=_STRONG_B1, words="train mode", **_VS_ORACLE),
    Question("pinned_vs_oracle_k{n_tasks}", "pinned", at=_STRONG_B1, words="pinned", **_VS_ORACLE),
    Question("mixture_vs_oracle_k{n_tasks}", "mixture", at=_STRONG_B1, words="mixture", **_VS_ORACLE),
    Question("router_vs_oracle_k{n_tasks}", "nearest_first", at=_GENTLE_B1, words="router", **_VS_ORACLE),
    Question("routed_gentle_b1_k{n_tasks}", "nearest_first", value="accuracy_routed_head", reference_value="accuracy",
             at=_GENTLE_B1, words="routed head", **_VS_ORACLE),
    Question("routed_gentle_bmax_k{n_tasks}", "nearest_first", value="accuracy_routed_head",
             reference_value="accuracy", at=dict(strength="min_positive", inference_batch="max"), words="routed head",
             **_VS_ORACLE),
    Question("oracle_exact", value="oracle_logit_change", table="rows", exact=0.0),
    Question("train_is_last_bank", "train_mode", "oracle", at=dict(n_tasks=2, task=TASK_NAMES[1]), table="rows",
             pair=("seed", "strength", "inference_batch"), exact=0.0, optional=True),  # a design without 2 tasks
    Question("perfect_at_strong", value="routing_accuracy", at=dict(strength="max", condition=HARD_ROUTERS),
             table="means", exact=1.0),
)


def claims(df: pd.DataFrame) -> pd.DataFrame:
    """The page's comparisons and checks (:data:`QUESTIONS`) as one claims table
    (:func:`bnstudy.study.inference.ask`; glued with :func:`bnstudy.study.pages.glue_claims` as ``ch06_<key>_<field>``). Raises
    ``ValueError`` if a condition is missing."""
    missing = set(CONDITIONS) - set(df["condition"])
    if missing:
        raise ValueError(f"claims needs every condition; missing {sorted(missing)}")
    return ask(dict(means=seed_means(df[df.condition.isin(CONDITIONS)]), rows=df), QUESTIONS, ALPHA)


def claims_family(table: pd.DataFrame) -> dict:
    """What the page says of the claims' family: ``claims_m`` (the comparisons, checks not counted) and
    ``claims_confidence`` (their intervals' confidence, percent)."""
    comp = table[table.kind.isin(["higher", "lower", "equivalent", "not decided", "too few seeds"])]
    return dict(claims_m=int(len(comp)), claims_confidence=100 * float(comp.confidence.iloc[0]) if len(comp) else
                float("nan"))


# --- findings ------------------------------------------------------------------------------------------------------

def _threshold(levels: list[float], ok: list[bool]) -> float:
    """Smallest level from which ``ok`` holds at every larger level (NaN: at none). With ``ok`` a test at level
    alpha per level, this is fixed-sequence testing from the largest level down (stop at the first level not
    shown): the family-wise error of "holds from t0 on" stays at alpha with no correction."""
    good = [t for i, t in enumerate(levels) if all(ok[i:])]
    return min(good) if good else math.nan


def findings(df: pd.DataFrame, cells: pd.DataFrame | None = None) -> pd.DataFrame:
    """Chapter 6's numbers table (:func:`bnstudy.study.inference.numbers_table`) from :func:`run`'s table (every router
    and baseline, >= 2 seeds, >= 3 strengths); read one with :func:`bnstudy.study.inference.number`, glued with
    :func:`bnstudy.study.pages.glue_numbers` as ``ch06_<key>`` (intervals ``ch06_<key>_mean`` / ``_ci_low`` /
    ``_ci_high``, cut to [0, 1] for accuracies, :data:`ACCURACY_FIELDS`, and to [-1, 1] for differences).

    ``cells``: :func:`cell_tests` of ``df`` if already computed (else computed here).
    Raises ``ValueError`` if a condition is missing.

    Its rows: the descriptive numbers chapter 6's prose cites beside its claims (:func:`claims`) and cell verdicts
    (:func:`cell_tests`); accuracies and routing accuracies are fractions 0..1.

    Keys end in ``k<n_tasks>_<router>`` (e.g. ``k2_nearest_first``) or ``k<n_tasks>``;
    "gentle" is the smallest swept strength above zero, "strong" the largest, "zero" t = 0 (the smallest
    strength); ``b1``/``bmax`` the smallest and largest inference batch. Intervals are 95% Student-t over seeds
    (:func:`bnstudy.study.inference.t_interval`; tasks averaged within a seed; differences paired within seed, always
    condition minus reference).

    * ``route_*``: routing accuracy. ``route_diff_gentle_b1``: paired routing accuracy of a router minus
      ``nearest_first`` (keys ``k<n>_classifier``, ``k<n>_nearest_all``). ``nall_worst``: per ``k<n>`` the
      most negative such difference for ``nearest_all`` over strengths (b1), at ``nall_worst_t``.
      ``route_gentle_b1_per_task``: ``nearest_first`` routing per task (keys ``k<n>_<task>``).
      ``route_strong_min``: per hard router the smallest seed's routing accuracy at the strong shift.
    * ``works_from_b1`` / ``works_from_bmax``: per ``k<n>``, the smallest strength from which
      ``nearest_first``'s routing accuracy is shown above :data:`ROUTE_OK` (one-sided t test,
      :func:`bnstudy.study.inference.one_sided_p`, below :data:`ALPHA`) at that strength and every stronger one
      (NaN: never); ``route_at_works_b1``: the routing interval there.
    * ``wrong_from_train`` / ``wrong_from_pinned``: per ``k<n>``, the smallest strength from which the
      wrong-bank difference ``accuracy(train_mode | pinned) - accuracy(oracle)`` (b1) has the verdict
      "train mode lower" / "pinned lower" (:func:`bnstudy.study.inference.decide`, one comparison) at that strength and
      every stronger one; ``wrong_at_train`` / ``wrong_at_pinned``: the difference there;
      ``wrong_from_*_text``: both in words ("from t = 0.1 on (mean, 95% interval ...)" or "at no strength
      tested"); ``wrong_below_routing``: per ``k<n>``, the lowest lower 95% bound of either difference over the
      strengths below ``works_from_b1`` (how much a wrong bank can cost where per-sample routing fails);
      ``cost_after_routing``: whether, for every task count, both differences become detectable only at or
      above the strength from which per-sample routing works. ``train_task_a``: task A's own ``train_mode -
      oracle`` at the strong shift.
    * ``routed_*``: the fully task-unknown case, ``nearest_first`` picks bank and head: paired
      ``accuracy_routed_head - accuracy(oracle)`` per ``k<n>`` at t = 0 (b1, bmax); ``routed_task_a_gentle_b1``: task A's accuracy at the gentle shift;
      ``oracle_task_a``: task A's under the oracle (same cells); ``oracle_new_tasks``: the new tasks' mean
      accuracy under the oracle (same cells).
    * The router cells (:func:`cell_tests`, ``n_cells`` of them, one family): ``n_equivalent``,
      ``n_equivalent_half`` (verdict "equivalent within ±margin" at :data:`TOST_MARGIN` and at half of it),
      ``n_lower``, ``n_higher`` (a direction shown), ``n_not_decided``: counted by the book's one counts rule
      (:func:`bnstudy.study.inference.count_verdicts`: a direction where Holm over the cells shows it, else the printed
      verdict; ``n_equivalent_half`` counts printed verdicts at half the margin) (the cells themselves in words:
      :func:`equivalence_phrase`, :func:`below_phrase`); ``max_bound_hard``: the largest absolute end of a hard router's family interval; ``worst_*``: the cell
      with the most negative estimate (its estimate, family interval and verdict: :func:`worst_cell`, a claims
      table); ``cells_confidence``: the
      family intervals' confidence (percent).
    * ``n_chance_cells`` / ``n_above_chance``: at t = 0, the (router, task count, inference batch) cells and
      how many route above chance ``1/n_tasks`` (one-sided t tests, Holm over those cells, below
      :data:`ALPHA`).
    
    """
    missing = set(CONDITIONS) - set(df["condition"])
    if missing:
        raise ValueError(f"findings needs every condition; missing {sorted(missing)}")
    df = df[df.condition.isin(CONDITIONS)]
    m, strengths, batches, gentle, ks = _frame_parts(df)
    strong, zero, b1, bmax = strengths[-1], strengths[0], batches[0], batches[-1]

    def cell(col, cond, k, t, b, ref=None, ref_col=None):
        sel = _at(m, k, t, b)
        if ref is None:
            return t_interval(sel[sel.condition == cond][col])
        return t_interval(_diff(sel, cond, ref, col, ref_col))

    def diff(cond, k, t, b, ref="oracle"):
        return _diff(_at(m, k, t, b), cond, ref)

    per = lambda f: {f"k{k}_{r}": f(k, r) for k in ks for r in ROUTERS}
    nf = "nearest_first"

    # where per-sample routing works (shown above ROUTE_OK, one-sided) and where a wrong bank starts to cost
    works, route_at = {}, {}
    for b, store in ((b1, "b1"), (bmax, "bmax")):
        works[store] = {}
        for k in ks:
            vals = [_of(_at(m, k, t, b), nf).routing_accuracy for t in strengths]
            ok = [one_sided_p(v, "greater", null=ROUTE_OK) < ALPHA for v in vals]
            t0 = _threshold(strengths, ok)
            works[store][f"k{k}"] = t0
            if store == "b1":
                route_at[f"k{k}"] = (t_interval(vals[strengths.index(t0)]) if not math.isnan(t0)
                                     else Interval(*(math.nan,) * 3, 0))
    wrong_from, wrong_at, below = {"train_mode": {}, "pinned": {}}, {"train_mode": {}, "pinned": {}}, {}
    wrong_text = {"train_mode": {}, "pinned": {}}
    for k in ks:
        lows = []
        for base in ("train_mode", "pinned"):
            ds = [diff(base, k, t, b1) for t in strengths]
            t0 = _threshold(strengths, [decide(d, **_words(base)).kind == "lower" for d in ds])
            ivs = [t_interval(d) for d in ds]
            wrong_from[base][f"k{k}"] = t0
            wrong_at[base][f"k{k}"] = ivs[strengths.index(t0)] if not math.isnan(t0) else Interval(*(math.nan,) * 3, 0)
            iv = wrong_at[base][f"k{k}"]
            wrong_text[base][f"k{k}"] = ("at no strength tested" if math.isnan(t0) else
                                         f"from t = {_fmt_t(t0)} on ({iv.mean:.4f}, 95% interval {iv.low:.4f} to "
                                         f"{iv.high:.4f})")
            limit = works["b1"][f"k{k}"]
            lows += [iv.low for t, iv in zip(strengths, ivs) if math.isnan(limit) or t < limit]
        below[f"k{k}"] = float(np.nanmin(lows)) if any(v == v for v in lows) else math.nan

    # paired router-vs-router routing accuracy
    diffs, nall_worst, nall_worst_t = {}, {}, {}
    for k in ks:
        for r in ("classifier", "nearest_all"):
            diffs[f"k{k}_{r}"] = cell("routing_accuracy", r, k, gentle, b1, nf)
        ivs = {t: cell("routing_accuracy", "nearest_all", k, t, b1, nf) for t in strengths}
        tw = min(ivs, key=lambda t: ivs[t].mean)
        nall_worst[f"k{k}"], nall_worst_t[f"k{k}"] = ivs[tw], float(tw)
    per_task = {}
    for k in ks:
        sel = df[(df.n_tasks == k) & (df.strength == gentle) & (df.inference_batch == b1) & (df.condition == nf)]
        for task, g in sel.groupby("task"):
            per_task[f"k{k}_{task}"] = t_interval(g.groupby("seed").routing_accuracy.mean())

    def task_rows(k, t, b, task):
        return df[(df.n_tasks == k) & (df.strength == t) & (df.inference_batch == b) & (df.task == task)]

    def task_values(k, t, b, cond, task, col="accuracy"):
        sel = task_rows(k, t, b, task)
        return sel[sel.condition == cond].set_index("seed")[col]

    train_task_a = {f"k{k}": t_interval(_diff(task_rows(k, strong, b1, "A"), "train_mode", "oracle")) for k in ks}
    routed = lambda t, b: {f"k{k}": cell("accuracy_routed_head", nf, k, t, b, "oracle", "accuracy") for k in ks}
    routed_a = {f"k{k}": t_interval(task_values(k, gentle, b1, nf, "A", "accuracy_routed_head")) for k in ks}
    oracle_a = {f"k{k}": t_interval(task_values(k, gentle, b1, "oracle", "A")) for k in ks}
    new = df[(df.task != "A") & (df.strength == gentle) & (df.inference_batch == b1) & (df.condition == "oracle")]
    oracle_new = {f"k{k}": t_interval(new[new.n_tasks == k].groupby("seed").accuracy.mean()) for k in ks}

    # every router cell against the oracle: its verdict in one family (cell_tests)
    tests = cell_tests(df) if cells is None else cells
    counts = count_verdicts(tests, ALPHA) if len(tests) else dict.fromkeys(("equivalent", "lower", "higher",
                                                                             "not decided"), 0)
    hard = tests[tests.condition != "mixture"]
    worst = tests.loc[tests["estimate"].idxmin()]
    strong_rows = m[(m.strength == strong) & m.condition.isin(HARD_ROUTERS)]
    route_strong_min = {r: float(strong_rows[strong_rows.condition == r].routing_accuracy.min()) for r in HARD_ROUTERS}
    # above chance at t = 0: one-sided t tests, Holm over the cells (a count)
    chance_p = [one_sided_p(_of(_at(m, k, zero, b), r).routing_accuracy, "greater", null=1 / k)
                for k in ks for r in ROUTERS for b in batches]
    return numbers_table(dict(
        n_seeds=int(m.seed.nunique()), route_ok=ROUTE_OK, tost_margin=TOST_MARGIN, gentle=float(gentle),
        strong=float(strong), zero=float(zero), b1=int(b1), bmax=int(bmax),
        route_strong_min=route_strong_min,
        route_zero_b1=per(lambda k, r: cell("routing_accuracy", r, k, zero, b1)),
        route_zero_bmax=per(lambda k, r: cell("routing_accuracy", r, k, zero, bmax)),
        n_chance_cells=len(chance_p), n_above_chance=int((holm(chance_p) < ALPHA).sum()),
        route_gentle_b1=per(lambda k, r: cell("routing_accuracy", r, k, gentle, b1)),
        route_gentle_bmax=per(lambda k, r: cell("routing_accuracy", r, k, gentle, bmax)),
        route_strong_b1=per(lambda k, r: cell("routing_accuracy", r, k, strong, b1)),
        route_diff_gentle_b1=diffs, nall_worst=nall_worst, nall_worst_t=nall_worst_t,
        route_gentle_b1_per_task=per_task,
        works_from_b1=works["b1"], works_from_bmax=works["bmax"], route_at_works_b1=route_at,
        wrong_from_train=wrong_from["train_mode"], wrong_from_pinned=wrong_from["pinned"],
        wrong_at_train=wrong_at["train_mode"], wrong_at_pinned=wrong_at["pinned"],
        wrong_from_train_text=wrong_text["train_mode"], wrong_from_pinned_text=wrong_text["pinned"],
        wrong_below_routing=below,
        cost_after_routing=all(not math.isnan(works["b1"][f"k{k}"]) and all(
            math.isnan(wrong_from[base][f"k{k}"]) or wrong_from[base][f"k{k}"] >= works["b1"][f"k{k}"]
            for base in ("train_mode", "pinned")) for k in ks),
        train_task_a=train_task_a,
        routed_zero_b1=routed(zero, b1), routed_zero_bmax=routed(zero, bmax),
        routed_task_a_gentle_b1=routed_a, oracle_task_a=oracle_a, oracle_new_tasks=oracle_new,
        n_cells=len(tests), cells_confidence=100 * float(tests.confidence.iloc[0]) if len(tests) else math.nan,
        n_equivalent=counts["equivalent"], n_equivalent_half=int(tests.equivalent_half.sum()),
        n_lower=counts["lower"], n_higher=counts["higher"], n_not_decided=counts["not decided"],
        max_bound_hard=float(hard.bound.max()) if len(hard) else math.nan,
        worst_router=str(worst["condition"]),
        worst_strength=float(worst["strength"]), worst_batch=int(worst["inference_batch"]),
        worst_n_tasks=int(worst["n_tasks"]),
    ), bounds=_bounds)


def temperature_findings(df: pd.DataFrame, kept: float) -> pd.DataFrame:
    """The temperature check's numbers table (glued as ``ch06t_<key>``) from its results (:func:`run` of
    :func:`temperature_check_config`). Raises ``ValueError`` if ``kept`` was not among its temperatures.

    The mixture's temperature check (:func:`temperature_check_config`, seeds not reported elsewhere).

    ``worst``: per temperature (keys ``tau_<value>``, e.g. ``tau_0_1``), the most negative paired
    ``mixture - oracle`` over the strengths and task counts checked (b1), with its 95% interval;
    ``kept``: the config's temperature; ``best``: the temperature whose worst mean is least negative;
    ``best_no_direction``: whether at ``best`` no strength checked shows a direction (every (task count,
    strength) cell's :func:`bnstudy.study.inference.decide` verdict, the cells one family of ``best_m``, is not
    "mixture lower" or "mixture higher"); ``seed_first`` / ``seed_last`` / ``n_seeds``: the held-out seeds.
    
    """
    t = temperature_table(df)
    if not np.isclose(t.temperature, kept).any():
        raise ValueError(f"temperature_findings: kept temperature {kept:g} not in {sorted(t.temperature.unique())}")
    worst = {}
    for tau, g in t.groupby("temperature"):
        w = g.loc[g["mean"].idxmin()]
        worst[tau] = Interval(float(w["mean"]), float(w["ci_low"]), float(w["ci_high"]), int(w["n_seeds"]))
    best = max(worst, key=lambda tau: worst[tau].mean)
    b1 = df.inference_batch.min()
    d = df[(df.inference_batch == b1) & ((df.condition == "oracle") | np.isclose(df.temperature, best))]
    m = seed_means(d.assign(condition=d.condition.where(d.condition == "oracle", "mixture")))
    at_best = [_diff(sel, "mixture", "oracle") for _, sel in m.groupby(["n_tasks", "strength"])]
    fam = Family(max(len(at_best), 1), ALPHA)
    kinds = [decide(v, family=fam, **_words("mixture")).kind for v in at_best]
    seeds = sorted(df.seed.unique())
    return numbers_table(dict(kept=float(kept), best=float(best),
                              best_no_direction=not any(k in ("higher", "lower") for k in kinds),
                              best_m=len(at_best), worst={f"tau_{tau:g}": iv for tau, iv in worst.items()},
                              seed_first=int(seeds[0]), seed_last=int(seeds[-1]), n_seeds=len(seeds)),
                         bounds=lambda key: (-1.0, 1.0))


# --- words: the page's sentences, chosen by the data (issue 25); claims in words from bnstudy.study.words -------------
# Every outcome sentence of the page's answer box and captions is chosen here from the numbers and claims tables, so
# that it is true for any rows (tests/test_unknown_task.py flips each headline verdict and checks the words follow).

def _ks(f: pd.DataFrame, stem: str = "works_from_b1") -> list[int]:
    """The task counts the numbers table ``f`` holds ``<stem>_k<n>`` (or ``<stem>_k<n>_...``) rows for, sorted."""
    pat = re.compile(rf"^{re.escape(stem)}_k(\d+)(_|$)")
    return sorted({int(m.group(1)) for m in map(pat.match, f["key"]) if m})


def _per_k(f: pd.DataFrame, stem: str) -> dict:
    """``{"k<n>": number(f, "<stem>_k<n>")}`` for every task count of :func:`_ks`."""
    return {f"k{k}": number(f, f"{stem}_k{k}") for k in _ks(f, stem)}


def _iv(iv: Interval, digits: int, flip: bool = False) -> tuple[str, str, str]:
    """Mean, low, high formatted (``flip``: of the negated interval, for a magnitude "below")."""
    m, lo, hi = (-iv.mean, -iv.high, -iv.low) if flip else (iv.mean, iv.low, iv.high)
    return f"{m:.{digits}f}", f"{lo:.{digits}f}", f"{hi:.{digits}f}"


_count, _and, _fmt_t = count_word, join, fmt_level

def works_phrase(thresholds: dict, gentle: float, intervals: dict | None = None) -> str:
    """Where routing works, per task count, in words.

    ``thresholds``: ``{"k2": t, "k4": t}`` (NaN: at no strength tested; a value <= ``gentle``: at every
    non-zero strength tested, the threshold may lie lower); ``intervals``: optional routing interval at each
    threshold (``Interval``, same keys), cited after each task count. One task-count clause when every count
    shares the threshold and no interval is given: "at every non-zero strength tested, for both task counts
    (t ≥ 0.0025; the threshold may lie lower)".
    """
    ks = sorted({int(key[1:].split("_")[0]) for key in thresholds})  # keys k<n>

    def desc(t):
        if math.isnan(t):
            return "at no strength tested"
        return "at every non-zero strength tested" if t <= gentle else f"from t = {_fmt_t(t)} on"

    floor_note = f"t ≥ {_fmt_t(gentle)}; the threshold may lie lower"
    ts = [thresholds[f"k{k}"] for k in ks]
    same = all((math.isnan(a) and math.isnan(ts[0])) or a == ts[0] for a in ts)
    if intervals is None and same:
        who = "with " + _count(ks[0]) + " tasks" if len(ks) == 1 else (
            "for both task counts" if len(ks) == 2 else "for every task count")
        note = f" ({floor_note})" if not math.isnan(ts[0]) and ts[0] <= gentle else ""
        return f"{desc(ts[0])}, {who}{note}"
    parts = []
    for i, (k, t) in enumerate(zip(ks, ts)):
        text = desc(t) + (f" (t ≥ {_fmt_t(gentle)})" if not math.isnan(t) and t <= gentle else "")
        text += f" with {_count(k)} tasks" if i == 0 else f" with {_count(k)}"
        if intervals is not None and not math.isnan(t):
            m, lo, hi = _iv(intervals[f"k{k}"], 3)
            text += (f" (routing there {m}, 95% interval {lo} to {hi})" if i == 0 else f" ({m}, {lo} to {hi})")
        parts.append(text)
    return _and(parts)


def _compact_cells(cells: list[tuple], strengths: list[float], batches: list[int]) -> str:
    """``[(router, n_tasks, strength, batch), ...]`` in few words: per router and task count, the strengths
    ("t ≥ 0.25" when they are the top of the grid) and the batches ("at every inference batch size" when all)."""
    by_cell: dict = {}
    for r, k, t, b in cells:
        by_cell.setdefault((r, int(k), float(t)), set()).add(int(b))
    groups: dict = {}
    for (r, k, t), bs in by_cell.items():
        groups.setdefault((r, k, tuple(sorted(bs))), []).append(t)
    parts = []
    for (r, k, bs), ts in sorted(groups.items(), key=lambda g: (ROUTERS.index(g[0][0]) if g[0][0] in ROUTERS else 9,
                                                                  g[0][1], min(g[1]))):
        ts = sorted(ts)
        tail = [t for t in strengths if t >= ts[0]]
        if len(ts) > 1 and ts == tail:
            where = f"t ≥ {_fmt_t(ts[0])}"
        else:
            where = "t = " + _and([_fmt_t(t) for t in ts])
        every = list(bs) == sorted(int(b) for b in batches)
        batch = (", at every inference batch size" if every and len(batches) > 1 else
                 f" (b = {', '.join(str(b) for b in bs)})")
        parts.append(f"`{r}` with {_count(k)} tasks at {where}{batch}")
    return "; ".join(parts)


def equivalence_phrase(cells: pd.DataFrame, margin: float = TOST_MARGIN) -> str:
    """How many router cells are shown equivalent to the oracle at ``margin`` and at half of it, and which
    are not, in few words (``cells``: :func:`cell_tests`). E.g. "is shown in 276 of the 288 cells, all but
    `mixture` with four tasks at t ≥ 0.25 at every inference batch size; within half that margin (±0.01) in
    272, all but ..."."""
    strengths = sorted(cells.strength.unique())
    batches = sorted(cells.inference_batch.unique())
    n = len(cells)

    def clause(col):
        ok = cells[col].to_numpy()
        bad = [(r.condition, r.n_tasks, r.strength, r.inference_batch) for r, e in zip(cells.itertuples(), ok) if not e]
        if not bad:
            return f"all {n}" if col == "equivalent_half" else f"all {n} cells"
        text = _compact_cells(bad, strengths, batches)
        return (f"{int(ok.sum())}" if col == "equivalent_half" else f"{int(ok.sum())} of the {n} cells") + \
            f", all but {text}"

    return (f"is shown in {clause('equivalent')}; within half that margin (±{margin / 2:g}) in "
            f"{clause('equivalent_half')}")


def below_phrase(cells: pd.DataFrame, zero: float = 0.0) -> str:
    """The cells whose family interval shows a direction (``cells``: :func:`cell_tests`, its ``below`` and
    ``above`` columns: verdict "router lower" / "mixture lower" or "... higher"), e.g. "find one cell below the
    oracle: `classifier` with two tasks at t = 0 (b = 1)"; "find no cell below the oracle" if none. With several,
    how many are at ``t = zero``; cells above the oracle, if any, after a semicolon."""
    strengths = sorted(cells.strength.unique())
    batches = sorted(cells.inference_batch.unique())
    bad = [(r.condition, r.n_tasks, r.strength, r.inference_batch) for r in cells.itertuples() if r.below]
    up = [(r.condition, r.n_tasks, r.strength, r.inference_batch) for r in cells.itertuples() if r.above]
    tail = ("" if not up else f"; {'one cell' if len(up) == 1 else f'{len(up)} cells'} above it: "
            + _compact_cells(up, strengths, batches))
    if not bad:
        return "find no cell below the oracle" + tail
    text = _compact_cells(bad, strengths, batches)
    if len(bad) == 1:
        return f"find one cell below the oracle: {text}" + tail
    n0 = sum(1 for c in bad if c[2] == zero)
    at_zero = (f", all at t = {_fmt_t(zero)}" if n0 == len(bad) else
               f", {n0} of them at t = {_fmt_t(zero)}" if n0 else "")
    return f"find {len(bad)} cells below the oracle{at_zero}: {text}" + tail


def margin_phrase(margin: float, ch3_margin: float) -> str:
    """"the equivalence margin, ±0.02, is chapter 3's" (or says how the two differ)."""
    if np.isclose(margin, ch3_margin):
        return f"the equivalence margin, ±{margin:g}, is chapter 3's"
    return f"the equivalence margin is ±{margin:g} (chapter 3's is ±{ch3_margin:g})"


def page_settings(config: Config) -> dict:
    """The settings the page cites beside the findings (glued as ``ch06_<name>``): ``tau_first`` (the
    temperature tried first), ``temperature``, ``first_grid_text`` (the first strength grid, in words),
    ``ch3_gentlest`` (chapter 3's gentlest non-zero ``both`` level, full profile), ``ch3_margin`` (its
    equivalence margin), ``margin_text`` (:func:`margin_phrase`), ``router_samples`` and ``router_samples_bmax`` (the
    classifier's training points per bank at the largest inference batch)."""
    from ..shift_strength.run import PROFILES as CH3_PROFILES, make_config as ch3_config
    ch3_margin = ch3_config("full").tie_margin
    return dict(tau_first=TEMPERATURE_TRIED_FIRST, temperature=config.temperature,
                first_grid_text=", ".join(_fmt_t(t) for t in FIRST_STRENGTH_GRID),
                ch3_gentlest=min(t for t in CH3_PROFILES["full"]["both_levels"] if t > 0), ch3_margin=ch3_margin,
                margin_text=margin_phrase(TOST_MARGIN, ch3_margin), router_samples=config.router_samples,
                router_samples_bmax=config.router_samples // max(config.inference_batches))



#: The page's binary outcomes, each a rule on the claims table (``c``) or numbers table (``f``) and a fixed
#: sentence (:class:`bnstudy.study.words.Note`): exactly one note of each key holds.
_IS = lambda key, kind: (lambda c, f: claim(c, key).kind == kind)  # noqa: E731
NOTES = (
    Note("oracle_exact_text", _IS("oracle_exact", "exact"), "the largest difference over all runs is zero"),
    Note("oracle_exact_text", lambda c, f: claim(c, "oracle_exact").kind != "exact",
         "yet in some run they differ, by up to {estimate:.3g}", lambda c, f: dict(claim(c, "oracle_exact"))),
    Note("train_is_last_bank_text", _IS("train_is_last_bank", "exact"), "the two are equal in every seed and cell"),
    Note("train_is_last_bank_text", lambda c, f: claim(c, "train_is_last_bank").kind != "exact"
         and claim(c, "train_is_last_bank").n > 0, "in some seed or cell the two differ"),
    Note("train_is_last_bank_text", lambda c, f: claim(c, "train_is_last_bank").n == 0,
         "no run with two tasks to check it on"),
    Note("known_head_text", lambda c, f: number(f, "cost_after_routing"),
         "the first BatchNorm layer's input statistics pick the bank wherever a wrong bank measurably costs on this "
         "grid"),
    Note("known_head_text", lambda c, f: not number(f, "cost_after_routing"),
         "the first BatchNorm layer's input statistics pick the bank at strong shifts, but not everywhere a wrong "
         "bank measurably costs on this grid"),
    Note("batch_effect_text", lambda c, f: _pooled(f),
         "pooling samples shrinks the noise in the estimated statistics, and here the larger batches route the "
         "gentlest shift more often on average with every task count"),
    Note("batch_effect_text", lambda c, f: not _pooled(f),
         "pooling samples shrinks the noise in the estimated statistics, yet here the larger batches do not route "
         "the gentlest shift more often on average with every task count"),
)


def _pooled(f: pd.DataFrame) -> bool:
    nf = "nearest_first"
    return all(number(f, f"route_gentle_bmax_k{k}_{nf}").mean > number(f, f"route_gentle_b1_k{k}_{nf}").mean
               for k in _ks(f, "route_gentle_b1"))


def phrases(f: pd.DataFrame, cells: pd.DataFrame, table: pd.DataFrame) -> dict[str, str]:
    """The page's data-dependent sentences (plain Markdown), keyed by name (glued as ``ch06_<name>``; every
    name ends in ``_text``, which no glued name of the numbers or claims table does, so they cannot clash).
    ``f``: :func:`findings`; ``cells``: :func:`cell_tests`; ``table``: :func:`claims` (its checks).

    ``works_b1_text`` / ``works_bmax_text`` (:func:`works_phrase`); ``works_b1_short_text``;
    ``equivalence_text`` (:func:`equivalence_phrase`); ``below_text`` (:func:`below_phrase`);
    ``nall_worst_text`` (where ``nearest_all`` routes below ``nearest_first``, as magnitudes);
    ``zero_shift_text`` (routing at t = 0 against chance); ``strong_routing_text``; ``cost_vs_routing_text``;
    ``cell_counts_text``; ``unknown_head_text``; and the :data:`NOTES` (``oracle_exact_text``,
    ``train_is_last_bank_text``, ``known_head_text``, ``batch_effect_text``), worded for either outcome.
    """
    n = lambda key: number(f, key)  # noqa: E731
    gentle = n("gentle")
    out = {
        "works_b1_text": works_phrase(_per_k(f, "works_from_b1"), gentle, _per_k(f, "route_at_works_b1")),
        "works_b1_short_text": works_phrase(_per_k(f, "works_from_b1"), gentle),
        "works_bmax_text": works_phrase(_per_k(f, "works_from_bmax"), gentle),
        "equivalence_text": equivalence_phrase(cells, n("tost_margin")),
        "below_text": below_phrase(cells, n("zero")),
    }
    neg = [k for k in _ks(f, "nall_worst") if n(f"nall_worst_k{k}").mean < 0]
    if neg:
        parts = []
        for k in neg:
            iv = n(f"nall_worst_k{k}")
            m, lo, hi = _iv(iv, 3, flip=True)
            t = _fmt_t(n(f"nall_worst_t_k{k}"))
            # magnitudes "below"; an interval reaching above zero is said as such (no "-0.2 below")
            span = f"{lo} to {hi} below" if iv.high < 0 else f"from {-float(lo):.3f} above to {hi} below"
            avg = "" if iv.high < 0 else " on average"
            parts.append(f"{m} below `nearest_first`{avg} at t = {t} with {_count(k)} tasks (95% interval {span})"
                         if not parts else f"{m} below{avg} at t = {t} with {_count(k)} ({span})")
        out["nall_worst_text"] = "but not at every strength: it routes " + _and(parts)
    else:
        out["nall_worst_text"] = "and no less at any strength on average"
    nf = "nearest_first"
    ks0 = _ks(f, "route_zero_b1")
    per_k = _and([f"{n(f'route_zero_b1_k{k}_{nf}').mean:.3f} ({_count(k)} tasks)" if i == 0 else
                  f"{n(f'route_zero_b1_k{k}_{nf}').mean:.3f} ({_count(k)})" for i, k in enumerate(ks0)])
    bigger = _and([f"{n(f'route_zero_bmax_k{k}_{nf}').mean:.3f}" for k in ks0])
    numbers = f"`{nf}` routes {per_k} per sample, and {bigger} with batches of {n('bmax')}"
    tests = (f"one-sided t tests against 1/K, Holm over the {n('n_chance_cells')} (router, task count, inference "
             f"batch) cells")
    if n("n_above_chance") == n("n_chance_cells"):
        out["zero_shift_text"] = ("which lets every router do better than chance (1/K) at every inference batch "
                                  f"size ({tests}): {numbers}")
    else:
        out["zero_shift_text"] = ("which is not enough for every router to do better than chance (1/K) at every "
                                  f"inference batch size ({n('n_above_chance')} of the {n('n_chance_cells')} cells "
                                  f"are shown above it; {tests}): {numbers}")
    out.update(notes(NOTES, table, f))
    hard = [f"`{r}`" for r in HARD_ROUTERS]
    off = [f"`{r}` ({n(f'route_strong_min_{r}'):.3f})" for r in HARD_ROUTERS if n(f"route_strong_min_{r}") < 1.0]
    out["strong_routing_text"] = (
        f"There, every hard router ({_and(hard)}) sends every sample to its own bank at every inference batch size "
        f"in every seed, so its accuracy equals the oracle's by construction: a check, not a finding."
        if claim(table, "perfect_at_strong").kind == "exact" else
        f"There, not every hard router routes every sample to its own bank (lowest seed's routing: {_and(off)}), "
        f"so not every router's accuracy equals the oracle's by construction.")
    out["cost_vs_routing_text"] = _cost_vs_routing(f)  # plain words: the guide pastes it across pages
    out["cell_counts_text"] = cell_counts_text(cells, n("tost_margin"))
    rk = [(k, claim(table, f"routed_gentle_b1_k{k}")) for k in _ks(f)]
    verdicts = _and([f"{claim_text(c, clip=(-1, 1))} with {_count(k)} tasks" for k, c in rk])
    if any(c.kind == "lower" for _, c in rk):
        out["unknown_head_text"] = (
            f"at the gentlest shift (t = {gentle:g}) the routed head minus the oracle is {verdicts} per sample, "
            "so there routing by statistics does not stand in for the task label: pool inference batches, or keep "
            "a task label.")
    else:
        out["unknown_head_text"] = (
            f"at the gentlest shift (t = {gentle:g}) the routed head minus the oracle is {verdicts} per sample: "
            "no loss is shown there on this grid.")
    return out


def mixture_advice(table: pd.DataFrame, tf: pd.DataFrame) -> str:
    """The practice bullet on the soft mixture, for the temperature the main sweep used (``table``:
    :func:`claims`, its ``mixture_vs_oracle_k<k>`` at the largest task count and its ``perfect_at_strong`` check;
    worded for its verdict: "Prefer hard routing ..." only where the mixture is shown lower) and what the held-out
    check (``tf``: :func:`temperature_findings`) found at its least bad temperature ``best``, with its worst
    interval."""
    kept_t, best = number(tf, "kept"), number(tf, "best")
    kept = f"τ = {kept_t:g}"
    k = max(int(key.rsplit("_k", 1)[1]) for key in table.key if key.startswith("mixture_vs_oracle_k"))
    c = claim(table, f"mixture_vs_oracle_k{k}")
    m, lo, hi = _iv(Interval(c.estimate, c.low, c.high, int(c.n)).clipped(-1, 1), 4)  # printed ends, as glued
    lead = {"lower": f"Prefer hard routing to the soft mixture at {kept}: at the strongest shift with {_count(k)} "
                     f"tasks the mixture differs from the oracle by",
            "higher": f"The soft mixture at {kept} beats the oracle at the strongest shift with {_count(k)} tasks: "
                      f"it differs from it by"}.get(
        c.kind, f"The soft mixture at {kept} gains nothing over hard routing at the strongest shift with "
                f"{_count(k)} tasks: it differs from the oracle by")
    text = (f"{lead} {m} ({lo} to {hi}; {c.verdict}), "
            + ("where hard routing matches the oracle by construction." if
               claim(table, "perfect_at_strong").kind == "exact" else
               "where not every hard router routes perfectly either."))
    if np.isclose(best, kept_t):
        return text + f" The held-out temperature check found no temperature better than {kept}."
    wm, wlo, whi = _iv(number(tf, f"worst_tau_{_slug(f'{best:g}')}"), 4)
    if number(tf, "best_no_direction"):
        tail = (f" At τ = {best:g}, the least bad temperature in the held-out check, the mixture's worst "
                f"difference from the oracle is {wm} ({wlo} to {whi}) and no strength checked shows a direction "
                f"(one family of {number(tf, 'best_m')}), so the advice is for {kept} only (the main sweep was not "
                f"rerun at τ = {best:g}).")
    else:
        tail = (f" At τ = {best:g}, the held-out check's least bad temperature, the mixture's worst difference "
                f"from the oracle is {wm} ({wlo} to {whi}); the main sweep was not rerun at it.")
    return text + tail


def cell_counts_text(cells: pd.DataFrame, margin: float = TOST_MARGIN) -> str:
    """The router cells (:func:`cell_tests`) against the oracle, counted by the book's rule
    (:func:`bnstudy.study.words.counts_text`), e.g. "275 of the 288 router cells are **equivalent within ±0.02** of the
    oracle and 13 are **not decided**"."""
    return counts_text(cells, "router cells", "a router", "the oracle", margin, ALPHA)


def answer(f: pd.DataFrame, cells: pd.DataFrame, table: pd.DataFrame) -> str:
    """The answer box's outcome sentences (Markdown, glued as ``ch06_answer``), chosen from the numbers ``f``,
    the router cells ``cells`` (:func:`cell_tests`) and the claims table ``table`` (:func:`claims`), so that they
    are true for any rows: where per-sample routing reaches the right bank, where it works, how the router cells
    compare with the oracle, whether a wrong bank costs before the router works, and what routing the head costs."""
    n = lambda key: number(f, key)  # noqa: E731
    nf = "nearest_first"
    ks = _ks(f)
    strong = _and([f"{n(f'route_strong_b1_k{k}_{nf}').mean:.3f} with {_count(k)} tasks" if i == 0 else
                   f"{n(f'route_strong_b1_k{k}_{nf}').mean:.3f} with {_count(k)}" for i, k in enumerate(ks)])
    gentle = _and([f"{n(f'route_gentle_b1_k{k}_{nf}').mean:.3f}" for k in ks])
    s1 = (f"Routed to the bank nearest its own statistics at the first BatchNorm layer's input (`{nf}`), one image "
          f"per decision, an input reaches the right bank {strong} at the strongest shift (t = {n('strong'):g}), "
          f"and {gentle} at the gentlest (t = {n('gentle'):g}).")
    s2 = (f"Taking “works” as routing shown above {n('route_ok'):g}, per-sample routing works "
          f"{works_phrase(_per_k(f, 'works_from_b1'), n('gentle'))}, and with batches of {n('bmax')} "
          f"{works_phrase(_per_k(f, 'works_from_bmax'), n('gentle'))}.")
    s3 = f"With the task's own head, {cell_counts_text(cells, n('tost_margin'))}."
    s4 = _cost_vs_routing(f)
    routed = [(k, claim(table, f"routed_gentle_b1_k{k}"), claim(table, f"routed_gentle_bmax_k{k}")) for k in ks]
    s5 = ("If the router must also pick the head, accuracy minus the oracle's at the gentlest shift is "
          + _and([f"{claim_text(b1, clip=(-1, 1))} with {_count(k)} tasks" for k, b1, _ in routed]) + " per sample, and "
          + _and([claim_text(bm, clip=(-1, 1)) for _, _, bm in routed]) + f" with batches of {n('bmax')}.")
    return " ".join((s1, s2, s3, s4, s5))


def _cost_vs_routing(f: pd.DataFrame) -> str:
    late = []
    for k in _ks(f):
        w = number(f, f"works_from_b1_k{k}")
        early = [name for name, stem in (("train mode", "wrong_from_train"), ("pinned", "wrong_from_pinned"))
                 if not math.isnan(number(f, f"{stem}_k{k}")) and (math.isnan(w) or number(f, f"{stem}_k{k}") < w)]
        if early:
            late.append(f"with {_count(k)} tasks the cost of {_and(early)} is detectable below the strength from "
                        f"which per-sample routing works")
    ks1 = _ks(f)
    counts = (f"With {_count(ks1[0])} tasks" if len(ks1) == 1 else "With both task counts" if len(ks1) == 2 else
              "With every task count")
    return (f"{counts}, each wrong-bank cost becomes detectable only at or above the strength from which "
            "per-sample routing works." if not late else
            "Not everywhere does the cost wait for routing: " + "; ".join(late) + ".")


def what_to_do(f: pd.DataFrame, table: pd.DataFrame) -> str:
    """The answer box's advice (Markdown, glued as ``ch06_what_to_do``), worded for the findings: keep one set of
    BatchNorm statistics per task and route each input by its first-layer statistics; where a wrong bank costs
    before routing works, or a routed head loses accuracy, pool inference batches or keep a task label."""
    head_loses = any(claim(table, f"routed_gentle_b1_k{k}").kind == "lower" for k in _ks(f))
    cost_after = number(f, "cost_after_routing")
    base = ("Keep one set of BatchNorm statistics per task over the shared frozen weights "
            "(`bnstudy.study.banks.StatisticBank(model, n_banks)`) and send each input batch to the bank nearest its "
            "first-layer statistics (`bnstudy.study.routing.routed_forward(bank, x, bnstudy.study.routing.NearestStatistics(bank))`)")
    if cost_after and not head_loses:
        return base + "; on this grid that needs no task label."
    why = []
    if not cost_after:
        why.append("a wrong bank costs accuracy at shifts too gentle for one image to route")
    if head_loses:
        why.append("a router that also picks the head loses accuracy at the gentlest shift")
    return base + "; where the shift is gentle, pool inference batches or keep a task label (" + _and(why) + ")."


def figure_takeaways(f: pd.DataFrame, cells: pd.DataFrame, table: pd.DataFrame) -> dict[str, str]:
    """The data-dependent takeaway of each figure's caption (glued as ``ch06_<name>``): ``routing_takeaway`` (where
    per-sample and batched routing work), ``accuracy_takeaway`` (what the wrong banks of ``train_mode`` and pinned
    statistics read at the strongest shift), ``cost_takeaway`` (the router cells' counts) and ``unknown_takeaway``
    (the routed head at the gentlest shift)."""
    ks, gentle = _ks(f), number(f, "gentle")
    acc = _and([f"{verdict_md(claim(table, f'train_vs_oracle_k{k}'))} and "
                f"{verdict_md(claim(table, f'pinned_vs_oracle_k{k}'))} with {_count(k)} tasks" for k in ks])
    return dict(
        routing_takeaway=(f"Takeaway: per-sample routing works {works_phrase(_per_k(f, 'works_from_b1'), gentle)}; "
                          f"with batches of {number(f, 'bmax')} {works_phrase(_per_k(f, 'works_from_bmax'), gentle)}."),
        accuracy_takeaway=(f"Takeaway: at the strongest shift, train mode and pinned statistics minus the oracle "
                           f"read {acc}."),
        cost_takeaway=(f"Takeaway: {_cost_vs_routing(f)} With the task's own head, "
                       f"{cell_counts_text(cells, number(f, 'tost_margin'))}."),
        unknown_takeaway=("Takeaway: with the head routed too, at the gentlest shift per sample the difference reads "
                          + _and([f"{verdict_md(claim(table, f'routed_gentle_b1_k{k}'))} with {_count(k)} tasks"
                                  for k in ks]) + "."),
    )


#: Numbers that are accuracies or routing accuracies (printed in [0, 1]); every other interval is a difference of
#: accuracies (printed in [-1, 1]).
ACCURACY_FIELDS = ("route_zero_b1", "route_zero_bmax", "route_gentle_b1", "route_gentle_bmax", "route_strong_b1",
                   "route_gentle_b1_per_task", "route_at_works_b1", "routed_task_a_gentle_b1", "oracle_task_a",
                   "oracle_new_tasks")


def _bounds(key: str) -> tuple[float, float]:
    return (0.0, 1.0) if key in ACCURACY_FIELDS else (-1.0, 1.0)
