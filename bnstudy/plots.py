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
import warnings
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


def mode_strips(df: pd.DataFrame, columns: dict, chance: float | None = None, ylabel: str = "accuracy",
                interval=None, ylim=None):
    """One panel per ``columns`` item (column -> title): each seed a dot per mode, mean and 95% interval beside.

    ``interval(values) -> Interval`` computes the bars (default: Student t, :func:`bnstudy.inference.t_interval`);
    ``ylim``: the value axis' limits, where a bar cut by them ends in a triangle pointing past the axis.
    ``chance`` draws a dotted chance line in every panel. The legend sits below the panels. Returns the figure.
    """
    from matplotlib.lines import Line2D
    interval = interval or _interval
    modes = [m for m in MODE_ORDER if m in set(df["mode"])]
    fig, axes = plt.subplots(1, len(columns), figsize=(3.3 * len(columns), 4.2), sharey=True, squeeze=False)
    clipped = False
    for ax, (col, title) in zip(axes[0], columns.items()):
        sns.stripplot(data=df, x="mode", y=col, hue="mode", order=modes, palette=MODE_PALETTE, ax=ax,
                      alpha=0.55, size=5, jitter=0.15, legend=False)
        ivs = [interval(df[df["mode"] == m][col]) for m in modes]
        x = np.arange(len(modes)) + 0.3
        mean, lo, hi = (np.array([getattr(iv, a) for iv in ivs]) for a in ("mean", "low", "high"))
        if ylim is not None:
            ax.set_ylim(*ylim)
            for xi, l, h in zip(x, lo, hi):
                if l < ylim[0]:
                    ax.plot([xi], [ylim[0]], marker="v", color="black", ms=6, clip_on=False); clipped = True
                if h > ylim[1]:
                    ax.plot([xi], [ylim[1]], marker="^", color="black", ms=6, clip_on=False); clipped = True
            lo, hi = np.clip(lo, *ylim), np.clip(hi, *ylim)
        ax.errorbar(x, mean, yerr=[mean - lo, hi - mean], fmt="o", color="black", capsize=4, ms=5)
        if chance is not None:
            ax.axhline(chance, ls=":", color="grey", lw=1.2)
        ax.set_title(title); ax.set_xlabel(""); ax.set_ylabel(ylabel)
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels([m.replace("_", "_\n", 1) for m in modes])
    handles = [Line2D([], [], marker="o", ls="-", color="black", label="mean, 95% interval")]
    if chance is not None:
        handles.append(Line2D([], [], ls=":", color="grey", lw=1.2, label="chance"))
    if clipped:
        handles.append(Line2D([], [], marker="v", ls="", color="black", label="interval cut by the axis"))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), bbox_to_anchor=(0.5, 0.0), fontsize=9)
    return fig


def drift_figure(drift: pd.DataFrame, floor: pd.Series, momentum: float, gone_step: int, max_step: int = 100,
                 residual: bool = False, compare: pd.DataFrame | None = None, residual_max_step: int | None = None):
    """Weight left on task A's running_mean per layer (mean over seeds, 95% band) against ``(1-m)^t``.

    Left: steps 0 to ``max_step`` (the decay). Right: the remaining recorded steps, where each layer's
    noise floor (``floor``, RMS of the weight there) is drawn as a band of the layer's colour with edges.
    ``residual``: a bottom panel with measured minus ``(1-m)^t`` per layer (mean, 95% band) for steps 1 to
    ``residual_max_step`` (default ``max_step``) on a linear axis; ``compare`` (same columns, e.g. the weight on
    a less precise target) is drawn there as thin dotted lines (means only).
    """
    last = int(drift.step.max())
    two = last > max_step
    if residual:
        fig = plt.figure(figsize=(6.6, 7.0))
        gs = fig.add_gridspec(2, 2 if two else 1, width_ratios=[2, 1] if two else [1], height_ratios=[1.25, 1])
        ax0 = fig.add_subplot(gs[0, 0])
        axes = np.array([[ax0] + ([fig.add_subplot(gs[0, 1], sharey=ax0)] if two else [])])
        rax = fig.add_subplot(gs[1, :])
    else:
        fig, axes = plt.subplots(1, 2 if two else 1, figsize=(6.6, 4.4), sharey=True, squeeze=False,
                                 gridspec_kw=dict(width_ratios=[2, 1] if two else [1]))
    layers = sorted(drift["layer"].unique())
    pal = sns.color_palette("colorblind")  # blue, orange, purple, ...: blocks distinguishable where bands overlap
    colors = dict(zip(layers, [pal[k] for k in (0, 1, 4, 2, 3, 5, 6, 7)]))
    markers = dict(zip(layers, "os^Dv"))
    for k, ax in enumerate(axes[0]):
        show = drift[drift.step <= max_step] if k == 0 else drift[drift.step >= max_step]
        for layer in layers:
            g = interval_frame(show[show.layer == layer], "step", "weight")
            ax.plot(g.index, g["mean"], marker=markers[layer], ls="-", color=colors[layer], ms=3, label=f"{layer} (measured)")
            ax.fill_between(g.index, g["lo"], g["hi"], color=colors[layer], alpha=0.2)
            if k == len(axes[0]) - 1:
                f = floor[layer]
                ax.axhspan(-f, f, color=colors[layer], alpha=0.08, lw=0)
                for y in (-f, f):
                    ax.axhline(y, color=colors[layer], lw=0.8, ls=(0, (4, 2)))
        lo_t = 0 if k == 0 else max_step
        t = np.linspace(lo_t, max_step if k == 0 else last, 400)
        ax.plot(t, (1 - momentum) ** t, "k--", lw=1.2, label=f"$(1-m)^t$, m = {momentum:g}")
        if k == 0:
            ax.axvline(gone_step, color="grey", ls=":", lw=1)
            ax.set_ylabel("weight left on task A's running_mean")
        ax.set_yscale("symlog", linthresh=1e-2, linscale=0.5); ax.set_ylim(-0.05, 1.5)
        ax.set_xlabel("stage-2 step t (train_mode)")
    if two:
        axes[0][1].set_title("noise floor (\u00b1 RMS)", fontsize=10)
        axes[0][0].set_title("decay", fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if residual:
        top = residual_max_step or max_step
        for layer in layers:
            sub = drift[(drift.layer == layer) & (drift.step >= 1) & (drift.step <= top)]
            sub = sub.assign(res=sub["weight"] - (1 - momentum) ** sub["step"])
            g = interval_frame(sub, "step", "res")
            rax.plot(g.index, g["mean"], marker=markers[layer], ls="-", color=colors[layer], ms=3)
            rax.fill_between(g.index, g["lo"], g["hi"], color=colors[layer], alpha=0.2)
            if compare is not None:
                c = compare[(compare.layer == layer) & (compare.step >= 1) & (compare.step <= top)]
                c = c.assign(res=c["weight"] - (1 - momentum) ** c["step"]).groupby("step")["res"].mean()
                rax.plot(c.index, c.values, ls=":", lw=1.4, color=colors[layer])
        rax.axhline(0, color="k", ls="--", lw=1.2)
        rax.set_xlabel("stage-2 step t (train_mode)")
        rax.set_ylabel("measured - $(1-m)^t$")
        rax.set_title("residual (95% bands)", fontsize=10)
        if compare is not None:
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], ls=":", lw=1.4, color="0.3"))
            labels.append("residual on the 20-batch target (means)")
        fig.tight_layout(rect=(0, 0.11, 1, 1))
    else:
        fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=2, bbox_to_anchor=(0.5, 0.0), fontsize=9)
    return fig


