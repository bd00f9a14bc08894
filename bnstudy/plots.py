"""One figure style for the book, and stable figure files.

``save_figure(fig, "01-accuracy", figures_dir)`` writes ``01-accuracy.png`` (150 dpi)
and ``01-accuracy.svg`` atomically, so a reader can cite and link a file whose
name does not change between builds.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import seaborn as sns

import numpy as np
import pandas as pd

from .analysis import mean_ci
from .modes import MODE_NAMES
from .sweep import atomic_write_bytes

MODE_ORDER = list(MODE_NAMES)
MODE_PALETTE = dict(zip(MODE_ORDER, sns.color_palette("colorblind", len(MODE_ORDER))))


def set_style() -> None:
    """The book's matplotlib/seaborn style (white grid, readable sizes, SVG text kept as text)."""
    # Text at least 10 pt in a figure drawn at its own size; the book shows figures at up to page
    # width (about 9 in), so a 9 in figure keeps 10 pt text and narrower ones are scaled up, never down.
    sns.set_theme(context="notebook", style="whitegrid", font_scale=0.95)
    matplotlib.rcParams.update({"figure.dpi": 100, "savefig.bbox": "tight", "svg.fonttype": "none",
                                "axes.titlesize": "medium", "font.size": 10, "legend.fontsize": 10,
                                "xtick.labelsize": 10, "ytick.labelsize": 10, "axes.labelsize": 10.5})


def save_figure(fig: plt.Figure, name: str, figures_dir) -> list[Path]:
    """Write ``fig`` as ``<figures_dir>/<name>.png`` and ``.svg``; returns both paths.

    Raises ``ValueError`` if ``name`` has a suffix or a path separator (names are stable ids).
    """
    if "/" in name or "." in name:
        raise ValueError(f"name must be a bare figure id like '01-accuracy', got {name!r}")
    paths = []
    for ext, kw in (("png", {"dpi": 150}), ("svg", {})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, **kw)
        p = Path(figures_dir) / f"{name}.{ext}"
        atomic_write_bytes(p, buf.getvalue())
        paths.append(p)
    return paths


def interval_frame(df: pd.DataFrame, by, value: str) -> pd.DataFrame:
    """Mean and 95% interval of ``value`` per group ``by``: columns ``mean, lo, hi``, indexed by ``by``."""
    return df.groupby(by)[value].apply(lambda v: pd.Series(tuple(mean_ci(v)), index=["mean", "lo", "hi"])).unstack()


def mode_strips(df: pd.DataFrame, columns: dict, chance: float | None = None, ylabel: str = "accuracy"):
    """One panel per ``columns`` item (column -> title): each seed a dot per mode, mean and 95% interval beside.

    Returns the figure. ``chance`` draws a dotted chance line.
    """
    modes = [m for m in MODE_ORDER if m in set(df["mode"])]
    fig, axes = plt.subplots(1, len(columns), figsize=(4.6 * len(columns), 3.8), sharey=True, squeeze=False)
    for ax, (col, title) in zip(axes[0], columns.items()):
        sns.stripplot(data=df, x="mode", y=col, hue="mode", order=modes, palette=MODE_PALETTE, ax=ax,
                      alpha=0.55, size=5, jitter=0.15, legend=False)
        s = interval_frame(df, "mode", col).loc[modes]
        ax.errorbar(np.arange(len(modes)) + 0.3, s["mean"], yerr=[s["mean"] - s["lo"], s["hi"] - s["mean"]],
                    fmt="o", color="black", capsize=4, ms=5, label="mean, 95% CI")
        if chance is not None:
            ax.axhline(chance, ls=":", color="grey", lw=1)
        ax.set_title(title); ax.set_xlabel(""); ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", rotation=20)
    if chance is not None:
        axes[0][0].text(len(modes) - 0.5, chance + 0.01, "chance", color="grey", ha="right", va="bottom")
    axes[0][-1].legend(loc="lower right")
    return fig


