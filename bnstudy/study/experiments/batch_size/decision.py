"""Chapter 5's batch-size-2 decision (issue 34): which way of treating BatchNorm to fine-tune with at a batch of two,
each strategy at its own tuned learning rate, under two budgets. One answer, glued by every page that gives advice
about small batches. Input: :func:`.run.decision_tables`' ``(check, reported)``; every difference is paired within
seed, every family Bonferroni at :data:`ALPHA`, TOST within ``margin`` (the chapter's ``break_margin``, fixed before
these runs): arms minus ``bn_train`` and best minus runner-up at the smallest batch size (family ``decision``),
smallest minus largest batch size at tuned rates (``tuned_break``), and grid edges named with their cells.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...inference import NOT_DECIDED, Family, claims_table, decide, one_sided_p, t_interval
from .run import BUDGETS, DECISION_CELL, PRECISE_AFTER, STRATEGY_LABELS, best_factors

#: Direction words of the decision's claims.
WORDS = {"decision": ("above BN in train mode", "below BN in train mode"),
         "best": ("best above the runner-up", "best below the runner-up"),
         "tuned_break": ("higher at the smaller batch", "lower at the smaller batch"),
         "did": ("BN in train mode higher beyond the control", "BN in train mode lower beyond the control"),
         "gain": ("precise BN higher", "precise BN lower")}
#: The per-sample-norm control of the chapter's difference-in-differences (no batch statistics).
CONTROL = "group_pretrained"
#: The level of every family of claims and of the counts (Bonferroni: the printed verdicts).
ALPHA = 0.05
#: A cell a one-sided t test (Bonferroni over the cells) does not place above chance + this is "near chance":
#: rankings there are meaningless.
NEAR_CHANCE = 0.06
#: The order ties are named in.
DECISION_ORDER = ("bn_train", PRECISE_AFTER, "stats_frozen", "adabn", "bn_frozen", "to_group", "to_layer",
                  "group_pretrained", "layer_pretrained")
#: What the reader runs for each strategy (the guide's recipe column).
CODE = {"bn_train": "`model.train()` (BatchNorm uses and updates batch statistics)",
        "stats_frozen": "`bnstudy.pin_norm_eval(backbone)` (statistics fixed, affine trained)",
        "adabn": "`bnstudy.update_bn_stats(backbone, target_loader)`, then `bnstudy.pin_norm_eval(backbone)`",
        "bn_frozen": "`bnstudy.freeze_batchnorm(backbone)` (FrozenBatchNorm: statistics and affine fixed)",
        PRECISE_AFTER: "`model.train()`, then `bnstudy.update_bn_stats(backbone, target_loader)` before evaluating",
        "to_group": "`bnstudy.replace_norm(backbone, \"group\")`, then fine-tune",
        "to_layer": "`bnstudy.replace_norm(backbone, \"layer\")`, then fine-tune",
        "group_pretrained": "a network pretrained with GroupNorm",
        "layer_pretrained": "a network pretrained with LayerNorm"}


def _pivot(d: pd.DataFrame) -> pd.DataFrame:
    """Seeds x arms of ``score``; a repeated (seed, arm) raises ``ValueError``."""
    dup = d.duplicated(["seed", "arm"])
    if dup.any():
        raise ValueError(f"decision: repeated (seed, arm) rows, e.g. {d.loc[dup, ['seed', 'arm']].iloc[0].to_dict()}")
    return d.pivot(index="seed", columns="arm", values="score")


def _claims(name: str, items: dict, words: str, margin: float | None = None) -> pd.DataFrame:
    """One family ``name`` on ``{key: per-seed differences}``, worded by ``WORDS[words]`` (``"best"``'s for the
    ``decision_best_*`` keys), TOST within ``margin`` where given."""
    fam = Family(max(len(items), 1), ALPHA)
    return claims_table([decide(v, k, margin=margin, family=fam, higher=w[0], lower=w[1]) for k, v in items.items()
                         for w in [WORDS["best" if k.startswith("decision_best_") else words]]], family=name)


def cell_table(dec: pd.DataFrame, check: pd.DataFrame, chance: float) -> pd.DataFrame:
    """One row per decision cell: the chosen ``lr_factor`` and ``lr``, the grid tried (``grid_low``, ``grid_high``,
    ``n_factors``), ``at_edge``, the reported seeds' ``mean``, 95% ``ci_low`` / ``ci_high`` and ``n`` of ``score``,
    ``retention``, ``diverged_runs`` and ``near_chance``."""
    best = best_factors(check).rename(columns={"score": "tuning_score"})
    n_factors = check.groupby(DECISION_CELL)["lr_factor"].nunique().rename("n_factors")
    recs = []
    for key, g in dec.groupby(DECISION_CELL, sort=True):
        iv = t_interval(g["score"])
        recs.append(dict(zip(DECISION_CELL, key), lr=float(g["lr"].iloc[0]),
                         retention=float(g["task_a_after"].mean()) if "task_a_after" in g else float("nan"),
                         mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n=iv.n, diverged_runs=int(g["diverged"].sum()),
                         p_chance=one_sided_p(g["score"], "greater", null=chance + NEAR_CHANCE)))
    out = pd.DataFrame(recs).merge(best, on=DECISION_CELL, how="left").merge(n_factors.reset_index(), on=DECISION_CELL)
    out["near_chance"] = ~(np.minimum(1.0, out["p_chance"] * len(out)) < ALPHA)
    return out


def decision(dec: pd.DataFrame, check: pd.DataFrame, margin: float) -> dict:
    """The decision: ``dict(cells, claims, answers, breaks, small, large, margin)``.

    ``cells``: :func:`cell_table`. ``claims``: ``decision_<budget>_<target>_<arm>`` (arm minus ``bn_train`` at the
    smallest batch size), ``decision_best_<budget>_<target>`` (best minus runner-up), ``tuned_break_<budget>_<target>
    _<arm>`` (smallest minus largest batch size) and, with ``bn_train`` and :data:`CONTROL` run, ``tuned_did`` (its
    change minus the control's) and ``precise_gain`` (precise BN after minus ``bn_train`` at the largest batch size).
    ``answers``: per (budget, target) the best arm and the runner-up, their verdicts and whether the cell is near
    chance. ``breaks``: ``{(budget, target, arm): outcome}`` (:data:`BREAK_OUTCOMES`). Raises ``ValueError``
    without ``bn_train`` among the arms or with an unknown budget."""
    if "bn_train" not in set(dec.arm):
        raise ValueError("decision: the reported runs have no bn_train arm (the reference of every comparison)")
    unknown = set(dec.budget) - set(BUDGETS)
    if unknown:
        raise ValueError(f"decision: budget must be one of {list(BUDGETS)}, got {sorted(unknown)}")
    cells = cell_table(dec, check, 1 / int(dec.n_classes.iloc[0]))
    small, large = int(dec.batch_size.min()), int(dec.batch_size.max())
    vs, best_items, answers = {}, {}, {}
    for (bu, t), g in dec[dec.batch_size == small].groupby(["budget", "target_name"], sort=True):
        piv = _pivot(g)
        order = piv.mean().sort_values(ascending=False).index
        vs.update({f"decision_{bu}_{t}_{a}": piv[a] - piv["bn_train"] for a in piv.columns if a != "bn_train"})
        best_items[f"decision_best_{bu}_{t}"] = piv[order[0]] - piv[order[1]]
        answers[(bu, t)] = dict(best=order[0], runner_up=order[1])
    drops, did, gain = {}, {}, {}
    for (bu, t), g in (dec.groupby(["budget", "target_name"], sort=True) if large != small else ()):
        s, lg = _pivot(g[g.batch_size == small]), _pivot(g[g.batch_size == large])
        for a in s.columns.intersection(lg.columns):
            drops[f"tuned_break_{bu}_{t}_{a}"] = (s[a] - lg[a]).dropna()
        if {"bn_train", CONTROL} <= set(dec.arm):
            did[f"tuned_did_{bu}_{t}"] = ((s["bn_train"] - lg["bn_train"]) - (s[CONTROL] - lg[CONTROL])).dropna()
            if PRECISE_AFTER in lg:
                gain[f"precise_gain_{bu}_{t}"] = (lg[PRECISE_AFTER] - lg["bn_train"]).dropna()
    claims = pd.concat([_claims("decision", {**vs, **best_items}, "decision", margin),
                        _claims("tuned_break", drops, "tuned_break", margin)]
                       + ([_claims("tuned_did", did, "did")] if did else [])
                       + ([_claims("precise_gain", gain, "gain", margin)] if gain else []), ignore_index=True)
    verdict, kind = dict(zip(claims.key, claims.verdict)), dict(zip(claims.key, claims.kind))
    by_cell = cells.set_index(DECISION_CELL)
    for (bu, t), a in answers.items():
        row, vs_bn = by_cell.loc[(bu, small, t, a["best"])], f"decision_{bu}_{t}_{a['best']}"
        self_ = a["best"] == "bn_train"
        a.update(mean=row["mean"], ci_low=row["ci_low"], ci_high=row["ci_high"], near_chance=bool(row["near_chance"]),
                 vs_runner_up=verdict[f"decision_best_{bu}_{t}"], vs_runner_up_kind=kind[f"decision_best_{bu}_{t}"],
                 vs_bn_train="is BN in train mode" if self_ else verdict[vs_bn],
                 vs_bn_train_kind="self" if self_ else kind[vs_bn])
    breaks = {}
    for c in claims[claims.family == "tuned_break"].itertuples():
        bu, t, a = c.key[len("tuned_break_"):].split("_", 2)
        breaks[(bu, t, a)] = "reference near chance" if by_cell["near_chance"].get((bu, large, t, a), False) else \
            "breaks" if c.high < -margin else "no break" if c.low > -margin else NOT_DECIDED
    return dict(cells=cells, claims=claims, answers=answers, breaks=breaks, small=small, large=large,
                margin=float(margin))


def edge_cells(d: dict) -> pd.DataFrame:
    """The cells whose chosen rate is still at an end of its grid after the extensions."""
    c = d["cells"]
    return c[c.at_edge][DECISION_CELL + ["lr_factor", "grid_low", "grid_high"]].reset_index(drop=True)


def label(arm: str) -> str:
    """The readable name of a decision arm."""
    return STRATEGY_LABELS.get(arm, arm)


def leading(a: dict) -> list[str]:
    """The arms a cell's answer ``a`` cannot tell apart at its top: the best, and the runner-up unless the best is
    shown above it."""
    return [a["best"]] if a["vs_runner_up_kind"] == "higher" else [a["best"], a["runner_up"]]


def _names(arms) -> str:
    """Readable names joined with "or"; BatchNorm in train mode with and without precise BN after, as one."""
    if set(arms) == {"bn_train", PRECISE_AFTER}:
        return "BN in train mode, then precise BN (not shown to differ from train mode alone here)"
    return " or ".join(label(x) for x in arms)


def edge_ends(d: dict, budget: str, target: str, arms) -> set[str]:
    """The grid ends (``"top"``, ``"bottom"``) the chosen rates of ``arms`` sit at, at the smallest batch size of
    ``budget`` and ``target`` (issue 35: a comparison with an edge rate is no headline)."""
    cells, out = d["cells"].set_index(DECISION_CELL), set()
    for key in ((budget, d["small"], target, a) for a in arms):
        if key in cells.index and bool((r := cells.loc[key])["at_edge"]):
            out.add("top" if r["lr_factor"] >= r["grid_high"] else "bottom" if r["lr_factor"] <= r["grid_low"]
                    else "end")
    return out


def _at(ends: set) -> str:
    """``"the top"`` / ``"the bottom"`` of a grid, ``"an end"`` where the ends differ."""
    return f"the {next(iter(ends))}" if len(ends) == 1 and ends != {"end"} else "an end"


def words(d: dict) -> dict[str, str]:
    """The one answer, in the sentences every page glues: ``use`` (the samples budget's strategy, one line),
    ``answer`` (both budgets and targets with verdicts: the headline), ``answer_full`` (the same with every result,
    for the body), ``short`` (a phrase for the guide's table and chapter 2), ``code``, ``rate``, ``edges`` and
    ``depends`` / ``depends_full`` (whether the answer depends on the target or the budget).

    Issue 35: where the best or the runner-up of a budget and target has its chosen rate at an edge of its grid
    (:func:`edge_ends`), ``answer`` states no result for it but that it may change with a wider grid;
    ``answer_full`` states it, marked; ``depends`` says nothing of a budget with any cell at an edge."""
    sb, ans = d["small"], d["answers"]
    out, per_budget, per_budget_full = {}, [], []
    for bu in BUDGETS:
        parts, full, edged = [], [], []
        for t, a in sorted((t, a) for (b, t), a in ans.items() if b == bu):
            iv = f"{a['mean']:.3f} (95% interval {a['ci_low']:.3f} to {a['ci_high']:.3f})"
            if a["near_chance"]:
                text = f"on the {t} target no strategy is shown above chance ({label(a['best'])} is highest, {iv})"
            else:
                text = (f"on the {t} target **{label(a['best'])}**, {iv}, against the runner-up "
                        f"({label(a['runner_up'])}): **{a['vs_runner_up']}**")
                if a["vs_bn_train_kind"] != "self" and a["runner_up"] != "bn_train":
                    text += f", against BN in train mode: **{a['vs_bn_train']}**"
            if ends := edge_ends(d, bu, t, [a["best"], a["runner_up"]]):
                edged.append((t, ends))
                full.append(f"{text}, with a leading strategy's chosen rate at {_at(ends)} of its grid (the result "
                            "may change with a wider grid)")
            else:
                parts.append(text)
                full.append(text)
        budget = "With a fixed number of " + ("samples" if bu == "samples" else "optimizer steps")
        if full:
            per_budget_full.append(f"{budget}: " + "; ".join(full) + ".")
        if edged:
            where = " and ".join(t for t, _ in edged) + (" targets" if len(edged) > 1 else " target")
            edge = (f"on the {where} a leading strategy's chosen rate sits at {_at(set().union(*(e for _, e in edged)))}"
                    " of its tuning grid, so the result may change with a wider grid and is given in the chapter, not "
                    "here")
            per_budget.append(f"{budget}: " + "; ".join(parts) + f"; {edge}." if parts else f"{budget}, {edge}.")
        elif parts:
            per_budget.append(f"{budget}: " + "; ".join(parts) + ".")
    lead = f"At batch size {sb}, each strategy at its own tuned learning rate. "
    out["answer"], out["answer_full"] = lead + " ".join(per_budget), lead + " ".join(per_budget_full)
    live = {k: a for k, a in ans.items() if not a["near_chance"]}
    samples = {t: a for (bu, t), a in live.items() if bu == "samples"}
    common = sorted(set.intersection(*(set(leading(a)) for a in samples.values())), key=DECISION_ORDER.index) \
        if samples else []
    cells = d["cells"].set_index(DECISION_CELL)
    if common:
        train_precise = set(common) == {"bn_train", PRECISE_AFTER}
        out["short"] = ("BN in train mode at its own tuned learning rate, then precise BN (not shown to differ from "
                        "train mode alone here)") if train_precise else \
            f"{_names(common)}, at its own tuned learning rate" + (
                " (the two are not told apart here)" if len(common) > 1 else "")
        out["code"] = "; or ".join(CODE.get(x, label(x)) for x in common)
        # the rate of each strategy the words recommend (issue 35: the rate printed is the named strategy's own)
        named = [PRECISE_AFTER] if train_precise else common
        out["rate"] = " and ".join(
            (f"{label(x)}: " if len(named) > 1 else "")
            + f"{cells.loc[('samples', sb, t, x), 'lr']:.3g} on the {t} target "
            f"({cells.loc[('samples', sb, t, x), 'lr_factor']:g} times the linear-scaling rate)"
            for x in named for t in sorted(samples))
    elif samples:
        out["short"] = "; ".join(f"{_names(leading(a))} on the {t} target" for t, a in sorted(samples.items())) \
            + ", each at its own tuned learning rate"
        out["code"] = "; ".join(f"{t} target: {CODE.get(a['best'], label(a['best']))}" for t, a in sorted(samples.items()))
        out["rate"] = "see the table"
    else:
        out["short"], out["code"], out["rate"] = ("no strategy shown above chance plus the near-chance margin",
                                                  "no recommendation", "none")
    use_ends = set().union(set(), *(edge_ends(d, "samples", t, common) for t in samples)) if common else set()
    scope = "On this chapter's three-block network and synthetic ten-class task, "
    out["use"] = (f"{scope}to fine-tune the whole network at batch size {sb} with a fixed number of labelled samples, "
                  f"use {out['short']}; its tuned rate here was {out['rate']}"
                  + (f" (at {_at(use_ends)} of its grid: the result may change with a wider grid)" if use_ends else "")
                  + ".") if samples else (
        f"{scope}at batch size {sb} with a fixed number of labelled samples no strategy is shown above chance plus "
        f"the near-chance margin: nothing is recommended.")
    steps_cells = d["cells"][(d["cells"].budget == "steps") & (d["cells"].batch_size == sb)]
    steps_edge = bool(steps_cells.at_edge.any())
    steps_live = [a for k, a in live.items() if k[0] == "steps"]
    if samples and common:
        steps = (f"With a fixed number of optimizer steps a batch of {sb} sees few images: "
                 f"{int(steps_cells.near_chance.sum())} of {len(steps_cells)} strategy and target cells there are "
                 f"near chance (not shown above chance plus {NEAR_CHANCE:.2f}), and "
                 + ("no strategy is shown above chance there" if not steps_live
                    else "where a strategy is shown above chance there, a fixed-samples leader is also among the "
                    "leaders, not separated from the best" if all(set(common) & set(leading(a)) for a in steps_live)
                    else "on some target there no fixed-samples leader is among the leaders"))
        same = "The answer is the same on both targets with a fixed number of samples."
        out["depends_full"] = f"{same} {steps}" + (
            " (some chosen rates there sit at an end of their grid: this may change with a wider grid)."
            if steps_edge else ".")
        out["depends"] = same if steps_edge else out["depends_full"]
    elif not live:
        out["depends_full"] = out["depends"] = ("No budget and target has a strategy shown above chance, so there "
                                                "is no answer to compare across them.")
    else:
        def by(edge_free: bool) -> list[str]:
            return [f"{_names(leading(a))} ({bu} budget, {t} target" + (
                f"; chosen rates at {_at(e)} of their grid" if (e := edge_ends(d, bu, t, [a["best"], a["runner_up"]]))
                else "") + ")" for (bu, t), a in sorted(live.items())
                if not (edge_free and edge_ends(d, bu, t, [a["best"], a["runner_up"]]))]
        out["depends_full"] = "The answer depends on the budget or the target: " + "; ".join(by(False)) + "."
        head = by(True)
        out["depends"] = ("The answer depends on the budget or the target: " + "; ".join(head) + "." if head else
                          "Every budget and target's leaders have a chosen rate at an end of their grid: see the chapter.")
    e = edge_cells(d)
    if len(e):
        items = "; ".join(f"{label(r.arm)}, {r.budget} budget, batch {r.batch_size}, {r.target_name} target "
                          f"(factor {r.lr_factor:g}, grid {r.grid_low:g} to {r.grid_high:g})" for r in e.itertuples())
        rec_edge = any(r.batch_size == sb and (r.budget, r.target_name) in ans
                       and r.arm in (ans[(r.budget, r.target_name)]["best"], ans[(r.budget, r.target_name)]["runner_up"])
                       for r in e.itertuples())
        out["edges"] = (f"{len(e)} chosen rates are still at an end of their grid after the extensions: {items}. "
                        "At such a cell the tuning curve was still rising at the edge, so a wider grid would be "
                        "expected to raise its accuracy" +
                        (", including a leading strategy's own cell: there a wider grid may also change which strategy "
                         "leads, so the answer at the top of the page states no result for it (the full answer above "
                         "marks it)." if rec_edge else
                         f"; none of them is a leading strategy's cell at batch size {sb}, so no recommendation rests "
                         "on an edge rate."))
    else:
        out["edges"] = "Every chosen rate lies inside its grid."
    return out


#: The outcomes of a pair at tuned rates (:func:`decision`'s ``breaks``) and the slug :func:`numbers` counts them by.
BREAK_OUTCOMES = {"breaks": "breaks", "no break": "no_break", NOT_DECIDED: "not_decided",
                  "reference near chance": "near_chance"}


def numbers(d: dict) -> dict:
    """The decision's numbers (``decision_*`` keys): the smallest and largest decision batch sizes; per budget and
    target the source-task retention of the strategies the page compares at the smallest one; per budget the pairs
    at tuned rates (``decision_n_pairs_<budget>``) and how many have each outcome of :data:`BREAK_OUTCOMES`."""
    cells = d["cells"].set_index(DECISION_CELL)
    out = {f"decision_retention_{bu}_{t}_{arm}": float(cells.loc[(bu, d["small"], t, arm), "retention"])
           for (bu, t) in d["answers"] for arm in ("bn_train", PRECISE_AFTER, "stats_frozen", "adabn", "bn_frozen",
                                                   CONTROL) if (bu, d["small"], t, arm) in cells.index}
    for bu in BUDGETS:
        got = [v for k, v in d["breaks"].items() if k[0] == bu]
        out[f"decision_n_pairs_{bu}"] = len(got)
        out.update({f"decision_n_{slug}_{bu}": sum(v == w for v in got) for w, slug in BREAK_OUTCOMES.items()})
    return dict(out, decision_small=int(d["small"]), decision_large=int(d["large"]))


def display(d: dict) -> pd.DataFrame:
    """The page's decision table: per budget and target at the smallest batch size, each strategy's tuned rate,
    accuracy with its 95% interval and difference and verdict against BatchNorm in train mode."""
    c = d["cells"]
    claims = d["claims"].set_index("key")
    rows = []
    for r in c[c.batch_size == d["small"]].sort_values(["budget", "target_name", "mean"],
                                                        ascending=[True, True, False]).itertuples():
        k = f"decision_{r.budget}_{r.target_name}_{r.arm}"
        x = claims.loc[k] if k in claims.index else None
        rows.append({"budget": "fixed samples" if r.budget == "samples" else "fixed steps", "target": r.target_name,
                     "strategy": label(r.arm), "tuned rate": f"{r.lr:.3g}" + (" (edge)" if r.at_edge else ""),
                     "accuracy (95% interval)": f"{r.mean:.3f} ({r.ci_low:.3f} to {r.ci_high:.3f})"
                     + (" near chance" if r.near_chance else ""),
                     "minus BN in train mode": "" if r.arm == "bn_train" or x is None else
                     f"{x.estimate:+.3f} ({x.low:+.3f} to {x.high:+.3f})",
                     "vs BN in train mode": "reference" if r.arm == "bn_train" else "" if x is None else x.verdict})
    return pd.DataFrame(rows)