def quantile_figure(lq: pd.DataFrame):
    """Absolute old-logit change per quantile and mode (mean over seeds, 95% band clipped at 0, since the
    quantity is non-negative); symlog axis shows zeros. Modes that coincide are drawn with distinct, nested
    markers, and the legend says which lie exactly at zero."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    styles = [("o", 9, "none"), ("s", 6.5, "none"), ("^", 4.5, None), ("x", 5, None)]
    for i, mode in enumerate([m for m in MODE_ORDER if m in set(lq["mode"])]):
        sub = lq[lq["mode"] == mode]
        g = interval_frame(sub, "quantile", "change")
        zero = bool((sub["change"] == 0).all())
        marker, ms, mfc = styles[i % len(styles)]
        ax.plot(g.index, g["mean"], marker=marker, ms=ms, mfc=mfc, ls="-", lw=1, color=MODE_PALETTE[mode],
                label=f"{mode} (all exactly 0)" if zero else mode, zorder=3 + i)
        ax.fill_between(g.index, g["lo"].clip(lower=0), g["hi"], color=MODE_PALETTE[mode], alpha=0.2)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=-2e-4)
    ax.set_xlabel("quantile over held-out images and classes"); ax.set_ylabel("|logit after - logit before|")
    ax.legend(loc="center right", fontsize=9)
    return fig


def summary_table(summary: pd.DataFrame, by: str, labels: dict, order=None, digits: int = 3) -> pd.DataFrame:
    """A display table from a long summary (columns ``metric, mean, ci_low, ci_high``): one row per ``by`` value,
    one column per metric in ``labels`` (metric -> column title), cells ``"mean [low, high]"``."""
    cell = summary.assign(value=[f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
                                 for m, lo, hi in summary[["mean", "ci_low", "ci_high"]].values])
    table = cell.pivot(index=by, columns="metric", values="value")
    table = table.loc[order if order is not None else table.index, list(labels)]
    table.columns = list(labels.values())
    return table


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

# --- chapter 6 (issue 14): routing inputs to statistic banks ------------------------------------------------------

CH06_CONDITIONS = ("nearest_first", "nearest_all", "classifier", "mixture", "oracle", "train_mode", "pinned")
# distinct hues (tab10) and markers, so that no two series differ by shade alone
CH06_PALETTE = style.palette("router", CH06_CONDITIONS)
CH06_MARKERS = dict(zip(CH06_CONDITIONS, ("o", "^", "s", "D", "*", "v", "P")))
CH06_AXIS_LABEL = "shift strength t (levels, not to scale)"


def _ch06_positions(strengths) -> dict:
    """Strengths at evenly spaced x positions (they span zero to orders of magnitude apart): a categorical axis."""
    return {t: i for i, t in enumerate(sorted(set(strengths)))}


def _ch06_axis(ax, pos, label=CH06_AXIS_LABEL):
    ax.set_xticks(list(pos.values()))
    ax.set_xticklabels([f"{t:g}" for t in pos], rotation=45)
    ax.set_xlabel(label)


def _ch06_errorbar(ax, x, f, name, label=None, color=None, marker=None, ls="-"):
    ax.errorbar(x, f["mean"], yerr=[f["mean"] - f["lo"], f["hi"] - f["mean"]], fmt=marker or CH06_MARKERS[name],
                ls=ls, ms=4, capsize=2, color=color or CH06_PALETTE[name], label=label or name)


def _ch06_clip(f: pd.DataFrame, low: float, high: float) -> pd.DataFrame:
    """Interval ends cut to what the quantity allows (accuracy [0, 1], a difference [-1, 1]), for drawing."""
    return f.assign(lo=f["lo"].clip(low, high), hi=f["hi"].clip(low, high))


def _ch06_finish(fig, axes_with_legend, ncol=3, bottom=-0.02):
    """One legend under the figure, fonts at least :data:`style.MIN_FONT_PT`, at the column width."""
    h, lab = axes_with_legend.get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(h, lab, loc="upper center", ncol=ncol, frameon=False, bbox_to_anchor=(0.5, bottom))
    return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def routing_figure(table: pd.DataFrame, routers=("nearest_first", "nearest_all", "classifier")):
    """Routing accuracy (mean, 95% band over seeds, clipped to [0, 1]) against shift strength, one line per
    inference batch size; rows: number of tasks, columns: routers (``table``: unknown_task.routing_table). Chance
    (1/K) dotted. The mixture is left out by default: its heaviest bank is ``nearest_first``'s choice, so its
    routing accuracy is that column again. The strength axis is categorical (levels, not to scale). Drawn at the
    column width with text of at least 9 pt."""
    ks = sorted(table.n_tasks.unique())
    batches = sorted(table.inference_batch.unique())
    colors = style.sequential(batches)
    pos = _ch06_positions(table.strength)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(len(ks), len(routers), figsize=(style.COLUMN_WIDTH_IN, 2.6 * len(ks) + 0.6),
                                 sharey=True, sharex=True, squeeze=False)
        for r, k in enumerate(ks):
            for c, name in enumerate(routers):
                ax = axes[r][c]
                for b in batches:
                    g = table[(table.n_tasks == k) & (table.condition == name) & (table.inference_batch == b)]
                    f = _ch06_clip(interval_frame(g, "strength", "routing_accuracy").reset_index(), 0, 1)
                    x = f.strength.map(pos)
                    ax.plot(x, f["mean"], "o-", ms=3, color=colors[b], label=f"batch {b}")
                    ax.fill_between(x, f["lo"], f["hi"], color=colors[b], alpha=0.2, lw=0)
                ax.axhline(1 / k, color=style.REFERENCE["chance"], ls=":", lw=1, label="chance (1/K)")
                ax.set_title(f"{name}\n{k} tasks")
                ax.set_xticks(list(pos.values()))
                ax.set_xticklabels([f"{t:g}" for t in pos], rotation=90)
            axes[r][0].set_ylabel("routing accuracy")
        for ax in axes[-1]:
            ax.set_xlabel("strength t")
        return _ch06_finish(fig, axes[0][0], ncol=4)


def router_accuracy_figure(df: pd.DataFrame, inference_batch: int = 1):
    """Task accuracy per router and baseline against shift strength, one decision per ``inference_batch``:
    columns task A and the mean of the new tasks (the two differ in level, so a mean over all tasks would show
    composition), rows: number of tasks. ``df``: unknown_task.run's table (per task). Per seed the new tasks
    are averaged first; points are means, bars 95% Student-t intervals over seeds (clipped to [0, 1]); series are
    offset slightly. Drawn at the column width with text of at least 9 pt."""
    d = df[(df.inference_batch == inference_batch) & df.condition.isin(CH06_CONDITIONS)]
    d = d.assign(group=np.where(d.task == "A", "task A", "new tasks (mean)"))
    per_seed = d.groupby(["seed", "n_tasks", "strength", "condition", "group"])["accuracy"].mean().reset_index()
    ks = sorted(per_seed.n_tasks.unique())
    pos = _ch06_positions(per_seed.strength)
    groups = ("task A", "new tasks (mean)")
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(len(ks), 2, figsize=(style.COLUMN_WIDTH_IN, 2.8 * len(ks) + 0.9), sharex=True,
                                 squeeze=False)
        for r, k in enumerate(ks):
            for c, grp in enumerate(groups):
                ax = axes[r][c]
                for i, name in enumerate(CH06_CONDITIONS):
                    sel = per_seed[(per_seed.n_tasks == k) & (per_seed.condition == name) & (per_seed.group == grp)]
                    f = _ch06_clip(interval_frame(sel, "strength", "accuracy").reset_index(), 0, 1)
                    x = f.strength.map(pos) + (i - 3) * 0.05
                    _ch06_errorbar(ax, x, f, name, ls="--" if name in ("oracle", "train_mode", "pinned") else "-")
                ax.set_title(f"{grp}, {k} tasks")
                ax.set_xticks(list(pos.values()))
                ax.set_xticklabels([f"{t:g}" for t in pos], rotation=90)
            axes[r][0].set_ylabel("accuracy\n(task's own head)")
        for ax in axes[-1]:
            ax.set_xlabel(CH06_AXIS_LABEL)
        return _ch06_finish(fig, axes[0][0], ncol=4, bottom=-0.01)


def routing_cost_figure(routes: pd.DataFrame, gaps: pd.DataFrame, routed: pd.DataFrame, margin: float,
                        inference_batches=(1, 32), part: str = "cost"):
    """Where routing fails and what that costs, on one categorical strength axis; columns: number of tasks. Two
    figures of two rows each (eight panels in one would shrink the text below 9 pt at the column width):

    ``part="cost"``: (a) the cost of a wrong bank, ``train_mode - oracle`` and ``pinned - oracle`` (``gaps``:
    gap_table; negative where the wrong bank loses); (b) router minus oracle with the task's own head, one decision
    per sample, zoomed, the equivalence band ``±margin`` shaded.
    ``part="unknown"``: (a) ``nearest_first`` routing accuracy at ``inference_batches`` (``routes``:
    routing_table), the 0.9 line dashed; (b) the fully task-unknown case, ``nearest_first`` picking bank and head,
    minus the oracle, per inference batch (``routed``: routed_head_table).
    Means and 95% Student-t intervals over seeds (paired differences), clipped to what the quantity allows.
    Returns the figure. Raises ``ValueError`` for another ``part``."""
    if part not in ("cost", "unknown"):
        raise ValueError(f"routing_cost_figure: part must be 'cost' or 'unknown', got {part!r}")
    ks = sorted(gaps.n_tasks.unique())
    pos = _ch06_positions(gaps.strength)
    b1 = min(gaps.inference_batch)
    batches = sorted(routed.inference_batch.unique())
    bcolors = style.sequential(batches)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(2, len(ks), figsize=(style.COLUMN_WIDTH_IN, 6.4), sharex=True, squeeze=False)
        for c, k in enumerate(ks):
            if part == "cost":
                ax = axes[0][c]
                for i, name in enumerate(("train_mode", "pinned")):
                    f = gaps[(gaps.n_tasks == k) & (gaps.condition == name) & (gaps.inference_batch == b1)
                             ].sort_values("strength").rename(columns={"ci_low": "lo", "ci_high": "hi"})
                    _ch06_errorbar(ax, f.strength.map(pos) + (i - 0.5) * 0.08, _ch06_clip(f, -1, 1), name,
                                   label=f"{name} - oracle")
                ax.axhline(0, color=style.REFERENCE["zero"], lw=0.6)
                ax.set_title(f"(a) wrong bank, {k} tasks")
                ax = axes[1][c]
                ax.axhspan(-margin, margin, color=style.REFERENCE["band"], zorder=0, label=f"margin ±{margin:g}")
                for i, name in enumerate(("nearest_first", "nearest_all", "classifier", "mixture")):
                    f = gaps[(gaps.n_tasks == k) & (gaps.condition == name) & (gaps.inference_batch == b1)
                             ].sort_values("strength").rename(columns={"ci_low": "lo", "ci_high": "hi"})
                    _ch06_errorbar(ax, f.strength.map(pos) + (i - 1.5) * 0.07, _ch06_clip(f, -1, 1), name,
                                   label=f"{name} - oracle")
                ax.axhline(0, color=style.REFERENCE["zero"], lw=0.6)
                ax.set_ylim(-1.6 * margin, 1.6 * margin)
                ax.set_title(f"(b) router - oracle (zoom), {k} tasks")
            else:
                ax = axes[0][c]
                for b in inference_batches:
                    g = routes[(routes.n_tasks == k) & (routes.condition == "nearest_first")
                               & (routes.inference_batch == b)]
                    f = _ch06_clip(interval_frame(g, "strength", "routing_accuracy").reset_index(), 0, 1)
                    _ch06_errorbar(ax, f.strength.map(pos), f, "nearest_first", label=f"nearest_first, batch {b}",
                                   color=bcolors.get(b, style.GREY))
                ax.axhline(0.9, color=style.REFERENCE["chance"], ls="--", lw=1, label="0.9 (routing works)")
                ax.axhline(1 / k, color=style.GREY, ls=":", lw=1, label="chance (1/K)")
                ax.set_title(f"(a) routing accuracy, {k} tasks")
                ax = axes[1][c]
                for i, b in enumerate(batches):
                    f = routed[(routed.n_tasks == k) & (routed.condition == "nearest_first")
                               & (routed.inference_batch == b)].sort_values("strength").rename(
                        columns={"ci_low": "lo", "ci_high": "hi"})
                    _ch06_errorbar(ax, f.strength.map(pos) + (i - 1.5) * 0.07, _ch06_clip(f, -1, 1), "nearest_first",
                                   color=bcolors[b], label=f"routed head, batch {b}")
                ax.axhline(0, color=style.REFERENCE["zero"], lw=0.6)
                ax.set_title(f"(b) routed head - oracle, {k} tasks")
            ax.set_xticks(list(pos.values()))
            ax.set_xticklabels([f"{t:g}" for t in pos], rotation=90)
            ax.set_xlabel("strength t")
        labels = (["wrong bank - oracle\n(accuracy)", "router - oracle\n(accuracy)"] if part == "cost" else
                  ["routing accuracy", "routed head - oracle\n(accuracy)"])
        for r, lab in enumerate(labels):
            axes[r][0].set_ylabel(lab)
        fig.tight_layout()
        for r in range(2):
            h, l = axes[r][0].get_legend_handles_labels()
            axes[r][-1].legend(h, l, loc="best", fontsize=style.MIN_FONT_PT)
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def temperature_figure(table: pd.DataFrame, kept: float):
    """The mixture's temperature check: paired mixture minus oracle (mean, 95% interval over the held-out seeds)
    against the temperature (log axis), one line per shift strength (``table``: unknown_task.temperature_table);
    the kept temperature marked by a dotted vertical line. Returns the figure."""
    ks = sorted(table.n_tasks.unique())
    strengths = sorted(table.strength.unique())
    colors = style.sequential(strengths)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(1, len(ks), figsize=(style.COLUMN_WIDTH_IN, 3.4), squeeze=False)
        for ax, k in zip(axes[0], ks):
            for t in strengths:
                f = table[(table.n_tasks == k) & (table.strength == t)].sort_values("temperature")
                lo, hi = f["ci_low"].clip(-1, 1), f["ci_high"].clip(-1, 1)
                ax.errorbar(f.temperature, f["mean"], yerr=[f["mean"] - lo, hi - f["mean"]],
                            fmt="o-", ms=4, capsize=2, color=colors[t], label=f"t = {t:g}")
            ax.axvline(kept, color=style.REFERENCE["chance"], ls=":", lw=1)
            ax.axhline(0, color=style.REFERENCE["zero"], lw=0.6)
            ax.set_xscale("log")
            ax.set_xlabel("temperature τ (nats, log)")
            ax.set_title(f"{k} tasks, per sample")
        axes[0][0].set_ylabel("mixture - oracle\n(accuracy)")
        axes[0][-1].legend(fontsize=style.MIN_FONT_PT)
        fig.tight_layout()
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


# --- chapter 4 (issue 12): heads and optimizers -------------------------------------------------------------------

OPTIMIZER_PALETTE = style.palette("optimizer", ("sgd", "sgd_plain", "adam"))
OPTIMIZER_LABELS = {"sgd": "SGD + momentum 0.9", "sgd_plain": "plain SGD", "adam": "Adam"}
#: Chapter 4's figures: drawn at the column width with text of at least the book's minimum (bnstudy.style).
_CH4_WIDTH, _CH4_MIN_PT = style.COLUMN_WIDTH_IN - 0.3, style.MIN_FONT_PT  # a margin for the tight bounding box


def _dodge(n: int, width: float = 0.6) -> np.ndarray:
    return (np.arange(n) - (n - 1) / 2) * (width / max(n, 1))


def gap_figure(gaps: pd.DataFrame, shift_labels: dict, margin: float):
    """Chapter 4: the gap ``task_b(separate_stats) - task_b(backbone_eval)`` per head (x) and optimizer (colour),
    one panel per shift, with the table's (Bonferroni, per shift) intervals cut to [-1, 1] and the equivalence band
    ``±margin``; the legend below the panels, clear of the whiskers. ``gaps``:
    :func:`bnstudy.experiments.heads.gap_table`'s output."""
    shifts = [s for s in shift_labels if s in set(gaps["shift"])]
    heads = list(dict.fromkeys(gaps["head"]))
    opts = [o for o in OPTIMIZER_PALETTE if o in set(gaps["optimizer"])]
    fig, axes = plt.subplots(1, len(shifts), figsize=(_CH4_WIDTH, 3.4), sharey=True, squeeze=False)
    off = _dodge(len(opts))
    ends = [margin, -margin]
    for ax, s in zip(axes[0], shifts):
        ax.axhspan(-margin, margin, color="grey", alpha=0.15, lw=0, label=f"±{margin:g} (equivalence margin)")
        ax.axhline(0, color="black", lw=0.8)
        for k, o in enumerate(opts):
            g = gaps[(gaps["shift"] == s) & (gaps["optimizer"] == o)].set_index("head").reindex(heads)
            x = np.arange(len(heads)) + off[k]
            est = g["estimate"].clip(-1, 1)
            lo, hi = g["low"].clip(-1, 1).fillna(est), g["high"].clip(-1, 1).fillna(est)  # no interval: a point
            ends += [float(v) for v in pd.concat([lo, hi]).dropna()]
            ax.errorbar(x, est, yerr=[est - lo, hi - est], fmt="o", capsize=2.5,
                        color=OPTIMIZER_PALETTE[o], label=OPTIMIZER_LABELS[o], ms=4)
        ax.set_xticks(range(len(heads)), heads, rotation=45, ha="right", rotation_mode="anchor")
        ax.set_title(shift_labels[s])
    lo, hi = min(ends), max(ends)  # the axis spans the clipped intervals (at most [-1, 1]) and the band
    pad = 0.06 * (hi - lo)
    axes[0][0].set_ylim(max(lo - pad, -1.02), min(hi + pad, 1.02))
    axes[0][0].set_ylabel("task-B accuracy difference\n(separate_stats - backbone_eval)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=_CH4_MIN_PT, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    return min_text_size(fig, _CH4_MIN_PT)


def head_accuracy_figure(acc: pd.DataFrame, shift_labels: dict, metric: str = "task_b",
                         modes=("backbone_eval", "all_eval", "separate_stats")):
    """Chapter 4: ``metric`` per head (x) and freeze mode (colour), rows = shifts, columns = optimizers, with
    95% intervals over seeds. ``acc``: :func:`bnstudy.experiments.heads.accuracy_table`'s output. ``modes``: the
    series drawn; by default not ``train_mode``, whose task-B accuracy equals ``separate_stats``' in every run
    (a check of the code, glued on the page), so drawing both would only hide one behind the other."""
    a = acc[acc["metric"] == metric]
    shifts = [s for s in shift_labels if s in set(a["shift"])]
    opts = [o for o in OPTIMIZER_PALETTE if o in set(a["optimizer"])]
    heads = list(dict.fromkeys(a["head"]))
    modes = [m for m in MODE_ORDER if m in set(a["mode"]) and m in modes]
    fig, axes = plt.subplots(len(shifts), len(opts), figsize=(_CH4_WIDTH, 2.3 * len(shifts) + 0.9),
                             sharey=True, sharex=True, squeeze=False)
    off = _dodge(len(modes), 0.6)
    for i, s in enumerate(shifts):
        for j, o in enumerate(opts):
            ax = axes[i][j]
            for k, m in enumerate(modes):
                g = a[(a["shift"] == s) & (a["optimizer"] == o) & (a["mode"] == m)].set_index("head").reindex(heads)
                label = m + (" (= train_mode)" if m == "separate_stats" and "train_mode" not in modes else "")
                ax.errorbar(np.arange(len(heads)) + off[k], g["mean"], yerr=[g["mean"] - g["ci_low"],
                            g["ci_high"] - g["mean"]], fmt="o", ms=4, capsize=2, color=MODE_PALETTE[m], label=label)
            ax.set_xticks(range(len(heads)), heads, rotation=45, ha="right", rotation_mode="anchor")
            if i == 0:
                ax.set_title(OPTIMIZER_LABELS[o])
            if j == 0:
                ax.set_ylabel(f"task-B accuracy\n{shift_labels[s]}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.45 / (2.3 * len(shifts) + 0.9), 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=_CH4_MIN_PT, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    return min_text_size(fig, _CH4_MIN_PT)


#: Chapter 4: line and marker per mode, so that modes with equal values (``all_eval`` = ``backbone_eval`` for a
#: head without BatchNorm) stay visible and close colours stay apart.
CH4_MODE_STYLE = {"backbone_eval": dict(ls="-", marker="o", ms=5), "all_eval": dict(ls=":", marker="s", ms=3),
                  "separate_stats": dict(ls="--", marker="^", ms=4.5)}


def lr_search_figure(search: pd.DataFrame, chosen: dict, modes=("backbone_eval", "all_eval", "separate_stats")):
    """Chapter 4: validation accuracy (mean over the tuning seeds) against the learning rate, one panel per head
    (rows) and optimizer (columns), one line per mode in ``modes`` (``train_mode`` left out: on task B it equals
    ``separate_stats``), each mode's chosen rate ringed; dashed grey: the mean over the four modes (the
    mode-averaged rule's criterion). ``search``: :func:`bnstudy.experiments.heads.search_table`; ``chosen``:
    ``{(head, optimizer, mode): lr}`` (or ``{(head, optimizer): lr}``, ringed on the mean line)."""
    opts = [o for o in OPTIMIZER_PALETTE if o in set(search["optimizer"])]
    heads = list(dict.fromkeys(search["head"]))
    fig, axes = plt.subplots(len(heads), len(opts), figsize=(_CH4_WIDTH, 1.9 * len(heads) + 1.0),
                             sharey=True, squeeze=False)
    for i, h in enumerate(heads):
        for j, o in enumerate(opts):
            ax = axes[i][j]
            g = search[(search["optimizer"] == o) & (search["head"] == h)]
            for m in (*modes, "mean"):
                c = g[g["mode"] == m].sort_values("lr")
                if not len(c):
                    continue
                style = dict(color="0.5", ls="--", marker="", lw=1) if m == "mean" else \
                    dict(color=MODE_PALETTE[m], lw=1.2, **CH4_MODE_STYLE.get(m, dict(ls="-", marker="o", ms=3.5)))
                label = "mean over modes" if m == "mean" else m + (" (= train_mode)" if m == "separate_stats" else "")
                ax.plot(c["lr"], c["val_accuracy"], label=label, **style)
                lr = chosen.get((h, o, m), chosen.get((h, o)) if m == "mean" else None)
                sel = c[c["lr"] == lr]
                ax.plot(sel["lr"], sel["val_accuracy"], "o", ms=10, mfc="none",
                        color=style["color"])
            ax.set_xscale("log")
            ax.minorticks_off()
            if i == 0:
                ax.set_title(OPTIMIZER_LABELS[o])
            if i == len(heads) - 1:
                ax.set_xlabel("learning rate")
            if j == 0:
                ax.set_ylabel(f"{h}\nvalidation task B")
    handles, labels = {}, {}
    for ax in axes.flat:
        for hd, lb in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lb, hd)
    fig.tight_layout(rect=(0, 0.55 / (1.9 * len(heads) + 1.0), 1, 1))
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=2, fontsize=_CH4_MIN_PT,
               frameon=False, bbox_to_anchor=(0.5, 0.0))
    return min_text_size(fig, _CH4_MIN_PT)
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

