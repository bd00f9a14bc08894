"""Chapter 4, what is claimed, in the lean chapter shape: the page's questions as data (:data:`QUESTIONS`, run by
:func:`bnstudy.study.inference.ask` into one claims table per family), its descriptive numbers as flat numbers tables
(:func:`bnstudy.study.inference.numbers_table`; no records), the estimators that are the chapter's own (the link test's
rank correlations, the equivalence feasibility, the geometry's ratios) and the sentences chosen by the data, all
from the tables of :mod:`.run`.

The *gap* of a (shift, head, optimizer) cell is ``task_b(separate_stats) - task_b(backbone_eval)`` per seed
(condition minus the pinned reference, the book's one sign: positive when pinning costs the new task). The cells
of one shift are one family (Bonferroni intervals, equivalence at ``alpha / m``, Holm counts). :func:`claims` gives
the page's claims table and :func:`findings` its numbers table.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from ...inference import MIN_BOOTSTRAP_UNITS, NOT_DECIDED, TOO_FEW, Family, Interval, Question, ask, \
    bootstrap_interval, claims_table, count_kinds, count_verdicts, decide, decide_interval, equivalent_text, number, \
    numbers_table, paired_differences, rank_correlation, t_interval
from ...modes import MODE_NAMES
from ...words import Note, join, verdict_md
from .run import HEADS, OPTIMIZERS, PINNED_MODES, REFERENCE_MODE, STEPS_CHECK_HEAD, STEPS_CHECK_OPTIMIZERS, \
    chosen_lrs, search_at, search_table

#: Direction words of the page's verdicts (:func:`bnstudy.study.inference.decide`), each (higher, lower) pair naming
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
#: quantity allows, to which printed interval ends are cut (:func:`printed`): accuracy differences lie in
#: [-1, 1], differences of two gaps in [-2, 2], rank correlations in [-1, 1].
CLIPS = {"gap": (-1, 1), "interaction": (-2, 2), "hc": (-2, 2), "sc": (-2, 2), "bn": (-1, 1), "steps": (-2, 2),
         "checks": None, "link": (-1, 1)}


# --- the questions, as data ----------------------------------------------------------------------------------------
# Every comparison is condition minus reference per seed (bnstudy.study.inference.ask); one ask call is one family. The
# tables a question reads: "main" (run's rows), "gaps" (gap_rows: one per-seed gap per shift, head, optimizer and
# seed), "steps" (the step check's per-seed gaps at the two budgets), "rows" (run's rows with the checks' columns)
# and "audit" (run.audit_buffers' table). Each comparison's margin is the page's (the notebook's ``margin``).

_MARGIN = 0.02  # run.Config's default margin; every call replaces it with the page's
_GAP = dict(value="task_b", by="mode", margin=_MARGIN)
QUESTIONS = {
    # the gap of every (shift, head, optimizer) cell; one family per shift (gap_table asks one shift at a time)
    "gap": (Question("gap_{shift}_{head}_{optimizer}", "separate_stats", REFERENCE_MODE,
                     each=("shift", "head", "optimizer"), words="separate_stats", **_GAP),),
    # the optimizer interaction at chapter 1's shift: gap(adam) - gap(sgd) per head
    "interaction": (Question("adam_vs_sgd_{head}", "adam", "sgd", value="gap", by="optimizer", at=dict(shift="ref"),
                             each=("head",), table="gaps", margin=_MARGIN),),
    # each head against the linear head at chapter 1's shift, per optimizer: gap(head) - gap(linear)
    "hc": (Question("hc_{condition}_{optimizer}", tuple(h for h in HEADS if h != STEPS_CHECK_HEAD), STEPS_CHECK_HEAD,
                    value="gap", by="head", at=dict(shift="ref"), each=("optimizer",), table="gaps",
                    margin=_MARGIN),),
    # does the shift make the gap? gap(ref) - gap(none) per head and optimizer
    "sc": (Question("sc_{head}_{optimizer}", "ref", "none", value="gap", by="shift", each=("head", "optimizer"),
                    table="gaps", margin=_MARGIN),),
    # the BatchNorm head's two pinned modes, all_eval - backbone_eval, per shift and optimizer
    "bn": (Question("bn_{shift}_{optimizer}", "all_eval", REFERENCE_MODE, at=dict(head="mlp_bn"),
                    each=("shift", "optimizer"), words="all_eval", **_GAP),),
    # the step check: gap at the long budget minus gap at the short one, per optimizer
    "steps": (Question("steps_change_{optimizer}", "long", "short", value="gap", by="budget", each=("optimizer",),
                       table="steps", margin=_MARGIN),),
    # the identities of the code (exact checks, not findings): train_mode's task B equals separate_stats' in every
    # seed, shift, head and optimizer (the same backbone statistics see the same stream); task A after minus before
    # is 0 in every run of both pinned modes; train_mode's task A after stage 2 equals the first head and
    # optimizer's of the same seed and shift (the head does not touch the backbone's buffers)
    "checks": (Question("check_train_is_separate", "train_mode", "separate_stats", value="task_b", by="mode",
                        pair=("shift", "head", "optimizer", "seed"), table="rows", exact=0.0),
               Question("check_pinned_keep_a", value="task_a_change", at=dict(mode=PINNED_MODES), table="rows",
                        exact=0.0),
               Question("check_task_a_loss_shared", value="task_a_vs_first", at=dict(mode="train_mode"),
                        table="rows", exact=0.0)),
    # every part moved exactly where its mode declares it may (run.audit_buffers)
    "audit": (Question("audit_matches", value="mismatch", table="audit", exact=0.0),),
}
#: The direction words of the families whose words are not ``"<words> higher"`` / ``"<words> lower"`` (what
#: :class:`bnstudy.study.inference.Question` can say): the verdict of a direction shown, by its kind.
VERDICT_WORDS = {"interaction": {"higher": ADAM_HIGHER, "lower": ADAM_LOWER},
                 "hc": {"higher": HEAD_LARGER, "lower": HEAD_SMALLER},
                 "sc": {"higher": SHIFT_LARGER, "lower": SHIFT_SMALLER},
                 "steps": {"higher": STEPS_LARGER, "lower": STEPS_SMALLER}}


def _asked(tables: dict, group: str, about: dict, margin: float, alpha: float, columns: tuple = (),
           family: str | None = None) -> pd.DataFrame:
    """One family's claims: :data:`QUESTIONS` ``[group]`` asked of ``tables`` (:func:`bnstudy.study.inference.ask`, every
    comparison at ``margin``; a tuple of conditions asked where the rows have them), the verdict of a direction in
    the family's words (:data:`VERDICT_WORDS`), then :func:`family_table`'s columns: ``family`` (default ``group``),
    ``m``, ``columns`` (what each claim is about, from ``about``: ``{key: {column: value}}``, in the page's order)
    and ``count_kind``. Raises ``ValueError`` if the questions give other claims than ``about`` names."""
    qs = []
    for q in QUESTIONS[group]:
        if q.exact is None:
            q = dataclasses.replace(q, margin=margin)
        if isinstance(q.condition, tuple):
            present = set(tables[q.table][q.by])
            q = dataclasses.replace(q, condition=tuple(c for c in q.condition if c in present))
        qs.append(q)
    t = ask(tables, qs, alpha)
    if set(t["key"]) != set(about):
        raise ValueError(f"{group}: the questions give claims {sorted(t['key'])}, the page expects {sorted(about)}")
    words = VERDICT_WORDS.get(group, {})
    t["verdict"] = [words.get(k, v) for k, v in zip(t["kind"], t["verdict"])]
    t = t.set_index("key").loc[list(about)].reset_index()
    t.insert(0, "family", family or group)
    t["m"] = max(len(t), 1)
    for c in columns:
        t[c] = [e[c] for e in about.values()] if len(t) else pd.Series(dtype=object)
    t["count_kind"] = count_kinds(t, alpha) if len(t) else pd.Series(dtype=str)
    return t


def family_table(claims: list, family: str, fam: Family, extra: list[dict], alpha: float = 0.05) -> pd.DataFrame:
    """One family's claims (:class:`bnstudy.study.inference.Claim` objects, for the estimators that are not a paired
    comparison: the link test's rank correlations) as a table: :func:`bnstudy.study.inference.claims_table` (Holm's
    ``p_adjusted`` over these claims) with the columns ``family``, ``m`` (the family's size) and ``extra`` (one dict
    per claim: what the claim is about), and ``count_kind``: the kind a count of cells uses (the glossary's rule: a
    direction, ``higher`` / ``lower`` by the estimate's sign, where Holm's adjusted p is below ``alpha``; otherwise
    the verdict's kind: :func:`bnstudy.study.inference.count_kinds`). Holm calls at least the cells whose Bonferroni
    interval excludes zero, so a cell can count as a direction while its printed verdict is ``not decided``."""
    t = claims_table(claims, family=family)
    t["m"] = fam.m
    for k in (extra[0] if extra else {}):
        t[k] = [e[k] for e in extra]
    t["count_kind"] = count_kinds(t, alpha) if len(t) else pd.Series(dtype=str)
    return t


def printed(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims with each family's interval ends cut to what its quantity allows (:data:`CLIPS`), for the page
    (:func:`bnstudy.study.pages.glue_chapter`); tests and figures read the raw ends."""
    out = claims.copy()
    for fam, clip in CLIPS.items():
        hit = out["family"] == fam
        if clip is not None and hit.any():
            out.loc[hit, ["low", "high"]] = out.loc[hit, ["low", "high"]].clip(*clip)
    return out


# --- the learning-rate search and the step check -------------------------------------------------------------------

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


def _cells(names) -> str:
    return ", ".join(names) if names else "none"


def _edge_text(edges) -> str:
    return _cells([f"{'/'.join(k)} at the {end} ({v:g})" for k, v, end in edges])


def lr_choice_findings(lrs: dict, grids: dict) -> pd.DataFrame:
    """One shift's chosen rates as a numbers table (glued as ``ch04_<shift>_<key>``) from its :func:`chosen_lrs` and
    the grids (``{optimizer: grid}``): ``lrs_<head>_<optimizer>_<mode>``, ``n_lr`` of them, ``n_lr_at_edge`` at an
    end of their grid and ``lr_edge_cells`` naming those (:func:`lr_edges`)."""
    edges = lr_edges(lrs, grids)
    return numbers_table(dict(lrs={"_".join(k): float(v) for k, v in lrs.items()}, n_lr=len(lrs),
                              n_lr_at_edge=len(edges), lr_edge_cells=_edge_text(edges)))


def search_findings(search: pd.DataFrame) -> pd.DataFrame:
    """The learning-rate search read as a sensitivity check (tuning seeds, validation set; fractions 0..1), a numbers
    table (glued as ``ch04_search_<key>``) from :func:`lr_search`'s rows at one shift (:func:`search_at`; or any table
    with ``head, optimizer, lr, mode, task_b``). Per ``"<head>_<optimizer>"``: ``gap_own_rates`` = ``separate_stats``
    at its own best rate minus ``backbone_eval`` at its own best rate (the chapter's rule; the book's sign, positive
    when pinning costs); ``gap_mean_rate`` = the same two modes at the one rate the mode-averaged rule picks (the
    first full run's rule); ``lr_mean_rule`` that rate; ``lr_pinned`` / ``lr_separate`` each side's own best rate. No
    intervals: the search has few tuning seeds and selects its maxima, so these are descriptions of the search, not
    tests. Raises ``ValueError`` if ``backbone_eval`` or ``separate_stats`` is missing, or the table covers several
    shifts."""
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
    return numbers_table(dict(gap_own_rates=own, gap_mean_rate=at_mean, lr_mean_rule=lr_mean, lr_pinned=lr_p,
                              lr_separate=lr_s))


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


def steps_findings(short: pd.DataFrame, long: pd.DataFrame) -> pd.DataFrame:
    """The step-count check at chapter 1's shift, linear head, per optimizer (``"sgd"``, ``"adam"``), on the check's
    seeds, as a numbers table (glued as ``ch04_steps_<key>``) from the main sweep's rows (``short``) and
    :func:`steps_check`'s (``long``), paired on the long table's seeds; 95% Student-t intervals over those seeds
    (:func:`bnstudy.study.inference.t_interval`; fractions 0..1). ``steps_short`` / ``steps_long``: the two budgets;
    ``n_seeds``. ``gap_short`` / ``gap_long``: ``task_b(separate_stats) - task_b(backbone_eval)`` per seed at each
    budget; ``separate_gain`` / ``pinned_gain``: task-B accuracy long minus short for each mode (how far from
    converged the short budget is). The change of the gap and its verdict: :func:`steps_claims`. Raises
    ``ValueError`` if ``long`` is empty or a seed lacks a mode."""
    seeds, pairs = _steps_pairs(short, long)
    gs, gl, sep, pin = {}, {}, {}, {}
    for o, (ps, ss, pl, sl) in pairs.items():
        gs[o], gl[o] = t_interval(ss - ps), t_interval(sl - pl)
        sep[o], pin[o] = t_interval(sl - ss), t_interval(pl - ps)
    return numbers_table(dict(steps_short=int(short["steps"].iloc[0]), steps_long=int(long["steps"].iloc[0]),
                              n_seeds=len(seeds), gap_short=gs, gap_long=gl, separate_gain=sep, pinned_gain=pin))


def steps_claims(short: pd.DataFrame, long: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The step check's claims (family ``steps``, :data:`QUESTIONS`, one per optimizer, printed together): per seed
    the gap at the long budget minus the gap at the short one, keys ``steps_change_<optimizer>``, verdict ``gap larger
    with more steps`` / ``gap smaller with more steps`` / ``equivalent within ±margin`` / ``not decided`` / ``too few
    seeds``. Raises as :func:`steps_findings`."""
    _, pairs = _steps_pairs(short, long)
    rows = [pd.DataFrame({"optimizer": o, "budget": b, "seed": g.index, "gap": g.to_numpy()})
            for o, (ps, ss, pl, sl) in pairs.items() for b, g in (("short", ss - ps), ("long", sl - pl))]
    rows = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["optimizer", "budget", "seed", "gap"])
    return _asked(dict(steps=rows), "steps", {f"steps_change_{o}": dict(optimizer=o) for o in pairs}, margin, alpha,
                  ("optimizer",))


# --- the gap and the claims ----------------------------------------------------------------------------------------

def verdict_counts(table: pd.DataFrame, alpha: float = 0.05) -> dict:
    """``{kind: count}`` of one family's claims for ``higher``, ``lower``, ``equivalent``, ``not decided`` and
    ``too few seeds`` (every kind present, 0 if none): the book's counts rule,
    :func:`bnstudy.study.inference.count_verdicts` (Holm directions, printed kinds otherwise)."""
    c = count_verdicts(table, alpha)
    return {k: int(c[k]) for k in ("higher", "lower", "equivalent", "not decided", "too few seeds")}


def gap_values(df: pd.DataFrame, shift: str, head: str, optimizer: str) -> pd.Series:
    """The per-seed gap of a cell, ``task_b(separate_stats) - task_b(backbone_eval)``, indexed by seed
    (:func:`bnstudy.study.inference.paired_differences`: a seed without both modes is left out). Raises ``ValueError``
    if the cell has no rows or lacks one of the two modes."""
    cell = df[(df["shift"] == shift) & (df["head"] == head) & (df["optimizer"] == optimizer)]
    if not len(cell):
        raise ValueError(f"gap: no rows for cell ({shift}, {head}, {optimizer})")
    return paired_differences(cell, "task_b", "mode", "separate_stats", REFERENCE_MODE)


def gap_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The per-seed gap (:func:`gap_values`) of every (shift, head, optimizer) cell of ``df``, one row per seed:
    ``shift, head, optimizer, seed, gap`` (the table ``gaps`` the contrasts of :data:`QUESTIONS` read)."""
    cols = ["shift", "head", "optimizer", "seed", "gap"]
    parts = [pd.DataFrame({"shift": s, "head": h, "optimizer": o, "seed": d.index, "gap": d.to_numpy()})
             for s, h, o in dict.fromkeys(zip(df["shift"], df["head"], df["optimizer"]))
             for d in (gap_values(df, s, h, o),)]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def equivalence_max_sd(margin: float, n: int, family: Family = Family()) -> float:
    """The largest per-seed standard deviation of a gap whose mean is exactly 0 that the equivalence test of
    :func:`bnstudy.study.inference.decide` (TOST at ``family.level``) can still call equivalent within ``±margin``:
    ``margin`` over the half-width of the ``1 - 2 level`` t interval of ``n`` values of standard deviation 1 (TOST
    passes exactly when that interval lies inside the margin). The design's feasibility; NaN for ``n < 2``."""
    if n < 2:
        return math.nan
    unit = np.arange(n, dtype=float)
    unit = (unit - unit.mean()) / unit.std(ddof=1)
    return float(margin / t_interval(unit, 1 - 2 * family.level).high)


def gap_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The gap claims (family ``gap``, :data:`QUESTIONS`), one per (shift, head, optimizer), keys
    ``gap_<shift>_<head>_<optimizer>``, the head x optimizer cells of one shift one family (Bonferroni intervals,
    TOST at ``alpha / m``, Holm over the shift's cells). Columns: :func:`family_table`'s plus ``shift, head,
    optimizer, sd`` (the gap's per-seed standard deviation), ``task_b_pinned`` / ``task_b_separate`` (the two modes'
    mean task-B accuracy)."""
    parts = []
    for shift, g in df.groupby("shift", sort=False):
        about = {}
        for h, o in dict.fromkeys(zip(g["head"], g["optimizer"])):
            d = gap_values(df, shift, h, o)
            c = g[(g["head"] == h) & (g["optimizer"] == o)]
            about[f"gap_{shift}_{h}_{o}"] = dict(
                shift=shift, head=h, optimizer=o, sd=float(np.std(d, ddof=1)) if len(d) > 1 else math.nan,
                task_b_pinned=float(c[c["mode"] == REFERENCE_MODE]["task_b"].mean()),
                task_b_separate=float(c[c["mode"] == "separate_stats"]["task_b"].mean()))
        parts.append(_asked(dict(main=g), "gap", about, margin, alpha,
                            ("shift", "head", "optimizer", "sd", "task_b_pinned", "task_b_separate")))
    return pd.concat(parts, ignore_index=True)


def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy task-B and task-A accuracy per ``shift, head, optimizer, mode``: ``metric, mean, ci_low, ci_high,
    n_seeds`` (95% Student-t over seeds, :func:`bnstudy.study.inference.t_interval`, not corrected; for display)."""
    rows = []
    for key, g in df.groupby(["shift", "head", "optimizer", "mode"], sort=False):
        for metric in ("task_b", "task_a_after"):
            iv = t_interval(g[metric])
            rows.append(dict(zip(("shift", "head", "optimizer", "mode"), key), metric=metric, mean=iv.mean,
                             ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


def interaction_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The optimizer interaction (family ``interaction``, :data:`QUESTIONS`) per head at chapter 1's shift: per seed
    ``gap(adam) - gap(sgd)``, keys ``adam_vs_sgd_<head>``, one family over the heads that have both optimizers;
    verdict ``gap larger with Adam`` (pinning costs more with Adam) / ``gap smaller with Adam`` / equivalence /
    ``not decided``. Columns: :func:`family_table`'s plus ``head``; empty if either optimizer is missing."""
    d = df[df["shift"] == "ref"]
    heads = [h for h in dict.fromkeys(d["head"]) if {"adam", "sgd"} <= set(d[d["head"] == h]["optimizer"])]
    gaps = gap_rows(d[d["head"].isin(heads) & d["optimizer"].isin(["adam", "sgd"])])
    return _asked(dict(gaps=gaps), "interaction", {f"adam_vs_sgd_{h}": dict(head=h) for h in heads}, margin, alpha,
                  ("head",))


def head_contrast_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """Does a head change the gap? (family ``hc``, :data:`QUESTIONS`) Per optimizer and head, per seed ``gap(head) -
    gap(linear)`` at chapter 1's shift, keys ``hc_<head>_<optimizer>``, one family over the head x optimizer
    contrasts; verdict ``larger gap than linear`` (pinning costs more with that head) / ``smaller gap than linear``
    / equivalence / ``not decided``. Columns: :func:`family_table`'s plus ``head, optimizer``, ``separate`` /
    ``separate_reference`` (the two heads' mean ``separate_stats`` task-B accuracy: a smaller gap can come from
    a worse separate side). Raises ``ValueError`` if the linear head has no rows at chapter 1's shift."""
    d = df[df["shift"] == "ref"]
    if STEPS_CHECK_HEAD not in set(d["head"]):
        raise ValueError(f"head_contrast_table: reference head {STEPS_CHECK_HEAD!r} has no rows at shift 'ref'")
    heads = [h for h in dict.fromkeys(d["head"]) if h != STEPS_CHECK_HEAD]
    sep = lambda head, o: float(d[(d["head"] == head) & (d["optimizer"] == o)
                                  & (d["mode"] == "separate_stats")]["task_b"].mean())
    about = {f"hc_{h}_{o}": dict(head=h, optimizer=o, separate=sep(h, o), separate_reference=sep(STEPS_CHECK_HEAD, o))
             for o in dict.fromkeys(d["optimizer"]) for h in heads}
    return _asked(dict(gaps=gap_rows(d)), "hc", about, margin, alpha,
                  ("head", "optimizer", "separate", "separate_reference"))


def shift_contrast_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """Does the shift make the gap? (family ``sc``, :data:`QUESTIONS`) Per head and optimizer, per seed ``gap(ref) -
    gap(none)`` (the pairing is the seed: same backbone, head initialization and task-B stream), keys
    ``sc_<head>_<optimizer>``, one family over the cells of chapter 1's shift; verdict ``larger gap at the shift``
    (pinning costs more at the shift) / ``smaller gap at the shift`` / equivalence / ``not decided``. Columns:
    :func:`family_table`'s plus ``head, optimizer``. Raises ``ValueError`` if either shift has no rows."""
    for name in ("ref", "none"):
        if name not in set(df["shift"]):
            raise ValueError(f"shift_contrast_table: no rows at shift {name!r}")
    d = df[df["shift"] == "ref"]
    cells = list(dict.fromkeys(zip(d["head"], d["optimizer"])))
    both = df[df["shift"].isin(["ref", "none"])]
    both = both[[c in set(cells) for c in zip(both["head"], both["optimizer"])]]
    return _asked(dict(gaps=gap_rows(both)), "sc", {f"sc_{h}_{o}": dict(head=h, optimizer=o) for h, o in cells},
                  margin, alpha, ("head", "optimizer"))


def _optimizers(df: pd.DataFrame) -> list:
    return sorted(set(df["optimizer"]), key=lambda o: OPTIMIZERS.index(o) if o in OPTIMIZERS else 99)


def bn_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The BatchNorm head's two pinned modes (family ``bn``, :data:`QUESTIONS`): per shift and optimizer, per seed
    ``task_b(all_eval) - task_b(backbone_eval)`` of ``mlp_bn``, keys ``bn_<shift>_<optimizer>``, one family over the
    table's cells; ``too few seeds`` in every cell where the rows have no ``mlp_bn`` at all."""
    about = {f"bn_{s}_{o}": dict(shift=s, optimizer=o) for s in dict.fromkeys(df["shift"]) for o in _optimizers(df)}
    if "mlp_bn" not in set(df["head"]):  # nothing to pair: every cell has too few seeds (run.Config requires mlp_bn)
        fam = Family(max(len(about), 1), alpha)
        return family_table([decide([], k, margin=margin, family=fam, higher=BN_HIGHER, lower=BN_LOWER) for k in about],
                            "bn", fam, list(about.values()), alpha)
    return _asked(dict(main=df), "bn", about, margin, alpha, ("shift", "optimizer"))


def checks_table(df: pd.DataFrame) -> pd.DataFrame:
    """The identities of the code as exact checks (family ``checks``, :data:`QUESTIONS`): ``check_train_is_separate``,
    ``check_pinned_keep_a``, ``check_task_a_loss_shared``."""
    first = df.groupby(["mode", "shift", "seed"])["task_a_after"].transform("first")
    rows = df.assign(task_a_change=df["task_a_after"] - df["task_a_before"], task_a_vs_first=df["task_a_after"] - first)
    return _asked(dict(rows=rows), "checks", {k.key: {} for k in QUESTIONS["checks"]}, _MARGIN, 0.05)


def _require(df: pd.DataFrame, who: str) -> None:
    missing = set(MODE_NAMES) - set(df["mode"])
    if missing:
        raise ValueError(f"{who} needs all four modes; missing {sorted(missing)}")
    if "ref" not in set(df["shift"]):
        raise ValueError(f"{who} needs chapter 1's shift (rows with shift == 'ref')")


def claims(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """Chapter 4's claims table from :func:`run`'s table (``shift`` column; all four modes): every claim of the page's
    main comparisons, families ``gap``, ``interaction``, ``bn``, ``checks`` and, given the linear head and the
    ``none`` shift, ``hc`` and ``sc`` (:func:`family_table`'s columns); glued by key with
    :func:`bnstudy.study.pages.glue_chapter` after :func:`printed`. Raises ``ValueError`` if a mode or chapter 1's shift
    (``shift == "ref"``) is missing."""
    _require(df, "claims")
    parts = [gap_table(df, margin, alpha), interaction_table(df, margin, alpha), bn_table(df, margin, alpha),
             checks_table(df)]
    if "linear" in set(df[df["shift"] == "ref"]["head"]):
        parts.append(head_contrast_table(df, margin, alpha))
    if "none" in set(df["shift"]):
        parts.append(shift_contrast_table(df, margin, alpha))
    return pd.concat([p for p in parts if len(p)], ignore_index=True)


# --- the numbers beside the claims ---------------------------------------------------------------------------------

def _cell_names(table: pd.DataFrame, kind: str) -> list[str]:
    """``head/optimizer`` of a family table's rows that count as ``kind`` (:func:`family_table`)."""
    t = table[table["count_kind"] == kind]
    return [f"{h}/{o}" for h, o in zip(t["head"], t["optimizer"])]


def _contrast(table: pd.DataFrame) -> dict:
    """A contrast family's numbers: ``m`` contrasts at ``confidence``; counts (Holm) ``n_larger`` / ``n_smaller`` and
    the ``head/optimizer`` cells with a larger / smaller gap, ``larger_cells`` / ``smaller_cells`` (``none`` if
    empty)."""
    c = verdict_counts(table)
    return dict(m=int(len(table)), confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
                n_larger=c["higher"], n_smaller=c["lower"], larger_cells=_cells(_cell_names(table, "higher")),
                smaller_cells=_cells(_cell_names(table, "lower")))


def shift_contrast_findings(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`shift_contrast_table` for the prose, a numbers table (glued as ``ch04_sc_<key>``): :func:`_contrast`'s
    numbers, larger / smaller meaning a larger / smaller gap at the shift."""
    return numbers_table(_contrast(table))


def head_contrast_findings(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`head_contrast_table` for the prose, a numbers table (glued as ``ch04_hc_<key>``): :func:`_contrast`'s
    numbers (larger / smaller: than the linear head's gap) and ``n_smaller_worse_separate`` /
    ``smaller_worse_separate_cells``: those smaller-gap contrasts whose head reaches a lower ``separate_stats``
    accuracy than the linear head (the gap shrinks from the separate side)."""
    worse = [f"{r.head}/{r.optimizer}" for r in table.itertuples()
             if r.count_kind == "lower" and r.separate < r.separate_reference]
    return numbers_table(dict(**_contrast(table), n_smaller_worse_separate=len(worse),
                              smaller_worse_separate_cells=_cells(worse)))


def findings(df: pd.DataFrame, lrs: dict | None = None, grids: dict | None = None, margin: float = 0.02,
             alpha: float = 0.05, C: pd.DataFrame | None = None) -> pd.DataFrame:
    """Chapter 4's numbers table (:func:`bnstudy.study.inference.numbers_table`; glued as ``ch04_<key>``), the numbers its
    prose cites beside its claims (accuracies are fractions 0..1), from :func:`run`'s table (``shift`` column; all
    four modes). ``lrs``: :func:`chosen_lrs`' output (per mode or per head and optimizer) and ``grids``
    (``{optimizer: grid}``) for the search's numbers; ``C``: :func:`claims` of ``df`` if already computed (else
    computed here). Raises ``ValueError`` if a mode or chapter 1's shift (``shift == "ref"``) is missing.

    Its rows: ``n_seeds``; the gap family (one shift's cells): ``n_cells`` (its ``m``), ``confidence`` (of its
    Bonferroni intervals), ``margin``, ``chance``. Counts per shift (``<count>_<shift>``; Holm's rule,
    :func:`family_table`): ``n_separate_higher`` (separate_stats higher: pinning costs), ``n_separate_lower``,
    ``n_equivalent``, ``n_not_decided``, ``n_too_few``; ``separate_higher_ref`` / ``equivalent_ref``: those cells at
    chapter 1's shift as ``head/optimizer`` lists (``none`` if empty).

    Equivalence feasibility: ``equiv_max_sd``, the largest per-seed SD for which a gap of mean exactly 0 could be
    shown equivalent at this design (:func:`equivalence_max_sd`); ``equiv_sd_median_<shift>`` and
    ``n_equiv_feasible_<shift>``: the median observed SD and the cells whose SD is below ``equiv_max_sd``.

    ``interaction_m`` / ``interaction_confidence``, ``bn_m`` / ``bn_confidence``: the other families' sizes and
    interval confidence. ``f3_heads_holding_<optimizer>``: for how many heads the gap at chapter 1's shift counts as
    ``separate_stats higher`` (Holm); ``f3_rate_edge_<optimizer>``: ``a rate at the grid's edge`` if one of the linear
    head's chosen rates (``backbone_eval`` or ``separate_stats``) sits at an end of its grid, else ``rates inside
    the grid``. ``train_mode_task_a_change``: ``task_a_after - task_a_before`` of ``train_mode`` at chapter 1's shift
    (one head and optimizer, negative = lost; 95% t interval).

    Best absolute accuracy at chapter 1's shift: ``best_pinned_cell`` (``head/optimizer`` with the highest
    ``backbone_eval`` accuracy), ``best_pinned_acc``, ``best_separate_cell``, ``best_separate_acc``; the best pinned
    cell's gap claim (estimate, interval, verdict) is the claims table's row (:func:`best_pinned_claim`).

    ``lrs_<head>_<optimizer>[_<mode>]``: the chosen rates; ``n_lr_at_edge`` and ``lr_edge_cells``. ``n_eval``: test
    images per accuracy (0 if absent); ``eval_se``: the binomial standard error of one accuracy at the mean
    ``separate_stats`` task-B accuracy at chapter 1's shift (NaN without ``n_eval``); ``margin_in_se``.
    """
    _require(df, "findings")
    C = claims(df, margin, alpha) if C is None else C
    gt, inter, bn = (C[C["family"] == f] for f in ("gap", "interaction", "bn"))
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
    return numbers_table(dict(
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
    ))


# --- the page's answer: sentences chosen by the claims and numbers (issue 25) ---------------------------------------

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


def gap_counts(C: pd.DataFrame, shift: str = "ref") -> dict:
    """The counts of one shift's gap family in the claims table ``C`` (:func:`bnstudy.study.inference.count_verdicts`:
    Holm directions, printed kinds otherwise), with ``m``. Raises ``ValueError`` if the shift has no gap claims."""
    t = C[(C["family"] == "gap") & (C["shift"] == shift)]
    if not len(t):
        raise ValueError(f"gap_counts: no gap claims at shift {shift!r}")
    return count_verdicts(t)


def headline(C: pd.DataFrame, F: pd.DataFrame) -> str:
    """The answer's first sentence, chosen by the counts of the gap family at chapter 1's shift (claims ``C``,
    numbers ``F``): whether the heads and optimizers tried make up for pinned statistics (all cells a cost shown,
    none, every cell equivalent, or a mix), with the counts spliced in."""
    c = gap_counts(C)
    m, hi, lo, eq = c["m"], c["higher"], c["lower"], c["equivalent"]
    und = c["not decided"] + c["too few seeds"]
    margin = number(F, "margin")
    eqw = equivalent_text(margin)
    counts = (f"the {m} head and optimizer cells split into {hi} where separate statistics score higher on task B "
              f"than the pinned backbone, {lo} where they score lower, {eq} {eqw} and {und} not decided")
    if hi == m:
        lead = "No head or optimizer tried makes up for pinned statistics at chapter 1's shift"
    elif hi == 0 and eq == m:
        lead = f"Every head and optimizer tried makes up for pinned statistics at chapter 1's shift, within ±{margin:g}"
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


def linear_sentence(C: pd.DataFrame) -> str:
    """The seed's linear head, per optimizer: its gap verdicts at chapter 1's shift, spliced into fixed words."""
    parts = [f"{verdict_md(C[C['key'] == f'gap_ref_linear_{o}'].iloc[0])} with {OPTIMIZER_WORDS[o]}"
             for o in ("sgd", "sgd_plain", "adam") if (C["key"] == f"gap_ref_linear_{o}").any()]
    if not parts:
        return ""
    return f"For the seed's linear head, separate minus pinned statistics on task B reads {join(parts)}."


def best_pinned_claim(C: pd.DataFrame, F: pd.DataFrame) -> pd.DataFrame:
    """The gap claim of the best pinned cell (``best_pinned_cell`` of the numbers ``F``, chapter 1's shift) as a
    one-row claims table under the key ``best_pinned_gap`` (``ch04_best_pinned_gap_estimate``, ``_low``, ``_high``,
    ``_verdict``, ...: the page cites the best cell without knowing which it is)."""
    key = "gap_ref_" + number(F, "best_pinned_cell").replace("/", "_")
    return C[C["key"] == key].assign(key="best_pinned_gap")


def best_sentence(C: pd.DataFrame, F: pd.DataFrame) -> str:
    """The best pinned configuration against the best separate one (absolute accuracies), with the gap claim of
    the best pinned cell (:func:`best_pinned_claim`)."""
    n = lambda key: number(F, key)  # noqa: E731
    g = best_pinned_claim(C, F).iloc[0]
    est, low, high = (float(g[c]) for c in ("estimate", "low", "high"))
    return (f"The best pinned configuration, {_bold(n('best_pinned_cell'))}, reaches "
            f"{_num(n('best_pinned_acc'), '.3f')} against {_num(n('best_separate_acc'), '.3f')} for the best one with "
            f"separate statistics ({_bold(n('best_separate_cell'))}; separate minus pinned in the best pinned cell "
            f"{_num(est)}, {_span(low, high)}: {verdict_md(g)}).")


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


def answer(C: pd.DataFrame, F: pd.DataFrame, probe: Interval | None = None) -> str:
    """The answer box's outcome sentences (Markdown), chosen and filled from the claims ``C`` and numbers ``F``, so
    that they are true for any rows: :func:`headline`, :func:`linear_sentence`, :func:`best_sentence` and, given the
    geometry's ``probe`` interval (:func:`geometry_findings`' ``probe_cost``), :func:`probe_sentence`."""
    parts = [headline(C, F), linear_sentence(C), best_sentence(C, F)]
    if probe is not None:
        t = C[C["key"] == "gap_ref_linear_sgd"]
        parts.append(probe_sentence(probe, float(t.iloc[0]["low"]) if len(t) else float("nan")))
    return " ".join(p for p in parts if p)


def advice(C: pd.DataFrame, F: pd.DataFrame) -> str:
    """The answer box's "what to do" (Markdown), with the one front-door call, chosen by whether a cost of
    pinning is shown in any cell at chapter 1's shift."""
    c = gap_counts(C)
    lrs = {k: v for k, v in zip(F["key"], F["value"]) if k.startswith("lrs_")}
    p, s = lrs.get("lrs_linear_sgd_backbone_eval"), lrs.get("lrs_linear_sgd_separate_stats")
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


# --- the "why" section: the feature geometry -------------------------------------------------------------------------

def _curvature(f: pd.DataFrame) -> tuple[float, float]:
    return number(f, "curvature_ratio"), number(f, "curvature_centered_ratio")


def _nan(f: pd.DataFrame) -> bool:
    return any(math.isnan(v) for v in _curvature(f))


def _wider(f: pd.DataFrame) -> bool:
    r, c = _curvature(f)
    return c - 1 >= (r - 1) / 2


#: The page's rule-triggered sentences (:class:`bnstudy.study.words.Note`; exactly one note of a key holds), said with
#: ``notes(NOTES, claims, geometry_findings(...))`` and glued as ``ch04_<key>``: ``geo_sentence_curvature``, whether
#: the added curvature under pinned statistics survives centring (the covariance's ratio at least half the second
#: moment's) or comes mostly from the common offset.
NOTES = (
    Note("geo_sentence_curvature", lambda c, f: _nan(f), "The centred ratio is not available."),
    Note("geo_sentence_curvature", lambda c, f: not _nan(f) and _curvature(f)[0] <= 1,
         "Pinned statistics add no curvature here."),
    Note("geo_sentence_curvature", lambda c, f: not _nan(f) and _curvature(f)[0] > 1 and _wider(f),
         "So most of the added curvature comes from the wider features, not from the common offset."),
    Note("geo_sentence_curvature", lambda c, f: not _nan(f) and _curvature(f)[0] > 1 and not _wider(f),
         "So most of the added curvature comes from the common offset, not from the wider features."),
)


def grid_text(grid) -> str:
    """A learning-rate grid for the page: ``0.005, 0.016, 0.05, 0.16``."""
    return ", ".join(f"{v:g}" for v in grid)


def geometry_summary(geom: pd.DataFrame) -> pd.DataFrame:
    """Mean and 95% interval over seeds (:func:`bnstudy.study.inference.t_interval`) of each geometry measure per
    ``shift, statistics`` (tidy)."""
    rows = []
    for key, g in geom.groupby(["shift", "statistics"], sort=False):
        for metric in ("scale_ratio", "offset_sd", "dead_fraction", "affine_r2", "curvature", "curvature_centered",
                       "mean_share", "probe_accuracy"):
            iv = t_interval(g[metric])
            rows.append(dict(shift=key[0], statistics=key[1], metric=metric, mean=iv.mean, ci_low=iv.low,
                             ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


def geometry_findings(geom: pd.DataFrame, shift: str = "ref") -> pd.DataFrame:
    """The numbers the "why" section cites (glued as ``ch04_geo_<key>``), from :func:`feature_geometry`'s table at
    ``shift`` (means over seeds): ``scale_ratio``, ``offset_sd``, ``dead_fraction``, ``affine_r2`` (pinned),
    ``curvature_ratio`` / ``curvature_centered_ratio`` (pinned over separate), ``mean_share_pinned`` /
    ``mean_share_separate``, ``probe_pinned`` / ``probe_separate``, and ``probe_cost``: the closed-form probe's
    accuracy on separate-statistics features minus on pinned ones, per seed (positive: pinning loses linearly
    decodable information; 95% t interval, :func:`bnstudy.study.inference.t_interval`)."""
    g = geom[geom["shift"] == shift]
    p = g[g["statistics"] == "pinned"].set_index("seed")
    s = g[g["statistics"] == "separate"].set_index("seed").loc[p.index]
    return numbers_table(dict(
        scale_ratio=float(p["scale_ratio"].mean()), offset_sd=float(p["offset_sd"].mean()),
        dead_fraction=float(p["dead_fraction"].mean()), affine_r2=float(p["affine_r2"].mean()),
        curvature_ratio=float((p["curvature"] / s["curvature"]).mean()),
        curvature_centered_ratio=float((p["curvature_centered"] / s["curvature_centered"]).mean()),
        mean_share_pinned=float(p["mean_share"].mean()), mean_share_separate=float(s["mean_share"].mean()),
        probe_pinned=float(p["probe_accuracy"].mean()), probe_separate=float(s["probe_accuracy"].mean()),
        probe_cost=t_interval(s["probe_accuracy"] - p["probe_accuracy"])))


# --- the geometry-gap link: rank correlations and a bootstrap (the chapter's own estimators, not paired comparisons)

#: The geometry measures the link test relates to the gap (``separate_stats - backbone_eval``, positive when pinning
#: costs), and the sign of the correlation each explanation predicts: a larger curvature ratio (pinned / separate:
#: steeper pinned features, the optimization story) should go with a larger gap; a larger probe difference
#: (separate minus pinned: information lost, the information story) likewise. Both positive.
LINK_MEASURES = {"curvature_ratio": 1, "probe_cost": 1}


def _pooled_interval(x, y, rows_of: list, confidence: float, n_boot: int, seed: int) -> Interval:
    """The pooled Spearman rho of ``x``, ``y`` with a percentile bootstrap interval over whole seeds
    (:func:`bnstudy.study.inference.bootstrap_interval`; ``rows_of[i]``: the rows of seed ``i``); no interval below
    :data:`bnstudy.study.inference.MIN_BOOTSTRAP_UNITS` seeds (bootstrap_interval's ``min_units``)."""
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
    :func:`bnstudy.study.inference.rank_correlation`, Fisher-z interval, ``too few seeds`` below 4 seeds) and ``all``
    (every shift, one point per seed and shift, which mixes in the shift's own effect on both sides; its points
    are not independent within a seed, so its interval is :func:`bnstudy.study.inference.bootstrap_interval`'s seeded
    percentile bootstrap over whole seeds, ``n_boot`` resamples, of the pooled Spearman rho, without a p-value;
    no interval below :data:`bnstudy.study.inference.MIN_BOOTSTRAP_UNITS` seeds).
    All rows are one :class:`bnstudy.study.inference.Family` (Bonferroni intervals at ``1 - alpha / m``). Verdict:
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


def link_findings(table: pd.DataFrame, head: str = "linear") -> pd.DataFrame:
    """The link test's counts (:func:`link_table`, computed for ``head``; the verdicts themselves are glued from its
    claims) as a numbers table (glued as ``ch04_link_<key>``): ``head`` tested; ``m`` rows at Bonferroni
    ``confidence``; ``n_predicted`` / ``n_opposite`` / ``n_tests``: rows whose verdict is a direction with the
    predicted sign / the other sign / rows with a verdict other than ``too few seeds``, and the same per scope
    (``_ref``: one point per seed at chapter 1's shift; ``_all``: pooled over shifts, which the shift itself drives).
    Counted on the printed verdicts: the pooled rows have no p-value for Holm."""
    pred = _predicted(table)
    tested = table["kind"] != TOO_FEW
    direction = table["kind"].isin(["higher", "lower"])
    sc = lambda s: table["scope"] == s  # noqa: E731
    return numbers_table(dict(
        head=head, m=int(table["m"].iloc[0]) if len(table) else 0,
        confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
        n_predicted=int(pred.sum()), n_opposite=int((direction & ~pred).sum()), n_tests=int(tested.sum()),
        n_predicted_ref=int((pred & sc("ref")).sum()), n_tests_ref=int((tested & sc("ref")).sum()),
        n_predicted_all=int((pred & sc("all")).sum()), n_tests_all=int((tested & sc("all")).sum())))


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


def audit_claims(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`audit_matches_declaration` as an exact check (:data:`QUESTIONS`, key ``audit_matches``, family
    ``checks``): ``exact, checked ==`` when ``moved == declared`` on every row of :func:`audit_buffers`' table, else
    ``not exact`` (an identity of the code, not a finding)."""
    audit = table.assign(mismatch=(table["moved"] != table["declared"]).astype(float))
    return _asked(dict(audit=audit), "audit", {"audit_matches": {}}, _MARGIN, 0.05, family="checks")


# --- what this execution cost ------------------------------------------------------------------------------------

def cost_findings(counts: dict, wall_s: float, threads_per_run: int = 1) -> pd.DataFrame:
    """What the page's execution cost and whether that is a cold-cache time, a numbers table (glued as
    ``ch04_cost_<key>``) from ``counts`` (``{namespace: (computed, total)}``, as :func:`bnstudy.study.sweep.sweep_counts`
    returns) and the wall time ``wall_s`` in seconds (``None``: not recorded, ``wall_min`` is NaN).

    ``wall_min``: minutes of wall time; ``n_computed`` of ``n_units`` cached units (stage-1 sources, search, sweep,
    step check and feature runs) were computed in this execution, ``n_cached`` read from the run cache;
    ``cache_state``: ``cold`` (every unit computed), ``warm`` (none) or ``partly warm``; ``threads_per_run``: torch
    threads each run used (:attr:`bnstudy.study.config.Execution.threads`, the sidecars' ``torch_threads_per_run``).
    Raises ``ValueError`` if a namespace claims more computed units than it has."""
    bad = [k for k, (c, t) in counts.items() if not 0 <= c <= t]
    if bad:
        raise ValueError(f"cost_findings: counts must satisfy 0 <= computed <= total, not for {bad}")
    n_c = int(sum(c for c, _ in counts.values()))
    n_t = int(sum(t for _, t in counts.values()))
    state = "cold" if n_t and n_c == n_t else ("warm" if n_c == 0 else "partly warm")
    return numbers_table(dict(wall_min=float("nan") if wall_s is None else float(wall_s) / 60, n_computed=n_c,
                              n_units=n_t, n_cached=n_t - n_c, cache_state=state, threads_per_run=int(threads_per_run)))
