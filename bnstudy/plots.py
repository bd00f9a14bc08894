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