# --- chapter 5 (issue 13): batch size and fine-tuning strategies --------------------------------------------------

def _ch05_fit(fig: plt.Figure) -> plt.Figure:
    """Chapter 5's figures at the column width: text raised to :data:`bnstudy.style.MIN_FONT_PT` and the figure
    shrunk until its tight bounding box fits :data:`bnstudy.style.COLUMN_WIDTH_IN` (so the browser does not
    shrink the text below it; :func:`legibility`)."""
    for _ in range(4):
        min_text_size(fig, style.MIN_FONT_PT)
        leg = legibility(fig)
        if leg["page_font_pt"] >= style.MIN_FONT_PT:
            break
        w, h = fig.get_size_inches()
        k = 0.97 * style.COLUMN_WIDTH_IN / leg["width_in"]
        fig.set_size_inches(w * k, h * k)
        fig.canvas.draw()
        inv = fig.transFigure.inverted()
        top = max([inv.transform(lg.get_window_extent())[1][1] for lg in fig.legends] + [0.0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tight_layout's "not compatible" note for a few axes kinds
            fig.tight_layout(rect=(0, min(max(top, 0.0), 0.4), 1, 1))  # labels re-spaced at the new size
    return fig

def _ci_rows(df: pd.DataFrame, by, value: str, confidence: float = 0.95) -> pd.DataFrame:
    """Mean and Student's t interval over seeds (:func:`bnstudy.inference.t_interval`) per ``by``: ``mean, lo, hi``."""
    from .inference import t_interval
    return df.groupby(by)[value].apply(lambda v: pd.Series(tuple(t_interval(v, confidence)),
                                                           index=["mean", "lo", "hi"])).unstack().reset_index()


def _log2_axis(ax, ticks) -> None:
    """A log x axis labelled at ``ticks`` only (no minor-tick labels crowding them)."""
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(list(ticks), [str(t) for t in ticks])


def _strategy_colors(strategies):
    return style.palette("strategy", strategies)


def noise_figure(noise: pd.DataFrame):
    """Spread of batch means and variances (relative to sigma^2, sigma^4) against batch size per BN layer,
    measured (mean and 95% interval over seeds) and the independent-values prediction (dashed)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = style.sequential(sorted(noise.layer.unique()))
    for ax, (val, pred, title) in zip(axes, (("var_mean_rel", "pred_mean_rel", "variance of the batch mean / $\\sigma^2$"),
                                           ("var_var_rel", "pred_var_rel", "variance of the batch variance / $\\sigma^4$"))):
        for layer, g in noise.groupby("layer"):
            r = _ci_rows(g, "batch_size", val)
            hw = int(g.hw.iloc[0])
            ax.plot(r.batch_size, r["mean"], "o-", color=colors[layer], label=f"block {layer + 1} (H x W = {hw})")
            ax.fill_between(r.batch_size, r.lo.clip(lower=1e-12), r.hi, color=colors[layer], alpha=0.25)
            p = g.groupby("batch_size")[pred].mean()
            ax.plot(p.index, p.values, "--", color=colors[layer])
        ax.set(yscale="log", xlabel="batch size m", ylabel=title)
        _log2_axis(ax, sorted(noise.batch_size.unique()))
    axes[0].set_title("dashed: 1/(m H W)", fontsize=9)
    axes[1].set_title("dashed: (kurtosis - 1)/(m H W)", fontsize=9)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=9, title="solid: measured",
               bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return _ch05_fit(fig)


def strategy_accuracy_figure(df: pd.DataFrame, value: str, ylabel: str, labels: dict, chance: float | None = None,
                             reference: int | None = None, groups: dict | None = None, flag=None):
    """``value`` against batch size per strategy (mean, 95% interval over seeds), one column per target.

    ``groups``: ``{row title: strategies}`` draws one row of panels per group (e.g. BatchNorm and per-sample
    norms apart); ``reference``: a vertical dotted line at that batch size; ``flag``: rows ``target_name,
    strategy, batch_size`` (e.g. cells with diverged runs) drawn as black crosses over the strategy's point."""
    targets = sorted(df.target_name.unique())
    strategies = [s for s in labels if s in set(df.strategy)]
    colors = _strategy_colors(strategies)
    groups = groups or {"": strategies}
    nrow = len(groups)
    fig, axes = plt.subplots(nrow, len(targets), figsize=(5.2 * len(targets), 3.6 * nrow + 0.8), sharey=True,
                             squeeze=False)
    flagged = set() if flag is None else {(r.target_name, r.strategy, r.batch_size) for r in flag.itertuples()}
    for row, (gname, members) in zip(axes, groups.items()):
        for ax, t in zip(row, targets):
            for s in [s for s in strategies if s in members]:
                g = df[(df.target_name == t) & (df.strategy == s)]
                r = _ci_rows(g, "batch_size", value)
                style = "-" if s in ("bn_frozen", "stats_frozen", "adabn", "bn_train") else "--"
                ax.plot(r.batch_size, r["mean"], style, marker="o", ms=4, color=colors[s], label=labels[s])
                ax.fill_between(r.batch_size, r.lo, r.hi, color=colors[s], alpha=0.15)
                for rr in r.itertuples():
                    if (t, s, rr.batch_size) in flagged:
                        ax.plot(rr.batch_size, rr.mean, "x", color="black", ms=10, mew=2,
                                label="cell with diverged runs" if not any(
                                    h.get_label() == "cell with diverged runs" for h in ax.lines[:-1]) else None)
            if chance is not None:
                ax.axhline(chance, color="grey", lw=0.8, ls=":")
            if reference is not None:
                ax.axvline(reference, color="grey", lw=0.8, ls="-.")
            title = f"target: {t}" + (f" - {gname}" if gname else "")
            ax.set(xlabel="fine-tuning batch size", title=title, ylabel=ylabel)
            _log2_axis(ax, sorted(df.batch_size.unique()))
    handles, names, seen = [], [], set()
    for ax in axes.flat:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in seen:
                seen.add(n)
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=9, bbox_to_anchor=(0.5, -0.01))
    fig.tight_layout(rect=(0, 0.14 if nrow == 1 else 0.1, 1, 1))
    return _ch05_fit(fig)


def tradeoff_figure(trade: pd.DataFrame, labels: dict):
    """Source retention against target accuracy per strategy (95% intervals both ways), one panel per target;
    filled markers at the smallest batch size, open at the largest shown."""
    targets = sorted(trade.target_name.unique())
    strategies = [s for s in labels if s in set(trade.strategy)]
    colors = _strategy_colors(strategies)
    sizes = sorted(trade.batch_size.unique())
    fig, axes = plt.subplots(1, len(targets), figsize=(5.2 * len(targets), 6.0), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], targets):
        for s in strategies:
            for b in sizes:
                r = trade[(trade.target_name == t) & (trade.strategy == s) & (trade.batch_size == b)]
                if not len(r):
                    continue
                r = r.iloc[0]
                ax.errorbar(r.target_mean, r.retention_mean, xerr=[[r.target_mean - r.target_lo], [r.target_hi - r.target_mean]],
                            yerr=[[r.retention_mean - r.retention_lo], [r.retention_hi - r.retention_mean]],
                            fmt="o", color=colors[s], mfc=colors[s] if b == sizes[0] else "white", ms=7,
                            label=labels[s] if b == sizes[0] else None)
        for s in strategies:  # an arrow per strategy from the smallest to the largest batch size shown
            a = trade[(trade.target_name == t) & (trade.strategy == s) & (trade.batch_size == sizes[0])]
            b = trade[(trade.target_name == t) & (trade.strategy == s) & (trade.batch_size == sizes[-1])]
            if len(a) and len(b) and len(sizes) > 1:
                ax.annotate("", xy=(b.target_mean.iloc[0], b.retention_mean.iloc[0]),
                            xytext=(a.target_mean.iloc[0], a.retention_mean.iloc[0]),
                            arrowprops=dict(arrowstyle="->", color=colors[s], lw=0.9, alpha=0.7))
        ax.set(xlabel="target accuracy (adaptation)", ylabel="source task accuracy\nafter fine-tuning",
               title=f"target: {t}\nfilled: batch {sizes[0]}, open: batch {sizes[-1]}")
        ax.yaxis.set_tick_params(labelleft=True)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=9, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    return _ch05_fit(fig)


