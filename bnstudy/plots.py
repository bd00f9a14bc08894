"""One figure style for the book, and stable figure files.

``save_figure(fig, "01-accuracy", figures_dir)`` writes ``01-accuracy.png`` (300 dpi)
and ``01-accuracy.svg`` atomically, so a reader can cite and link a file whose
name does not change between builds, and ``01-accuracy.json``, which names the
tidy CSV the figure was drawn from. The book (``bnstudy.sphinxext``) links all of
them under the figure labelled ``fig-ch01-accuracy``.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import seaborn as sns

import textwrap

import numpy as np
import pandas as pd

from . import style
from .inference import Interval, t_interval
from .modes import MODE_NAMES
from .sweep import atomic_write_bytes

def _interval(values, confidence: float = 0.95) -> Interval:
    """A figure's bar: :func:`bnstudy.inference.t_interval` of ``values`` (NaN dropped); one value is drawn as a
    point without a bar."""
    iv = t_interval(values, confidence)
    return iv if iv.n >= 2 else Interval(iv.mean, iv.mean, iv.mean, iv.n, confidence)


MODE_ORDER = list(MODE_NAMES)
# colorblind palette entries blue, orange, green and purple: its fourth (vermillion) is too close to orange
# for backbone_eval and separate_stats, which several figures draw side by side (referee s7)
MODE_PALETTE = style.palette("mode", MODE_ORDER)  # one colour per freeze mode in every figure (bnstudy.style)


def set_style() -> None:
    """The book's matplotlib/seaborn style (white grid, readable sizes, SVG text kept as text)."""
    # Text at least 10 pt in a figure drawn at its own size; the book shows figures at up to page
    # width (about 9 in), so a 9 in figure keeps 10 pt text and narrower ones are scaled up, never down.
    sns.set_theme(context="notebook", style="whitegrid", font_scale=0.95)
    matplotlib.rcParams.update({"figure.dpi": 100, "savefig.bbox": "tight", "svg.fonttype": "none",
                                "axes.titlesize": "medium", "font.size": 10, "legend.fontsize": 10,
                                "xtick.labelsize": 10, "ytick.labelsize": 10, "axes.labelsize": 10.5})


PNG_DPI = 300


def save_figure(fig: plt.Figure, name: str, figures_dir, data=None) -> list[Path]:
    """Write ``fig`` as ``<figures_dir>/<name>.png`` (300 dpi) and ``.svg``; returns both paths.

    Also writes ``<name>.json`` naming the files and ``data``, the tidy CSV the figure was drawn from
    (default: the table that :func:`bnstudy.report.save_table` wrote last in this process; pass the
    path when the figure comes from another one, or a list of paths when it draws from several: the first is
    ``data``, the others ``data_more``, each with its run-parameter sidecar). Raises ``ValueError`` if ``name`` has
    a suffix or a path separator (names are stable ids), or for an empty list of paths.
    """
    from . import report

    if "/" in name or "." in name:
        raise ValueError(f"name must be a bare figure id like '01-accuracy', got {name!r}")
    paths = []
    for ext, kw in (("png", {"dpi": PNG_DPI}), ("svg", {})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, **kw)
        p = Path(figures_dir) / f"{name}.{ext}"
        atomic_write_bytes(p, buf.getvalue())
        paths.append(p)
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError(f"data must name at least one CSV for figure {name!r}, got an empty list")
        data, more = Path(data[0]), [Path(d) for d in data[1:]]
    else:
        data, more = (Path(data) if data is not None else report.last_table), []
    meta = dict(figure=name, png=f"{name}.png", png_dpi=PNG_DPI, svg=f"{name}.svg",
                data=data.name if data is not None else None,
                data_sidecar=report.sidecar_path(data).name if data is not None else None)
    if more:
        meta.update(data_more=[d.name for d in more], data_more_sidecars=[report.sidecar_path(d).name for d in more])
    meta.update(legibility(fig))
    side = Path(figures_dir) / f"{name}.json"
    atomic_write_bytes(side, (json.dumps(meta, indent=2) + "\n").encode())
    return paths


def legibility(fig: plt.Figure) -> dict:
    """How large ``fig``'s smallest text is on the page: ``width_in`` (the drawn width, tight bounding box, in
    inches), ``min_font_pt`` (the smallest visible, non-empty text, in points as drawn) and ``page_font_pt``,
    that size once the browser shrinks the figure to the text column
    (:data:`bnstudy.style.COLUMN_WIDTH_IN`; a narrower figure is not enlarged). ``tests/test_pages_clean.py``
    requires ``page_font_pt >= bnstudy.style.MIN_FONT_PT`` for every figure of the book."""
    from . import style

    fig.canvas.draw()
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text)
             if t.get_visible() and t.get_text().strip() and t.figure is not None]
    width = float(fig.get_tightbbox(fig.canvas.get_renderer()).width)
    smallest = float(min(sizes)) if sizes else float("nan")
    scale = min(1.0, style.COLUMN_WIDTH_IN / width) if width > 0 else 1.0
    return dict(width_in=round(width, 3), min_font_pt=smallest, page_font_pt=round(smallest * scale, 3))


def interval_frame(df: pd.DataFrame, by, value: str) -> pd.DataFrame:
    """Mean and 95% interval of ``value`` per group ``by``: columns ``mean, lo, hi``, indexed by ``by``."""
    return df.groupby(by)[value].apply(lambda v: pd.Series(tuple(_interval(v)), index=["mean", "lo", "hi"])).unstack()


def _curve(table: pd.DataFrame, x: str, value: str) -> pd.DataFrame:
    """Mean and 95% interval over seeds of ``value`` at each ``x``: columns ``x, mean, lo, hi``."""
    return interval_frame(table, x, value).reset_index()


