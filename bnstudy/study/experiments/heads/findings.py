"""Chapter 4, what is claimed: the page's comparisons as data (:data:`QUESTIONS`), its numbers tables, the chapter's
own estimators (link test, equivalence feasibility, geometry ratios) and the sentences the claims choose.

The *gap* of a (shift, head, optimizer) cell is ``task_b(separate_stats) - task_b(backbone_eval)`` per seed; the cells
of one shift are one family (Bonferroni intervals, equivalence at ``alpha / m``).
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
from .run import HEADS, INPUT_NORM_HEADS, OPTIMIZERS, REFERENCE_MODE, STEPS_CHECK_MODES, chosen_lrs, search_at, \
    search_table

#: The page's direction words per family, by the names the page cites them under (``ch04_w_<name>``).
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
CLIPS = {**dict.fromkeys(("gap", "gap_long", "lift", "lift_long", "bn", "link"), (-1, 1)),
         **dict.fromkeys(("interaction", "hc", "sc", "steps"), (-2, 2)), "checks": None}

# Each comparison is condition minus reference per seed, at the page's margin; one group is one family. Tables:
# "main" (run's rows), "gaps" (gap_rows), "long" (the longer budget's rows), "steps" (its per-seed gaps at both
# budgets), "rows" (run's rows with the checks' columns), "audit" (run.audit_buffers' table).
_GAP = dict(value="task_b", by="mode")
_GAPS = dict(value="gap", table="gaps")
_LIFT = (("pinned", REFERENCE_MODE), ("separate", "separate_stats"))
QUESTIONS = {
    "gap": (Question("gap_{shift}_{head}_{optimizer}", "separate_stats", REFERENCE_MODE,
                     each=("shift", "head", "optimizer"), **_GAP),),
    # at chapter 1's shift: gap(adam) - gap(sgd) per head, and each head's gap minus the linear head's
    "interaction": (Question("adam_vs_sgd_{head}", "adam", "sgd", by="optimizer", at=dict(shift="ref"),
                             each=("head",), **_GAPS),),
    "hc": (Question("hc_{condition}_{optimizer}", tuple(h for h in HEADS if h != "linear"), "linear", by="head",
                    at=dict(shift="ref"), each=("optimizer",), **_GAPS),),
    # task B of each input-normalizing head minus the linear head's, with each statistics, at every shift and at
    # the longer budget (the part specific to pinning is the gap's change, family hc)
    "lift": tuple(Question(f"lift_{{shift}}_{m}_{{condition}}_{{optimizer}}", INPUT_NORM_HEADS, "linear",
                           value="task_b", by="head", at=dict(mode=mode), each=("shift", "optimizer"))
                  for m, mode in _LIFT),
    "lift_long": tuple(Question(f"lift_long_{m}_{{condition}}_{{optimizer}}", INPUT_NORM_HEADS, "linear",
                                value="task_b", by="head", at=dict(mode=mode), each=("optimizer",), table="long")
                       for m, mode in _LIFT),
    "sc": (Question("sc_{head}_{optimizer}", "ref", "none", by="shift", each=("head", "optimizer"), **_GAPS),),
    "bn": (Question("bn_{shift}_{optimizer}", "all_eval", REFERENCE_MODE, at=dict(head="mlp_bn"),
                    each=("shift", "optimizer"), **_GAP),),
    # the longer budget: the gap there, and its change from the short budget (long minus short, per seed)
    "gap_long": (Question("gap_long_{head}_{optimizer}", "separate_stats", REFERENCE_MODE, each=("head", "optimizer"),
                          value="task_b", by="mode", table="long"),),
    "steps": (Question("steps_change_{head}_{optimizer}", "long", "short", value="gap", by="budget",
                       each=("head", "optimizer"), table="steps"),),
    # identities of the code: train_mode's task B is separate_stats' (the same statistics see the same stream); the
    # pinned modes keep task A; train_mode's task A does not depend on the head or optimizer
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
    """:data:`QUESTIONS` ``[group]`` asked of ``tables``, worded by :data:`WORDS`, in the tables' order, with a column
    per ``each`` level (and ``by`` for several conditions), ``m``, ``count_kind`` and, for lift, ``statistics``."""
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
    """The per-seed gap of one cell, indexed by seed (``ValueError`` if the cell has no rows)."""
    cell = df[(df["shift"] == shift) & (df["head"] == head) & (df["optimizer"] == optimizer)]
    if not len(cell):
        raise ValueError(f"gap: no rows for cell ({shift}, {head}, {optimizer})")
    return paired_differences(cell, "task_b", "mode", "separate_stats", REFERENCE_MODE)


def gap_rows(df: pd.DataFrame) -> pd.DataFrame:
    """``shift, head, optimizer, seed, gap``: the per-seed gap of every cell of ``df``."""
    cols = ["shift", "head", "optimizer", "seed", "gap"]
    parts = [pd.DataFrame({"shift": s, "head": h, "optimizer": o, "seed": d.index, "gap": d.to_numpy()})
             for s, h, o in dict.fromkeys(zip(df["shift"], df["head"], df["optimizer"]))
             for d in (gap_values(df, s, h, o),)]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def gap_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The gap claims, one family per shift, with ``sd`` (of the per-seed gap) and ``task_b_pinned`` /
    ``task_b_separate`` (the two modes' mean task B)."""
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
    """The page's claims from :func:`run`'s rows: families ``gap``, ``checks`` and, where the rows have what they
    compare, the others; ``hc`` with ``separate`` / ``separate_reference`` (the head's and the linear head's mean
    separate_stats accuracy: a smaller gap can come from a worse separate side). ``ValueError`` without ``ref``."""
    if "ref" not in set(df["shift"]):
        raise ValueError("claims needs chapter 1's shift (rows with shift == 'ref')")
    ref = df[df["shift"] == "ref"]
    first = df.groupby(["mode", "shift", "seed"])["task_a_after"].transform("first")
    tables = dict(main=df, gaps=gap_rows(df), rows=df.assign(task_a_change=df["task_a_after"] - df["task_a_before"],
                                                              task_a_vs_first=df["task_a_after"] - first))
    groups = {"interaction": {"adam", "sgd"} <= set(ref["optimizer"]), "bn": "mlp_bn" in set(df["head"]),
              "checks": True, "hc": "linear" in set(ref["head"]), "sc": "none" in set(df["shift"]),
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
    """The claims with each family's interval ends cut to :data:`CLIPS` (for the page)."""
    out = claims.copy()
    for fam, clip in CLIPS.items():
        hit = out["family"] == fam
        if clip is not None and hit.any():
            out.loc[hit, ["low", "high"]] = out.loc[hit, ["low", "high"]].clip(*clip)
    return out


def summary_table(df: pd.DataFrame, by: list, metrics: list) -> pd.DataFrame:
    """``*by, metric, mean, ci_low, ci_high, n_seeds``: mean and 95% t interval over seeds (for display)."""
    rows = []
    for key, g in df.groupby(by, sort=False):
        for metric in metrics:
            iv = t_interval(g[metric])
            rows.append(dict(zip(by, key), metric=metric, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return pd.DataFrame(rows)


# --- the numbers beside the claims ------------------------------------------------------------------------------

def _named(t: pd.DataFrame, kind: str) -> str:
    """The ``head/optimizer`` cells of claims ``t`` whose printed verdict is of ``kind``, or ``none``."""
    return ", ".join(f"{h}/{o}" for h, o, k in zip(t["head"], t["optimizer"], t["count_kind"]) if k == kind) or "none"


def lr_edges(lrs: dict, grids: dict) -> list[tuple]:
    """``[(key, lr, "top" | "bottom")]``: the chosen rates at an end of their grid (``grids``: ``{optimizer:
    grid}``), in ``lrs``' order; a rate at the top (bottom) might be beaten by a larger (smaller) one."""
    return [(k, v, "top" if v == max(g) else "bottom") for k, v in lrs.items() for g in [grids.get(k[1])]
            if g is not None and len(g) >= 2 and v in (max(g), min(g))]


def lr_choice_findings(lrs: dict, grids: dict, n_lr: bool = True) -> pd.DataFrame:
    """One shift's chosen rates (:func:`chosen_lrs`): ``lrs_<head>_<optimizer>_<mode>``, ``n_lr`` of them (where
    ``n_lr``), ``n_lr_at_edge`` at an end of their grid and ``lr_edge_cells`` naming those."""
    edges = lr_edges(lrs, grids)
    return numbers_table(dict(lrs={"_".join(k): float(v) for k, v in lrs.items()}, n_lr_at_edge=len(edges),
                              lr_edge_cells=", ".join(f"{'/'.join(k)} at the {end} ({v:g})" for k, v, end in edges)
                              or "none", **(dict(n_lr=len(lrs)) if n_lr else {})))


def search_findings(search: pd.DataFrame) -> pd.DataFrame:
    """The search at one shift as a sensitivity check, per ``<head>_<optimizer>``: ``gap_own_rates`` (each mode at
    its best rate), ``gap_mean_rate`` (both at the mode-averaged rule's ``lr_mean_rule``), ``lr_pinned`` /
    ``lr_separate``. Raises ``ValueError`` if either mode is missing or the table covers several shifts."""
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
    """The longer budget's seeds and ``{(head, optimizer): (pinned short, separate short, pinned long, separate
    long)}`` task-B series. Raises ``ValueError`` if ``long`` is empty or a seed lacks a mode."""
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
    """Per ``<head>_<optimizer>``, each mode's gain from the sweep's rows (``short``) to :func:`steps_check`'s
    (``long``): ``separate_gain`` / ``pinned_gain``, t intervals at ``gain_confidence = 1 - alpha / n_cells``
    (Bonferroni over the cells), and ``pinned_long`` (mean pinned task B at the longer budget)."""
    seeds, pairs = _steps_pairs(short, long)
    conf = Family(len(pairs), alpha).confidence
    gains = dict(separate_gain=lambda ps, ss, pl, sl: sl - ss, pinned_gain=lambda ps, ss, pl, sl: pl - ps)
    return numbers_table(dict(
        steps_short=int(short["steps"].iloc[0]), steps_long=int(long["steps"].iloc[0]), n_seeds=len(seeds),
        n_cells=len(pairs), gain_confidence=conf,
        **{k: {"_".join(c): t_interval(f(*v), conf) for c, v in pairs.items()} for k, f in gains.items()},
        pinned_long={"_".join(c): float(v[2].mean()) for c, v in pairs.items()}))


def steps_claims(short: pd.DataFrame, long: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The longer budget's families ``gap_long``, ``steps`` (the gap there minus at the short budget, per seed) and
    ``lift_long`` (for the optimizers that ran the linear head and every input-normalizing head)."""
    _, pairs = _steps_pairs(short, long)
    rows = pd.concat([pd.DataFrame({"head": h, "optimizer": o, "budget": b, "seed": g.index, "gap": g.to_numpy()})
                      for (h, o), (ps, ss, pl, sl) in pairs.items()
                      for b, g in (("short", ss - ps), ("long", sl - pl))], ignore_index=True)
    at_ref = long[long["shift"] == "ref"]
    parts = [_asked(dict(long=at_ref), "gap_long", margin, alpha), _asked(dict(steps=rows), "steps", margin, alpha)]
    norm = set(INPUT_NORM_HEADS) & set(at_ref["head"])
    whole = [o for o, g in at_ref.groupby("optimizer", sort=False) if {"linear", *norm} <= set(g["head"])]
    if norm and whole:
        parts.append(_asked(dict(long=at_ref[at_ref["optimizer"].isin(whole)]), "lift_long", margin, alpha))
    return pd.concat(parts, ignore_index=True)


def _m_conf(t: pd.DataFrame) -> tuple[int, float]:
    return int(len(t)), float(t["confidence"].iloc[0]) if len(t) else math.nan


def long_findings(S: pd.DataFrame, SF: pd.DataFrame) -> pd.DataFrame:
    """The longer budget's counts from :func:`steps_claims` ``S`` and :func:`steps_findings` ``SF``: families
    ``gap_long`` and ``steps`` (``n_narrower`` / ``n_wider``), ``n_<mode>_gains`` (cells whose gain interval lies
    above zero) and the best pinned cell."""
    g, st = S[S["family"] == "gap_long"], S[S["family"] == "steps"]
    c, cs = count_verdicts(g), count_verdicts(st)
    gains = lambda name: int(sum(number(SF, k).low > 0 for k in SF["key"] if k.startswith(name + "_")))  # noqa: E731
    pinned = {f"{h}/{o}": float(number(SF, f"pinned_long_{h}_{o}")) for h, o in zip(g["head"], g["optimizer"])}
    best = max(pinned, key=pinned.get) if pinned else ""
    (m, conf), (steps_m, steps_conf) = _m_conf(g), _m_conf(st)
    return numbers_table(dict(
        m=m, confidence=conf, n_higher=c["higher"], n_lower=c["lower"], steps_m=steps_m, steps_confidence=steps_conf,
        n_narrower=cs["lower"], n_wider=cs["higher"], narrower_cells=_named(st, "lower"),
        wider_cells=_named(st, "higher"), n_pinned_gains=gains("pinned_gain"),
        n_separate_gains=gains("separate_gain"), best_pinned_cell=best,
        best_pinned_acc=float(pinned[best]) if best else math.nan))


def _span(t: pd.DataFrame) -> tuple[float, float]:
    return (float(t["estimate"].min()), float(t["estimate"].max())) if len(t) else (math.nan, math.nan)


#: The heads that normalize each feature (the plain lead's advice for a pinned backbone rests on their ``lift``).
PER_FEATURE_HEADS = ("std_linear", "bn_linear")


def input_norm_findings(C: pd.DataFrame, S: pd.DataFrame | None = None) -> pd.DataFrame:
    """The per-feature normalizing heads (:data:`PER_FEATURE_HEADS`) together, keys ``pf_*`` (empty if none ran): at
    chapter 1's shift their gap cells, family ``hc`` (``n_smaller``), family ``lift`` with the pinned backbone
    (``lift_*``) and with separate statistics (``sep_*``), the pinned lift at the other shifts (``other_*``) and,
    given the longer budget's claims ``S``, ``lift_long`` (``long_*``); counts of verdicts shown, ranges of all."""
    gap = C[(C["family"] == "gap") & (C["shift"] == "ref")]
    pf = [h for h in PER_FEATURE_HEADS if h in set(gap["head"])]
    if not pf:
        return numbers_table({})
    lift = C[(C["family"] == "lift") & C["head"].isin(pf)] if "statistics" in C else C.iloc[:0]
    lift_at = lambda st, ref=True: lift[(lift["statistics"] == st) & ((lift["shift"] == "ref") == ref)]  # noqa: E731
    shown = lambda t: int((t["count_kind"] == "higher").sum())  # noqa: E731
    gp, other, hc = gap[gap["head"].isin(pf)], lift_at("pinned", False), C[(C["family"] == "hc") & C["head"].isin(pf)]
    out = dict(m=len(gp), n_higher=shown(gp), gap_min=float(gp["estimate"].min()), gap_max=float(gp["estimate"].max()),
               gap_high=float(gp["high"].max()), n_smaller=int((hc["count_kind"] == "lower").sum()),
               other_m=len(other), other_higher=shown(other))
    out["other_min"], out["other_max"] = _span(other)
    long = S is not None and (S["family"] == "lift_long").any()
    for name, st in (("lift", "pinned"), ("sep", "separate")):
        t = lift_at(st)
        out[f"n_{name}_higher"], (out[f"{name}_min"], out[f"{name}_max"]) = shown(t), _span(t)
        if long:
            t = S[(S["family"] == "lift_long") & S["head"].isin(pf) & (S["statistics"] == st)]
            out[f"long_n_{name}"], out[f"long_n_{name}_higher"] = len(t), shown(t)
            out[f"long_{name}_min"], out[f"long_{name}_max"] = _span(t)
    return numbers_table({f"pf_{k}": v for k, v in out.items()})


def equivalence_max_sd(margin: float, n: int, family: Family = Family()) -> float:
    """The largest per-seed SD of a zero gap that TOST at ``family.level`` can still call equivalent within
    ``±margin`` with ``n`` seeds (NaN for ``n < 2``)."""
    if n < 2:
        return math.nan
    unit = np.arange(n, dtype=float)
    unit = (unit - unit.mean()) / unit.std(ddof=1)
    return float(margin / t_interval(unit, 1 - 2 * family.level).high)


def findings(df: pd.DataFrame, lrs: dict | None = None, grids: dict | None = None, margin: float = 0.02,
             alpha: float = 0.05, C: pd.DataFrame | None = None) -> pd.DataFrame:
    """The page's numbers from :func:`run`'s rows, its claims ``C``, the chosen rates ``lrs`` and the grids
    ``{optimizer: grid}``: the gap family's size, per-shift counts and SDs beside :func:`equivalence_max_sd`; the
    other families' sizes and counts; finding 3 per optimizer; the best cells; the rates; ``eval_se``."""
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
        n_eval=n_eval, eval_se=se, margin_in_se=margin / se if se > 0 else math.nan)
    rates = lr_choice_findings(lrs or {}, grids or {}, n_lr=False)
    for name in ("interaction", "bn", "hc", "sc"):
        t = C[C["family"] == name]
        m, conf = _m_conf(t)
        if name in ("interaction", "bn"):
            out.update({f"{name}_m": m, f"{name}_confidence": conf})
        elif len(t):
            c = count_verdicts(t)
            out[name] = dict(m=m, confidence=conf, n_larger=c["higher"], n_smaller=c["lower"],
                             larger_cells=_named(t, "higher"), smaller_cells=_named(t, "lower"))
    if "hc" in out:
        hc = C[C["family"] == "hc"]
        worse = [f"{h}/{o}" for h, o, k, s, r in zip(hc["head"], hc["optimizer"], hc["count_kind"], hc["separate"],
                                                     hc["separate_reference"]) if k == "lower" and s < r]
        out["hc"].update(n_smaller_worse_separate=len(worse), smaller_worse_separate_cells=", ".join(worse) or "none")
    return pd.concat([numbers_table(out), rates], ignore_index=True)


def best_pinned_claim(C: pd.DataFrame, F: pd.DataFrame) -> pd.DataFrame:
    """The gap claim of ``F``'s ``best_pinned_cell`` under the key ``best_pinned_gap`` (the page cites it blind)."""
    return C[C["key"] == "gap_ref_" + number(F, "best_pinned_cell").replace("/", "_")].assign(key="best_pinned_gap")


def vocabulary(margin: float) -> dict:
    """The page's verdict words by name (glued as ``ch04_w_<name>``): :data:`WORDS`' directions, the equivalence
    verdict at ``margin``, ``not decided`` and ``too few seeds``."""
    return {**{k: w for d in WORDS.values() for k, w in d.items()}, "equivalent": equivalent_text(margin),
            "not_decided": NOT_DECIDED, "too_few": TOO_FEW}


# --- the page's words: the counts in the book's one shape and the notes the claims choose ---------------------------

def page_numbers(F: pd.DataFrame, **parts: pd.DataFrame) -> pd.DataFrame:
    """``F`` and each of ``parts`` (``{prefix: numbers table}``) with its keys as ``<prefix>_<key>``, the names the
    page glues them under: the numbers the notes (:data:`NOTES`) read."""
    return pd.concat([F] + [t.assign(key=f"{p}_" + t["key"]) for p, t in parts.items()], ignore_index=True)


def page_counts(C: pd.DataFrame, S: pd.DataFrame, margin: float) -> dict:
    """The gap family's counts in the book's one shape (:func:`bnstudy.study.words.counts_text`) at chapter 1's shift
    (``gap_counts_ref``; ``inorm_pf_gap_counts``: the per-feature heads' cells) and at the longer budget
    (``gap_counts_long``), and the gap's change between the budgets (``steps_counts``; ``S``: :func:`steps_claims`)."""
    sides = ("head and optimizer cells", "separate statistics", "the pinned backbone", margin)
    ref = C[(C["family"] == "gap") & (C["shift"] == "ref")]
    return dict(gap_counts_ref=counts_text(ref, *sides),
                inorm_pf_gap_counts=counts_text(ref[ref["head"].isin(PER_FEATURE_HEADS)], *sides),
                gap_counts_long=counts_text(S[S["family"] == "gap_long"], *sides),
                steps_counts=counts_text(S[S["family"] == "steps"], "gaps at the longer budget", "the gap",
                                         "the short budget's", margin))


def _ref_counts(C: pd.DataFrame) -> dict:
    return count_verdicts(C[(C["family"] == "gap") & (C["shift"] == "ref")])


def _v(N: pd.DataFrame) -> dict:
    return {k: number(N, k) for k in N.get("key", ())}


def _fill(C: pd.DataFrame, N: pd.DataFrame) -> dict:
    """A note's fields: ``N``'s numbers by key, the gap counts at chapter 1's shift (``{higher}``...), ``{margin}``."""
    gap = C[C["family"] == "gap"] if "family" in C else C.iloc[:0]
    return {**_v(N), **(_ref_counts(C) if len(gap) else {}),
            "margin": float(gap["margin"].iloc[0]) if "margin" in gap and len(gap) else math.nan}


def _curvature(N: pd.DataFrame) -> str:
    """``nan``, ``none``, ``wider`` (the centred ratio keeps at least half the added curvature) or ``offset``."""
    r, c = number(N, "geo_curvature_ratio"), number(N, "geo_curvature_centered_ratio")
    if math.isnan(r) or math.isnan(c):
        return "nan"
    return "none" if r <= 1 else "wider" if c - 1 >= (r - 1) / 2 else "offset"


def _probe(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """Where the probe's interval (separate minus pinned) lies: ``none``, ``lost`` (above 0), ``gained``, ``zero``."""
    p = number(N, "geo_probe_cost")
    return "none" if math.isnan(p.low) or math.isnan(p.high) else "lost" if p.low > 0 else \
        "gained" if p.high < 0 else "zero"


def _shortfall(C: pd.DataFrame, N: pd.DataFrame) -> bool | str:
    """Whether the linear head's gap with SGD + momentum lies above the probe's interval (``none``: no interval)."""
    t, high = C[C["key"] == "gap_ref_linear_sgd"], number(N, "geo_probe_cost").high
    return "none" if math.isnan(high) else bool(len(t)) and float(t.iloc[0]["low"]) > high


def _gains(N: pd.DataFrame) -> str:
    p, q = (number(N, f"long_n_{m}_gains") > 0 for m in ("pinned", "separate"))
    return "both" if p and q else "pinned" if p else "separate" if q else "neither"


def _lift(N: pd.DataFrame) -> str:
    """Whether normalizing each feature raised task B: ``absent``, ``all`` (both statistics), ``none``, ``some``."""
    v = _v(N)
    if "inorm_pf_m" not in v:
        return "absent"
    k, k2, m = v["inorm_pf_n_lift_higher"], v["inorm_pf_n_sep_higher"], v["inorm_pf_m"]
    return "all" if k == k2 == m > 0 else "none" if k == k2 == 0 else "some"


def _advice(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """``no cost`` (in no cell at either budget), ``left undecided`` (no per-feature head's gap shown), ``cost``."""
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


def _plain(C: pd.DataFrame, N: pd.DataFrame) -> str:
    c = _ref_counts(C)
    h, lo, m = c["higher"], c["lower"], c["m"]
    return "all" if h == m else "mixed" if h and lo else "some" if h else "pin" if lo else "either"


def _lead(C: pd.DataFrame, N: pd.DataFrame) -> str:
    c = _ref_counts(C)
    h, lo, e, m = c["higher"], c["lower"], c["equivalent"], c["m"]
    if h == m:
        return "all"
    if h == 0:
        return "equivalent" if 0 < e == m else "cost" if lo else "open"
    return "depends" if lo or 0 < e < m - h else "none shown" if e == 0 else "some"


#: The page's rule-triggered sentences (:func:`bnstudy.study.words.notes` on the claims and :func:`page_numbers`),
#: glued as ``ch04_<key>``, each key's rules covering every outcome once: ``plain`` (the plain lead of the answer
#: box and the front page) and ``lead`` (the answer's lead), by the gap family's counts at chapter 1's shift; the
#: closed-form ``probe`` and whether the trained linear head falls short of it (``probe_tail``); where the added
#: curvature comes from; whether each mode still ``gains`` at the longer budget; whether normalizing each feature
#: raised task B (``lift_plain``); what to do about the head's input and about the statistics (``advice_*``).
NOTES = (
    *_when("plain", _plain, {
        "all": "**Give the new task its own statistics.** " + _AT + " they beat a pinned backbone with every head "
               "and optimizer tried.",
        "some": "**Prefer the new task's own statistics.** " + _AT + " they beat a pinned backbone " + _HEADS +
                " and lose with none.",
        "mixed": "**It depends on the head.** " + _AT + " separate statistics beat a pinned backbone " + _HEADS +
                 " and lose with {lower}.",
        "pin": "**Pin the backbone.** " + _AT + " separate statistics lose to a pinned backbone with {lower} of the "
               "{m} heads and optimizers tried and win with none.",
        "either": "**Either works on this evidence.** " + _AT + " no head and optimizer tried shows separate "
                  "statistics ahead of a pinned backbone or behind it."}),
    *_when("lead", _lead, {
        "all": "No head or optimizer tried makes up" + _PIN,
        "equivalent": "Every head and optimizer tried makes up" + _PIN + ", within ±{margin:g}",
        "open": _COST + ", and not every one is shown to be without one",
        "cost": _COST,
        "none shown": "No head or optimizer tried is shown to make up" + _PIN,
        "some": "Some heads and optimizers make up" + _PIN + " and others do not",
        "depends": "Whether a head or optimizer makes up" + _PIN + " depends on the cell"}),
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
    """The "why" section's numbers at ``shift`` (means over seeds; ratios pinned over separate) and ``probe_cost``
    (the probe on separate minus pinned features per seed, 95% t interval)."""
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



#: The geometry measures the link test relates to the gap, each predicted to go with a larger gap: the curvature
#: ratio (pinned / separate: the optimization story) and the probe cost (the information story).
LINK_MEASURES = {"curvature_ratio": 1, "probe_cost": 1}


def link_table(df: pd.DataFrame, geom: pd.DataFrame, head: str = "linear", n_boot: int = 2000, alpha: float = 0.05,
               seed: int = 0) -> pd.DataFrame:
    """Family ``link``: Spearman's rho of each :data:`LINK_MEASURES` measure with ``head``'s per-seed gap, per
    optimizer and scope: ``ref`` (a point per seed at chapter 1's shift; Fisher-z interval) and ``all`` (a point per
    seed and shift, not independent within a seed: a percentile bootstrap over whole seeds, no p-value). Raises
    ``ValueError`` if ``geom`` lacks a measure's columns."""
    need = {"seed", "shift", "statistics", "curvature", "probe_accuracy"} - set(geom.columns)
    if need:
        raise ValueError(f"link_table: the geometry table lacks columns {sorted(need)}")
    opts = [o for o in OPTIMIZERS if o in set(df[df["head"] == head]["optimizer"])]
    fam, (hi, lo) = Family(max(2 * len(opts) * len(LINK_MEASURES), 1), alpha), WORDS["link"].values()
    p = geom[geom["statistics"] == "pinned"].set_index(["seed", "shift"])
    q = geom[geom["statistics"] == "separate"].set_index(["seed", "shift"]).reindex(p.index)
    meas = pd.DataFrame({"curvature_ratio": p["curvature"] / q["curvature"],
                         "probe_cost": q["probe_accuracy"] - p["probe_accuracy"]}).reset_index()
    out, extra, gaps = [], [], gap_rows(df[df["head"] == head])
    for o in opts:
        tab = meas.merge(gaps[gaps["optimizer"] == o][["seed", "shift", "gap"]], on=["seed", "shift"]).dropna()
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



def link_findings(table: pd.DataFrame) -> pd.DataFrame:
    """The link test's ``m``, ``confidence`` and counts of directions with / against the predicted sign
    (``n_predicted`` / ``n_opposite``) and of tests, also per scope."""
    pred = ((table["kind"] == "higher") & (table["predicted_sign"] > 0)) | \
        ((table["kind"] == "lower") & (table["predicted_sign"] < 0))
    tested, direction = table["kind"] != TOO_FEW, table["kind"].isin(["higher", "lower"])
    m, conf = _m_conf(table)
    return numbers_table(dict(
        m=m, confidence=conf, n_predicted=int(pred.sum()), n_opposite=int((direction & ~pred).sum()),
        n_tests=int(tested.sum()), **{f"n_{k}_{s}": int((v & (table["scope"] == s)).sum()) for s in ("ref", "all")
                                      for k, v in (("predicted", pred), ("tests", tested))}))

def link_texts(table: pd.DataFrame) -> dict:
    """``{<scope>_<optimizer>_<measure>: text}`` to follow "$\\rho$": ``= +0.12 (-0.30 to +0.50)``, ``= -0.83, no
    interval`` or ``not computed (2 seeds, one point each)``."""
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
    """:func:`run.audit_buffers`' table as the exact check ``audit_matches`` (family ``checks``): ``moved ==
    declared`` on every row."""
    audit = table.assign(mismatch=(table["moved"] != table["declared"]).astype(float))
    return _asked(dict(audit=audit), "audit", None, family="checks")


def cost_findings(counts: dict) -> pd.DataFrame:
    """``n_computed`` / ``n_cached`` of ``n_units`` and ``cache_state`` (``cold``, ``warm``, ``partly warm``) from
    ``{namespace: (computed, total)}``; ``ValueError`` if a namespace claims more computed units than it has."""
    bad = [k for k, (c, t) in counts.items() if not 0 <= c <= t]
    if bad:
        raise ValueError(f"cost_findings: counts must satisfy 0 <= computed <= total, not for {bad}")
    n_c, n_t = int(sum(c for c, _ in counts.values())), int(sum(t for _, t in counts.values()))
    state = "cold" if n_t and n_c == n_t else ("warm" if n_c == 0 else "partly warm")
    return numbers_table(dict(n_computed=n_c, n_units=n_t, n_cached=n_t - n_c, cache_state=state))
