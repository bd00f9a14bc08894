"""Chapter 4, what is drawn: the figures and the page's display tables, from :mod:`.run`'s tables and
:mod:`.findings`' claims; colours from :mod:`bnstudy.study.style`."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ... import style
from ...inference import Interval, number
from ...plots import MODE_ORDER, MODE_PALETTE, min_text_size
from .findings import CLIPS

OPTIMIZER_PALETTE = style.palette("optimizer", ("sgd", "sgd_plain", "adam"))
OPTIMIZER_LABELS = {"sgd": "SGD + momentum 0.9", "sgd_plain": "plain SGD", "adam": "Adam"}
#: The column width with a margin for the tight bounding box, and the book's minimum text size.
_CH4_WIDTH, _CH4_MIN_PT = style.COLUMN_WIDTH_IN - 0.3, style.MIN_FONT_PT


def _dodge(n: int, width: float = 0.6) -> np.ndarray:
    return (np.arange(n) - (n - 1) / 2) * (width / max(n, 1))


def _legend_below(fig, handles, labels, bottom: float, ncol: int, layout: dict | None = None, **legend):
    """Lays ``fig`` out above ``bottom`` (a fraction of its height), puts the legend under the panels and raises any
    smaller text to the book's minimum."""
    fig.tight_layout(rect=(0, bottom, 1, 1), **(layout or {}))
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=_CH4_MIN_PT, frameon=False,
               bbox_to_anchor=(0.5, 0.0), **legend)
    return min_text_size(fig, _CH4_MIN_PT)


def gap_figure(gaps: pd.DataFrame, shift_labels: dict, margin: float):
    """The gap claims (``findings.gap_table``) per head (x) and optimizer (colour), a row per shift, intervals cut to
    [-1, 1], the band ``±margin`` and the legend below. 4 in wide (its 9 pt text still about 11 px tall on a phone
    360 px wide), 0.6 in per head beyond that so that level names never overlap."""
    shifts = [s for s in shift_labels if s in set(gaps["shift"])]
    heads = list(dict.fromkeys(gaps["head"]))
    opts = [o for o in OPTIMIZER_PALETTE if o in set(gaps["optimizer"])]
    row_in, legend_in = 1.55, 0.55
    height = row_in * len(shifts) + legend_in
    fig, axes = plt.subplots(len(shifts), 1, figsize=(max(4.0, 0.6 * len(heads)), height), sharex=True, sharey=True,
                             squeeze=False)
    off = _dodge(len(opts))
    ends = [margin, -margin]
    for ax, s in zip(axes[:, 0], shifts):
        ax.axhspan(-margin, margin, color="grey", alpha=0.15, lw=0, label=f"±{margin:g} (equivalence margin)")
        ax.axhline(0, color="black", lw=0.8)
        for k, o in enumerate(opts):
            g = gaps[(gaps["shift"] == s) & (gaps["optimizer"] == o)].set_index("head").reindex(heads)
            est = g["estimate"].clip(-1, 1)
            lo, hi = g["low"].clip(-1, 1).fillna(est), g["high"].clip(-1, 1).fillna(est)  # no interval: a point
            ends += [float(v) for v in pd.concat([lo, hi]).dropna()]
            ax.errorbar(np.arange(len(heads)) + off[k], est, yerr=[est - lo, hi - est], fmt="o", capsize=2.5,
                        color=OPTIMIZER_PALETTE[o], label=OPTIMIZER_LABELS[o], ms=4)
        ax.set_title(shift_labels[s], pad=3)
    # a name longer than six letters, or any with more than five heads, breaks after its underscore (std_ / linear)
    axes[-1][0].set_xticks(range(len(heads)), [h.replace("_", "_\n", 1) if len(h) > 6 or len(heads) > 5 else h
                                               for h in heads])
    lo, hi = min(ends), max(ends)
    pad = 0.06 * (hi - lo)
    axes[0][0].set_ylim(max(lo - pad, -1.02), min(hi + pad, 1.02))
    fig.supylabel("task-B accuracy difference\n(separate_stats - backbone_eval)", fontsize=_CH4_MIN_PT)
    return _legend_below(fig, *axes[0][0].get_legend_handles_labels(), legend_in / height, 2, dict(h_pad=0.6),
                         handlelength=1.2, columnspacing=0.8)