def drift_figure(drift: pd.DataFrame, floor: pd.Series, momentum: float, gone_step: int, max_step: int = 100):
    """Weight left on task A's running_mean per layer (mean, 95% band, noise-floor band) against ``(1-m)^t``."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    show = drift[drift.step <= max_step]
    layers = sorted(show["layer"].unique())
    for layer, color in zip(layers, sns.color_palette("viridis", len(layers))):
        g = interval_frame(show[show.layer == layer], "step", "weight")
        ax.plot(g.index, g["mean"], "o-", color=color, ms=3, label=f"{layer} (measured)")
        ax.fill_between(g.index, g["lo"], g["hi"], color=color, alpha=0.2)
        ax.axhspan(-floor[layer], floor[layer], color=color, alpha=0.07, lw=0)
    t = np.arange(0, max_step + 1)
    ax.plot(t, (1 - momentum) ** t, "k--", lw=1.2, label=f"$(1-m)^t$, m = {momentum:g}")
    ax.axvline(gone_step, color="grey", ls=":", lw=1)
    ax.set_yscale("symlog", linthresh=1e-2, linscale=0.5); ax.set_ylim(-0.05, 1.5)
    ax.set_xlabel("stage-2 step t (train_mode)"); ax.set_ylabel("weight left on task A's running_mean")
    ax.legend()
    return fig


def quantile_figure(lq: pd.DataFrame):
    """Absolute old-logit change per quantile and mode (mean over seeds, 95% band); symlog axis shows zeros."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for mode in [m for m in MODE_ORDER if m in set(lq["mode"])]:
        g = interval_frame(lq[lq["mode"] == mode], "quantile", "change")
        ax.plot(g.index, g["mean"], "o-", ms=3, color=MODE_PALETTE[mode], label=mode)
        ax.fill_between(g.index, g["lo"], g["hi"], color=MODE_PALETTE[mode], alpha=0.2)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("quantile over held-out images and classes"); ax.set_ylabel("|logit after - logit before|")
    ax.legend()
    return fig


