"""Chapter 4, what is claimed: the claims tables (every interval, test and verdict from :mod:`bnstudy.inference`),
the small records the page glues, the sentences chosen by the data and the glue helpers, all from the tables of
:mod:`.run`.

The *gap* of a (shift, head, optimizer) cell is ``task_b(separate_stats) - task_b(backbone_eval)`` per seed
(condition minus the pinned reference, the book's one sign: positive when pinning costs the new task). The cells
of one shift are one family (Bonferroni intervals, equivalence at ``alpha / m``, Holm counts). :func:`findings`
gives a claims table and a small :class:`Record`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...inference import MIN_BOOTSTRAP_UNITS, NOT_DECIDED, TOO_FEW, Claim, Family, Interval, bootstrap_interval, \
    claims_table, count_kinds, count_verdicts, decide, decide_interval, equivalent_text, exact_check, paired_differences, \
    rank_correlation, t_interval
from ...modes import MODE_NAMES
from .run import OPTIMIZERS, PINNED_MODES, REFERENCE_MODE, STEPS_CHECK_HEAD, STEPS_CHECK_OPTIMIZERS, chosen_lrs, \
    search_at, search_table

#: Direction words of the page's verdicts (:func:`bnstudy.inference.decide`), each (higher, lower) pair naming
#: the direction of *condition minus reference*: the gap ``separate_stats - backbone_eval`` of a cell;
GAP_HIGHER, GAP_LOWER = "separate_stats higher", "separate_stats lower"
#: the optimizer interaction ``gap(adam) - gap(sgd)``;
ADAM_HIGHER, ADAM_LOWER = "gap larger with Adam", "gap smaller with Adam"
#: the head contrast ``gap(head) - gap(linear)``;
HEAD_LARGER, HEAD_SMALLER = "larger gap than linear", "smaller gap than linear"
#: the shift contrast ``gap(ref) - gap(none)``;
SHIFT_LARGER, SHIFT_SMALLER = "larger gap at the shift", "smaller gap at the shift"
#: the step check ``gap(long budget) - gap(short budget)``;
STEPS_LARGER, STEPS_SMALLER = "gap larger with more steps", "gap smaller with more steps"
#: the BatchNorm head's two pinned modes, ``all_eval - backbone_eval``;
BN_HIGHER, BN_LOWER = "all_eval higher", "all_eval lower"
#: the link test: a rank correlation above / below zero.
LINK_POSITIVE, LINK_NEGATIVE = "rank correlation positive", "rank correlation negative"
#: Every direction word this page may print (``inference.is_verdict(text, DIRECTIONS)``).
DIRECTIONS = (GAP_HIGHER, GAP_LOWER, ADAM_HIGHER, ADAM_LOWER, HEAD_LARGER, HEAD_SMALLER, SHIFT_LARGER, SHIFT_SMALLER,
              STEPS_LARGER, STEPS_SMALLER, BN_HIGHER, BN_LOWER, LINK_POSITIVE, LINK_NEGATIVE)
#: The families of the page's claims (the ``family`` column of the claims tables) and the range each
#: quantity allows, to which printed interval ends are cut (:func:`bnstudy.pages.glue_claims`' ``clip``):
#: accuracy differences lie in [-1, 1], differences of two gaps in [-2, 2], rank correlations in [-1, 1].
CLIPS = {"gap": (-1, 1), "interaction": (-2, 2), "hc": (-2, 2), "sc": (-2, 2), "bn": (-1, 1), "steps": (-2, 2),
         "checks": None, "link": (-1, 1)}


def lr_edges(lrs: dict, grids: dict) -> list[tuple]:
    """The chosen rates at an end of their grid: ``[(key, lr, "top" | "bottom"), ...]`` (``key`` as in
    ``lrs``), in ``lrs``' order. A rate at the top (bottom) end might be beaten by a larger (smaller) one."""
    out = []
    for k, v in lrs.items():
        g = grids.get(k[1])
        if g is None or len(g) < 2:
            continue
        if v == max(g):
            out.append((k, v, "top"))
        elif v == min(g):
            out.append((k, v, "bottom"))
    return out


@dataclass(frozen=True)
class LrChoice:
    """One shift's chosen rates for the page: ``lrs`` (``{"<head>_<optimizer>_<mode>": lr}``), ``n_lr`` of
    them, ``n_lr_at_edge`` at an end of their grid and ``lr_edge_cells`` naming those (:func:`lr_edges`)."""

    lrs: dict
    n_lr: int
    n_lr_at_edge: int
    lr_edge_cells: str


def lr_choice_findings(lrs: dict, grids: dict) -> LrChoice:
    """:class:`LrChoice` from one shift's :func:`chosen_lrs` and the grids (``{optimizer: grid}``)."""
    edges = lr_edges(lrs, grids)
    return LrChoice(lrs={"_".join(k): float(v) for k, v in lrs.items()}, n_lr=len(lrs), n_lr_at_edge=len(edges),
                    lr_edge_cells=_edge_text(edges))


@dataclass(frozen=True)
class SearchFindings:
    """The learning-rate search read as a sensitivity check (tuning seeds, validation set; fractions 0..1).

    Per ``"<head>_<optimizer>"``: ``gap_own_rates`` = ``separate_stats`` at its own best rate minus
    ``backbone_eval`` at its own best rate (the chapter's rule; the book's sign, positive when pinning costs);
    ``gap_mean_rate`` = the same two modes at the one rate the mode-averaged rule picks (the first full run's
    rule); ``lr_mean_rule`` that rate; ``lr_pinned`` / ``lr_separate`` each side's own best rate. No intervals:
    the search has few tuning seeds and selects its maxima, so these are descriptions of the search, not tests.
    """

    gap_own_rates: dict
    gap_mean_rate: dict
    lr_mean_rule: dict
    lr_pinned: dict
    lr_separate: dict


def search_findings(search: pd.DataFrame) -> SearchFindings:
    """:class:`SearchFindings` from :func:`lr_search`'s rows at one shift (:func:`search_at`; or any table with
    ``head, optimizer, lr, mode, task_b``). Raises ``ValueError`` if ``backbone_eval`` or ``separate_stats`` is
    missing, or the table covers several shifts."""
    search = search_at(search, None)
    missing = {REFERENCE_MODE, "separate_stats"} - set(search["mode"])
    if missing:
        raise ValueError(f"search_findings needs modes {sorted(missing)} in the search")
    t = search_table(search)
    own, at_mean, lr_mean, lr_p, lr_s = {}, {}, {}, {}, {}
    mean_rule = chosen_lrs(search, "mean")
    for (h, o), g in t[t["mode"] != "mean"].groupby(["head", "optimizer"], sort=False):
        piv = g.pivot(index="lr", columns="mode", values="val_accuracy").sort_index()
        pinned, sep = piv[REFERENCE_MODE], piv["separate_stats"]
        k = f"{h}_{o}"
        own[k] = float(sep.max() - pinned.max())
        lr_p[k] = float(pinned.index[pinned == pinned.max()].min())
        lr_s[k] = float(sep.index[sep == sep.max()].min())
        lr_mean[k] = mean_rule[(h, o)]
        at_mean[k] = float(sep[lr_mean[k]] - pinned[lr_mean[k]])
    return SearchFindings(gap_own_rates=own, gap_mean_rate=at_mean, lr_mean_rule=lr_mean, lr_pinned=lr_p,
                          lr_separate=lr_s)