def sorted_batches_figure(t4: pd.DataFrame, chance: float | None = None, tolerance: float | None = None):
    """Chapter 2, trap 4: task-A accuracy against the share of each batch drawn from one class.

    ``t4``: the trap's tidy table (``seed, sorted_fraction, module_eval_accuracy,
    module_train_accuracy, module_eval_accuracy_after_pass, label_dependence, sorted_lint,
    source_task_a_accuracy``). Top: the module in eval mode (running statistics) and in train mode
    (batch statistics) on the same batches, means over seeds with 95% Student-t bands, ``chance``
    dotted; the top axis gives each loader's label dependence, circled points are loaders the lint
    flagged (in more than half of the seeds). Bottom: paired differences per seed, train minus eval
    mode on the same batches, and held-out eval accuracy after the train-mode pass minus before it
    (the same held-out images), with 95% Student-t bands; an inset zooms on the latter with the
    equivalence band +-``tolerance`` (upper right, its own y ticks on its right). Returns the figure.
    """
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(6.6, 5.8), sharex=True, gridspec_kw={"height_ratios": [1.25, 1]})
    for q, label, color, marker in (("module_eval_accuracy", "eval mode (running statistics)", style.STATISTICS["running"], "o"),
                                    ("module_train_accuracy", "train mode (batch statistics)", style.STATISTICS["batch"], "s")):
        c = _curve(t4, "sorted_fraction", q)
        ax.plot(c["sorted_fraction"], c["mean"], marker=marker, ms=4, color=color, label=label)
        ax.fill_between(c["sorted_fraction"], c["lo"], c["hi"], color=color, alpha=0.2)
    flagged = _curve(t4, "sorted_fraction", "sorted_lint")
    dep = _curve(t4, "sorted_fraction", "label_dependence")
    tm = _curve(t4, "sorted_fraction", "module_train_accuracy")
    hit = flagged["mean"] > 0.5
    ax.scatter(tm["sorted_fraction"][hit], tm["mean"][hit], s=70, facecolors="none", edgecolors="k", zorder=5,
               label="loader flagged by the lint")
    if chance is not None:
        ax.axhline(chance, color=style.REFERENCE["chance"], ls=":", lw=1, label="chance")
    ax.set_ylabel("accuracy on task A")
    ax.set_ylim(0, 1.02)
    top = ax.secondary_xaxis("top")
    top.set_xticks(dep["sorted_fraction"].tolist())
    top.set_xticklabels([f"{v:.2f}".replace("-0.00", "0.00") for v in dep["mean"]])
    top.set_xlabel("label dependence of the batches (audit)")
    ax.legend(fontsize=9, loc="center left", bbox_to_anchor=(0.0, 0.45))
    d = t4.assign(train_minus_eval=t4["module_train_accuracy"] - t4["module_eval_accuracy"],
                  after_minus_before=t4["module_eval_accuracy_after_pass"] - t4["source_task_a_accuracy"])
    for q, label, color, marker in (("train_minus_eval", "train mode - eval mode (same batches)", style.STATISTICS["batch"], "s"),
                                    ("after_minus_before", "held-out eval accuracy: after the pass - before", style.GREEN,
                                     "^")):
        c = _curve(d, "sorted_fraction", q)
        dx.plot(c["sorted_fraction"], c["mean"], marker=marker, ms=4, color=color, label=label)
        dx.fill_between(c["sorted_fraction"], c["lo"], c["hi"], color=color, alpha=0.2)
    dx.axhline(0, color=style.REFERENCE["chance"], lw=1)
    if tolerance is not None:  # upper right, above the zero line, its ticks on the right (not beside dx's)
        ins = dx.inset_axes([0.52, 0.66, 0.40, 0.22])
        c = _curve(d, "sorted_fraction", "after_minus_before")
        ins.axhspan(-tolerance, tolerance, color=style.REFERENCE["band"], zorder=0)
        ins.plot(c["sorted_fraction"], c["mean"], "^-", ms=3, color=style.GREEN)
        ins.fill_between(c["sorted_fraction"], c["lo"], c["hi"], color=style.GREEN, alpha=0.25)
        ins.axhline(0, color="0.4", lw=0.8)
        ins.set_ylim(-1.5 * tolerance, 1.5 * tolerance)
        ins.set_title(f"after - before, zoomed (band \u00b1{tolerance:g})", fontsize=9, pad=3)
        ins.set_xlim(dx.get_xlim())
        ins.tick_params(labelsize=9, labelbottom=False, left=False, labelleft=False, right=True, labelright=True)
    dx.set_ylabel("difference in accuracy\n(paired per seed)")
    dx.set_xlabel("share of each batch drawn from one class (0 = shuffled, 1 = class-sorted)")
    dx.set_ylim(min(dx.get_ylim()[0], -0.05), 0.75)
    dx.legend(fontsize=9, loc="lower left")
    return min_text_size(fig)