def summary_table(summary: pd.DataFrame, by: str, labels: dict, order=None, digits: int = 3) -> pd.DataFrame:
    """A display table from a long summary (:func:`bnstudy.analysis.summarize`): one row per ``by`` value,
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


def sorted_batches_figure(t4: pd.DataFrame):
    """Chapter 2, trap 4: task-A accuracy against the share of each batch drawn from one class.

    ``t4``: the trap's tidy table (``seed, sorted_fraction, module_eval_accuracy,
    module_train_accuracy, module_eval_accuracy_after_pass, label_dependence, sorted_lint``).
    Lines: the module in eval mode (running statistics), in train mode (batch statistics), and
    in eval mode after the train-mode pass; means over seeds with 95% Student-t bands. The top
    axis gives each loader's label dependence; circled points are loaders the lint flagged (in
    most seeds). Returns the figure.
    """
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    series = [("module_eval_accuracy", "eval mode (running statistics)", "C0", "o"),
              ("module_train_accuracy", "train mode (batch statistics)", "C3", "s"),
              ("module_eval_accuracy_after_pass", "eval mode, after the train-mode pass", "C2", "^")]
    for q, label, color, marker in series:
        c = _curve(t4, "sorted_fraction", q)
        ax.plot(c["sorted_fraction"], c["mean"], marker=marker, ms=4, color=color, label=label)
        ax.fill_between(c["sorted_fraction"], c["lo"], c["hi"], color=color, alpha=0.2)
    flagged = _curve(t4, "sorted_fraction", "sorted_lint")
    dep = _curve(t4, "sorted_fraction", "label_dependence")
    tm = _curve(t4, "sorted_fraction", "module_train_accuracy")
    hit = flagged["mean"] > 0.5
    ax.scatter(tm["sorted_fraction"][hit], tm["mean"][hit], s=70, facecolors="none", edgecolors="k", zorder=5,
               label="loader flagged by the lint")
    ax.set_xlabel("share of each batch drawn from one class (0 = shuffled, 1 = class-sorted)")
    ax.set_ylabel("accuracy on task A")
    ax.set_ylim(0, 1.02)
    top = ax.secondary_xaxis("top")
    top.set_xticks(dep["sorted_fraction"].tolist())
    top.set_xticklabels([f"{v:.2f}".replace("-0.00", "0.00") for v in dep["mean"]])
    top.set_xlabel("label dependence of the batches (audit)")
    ax.legend(fontsize=8, loc="lower left")
    return fig


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
    ax.plot(c["device_batch_size"], c["mean"], "s-", ms=4, color="C3", label="train mode (batch statistics)")
    ax.fill_between(c["device_batch_size"], c["lo"], c["hi"], color="C3", alpha=0.2)
    ax.axhline(float(t5["module_eval_accuracy"].mean()), color="C0", ls="--", label="eval mode (running statistics)")
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

# --- chapter 3: shift strength (tidy tables from bnstudy.experiments.shift_strength) ------------------------------

EFFECT_COLORS = {"cost": sns.color_palette("colorblind")[3], "benefit": sns.color_palette("colorblind")[0]}


def _band(ax, g, x, name, **kw):
    g = g.sort_values(x)
    ax.plot(g[x], g["mean"], "o-", ms=4, color=EFFECT_COLORS[name], label=name, **kw)
    ax.fill_between(g[x], g["ci_low"], g["ci_high"], color=EFFECT_COLORS[name], alpha=0.25, lw=0)


def cost_benefit_lines(lines: pd.DataFrame, cross: dict, xlabels: dict, reference: dict):
    """One panel per line (``lines``: shift_strength.line_table): mean cost and benefit with 95% bands, the
    crossover (``cross[line]``: estimate, ci_low, ci_high) dashed with its interval shaded, and ``reference[line]``
    (chapter 1's shift) dotted."""
    shifts = list(dict.fromkeys(lines["shift"]))
    fig, axes = plt.subplots(1, len(shifts), figsize=(4 * len(shifts), 3.7), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], shifts):
        for name in ("cost", "benefit"):
            _band(ax, lines[(lines["shift"] == t) & (lines["metric"] == name)], "strength", name)
        cr, x = cross[t], lines.loc[lines["shift"] == t, "strength"]
        if not np.isnan(cr["estimate"]):
            ax.axvspan(cr["ci_low"], cr["ci_high"], color="grey", alpha=0.2, lw=0)
            ax.axvline(cr["estimate"], color="black", lw=1, ls="--", label="crossover (95% CI)")
        if x.min() <= reference[t] <= x.max():
            ax.axvline(reference[t], color="grey", lw=1, ls=":", label="chapter 1's shift")
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xlabel(xlabels[t]); ax.set_title(t)
    axes[0][0].set_ylabel("accuracy (fraction)")
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8,
               bbox_to_anchor=(0.5, -0.08), frameon=False)
    return fig


def budget_figure(budget: pd.DataFrame):
    """Cost and benefit against stage-2 steps, one panel per strength (``budget``: shift_strength.budget_table)."""
    ts = sorted(budget["t"].unique())
    steps = sorted(budget["steps"].unique())
    fig, axes = plt.subplots(1, len(ts), figsize=(4.6 * len(ts), 3.5), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], ts):
        for name in ("cost", "benefit"):
            _band(ax, budget[(budget["t"] == t) & (budget["metric"] == name)], "steps", name)
        ax.set_xscale("log"); ax.set_xticks(steps); ax.set_xticklabels(steps); ax.minorticks_off()
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xlabel("stage-2 steps (new head)"); ax.set_title(f"both line, t = {t:g}")
    axes[0][0].set_ylabel("accuracy (fraction)"); axes[0][0].legend(fontsize=8)
    return fig