@dataclass(frozen=True)
class StepsFindings:
    """The step-count check at chapter 1's shift, linear head, per optimizer (``"sgd"``, ``"adam"``), on the
    check's seeds; 95% Student-t intervals over those seeds (:func:`bnstudy.inference.t_interval`; fractions 0..1).

    ``steps_short`` / ``steps_long``: the two budgets; ``n_seeds``. ``gap_short`` / ``gap_long``:
    ``task_b(separate_stats) - task_b(backbone_eval)`` per seed at each budget; ``separate_gain`` /
    ``pinned_gain``: task-B accuracy long minus short for each mode (how far from converged the short budget
    is). The change of the gap and its verdict: :func:`steps_claims`.
    """

    steps_short: int
    steps_long: int
    n_seeds: int
    gap_short: dict
    gap_long: dict
    separate_gain: dict
    pinned_gain: dict


def _steps_pairs(short: pd.DataFrame, long: pd.DataFrame) -> tuple[list, dict]:
    """The check's seeds and, per optimizer, the per-seed task-B series ``(pinned short, separate short, pinned
    long, separate long)``. Raises ``ValueError`` if ``long`` is empty or a seed lacks a mode."""
    if not len(long):
        raise ValueError("steps_findings: the step-count check has no rows (linear head and sgd/adam needed)")
    seeds = sorted(set(long["seed"]))
    sel = lambda d, o, m: d[(d["shift"] == "ref") & (d["head"] == STEPS_CHECK_HEAD) & (d["optimizer"] == o)
                            & (d["mode"] == m) & d["seed"].isin(seeds)].set_index("seed")["task_b"].reindex(seeds)
    out = {}
    for o in [o for o in STEPS_CHECK_OPTIMIZERS if o in set(long["optimizer"])]:
        parts = tuple(sel(d, o, m) for d in (short, long) for m in (REFERENCE_MODE, "separate_stats"))
        if pd.concat(parts).isna().any():
            raise ValueError(f"steps_findings: optimizer {o!r} lacks backbone_eval or separate_stats for some seed")
        out[o] = parts
    return seeds, out


def steps_findings(short: pd.DataFrame, long: pd.DataFrame) -> StepsFindings:
    """:class:`StepsFindings` from the main sweep's rows (``short``) and :func:`steps_check`'s (``long``),
    paired on the long table's seeds. Raises ``ValueError`` if ``long`` is empty or a seed lacks a mode."""
    seeds, pairs = _steps_pairs(short, long)
    gs, gl, sep, pin = {}, {}, {}, {}
    for o, (ps, ss, pl, sl) in pairs.items():
        gs[o], gl[o] = t_interval(ss - ps), t_interval(sl - pl)
        sep[o], pin[o] = t_interval(sl - ss), t_interval(pl - ps)
    return StepsFindings(steps_short=int(short["steps"].iloc[0]), steps_long=int(long["steps"].iloc[0]),
                         n_seeds=len(seeds), gap_short=gs, gap_long=gl, separate_gain=sep, pinned_gain=pin)