def batch_size_figure(t5: pd.DataFrame, min_batch: int, chance: float):
    """Chapter 2, trap 5: task-A accuracy with BatchNorm in train mode against the per-device batch size.

    ``t5``: the trap's tidy table (``seed, device_batch_size, module_train_accuracy,
    module_eval_accuracy``). Mean over seeds with a 95% Student-t band; the eval-mode accuracy
    and ``chance`` as reference lines; the shaded region is where the small-batch lints fire
    (below ``min_batch``). Returns the figure.
    """
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    c = _curve(t5, "device_batch_size", "module_train_accuracy")
    ax.axvspan(0.8, min_batch, color="0.9", zorder=0, label=f"lint fires (batch < {min_batch})")
    ax.plot(c["device_batch_size"], c["mean"], "s-", ms=4, color=style.STATISTICS["batch"], label="train mode (batch statistics)")
    ax.fill_between(c["device_batch_size"], c["lo"], c["hi"], color=style.STATISTICS["batch"], alpha=0.2)
    ax.axhline(float(t5["module_eval_accuracy"].mean()), color=style.STATISTICS["running"], ls="--",
               label="eval mode (running statistics)")
    ax.axhline(chance, color="0.4", ls=":", label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xticks(c["device_batch_size"].tolist())
    ax.set_xticklabels([str(int(b)) for b in c["device_batch_size"]])
    ax.set_xlim(0.8, c["device_batch_size"].max() * 1.25)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("per-device batch size")
    ax.set_ylabel("accuracy on task A")
    ax.legend(fontsize=8, loc="lower right")
    return fig

# --- chapter 3, issue 10: per-level effects, normalized view, budget points, candidates -----------------------------
# Figures at most 9 in wide (the page's width), text at least 9 pt, so nothing is shrunk below 9 pt on the page.

CH3_FONT = {"font.size": 9.5, "axes.titlesize": 9.5, "axes.labelsize": 9.5, "xtick.labelsize": 9,
            "ytick.labelsize": 9, "legend.fontsize": 9, "legend.title_fontsize": 9}
#: Task A's and task B's differences (train_mode - backbone_eval) and their sum: style.EFFECTS ("cost" is task A's).
EFFECT_COLORS = {"cost": style.color("effect", "cost"), "benefit": style.color("effect", "benefit"),
                 "net": style.color("effect", "net")}
#: The page's labels of the three effects, as drawn (condition minus reference, the book's one sign).
CH3_EFFECT_LABELS = {"cost": "task A (train_mode − backbone_eval)", "benefit": "task B (train_mode − backbone_eval)",
                     "net": "sum of both"}


def _ch3_signed(g: pd.DataFrame, metric: str) -> pd.DataFrame:
    """A level/budget table's rows of ``metric`` as drawn: task A's ``cost`` (backbone_eval - train_mode) negated to
    train_mode - backbone_eval (mean and interval), intervals cut to [-1, 1] (accuracy differences)."""
    g = g.copy()
    if metric == "cost":
        g["mean"], g["ci_low"], g["ci_high"] = -g["mean"], -g["ci_high"], -g["ci_low"]
    g["ci_low"], g["ci_high"] = g["ci_low"].clip(-1, 1), g["ci_high"].clip(-1, 1)
    return g


def _ch3_grid(n: int, height: float = 2.6):
    ncol = min(n, 3)
    nrow = int(np.ceil(n / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(style.COLUMN_WIDTH_IN, height * nrow + 0.8), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat[:n]


def _ch3_log_levels(ax, x, ylim=(-1.05, 1.05)):
    """Log x axis labelled at the levels themselves; y cut to ``ylim`` (accuracy differences cannot leave
    [-1, 1]; a t interval over few seeds can)."""
    x = sorted(set(float(v) for v in x))
    ax.set_xscale("log")
    ax.set_xticks(x)
    # Label only levels far enough apart on the log axis to be read (about a fifth of the panel's span, at least
    # 0.12 decade, more after a long label such as 0.0625), always the first and the last; the other levels keep an
    # unlabelled tick.
    lx = np.log10(x)
    gap = max(0.12, (lx[-1] - lx[0]) / 5) if len(x) > 1 else 0
    keep, last, need = [], -np.inf, 0.0
    for i, v in enumerate(lx):
        if v - last >= need:
            keep.append(i)
            last, need = v, gap * max(1.0, len(f"{x[i]:g}") / 4)
    if len(x) > 1 and keep[-1] != len(x) - 1:
        if lx[-1] - lx[keep[-1]] < gap and len(keep) > 1:
            keep.pop()
        keep.append(len(x) - 1)
    ax.set_xticklabels([f"{v:g}" if i in keep else "" for i, v in enumerate(x)], rotation=30)
    ax.minorticks_off()
    lo, hi = ax.get_ylim()
    ax.set_ylim(max(lo, ylim[0]), min(hi, ylim[1]))


def _ch3_legend(fig, axes, ncol=4, order=None):
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if order is not None:  # entries named in ``order`` first, in its order; the rest after, as drawn
        rank = {k: i for i, k in enumerate(order)}
        handles = dict(sorted(handles.items(), key=lambda kv: rank.get(kv[0], len(rank))))
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(ncol, len(handles)), frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.07, 1, 1))


def ch3_level_effects(levels, crossings: dict, xlabels: dict, reference: dict, view: str = "raw", points=None):
    """Cost and benefit per level (``levels``: shift_strength.level_table) with their Bonferroni intervals, one
    panel per line, log strength axis (so the weak shifts get as much room as the strong ones); the two series
    are drawn side by side (dodged), never on top of each other. ``crossings[line]``: the crossover strength drawn
    as a dashed line when finite; ``reference[line]``: chapter 1's shift, dotted. ``points``
    (shift_strength.seed_points, raw view only): each seed's value as a small translucent dot behind its mean."""
    with plt.rc_context(CH3_FONT):
        lv = levels[levels["view"] == view]
        lines = list(dict.fromkeys(lv["line"]))
        fig, axes = _ch3_grid(len(lines))
        for ax, t in zip(axes, lines):
            for name, f, mk in (("cost", 0.93, "v"), ("benefit", 1.07, "^")):
                g = _ch3_signed(lv[(lv["line"] == t) & (lv["metric"] == name)].sort_values("strength"), name)
                if points is not None and view == "raw":
                    p = points[(points["line"] == t) & (points["metric"] == name)]
                    sign = -1 if name == "cost" else 1
                    ax.plot(p["strength"] * f, sign * p["value"], ".", ms=2.5, alpha=0.35, color=EFFECT_COLORS[name],
                            zorder=1, label=f"{CH3_EFFECT_LABELS[name].split(' ')[0]} {CH3_EFFECT_LABELS[name].split(' ')[1]}, one seed")
                ax.errorbar(g["strength"] * f, g["mean"], yerr=[g["mean"] - g["ci_low"], g["ci_high"] - g["mean"]],
                            fmt=mk + "-", ms=5, lw=1, capsize=2, color=EFFECT_COLORS[name], label=CH3_EFFECT_LABELS[name])
            cx = crossings.get(t, np.nan)
            if np.isfinite(cx):
                ax.axvline(cx, color="black", ls="--", lw=1, label="crossover of the mean curves")
            if t in reference and lv.loc[lv["line"] == t, "strength"].between(0, np.inf).any():
                ax.axvline(reference[t], color="grey", ls=":", lw=1.2, label="chapter 1's shift")
            ax.axhline(0, color="black", lw=0.6)
            _ch3_log_levels(ax, lv.loc[lv["line"] == t, "strength"])
            ax.set_title(t.replace("_", " ") + (" (same classes)" if t.startswith("same") else ""))
            ax.set_xlabel(textwrap.fill(xlabels.get(t, "strength"), 26))
        for ax in axes[::3]:
            ax.set_ylabel("difference in accuracy" if view == "raw" else "difference in share of room")
        _ch3_legend(fig, axes, ncol=2)
    return fig


def ch3_net_views(levels, margin: float, xlabels: dict | None = None, views=("raw", "vs no shift")):
    """Benefit minus cost per level (difference in accuracy) in the ``views`` of ``levels`` (shift_strength.
    level_table; default: ``raw`` and ``vs no shift``, the benefit counted above its no-shift value), Bonferroni
    intervals, the equivalence band ``±margin`` shaded; one panel per line, log strength axis labelled by
    ``xlabels[line]``, symmetric-log y axis (linear within ±0.05) so that the band and the weak levels stay
    readable next to losses of 0.8. Filled markers: a direction shown (the family interval excludes 0); open
    diamonds: equivalent within the margin (TOST); open circles: not decided."""
    labels = {"raw": "benefit − cost", "vs no shift": "benefit above its no-shift value − cost",
              "normalized": "share of room above chance"}
    with plt.rc_context(CH3_FONT):
        lines = list(dict.fromkeys(levels["line"]))
        fig, axes = _ch3_grid(len(lines), height=2.9)
        col = {"raw": style.color("effect", "net"), "vs no shift": style.PURPLE, "normalized": style.GREEN}
        for ax, t in zip(axes, lines):
            ax.axhspan(-margin, margin, color="grey", alpha=0.25, lw=0, label=f"equivalence band ±{margin:g}")
            for k, view in enumerate(views):
                f = 0.93 + 0.14 * k / max(len(views) - 1, 1)
                g = levels[(levels["line"] == t) & (levels["metric"] == "net") & (levels["view"] == view)]
                g = _ch3_signed(g.sort_values("strength"), "net")
                ax.errorbar(g["strength"] * f, g["mean"], yerr=[g["mean"] - g["ci_low"], g["ci_high"] - g["mean"]],
                            fmt="-", lw=1, capsize=2, color=col[view], label=labels[view])
                res = g["kind"].isin(["lower", "higher"]) if "kind" in g.columns else (g["ci_low"] > 0) | (g["ci_high"] < 0)
                tie = ~res & (g["kind"] == "equivalent") if "kind" in g.columns else ~res & False
                ax.plot(g["strength"][res] * f, g["mean"][res], "o", ms=4.5, color=col[view])
                ax.plot(g["strength"][~res & ~tie] * f, g["mean"][~res & ~tie], "o", ms=4.5, mfc="white",
                        color=col[view])
                ax.plot(g["strength"][tie] * f, g["mean"][tie], "D", ms=4, mfc="white", color=col[view])
            ax.axhline(0, color="black", lw=0.6)
            ax.set_yscale("symlog", linthresh=0.05, linscale=1.5)
            ax.set_ylim(-1.05, 0.3)
            ax.set_yticks([-1, -0.1, -0.02, 0, 0.02, 0.1])
            ax.set_yticklabels(["−1", "−0.1", "−0.02", "0", "0.02", "0.1"])
            _ch3_log_levels(ax, levels.loc[levels["line"] == t, "strength"], ylim=(-1.05, 0.3))
            ax.set_title(t.replace("_", " ") + (" (same classes)" if t.startswith("same") else ""))
            ax.set_xlabel(textwrap.fill((xlabels or {}).get(t, "strength"), 26))
        for ax in axes[::3]:
            ax.set_ylabel("difference in accuracy\n(symmetric log)")
        _ch3_legend(fig, axes, ncol=2)
    return fig


def ch3_budget_points(bp):
    """Every budget point (``bp``: shift_strength.budget_points): top row task-B accuracy of the drifting and the
    pinned head against stage-2 steps, bottom row cost, benefit and net (differences in accuracy; colours distinct
    from the modes'); one column per strength ``t`` of the both line; 95% t intervals over seeds; series dodged
    (x scaled by 0.96 / 1.04) so that none hides another."""
    with plt.rc_context(CH3_FONT):
        ts = sorted(bp["t"].unique())
        fig, axes = plt.subplots(2, len(ts), figsize=(style.COLUMN_WIDTH_IN, 5.6), squeeze=False, sharex=True)
        for j, t in enumerate(ts):
            g = bp[bp["t"] == t]
            for mode, mk, f in (("train_mode", "o", 0.96), ("backbone_eval", "s", 1.04)):
                h = g[(g["mode"] == mode)].sort_values("steps")
                axes[0][j].errorbar(h["steps"] * f, h["mean"], yerr=[h["mean"] - h["ci_low"], h["ci_high"] - h["mean"]],
                                    fmt=mk + "-", ms=4.5, capsize=2, lw=1, color=MODE_PALETTE[mode], label=mode)
            for name, mk, f in (("cost", "v", 0.96), ("benefit", "^", 1.0), ("net", "D", 1.04)):
                h = _ch3_signed(g[(g["metric"] == name)].sort_values("steps"), name)
                axes[1][j].errorbar(h["steps"] * f, h["mean"], yerr=[h["mean"] - h["ci_low"], h["ci_high"] - h["mean"]],
                                    fmt=mk + "--", ms=5, capsize=2, lw=1, color=EFFECT_COLORS[name],
                                    label=CH3_EFFECT_LABELS[name])
            axes[1][j].axhline(0, color="black", lw=0.6)
            axes[0][j].set_title(f"both line, t = {t:g}")
            axes[1][j].set_xscale("log")
            steps = sorted(g["steps"].unique())
            axes[1][j].set_xticks(steps); axes[1][j].set_xticklabels([str(int(s)) for s in steps]); axes[1][j].minorticks_off()
            axes[1][j].set_xlabel("stage-2 steps")
        axes[0][0].set_ylabel("task-B accuracy")
        axes[1][0].set_ylabel("difference in accuracy")
        _ch3_legend(fig, [axes[0][0], axes[1][0]], ncol=2)
    return fig


def ch3_heatmaps(grid):
    """Task-A difference, task-B difference and their sum (each train_mode - backbone_eval) on the brightness x
    contrast grid (``grid``: shift_strength.grid_table), one row per quantity so that the cells' 9 pt text fits the
    column, each with its colour bar; cells show the mean and the half-width of the 95% interval."""
    with plt.rc_context(CH3_FONT):
        gb, gc = sorted(grid["brightness"].unique()), sorted(grid["contrast"].unique())
        wide = {m: _ch3_signed(grid[grid["metric"] == m], m).set_index(["brightness", "contrast"])
                for m in ("cost", "benefit", "net")}
        titles = {"cost": "task-A difference", "benefit": "task-B difference", "net": "sum of both"}
        fig, axes = plt.subplots(1, 3, figsize=(style.COLUMN_WIDTH_IN, 3.2), sharey=True)
        for ax, (name, cmap) in zip(axes, (("cost", "RdBu"), ("benefit", "RdBu"), ("net", "RdBu"))):
            a = wide[name]
            M = a["mean"].unstack("contrast").reindex(index=gb, columns=gc).values
            H = ((a["ci_high"] - a["ci_low"]) / 2).unstack("contrast").reindex(index=gb, columns=gc).values
            top = max(np.nanmax(np.abs(M)), 1e-9)
            im = ax.imshow(M, origin="lower", cmap=cmap, aspect="auto", vmin=-top, vmax=top)
            cb = fig.colorbar(im, ax=ax, fraction=0.08, pad=0.03)
            cb.locator = matplotlib.ticker.MaxNLocator(3)
            cb.update_ticks()
            for i, j in np.ndindex(M.shape):
                ax.text(j, i, f"{M[i, j]:.2f}\n±{H[i, j]:.2f}", ha="center", va="center", fontsize=9,
                        color="white" if abs(M[i, j]) > 0.6 * top else "black")
            ax.set_xticks(range(len(gc))); ax.set_xticklabels([f"{c:g}" for c in gc])
            ax.set_yticks(range(len(gb))); ax.set_yticklabels([f"{b:g}" for b in gb])
            ax.set_xlabel("contrast gain c"); ax.set_title(titles[name])
            ax.grid(False)
        axes[0].set_ylabel("brightness offset b")
        fig.supxlabel("colour: difference in accuracy (train_mode − backbone_eval)", fontsize=9)
        fig.tight_layout()
    return min_text_size(fig)


#: Fig. 6's marks per condition kind: the second family (task B with task A's classes) gets open markers and
#: colours of its own, so each twin line is told apart from its twin (``noise`` / ``same_noise`` were two pinks).
CH3_KIND_MARKS = {**{k: ("o", style.color("shift", k), True) for k in ("brightness", "contrast", "both", "blur", "noise")},
                  "same_both": ("D", style.color("shift", "same_both"), False),
                  "same_noise": ("D", style.color("shift", "same_noise"), False),
                  "no shift": ("s", style.GREY, True), "no shift, same classes": ("s", style.GREY, False)}


def _log_ticks(ax):
    """Readable labels on a log x axis: 1-2-5 steps over up to 2.5 decades, 1-3 up to 4, else powers of ten;
    plain numbers, rotated."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    lo, hi = ax.get_xlim()
    decades = np.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0, 3.0) if decades <= 4 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=30))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    for t in ax.get_xticklabels():
        t.set_rotation(35); t.set_ha("right")


def ch3_candidates(conditions, selection: dict, candidates: dict, winner: str | None = None):
    """Cost against each mismatch candidate (``conditions``: shift_strength.condition_table; one point per shift,
    95% bars in both directions), log measure axis, two rows of three panels; the second family's lines and no-shift
    point in open markers. The last panel: each candidate's leave-one-type-out score minus the ``winner``'s, with the
    95% bootstrap interval of that paired difference (``selection``: Findings.selection; filled where it excludes 0,
    "beaten"); the claim rests on these differences, not on the overlapping marginal score intervals. Without
    ``winner`` it shows the marginal scores (the old panel). Grid-only shifts (in the rank correlations) are not
    drawn."""
    with plt.rc_context(CH3_FONT):
        names = [n for n in candidates if candidates[n] in conditions.columns]
        ncol = 3
        nrow = int(np.ceil((len(names) + 1) / ncol))
        fig, axs = plt.subplots(nrow, ncol, figsize=(style.COLUMN_WIDTH_IN - 0.3, 3.2 * nrow + 1.2), squeeze=False)
        axes = list(axs.flat)
        for ax in axes[len(names) + 1:]:
            ax.set_visible(False)
        c = conditions[conditions["kind"] != "grid only"]
        for ax, n in zip(axes, names):
            col = candidates[n]
            for kind, g in c.groupby("kind", sort=False):
                mk, color, filled = CH3_KIND_MARKS.get(kind, ("o", "0.5", True))
                # task A as train_mode - backbone_eval: minus the cost, its interval negated and cut to [-1, 1]
                y, ylo, yhi = -g["cost"], (-g["cost_hi"]).clip(-1, 1), (-g["cost_lo"]).clip(-1, 1)
                ax.errorbar(g[col], y, xerr=[g[col] - g[col + "_lo"], g[col + "_hi"] - g[col]],
                            yerr=[y - ylo, yhi - y], fmt=mk, ms=5, lw=0.8,
                            capsize=1.5, color=color, mfc=color if filled else "white", mew=1.2, label=kind,
                            alpha=0.9)
            ax.set_xscale("log"); ax.axhline(0, color="black", lw=0.6)
            _log_ticks(ax)
            ax.set_title(f"{n}\nscore {selection[n]['score']:.3f}")
            ax.set_xlabel(textwrap.fill(f"{n} (before stage 2)", 22))
            ax.set_ylim(-1.0, 0.1)
        for i, ax in enumerate(axes[:len(names)]):
            if i % ncol == 0:
                ax.set_ylabel("task-A difference\n(train_mode − backbone_eval)")
        ax = axes[len(names)]
        if winner is not None:
            others = [n for n in names if n != winner]
            d = np.array([selection[n]["diff"] for n in others])
            lo = np.array([selection[n]["diff_lo"] for n in others])
            hi = np.array([selection[n]["diff_hi"] for n in others])
            for i, (n, v, l, h) in enumerate(zip(others, d, lo, hi)):
                beaten = l > 0
                ax.errorbar([v], [i], xerr=[[v - l], [h - v]], fmt="o", color="0.15", mfc="0.15" if beaten else "white",
                            capsize=3, ms=6, mew=1.2)
            ax.axvline(0, color="black", lw=0.8)
            ax.set_yticks(range(len(others))); ax.set_yticklabels(others); ax.invert_yaxis()
            ax.set_xlabel(f"score minus {winner}'s\n(accuracy; 95% bootstrap)")
            ax.set_title("against the lowest score")
        else:
            sc = np.array([selection[n]["score"] for n in names])
            lo = np.array([selection[n]["score_lo"] for n in names]); hi = np.array([selection[n]["score_hi"] for n in names])
            ax.errorbar(sc, range(len(names)), xerr=[sc - lo, hi - sc], fmt="o", color="0.2", capsize=2)
            ax.set_yticks(range(len(names))); ax.set_yticklabels(names); ax.invert_yaxis()
            ax.set_xlabel("held-out-type error (accuracy)"); ax.set_title("leave one type out")
        _ch3_legend(fig, axes[:len(names)], ncol=3, order=list(CH3_KIND_MARKS))
        fig.tight_layout(rect=(0, 0.12, 1, 1))
    return min_text_size(fig)


# Paths of train_mode along the three affine lines: named colours of bnstudy.style that none of the modes uses.
CH3_PATH_COLORS = {"brightness": style.SKY, "contrast": style.BROWN, "both": style.PINK}


def ch3_retention(scatter):
    """Task-B gain over ``backbone_eval`` (y) against task-A change from before stage 2 (x) (``scatter``:
    shift_strength.scatter_table), one marker shape and size per mode so that modes that coincide (the two pinned
    modes at the origin) stay visible; ``train_mode``'s points joined along each line in order of strength."""
    marks = {"train_mode": ("o", 5), "backbone_eval": ("s", 9), "all_eval": ("D", 5), "separate_stats": ("^", 6)}
    with plt.rc_context(CH3_FONT):
        fig, ax = plt.subplots(figsize=(style.COLUMN_WIDTH_IN, 5.2))
        for mode in [m for m in MODE_ORDER if m in set(scatter["mode"])]:
            g = scatter[scatter["mode"] == mode]
            xa = g[g["metric"] == "task_a_change"].set_index(["brightness", "contrast"])
            yb = g[g["metric"] == "task_b_gain"].set_index(["brightness", "contrast"]).loc[xa.index]
            mk, ms = marks.get(mode, ("o", 5))
            ax.errorbar(xa["mean"], yb["mean"], xerr=[xa["mean"] - xa["ci_low"], xa["ci_high"] - xa["mean"]],
                        yerr=[yb["mean"] - yb["ci_low"], yb["ci_high"] - yb["mean"]], fmt=mk, ms=ms, capsize=2, lw=0.8,
                        color=MODE_PALETTE[mode], mfc="none" if mode == "backbone_eval" else MODE_PALETTE[mode],
                        mew=1.4, label=mode)
        # train_mode's points joined in order of strength along each line, so that its path away from the origin
        # can be followed (the no-shift point starts every line; the both line is every point off the other two).
        tm = scatter[scatter["mode"] == "train_mode"]
        if len(tm):
            xa = tm[tm["metric"] == "task_a_change"].set_index(["brightness", "contrast"])["mean"]
            yb = tm[tm["metric"] == "task_b_gain"].set_index(["brightness", "contrast"])["mean"].reindex(xa.index)
            b, c = xa.index.get_level_values(0), xa.index.get_level_values(1)
            paths = {"brightness": (c == 1), "contrast": (b == 0), "both": ((b == 0) & (c == 1)) | ((b != 0) & (c != 1))}
            for line, on in paths.items():
                order = np.argsort(np.asarray(b[on]) + np.asarray(c[on]))
                ax.plot(np.asarray(xa[on])[order], np.asarray(yb[on])[order], "-", lw=1.4, alpha=0.85,
                        color=CH3_PATH_COLORS[line], label=f"train_mode along the {line} line")
        ax.set_xlim(-1.05, 0.1); ax.set_ylim(min(-0.3, ax.get_ylim()[0]), min(1.05, max(0.3, ax.get_ylim()[1])))
        xx = np.linspace(-1.0, 0, 10)
        ax.plot(xx, -xx, color="grey", ls="--", lw=1, label="gain = loss")
        ax.axhline(0, color="black", lw=0.6); ax.axvline(0, color="black", lw=0.6)
        ax.set_xlabel("task-A accuracy change from before stage 2 (difference in accuracy)")
        ax.set_ylabel("task-B gain over backbone_eval\n(difference in accuracy)")
        ax.legend(loc="lower left", fontsize=9, ncol=2)
        fig.tight_layout()
    return min_text_size(fig)

# --- chapter 7 (issue 15): real digits and torchvision networks ---------------------------------------------------

#: Chapter 7's network order in every figure (smallest first).
CH07_NETWORK_ORDER = ("small_cnn", "resnet18", "mobilenet_v3_small")


#: Chapter 7's corruptions in the page's order (brightness, contrast, noise, blur, inversion).
CH07_CORRUPTION_ORDER = ("brightness", "contrast", "gaussian_noise", "blur", "inversion")


def _ch07_label(name: str, kind: str = "network") -> str:
    """A readable name for a chapter-7 network or corruption (real_data's label maps)."""
    from .experiments.real_data import CORRUPTION_LABELS, NETWORK_LABELS
    return (NETWORK_LABELS if kind == "network" else CORRUPTION_LABELS).get(name, name)


def _ch07_nets(col: pd.Series) -> list:
    present = list(dict.fromkeys(col))
    return [n for n in CH07_NETWORK_ORDER if n in present] + [n for n in present if n not in CH07_NETWORK_ORDER]


def ch07_accuracy_figure(acc: pd.DataFrame, chance: float):
    """Accuracy per freeze mode at the reference corruption, one panel per network, 95% bars over seeds cut to
    [0, 1] (``acc``: real_data.accuracy_table): task A before and after stage 2, and task B. Drawn at the column
    width with text of at least 9 pt; colours from :mod:`bnstudy.style`."""
    nets = _ch07_nets(acc["network"])
    metrics = {"task_a_before": "task A before", "task_a_after": "task A after", "task_b": "task B"}
    colors = (style.GREY, style.VERMILLION, style.BLUE)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(1, len(nets), figsize=(style.COLUMN_WIDTH_IN, 3.6), sharey=True, squeeze=False)
        for ax, net in zip(axes[0], nets):
            g = acc[acc["network"] == net]
            modes = [m for m in MODE_ORDER if m in set(g["mode"])]
            for k, (metric, label) in enumerate(metrics.items()):
                h = g[g["metric"] == metric].set_index("mode").loc[modes]
                lo, hi = h["ci_low"].clip(0, 1), h["ci_high"].clip(0, 1)
                x = np.arange(len(modes)) + (k - 1) * 0.22
                ax.errorbar(x, h["mean"], yerr=[h["mean"] - lo, hi - h["mean"]], fmt="o", ms=4, capsize=2,
                            label=label, color=colors[k], mfc="none" if metric == "task_a_before" else None,
                            zorder=3 + k)
            ax.axhline(chance, color=style.REFERENCE["chance"], ls=":", lw=1, label="chance")
            ax.set_xticks(range(len(modes)))
            ax.set_xticklabels(modes, rotation=90)
            ax.set_title(_ch07_label(net)); ax.set_ylim(0, 1.02)
        axes[0][0].set_ylabel("held-out accuracy")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0, 1, 0.88))
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), bbox_to_anchor=(0.5, 1.0), frameon=False)
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def ch07_effects_figure(eff: pd.DataFrame):
    """Cost (task A) and benefit (task B) of drifting statistics, each ``train_mode - backbone_eval``, against
    corruption severity: rows are corruptions, columns networks (``eff``: real_data.effects_table); bars are its
    intervals (the network's condition family), cut to [-1, 1]. Severity 0 (no corruption) is drawn in every row.
    Drawn at the column width with text of at least 9 pt (five rows of three panels: five columns would shrink it)."""
    nets = _ch07_nets(eff["network"])
    present = [c for c in dict.fromkeys(eff["corruption"]) if c != "none"]
    corrs = [c for c in CH07_CORRUPTION_ORDER if c in present] + [c for c in present if c not in CH07_CORRUPTION_ORDER]
    sevs = sorted(set(int(v) for v in eff["severity"]))
    colors = {"cost": style.EFFECTS["cost"], "benefit": style.EFFECTS["benefit"]}
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(len(corrs), len(nets), figsize=(style.COLUMN_WIDTH_IN, 1.75 * len(corrs) + 1.0),
                                 sharex=True, sharey=True, squeeze=False)
        for i, corr in enumerate(corrs):
            for j, net in enumerate(nets):
                ax = axes[i][j]
                g = eff[(eff["network"] == net) & eff["corruption"].isin(["none", corr])]
                for name in ("cost", "benefit"):
                    h = g[g["effect"] == name].sort_values("severity")
                    lo, hi = h["ci_low"].clip(-1, 1), h["ci_high"].clip(-1, 1)
                    ax.errorbar(h["severity"], h["mean"], yerr=[h["mean"] - lo, hi - h["mean"]], fmt="o-", ms=3,
                                capsize=2, lw=1, color=colors[name],
                                label=f"{name} (task {'A' if name == 'cost' else 'B'})")
                ax.axhline(0, color=style.REFERENCE["zero"], lw=0.6)
                if i == 0:
                    ax.set_title(_ch07_label(net))
                if j == 0:
                    label = _ch07_label(corr, "corruption")
                    if corr == "inversion":  # its x axis is not monotone in pixel statistics: give the mix s
                        from .data import SEVERITY_LEVELS
                        shown = [v for v in sevs if v > 0]
                        label += "\n(s = " + ", ".join(f"{SEVERITY_LEVELS['inversion'][v - 1]:g}" for v in shown) + ")"
                    ax.set_ylabel(label)
                if i == len(corrs) - 1:
                    ax.set_xlabel("severity")
                ax.set_xticks(sevs)
        # accuracy differences live in [-1, 1]
        axes[0][0].set_ylim(max(-1.05, axes[0][0].get_ylim()[0]), min(1.05, axes[0][0].get_ylim()[1]))
        fig.supylabel("train_mode − backbone_eval (accuracy)")
        h, lab = axes[0][0].get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        fig.legend(h, lab, loc="upper center", ncol=2, bbox_to_anchor=(0.5, 1.0), frameon=False)
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def ch07_mismatch_figure(cond: pd.DataFrame, rho: dict | None = None):
    """Cost of drifting statistics against the statistics mismatch measured before stage 2, one panel per
    network, one point per corruption and severity (``cond``: real_data.condition_table): x the median
    mismatch over seeds with its quartiles as horizontal bars, y the mean cost (task A, ``train_mode -
    backbone_eval``) with its interval (the network's condition family); each
    corruption's points joined in severity order from the uncorrupted point. ``rho``: optional ``{network:
    Interval or float}`` (Spearman rho) written in each panel's title. Corruptions differ in colour and marker."""
    nets = _ch07_nets(cond["network"])
    present = list(dict.fromkeys(cond["corruption"]))
    corrs = [c for c in ("none",) + CH07_CORRUPTION_ORDER if c in present] + \
        [c for c in present if c not in ("none",) + CH07_CORRUPTION_ORDER]
    # one warm hue only (orange): brightness, Gaussian noise and inversion were orange, vermilion and tan before
    colors = {c: style.color("shift", c) for c in corrs}  # the same colour per kind of shift as chapter 3's
    markers = dict(zip(corrs, "osD^vPX*"))
    rc = plt.rc_context(style.rc())
    rc.__enter__()
    ncol = 2 if len(nets) > 1 else 1
    nrow = -(-(len(nets) + 1) // ncol) if len(nets) > 1 else 1
    fig, grid = plt.subplots(nrow, ncol, figsize=(style.COLUMN_WIDTH_IN, 3.3 * nrow), sharey=True, squeeze=False)
    flat = [a for row in grid for a in row]
    axes = [flat[:len(nets)]]
    for ax in flat[len(nets):]:
        ax.axis("off")
    for ax, net in zip(axes[0], nets):
        g = cond[cond["network"] == net]
        none = g[g["corruption"] == "none"]
        for corr in corrs:
            h = g[g["corruption"] == corr].sort_values("severity")
            if corr != "none":
                line = pd.concat([none, h])
                ax.plot(line["mismatch_kl"], line["cost"], "-", lw=0.7, color=colors[corr], alpha=0.6)
            xerr = None
            if "mismatch_kl_q25" in h:
                xerr = [h["mismatch_kl"] - h["mismatch_kl_q25"], h["mismatch_kl_q75"] - h["mismatch_kl"]]
            ax.errorbar(h["mismatch_kl"], h["cost"], yerr=[h["cost"] - h["cost_lo"].clip(-1, 1),
                                                           h["cost_hi"].clip(-1, 1) - h["cost"]],
                        xerr=xerr, fmt=markers[corr], ms=5, capsize=2, lw=0.8, color=colors[corr],
                        label=_ch07_label(corr, "corruption"))
        ax.set_xscale("log"); ax.axhline(0, color="black", lw=0.6)
        ax.grid(False, axis="x")  # a vertical gridline next to the left spine read as a doubled axis line
        title = _ch07_label(net)
        if rho is not None and net in rho:
            r = rho[net]
            if hasattr(r, "low"):
                r = r.clipped(-1, 1)  # a correlation lies in [-1, 1]; a t interval over few seeds can overshoot
            title += (f"\nper-seed Spearman ρ {r.mean:.2f} [{r.low:.2f}, {r.high:.2f}]" if hasattr(r, "low")
                      else f"\nSpearman ρ = {r:.2f}")
        ax.set_title(title, fontsize=10)
        # ticks at 1, 2 and 5 per decade, plain numbers (a narrow log range otherwise labels every minor tick);
        # major and minor ticks of one length, so that their labels sit at one height
        ax.xaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(2, 5)))
        ax.tick_params(axis="x", which="both", labelsize=style.MIN_FONT_PT, length=3.5, width=0.8)
        for fmt in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
            fmt(matplotlib.ticker.FormatStrFormatter("%.2g"))
        ax.set_xlabel("median mismatch KL over seeds (nats)")
    # accuracy differences live in [-1, 1]; t intervals over few seeds can overshoot
    axes[0][0].set_ylim(max(-1.05, axes[0][0].get_ylim()[0]), min(1.05, axes[0][0].get_ylim()[1]))
    for ax in grid[:, 0]:
        ax.set_ylabel("cost: task A, train_mode\n− backbone_eval (accuracy)")
    h, lab = axes[0][0].get_legend_handles_labels()
    spare = flat[len(nets)] if len(flat) > len(nets) else None
    (spare or axes[0][-1]).legend(h, lab, title="corruption", loc="center" if spare is not None else "best")
    fig.tight_layout()
    rc.__exit__(None, None, None)
    return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


