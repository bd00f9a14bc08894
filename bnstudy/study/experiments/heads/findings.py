"""Chapter 4, what is claimed: the page's comparisons as data (:data:`QUESTIONS`, asked by
:func:`bnstudy.study.inference.ask`), its numbers as flat numbers tables, the chapter's own estimators (the link test's rank
correlations, the equivalence feasibility, the geometry's ratios), the counts in the book's one shape
(:func:`page_counts`) and the sentences the claims choose (:data:`NOTES`).

The *gap* of a (shift, head, optimizer) cell is ``task_b(separate_stats) - task_b(backbone_eval)`` per seed (positive
when pinning costs the new task); the cells of one shift are one family (Bonferroni intervals, equivalence at
``alpha / m``; counts count the printed verdicts).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from ...inference import MIN_BOOTSTRAP_UNITS, NOT_DECIDED, TOO_FEW, Family, Question, ask, bootstrap_interval, \
    claims_table, count_kinds, count_verdicts, decide_interval, equivalent_text, number, numbers_table, \
    paired_differences, rank_correlation, t_interval
from ...words import Note, counts_text
from .run import HEADS, INPUT_NORM_HEADS, OPTIMIZERS, REFERENCE_MODE, STEPS_CHECK_MODES, chosen_lrs, search_at, search_table

#: The page's direction words per family (condition minus reference above / below zero), by the names the page
#: cites them under (``ch04_w_<name>``, :func:`vocabulary`).
WORDS = {"gap": dict(gap_higher="separate_stats higher", gap_lower="separate_stats lower"),
         "gap_long": dict(gap_long_higher="separate_stats higher", gap_long_lower="separate_stats lower"),
         "interaction": dict(adam_higher="gap larger with Adam", adam_lower="gap smaller with Adam"),
         "hc": dict(head_larger="larger gap than linear", head_smaller="smaller gap than linear"),
         "lift": dict(lift_higher="higher than with linear", lift_lower="lower than with linear"),
         "lift_long": dict(lift_long_higher="higher than with linear", lift_long_lower="lower than with linear"),
         "sc": dict(shift_larger="larger gap at the shift", shift_smaller="smaller gap at the shift"),
         "steps": dict(steps_larger="gap larger with more steps", steps_smaller="gap smaller with more steps"),
         "bn": dict(bn_higher="all_eval higher", bn_lower="all_eval lower"),
         "link": dict(link_positive="rank correlation positive", link_negative="rank correlation negative")}
DIRECTIONS = tuple(dict.fromkeys(w for d in WORDS.values() for w in d.values()))
#: What each family's quantity allows (a difference of accuracies, of two gaps, a rank correlation): printed
#: interval ends are cut to it (:func:`printed`).
CLIPS = {"gap": (-1, 1), "gap_long": (-1, 1), "interaction": (-2, 2), "hc": (-2, 2), "lift": (-1, 1), "lift_long": (-1, 1), "sc": (-2, 2), "bn": (-1, 1), "steps": (-2, 2),
         "checks": None, "link": (-1, 1)}

# --- the questions, as data -------------------------------------------------------------------------------------
# Each comparison is condition minus reference per seed, at the page's margin; one group is one family. Tables:
# "main" (run's rows), "gaps" (gap_rows), "steps" (the step check's per-seed gaps), "rows" (run's rows with the
# checks' columns), "audit" (run.audit_buffers' table).
_GAP = dict(value="task_b", by="mode")
_GAPS = dict(value="gap", table="gaps")
QUESTIONS = {
    "gap": (Question("gap_{shift}_{head}_{optimizer}", "separate_stats", REFERENCE_MODE,
                     each=("shift", "head", "optimizer"), **_GAP),),
    # at chapter 1's shift: gap(adam) - gap(sgd) per head, and each head's gap minus the linear head's
    "interaction": (Question("adam_vs_sgd_{head}", "adam", "sgd", by="optimizer", at=dict(shift="ref"),
                             each=("head",), **_GAPS),),
    "hc": (Question("hc_{condition}_{optimizer}", tuple(h for h in HEADS if h != "linear"), "linear", by="head",
                    at=dict(shift="ref"), each=("optimizer",), **_GAPS),),
    # does a head that normalizes its input score higher on task B than the linear head? per seed, each head at
    # its own rate, with the backbone pinned and with separate statistics (the part specific to pinning is the gap's
    # change, family hc), at every shift; and at the longer budget
    "lift": tuple(Question(f"lift_{{shift}}_{m}_{{condition}}_{{optimizer}}", INPUT_NORM_HEADS, "linear", value="task_b",
                           by="head", at=dict(mode=mode), each=("shift", "optimizer"))
                  for m, mode in (("pinned", REFERENCE_MODE), ("separate", "separate_stats"))),
    "lift_long": tuple(Question(f"lift_long_{m}_{{condition}}_{{optimizer}}", INPUT_NORM_HEADS, "linear",
                                value="task_b", by="head", at=dict(mode=mode), each=("optimizer",), table="long")
                       for m, mode in (("pinned", REFERENCE_MODE), ("separate", "separate_stats"))),
    # does the shift make the gap? gap(ref) - gap(none)
    "sc": (Question("sc_{head}_{optimizer}", "ref", "none", by="shift", each=("head", "optimizer"), **_GAPS),),
    # the BatchNorm head's two pinned modes
    "bn": (Question("bn_{shift}_{optimizer}", "all_eval", REFERENCE_MODE, at=dict(head="mlp_bn"),
                    each=("shift", "optimizer"), **_GAP),),
    # the longer budget: the gap there (each mode at its own rate tuned at that budget), and its change from the
    # short budget (long minus short, per seed)
    "gap_long": (Question("gap_long_{head}_{optimizer}", "separate_stats", REFERENCE_MODE, each=("head", "optimizer"),
                          value="task_b", by="mode", table="long"),),
    "steps": (Question("steps_change_{head}_{optimizer}", "long", "short", value="gap", by="budget",
                       each=("head", "optimizer"), table="steps"),),
    # identities of the code (exact checks): train_mode's task B is separate_stats' (the same statistics see the
    # same stream); the pinned modes keep task A; train_mode's task A does not depend on the head or optimizer
    "checks": (Question("check_train_is_separate", "train_mode", "separate_stats", value="task_b", by="mode",
                        pair=("shift", "head", "optimizer", "seed"), table="rows", exact=0.0),
               Question("check_pinned_keep_a", value="task_a_change", at=dict(mode=("backbone_eval", "all_eval")),
                        table="rows", exact=0.0),
               Question("check_task_a_loss_shared", value="task_a_vs_first", at=dict(mode="train_mode"),
                        table="rows", exact=0.0)),
    # every part's buffers moved exactly where its mode declares they may
    "audit": (Question("audit_matches", value="mismatch", table="audit", exact=0.0),),
}


def _asked(tables: dict, group: str, margin: float | None, alpha: float = 0.05, family: str | None = None
           ) -> pd.DataFrame:
    """One family's claims table: :data:`QUESTIONS` ``[group]`` asked of ``tables`` at ``margin`` (a tuple of
    conditions: those the rows have), directions in the family's :data:`WORDS`, a column per ``each`` level (and
    ``by`` for a tuple of conditions), rows in the order the cells occur in the tables, ``m`` and ``count_kind``
    (the kind a count uses, :func:`bnstudy.study.inference.count_kinds`: the printed verdict's kind); the lift
    families' ``statistics`` (``pinned`` / ``separate``)."""
    qs, about = [], {}
    for q in QUESTIONS[group]:
        t, several = tables[q.table], isinstance(q.condition, tuple)
        if several:
            q = dataclasses.replace(q, condition=tuple(c for c in q.condition if c in set(t[q.by])))
        qs.append(q if q.exact is not None else dataclasses.replace(q, margin=margin))
        for levels in (dict.fromkeys(zip(*(t[c] for c in q.each))) if q.each else [()]):
            for c in (q.condition if several else [None]):
                cols = dict(zip(q.each, levels), **({q.by: c} if several else {}))
                about[q.key.format(**cols, condition=c)] = cols
    out = ask(tables, qs, alpha, family=family or group)
    hi, lo = WORDS.get(group, dict(higher="higher", lower="lower")).values()
    out["verdict"] = [{"higher": hi, "lower": lo}.get(k, v) for k, v in zip(out["kind"], out["verdict"])]
    order = {k: i for i, k in enumerate(about)}
    out = out.sort_values("key", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    out = pd.concat([out, pd.DataFrame([about[k] for k in out["key"]], index=out.index)], axis=1)
    out["m"] = max(len(out), 1)
    out["count_kind"] = count_kinds(out, alpha) if len(out) else pd.Series(dtype=str)
    if group.startswith("lift"):
        out["statistics"] = ["pinned" if "_pinned_" in k else "separate" for k in out["key"]]
    return out


def gap_values(df: pd.DataFrame, shift: str, head: str, optimizer: str) -> pd.Series:
    """The per-seed gap of one cell, indexed by seed (a seed without both modes left out). Raises ``ValueError``
    if the cell has no rows or lacks a mode."""
    cell = df[(df["shift"] == shift) & (df["head"] == head) & (df["optimizer"] == optimizer)]
    if not len(cell):
        raise ValueError(f"gap: no rows for cell ({shift}, {head}, {optimizer})")
    return paired_differences(cell, "task_b", "mode", "separate_stats", REFERENCE_MODE)


def gap_rows(df: pd.DataFrame) -> pd.DataFrame:
    """``shift, head, optimizer, seed, gap``: the per-seed gap of every cell of ``df`` (the table ``gaps``)."""
    cols = ["shift", "head", "optimizer", "seed", "gap"]
    parts = [pd.DataFrame({"shift": s, "head": h, "optimizer": o, "seed": d.index, "gap": d.to_numpy()})
             for s, h, o in dict.fromkeys(zip(df["shift"], df["head"], df["optimizer"]))
             for d in (gap_values(df, s, h, o),)]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def gap_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The gap claims, one family per shift, with ``sd`` (the per-seed gap's SD) and ``task_b_pinned`` /
    ``task_b_separate`` (the two modes' mean task-B accuracy)."""
    t = pd.concat([_asked(dict(main=g), "gap", margin, alpha) for _, g in df.groupby("shift", sort=False)],
                  ignore_index=True)
    cells = list(zip(t["shift"], t["head"], t["optimizer"]))
    mean = lambda s, h, o, m: float(df[(df["shift"] == s) & (df["head"] == h) & (df["optimizer"] == o)  # noqa: E731
                                       & (df["mode"] == m)]["task_b"].mean())
    gaps = [gap_values(df, *c) for c in cells]
    return t.assign(sd=[float(np.std(d, ddof=1)) if len(d) > 1 else math.nan for d in gaps],
                    task_b_pinned=[mean(*c, REFERENCE_MODE) for c in cells],
                    task_b_separate=[mean(*c, "separate_stats") for c in cells])


def claims(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The page's claims table from :func:`run`'s rows: families ``gap`` (:func:`gap_table`), ``checks`` and, where
    the rows have what they compare, ``interaction``, ``bn`` (mlp_bn), ``hc`` (the linear head; with
    ``separate`` / ``separate_reference``: the head's and the linear head's mean separate_stats accuracy, since a
    smaller gap can come from a worse separate side) and ``sc`` (the ``none`` shift). Raises ``ValueError`` without chapter 1's shift
    (``shift == "ref"``) or with a mode missing."""
    if "ref" not in set(df["shift"]):
        raise ValueError("claims needs chapter 1's shift (rows with shift == 'ref')")
    ref = df[df["shift"] == "ref"]
    first = df.groupby(["mode", "shift", "seed"])["task_a_after"].transform("first")
    tables = dict(main=df, gaps=gap_rows(df), rows=df.assign(task_a_change=df["task_a_after"] - df["task_a_before"],
                                                              task_a_vs_first=df["task_a_after"] - first))
    groups = {"interaction": {"adam", "sgd"} <= set(ref["optimizer"]), "bn": "mlp_bn" in set(df["head"]), "checks": True,
              "hc": "linear" in set(ref["head"]), "sc": "none" in set(df["shift"]),
              "lift": "linear" in set(ref["head"]) and bool(set(INPUT_NORM_HEADS) & set(ref["head"]))}
    C = pd.concat([gap_table(df, margin, alpha)] + [_asked(tables, g, margin, alpha) for g, on in groups.items() if on],
                  ignore_index=True)
    sep = lambda h, o: float(ref[(ref["head"] == h) & (ref["optimizer"] == o)  # noqa: E731
                                 & (ref["mode"] == "separate_stats")]["task_b"].mean())
    hc = C["family"] == "hc"
    if hc.any():
        C.loc[hc, "separate"] = [sep(h, o) for h, o in zip(C.loc[hc, "head"], C.loc[hc, "optimizer"])]
        C.loc[hc, "separate_reference"] = [sep("linear", o) for o in C.loc[hc, "optimizer"]]
    return C


def family(C: pd.DataFrame, name: str) -> pd.DataFrame:
    """One family's rows of a claims table, without the columns only other families fill."""
    t = C[C["family"] == name].reset_index(drop=True)
    keep = set(claims_table([]).columns) | {"family", "m", "count_kind"}
    return t[[c for c in t.columns if c in keep or t[c].notna().any()]]


def printed(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims with each family's interval ends cut to :data:`CLIPS` (for the page; tests and figures read the
    raw ends)."""
    out = claims.copy()
    for fam, clip in CLIPS.items():
        hit = out["family"] == fam
        if clip is not None and hit.any():
            out.loc[hit, ["low", "high"]] = out.loc[hit, ["low", "high"]].clip(*clip)
    return out


def summary_table(df: pd.DataFrame, by: list, metrics: list) -> pd.DataFrame:
    """Mean and 95% Student-t interval over seeds (not corrected; for display) of each of ``metrics`` per ``by``:
    ``*by, metric, mean, ci_low, ci_high, n_seeds``."""
    rows = []
    for key, g in df.groupby(by, sort=False):
        for metric in metrics:
            iv = t_interval(g[metric])
            rows.append(dict(zip(by, key), metric=metric, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


# --- the numbers beside the claims ------------------------------------------------------------------------------

def _cells(names) -> str:
    return ", ".join(names) if names else "none"


def _named(t: pd.DataFrame, kind: str) -> str:
    """The ``head/optimizer`` cells of claims ``t`` whose printed verdict is of ``kind``, or ``none``."""
    return _cells([f"{h}/{o}" for h, o, k in zip(t["head"], t["optimizer"], t["count_kind"]) if k == kind])


def lr_edges(lrs: dict, grids: dict) -> list[tuple]:
    """The chosen rates at an end of their grid (``grids``: ``{optimizer: grid}``), in ``lrs``' order: ``[(key, lr,
    "top" | "bottom")]``; a rate at the top (bottom) might be beaten by a larger (smaller) one."""
    return [(k, v, "top" if v == max(g) else "bottom") for k, v in lrs.items() for g in [grids.get(k[1])]
            if g is not None and len(g) >= 2 and v in (max(g), min(g))]


def _rates(lrs: dict, grids: dict) -> dict:
    edges = lr_edges(lrs, grids)
    return dict(lrs={"_".join(k): float(v) for k, v in lrs.items()}, n_lr_at_edge=len(edges),
                lr_edge_cells=_cells([f"{'/'.join(k)} at the {end} ({v:g})" for k, v, end in edges]))


def lr_choice_findings(lrs: dict, grids: dict) -> pd.DataFrame:
    """One shift's chosen rates (:func:`chosen_lrs`) as a numbers table: ``lrs_<head>_<optimizer>_<mode>``, ``n_lr``
    of them, ``n_lr_at_edge`` at an end of their grid and ``lr_edge_cells`` naming those."""
    return numbers_table(dict(**_rates(lrs, grids), n_lr=len(lrs)))


def search_findings(search: pd.DataFrame) -> pd.DataFrame:
    """The search at one shift as a sensitivity check (no intervals: few seeds, selected maxima), per
    ``<head>_<optimizer>``: ``gap_own_rates`` (separate_stats at its best rate minus backbone_eval at its own),
    ``gap_mean_rate`` (both at the mode-averaged rule's ``lr_mean_rule``), ``lr_pinned`` / ``lr_separate``. Raises
    ``ValueError`` if either mode is missing or the table covers several shifts."""
    search = search_at(search, None)
    missing = {REFERENCE_MODE, "separate_stats"} - set(search["mode"])
    if missing:
        raise ValueError(f"search_findings needs modes {sorted(missing)} in the search")
    t, mean_rule = search_table(search), chosen_lrs(search, "mean")
    out = dict(gap_own_rates={}, gap_mean_rate={}, lr_mean_rule={}, lr_pinned={}, lr_separate={})
    for (h, o), g in t[t["mode"] != "mean"].groupby(["head", "optimizer"], sort=False):
        piv = g.pivot(index="lr", columns="mode", values="val_accuracy").sort_index()
        pinned, sep, k, lr = piv[REFERENCE_MODE], piv["separate_stats"], f"{h}_{o}", mean_rule[(h, o)]
        out["gap_own_rates"][k] = float(sep.max() - pinned.max())
        out["lr_pinned"][k] = float(pinned.index[pinned == pinned.max()].min())
        out["lr_separate"][k] = float(sep.index[sep == sep.max()].min())
        out["lr_mean_rule"][k], out["gap_mean_rate"][k] = lr, float(sep[lr] - pinned[lr])
    return numbers_table(out)


def _steps_pairs(short: pd.DataFrame, long: pd.DataFrame) -> tuple[list, dict]:
    """The longer budget's seeds and per (head, optimizer) it ran the task-B series ``(pinned short, separate short,
    pinned long, separate long)`` over them (``short``: the sweep's rows at chapter 1's shift). Raises ``ValueError``
    if ``long`` is empty or a seed lacks a mode at either budget."""
    if not len(long):
        raise ValueError("steps_findings: the longer budget has no rows")
    seeds = sorted(set(long["seed"]))
    sel = lambda d, h, o, m: d[(d["shift"] == "ref") & (d["head"] == h) & (d["optimizer"] == o)  # noqa: E731
                               & (d["mode"] == m) & d["seed"].isin(seeds)].set_index("seed")["task_b"].reindex(seeds)
    out = {}
    for h, o in dict.fromkeys(zip(long["head"], long["optimizer"])):
        out[(h, o)] = tuple(sel(d, h, o, m) for d in (short, long) for m in STEPS_CHECK_MODES)
        if pd.concat(out[(h, o)]).isna().any():
            raise ValueError(f"steps_findings: {h}/{o} lacks backbone_eval or separate_stats for some seed at one of "
                             f"the budgets")
    return seeds, out


def steps_findings(short: pd.DataFrame, long: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """The longer budget per (head, optimizer) ``<head>_<optimizer>`` from the sweep's rows (``short``) and
    :func:`steps_check`'s (``long``) on its seeds: each mode's gain, long minus short (``separate_gain`` /
    ``pinned_gain``: how far from converged the short budget is), Student's t intervals over seeds at the family
    (Bonferroni) confidence over the ``n_cells`` cells, ``gain_confidence`` ``= 1 - alpha / n_cells`` (the book's rule
    for counts: a cell counts as gaining where this interval lies above zero), and ``pinned_long`` (mean pinned
    task-B accuracy at the longer budget). Raises ``ValueError`` as :func:`_steps_pairs`."""
    seeds, pairs = _steps_pairs(short, long)
    cell = lambda k: "_".join(k)  # noqa: E731
    conf = Family(len(pairs), alpha).confidence
    return numbers_table(dict(
        steps_short=int(short["steps"].iloc[0]), steps_long=int(long["steps"].iloc[0]), n_seeds=len(seeds),
        n_cells=len(pairs), gain_confidence=conf, **{k: {cell(c): t_interval(f(*v), conf) for c, v in pairs.items()}
                                                     for k, f in (("separate_gain", lambda ps, ss, pl, sl: sl - ss),
                                                                  ("pinned_gain", lambda ps, ss, pl, sl: pl - ps))},
        pinned_long={cell(c): float(v[2].mean()) for c, v in pairs.items()}))


def steps_claims(short: pd.DataFrame, long: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The longer budget's claims: family ``gap_long`` (separate minus pinned there, per head and optimizer, one
    family) and family ``steps`` (per seed the gap at the long budget minus at the short one)."""
    _, pairs = _steps_pairs(short, long)
    rows = pd.concat([pd.DataFrame({"head": h, "optimizer": o, "budget": b, "seed": g.index, "gap": g.to_numpy()})
                      for (h, o), (ps, ss, pl, sl) in pairs.items() for b, g in (("short", ss - ps), ("long", sl - pl))],
                     ignore_index=True)
    at_ref = long[long["shift"] == "ref"]
    parts = [_asked(dict(long=at_ref), "gap_long", margin, alpha), _asked(dict(steps=rows), "steps", margin, alpha)]
    norm = set(INPUT_NORM_HEADS) & set(at_ref["head"])
    whole = [o for o, g in at_ref.groupby("optimizer", sort=False) if {"linear", *norm} <= set(g["head"])]
    if norm and whole:  # the optimizers that ran the linear head and every input-normalizing head
        parts.append(_asked(dict(long=at_ref[at_ref["optimizer"].isin(whole)]), "lift_long", margin, alpha))
    return pd.concat(parts, ignore_index=True)


def long_findings(S: pd.DataFrame, SF: pd.DataFrame) -> pd.DataFrame:
    """The longer budget's counts (glued as ``ch04_long_<key>``) from :func:`steps_claims` ``S`` and
    :func:`steps_findings` ``SF``: the ``gap_long`` family's ``m`` / ``confidence`` and counts by printed verdict
    (``n_higher``, ``n_lower``, ``n_equivalent``, ``n_not_decided``, ``higher_cells``, ``lower_cells``), the ``steps``
    family's (``n_narrower`` / ``n_wider``: the gap smaller / larger than at the short budget), ``n_pinned_gains`` /
    ``n_separate_gains`` (cells whose family interval of long minus short accuracy, :func:`steps_findings`' Bonferroni
    over the cells, lies above zero: not converged at the short budget) and the best pinned cell at the longer
    budget."""
    g, st = S[S["family"] == "gap_long"], S[S["family"] == "steps"]
    c, cs = count_verdicts(g), count_verdicts(st)
    gains = lambda name: sum(number(SF, k).low > 0 for k in SF["key"] if k.startswith(name + "_"))  # noqa: E731
    pinned = {f"{h}/{o}": float(number(SF, f"pinned_long_{h}_{o}")) for h, o in zip(g["head"], g["optimizer"])}
    best = max(pinned, key=pinned.get) if pinned else ""
    return numbers_table(dict(
        m=int(len(g)), confidence=float(g["confidence"].iloc[0]) if len(g) else math.nan,
        n_higher=c["higher"], n_lower=c["lower"], n_equivalent=c["equivalent"],
        n_not_decided=c["not decided"] + c["too few seeds"], higher_cells=_named(g, "higher"),
        lower_cells=_named(g, "lower"), steps_m=int(len(st)),
        steps_confidence=float(st["confidence"].iloc[0]) if len(st) else math.nan, n_narrower=cs["lower"],
        n_wider=cs["higher"], narrower_cells=_named(st, "lower"), wider_cells=_named(st, "higher"),
        n_pinned_gains=int(gains("pinned_gain")), n_separate_gains=int(gains("separate_gain")), best_pinned_cell=best,
        best_pinned_acc=float(pinned[best]) if best else math.nan))


def _range(t: pd.DataFrame, kind: str | None = None) -> tuple[int, float, float]:
    """``(count, smallest, largest estimate)`` of the claims ``t`` whose printed verdict has ``kind`` (all: None)."""
    t = t if kind is None else t[t["count_kind"] == kind]
    return (len(t), float(t["estimate"].min()), float(t["estimate"].max())) if len(t) else (0, math.nan, math.nan)


#: The heads that normalize each feature (the plain lead's advice for a pinned backbone rests on their ``lift``).
PER_FEATURE_HEADS = ("std_linear", "bn_linear")


def input_norm_findings(C: pd.DataFrame, S: pd.DataFrame | None = None) -> pd.DataFrame:
    """The heads that normalize their own input (:data:`INPUT_NORM_HEADS`), glued as ``ch04_inorm_<key>``: ``m``
    (their gap cells at chapter 1's shift and the short budget) and per head ``<name>_<head>``:
    ``n_cells``, the gap cells counted by printed verdict (``n_higher``, ``n_equivalent``, ``n_not_decided``),
    ``gap_min`` / ``gap_max`` (estimates) and ``gap_high`` (the largest interval end); family ``lift`` at chapter
    1's shift (this head's task B minus the linear head's, per seed) with the pinned backbone (``n_lift_higher``,
    ``lift_min`` / ``lift_max``) and with separate statistics (``n_sep_higher``, ``sep_min`` / ``sep_max``); family
    ``hc`` (``n_smaller``: the gap shown smaller than the linear head's, the part specific to pinning). Per-feature
    heads (:data:`PER_FEATURE_HEADS`) together: ``pf_*`` (the same, over their cells; a lift's ``_min`` / ``_max``
    span every cell's estimate, its ``n_..._higher`` counts those shown), ``pf_other_min`` /
    ``pf_other_max`` (the pinned lift's estimates at the other shifts, counted in ``pf_other_higher`` of
    ``pf_other_m``), and given the longer budget's claims ``S`` (family ``lift_long``) ``pf_long_*``."""
    g = C[(C["family"] == "gap") & (C["shift"] == "ref") & C["head"].isin(INPUT_NORM_HEADS)]
    heads = list(dict.fromkeys(g["head"]))
    lift = C[C["family"] == "lift"] if "statistics" in C else C.iloc[:0]
    lift_at = lambda h, st, ref=True: lift[(lift["head"].isin(h)) & (lift["statistics"] == st)  # noqa: E731
                                           & ((lift["shift"] == "ref") == ref)]
    out = dict(m=int(len(g)))
    for h in heads:
        gh = g[g["head"] == h]
        c, ch = count_verdicts(gh), count_verdicts(C[(C["family"] == "hc") & (C["head"] == h)])
        n_l, lo_l, hi_l = _range(lift_at([h], "pinned"), "higher")
        n_s, lo_s, hi_s = _range(lift_at([h], "separate"), "higher")
        for k, v in dict(n_cells=len(gh), n_higher=c["higher"], n_equivalent=c["equivalent"],
                         n_not_decided=c["not decided"] + c["too few seeds"], gap_min=float(gh["estimate"].min()),
                         gap_max=float(gh["estimate"].max()), gap_high=float(gh["high"].max()), n_lift_higher=n_l,
                         n_lift=len(lift_at([h], "pinned")), lift_min=lo_l, lift_max=hi_l, n_sep_higher=n_s,
                         sep_min=lo_s, sep_max=hi_s, n_smaller=ch["lower"]).items():
            out.setdefault(k, {})[h] = v
    pf = [h for h in PER_FEATURE_HEADS if h in heads]
    if pf:
        shown = lambda t: _range(t, "higher")[0]  # noqa: E731
        gp, other = g[g["head"].isin(pf)], lift_at(pf, "pinned", False)
        hc = C[(C["family"] == "hc") & C["head"].isin(pf)]
        out.update(pf_m=len(gp), pf_n_higher=shown(gp), pf_gap_min=float(gp["estimate"].min()),
                   pf_gap_max=float(gp["estimate"].max()), pf_gap_high=float(gp["high"].max()),
                   pf_n_smaller=int((hc["count_kind"] == "lower").sum()), pf_other_m=len(other),
                   pf_other_higher=shown(other), pf_other_min=_range(other)[1], pf_other_max=_range(other)[2])
        long = S is not None and (S["family"] == "lift_long").any()
        for name, st in (("lift", "pinned"), ("sep", "separate")):  # counts of those shown; the range of all
            t = lift_at(pf, st)
            out.update({f"pf_n_{name}_higher": shown(t), f"pf_{name}_min": _range(t)[1],
                        f"pf_{name}_max": _range(t)[2]})
            if long:
                t = S[(S["family"] == "lift_long") & S["head"].isin(pf) & (S["statistics"] == st)]
                out.update({f"pf_long_n_{name}": len(t), f"pf_long_n_{name}_higher": shown(t),
                            f"pf_long_{name}_min": _range(t)[1], f"pf_long_{name}_max": _range(t)[2]})
    return numbers_table(out)


def equivalence_max_sd(margin: float, n: int, family: Family = Family()) -> float:
    """The largest per-seed SD of a gap of mean exactly 0 that TOST at ``family.level`` can still call equivalent
    within ``±margin`` with ``n`` seeds (the design's feasibility): ``margin`` over the half-width of the ``1 - 2
    level`` t interval of ``n`` values of SD 1; NaN for ``n < 2``."""
    if n < 2:
        return math.nan
    unit = np.arange(n, dtype=float)
    unit = (unit - unit.mean()) / unit.std(ddof=1)
    return float(margin / t_interval(unit, 1 - 2 * family.level).high)


def _contrast(table: pd.DataFrame) -> dict:
    """A contrast family's ``m``, ``confidence``, counts ``n_larger`` / ``n_smaller`` and those cells."""
    c = count_verdicts(table)
    return dict(m=int(len(table)), confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
                n_larger=c["higher"], n_smaller=c["lower"], larger_cells=_named(table, "higher"),
                smaller_cells=_named(table, "lower"))


def findings(df: pd.DataFrame, lrs: dict | None = None, grids: dict | None = None, margin: float = 0.02,
             alpha: float = 0.05, C: pd.DataFrame | None = None) -> pd.DataFrame:
    """The page's numbers table (accuracies are fractions) from :func:`run`'s rows, its claims ``C`` (computed if
    not given), the chosen rates ``lrs`` and the grids ``{optimizer: grid}``: the gap family's size and confidence
    (``n_cells``, ``confidence``), per shift its counts (``n_separate_higher_<shift>``, ...) and median gap SD
    beside the largest SD an equivalence could pass (:func:`equivalence_max_sd`); the cells counted at chapter 1's
    shift; the other families' ``m`` / ``confidence`` and counts (:func:`_contrast`; ``hc_n_smaller_worse_separate``:
    smaller gaps from a worse separate side); per optimizer ``f3_heads_holding`` (heads whose gap counts as
    separate_stats higher) and ``f3_rate_edge``; ``train_mode_task_a_change`` (95% t); the best pinned and separate
    cells at chapter 1's shift; the rates (:func:`lr_choice_findings`); ``eval_se``, one accuracy's binomial SE."""
    C = claims(df, margin, alpha) if C is None else C
    gt = C[C["family"] == "gap"]
    by_shift = {s: count_verdicts(g) for s, g in gt.groupby("shift", sort=False)}
    count = lambda kind: {s: c[kind] for s, c in by_shift.items()}  # noqa: E731
    ref = gt[gt["shift"] == "ref"]
    fam = Family(int(ref["m"].iloc[0]), alpha)
    max_sd = equivalence_max_sd(margin, int(df["seed"].nunique()), fam)
    opts = list(dict.fromkeys(ref["optimizer"]))
    tm = df[(df["mode"] == "train_mode") & (df["shift"] == "ref")]
    first = tm[(tm["head"] == tm["head"].iloc[0]) & (tm["optimizer"] == tm["optimizer"].iloc[0])]
    bp, bs = ref.loc[ref["task_b_pinned"].idxmax()], ref.loc[ref["task_b_separate"].idxmax()]
    edges = {k for k, _, _ in lr_edges(lrs or {}, grids or {})}
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df else 0
    p_sep = float(ref["task_b_separate"].mean())
    se = math.sqrt(p_sep * (1 - p_sep) / n_eval) if n_eval else math.nan
    out = dict(
        n_seeds=int(df["seed"].nunique()), n_cells=fam.m, confidence=fam.confidence, margin=margin,
        n_separate_higher=count("higher"), n_separate_lower=count("lower"), n_equivalent=count("equivalent"),
        n_not_decided=count("not decided"), n_too_few=count("too few seeds"),
        separate_higher_ref=_named(ref, "higher"), equivalent_ref=_named(ref, "equivalent"), equiv_max_sd=max_sd,
        equiv_sd_median={s: float(g["sd"].median()) for s, g in gt.groupby("shift", sort=False)},
        n_equiv_feasible={s: int((g["sd"] < max_sd).sum()) for s, g in gt.groupby("shift", sort=False)},
        f3_heads_holding={o: int(((ref["optimizer"] == o) & (ref["count_kind"] == "higher")).sum()) for o in opts},
        f3_rate_edge={o: "a rate at the grid's edge" if {("linear", o, REFERENCE_MODE), ("linear", o, "separate_stats"),
                                                          ("linear", o)} & edges else "rates inside the grid"
                      for o in opts},
        train_mode_task_a_change=t_interval(first["task_a_after"] - first["task_a_before"]),
        best_pinned_cell=f"{bp['head']}/{bp['optimizer']}", best_pinned_acc=float(bp["task_b_pinned"]),
        best_separate_cell=f"{bs['head']}/{bs['optimizer']}", best_separate_acc=float(bs["task_b_separate"]),
        **_rates(lrs or {}, grids or {}), n_eval=n_eval, eval_se=se, margin_in_se=margin / se if se > 0 else math.nan)
    for name in ("interaction", "bn"):
        t = C[C["family"] == name]
        out.update({f"{name}_m": int(t["m"].iloc[0]) if len(t) else 0,
                    f"{name}_confidence": float(t["confidence"].iloc[0]) if len(t) else math.nan})
    for name in ("hc", "sc"):
        t = C[C["family"] == name]
        if len(t):
            out[name] = _contrast(t)
    if "hc" in out:
        hc = C[C["family"] == "hc"]
        worse = [f"{h}/{o}" for h, o, k, s, r in zip(hc["head"], hc["optimizer"], hc["count_kind"], hc["separate"],
                                                     hc["separate_reference"]) if k == "lower" and s < r]
        out["hc"].update(n_smaller_worse_separate=len(worse), smaller_worse_separate_cells=_cells(worse))
    return numbers_table(out)


def best_pinned_claim(C: pd.DataFrame, F: pd.DataFrame) -> pd.DataFrame:
    """The gap claim of the best pinned cell (``best_pinned_cell`` of ``F``) under the key ``best_pinned_gap``, so
    that the page cites it without knowing which cell it is."""
    return C[C["key"] == "gap_ref_" + number(F, "best_pinned_cell").replace("/", "_")].assign(key="best_pinned_gap")


def vocabulary(margin: float) -> dict:
    """The page's verdict words by name (glued as ``ch04_w_<name>``): every direction of :data:`WORDS`, the
    equivalence verdict at ``margin``, ``not decided`` and ``too few seeds``."""
    return {**{k: w for d in WORDS.values() for k, w in d.items()}, "equivalent": equivalent_text(margin),
            "not_decided": NOT_DECIDED, "too_few": TOO_FEW}


# --- the page's words: the counts in the book's one shape and the notes the claims choose ---------------------------

def page_numbers(F: pd.DataFrame, **parts: pd.DataFrame) -> pd.DataFrame:
    """The page's numbers in one table for the notes (:data:`NOTES`): ``F`` (:func:`findings`) with its keys as they
    are and each of ``parts`` (``{prefix: numbers table}``, e.g. ``long=`` :func:`long_findings`) with its keys as
    ``<prefix>_<key>``, the names the page glues them under (``ch04_<prefix>_<key>``)."""
    return pd.concat([F] + [t.assign(key=f"{p}_" + t["key"]) for p, t in parts.items()], ignore_index=True)


def page_counts(C: pd.DataFrame, S: pd.DataFrame, margin: float) -> dict:
    """The page's counts in the book's one shape (:func:`bnstudy.study.words.counts_text`), glued as ``ch04_<name>``:
    the gap family at chapter 1's shift (``gap_counts_ref``, claims ``C``; ``inorm_pf_gap_counts``: the cells of the
    per-feature heads, :data:`PER_FEATURE_HEADS`), at the longer budget (``gap_counts_long``) and the gap's change
    between the budgets (``steps_counts``; both from :func:`steps_claims` ``S``)."""
    sides = ("head and optimizer cells", "separate statistics", "the pinned backbone", margin)
    gap = C[C["family"] == "gap"]
    ref = gap[gap["shift"] == "ref"]
    return dict(gap_counts_ref=counts_text(ref, *sides),
                inorm_pf_gap_counts=counts_text(ref[ref["head"].isin(PER_FEATURE_HEADS)], *sides),
                gap_counts_long=counts_text(S[S["family"] == "gap_long"], *sides),
                steps_counts=counts_text(S[S["family"] == "steps"], "gaps at the longer budget", "the gap",
                                         "the short budget's", margin))


def _ref_counts(C: pd.DataFrame) -> dict:
    """The gap family's counts at chapter 1's shift (the book's rule), with ``m``."""
    return count_verdicts(C[(C["family"] == "gap") & (C["shift"] == "ref")])


def _counted(rule):
    """A note's rule on :func:`_ref_counts`."""
    return lambda C, N: rule(_ref_counts(C))


def _v(N: pd.DataFrame) -> dict:
    """The page's numbers ``N`` (:func:`page_numbers`) as ``{key: value}`` (an interval as an
    :class:`~bnstudy.study.inference.Interval`)."""
    return {k: number(N, k) for k in N.get("key", ())}


def _fill(C: pd.DataFrame, N: pd.DataFrame) -> dict:
    """The fields a note's sentence quotes: every number of ``N`` by its key (``{inorm_pf_m}``, an interval's
    ``{geo_probe_cost.low:+.3f}``), the gap family's counts at chapter 1's shift (``{higher}``, ``{m}``, ...) and
    its ``{margin}`` (where ``C`` has the gap family)."""
    gap = C[C["family"] == "gap"] if "family" in C else C.iloc[:0]
    return {**_v(N), **(_ref_counts(C) if len(gap) else {}),
            "margin": float(gap["margin"].iloc[0]) if "margin" in gap and len(gap) else math.nan}


def _curvature(N: pd.DataFrame) -> str:
    """Where the curvature pinned statistics add comes from (:func:`geometry_findings`, as ``geo_*`` in ``N``):
    ``nan`` (a ratio missing), ``none`` (ratio at most 1), ``wider`` (the centred ratio's excess at least half the
    uncentred one's) or ``offset``."""
    r, c = number(N, "geo_curvature_ratio"), number(N, "geo_curvature_centered_ratio")
    if math.isnan(r) or math.isnan(c):
        return "nan"
    return "none" if r <= 1 else "wider" if c - 1 >= (r - 1) / 2 else "offset"


def _probe(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """Where the closed-form probe's interval (separate minus pinned features) lies: ``none`` (no interval),
    ``lost`` (above zero), ``gained`` (below) or ``zero`` (includes it)."""
    p = number(N, "geo_probe_cost")
    return "none" if math.isnan(p.low) or math.isnan(p.high) else "lost" if p.low > 0 else \
        "gained" if p.high < 0 else "zero"


def _shortfall(C: pd.DataFrame, N: pd.DataFrame) -> bool | str:
    """Whether the linear head's gap with SGD + momentum lies above the probe's whole interval; ``none`` where the
    probe has no interval (nothing to compare with)."""
    t, high = C[C["key"] == "gap_ref_linear_sgd"], number(N, "geo_probe_cost").high
    return "none" if math.isnan(high) else bool(len(t)) and float(t.iloc[0]["low"]) > high


def _gains(N: pd.DataFrame) -> str:
    """Which modes still gained from the short to the longer budget: ``both``, ``pinned``, ``separate`` or
    ``neither``."""
    p, q = (number(N, f"long_n_{m}_gains") > 0 for m in ("pinned", "separate"))
    return "both" if p and q else "pinned" if p else "separate" if q else "neither"


def _lift(N: pd.DataFrame) -> str:
    """Whether normalizing each feature before the linear head raised task B over it (``inorm_pf_*`` of ``N``):
    ``absent`` (no such head ran), ``all`` (in every cell with both statistics), ``none`` (in no cell) or ``some``."""
    v = _v(N)
    if "inorm_pf_m" not in v:
        return "absent"
    k, k2, m = v["inorm_pf_n_lift_higher"], v["inorm_pf_n_sep_higher"], v["inorm_pf_m"]
    return "all" if k == k2 == m > 0 else "none" if k == k2 == 0 else "some"


def _advice(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """What the advice on the statistics rests on: ``no cost`` (pinning shown to cost in no cell at chapter 1's
    shift, at either budget), ``left undecided`` (a cost, and no per-feature head's gap shown) or ``cost``."""
    v = _v(N)
    if not (_ref_counts(C)["higher"] or v.get("long_n_higher", 0)):
        return "no cost"
    return "left undecided" if v.get("inorm_pf_n_higher", 1) == 0 else "cost"


def _when(key: str, rule, cases: dict) -> tuple:
    """One :class:`Note` per ``{case: text}`` of ``key``, said where ``rule(C, N) == case``, quoting :func:`_fill`."""
    return tuple(Note(key, lambda C, N, case=case: rule(C, N) == case, text, _fill) for case, text in cases.items())


_PIN = " for pinned statistics at chapter 1's shift"
_COST = "No head and optimizer cell shows a cost of pinned statistics at chapter 1's shift"
_PROBE = "A least-squares probe solved in closed form, free of any optimizer, reads {geo_probe_cost.mean:+.3f}"
_SPAN = " ({geo_probe_cost.low:+.3f} to {geo_probe_cost.high:+.3f}) on separate minus pinned features"
_HEADS = "with {higher} of the {m} heads and optimizers tried"
#: How every plain lead (:data:`NOTES`, key ``plain``) opens, so that the budget is named after it.
AT_SHIFT = "At chapter 1's shift"
_AT = AT_SHIFT + " and {steps_steps_short:,} steps"
_WHAT = "normalizing each feature before the new linear head (a fixed standardization, or a BatchNorm that keeps " \
        "updating on the new task)"
_RAISED = ": at chapter 1's shift and {steps_steps_short:,} steps on this synthetic task it raised task-B accuracy " \
          "in {inorm_pf_n_lift_higher} of {inorm_pf_m} cells with the pinned backbone ({inorm_pf_lift_min:+.3f} to " \
          "{inorm_pf_lift_max:+.3f}) and in {inorm_pf_n_sep_higher} of {inorm_pf_m} with separate statistics " \
          "({inorm_pf_sep_min:+.3f} to {inorm_pf_sep_max:+.3f}), and narrowed the gap between them in " \
          "{inorm_pf_n_smaller} of {inorm_pf_m}; at {steps_steps_long:,} steps, in {inorm_pf_long_n_lift_higher} of " \
          "{inorm_pf_long_n_lift} ({inorm_pf_long_lift_min:+.3f} to {inorm_pf_long_lift_max:+.3f}) and " \
          "{inorm_pf_long_n_sep_higher} of {inorm_pf_long_n_sep} ({inorm_pf_long_sep_min:+.3f} to " \
          "{inorm_pf_long_sep_max:+.3f}), with its effect on the gap not tested there."
_GAINED = "still gained accuracy from {steps_steps_short:,} to {steps_steps_long:,} steps"
_BONF = "on Bonferroni intervals over the cells"
_SEPARATE = "Separate statistics scored higher in {higher} of the {m} head and optimizer cells ({long_n_higher} of " \
            "{long_m} at the longer budget) and lower in {lower}."
_OWN = " Where the new task must be as good as it can be, give it its own statistics (the `separate_stats` mode, " \
       "built with `bnstudy.shared_weight_copy(model.backbone)`)."
#: The page's rule-triggered sentences (:func:`bnstudy.study.words.notes` on the claims and :func:`page_numbers`),
#: glued as ``ch04_<key>``, each key's rules covering every outcome once:
#:
#: * ``plain``: the plain lead of the answer box and the front page, by the gap family's counts at chapter 1's shift;
#: * ``lead``: the answer's lead on the same counts;
#: * ``probe`` / ``probe_tail``: where the closed-form probe's interval lies, and whether the trained linear head
#:   falls short by more than the features lose;
#: * ``geo_sentence_curvature``: whether the added curvature under pinned statistics survives centring;
#: * ``gains``: whether each mode still gained from the short to the longer budget (Bonferroni over the cells);
#: * ``lift_plain``: whether normalizing each feature before the linear head raised task B with both statistics;
#: * ``advice_lift`` / ``advice_separate``: what to do about the head's input and about the statistics.
NOTES = (
    Note("plain", _counted(lambda c: c["higher"] == c["m"]),
         "**Give the new task its own statistics.** " + _AT + " they beat a pinned backbone with every head and "
         "optimizer tried.", _fill),
    Note("plain", _counted(lambda c: 0 < c["higher"] < c["m"] and c["lower"] == 0),
         "**Prefer the new task's own statistics.** " + _AT + " they beat a pinned backbone " + _HEADS +
         " and lose with none.", _fill),
    Note("plain", _counted(lambda c: c["higher"] > 0 and c["lower"] > 0),
         "**It depends on the head.** " + _AT + " separate statistics beat a pinned backbone " + _HEADS +
         " and lose with {lower}.", _fill),
    Note("plain", _counted(lambda c: c["higher"] == 0 < c["lower"]),
         "**Pin the backbone.** " + _AT + " separate statistics lose to a pinned backbone with {lower} of the "
         "{m} heads and optimizers tried and win with none.", _fill),
    Note("plain", _counted(lambda c: c["higher"] == c["lower"] == 0),
         "**Either works on this evidence.** " + _AT + " no head and optimizer tried shows separate "
         "statistics ahead of a pinned backbone or behind it.", _fill),
    Note("lead", _counted(lambda c: c["higher"] == c["m"]), "No head or optimizer tried makes up" + _PIN),
    Note("lead", _counted(lambda c: c["higher"] == 0 < c["equivalent"] == c["m"]),
         "Every head and optimizer tried makes up" + _PIN + ", within ±{margin:g}", _fill),
    Note("lead", _counted(lambda c: c["higher"] == c["lower"] == 0 and c["equivalent"] < c["m"]),
         _COST + ", and not every one is shown to be without one"),
    Note("lead", _counted(lambda c: c["higher"] == 0 < c["lower"]), _COST),
    Note("lead", _counted(lambda c: 0 < c["higher"] < c["m"] and c["lower"] == c["equivalent"] == 0),
         "No head or optimizer tried is shown to make up" + _PIN),
    Note("lead", _counted(lambda c: 0 < c["higher"] < c["m"] and c["lower"] == 0 < c["equivalent"]
                          and c["higher"] + c["equivalent"] == c["m"]),
         "Some heads and optimizers make up" + _PIN + " and others do not"),
    Note("lead", _counted(lambda c: 0 < c["higher"] < c["m"] and (c["lower"] > 0
                                                                  or 0 < c["equivalent"] < c["m"] - c["higher"])),
         "Whether a head or optimizer makes up" + _PIN + " depends on the cell"),
    *_when("probe", _probe, {
        "none": _PROBE + " on separate minus pinned features, without an interval (too few seeds).",
        "lost": _PROBE + _SPAN + ": pinning loses some linearly decodable information about task B.",
        "gained": _PROBE + _SPAN + ": for this probe the pinned features are the more linearly decodable.",
        "zero": _PROBE + _SPAN + ", an interval that includes zero: this probe detects no linearly decodable "
                                 "information lost to pinning."}),
    *_when("probe_tail", _shortfall, {
        "none": "",
        True: "The trained linear head with SGD and momentum falls short by more than the probe's upper end "
              "({geo_probe_cost.high:+.3f}), a shortfall of optimization (rate and step budget) rather than of the "
              "features.",
        False: "The trained linear head with SGD and momentum is not shown to fall short by more than the probe's "
               "upper end ({geo_probe_cost.high:+.3f})."}),
    *_when("geo_sentence_curvature", lambda C, N: _curvature(N), {
        "nan": "The centred ratio is not available.", "none": "Pinned statistics add no curvature here.",
        "wider": "So most of the added curvature comes from the wider features, not from the common offset.",
        "offset": "So most of the added curvature comes from the common offset, not from the wider features."}),
    *_when("gains", lambda C, N: _gains(N), {
        "both": "Both modes " + _GAINED + " (pinned in {long_n_pinned_gains} of {steps_n_cells} cells, separate in "
                "{long_n_separate_gains}, " + _BONF + "), so neither budget is shown to be converged.",
        "pinned": "Only the pinned mode " + _GAINED + " ({long_n_pinned_gains} of {steps_n_cells} cells, the "
                  "separate in none, " + _BONF + "), so neither budget is shown to be converged.",
        "separate": "Only the separate mode " + _GAINED + " ({long_n_separate_gains} of {steps_n_cells} cells, the "
                    "pinned in none, " + _BONF + "), so neither budget is shown to be converged.",
        "neither": "Neither mode is shown to gain accuracy from {steps_steps_short:,} to {steps_steps_long:,} steps in "
                   "any of the {steps_n_cells} cells (" + _BONF + ")."}),
    *_when("lift_plain", lambda C, N: _lift(N), {
        "absent": "", "all": "Whatever the statistics, consider " + _WHAT + _RAISED,
        "none": "On this synthetic task, " + _WHAT + " raised task-B accuracy in none of the {inorm_pf_m} cells tried "
                "at chapter 1's shift and {steps_steps_short:,} steps.",
        "some": _WHAT[0].upper() + _WHAT[1:] + _RAISED}),
    *_when("advice_lift", lambda C, N: _lift(N) == "all", {
        True: "Whatever the statistics, consider a normalization of each feature in front of a linear head: "
              "`std_linear` (a standardization fitted once on new-task features) or `bn_linear` (whose BatchNorm must "
              "keep updating on the new task: pin `model.backbone`, not the whole model). Here it raised task B over "
              "the plain linear head in all {inorm_pf_m} cells with the pinned backbone and with separate statistics "
              "alike (family `lift`).", False: ""}),
    *_when("advice_separate", _advice, {
        "left undecided": _SEPARATE + " With the per-feature normalizing heads the gap left is not decided "
                          "({inorm_pf_gap_min:+.3f} to {inorm_pf_gap_max:+.3f}, interval ends up to "
                          "{inorm_pf_gap_high:+.3f}): these seeds can neither show it nor rule it out." + _OWN,
        "cost": _SEPARATE + _OWN,
        "no cost": "At this shift no cell shows a cost of pinning that another head or optimizer would have to make "
                   "up."}),
)


# --- the "why" section: the feature geometry and its link to the gap -----------------------------------------------

def geometry_findings(geom: pd.DataFrame, shift: str = "ref") -> pd.DataFrame:
    """The "why" section's numbers from :func:`feature_geometry`'s table at ``shift`` (means over seeds; ratios
    pinned over separate), and ``probe_cost``: the probe's accuracy on separate minus pinned features per seed
    (positive: pinning loses linearly decodable information; 95% t interval)."""
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


#: The geometry measures the link test relates to the gap, with the sign each explanation predicts: a larger
#: curvature ratio (pinned / separate: the optimization story) and a larger probe cost (the information story)
#: should both go with a larger gap.
LINK_MEASURES = {"curvature_ratio": 1, "probe_cost": 1}


def link_table(df: pd.DataFrame, geom: pd.DataFrame, head: str = "linear", n_boot: int = 2000, alpha: float = 0.05,
               seed: int = 0) -> pd.DataFrame:
    """Does the feature geometry track the gap? (family ``link``, no training) Spearman's rho of each
    :data:`LINK_MEASURES` measure with ``head``'s per-seed gap, per optimizer and scope: ``ref`` (a point per seed at
    chapter 1's shift; Fisher-z interval) and ``all`` (a point per seed and shift, not independent within a seed: a
    seeded percentile bootstrap over whole seeds, no p-value, no interval below ``MIN_BOOTSTRAP_UNITS`` seeds). One
    family (Bonferroni); columns ``scope, optimizer, measure, predicted_sign, n_points`` besides the claims'. Empty if
    ``head`` has no rows; raises ``ValueError`` if ``geom`` lacks a measure's columns."""
    need = {"seed", "shift", "statistics", "curvature", "probe_accuracy"} - set(geom.columns)
    if need:
        raise ValueError(f"link_table: the geometry table lacks columns {sorted(need)}")
    opts = [o for o in OPTIMIZERS if o in set(df[df["head"] == head]["optimizer"])]
    fam, (hi, lo) = Family(max(2 * len(opts) * len(LINK_MEASURES), 1), alpha), WORDS["link"].values()
    p = geom[geom["statistics"] == "pinned"].set_index(["seed", "shift"])
    q = geom[geom["statistics"] == "separate"].set_index(["seed", "shift"]).reindex(p.index)
    meas = pd.DataFrame({"curvature_ratio": p["curvature"] / q["curvature"],
                         "probe_cost": q["probe_accuracy"] - p["probe_accuracy"]}).reset_index()
    out, extra = [], []
    for o in opts:
        gaps = [pd.DataFrame({"seed": gv.index, "shift": s, "gap": gv.to_numpy()})
                for s in dict.fromkeys(df["shift"]) for gv in (gap_values(df, s, head, o),)]
        tab = meas.merge(pd.concat(gaps), on=["seed", "shift"]).dropna()
        for scope in ("ref", "all"):
            t = tab[tab["shift"] == "ref"] if scope == "ref" else tab
            y, seeds = t["gap"].to_numpy(), np.array(sorted(set(t["seed"])))
            rows_of = [np.flatnonzero(t["seed"].to_numpy() == s) for s in seeds]
            for m, sign in LINK_MEASURES.items():
                x = t[m].to_numpy()
                if scope == "ref":
                    _, iv, pv = rank_correlation(x, y, fam.confidence)
                else:
                    pooled = lambda ix: rank_correlation(*(a[np.concatenate([rows_of[int(i)] for i in ix])]  # noqa
                                                           for a in (x, y)))[0]
                    iv, pv = bootstrap_interval((np.arange(len(rows_of)),), pooled, fam.confidence, n_boot, seed,
                                                min_units=MIN_BOOTSTRAP_UNITS), math.nan
                out.append(decide_interval(iv, f"link_{scope}_{o}_{m}", p=pv, higher=hi, lower=lo))
                extra.append(dict(scope=scope, optimizer=o, measure=m, predicted_sign=sign, n_points=len(t)))
    t = claims_table(out, family="link")
    t["m"] = fam.m
    t = pd.concat([t, pd.DataFrame(extra, index=t.index, columns=["scope", "optimizer", "measure", "predicted_sign",
                                                                 "n_points"])], axis=1)
    t["count_kind"] = count_kinds(t, alpha) if len(t) else pd.Series(dtype=str)
    return t


def link_findings(table: pd.DataFrame, head: str = "linear") -> pd.DataFrame:
    """The link test's counts on its printed verdicts : ``head``, ``m``,
    ``confidence``; ``n_predicted`` / ``n_opposite`` (a direction with / against the predicted sign) and ``n_tests``
    (rows not ``too few seeds``), and the same per scope (``_ref``, ``_all``)."""
    pred = ((table["kind"] == "higher") & (table["predicted_sign"] > 0)) | \
        ((table["kind"] == "lower") & (table["predicted_sign"] < 0))
    tested, direction = table["kind"] != TOO_FEW, table["kind"].isin(["higher", "lower"])
    return numbers_table(dict(
        head=head, m=int(table["m"].iloc[0]) if len(table) else 0,
        confidence=float(table["confidence"].iloc[0]) if len(table) else math.nan,
        n_predicted=int(pred.sum()), n_opposite=int((direction & ~pred).sum()), n_tests=int(tested.sum()),
        **{f"n_{k}_{s}": int((v & (table["scope"] == s)).sum()) for s in ("ref", "all")
           for k, v in (("predicted", pred), ("tests", tested))}))


def link_texts(table: pd.DataFrame) -> dict:
    """The words for each link row's value, keyed ``<scope>_<optimizer>_<measure>``, to follow "$\\rho$": ``= +0.12
    (-0.30 to +0.50)``, ``= -0.83, no interval``, or ``not computed (2 seeds, one point each)``; never NaN."""
    out = {}
    for r in table.itertuples(index=False):
        if math.isnan(r.estimate):
            text = f"not computed ({f'{r.n} seeds, one point each' if r.n_points == r.n else f'{r.n_points} points'})"
        elif math.isnan(r.low) or math.isnan(r.high):
            text = f"= {r.estimate:+.2f}, no interval"
        else:
            text = f"= {r.estimate:+.2f} ({r.low:+.2f} to {r.high:+.2f})"
        out[f"{r.scope}_{r.optimizer}_{r.measure}"] = text
    return out


def audit_claims(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`run.audit_buffers`' table as an exact check (key ``audit_matches``, family ``checks``): every part
    moved exactly where its mode declares it may (``moved == declared`` on every row)."""
    audit = table.assign(mismatch=(table["moved"] != table["declared"]).astype(float))
    return _asked(dict(audit=audit), "audit", None, family="checks")


def cost_findings(counts: dict, wall_s: float | None, threads_per_run: int = 1) -> pd.DataFrame:
    """What the execution cost, from ``{namespace: (computed, total)}`` and the wall time in seconds (``None``:
    NaN): ``wall_min``, ``n_computed`` / ``n_cached`` of ``n_units``, ``cache_state`` (``cold``, ``warm``, ``partly
    warm``), ``threads_per_run``. Raises ``ValueError`` if a namespace claims more computed units than it has."""
    bad = [k for k, (c, t) in counts.items() if not 0 <= c <= t]
    if bad:
        raise ValueError(f"cost_findings: counts must satisfy 0 <= computed <= total, not for {bad}")
    n_c, n_t = int(sum(c for c, _ in counts.values())), int(sum(t for _, t in counts.values()))
    state = "cold" if n_t and n_c == n_t else ("warm" if n_c == 0 else "partly warm")
    return numbers_table(dict(wall_min=float("nan") if wall_s is None else float(wall_s) / 60, n_computed=n_c,
                              n_units=n_t, n_cached=n_t - n_c, cache_state=state, threads_per_run=int(threads_per_run)))