def effect_heatmaps(grid: pd.DataFrame):
    """Cost, benefit and net on the brightness x contrast grid (``grid``: shift_strength.grid_table); each cell
    shows the mean and the half-width of its 95% interval. Cost and benefit share one color scale."""
    gb, gc = sorted(grid["brightness"].unique()), sorted(grid["contrast"].unique())
    wide = {m: grid[grid["metric"] == m].set_index(["brightness", "contrast"]) for m in ("cost", "benefit", "net")}
    vmax = max(wide["cost"]["mean"].max(), wide["benefit"]["mean"].max())
    titles = {"cost": "cost (task A lost)", "benefit": "benefit (task B gained)", "net": "benefit minus cost"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.9))
    for ax, (name, cmap) in zip(axes, (("cost", "Reds"), ("benefit", "Blues"), ("net", "RdBu"))):
        a = wide[name]
        M = a["mean"].unstack("contrast").reindex(index=gb, columns=gc).values
        H = ((a["ci_high"] - a["ci_low"]) / 2).unstack("contrast").reindex(index=gb, columns=gc).values
        top = np.nanmax(np.abs(M)) if name == "net" else vmax
        ax.imshow(M, origin="lower", cmap=cmap, aspect="auto", vmin=-top if name == "net" else 0, vmax=top)
        for i, j in np.ndindex(M.shape):
            ax.text(j, i, f"{M[i, j]:.2f}\n±{H[i, j]:.2f}", ha="center", va="center", fontsize=7.5,
                    color="white" if abs(M[i, j]) > 0.6 * top else "black")
        ax.set_xticks(range(len(gc))); ax.set_xticklabels([f"{c:g}" for c in gc])
        ax.set_yticks(range(len(gb))); ax.set_yticklabels([f"{b:g}" for b in gb])
        ax.set_xlabel("contrast gain c"); ax.set_ylabel("brightness offset b"); ax.set_title(titles[name])
        ax.grid(False)
    return fig


def mismatch_figure(conditions: pd.DataFrame):
    """Cost and benefit against the statistics mismatch, one point per shift with 95% bars in both directions
    (``conditions``: shift_strength.condition_table); markers by the line a shift illustrates."""
    marks = {"no shift": "s", "brightness": "o", "contrast": "^", "both": "D", "grid only": "x"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.9), sharey=True)
    for ax, name in zip(axes, ("cost", "benefit")):
        for kind, g in conditions.groupby("kind"):
            ax.errorbar(g["mismatch_kl"], g[name],
                        xerr=[g["mismatch_kl"] - g["mismatch_kl_lo"], g["mismatch_kl_hi"] - g["mismatch_kl"]],
                        yerr=[g[name] - g[name + "_lo"], g[name + "_hi"] - g[name]], fmt=marks[kind], ms=5,
                        capsize=2, lw=0.8, color=EFFECT_COLORS[name], alpha=0.85, label=kind,
                        mfc="none" if kind == "grid only" else EFFECT_COLORS[name])
        ax.set_xscale("log"); ax.axhline(0, color="black", lw=0.6); ax.set_title(name)
    fig.supxlabel("statistics mismatch before stage 2: mean over BN layers of KL(new || stored), nats",
                  fontsize=10, y=-0.02)
    axes[0].set_ylabel("accuracy (fraction)")
    axes[0].legend(fontsize=8, title="shift", title_fontsize=8)
    return fig


def retention_scatter(scatter: pd.DataFrame):
    """Task-A change against task-B gain over ``backbone_eval``, one point per mode and shift with 95% bars
    (``scatter``: shift_strength.scatter_table); the dashed line is gain = loss."""
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    for mode in [m for m in MODE_ORDER if m in set(scatter["mode"])]:
        g = scatter[scatter["mode"] == mode]
        xa = g[g["metric"] == "task_a_change"].set_index(["brightness", "contrast"])
        yb = g[g["metric"] == "task_b_gain"].set_index(["brightness", "contrast"]).loc[xa.index]
        ax.errorbar(xa["mean"], yb["mean"], xerr=[xa["mean"] - xa["ci_low"], xa["ci_high"] - xa["mean"]],
                    yerr=[yb["mean"] - yb["ci_low"], yb["ci_high"] - yb["mean"]], fmt="o", ms=4, alpha=0.8,
                    capsize=2, color=MODE_PALETTE[mode], label=mode, lw=0.8)
    # Accuracy changes live in [-1, 1]; t-intervals over few seeds can overshoot, so the axes stop at the possible range.
    ax.set_xlim(-1.05, 0.1); ax.set_ylim(min(-0.1, ax.get_ylim()[0]), min(1.05, max(0.3, ax.get_ylim()[1])))
    xx = np.linspace(-1.0, 0, 10)
    ax.plot(xx, -xx, color="grey", ls="--", lw=1, label="gain = loss")
    ax.axhline(0, color="black", lw=0.6); ax.axvline(0, color="black", lw=0.6)
    ax.set_xlabel("task A accuracy change (after - before)"); ax.set_ylabel("task B gain over backbone_eval")
    ax.legend(fontsize=8, loc="lower left")
    return fig