def head_accuracy_figure(acc: pd.DataFrame, shift_labels: dict):
    """Task B per head (x) and freeze mode (colour), rows = shifts, columns = optimizers, 95% intervals over seeds
    (``findings.summary_table``'s). Not ``train_mode``: its task B is ``separate_stats``' in every run."""
    a = acc[acc["metric"] == "task_b"]
    shifts = [s for s in shift_labels if s in set(a["shift"])]
    opts = [o for o in OPTIMIZER_PALETTE if o in set(a["optimizer"])]
    heads = list(dict.fromkeys(a["head"]))
    modes = [m for m in MODE_ORDER if m in set(a["mode"]) and m != "train_mode"]
    fig, axes = plt.subplots(len(shifts), len(opts), figsize=(_CH4_WIDTH, 2.3 * len(shifts) + 0.9),
                             sharey=True, sharex=True, squeeze=False)
    off = _dodge(len(modes), 0.6)
    for i, s in enumerate(shifts):
        for j, o in enumerate(opts):
            ax = axes[i][j]
            for k, m in enumerate(modes):
                g = a[(a["shift"] == s) & (a["optimizer"] == o) & (a["mode"] == m)].set_index("head").reindex(heads)
                label = m + (" (= train_mode)" if m == "separate_stats" else "")
                ax.errorbar(np.arange(len(heads)) + off[k], g["mean"], yerr=[g["mean"] - g["ci_low"],
                            g["ci_high"] - g["mean"]], fmt="o", ms=4, capsize=2, color=MODE_PALETTE[m], label=label)
            ax.set_xticks(range(len(heads)), heads, rotation=90, ha="center")
            if i == 0:
                ax.set_title(OPTIMIZER_LABELS[o])
            if j == 0:
                ax.set_ylabel(f"task-B accuracy\n{shift_labels[s]}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    return _legend_below(fig, handles, labels, 0.45 / (2.3 * len(shifts) + 0.9), len(labels))


#: Line and marker per mode, so that equal modes (``all_eval`` = ``backbone_eval`` without a BatchNorm head) stay
#: visible.
CH4_MODE_STYLE = {"backbone_eval": dict(ls="-", marker="o", ms=5), "all_eval": dict(ls=":", marker="s", ms=3),
                  "separate_stats": dict(ls="--", marker="^", ms=4.5)}


def lr_search_figure(search: pd.DataFrame, chosen: dict):
    """Validation accuracy (``run.search_table``) against the learning rate, a panel per head (rows) and optimizer,
    a line per mode with its ``chosen`` rate ringed (a ``{(head, optimizer): lr}`` rate on the dashed mean)."""
    opts = [o for o in OPTIMIZER_PALETTE if o in set(search["optimizer"])]
    heads = list(dict.fromkeys(search["head"]))
    fig, axes = plt.subplots(len(heads), len(opts), figsize=(_CH4_WIDTH, 1.9 * len(heads) + 1.0),
                             sharey=True, squeeze=False)
    for i, h in enumerate(heads):
        for j, o in enumerate(opts):
            ax = axes[i][j]
            g = search[(search["optimizer"] == o) & (search["head"] == h)]
            for m in ("backbone_eval", "all_eval", "separate_stats", "mean"):
                c = g[g["mode"] == m].sort_values("lr")
                if not len(c):
                    continue
                style = dict(color="0.5", ls="--", marker="", lw=1) if m == "mean" else \
                    dict(color=MODE_PALETTE[m], lw=1.2, **CH4_MODE_STYLE.get(m, dict(ls="-", marker="o", ms=3.5)))
                label = "mean over modes" if m == "mean" else m + (" (= train_mode)" if m == "separate_stats" else "")
                ax.plot(c["lr"], c["val_accuracy"], label=label, **style)
                sel = c[c["lr"] == chosen.get((h, o, m), chosen.get((h, o)) if m == "mean" else None)]
                ax.plot(sel["lr"], sel["val_accuracy"], "o", ms=10, mfc="none", color=style["color"])
            ax.set_xscale("log")
            ax.minorticks_off()
            if i == 0:
                ax.set_title(OPTIMIZER_LABELS[o])
            if i == len(heads) - 1:
                ax.set_xlabel("learning rate")
            if j == 0:
                ax.set_ylabel(f"{h}\nvalidation task B")
    handles = {}
    for ax in axes.flat:
        for hd, lb in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lb, hd)
    return _legend_below(fig, handles.values(), handles.keys(), 0.55 / (1.9 * len(heads) + 1.0), 2)


# --- display tables -----------------------------------------------------------------------------------------

def _value_text(r, clip: tuple) -> str:
    """``+0.123 [+0.050, +0.200]`` of one claim, ends cut to ``clip`` (no interval: ``[no interval]``)."""
    iv = Interval(r.estimate, r.low, r.high, int(r.n), r.confidence).clipped(*clip)
    return f"{r.estimate:+.3f} " + ("[no interval]" if math.isnan(iv.low) else f"[{iv.low:+.3f}, {iv.high:+.3f}]")


def _cell_text(r, clip: tuple = (-1, 1)) -> str:
    return f"{_value_text(r, clip)} {r.verdict}"