# --- chapters 1 and 2, issue 10: the head's optimizer swept, training budget, trap 3's dropout, trap 5's loss,
# --- training on class-sorted batches; and a floor on text size -------------------------------------------------

def min_text_size(fig: plt.Figure, size: float = 9.0) -> plt.Figure:
    """Raise every text of ``fig`` (labels, ticks, legends, annotations) below ``size`` points to ``size``."""
    for t in fig.findobj(matplotlib.text.Text):
        if t.get_fontsize() < size:
            t.set_fontsize(size)
    return fig


def _mean_ci_bar(ax, x, values, color, **kw):
    iv = _interval(values)
    ax.errorbar([x], [iv.mean], yerr=[[iv.mean - iv.low], [iv.high - iv.mean]], fmt="D", color=color, ms=6,
                capsize=5, lw=1.6, zorder=4, **kw)


def _ci_text(mean, lo, hi, n, min_seeds=3, digits=3) -> str:
    if n < min_seeds:
        return f"{mean:.{digits}f} (range of {n} seeds)"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def dropout_figure(t3: pd.DataFrame, tuned: pd.DataFrame, chosen: dict, chance: float, chance_factor: float = 1.5):
    """Chapter 2, trap 3: the main head's task-B accuracy, at the run line's rate and tuned on validation data.

    ``t3``: tidy ``seed, case, task_b_main, lr, steps`` (the audited runs); ``tuned``: tidy ``seed, setup,
    lr, steps, val_main, task_b_main`` (the learning-rate sweep); ``chosen``: setup -> the rate chosen on
    validation accuracy. (a) the run line's rate and budget; (b) test accuracy at the chosen rates; (c) mean
    validation accuracy against the rate, 95% Student-t bands over seeds, chosen rates starred.
    Grey lines join one seed's runs; black diamonds are means with 95% Student-t intervals; ``chance``
    dotted in every panel. The fix with dropout off is not drawn: for the main head it equals the
    whole-model run by construction. Dash-dotted: ``chance_factor`` x chance, the line the page's "about
    chance" rule tests against. (c) also draws the fix's auxiliary head (``val_aux``: the same run's
    linear head on the same features, without dropout) when ``tuned`` has it. (a) and (b) share the y axis.
    Returns the figure.
    """
    setups = ["whole_model", "backbone_only"]
    names = {"whole_model": "whole model\npinned", "backbone_only": "backbone pinned\n(the fix)"}
    colors = {"whole_model": style.MODES["all_eval"], "backbone_only": style.MODES["backbone_eval"]}
    fig = plt.figure(figsize=(6.6, 6.4))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.05], hspace=0.55, wspace=0.35)
    ax_a = fig.add_subplot(grid[0, 0])
    ax_c, ax_b = fig.add_subplot(grid[0, 1], sharey=ax_a), fig.add_subplot(grid[1, :])

    def paired_panel(ax, piv, title):
        for _, row in piv.iterrows():
            ax.plot(range(len(setups)), row.values, "-o", color="0.6", alpha=0.6, ms=3)
        for i, c in enumerate(setups):
            _mean_ci_bar(ax, i + 0.12, piv[c], "black")
        ax.axhline(chance, color="0.4", ls=":", lw=1)
        ax.axhline(chance_factor * chance, color="0.4", ls="-.", lw=1)
        ax.text(-0.35, chance, "chance", color="0.4", ha="left", va="top", fontsize=9)
        ax.text(-0.35, chance_factor * chance, f"{chance_factor:g} x chance", color="0.4", ha="left",
                va="bottom", fontsize=9)
        ax.set_xticks(range(len(setups))); ax.set_xticklabels([names[c] for c in setups])
        ax.set_xlim(-0.4, len(setups) - 0.5); ax.set_ylim(0, 1); ax.set_title(title)

    run = t3[t3["case"].isin(setups)]
    paired_panel(ax_a, run.pivot(index="seed", columns="case", values="task_b_main")[setups],
                 f"(a) lr {run['lr'].iloc[0]:g}, {int(run['steps'].iloc[0]):,} steps")
    ax_a.set_ylabel("task-B test accuracy,\nmain head")
    plt.setp(ax_c.get_yticklabels(), visible=False)
    at = pd.concat([tuned[(tuned["setup"] == s) & (tuned["lr"] == chosen[s])] for s in setups])
    paired_panel(ax_c, at.pivot(index="seed", columns="setup", values="task_b_main")[setups],
                 f"(b) chosen rates, {int(tuned['steps'].iloc[0]):,} steps")
    for s in setups:
        c = _curve(tuned[tuned["setup"] == s], "lr", "val_main")
        ax_b.plot(c["lr"], c["mean"], "-o", ms=4, color=colors[s], label=names[s].replace("\n", " "))
        ax_b.fill_between(c["lr"], c["lo"], c["hi"], color=colors[s], alpha=0.2)
        best = c[c["lr"] == chosen[s]]
        ax_b.plot(best["lr"], best["mean"], "*", ms=14, color=colors[s], mec="black", zorder=5)
    if "val_aux" in tuned and tuned["val_aux"].notna().any():
        c = _curve(tuned[tuned["setup"] == "backbone_only"], "lr", "val_aux")
        ax_b.plot(c["lr"], c["mean"], "--^", ms=4, color=style.SKY, label="the fix's auxiliary head (no dropout)")
        ax_b.fill_between(c["lr"], c["lo"], c["hi"], color=style.SKY, alpha=0.15)
    ax_b.axhline(chance, color="0.4", ls=":", lw=1, label="chance")
    ax_b.set_xscale("log")
    ax_b.set_ylim(0, 1)
    ax_b.set_xlabel("learning rate (SGD, momentum 0.9); star: chosen")
    ax_b.set_ylabel("task-B validation\naccuracy")
    ax_b.set_title(f"(c) validation accuracy after {int(tuned['steps'].iloc[0]):,} steps")
    ax_b.legend(fontsize=9, loc="upper left", ncol=2)
    return min_text_size(fig)