def steps_claims(short: pd.DataFrame, long: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The step check's claims (family ``steps``, one per optimizer, printed together: ``Family(m)``): per seed the
    gap at the long budget minus the gap at the short one, keys ``steps_change_<optimizer>``, verdict
    ``gap larger with more steps`` / ``gap smaller with more steps`` / ``equivalent within ±margin`` /
    ``not decided`` / ``too few seeds`` (:func:`bnstudy.inference.decide`). Raises as :func:`steps_findings`."""
    _, pairs = _steps_pairs(short, long)
    fam = Family(max(len(pairs), 1), alpha)
    claims = [decide((sl - pl) - (ss - ps), f"steps_change_{o}", margin=margin, family=fam, higher=STEPS_LARGER,
                     lower=STEPS_SMALLER) for o, (ps, ss, pl, sl) in pairs.items()]
    return family_table(claims, "steps", fam, [dict(optimizer=o) for o in pairs], alpha)


# --- the gap and the findings ------------------------------------------------------------------------------------

def family_table(claims: list, family: str, fam: Family, extra: list[dict], alpha: float = 0.05) -> pd.DataFrame:
    """One family's claims as a table: :func:`bnstudy.inference.claims_table` (Holm's ``p_adjusted`` over these
    claims) with the columns ``family``, ``m`` (the family's size) and ``extra`` (one dict per claim: what the
    claim is about, e.g. ``shift, head, optimizer``), and ``count_kind``: the kind a count of cells uses (the
    glossary's rule: a direction, ``higher`` / ``lower`` by the estimate's sign, where Holm's adjusted p is below
    ``alpha``; otherwise the verdict's kind: :func:`bnstudy.inference.count_kinds`). Holm calls at least the cells whose Bonferroni interval excludes
    zero, so a cell can count as a direction while its printed verdict is ``not decided``."""
    t = claims_table(claims, family=family)
    t["m"] = fam.m
    for k in (extra[0] if extra else {}):
        t[k] = [e[k] for e in extra]
    t["count_kind"] = count_kinds(t, alpha) if len(t) else pd.Series(dtype=str)
    return t


def verdict_counts(table: pd.DataFrame, alpha: float = 0.05) -> dict:
    """``{kind: count}`` of one family's claims for ``higher``, ``lower``, ``equivalent``, ``not decided`` and
    ``too few seeds`` (every kind present, 0 if none): the book's counts rule,
    :func:`bnstudy.inference.count_verdicts` (Holm directions, printed kinds otherwise)."""
    c = count_verdicts(table, alpha)
    return {k: int(c[k]) for k in ("higher", "lower", "equivalent", "not decided", "too few seeds")}


def gap_values(df: pd.DataFrame, shift: str, head: str, optimizer: str) -> pd.Series:
    """The per-seed gap of a cell, ``task_b(separate_stats) - task_b(backbone_eval)``, indexed by seed
    (:func:`bnstudy.inference.paired_differences`: a seed without both modes is left out). Raises ``ValueError``
    if the cell has no rows or lacks one of the two modes."""
    cell = df[(df["shift"] == shift) & (df["head"] == head) & (df["optimizer"] == optimizer)]
    if not len(cell):
        raise ValueError(f"gap: no rows for cell ({shift}, {head}, {optimizer})")
    return paired_differences(cell, "task_b", "mode", "separate_stats", REFERENCE_MODE)


def equivalence_max_sd(margin: float, n: int, family: Family = Family()) -> float:
    """The largest per-seed standard deviation of a gap whose mean is exactly 0 that the equivalence test of
    :func:`bnstudy.inference.decide` (TOST at ``family.level``) can still call equivalent within ``±margin``:
    ``margin`` over the half-width of the ``1 - 2 level`` t interval of ``n`` values of standard deviation 1 (TOST
    passes exactly when that interval lies inside the margin). The design's feasibility; NaN for ``n < 2``."""
    if n < 2:
        return math.nan
    unit = np.arange(n, dtype=float)
    unit = (unit - unit.mean()) / unit.std(ddof=1)
    return float(margin / t_interval(unit, 1 - 2 * family.level).high)


def gap_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The gap claims (family ``gap``), one per (shift, head, optimizer), keys ``gap_<shift>_<head>_<optimizer>``:
    :func:`bnstudy.inference.decide` on the per-seed gap (:func:`gap_values`) with the ``m`` head x optimizer cells
    of one shift as one :class:`bnstudy.inference.Family` (Bonferroni intervals, TOST at ``alpha / m``, Holm over
    the shift's cells). Columns: :func:`family_table`'s plus ``shift, head, optimizer, sd`` (the gap's per-seed
    standard deviation), ``task_b_pinned`` / ``task_b_separate`` (the two modes' mean task-B accuracy)."""
    parts = []
    for shift, g in df.groupby("shift", sort=False):
        cells = list(dict.fromkeys(zip(g["head"], g["optimizer"])))
        fam = Family(len(cells), alpha)
        claims, extra = [], []
        for h, o in cells:
            d = gap_values(df, shift, h, o)
            claims.append(decide(d, f"gap_{shift}_{h}_{o}", margin=margin, family=fam, higher=GAP_HIGHER,
                                 lower=GAP_LOWER))
            c = g[(g["head"] == h) & (g["optimizer"] == o)]
            extra.append(dict(shift=shift, head=h, optimizer=o, sd=float(np.std(d, ddof=1)) if len(d) > 1 else math.nan,
                              task_b_pinned=float(c[c["mode"] == REFERENCE_MODE]["task_b"].mean()),
                              task_b_separate=float(c[c["mode"] == "separate_stats"]["task_b"].mean())))
        parts.append(family_table(claims, "gap", fam, extra, alpha))
    return pd.concat(parts, ignore_index=True)


def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy task-B and task-A accuracy per ``shift, head, optimizer, mode``: ``metric, mean, ci_low, ci_high,
    n_seeds`` (95% Student-t over seeds, :func:`bnstudy.inference.t_interval`, not corrected; for display)."""
    rows = []
    for key, g in df.groupby(["shift", "head", "optimizer", "mode"], sort=False):
        for metric in ("task_b", "task_a_after"):
            iv = t_interval(g[metric])
            rows.append(dict(zip(("shift", "head", "optimizer", "mode"), key), metric=metric, mean=iv.mean,
                             ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


def _difference_of_gaps(df, cond: tuple, ref: tuple) -> pd.Series:
    """Per seed ``gap(cond) - gap(ref)``, each a ``(shift, head, optimizer)`` cell; seeds in both only."""
    return (gap_values(df, *cond) - gap_values(df, *ref)).dropna()


def interaction_table(df: pd.DataFrame, a: str = "adam", b: str = "sgd", shift: str = "ref", margin: float = 0.02,
                      alpha: float = 0.05) -> pd.DataFrame:
    """The optimizer interaction (family ``interaction``) per head at ``shift``: per seed ``gap(a) - gap(b)``,
    keys ``<a>_vs_<b>_<head>``, one :class:`bnstudy.inference.Family` over the heads; verdict ``gap larger with
    Adam`` (pinning costs more with Adam) / ``gap smaller with Adam`` / equivalence / ``not decided``. Columns:
    :func:`family_table`'s plus ``head``; empty if ``a`` or ``b`` is missing."""
    d = df[df["shift"] == shift]
    heads = [h for h in dict.fromkeys(d["head"]) if {a, b} <= set(d[d["head"] == h]["optimizer"])]
    fam = Family(max(len(heads), 1), alpha)
    claims = [decide(_difference_of_gaps(df, (shift, h, a), (shift, h, b)), f"{a}_vs_{b}_{h}", margin=margin,
                     family=fam, higher=ADAM_HIGHER, lower=ADAM_LOWER) for h in heads]
    t = family_table(claims, "interaction", fam, [dict(head=h) for h in heads], alpha)
    return t if heads else t.assign(head=pd.Series(dtype=str))


def head_contrast_table(df: pd.DataFrame, reference: str = STEPS_CHECK_HEAD, shift: str = "ref",
                        margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """Does a head change the gap? (family ``hc``) Per optimizer and head, per seed ``gap(head) - gap(reference)``
    at ``shift``, keys ``hc_<head>_<optimizer>``, one :class:`bnstudy.inference.Family` over the head x optimizer
    contrasts; verdict ``larger gap than linear`` (pinning costs more with that head) / ``smaller gap than linear``
    / equivalence / ``not decided``. Columns: :func:`family_table`'s plus ``head, optimizer``, ``separate`` /
    ``separate_reference`` (the two heads' mean ``separate_stats`` task-B accuracy: a smaller gap can come from
    a worse separate side). Raises ``ValueError`` if ``reference`` has no rows at ``shift``."""
    d = df[df["shift"] == shift]
    if reference not in set(d["head"]):
        raise ValueError(f"head_contrast_table: reference head {reference!r} has no rows at shift {shift!r}")
    heads = [h for h in dict.fromkeys(d["head"]) if h != reference]
    opts = list(dict.fromkeys(d["optimizer"]))
    fam = Family(max(len(heads) * len(opts), 1), alpha)
    sep = lambda head, o: float(d[(d["head"] == head) & (d["optimizer"] == o)
                                  & (d["mode"] == "separate_stats")]["task_b"].mean())
    claims, extra = [], []
    for o in opts:
        for h in heads:
            claims.append(decide(_difference_of_gaps(df, (shift, h, o), (shift, reference, o)), f"hc_{h}_{o}",
                                 margin=margin, family=fam, higher=HEAD_LARGER, lower=HEAD_SMALLER))
            extra.append(dict(head=h, optimizer=o, separate=sep(h, o), separate_reference=sep(reference, o)))
    t = family_table(claims, "hc", fam, extra, alpha)
    return t if extra else t.assign(head=pd.Series(dtype=str), optimizer=pd.Series(dtype=str),
                                    separate=pd.Series(dtype=float), separate_reference=pd.Series(dtype=float))


def shift_contrast_table(df: pd.DataFrame, shift: str = "ref", base: str = "none", margin: float = 0.02,
                         alpha: float = 0.05) -> pd.DataFrame:
    """Does the shift make the gap? (family ``sc``) Per head and optimizer, per seed ``gap(shift) - gap(base)``
    (the pairing is the seed: same backbone, head initialization and task-B stream), keys ``sc_<head>_<optimizer>``,
    one :class:`bnstudy.inference.Family` over the cells; verdict ``larger gap at the shift`` (pinning costs more
    at ``shift``) / ``smaller gap at the shift`` / equivalence / ``not decided``. Columns: :func:`family_table`'s
    plus ``head, optimizer``. Raises ``ValueError`` if either shift has no rows."""
    for name in (shift, base):
        if name not in set(df["shift"]):
            raise ValueError(f"shift_contrast_table: no rows at shift {name!r}")
    d = df[df["shift"] == shift]
    cells = list(dict.fromkeys(zip(d["head"], d["optimizer"])))
    fam = Family(max(len(cells), 1), alpha)
    claims = [decide(_difference_of_gaps(df, (shift, h, o), (base, h, o)), f"sc_{h}_{o}", margin=margin, family=fam,
                     higher=SHIFT_LARGER, lower=SHIFT_SMALLER) for h, o in cells]
    return family_table(claims, "sc", fam, [dict(head=h, optimizer=o) for h, o in cells], alpha)


def bn_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05, head: str = "mlp_bn") -> pd.DataFrame:
    """The BatchNorm head's two pinned modes (family ``bn``): per shift and optimizer, per seed
    ``task_b(all_eval) - task_b(backbone_eval)`` of ``head``, keys ``bn_<shift>_<optimizer>``, one
    :class:`bnstudy.inference.Family` over the table's cells; ``too few seeds`` where ``head`` has no rows."""
    shifts, opts = list(dict.fromkeys(df["shift"])), _optimizers(df)
    fam = Family(max(len(shifts) * len(opts), 1), alpha)
    claims, extra = [], []
    for s in shifts:
        for o in opts:
            c = df[(df["shift"] == s) & (df["optimizer"] == o) & (df["head"] == head)]
            d = paired_differences(c, "task_b", "mode", "all_eval", REFERENCE_MODE) if len(c) else []
            claims.append(decide(d, f"bn_{s}_{o}", margin=margin, family=fam, higher=BN_HIGHER, lower=BN_LOWER))
            extra.append(dict(shift=s, optimizer=o))
    return family_table(claims, "bn", fam, extra, alpha)


def checks_table(df: pd.DataFrame) -> pd.DataFrame:
    """The identities of the code as exact checks (family ``checks``; :func:`bnstudy.inference.exact_check`):
    ``check_train_is_separate`` (``train_mode`` minus ``separate_stats`` task-B accuracy is 0 in every seed, shift,
    head and optimizer: the same backbone statistics see the same stream), ``check_pinned_keep_a`` (task A after
    minus before is 0 in every run of both pinned modes), ``check_task_a_loss_shared`` (``train_mode``'s task-A
    accuracy after stage 2 minus its value for the first head and optimizer of the same seed and shift is 0: the
    head does not touch the backbone's buffers)."""
    piv = df.pivot_table(index=["shift", "head", "optimizer", "seed"], columns="mode", values="task_b",
                         aggfunc="first")
    pinned = df[df["mode"].isin(PINNED_MODES)]
    tm = df[df["mode"] == "train_mode"]
    shared = tm["task_a_after"] - tm.groupby(["shift", "seed"])["task_a_after"].transform("first")
    claims = [exact_check(piv["train_mode"] - piv["separate_stats"], key="check_train_is_separate"),
              exact_check(pinned["task_a_after"] - pinned["task_a_before"], key="check_pinned_keep_a"),
              exact_check(shared, key="check_task_a_loss_shared")]
    return family_table(claims, "checks", Family(len(claims)), [{} for _ in claims])


def _optimizers(df: pd.DataFrame) -> list:
    return sorted(set(df["optimizer"]), key=lambda o: OPTIMIZERS.index(o) if o in OPTIMIZERS else 99)


def _cells(names) -> str:
    return ", ".join(names) if names else "none"


def _cell_names(table: pd.DataFrame, kind: str) -> list[str]:
    """``head/optimizer`` of a family table's rows that count as ``kind`` (:func:`family_table`)."""
    t = table[table["count_kind"] == kind]
    return [f"{h}/{o}" for h, o in zip(t["head"], t["optimizer"])]


@dataclass(frozen=True)
class ShiftContrast:
    """:func:`shift_contrast_table` for the prose: ``m`` contrasts at ``confidence``; counts (Holm) and
    ``head/optimizer`` lists of cells whose gap is larger / smaller at the shift (``none`` if empty)."""

    m: int
    confidence: float
    n_larger: int
    n_smaller: int
    larger_cells: str
    smaller_cells: str


def shift_contrast_findings(table: pd.DataFrame) -> ShiftContrast:
    """:class:`ShiftContrast` from :func:`shift_contrast_table`'s output."""
    c = verdict_counts(table)
    return ShiftContrast(m=int(len(table)), confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
                         n_larger=c["higher"], n_smaller=c["lower"], larger_cells=_cells(_cell_names(table, "higher")),
                         smaller_cells=_cells(_cell_names(table, "lower")))


@dataclass(frozen=True)
class HeadContrast:
    """:func:`head_contrast_table` for the prose: ``m`` contrasts at ``confidence``; counts (Holm) and the
    contrasts (``head/optimizer``) with a smaller / larger gap than the linear head (``smaller_cells`` /
    ``larger_cells``, ``none`` if empty); ``n_smaller_worse_separate`` / ``smaller_worse_separate_cells``: those
    smaller-gap contrasts whose head reaches a lower ``separate_stats`` accuracy than the linear head (the gap
    shrinks from the separate side)."""

    m: int
    confidence: float
    n_smaller: int
    n_larger: int
    smaller_cells: str
    larger_cells: str
    n_smaller_worse_separate: int
    smaller_worse_separate_cells: str


def head_contrast_findings(table: pd.DataFrame) -> HeadContrast:
    """:class:`HeadContrast` from :func:`head_contrast_table`'s output."""
    c = verdict_counts(table)
    worse = [f"{r.head}/{r.optimizer}" for r in table.itertuples()
             if r.count_kind == "lower" and r.separate < r.separate_reference]
    return HeadContrast(m=int(len(table)), confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
                        n_smaller=c["lower"], n_larger=c["higher"], smaller_cells=_cells(_cell_names(table, "lower")),
                        larger_cells=_cells(_cell_names(table, "higher")), n_smaller_worse_separate=len(worse),
                        smaller_worse_separate_cells=_cells(worse))


@dataclass(frozen=True)
class Record:
    """The numbers chapter 4's prose cites beside its claims (accuracies are fractions 0..1).

    ``n_seeds``; the gap family (one shift's cells): ``n_cells`` (its ``m``), ``confidence`` (of its Bonferroni
    intervals), ``margin``. Counts per shift (Holm's rule, :func:`family_table`): ``n_separate_higher`` (separate_stats
    higher: pinning costs), ``n_separate_lower``, ``n_equivalent``, ``n_not_decided``, ``n_too_few``; ``separate_higher_ref`` /
    ``equivalent_ref``: those cells at chapter 1's shift as ``head/optimizer`` lists (``none`` if empty).

    Equivalence feasibility: ``equiv_max_sd``, the largest per-seed SD for which a gap of mean exactly 0 could be
    shown equivalent at this design (:func:`equivalence_max_sd`); ``equiv_sd_median`` and ``n_equiv_feasible``
    per shift: the median observed SD and the cells whose SD is below ``equiv_max_sd``.

    ``interaction_m`` / ``interaction_confidence``, ``bn_m`` / ``bn_confidence``: the other families' sizes and
    interval confidence. ``f3_heads_holding``: per optimizer, for how many heads the gap at chapter 1's shift counts
    as ``separate_stats higher`` (Holm); ``f3_rate_edge``: per optimizer, ``a rate at the grid's edge`` if one of
    the linear head's chosen rates (``backbone_eval`` or ``separate_stats``) sits at an end of its grid, else
    ``rates inside the grid``. ``train_mode_task_a_change``: ``task_a_after - task_a_before`` of ``train_mode`` at
    chapter 1's shift (one head and optimizer, negative = lost; 95% t interval).

    Best absolute accuracy at chapter 1's shift: ``best_pinned_cell`` (``head/optimizer`` with the highest
    ``backbone_eval`` accuracy), ``best_pinned_acc``, ``best_separate_cell``, ``best_separate_acc``; the best pinned
    cell's gap claim (estimate, interval, verdict) is the claims table's row (:func:`best_pinned_claim`).

    ``lrs``: the chosen rates (``"<head>_<optimizer>[_<mode>]"``); ``n_lr_at_edge`` and ``lr_edge_cells``.
    ``n_eval``: test images per accuracy (0 if absent); ``eval_se``: the binomial standard error of one accuracy at
    the mean ``separate_stats`` task-B accuracy at chapter 1's shift (NaN without ``n_eval``); ``margin_in_se``.
    """

    n_seeds: int
    n_cells: int
    confidence: float
    margin: float
    chance: float
    n_separate_higher: dict
    n_separate_lower: dict
    n_equivalent: dict
    n_not_decided: dict
    n_too_few: dict
    separate_higher_ref: str
    equivalent_ref: str
    equiv_max_sd: float
    equiv_sd_median: dict
    n_equiv_feasible: dict
    interaction_m: int
    interaction_confidence: float
    bn_m: int
    bn_confidence: float
    f3_heads_holding: dict
    f3_rate_edge: dict
    train_mode_task_a_change: Interval
    best_pinned_cell: str
    best_pinned_acc: float
    best_separate_cell: str
    best_separate_acc: float
    lrs: dict
    n_lr_at_edge: int
    lr_edge_cells: str
    n_eval: int
    eval_se: float
    margin_in_se: float


@dataclass(frozen=True)
class Findings:
    """Chapter 4's findings: ``claims``, every claim of the page's main comparisons as one table (families
    ``gap``, ``interaction``, ``hc``, ``sc``, ``bn``, ``checks``; :func:`family_table`'s columns), glued by key with
    :func:`bnstudy.pages.glue_claims` (per family, at :data:`CLIPS`), and ``record``, the few numbers beside them
    (:class:`Record`, glued with :func:`bnstudy.pages.glue_findings`)."""

    claims: pd.DataFrame
    record: Record

    def claim(self, key: str) -> pd.Series:
        """The claims-table row of ``key``. Raises ``KeyError`` naming it if absent."""
        t = self.claims[self.claims["key"] == key]
        if not len(t):
            raise KeyError(f"no claim {key!r}")
        return t.iloc[0]


def _edge_text(edges) -> str:
    return _cells([f"{'/'.join(k)} at the {end} ({v:g})" for k, v, end in edges])


def findings(df: pd.DataFrame, lrs: dict | None = None, grids: dict | None = None, margin: float = 0.02,
             alpha: float = 0.05) -> Findings:
    """Chapter 4's findings from :func:`run`'s table (``shift`` column; all four modes).

    ``lrs``: :func:`chosen_lrs`' output (per mode or per head and optimizer) and ``grids``
    (``{optimizer: grid}``) for the search's numbers. The head and shift contrasts need the linear head and
    the ``none`` shift (without them those families are left out). Raises ``ValueError`` if a mode or chapter 1's
    shift (``shift == "ref"``) is missing.
    """
    missing = set(MODE_NAMES) - set(df["mode"])
    if missing:
        raise ValueError(f"findings needs all four modes; missing {sorted(missing)}")
    if "ref" not in set(df["shift"]):
        raise ValueError("findings needs chapter 1's shift (rows with shift == 'ref')")
    gt = gap_table(df, margin, alpha)
    inter = interaction_table(df, margin=margin, alpha=alpha)
    bn = bn_table(df, margin, alpha)
    parts = [gt, inter, bn, checks_table(df)]
    if "linear" in set(df[df["shift"] == "ref"]["head"]):
        parts.append(head_contrast_table(df, margin=margin, alpha=alpha))
    if "none" in set(df["shift"]):
        parts.append(shift_contrast_table(df, margin=margin, alpha=alpha))
    claims = pd.concat([p for p in parts if len(p)], ignore_index=True)

    by_shift = {s: verdict_counts(g) for s, g in gt.groupby("shift", sort=False)}
    count = lambda kind: {s: c[kind] for s, c in by_shift.items()}
    ref = gt[gt["shift"] == "ref"]
    label = lambda d: [f"{h}/{o}" for h, o in zip(d["head"], d["optimizer"])]
    n = int(df["seed"].nunique())
    fam = Family(int(ref["m"].iloc[0]), alpha)
    max_sd = equivalence_max_sd(margin, n, fam)
    opts = _optimizers(df)
    holding = {o: int(((ref["optimizer"] == o) & (ref["count_kind"] == "higher")).sum()) for o in opts}

    tm = df[(df["mode"] == "train_mode") & (df["shift"] == "ref")]
    first = tm[(tm["head"] == tm["head"].iloc[0]) & (tm["optimizer"] == tm["optimizer"].iloc[0])]
    change = t_interval(first["task_a_after"] - first["task_a_before"])

    bp = ref.loc[ref["task_b_pinned"].idxmax()]
    bs = ref.loc[ref["task_b_separate"].idxmax()]
    lrs = lrs or {}
    edges = lr_edges(lrs, grids or {})
    edge_keys = {k for k, _, _ in edges}
    f3_edge = {}
    for o in opts:
        ks = {("linear", o, m) for m in (REFERENCE_MODE, "separate_stats")} | {("linear", o)}
        f3_edge[o] = "a rate at the grid's edge" if ks & edge_keys else "rates inside the grid"
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df else 0
    p_sep = float(ref["task_b_separate"].mean())
    se = math.sqrt(p_sep * (1 - p_sep) / n_eval) if n_eval else math.nan
    record = Record(
        n_seeds=n, n_cells=fam.m, confidence=fam.confidence, margin=margin,
        chance=1 / int(df["n_classes"].iloc[0]) if "n_classes" in df else 0.1,
        n_separate_higher=count("higher"), n_separate_lower=count("lower"), n_equivalent=count("equivalent"),
        n_not_decided=count("not decided"), n_too_few=count("too few seeds"),
        separate_higher_ref=_cells(label(ref[ref["count_kind"] == "higher"])),
        equivalent_ref=_cells(label(ref[ref["count_kind"] == "equivalent"])),
        equiv_max_sd=max_sd,
        equiv_sd_median={s: float(g["sd"].median()) for s, g in gt.groupby("shift", sort=False)},
        n_equiv_feasible={s: int((g["sd"] < max_sd).sum()) for s, g in gt.groupby("shift", sort=False)},
        interaction_m=int(inter["m"].iloc[0]) if len(inter) else 0,
        interaction_confidence=float(inter["confidence"].iloc[0]) if len(inter) else math.nan,
        bn_m=int(bn["m"].iloc[0]), bn_confidence=float(bn["confidence"].iloc[0]),
        f3_heads_holding=holding, f3_rate_edge=f3_edge, train_mode_task_a_change=change,
        best_pinned_cell=f"{bp['head']}/{bp['optimizer']}", best_pinned_acc=float(bp["task_b_pinned"]),
        best_separate_cell=f"{bs['head']}/{bs['optimizer']}",
        best_separate_acc=float(bs["task_b_separate"]),
        lrs={"_".join(k): v for k, v in lrs.items()}, n_lr_at_edge=len(edges), lr_edge_cells=_edge_text(edges),
        n_eval=n_eval, eval_se=se, margin_in_se=margin / se if se > 0 else math.nan,
    )
    return Findings(claims=claims, record=record)


# --- the page's answer: sentences chosen by the findings (issue 25) -------------------------------------------------

#: Labels of the optimizers in the page's sentences.
OPTIMIZER_WORDS = {"sgd": "SGD with momentum", "sgd_plain": "plain SGD", "adam": "Adam"}


def _bold(text: str) -> str:
    return f"**{text}**"


def _num(v: float, fmt: str = "+.3f") -> str:
    """A number for the page's prose; ``n/a`` for NaN (a page never prints NaN)."""
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _span(low: float, high: float, clip: tuple = (-1, 1)) -> str:
    """``-0.004 to +0.027`` (ends cut to ``clip``), or ``no interval``."""
    if math.isnan(low) or math.isnan(high):
        return "no interval"
    lo, hi = (min(max(v, clip[0]), clip[1]) for v in (low, high))
    return f"{lo:+.3f} to {hi:+.3f}"


def gap_counts(F: "Findings", shift: str = "ref") -> dict:
    """The counts of one shift's gap family (:func:`bnstudy.inference.count_verdicts`: Holm directions, printed
    kinds otherwise), with ``m``. Raises ``ValueError`` if the shift has no gap claims."""
    t = F.claims[(F.claims["family"] == "gap") & (F.claims["shift"] == shift)]
    if not len(t):
        raise ValueError(f"gap_counts: no gap claims at shift {shift!r}")
    return count_verdicts(t)


def headline(F: "Findings") -> str:
    """The answer's first sentence, chosen by the counts of the gap family at chapter 1's shift: whether the
    heads and optimizers tried make up for pinned statistics (all cells a cost shown, none, every cell
    equivalent, or a mix), with the counts spliced in."""
    c = gap_counts(F)
    m, hi, lo, eq = c["m"], c["higher"], c["lower"], c["equivalent"]
    und = c["not decided"] + c["too few seeds"]
    eqw = equivalent_text(F.record.margin)
    counts = (f"the {m} head and optimizer cells split into {hi} where separate statistics score higher on task B "
              f"than the pinned backbone, {lo} where they score lower, {eq} {eqw} and {und} not decided")
    if hi == m:
        lead = "No head or optimizer tried makes up for pinned statistics at chapter 1's shift"
    elif hi == 0 and eq == m:
        lead = f"Every head and optimizer tried makes up for pinned statistics at chapter 1's shift, within ±{F.record.margin:g}"
    elif hi == 0 and lo == 0:
        lead = "No head and optimizer cell shows a cost of pinned statistics at chapter 1's shift, and not every one is shown to be without one"
    elif hi == 0:
        lead = "No head and optimizer cell shows a cost of pinned statistics at chapter 1's shift"
    elif lo == 0 and eq == 0:
        lead = "No head or optimizer tried is shown to make up for pinned statistics at chapter 1's shift"
    elif lo == 0 and hi + eq == m:
        lead = "Some heads and optimizers make up for pinned statistics at chapter 1's shift and others do not"
    else:
        lead = "Whether a head or optimizer makes up for pinned statistics at chapter 1's shift depends on the cell"
    return (f"{lead}: with every freeze mode at its own tuned learning rate, {counts} (counted by Holm; the words "
            f"are the [glossary](../glossary.html)'s).")


def linear_sentence(F: "Findings") -> str:
    """The seed's linear head, per optimizer: its gap verdicts at chapter 1's shift, spliced into fixed words."""
    parts = []
    for o in ("sgd", "sgd_plain", "adam"):
        t = F.claims[F.claims["key"] == f"gap_ref_linear_{o}"]
        if len(t):
            parts.append(f"{_bold(t.iloc[0]['verdict'])} with {OPTIMIZER_WORDS[o]}")
    if not parts:
        return ""
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"For the seed's linear head, separate minus pinned statistics on task B reads {listed}."


def best_pinned_claim(F: "Findings") -> pd.DataFrame:
    """The gap claim of the best pinned cell (:attr:`Record.best_pinned_cell`, chapter 1's shift) as a one-row
    claims table under the key ``best_pinned_gap``, for :func:`glue_page_claims` (``ch04_best_pinned_gap_estimate``,
    ``_low``, ``_high``, ``_verdict``, ...: the page cites the best cell without knowing which it is)."""
    key = "gap_ref_" + F.record.best_pinned_cell.replace("/", "_")
    return F.claims[F.claims["key"] == key].assign(key="best_pinned_gap")


def best_sentence(F: "Findings") -> str:
    """The best pinned configuration against the best separate one (absolute accuracies), with the gap claim of
    the best pinned cell (:func:`best_pinned_claim`)."""
    R = F.record
    g = best_pinned_claim(F).iloc[0]
    est, low, high = (float(g[c]) for c in ("estimate", "low", "high"))
    return (f"The best pinned configuration, {_bold(R.best_pinned_cell)}, reaches {_num(R.best_pinned_acc, '.3f')} "
            f"against {_num(R.best_separate_acc, '.3f')} for the best one with separate statistics "
            f"({_bold(R.best_separate_cell)}; separate minus pinned in the best pinned cell {_num(est)}, "
            f"{_span(low, high)}: {_bold(g['verdict'])}).")


def probe_sentence(probe: Interval, linear_gap_low: float = float("nan")) -> str:
    """The closed-form probe's reading (separate minus pinned features, 95% interval), chosen by where its interval
    lies: pinning loses linearly decodable information (above 0), the pinned features are the more decodable
    (below 0), or no loss is detected (spans 0); and, when ``linear_gap_low`` (the lower end of the linear head's
    gap with SGD and momentum) lies above the probe's interval, that the trained head's shortfall exceeds what the
    features lose."""
    if math.isnan(probe.low) or math.isnan(probe.high):
        return (f"A least-squares probe solved in closed form, free of any optimizer, reads {_num(probe.mean)} on "
                f"separate minus pinned features, without an interval (too few seeds).")
    head = (f"A least-squares probe solved in closed form, free of any optimizer, reads {_num(probe.mean)} "
            f"({_span(probe.low, probe.high)}) on separate minus pinned features")
    if probe.low > 0:
        body = ": pinning loses some linearly decodable information about task B"
    elif probe.high < 0:
        body = ": for this probe the pinned features are the more linearly decodable"
    else:
        body = ", an interval that includes zero: this probe detects no linearly decodable information lost to pinning"
    tail = ""
    if not math.isnan(linear_gap_low) and linear_gap_low > probe.high:
        tail = ("; the trained linear head with SGD and momentum falls short by more than that, a shortfall of "
                "optimization (rate and step budget) rather than of the features")
    return head + body + tail + "."


def answer(F: "Findings", probe: Interval | None = None) -> str:
    """The answer box's outcome sentences (Markdown), chosen and filled from the findings, so that they are true
    for any rows: :func:`headline`, :func:`linear_sentence`, :func:`best_sentence` and, given the geometry's
    ``probe`` interval (:class:`GeometryFindings`' ``probe_cost``), :func:`probe_sentence`."""
    parts = [headline(F), linear_sentence(F), best_sentence(F)]
    if probe is not None:
        t = F.claims[F.claims["key"] == "gap_ref_linear_sgd"]
        parts.append(probe_sentence(probe, float(t.iloc[0]["low"]) if len(t) else float("nan")))
    return " ".join(p for p in parts if p)


def advice(F: "Findings") -> str:
    """The answer box's "what to do" (Markdown), with the one front-door call, chosen by whether a cost of
    pinning is shown in any cell at chapter 1's shift."""
    c = gap_counts(F)
    lrs = F.record.lrs
    p, s = lrs.get("linear_sgd_backbone_eval"), lrs.get("linear_sgd_separate_stats")
    rates = (f" (here {p:g} pinned against {s:g} with separate statistics, for the linear head with SGD and momentum)"
             if p is not None and s is not None else "")
    pin = (f"Where task A must be kept, pin the backbone with `bnstudy.pin_eval(model.backbone)` and tune the new "
           f"head's learning rate for the pinned features{rates}.")
    if c["higher"]:
        return (pin + f" A deeper head, a normalizing head or another optimizer is no substitute for task B's own "
                f"statistics in the {c['higher']} of {c['m']} cells where pinning costs: where the new task must be as "
                f"good as it can be, give it its own statistics (the `separate_stats` mode, built with "
                f"`bnstudy.shared_weight_copy(model.backbone)`).")
    return pin + " At this shift no cell shows a cost of pinning that another head or optimizer would have to make up."


def vocabulary(margin: float) -> dict:
    """The page's verdict words by a short name (the glue keys ``ch04_w_<name>``), so that the notebook's
    definitions cite the words instead of typing them: every direction of :data:`DIRECTIONS`, the equivalence
    verdict at ``margin``, ``not decided`` and ``too few seeds``."""
    names = ("gap_higher", "gap_lower", "adam_higher", "adam_lower", "head_larger", "head_smaller", "shift_larger",
             "shift_smaller", "steps_larger", "steps_smaller", "bn_higher", "bn_lower", "link_positive",
             "link_negative")
    out = dict(zip(names, DIRECTIONS))
    out.update(equivalent=equivalent_text(margin), not_decided=NOT_DECIDED, too_few=TOO_FEW)
    return out


def geometry_sentences(G: "GeometryFindings") -> dict:
    """Sentences of the "why" section chosen by the geometry's numbers (Markdown, by name): ``curvature``, whether
    the added curvature under pinned statistics survives centring (the covariance's ratio at least half the second
    moment's) or comes mostly from the common offset."""
    if math.isnan(G.curvature_ratio) or math.isnan(G.curvature_centered_ratio):
        cur = "The centred ratio is not available."
    elif G.curvature_ratio <= 1:
        cur = "Pinned statistics add no curvature here."
    elif G.curvature_centered_ratio - 1 >= (G.curvature_ratio - 1) / 2:
        cur = "So most of the added curvature comes from the wider features, not from the common offset."
    else:
        cur = "So most of the added curvature comes from the common offset, not from the wider features."
    return {"curvature": cur}


def glue_page_claims(prefix: str, claims: pd.DataFrame) -> None:
    """Glue a claims table of this chapter (:func:`family_table`'s rows, any families) by key with
    :func:`bnstudy.pages.glue_claims`, each family's interval ends cut to its :data:`CLIPS` range."""
    from ...pages import glue_claims
    for fam, t in claims.groupby("family", sort=False):
        glue_claims(prefix, t, clip=CLIPS.get(fam))


def grid_text(grid) -> str:
    """A learning-rate grid for the page: ``0.005, 0.016, 0.05, 0.16``."""
    return ", ".join(f"{v:g}" for v in grid)


def geometry_summary(geom: pd.DataFrame) -> pd.DataFrame:
    """Mean and 95% interval over seeds (:func:`bnstudy.inference.t_interval`) of each geometry measure per
    ``shift, statistics`` (tidy)."""
    rows = []
    for key, g in geom.groupby(["shift", "statistics"], sort=False):
        for metric in ("scale_ratio", "offset_sd", "dead_fraction", "affine_r2", "curvature", "curvature_centered",
                       "mean_share", "probe_accuracy"):
            iv = t_interval(g[metric])
            rows.append(dict(shift=key[0], statistics=key[1], metric=metric, mean=iv.mean, ci_low=iv.low,
                             ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class GeometryFindings:
    """The explanation's numbers at one shift (means over seeds). ``probe_cost``: the closed-form probe's accuracy
    on separate-statistics features minus on pinned ones, per seed (positive: pinning loses linearly decodable
    information; 95% t interval, :func:`bnstudy.inference.t_interval`)."""

    scale_ratio: float
    offset_sd: float
    dead_fraction: float
    affine_r2: float
    curvature_ratio: float
    curvature_centered_ratio: float
    mean_share_pinned: float
    mean_share_separate: float
    probe_pinned: float
    probe_separate: float
    probe_cost: Interval


def geometry_findings(geom: pd.DataFrame, shift: str = "ref") -> GeometryFindings:
    """The numbers the "why" section cites, from :func:`feature_geometry`'s table at ``shift``."""
    g = geom[geom["shift"] == shift]
    p = g[g["statistics"] == "pinned"].set_index("seed")
    s = g[g["statistics"] == "separate"].set_index("seed").loc[p.index]
    return GeometryFindings(
        scale_ratio=float(p["scale_ratio"].mean()), offset_sd=float(p["offset_sd"].mean()),
        dead_fraction=float(p["dead_fraction"].mean()), affine_r2=float(p["affine_r2"].mean()),
        curvature_ratio=float((p["curvature"] / s["curvature"]).mean()),
        curvature_centered_ratio=float((p["curvature_centered"] / s["curvature_centered"]).mean()),
        mean_share_pinned=float(p["mean_share"].mean()), mean_share_separate=float(s["mean_share"].mean()),
        probe_pinned=float(p["probe_accuracy"].mean()), probe_separate=float(s["probe_accuracy"].mean()),
        probe_cost=t_interval(s["probe_accuracy"] - p["probe_accuracy"]))


#: The geometry measures the link test relates to the gap (``separate_stats - backbone_eval``, positive when pinning
#: costs), and the sign of the correlation each explanation predicts: a larger curvature ratio (pinned / separate:
#: steeper pinned features, the optimization story) should go with a larger gap; a larger probe difference
#: (separate minus pinned: information lost, the information story) likewise. Both positive.
LINK_MEASURES = {"curvature_ratio": 1, "probe_cost": 1}


def _pooled_interval(x, y, rows_of: list, confidence: float, n_boot: int, seed: int) -> Interval:
    """The pooled Spearman rho of ``x``, ``y`` with a percentile bootstrap interval over whole seeds
    (:func:`bnstudy.inference.bootstrap_interval`; ``rows_of[i]``: the rows of seed ``i``); no interval below
    :data:`bnstudy.inference.MIN_BOOTSTRAP_UNITS` seeds (bootstrap_interval's ``min_units``)."""
    pooled = lambda ix: rank_correlation(*(a[np.concatenate([rows_of[int(i)] for i in ix])] for a in (x, y)))[0]
    return bootstrap_interval((np.arange(len(rows_of)),), pooled, confidence, n_boot, seed,
                              min_units=MIN_BOOTSTRAP_UNITS)


def link_table(df: pd.DataFrame, geom: pd.DataFrame, head: str = "linear", n_boot: int = 2000, alpha: float = 0.05,
               seed: int = 0) -> pd.DataFrame:
    """Does the feature geometry track the gap? (family ``link``) Spearman's rank correlation between a per-seed
    geometry measure and the per-seed gap of ``head`` (:func:`gap_values`), per optimizer, from rows the run already
    has (no training); keys ``link_<scope>_<optimizer>_<measure>``.

    Measures (:data:`LINK_MEASURES`), per seed and shift from :func:`feature_geometry`'s table:
    ``curvature_ratio`` = pinned / separate largest eigenvalue of E[f f^T]; ``probe_cost`` = separate minus pinned
    closed-form probe accuracy. Scopes: ``ref`` (chapter 1's shift, one point per seed: the seed-to-seed link;
    :func:`bnstudy.inference.rank_correlation`, Fisher-z interval, ``too few seeds`` below 4 seeds) and ``all``
    (every shift, one point per seed and shift, which mixes in the shift's own effect on both sides; its points
    are not independent within a seed, so its interval is :func:`bnstudy.inference.bootstrap_interval`'s seeded
    percentile bootstrap over whole seeds, ``n_boot`` resamples, of the pooled Spearman rho, without a p-value;
    no interval below :data:`bnstudy.inference.MIN_BOOTSTRAP_UNITS` seeds).
    All rows are one :class:`bnstudy.inference.Family` (Bonferroni intervals at ``1 - alpha / m``). Verdict:
    ``rank correlation positive`` / ``rank correlation negative`` / ``not decided`` / ``too few seeds``.

    Columns: :func:`family_table`'s plus ``scope, optimizer, measure, predicted_sign, n_points``. Empty if
    ``head`` is not in ``df``. Raises ``ValueError`` if ``geom`` lacks a measure's columns.
    """
    need = {"seed", "shift", "statistics", "curvature", "probe_accuracy"} - set(geom.columns)
    if need:
        raise ValueError(f"link_table: the geometry table lacks columns {sorted(need)}")
    opts = [o for o in OPTIMIZERS if o in set(df[df["head"] == head]["optimizer"])]
    fam = Family(max(2 * len(opts) * len(LINK_MEASURES), 1), alpha)
    p = geom[geom["statistics"] == "pinned"].set_index(["seed", "shift"])
    q = geom[geom["statistics"] == "separate"].set_index(["seed", "shift"]).reindex(p.index)
    meas = pd.DataFrame({"curvature_ratio": p["curvature"] / q["curvature"],
                         "probe_cost": q["probe_accuracy"] - p["probe_accuracy"]}).reset_index()
    claims, extra = [], []
    for o in opts:
        gaps = []
        for shift in dict.fromkeys(df["shift"]):
            gv = gap_values(df, shift, head, o)
            gaps.append(pd.DataFrame({"seed": gv.index, "shift": shift, "gap": gv.to_numpy()}))
        tab = meas.merge(pd.concat(gaps), on=["seed", "shift"]).dropna()
        for scope in ("ref", "all"):
            t = tab[tab["shift"] == "ref"] if scope == "ref" else tab
            y = t["gap"].to_numpy()
            seeds = np.array(sorted(set(t["seed"])))
            rows_of = [np.flatnonzero(t["seed"].to_numpy() == s) for s in seeds]
            for m, sign in LINK_MEASURES.items():
                x = t[m].to_numpy()
                key = f"link_{scope}_{o}_{m}"
                if scope == "ref":
                    _, iv, pv = rank_correlation(x, y, fam.confidence)
                else:
                    iv, pv = _pooled_interval(x, y, rows_of, fam.confidence, n_boot, seed), math.nan
                claims.append(decide_interval(iv, key, p=pv, higher=LINK_POSITIVE, lower=LINK_NEGATIVE))
                extra.append(dict(scope=scope, optimizer=o, measure=m, predicted_sign=sign, n_points=len(t)))
    t = family_table(claims, "link", fam, extra, alpha)
    if not extra:
        t = t.assign(**{c: pd.Series(dtype=object) for c in ("scope", "optimizer", "measure", "predicted_sign",
                                                              "n_points")})
    return t


def _predicted(table: pd.DataFrame) -> pd.Series:
    """Whether each link row's verdict is a direction with the predicted sign."""
    return ((table["kind"] == "higher") & (table["predicted_sign"] > 0)) | \
        ((table["kind"] == "lower") & (table["predicted_sign"] < 0))


@dataclass(frozen=True)
class LinkFindings:
    """The link test's counts (:func:`link_table`; the verdicts themselves are glued from its claims): ``head``
    tested; ``m`` rows at Bonferroni ``confidence``; ``n_predicted`` / ``n_opposite`` / ``n_tests``: rows whose
    verdict is a direction with the predicted sign / the other sign / rows with a verdict other than ``too few
    seeds``, and the same per scope (``_ref``: one point per seed at chapter 1's shift; ``_all``: pooled over
    shifts, which the shift itself drives). Counted on the printed verdicts: the pooled rows have no p-value for
    Holm."""

    head: str
    m: int
    confidence: float
    n_predicted: int
    n_opposite: int
    n_tests: int
    n_predicted_ref: int
    n_tests_ref: int
    n_predicted_all: int
    n_tests_all: int


def link_findings(table: pd.DataFrame, head: str = "linear") -> LinkFindings:
    """:class:`LinkFindings` from :func:`link_table`'s output (computed for ``head``)."""
    pred = _predicted(table)
    tested = table["kind"] != TOO_FEW
    direction = table["kind"].isin(["higher", "lower"])
    sc = lambda s: table["scope"] == s
    return LinkFindings(
        head=head, m=int(table["m"].iloc[0]) if len(table) else 0,
        confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
        n_predicted=int(pred.sum()), n_opposite=int((direction & ~pred).sum()), n_tests=int(tested.sum()),
        n_predicted_ref=int((pred & sc("ref")).sum()), n_tests_ref=int((tested & sc("ref")).sum()),
        n_predicted_all=int((pred & sc("all")).sum()), n_tests_all=int((tested & sc("all")).sum()))


def link_texts(table: pd.DataFrame) -> dict:
    """The page's words for each :func:`link_table` row's value, keyed ``"<scope>_<optimizer>_<measure>"``
    (Markdown, to follow "$\\rho$"; the verdict is glued on its own, ``..._verdict``): ``= +0.12 (-0.30 to
    +0.50)``; without an interval ``= -0.83, no interval``; without a correlation at all (fewer than 4 points or a
    constant side) ``not computed (2 seeds, one point each)``. Never prints NaN."""
    out = {}
    for r in table.itertuples(index=False):
        if math.isnan(r.estimate):
            where = f"{r.n} seeds, one point each" if r.n_points == r.n else f"{r.n_points} points"
            text = f"not computed ({where})"
        elif math.isnan(r.low) or math.isnan(r.high):
            text = f"= {r.estimate:+.2f}, no interval"
        else:
            text = f"= {r.estimate:+.2f} ({r.low:+.2f} to {r.high:+.2f})"
        out[f"{r.scope}_{r.optimizer}_{r.measure}"] = text
    return out


def audit_matches_declaration(table: pd.DataFrame) -> bool:
    """Whether every part moved exactly where its mode declares it may (``moved == declared`` on every row)."""
    return bool((table["moved"] == table["declared"]).all())


def audit_check(table: pd.DataFrame) -> Claim:
    """:func:`audit_matches_declaration` as an exact check (key ``audit_matches``): ``exact, checked ==`` when
    ``moved == declared`` on every row of :func:`audit_buffers`' table, else ``not exact`` (an identity of the
    code, not a finding)."""
    return exact_check((table["moved"] != table["declared"]).astype(float), key="audit_matches")


# --- what this execution cost ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CostFindings:
    """What the page's execution cost and whether that is a cold-cache time.

    ``wall_min``: minutes of wall time; ``n_computed`` of ``n_units`` cached units (stage-1 sources, search,
    sweep, step check and feature runs, summed over :func:`bnstudy.sweep.sweep_counts`) were computed in this
    execution, ``n_cached`` read from the run cache; ``cache_state``: ``cold`` (every unit computed), ``warm``
    (none) or ``partly warm``; ``threads_per_run``: torch threads each run used
    (:attr:`bnstudy.config.Execution.threads`, the sidecars' ``torch_threads_per_run``).
    """

    wall_min: float
    n_computed: int
    n_units: int
    n_cached: int
    cache_state: str
    threads_per_run: int


def cost_findings(counts: dict, wall_s: float, threads_per_run: int = 1) -> CostFindings:
    """:class:`CostFindings` from ``counts`` (``{namespace: (computed, total)}``, as
    :func:`bnstudy.sweep.sweep_counts` returns) and the wall time ``wall_s`` in seconds (``None``: not
    recorded, ``wall_min`` is NaN). Raises ``ValueError``
    if a namespace claims more computed units than it has."""
    bad = [k for k, (c, t) in counts.items() if not 0 <= c <= t]
    if bad:
        raise ValueError(f"cost_findings: counts must satisfy 0 <= computed <= total, not for {bad}")
    n_c = int(sum(c for c, _ in counts.values()))
    n_t = int(sum(t for _, t in counts.values()))
    state = "cold" if n_t and n_c == n_t else ("warm" if n_c == 0 else "partly warm")
    return CostFindings(wall_min=float("nan") if wall_s is None else float(wall_s) / 60, n_computed=n_c, n_units=n_t, n_cached=n_t - n_c,
                        cache_state=state, threads_per_run=int(threads_per_run))