def precise_bn_figure(pt: pd.DataFrame, claim=(1e3, 1e4), margin: float | None = None, tolerance: float | None = None):
    """Precise BN against the number of samples, at each batch size: statistic errors (mean, 95% interval over
    seeds; ``tolerance`` drawn dashed) and accuracy difference to the exact statistics (mean, 90% interval: the
    TOST's; ``+-margin`` drawn dashed); Wu & Johnson's range shaded."""
    d = pt[pt.kind == "precise"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    colors = style.sequential(sorted(d.batch_size.unique()))
    for ax, (val, lab) in zip(axes, (("mean_err", "mean error / population std"),
                                     ("var_err", "|log variance ratio|"),
                                     ("acc_vs_exact", "accuracy difference to exact statistics"))):
        for m, g in d.groupby("batch_size"):
            r = _ci_rows(g, "n_samples", val, 0.90 if val == "acc_vs_exact" else 0.95)
            ax.plot(r.n_samples, r["mean"], "o-", color=colors[m], label=f"batch size {m}", alpha=0.85)
            ax.fill_between(r.n_samples, r.lo, r.hi, color=colors[m], alpha=0.2)
        ax.axvspan(*claim, color="grey", alpha=0.12)
        if val == "acc_vs_exact" and margin is not None:
            for y in (-margin, margin):
                ax.axhline(y, color="black", lw=0.8, ls="--")
        if val != "acc_vs_exact" and tolerance is not None:
            ax.axhline(tolerance, color="black", lw=0.8, ls="--")
        ax.set(xscale="log", xlabel="samples used by precise BN", ylabel=lab)
        if val != "acc_vs_exact":
            ax.set_yscale("log")
        else:
            ax.axhline(0, color="grey", lw=0.8)
    axes[0].legend()
    fig.tight_layout()
    return _ch05_fit(fig)


def mismatch_advantage_figure(mt: pd.DataFrame, labels: dict):
    """Per seed and target: each strategy's target-accuracy difference to inherited frozen statistics against
    the statistics mismatch measured before fine-tuning; means with 95% intervals per target drawn as bars."""
    from .inference import t_interval
    strategies = [s for s in labels if s in set(mt.strategy)]
    colors = _strategy_colors(list(labels))
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for i, s in enumerate(strategies):
        g = mt[mt.strategy == s]
        shift = 1.15 ** (i - (len(strategies) - 1) / 2)  # spread strategies sideways so every series shows
        ax.scatter(g.mismatch_kl * shift, g.advantage, s=14, alpha=0.45, color=colors[s])
        for t, h in g.groupby("target_name"):
            iv = t_interval(h.advantage)
            ax.errorbar(h.mismatch_kl.mean() * shift, iv.mean, yerr=[[iv.mean - iv.low], [iv.high - iv.mean]], fmt="s",
                        color=colors[s], ms=7, capsize=3, label=labels[s] if t == sorted(g.target_name.unique())[0] else None)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="statistics mismatch before fine-tuning (mean KL over BN layers, nats;\n"
                                "strategies drawn side by side)",
           ylabel="target accuracy minus stats-frozen's")
    ax.legend(fontsize=8.5, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return _ch05_fit(fig)


# --- chapters 1 and 2, issue 10: the head's optimizer swept, training budget, trap 3's dropout, trap 5's loss,
# --- training on class-sorted batches; and a floor on text size -------------------------------------------------

OPTIMIZER_COLORS = {"sgd": style.OPTIMIZERS["sgd"], "adam": style.OPTIMIZERS["adam"], "reference": style.GREY,
                    "sgd-std": style.SKY, "adam-std": style.PINK}
CH01_GAP_LABELS = {"sgd": "SGD +\nmomentum", "adam": "Adam", "sgd-std": "SGD,\nstandardized", "adam-std": "Adam,\nstandardized",
                    "reference": "logistic regr.\n(converged,\n4000 samples)"}
PATH_STYLES = {"batch_stats": ("-", "o", "train_mode = separate_stats"),
               "pinned": ("--", "s", "backbone_eval = all_eval")}


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


def optimizer_gap_figure(gaps: pd.DataFrame, margin: float | None = None, min_seeds: int = 3):
    """Chapter 1: paired task-B difference ``train_mode - backbone_eval`` per head optimizer and the reference.

    ``gaps``: tidy ``seed, role (report | confirm), optimizer, gap``. Each seed a dot (reported seeds
    filled, confirmation seeds open); per optimizer the pooled mean and 95% Student-t interval over all
    seeds (only with >= ``min_seeds`` seeds; otherwise the mean and the range). Optimizers ``sgd-std`` /
    ``adam-std`` (heads on standardized features) get their own columns. ``margin``: the reference test's
    equivalence margin, drawn as a band around zero in the reference column only.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    opts = [o for o in ("sgd", "adam", "sgd-std", "adam-std", "reference") if o in set(gaps["optimizer"])]
    # at most the column's width, so that 9 pt text stays 9 pt on the page (bnstudy.style)
    fig, ax = plt.subplots(figsize=(min(style.COLUMN_WIDTH_IN - 0.2, max(6.4, 1.35 * len(opts) + 1.4)), 4.2))
    ax.axhline(0, color=style.REFERENCE["zero"], lw=1)
    if margin is not None and "reference" in opts:
        i = opts.index("reference")
        ax.fill_between([i - 0.45, i + 0.45], -margin, margin, color=style.REFERENCE["band"], lw=0)
    for i, o in enumerate(opts):
        for j, (role, fill) in enumerate((("report", True), ("confirm", False))):
            g = gaps[(gaps["optimizer"] == o) & (gaps["role"] == role)]
            if g.empty:
                continue
            x = i - 0.22 + j * 0.14
            jit = np.linspace(-0.04, 0.04, len(g)) if len(g) > 1 else np.zeros(1)
            ax.scatter(x + jit, g["gap"], s=24, facecolors=OPTIMIZER_COLORS[o] if fill else "none",
                       edgecolors=OPTIMIZER_COLORS[o], alpha=0.85, zorder=3)
        v = gaps[gaps["optimizer"] == o]["gap"]
        if len(v) >= min_seeds:  # a difference of accuracies: the drawn interval cut to [-1, 1]
            iv = _interval(v).clipped(-1, 1)
            ax.errorbar([i + 0.2], [iv.mean], yerr=[[iv.mean - iv.low], [iv.high - iv.mean]], fmt="D",
                        color=style.REFERENCE["zero"], ms=6, capsize=5, lw=1.6, zorder=4)
        else:
            ax.errorbar([i + 0.2], [v.mean()], yerr=[[v.mean() - v.min()], [v.max() - v.mean()]], fmt="D",
                        color=style.GREY, ms=6, capsize=5, zorder=4)
    ax.set_xticks(range(len(opts)))
    ax.set_xticklabels([CH01_GAP_LABELS[o] for o in opts])
    ax.set_xlim(-0.6, len(opts) - 0.4)
    ax.set_ylabel("difference in task-B accuracy\n(train_mode - backbone_eval)")
    handles = [Line2D([], [], marker="o", ls="", color=style.GREY, label="reported seed"),
               Line2D([], [], marker="o", ls="", mfc="none", color=style.GREY, label="confirmation seed"),
               Line2D([], [], marker="D", ls="-", color=style.REFERENCE["zero"], label="all seeds: mean, 95% CI")]
    if margin is not None:
        handles.append(Patch(color=style.REFERENCE["band"], label=f"reference test's margin \u00b1{margin:g}"))
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=2, bbox_to_anchor=(0.5, 0.0), fontsize=9)
    return min_text_size(fig)


def budget_figure_ch01(chosen: pd.DataFrame):
    """Chapter 1: task-B test accuracy against head-training steps, one panel per optimizer.

    ``chosen``: tidy ``seed, role, path, optimizer, lr, step, accuracy`` (reported and confirmation seeds,
    pooled). Lines per path (mean over seeds, 95% Student-t band); the logistic-regression reference per
    path as a horizontal line with its 95% band (solid and plain for ``train_mode``, dashed and hatched
    for the pinned path).
    """
    from .inference import t_interval
    rep = chosen[chosen["role"].isin(["report", "confirm"])]
    opts = [o for o in ("sgd", "adam") if o in set(rep["optimizer"])]
    fig, axes = plt.subplots(1, len(opts), figsize=(3.4 * len(opts) + 0.4, 3.9), sharey=True, squeeze=False)
    ref_style = {"batch_stats": dict(color=style.OPTIMIZERS["sgd"], hatch=None, alpha=0.22),
                 "pinned": dict(color=style.GREY, hatch="////", alpha=0.25)}
    for ax, o in zip(axes[0], opts):
        for path, (ls, marker, label) in PATH_STYLES.items():
            g = interval_frame(rep[(rep["optimizer"] == o) & (rep["path"] == path)], "step", "accuracy")
            ax.plot(g.index, g["mean"], ls=ls, marker=marker, ms=4, color=OPTIMIZER_COLORS[o], label=label)
            ax.fill_between(g.index, g["lo"], g["hi"], color=OPTIMIZER_COLORS[o], alpha=0.18, lw=0)
            r = rep[(rep["optimizer"] == "reference") & (rep["path"] == path)]
            if len(r):
                iv = t_interval(r["accuracy"])
                st = ref_style[path]
                ax.axhspan(iv.low, iv.high, facecolor=st["color"] if st["hatch"] is None else "none",
                           edgecolor=st["color"], hatch=st["hatch"], alpha=st["alpha"], lw=0)
                ax.axhline(iv.mean, color=st["color"], ls=ls, lw=1.2,
                           label=f"reference, {label.split(' =')[0]} (one fit at step {int(r['step'].iloc[0])})")
        ax.set_xscale("log", base=2)
        steps = sorted(rep["step"].unique())
        ax.set_xticks(steps); ax.set_xticklabels([str(s) for s in steps])
        ax.set_title("SGD + momentum" if o == "sgd" else "Adam")
        ax.set_xlabel("head-training steps")
    axes[0][0].set_ylabel("task-B accuracy (fraction)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=9)
    return min_text_size(fig)


def lr_figure(lrt: pd.DataFrame, chosen: dict | None = None, min_seeds: int = 3):
    """Chapter 1: what was tried: validation accuracy (tuning seeds) against learning rate, per optimizer and path.

    Each tuning seed is a small dot; the line joins the means; the band is the seeds' range (plain on the
    ``batch_stats`` path, hatched on the pinned one; a t interval from 2-3 tuning seeds would be mostly its
    t quantile). ``min_seeds`` is kept for callers and not used. ``chosen``: ``{(optimizer, path): lr}``, each
    choice ringed. Where ``lrt`` holds the standardized heads (``sgd-std``, ``adam-std``) they get a second row,
    on the same y axis.
    """
    from matplotlib.lines import Line2D
    present = set(lrt["optimizer"])
    base = [o for o in ("sgd", "adam") if o in present or o + "-std" in present]
    rows = [[o if o in present else None for o in base]]
    if any(o + "-std" in present for o in base):
        rows.append([o + "-std" if o + "-std" in present else None for o in base])
    n = int(lrt["seed"].nunique())
    fig, axes = plt.subplots(len(rows), len(base), figsize=(3.4 * len(base) + 0.4, 3.0 * len(rows) + 0.7),
                             sharey=True, squeeze=False)
    for r, row in enumerate(rows):
        for ax, o in zip(axes[r], row):
            if o is None:
                ax.set_visible(False)
                continue
            color = OPTIMIZER_COLORS[o.removesuffix("-std")]
            for path, (ls, marker, label) in PATH_STYLES.items():
                sub = lrt[(lrt["optimizer"] == o) & (lrt["path"] == path)]
                g = sub.groupby("lr")["accuracy"].agg(mean="mean", lo="min", hi="max")
                ax.plot(g.index, g["mean"], ls=ls, marker=marker, ms=4, color=color, label=label)
                pinned = path == "pinned"
                ax.fill_between(g.index, g["lo"], g["hi"], facecolor="none" if pinned else color,
                                edgecolor=color, hatch="////" if pinned else None,
                                alpha=0.35 if pinned else 0.15, lw=0)
                ax.scatter(sub["lr"], sub["accuracy"], s=8, color=color, alpha=0.6, zorder=3)
                if chosen and (o, path) in chosen and chosen[(o, path)] in g.index:
                    lr = chosen[(o, path)]
                    ax.plot([lr], [g.loc[lr, "mean"]], marker="o", ms=13, mfc="none", mec=style.REFERENCE["zero"], mew=1.4, zorder=4)
            ax.set_xscale("log"); ax.set_xlabel("learning rate")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            grid = sorted(lrt[lrt["optimizer"] == o]["lr"].unique())
            if grid and np.log10(grid[-1] / grid[0]) < 1.5:   # a narrow grid: label its rates, not the decades
                ax.set_xticks(grid, [f"{x:g}" for x in grid])
            ax.set_title(("SGD + momentum" if o.startswith("sgd") else "Adam")
                         + (", standardized" if o.endswith("-std") else ""))
        axes[r][0].set_ylabel("validation accuracy, task B")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if chosen:
        handles.append(Line2D([], [], marker="o", ms=11, mfc="none", mec=style.REFERENCE["zero"], ls="", label="chosen"))
        labels.append("chosen")
    band = f"range of {n} seeds"
    handles.append(Line2D([], [], marker="o", ms=3, ls="", color=style.GREY)); labels.append(f"one tuning seed (band: {band})")
    fig.tight_layout(rect=(0, 0.7 / (3.0 * len(rows) + 0.7), 1, 1))   # the legend's 0.7 inch below the panels
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=9)
    return min_text_size(fig)


def _ci_text(mean, lo, hi, n, min_seeds=3, digits=3) -> str:
    if n < min_seeds:
        return f"{mean:.{digits}f} (range of {n} seeds)"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


EXPLORE_LABELS = {"sgd": "SGD + momentum", "adam": "Adam", "sgd-std": "SGD + momentum, standardized features",
                  "adam-std": "Adam, standardized features"}


def ch01_exploratory_display(ex: pd.DataFrame, main_lr: float | None = None) -> pd.DataFrame:
    """Chapter 1: :func:`bnstudy.experiments.freeze_modes.exploratory_tests` as a display table."""
    rows = []
    for _, r in ex.iterrows():
        if r["test"] == "main":
            what = f"main run: {EXPLORE_LABELS.get(r['optimizer'], r['optimizer'])}, lr {r['lr']:g} (reported seeds)"
        else:
            what = f"{EXPLORE_LABELS.get(r['optimizer'], r['optimizer'])}, lr chosen on validation (all seeds)"
        p = "-" if pd.isna(r["p"]) else "< 0.001" if r["p"] < 0.001 else f"{r['p']:.3f}"
        ph = "-" if pd.isna(r["p_holm"]) else "< 0.001" if r["p_holm"] < 0.001 else f"{r['p_holm']:.3f}"
        rows.append({"head": what, "steps": int(r["step"]), "seeds": int(r["n"]),
                     "difference [family interval]": _ci_text(r["mean"], r["ci_low"], r["ci_high"], int(r["n"]), min_seeds=2),
                     "p": p, "p (Holm)": ph, "verdict": r["verdict"]})
    return pd.DataFrame(rows).set_index("head")  # the row label, not a 0, 1, 2 index


def ch01_std_display(tuning, reference: dict | None = None) -> pd.DataFrame:
    """Chapter 1: the heads on standardized features (:class:`~bnstudy.experiments.freeze_modes.TuningFindings`).

    Rows per optimizer: the gap ``train_mode`` minus pinned path with its family interval at every checkpoint, then
    at the main step each path's mean test accuracy with the paired gain over the plain head (95% interval).
    ``reference``: optional ``{"batch_stats": acc, "pinned": acc}``, the converged reference, added as a last row
    (accuracies only). Raises ``ValueError`` when the standardized heads were not run.
    """
    if not tuning.std_gap_at:
        raise ValueError("ch01_std_display needs standardized heads (TuningFindings.std_gap_at is empty)")
    opts = [o for o in ("sgd", "adam") if o in tuning.std_reduction]
    steps = sorted({int(k.rsplit("_", 1)[1]) for k in tuning.std_gap_at})
    rows = []
    for o in opts:
        row = {"head (standardized features)": EXPLORE_LABELS[o]}
        for st in steps:
            iv = tuning.std_gap_at[f"{o}_{st}"]
            row[f"gap, {st:,} steps"] = _ci_text(iv.mean, iv.low, iv.high, iv.n, min_seeds=2)
        for p, label in (("batch_stats", "train_mode path"), ("pinned", "pinned path")):
            g = tuning.std_gain[f"{o}_{p}"]
            row[f"{label}, {tuning.main_step:,} steps (gain)"] = (f"{tuning.std_acc[f'{o}_{p}']:.3f} "
                                                               f"(+{_ci_text(g.mean, g.low, g.high, g.n, min_seeds=2)})")
        rows.append(row)
    if reference:
        row = {"head (standardized features)": "reference (converged)"}
        row.update({f"gap, {st:,} steps": "-" for st in steps})
        row[f"train_mode path, {tuning.main_step:,} steps (gain)"] = f"{reference['batch_stats']:.3f}"
        row[f"pinned path, {tuning.main_step:,} steps (gain)"] = f"{reference['pinned']:.3f}"
        rows.append(row)
    return pd.DataFrame(rows).set_index("head (standardized features)")


def ch01_sensitivity_display(sens: pd.DataFrame) -> pd.DataFrame:
    """Chapter 1: the reference's sensitivity fits (:func:`~bnstudy.experiments.freeze_modes.reference_sensitivity`)."""
    return pd.DataFrame([{"L2 penalty": f"{r['l2']:g}", "fit samples": int(r["n_fit"]), "seeds": int(r["n"]),
                          "train_mode path": f"{r['acc_batch_stats']:.3f}", "pinned path": f"{r['acc_pinned']:.3f}",
                          "difference [family interval]": _ci_text(r["mean"], r["ci_low"], r["ci_high"], int(r["n"]), min_seeds=2),
                          "verdict": r["verdict"]} for _, r in sens.iterrows()]).set_index("L2 penalty")


def ch01_lr_choice_display(choice: pd.DataFrame) -> pd.DataFrame:
    """Chapter 1: the learning rate chosen when selecting at each checkpoint (rows: optimizer and path)."""
    names = {"batch_stats": "train_mode path", "pinned": "pinned path"}
    out = {}
    for (o, p), g in choice.groupby(["optimizer", "path"], sort=False):
        out[f"{EXPLORE_LABELS.get(o, o)}, {names.get(p, p)}"] = {
            f"selected at {int(r['step']):,} steps": f"{r['lr']:g}" + ("" if r["position"] == "interior"
                                                                   else f" ({r['position']} tried)")
            for _, r in g.iterrows()}
    return pd.DataFrame(out).T.rename_axis("head")


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