def batch_loss_figure(t5: pd.DataFrame, min_batch: int, tolerance: float | None = None):
    """Chapter 2, trap 5: train-mode minus eval-mode accuracy (negative: train mode loses) per per-device batch size.

    ``t5``: tidy ``seed, device_batch_size, module_eval_accuracy, module_train_accuracy,
    min_values_per_channel``. Mean and 95% Student-t interval of the paired difference; the top axis
    gives the values per channel of the last BatchNorm (m x H x W: a candidate effective count, not
    tested here); shaded: where the lint fires; ``tolerance``: a dashed line at minus the loss tolerance.
    Bottom panel: the same, zoomed on batches from 4 on, where the lower ends are read against the
    tolerance. Returns the figure.
    """
    from matplotlib.ticker import NullLocator
    d = t5.assign(loss=t5["module_train_accuracy"] - t5["module_eval_accuracy"])
    c = _curve(d, "device_batch_size", "loss")
    bs = c["device_batch_size"].tolist()
    fig, (ax, zx) = plt.subplots(2, 1, figsize=(6.6, 5.6), sharex=True, gridspec_kw={"height_ratios": [1, 1]})
    for a, zoom in ((ax, False), (zx, True)):
        a.axvspan(0.8, min_batch, color="0.9", zorder=0, label=f"lint fires (batch < {min_batch})")
        a.axhline(0, color="0.4", lw=1)
        if tolerance is not None:
            a.axhline(-tolerance, color="0.3", ls="--", lw=1, label=f"tolerance -{tolerance:g}")
        a.errorbar(c["device_batch_size"], c["mean"], yerr=[c["mean"] - c["lo"], c["hi"] - c["mean"]], fmt="s-",
                   color=style.STATISTICS["batch"], ms=4, capsize=4, label="mean, 95% CI over seeds")
        a.set_ylabel("train mode -\neval mode" + (" (zoom)" if zoom else ""))
    zoomed = c[c["device_batch_size"] >= 4]
    hi = max(float(zoomed["hi"].max()) if len(zoomed) else 0.0, 0.0)
    lo = min(float(zoomed["lo"].min()) if len(zoomed) else 0.0, -(tolerance or 0.0))
    zx.set_ylim(lo - 0.25 * (hi - lo + 1e-3), hi + 0.15 * (hi - lo + 1e-3))
    zx.set_xscale("log", base=2)
    zx.set_xticks(bs); zx.set_xticklabels([str(int(b)) for b in bs]); zx.set_xlim(0.8, max(bs) * 1.25)
    zx.xaxis.set_minor_locator(NullLocator())
    zx.set_xlabel("per-device batch size m")
    if "min_values_per_channel" in d:
        cnt = d.groupby("device_batch_size")["min_values_per_channel"].first()
        top = ax.secondary_xaxis("top")
        top.set_xticks(bs); top.set_xticklabels([f"{int(cnt[b])}" for b in bs])
        top.xaxis.set_minor_locator(NullLocator())
        top.set_xlabel("values per channel, last BatchNorm (m x H x W; not tested as the count)")
    ax.legend(loc="lower right", fontsize=9)
    return min_text_size(fig)