# --- chapters 1 and 2, issue 10: the head's optimizer swept, training budget, trap 3's dropout, trap 5's loss,
# --- training on class-sorted batches; and a floor on text size -------------------------------------------------

OPTIMIZER_COLORS = {"sgd": sns.color_palette("colorblind")[0], "adam": sns.color_palette("colorblind")[1],
                    "reference": "0.25"}
PATH_STYLES = {"batch_stats": ("-", "o", "train_mode = separate_stats"),
               "pinned": ("--", "s", "backbone_eval = all_eval")}


def min_text_size(fig: plt.Figure, size: float = 9.0) -> plt.Figure:
    """Raise every text of ``fig`` (labels, ticks, legends, annotations) below ``size`` points to ``size``."""
    for t in fig.findobj(matplotlib.text.Text):
        if t.get_fontsize() < size:
            t.set_fontsize(size)
    return fig


def _mean_ci_bar(ax, x, values, color, **kw):
    iv = mean_ci(values)
    ax.errorbar([x], [iv.mean], yerr=[[iv.mean - iv.low], [iv.high - iv.mean]], fmt="D", color=color, ms=6,
                capsize=5, lw=1.6, zorder=4, **kw)


def optimizer_gap_figure(gaps: pd.DataFrame):
    """Chapter 1: paired task-B difference ``train_mode - backbone_eval`` per head optimizer and the reference.

    ``gaps``: tidy ``seed, role (report | confirm), optimizer, gap``. Each seed a dot (reported seeds
    filled, confirmation seeds open), per role the mean and 95% Student-t interval over seeds.
    """
    opts = [o for o in ("sgd", "adam", "reference") if o in set(gaps["optimizer"])]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.axhline(0, color="0.4", lw=1)
    for i, o in enumerate(opts):
        for j, (role, fill) in enumerate((("report", True), ("confirm", False))):
            g = gaps[(gaps["optimizer"] == o) & (gaps["role"] == role)]
            if g.empty:
                continue
            x = i + (j - 0.5) * 0.36
            jit = np.linspace(-0.06, 0.06, len(g)) if len(g) > 1 else np.zeros(1)
            ax.scatter(x + jit, g["gap"], s=22, facecolors=OPTIMIZER_COLORS[o] if fill else "none",
                       edgecolors=OPTIMIZER_COLORS[o], alpha=0.8, zorder=3)
            _mean_ci_bar(ax, x + 0.12, g["gap"], "black")
    ax.set_xticks(range(len(opts)))
    ax.set_xticklabels(["SGD + momentum" if o == "sgd" else "Adam" if o == "adam"
                        else "logistic regression\n(no optimizer settings)" for o in opts])
    ax.set_xlim(-0.6, len(opts) - 0.4)
    ax.set_ylabel("difference in task-B accuracy\n(train_mode - backbone_eval)")
    from matplotlib.lines import Line2D
    ax.legend(handles=[Line2D([], [], marker="o", ls="", color="0.3", label="reported seed"),
                       Line2D([], [], marker="o", ls="", mfc="none", color="0.3", label="confirmation seed"),
                       Line2D([], [], marker="D", ls="-", color="black", label="mean, 95% CI")],
              loc="best", fontsize=9)
    return min_text_size(fig)


