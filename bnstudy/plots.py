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


# --- chapter 7 (issue 15): real digits and torchvision networks ---------------------------------------------------

def ch07_accuracy_figure(acc: pd.DataFrame, chance: float):
    """Accuracy per freeze mode at the reference corruption, one panel per network, 95% bars over seeds
    (``acc``: real_data.accuracy_table): task A before and after stage 2, and task B."""
    nets = list(dict.fromkeys(acc["network"]))
    metrics = {"task_a_before": "task A before", "task_a_after": "task A after", "task_b": "task B"}
    fig, axes = plt.subplots(1, len(nets), figsize=(4.2 * len(nets), 3.8), sharey=True, squeeze=False)
    for ax, net in zip(axes[0], nets):
        g = acc[acc["network"] == net]
        modes = [m for m in MODE_ORDER if m in set(g["mode"])]
        for k, (metric, label) in enumerate(metrics.items()):
            h = g[g["metric"] == metric].set_index("mode").loc[modes]
            x = np.arange(len(modes)) + (k - 1) * 0.22
            ax.errorbar(x, h["mean"], yerr=[h["mean"] - h["ci_low"], h["ci_high"] - h["mean"]], fmt="o", ms=5,
                        capsize=3, label=label, color=sns.color_palette("colorblind")[(0, 1, 2)[k]])
        ax.axhline(chance, color="grey", ls=":", lw=1, label="chance")
        ax.set_xticks(range(len(modes))); ax.set_xticklabels(modes, rotation=25, ha="right")
        ax.set_title(net); ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("held-out accuracy (fraction)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9, bbox_to_anchor=(0.5, -0.02),
               frameon=False)
    return fig


def ch07_effects_figure(eff: pd.DataFrame):
    """Cost and benefit of drifting statistics (``train_mode`` against ``backbone_eval``) against corruption
    severity: rows are networks, columns corruptions (``eff``: real_data.effects_table); 95% bars over seeds.
    Severity 0 (no corruption) is drawn in every column."""
    nets = list(dict.fromkeys(eff["network"]))
    corrs = [c for c in dict.fromkeys(eff["corruption"]) if c != "none"]
    fig, axes = plt.subplots(len(nets), len(corrs), figsize=(2.9 * len(corrs) + 0.6, 2.5 * len(nets) + 0.5),
                             sharex=True, sharey=True, squeeze=False)
    for i, net in enumerate(nets):
        for j, corr in enumerate(corrs):
            ax = axes[i][j]
            g = eff[(eff["network"] == net) & eff["corruption"].isin(["none", corr])]
            for name in ("cost", "benefit"):
                h = g[g["effect"] == name].sort_values("severity")
                ax.errorbar(h["severity"], h["mean"], yerr=[h["mean"] - h["ci_low"], h["ci_high"] - h["mean"]],
                            fmt="o-", ms=4, capsize=2, lw=1, color=EFFECT_COLORS[name], label=name)
            ax.axhline(0, color="black", lw=0.6)
            if i == 0:
                ax.set_title(corr)
            if j == 0:
                ax.set_ylabel(f"{net}\naccuracy difference")
            if i == len(nets) - 1:
                ax.set_xlabel("severity")
    axes[0][0].legend(fontsize=9)
    # accuracy differences live in [-1, 1]; t intervals over few seeds can overshoot
    axes[0][0].set_ylim(max(-1.05, axes[0][0].get_ylim()[0]), min(1.05, axes[0][0].get_ylim()[1]))
    return fig


def ch07_mismatch_figure(cond: pd.DataFrame):
    """Cost of drifting statistics against the statistics mismatch measured before stage 2, one panel per
    network, one point per corruption and severity with the cost's 95% interval (``cond``: real_data.condition_table)."""
    nets = list(dict.fromkeys(cond["network"]))
    corrs = list(dict.fromkeys(cond["corruption"]))
    colors = dict(zip(corrs, sns.color_palette("colorblind", len(corrs))))
    fig, axes = plt.subplots(1, len(nets), figsize=(4.2 * len(nets), 3.8), sharey=True, squeeze=False)
    for ax, net in zip(axes[0], nets):
        g = cond[cond["network"] == net]
        for corr in corrs:
            h = g[g["corruption"] == corr]
            ax.errorbar(h["mismatch_kl"], h["cost"], yerr=[h["cost"] - h["cost_lo"], h["cost_hi"] - h["cost"]],
                        fmt="o", ms=5, capsize=2, lw=0.8, color=colors[corr], label=corr)
        ax.set_xscale("log"); ax.axhline(0, color="black", lw=0.6); ax.set_title(net)
        # ticks at 1, 2 and 5 per decade, plain numbers (a narrow log range otherwise labels every minor tick)
        ax.xaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(2, 5)))
        for fmt in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
            fmt(matplotlib.ticker.FormatStrFormatter("%.2g"))
        ax.set_xlabel("mismatch KL (nats)")
    # accuracy differences live in [-1, 1]; t intervals over few seeds can overshoot
    axes[0][0].set_ylim(max(-1.05, axes[0][0].get_ylim()[0]), min(1.05, axes[0][0].get_ylim()[1]))
    axes[0][0].set_ylabel("cost: task A accuracy lost")
    axes[0][-1].legend(fontsize=9, title="corruption", title_fontsize=9)
    return fig