def sorted_training_figure(t6: pd.DataFrame, chance: float | None = None, tie_margin: float | None = None):
    """Chapter 2, trap 6: networks trained on shuffled or class-sorted batches.

    ``t6``: tidy ``seed, case, train_meter_accuracy, heldout_eval_accuracy,
    heldout_batch_stats_accuracy``. Bars: means; error bars: 95% Student-t intervals (clipped at 0, a
    small bar marks a clipped end); dots: seeds; ``chance``: a dotted line. Right panel: paired per seed,
    meter minus held-out (eval mode) for each case, and held-out accuracy class-sorted minus shuffled,
    mean and 95% Student-t interval; ``tie_margin``: the equivalence band +-margin, shaded on the
    class-sorted meter row. Row labels sit inside the lower panel, so both panels use the full width.
    Returns the figure.
    """
    qs = [("train_meter_accuracy", "training meter\n(train mode,\nits own batches)"),
          ("heldout_eval_accuracy", "held-out,\neval mode"),
          ("heldout_batch_stats_accuracy", "held-out,\ntrain mode\n(shuffled batches)")]
    cases = [c for c in ("shuffled", "class_sorted") if c in set(t6["case"])]
    fig, (ax, px) = plt.subplots(2, 1, figsize=(6.6, 6.4), gridspec_kw={"height_ratios": [2.2, 1]})
    w = 0.38
    for j, case in enumerate(cases):
        g = t6[t6["case"] == case]
        for i, (q, _) in enumerate(qs):
            iv = _interval(g[q])
            x = i + (j - 0.5) * w
            ax.bar(x, iv.mean, width=w * 0.92, color=(style.GREY, style.VERMILLION)[j], alpha=0.75,
                   label=("trained on " + case.replace("_", "-") + " batches") if i == 0 else None)
            low = max(iv.low, 0.0)
            ax.errorbar(x, iv.mean, yerr=[[iv.mean - low], [iv.high - iv.mean]], color="black", capsize=5,
                        lw=1.6, zorder=5)
            if iv.low < 0:
                ax.plot([x], [0.0], marker="v", color="black", ms=6, clip_on=False, zorder=6)
            ax.scatter(np.full(len(g), x) + 0.09, g[q], s=8, color="0.3", alpha=0.5, zorder=3)
    ax.set_xticks(range(len(qs))); ax.set_xticklabels([n for _, n in qs], fontsize=9)
    if chance is not None:
        ax.axhline(chance, color="0.4", ls=":", lw=1)
        ax.text(-0.55, chance, "chance", color="0.4", ha="left", va="bottom", fontsize=9)
    ax.set_xlim(-0.6, len(qs) - 0.4)
    ax.set_ylim(0, 1.3); ax.set_yticks(np.linspace(0, 1, 6)); ax.set_ylabel("accuracy on task A (fraction)")
    ax.legend(loc="upper center", ncol=1, fontsize=9)
    piv = {q: t6.pivot(index="seed", columns="case", values=q) for q in ("train_meter_accuracy",
                                                                          "heldout_eval_accuracy")}
    diffs = [(f"meter - held-out, trained {case.replace('_', '-')}", piv["train_meter_accuracy"][case]
              - piv["heldout_eval_accuracy"][case]) for case in cases]
    if len(cases) == 2:
        diffs.append(("held-out: trained class-sorted - shuffled", piv["heldout_eval_accuracy"]["class_sorted"]
                      - piv["heldout_eval_accuracy"]["shuffled"]))
    for i, (name, v) in enumerate(diffs):
        if tie_margin is not None and name.endswith("class-sorted") and name.startswith("meter"):
            px.fill_betweenx([i - 0.3, i + 0.3], -tie_margin, tie_margin, color=style.REFERENCE["band"], lw=0, zorder=0,
                             label=f"equivalence margin \u00b1{tie_margin:g}")
        px.scatter(v, np.full(len(v), i) + 0.18, s=8, color="0.3", alpha=0.5, zorder=3)
        iv = _interval(v)
        px.errorbar([iv.mean], [i], xerr=[[iv.mean - iv.low], [iv.high - iv.mean]], fmt="D", color="black", ms=5,
                    capsize=4, lw=1.6, zorder=4)
    px.axvline(0, color="0.4", lw=1)
    px.set_yticks([])
    lo = min(min(float(v.min()) for _, v in diffs), -(tie_margin or 0), 0.0)
    hi = max(max(float(v.max()) for _, v in diffs), tie_margin or 0, 0.0)
    px.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    for i, (name, _) in enumerate(diffs):  # each row's label above it, inside the panel
        px.text(lo - 0.03 * (hi - lo), i - 0.32, name, fontsize=9, va="bottom", ha="left")
    px.set_ylim(len(diffs) - 0.55, -0.95)
    if tie_margin is not None:
        px.legend(loc="upper right", fontsize=9)
    px.set_xlabel("paired difference per seed (accuracy): mean, 95% CI, dots = seeds")
    fig.tight_layout()
    return min_text_size(fig)


def fit_page(fig: plt.Figure, width: float = 6.6, min_size: float = 9.0) -> plt.Figure:
    """Shrink ``fig`` to at most ``width`` inches wide (aspect kept) and raise text below ``min_size`` pt.

    A figure wider than the page is scaled down by the browser, and its text with it; at most the
    page's width (about 6.6 in at 100 dpi in the book's theme), text set at 9 pt stays 9 pt.
    """
    w, h = fig.get_size_inches()
    if w > width:
        fig.set_size_inches(width, h * width / w)
    return min_text_size(fig, min_size)