def budget_figure_ch01(chosen: pd.DataFrame):
    """Chapter 1: task-B test accuracy against head-training steps, one panel per optimizer.

    ``chosen``: tidy ``seed, role, path, optimizer, lr, step, accuracy`` (reported seeds used).
    Lines per path (mean over seeds, 95% Student-t band); the logistic-regression reference as a
    horizontal band per path.
    """
    rep = chosen[chosen["role"] == "report"]
    opts = [o for o in ("sgd", "adam") if o in set(rep["optimizer"])]
    fig, axes = plt.subplots(1, len(opts), figsize=(3.4 * len(opts) + 0.4, 3.7), sharey=True, squeeze=False)
    for ax, o in zip(axes[0], opts):
        for path, (ls, marker, label) in PATH_STYLES.items():
            g = interval_frame(rep[(rep["optimizer"] == o) & (rep["path"] == path)], "step", "accuracy")
            ax.plot(g.index, g["mean"], ls=ls, marker=marker, ms=4, color=OPTIMIZER_COLORS[o], label=label)
            ax.fill_between(g.index, g["lo"], g["hi"], color=OPTIMIZER_COLORS[o], alpha=0.18, lw=0)
            r = rep[(rep["optimizer"] == "reference") & (rep["path"] == path)]
            if len(r):
                iv = mean_ci(r["accuracy"])
                ax.axhspan(iv.low, iv.high, color="0.5", alpha=0.18, lw=0)
                ax.axhline(iv.mean, color="0.25", ls=ls, lw=1, label=f"reference, {label.split(' =')[0]}")
        ax.set_xscale("log", base=2)
        steps = sorted(rep["step"].unique())
        ax.set_xticks(steps); ax.set_xticklabels([str(s) for s in steps])
        ax.set_title("SGD + momentum" if o == "sgd" else "Adam")
        ax.set_xlabel("head-training steps")
    axes[0][0].set_ylabel("task-B accuracy (fraction)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=9)
    return min_text_size(fig)


def lr_figure(lrt: pd.DataFrame):
    """Chapter 1: what was tried: validation accuracy (tuning seeds) against learning rate, per optimizer and path."""
    opts = [o for o in ("sgd", "adam") if o in set(lrt["optimizer"])]
    fig, axes = plt.subplots(1, len(opts), figsize=(3.4 * len(opts) + 0.4, 3.4), sharey=True, squeeze=False)
    for ax, o in zip(axes[0], opts):
        for path, (ls, marker, label) in PATH_STYLES.items():
            g = interval_frame(lrt[(lrt["optimizer"] == o) & (lrt["path"] == path)], "lr", "accuracy")
            ax.plot(g.index, g["mean"], ls=ls, marker=marker, ms=4, color=OPTIMIZER_COLORS[o], label=label)
            ax.fill_between(g.index, g["lo"], g["hi"], color=OPTIMIZER_COLORS[o], alpha=0.18, lw=0)
        ax.set_xscale("log"); ax.set_xlabel("learning rate")
        ax.set_title("SGD + momentum" if o == "sgd" else "Adam")
    axes[0][0].set_ylabel("validation accuracy, task B")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=9)
    return min_text_size(fig)


def dropout_figure(t3: pd.DataFrame):
    """Chapter 2, trap 3: the main head's task-B accuracy per case, each seed a line across the cases.

    ``t3``: tidy ``seed, case, task_b_main``; black diamonds are means with 95% Student-t intervals.
    """
    cases = ["whole_model", "backbone_only", "backbone_only_dropout_off"]
    names = ["whole model pinned\n(dropout off, no aux.)", "backbone pinned\n(the fix)", "the fix with\ndropout off"]
    piv = t3.pivot(index="seed", columns="case", values="task_b_main")[cases]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for _, row in piv.iterrows():
        ax.plot(range(3), row.values, "-o", color="0.6", alpha=0.6, ms=3)
    for i, c in enumerate(cases):
        _mean_ci_bar(ax, i + 0.12, piv[c], "black")
    ax.set_xticks(range(3)); ax.set_xticklabels(names)
    ax.set_xlim(-0.4, 2.5)
    ax.set_ylabel("task-B accuracy, main head")
    return min_text_size(fig)