def contrast_display(table: pd.DataFrame, clip: tuple = (-2, 2)) -> pd.DataFrame:
    """A contrast family (``hc``, ``sc``): heads in rows, optimizers in columns, ``estimate [low, high] verdict``."""
    t = table.assign(cell=[_cell_text(r, clip) for r in table.itertuples(index=False)])
    return t.pivot(index="head", columns="optimizer", values="cell").reindex(
        index=list(dict.fromkeys(table["head"])), columns=list(dict.fromkeys(table["optimizer"])))


def gap_display(gaps: pd.DataFrame, heads, optimizers, shift: str = "ref") -> pd.DataFrame:
    """The gap claims at ``shift``, heads in rows, optimizers in columns, each with its modes' mean task B."""
    cell = {(r.head, r.optimizer): f"{_cell_text(r)} (pinned {r.task_b_pinned:.3f} / separate {r.task_b_separate:.3f})"
            for r in gaps[gaps["shift"] == shift].itertuples(index=False)}
    return pd.DataFrame.from_dict({h: {o: cell.get((h, o), "") for o in optimizers} for h in heads}, orient="index")


def interaction_display(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({r.head: {"Adam - SGD + momentum (gap difference)": _value_text(r, CLIPS["interaction"]),
                                  "verdict": r.verdict} for r in table.itertuples(index=False)}).T


def link_display(table: pd.DataFrame) -> pd.DataFrame:
    """The link family indexed by ``scope, optimizer, measure``: ``predicted, rho, n_seeds, n_points, verdict``."""
    def rho(r, lo, hi):
        if math.isnan(r):
            return "not computed"
        return f"{r:+.2f} [no interval]" if math.isnan(lo) or math.isnan(hi) else f"{r:+.2f} [{lo:+.2f}, {hi:+.2f}]"
    return table.assign(rho=[rho(*v) for v in zip(table["estimate"], table["low"], table["high"])],
                        predicted=["negative" if s < 0 else "positive" for s in table["predicted_sign"]],
                        n_seeds=table["n"])[
        ["scope", "optimizer", "measure", "predicted", "rho", "n_seeds", "n_points", "verdict"]].set_index(
        ["scope", "optimizer", "measure"])


def _short_gaps(C: pd.DataFrame) -> pd.DataFrame:
    return C[(C["family"] == "gap") & (C["shift"] == "ref")]


def budget_gaps(C: pd.DataFrame, S: pd.DataFrame) -> pd.DataFrame:
    """The gap at both budgets for :func:`gap_figure`, ``shift`` naming the budget: ``short`` (the gap family at
    chapter 1's shift, for the cells the longer budget ran) and ``long`` (family ``gap_long``), each family's
    intervals."""
    long = S[S["family"] == "gap_long"]
    cells, short = set(zip(long["head"], long["optimizer"])), _short_gaps(C)
    short = short[[(h, o) in cells for h, o in zip(short["head"], short["optimizer"])]]
    return pd.concat([short.assign(shift="short"), long.assign(shift="long")], ignore_index=True)


def long_display(C: pd.DataFrame, S: pd.DataFrame, SF: pd.DataFrame) -> pd.DataFrame:
    """The longer budget per (head, optimizer): the gap at each budget and its change (``estimate [low, high]
    verdict``, each family's intervals) and each mode's gain (long minus short task B, Bonferroni intervals over the
    cells, :func:`~.findings.steps_findings`)."""
    short = _short_gaps(C).set_index(["head", "optimizer"])
    n_short, n_long = number(SF, "steps_short"), number(SF, "steps_long")
    rows = {}
    for r in S[S["family"] == "gap_long"].itertuples(index=False):
        rows[(r.head, r.optimizer)] = {f"gap, {n_short:,} steps": _cell_text(short.loc[(r.head, r.optimizer)]),
                                       f"gap, {n_long:,} steps": _cell_text(r)}
    for r in S[S["family"] == "steps"].itertuples(index=False):
        rows.setdefault((r.head, r.optimizer), {})["change of the gap"] = _cell_text(r, (-2, 2))
    for (h, o), row in rows.items():
        for mode in ("pinned", "separate"):
            iv = number(SF, f"{mode}_gain_{h}_{o}")
            row[f"{mode} gain"] = f"{iv.mean:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index = [f"{h} / {OPTIMIZER_LABELS[o]}" for h, o in out.index]
    return out


def lift_display(lift: pd.DataFrame, shift_labels: dict) -> pd.DataFrame:
    """Family ``lift``: a row per (shift, statistics, head), optimizers in columns, ``estimate [low, high]
    verdict``."""
    t = lift.assign(cell=[_cell_text(r, (-1, 1)) for r in lift.itertuples(index=False)],
                    where=[shift_labels.get(s, s) for s in lift["shift"]])
    out = t.pivot_table(index=["where", "statistics", "head"], columns="optimizer", values="cell", aggfunc="first",
                        sort=False)
    return out.reindex(columns=list(dict.fromkeys(lift["optimizer"]))).rename_axis(
        index=["shift", "statistics", "head"], columns=None)
