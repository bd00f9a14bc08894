"""Chapter 9, what is drawn: the statistics error and the accuracy against the momentum, the training choices, and
Frankle et al.'s comparison at digit scale. Colours from :mod:`bnstudy.study.style` only; means over seeds with 95%
Student-t intervals (descriptive; the claims' family intervals are wider, and the text reads those)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ... import style
from ...plots import interval_frame, legend_below
from .claims import FRANKLE_NAMES, MARGIN, TRAIN_NAMES, chosen_rows, grid, setting_label
from .run import TRAIN_CONDITIONS


#: The shift families' names in the legends ("affine" would read as BatchNorm's affine parameters).
SHIFT_LABELS = {"affine": "brightness/contrast shift", "noise": "noise shift", "blur": "blur shift"}


def momentum_figure(rows: pd.DataFrame):
    """Part 1 on the reported seeds: top, the statistics error of each momentum setting of the grid (x, in order;
    the cumulative average last) at the final weights of each step budget (colour), the dashed line precise BN's;
    bottom, task-B accuracy minus precise BN's, paired by seed, with the equivalence margin shaded. Columns: target
    x batch size."""
    rep = rows[rows["role"] == "report"]
    g = grid(rows)
    cells = list(rep.groupby(["target", "batch_size"]).groups)
    budgets = sorted(rep["budget"].unique())
    colors = style.sequential(budgets)
    fig, axes = plt.subplots(2, len(cells), figsize=(7.3, 4.8), sharex=True, sharey="row", squeeze=False)
    for j, (target, b) in enumerate(cells):
        cell = rep[(rep["target"] == target) & (rep["batch_size"] == b)]
        wide = cell.pivot_table(index=["seed", "budget"], columns="condition", values="accuracy")
        ema = [c for c in g if c != "cma"]  # the momenta, joined; the cumulative average apart, unjoined
        for t in budgets:
            c = cell[(cell["budget"] == t) & cell["condition"].isin(g)]
            fr = interval_frame(c, "condition", "stats_error").reindex(g)
            k = len(ema)
            axes[0, j].plot(range(k), fr["mean"][:k], marker="o", ms=3, color=colors[t], label=f"{t} steps")
            axes[0, j].fill_between(range(k), fr["lo"][:k].clip(lower=fr["mean"][:k] / 10), fr["hi"][:k],
                                    color=colors[t], alpha=0.2, lw=0)
            if "cma" in g:
                axes[0, j].plot([k], [fr["mean"]["cma"]], marker="D", ms=4, ls="none", color=colors[t])
            p = cell[(cell["budget"] == t) & (cell["condition"] == "precise")]["stats_error"].mean()
            axes[0, j].axhline(p, ls="--", lw=0.9, color=colors[t])
            w = wide.xs(t, level="budget")
            d = pd.DataFrame({"condition": np.repeat(g, len(w)),
                              "diff": np.concatenate([(w[c] - w["precise"]).to_numpy() for c in g])})
            fd = interval_frame(d, "condition", "diff").reindex(g)
            axes[1, j].errorbar(np.arange(len(g)) + 0.12 * (budgets.index(t) - 1), fd["mean"],
                                yerr=[fd["mean"] - fd["lo"], fd["hi"] - fd["mean"]], fmt="o", ms=3, lw=0.8,
                                capsize=1.5, color=colors[t])
        axes[1, j].axhspan(-MARGIN, MARGIN, color=style.color("reference", "band"), lw=0)
        axes[1, j].axhline(0, color=style.color("reference", "zero"), lw=0.8)
        axes[0, j].set_title(f"{target}, batch {b}")
        axes[0, j].set_yscale("log")
        axes[1, j].set_xticks(range(len(g)), [setting_label(c).replace("m = ", "").replace("cumulative average", "cma")
                                              for c in g], rotation=90)
        axes[1, j].set_xlabel("momentum")
        if "cma" in g:
            for ax in axes[:, j]:
                ax.axvline(len(g) - 1.5, color=style.color("reference", "chance"), lw=0.6, ls=":")
    axes[0, 0].set_ylabel("statistics error\n(dashed: precise BN)")
    axes[1, 0].set_ylabel("accuracy minus\nprecise BN")
    axes[1, 0].set_ylim(max(axes[1, 0].get_ylim()[0], -1.0), min(axes[1, 0].get_ylim()[1], 1.0))
    return legend_below(fig, axes[0, 0], ncol=len(budgets))


def train_figure(train: pd.DataFrame):
    """Part 2 at each condition's tuned rate, reported seeds: task-B accuracy (top) and task A's retention
    (bottom) per training choice (x) for new and same task-B classes (columns), one colour per shift family;
    means over seeds with 95% intervals."""
    ch = chosen_rows(train)
    classes = [k for k in ("new", "same") if k in set(ch["classes"])]
    shifts = list(dict.fromkeys(ch["shift"]))
    conds = [c for c in TRAIN_CONDITIONS if c in set(ch["condition"])]
    fig, axes = plt.subplots(2, len(classes), figsize=(7.3, 5.2), sharex=True, sharey="row", squeeze=False)
    for j, k in enumerate(classes):
        for i, v in enumerate(("accuracy", "task_a")):
            ax = axes[i, j]
            for s_i, s in enumerate(shifts):
                c = ch[(ch["classes"] == k) & (ch["shift"] == s)]
                fr = interval_frame(c, "condition", v).reindex(conds)
                xs = np.arange(len(conds)) + 0.15 * (s_i - (len(shifts) - 1) / 2)
                ax.errorbar(xs, fr["mean"], yerr=[fr["mean"] - fr["lo"].clip(0, 1), fr["hi"].clip(0, 1) - fr["mean"]],
                            fmt="o", ms=3.5, lw=0.8, capsize=1.5, color=style.color("shift", s),
                            label=SHIFT_LABELS.get(s, s))
            ax.set_ylim(0, 1.02)
            if i == 0:
                ax.set_title(f"task B: {k} classes")
            if i == 1:
                ax.set_xticks(range(len(conds)), [TRAIN_NAMES[c] for c in conds], rotation=60, ha="right")
        axes[0, 0].set_ylabel("task-B accuracy")
        axes[1, 0].set_ylabel("task A kept\n(head A, eval mode)")
    return legend_below(fig, axes[0, 0], ncol=len(shifts))


def frankle_figure(frankle: pd.DataFrame):
    """Part 3 at each condition's tuned rate, reported seeds: task-A accuracy from random initialisation against
    the number of trainable parameters (log scale; the output layer's included), means over seeds with 95%
    intervals."""
    ch = chosen_rows(frankle, ("condition",))
    fig, ax = plt.subplots(figsize=(5.0, 3.2))
    for c, g in ch.groupby("condition", sort=False):
        iv = interval_frame(g.assign(k=0), "k", "accuracy").iloc[0]
        n = g["trainable"].mean()
        ax.errorbar([n], [iv["mean"]], yerr=[[iv["mean"] - max(iv["lo"], 0)], [min(iv["hi"], 1) - iv["mean"]]],
                    fmt="o", ms=5, capsize=2, color=style.color("frankle", c), label=FRANKLE_NAMES[c])
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("trainable parameters (log scale)")
    ax.set_ylabel("task-A accuracy\nfrom random init")
    return legend_below(fig, ax, ncol=2)