def batch_loss_figure(t5: pd.DataFrame, min_batch: int):
    """Chapter 2, trap 5: accuracy lost in train mode (eval minus train-mode accuracy) per per-device batch size.

    ``t5``: tidy ``seed, device_batch_size, module_eval_accuracy, module_train_accuracy,
    min_values_per_channel``. Mean and 95% Student-t interval of the paired difference; the top axis
    gives the values per channel of the last BatchNorm (m x H x W); shaded: where the lint fires.
    """
    d = t5.assign(loss=t5["module_eval_accuracy"] - t5["module_train_accuracy"])
    c = _curve(d, "device_batch_size", "loss")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.axvspan(0.8, min_batch, color="0.9", zorder=0, label=f"lint fires (batch < {min_batch})")
    ax.axhline(0, color="0.4", lw=1)
    ax.errorbar(c["device_batch_size"], c["mean"], yerr=[c["mean"] - c["lo"], c["hi"] - c["mean"]], fmt="s-",
                color="C3", ms=4, capsize=4, label="mean, 95% CI over seeds")
    ax.set_xscale("log", base=2)
    bs = c["device_batch_size"].tolist()
    ax.set_xticks(bs); ax.set_xticklabels([str(int(b)) for b in bs]); ax.set_xlim(0.8, max(bs) * 1.25)
    ax.set_xlabel("per-device batch size m")
    ax.set_ylabel("difference in accuracy\n(eval mode - train mode)")
    if "min_values_per_channel" in d:
        cnt = d.groupby("device_batch_size")["min_values_per_channel"].first()
        top = ax.secondary_xaxis("top")
        top.set_xticks(bs); top.set_xticklabels([f"{int(cnt[b])}" for b in bs])
        top.set_xlabel("values per channel in the last BatchNorm (m x H x W)")
    ax.legend(loc="upper right", fontsize=9)
    return min_text_size(fig)


def sorted_training_figure(t6: pd.DataFrame):
    """Chapter 2, trap 6: networks trained on shuffled or class-sorted batches.

    ``t6``: tidy ``seed, case, train_meter_accuracy, heldout_eval_accuracy,
    heldout_batch_stats_accuracy``. Bars: means; error bars: 95% Student-t intervals; dots: seeds.
    """
    qs = [("train_meter_accuracy", "training meter\n(train mode, its own batches)"),
          ("heldout_eval_accuracy", "held-out, eval mode"),
          ("heldout_batch_stats_accuracy", "held-out, train mode\n(shuffled batches)")]
    cases = [c for c in ("shuffled", "class_sorted") if c in set(t6["case"])]
    fig, ax = plt.subplots(figsize=(6.6, 3.8))
    w = 0.38
    for j, case in enumerate(cases):
        g = t6[t6["case"] == case]
        for i, (q, _) in enumerate(qs):
            iv = mean_ci(g[q])
            x = i + (j - 0.5) * w
            ax.bar(x, iv.mean, width=w * 0.92, color=f"C{j}", alpha=0.75,
                   label=("trained on " + case.replace("_", "-") + " batches") if i == 0 else None)
            ax.errorbar(x, iv.mean, yerr=[[iv.mean - iv.low], [iv.high - iv.mean]], color="black", capsize=4)
            ax.scatter(np.full(len(g), x), g[q], s=10, color="black", alpha=0.5, zorder=3)
    ax.set_xticks(range(len(qs))); ax.set_xticklabels([n for _, n in qs])
    ax.set_ylim(0, 1.25); ax.set_yticks(np.linspace(0, 1, 6)); ax.set_ylabel("accuracy on task A (fraction)")
    ax.legend(loc="upper center", ncol=2, fontsize=9)
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
