"""Chapter 6, what is drawn, in :mod:`bnstudy.study.style`'s colours at the column width: means and 95% t intervals
over seeds, ends cut to the quantity's range; the strength axis is categorical (levels span orders of magnitude)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ... import style
from ...plots import fit_page, interval_frame, legend_below
from .run import BASELINES, CONDITIONS, HARD_ROUTERS, ROUTE_OK, ROUTERS

# distinct hues (tab10) and markers, so that no two series differ by shade alone
PALETTE = style.palette("router", CONDITIONS)
MARKERS = dict(zip(CONDITIONS, ("o", "^", "s", "D", "*", "v", "P")))


def _positions(strengths) -> dict:
    return {t: i for i, t in enumerate(sorted(set(strengths)))}


def _ticks(ax, pos, rotation=90):
    ax.set_xticks(list(pos.values()))
    ax.set_xticklabels([f"{t:g}" for t in pos], rotation=rotation, ha="right" if rotation % 90 else "center")


def _select(t: pd.DataFrame, **levels) -> pd.DataFrame:
    return t[np.logical_and.reduce([t[c] == v for c, v in levels.items()])]


def _band(t: pd.DataFrame, value: str, **levels) -> pd.DataFrame:
    """Mean and 95% interval of the accuracy ``value`` per strength in the rows at ``levels``."""
    f = interval_frame(_select(t, **levels), "strength", value).reset_index()
    return f.assign(lo=f["lo"].clip(0, 1), hi=f["hi"].clip(0, 1))


def _gap(t: pd.DataFrame, **levels) -> pd.DataFrame:
    """The rows of a gap table at ``levels`` by strength."""
    f = _select(t, **levels).sort_values("strength")
    return f.assign(lo=f["ci_low"].clip(-1, 1), hi=f["ci_high"].clip(-1, 1))


def _errorbar(ax, x, f, name, label=None, color=None, ls="-", capsize=2, ms=4):
    ax.errorbar(x, f["mean"], yerr=[f["mean"] - f["lo"], f["hi"] - f["mean"]], fmt=MARKERS[name], ls=ls, ms=ms,
                capsize=capsize, color=color or PALETTE[name], label=label or name)


def _batch_lines(ax, table: pd.DataFrame, pos: dict, colors: dict, **levels) -> None:
    """Routing accuracy against strength (band: 95% interval), one line per inference batch size in ``colors``."""
    for b in colors:
        f = _band(table, "routing_accuracy", inference_batch=b, **levels)
        x = f.strength.map(pos)
        ax.plot(x, f["mean"], "o-", ms=3, color=colors[b], label=f"batch {b}")
        ax.fill_between(x, f["lo"], f["hi"], color=colors[b], alpha=0.2, lw=0)


def _routing_grid(table: pd.DataFrame, columns, size: tuple, panel, ylabel: str, ncol: int):
    """Rows: number of tasks, one column per entry of ``columns``; ``panel(ax, k, column, pos, colors)`` draws a
    panel; ``size``: (inches per row, inches added)."""
    ks, batches = sorted(table.n_tasks.unique()), sorted(table.inference_batch.unique())
    colors, pos = style.sequential(batches), _positions(table.strength)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(len(ks), len(columns), figsize=(style.COLUMN_WIDTH_IN, size[0] * len(ks) + size[1]),
                                 sharey=True, sharex=True, squeeze=False)
        for r, k in enumerate(ks):
            for ax, column in zip(axes[r], columns):
                panel(ax, k, column, pos, colors)
                _ticks(ax, pos)
            axes[r][0].set_ylabel(ylabel)
        for ax in axes[-1]:
            ax.set_xlabel("strength t")
        fig.tight_layout()
        fig.legend(*axes[0][0].get_legend_handles_labels(), loc="upper center", ncol=ncol, frameon=False,
                   bbox_to_anchor=(0.5, -0.02))
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def routing_figure(table: pd.DataFrame):
    """Routing accuracy of the hard routers against shift strength (``table``: :func:`.findings.seed_table`), one
    line per inference batch size; the mixture left out (its heaviest bank is ``nearest_first``'s choice)."""
    def panel(ax, k, name, pos, colors):
        _batch_lines(ax, table, pos, colors, n_tasks=k, condition=name)
        ax.axhline(1 / k, color=style.REFERENCE["chance"], ls=":", lw=1, label="chance (1/K)")
        ax.set_title(f"{name}\n{k} tasks")
    return _routing_grid(table, HARD_ROUTERS, (2.6, 0.6), panel, "routing accuracy", ncol=4)


def empty_figure(text: str):
    """A small figure that only says ``text`` (a section not run, so that its figure reference resolves)."""
    with plt.rc_context(style.rc()):
        fig, ax = plt.subplots(figsize=(style.COLUMN_WIDTH_IN, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
        return fig


def family_routing_figure(routes: pd.DataFrame):
    """``nearest_first``'s routing accuracy against the family strength per inference batch size, one column per
    shift family (``routes``: :func:`.findings.family_routes`)."""
    def panel(ax, k, fam, pos, colors):
        _batch_lines(ax, routes, pos, colors, n_tasks=k, condition="nearest_first", shift_family=fam)
        ax.axhline(ROUTE_OK, color=style.REFERENCE["chance"], ls="--", lw=1, label=f"{ROUTE_OK:g} (works)")
        ax.axhline(1 / k, color=style.GREY, ls=":", lw=1, label="chance (1/K)")
        ax.set_title(f"{fam}, {k} tasks")
    return _routing_grid(routes, list(dict.fromkeys(routes.shift_family)), (2.4, 0.8), panel,
                         "routing accuracy\n(nearest_first)", ncol=3)


def router_accuracy_figure(df: pd.DataFrame, inference_batch: int = 1):
    """Task accuracy per condition against shift strength at ``inference_batch`` (``df``: :func:`.run.run`'s rows);
    columns: task A and the new tasks' mean (their levels differ: a mean over all tasks would show composition)."""
    d = df[(df.inference_batch == inference_batch) & df.condition.isin(CONDITIONS)]
    d = d.assign(group=np.where(d.task == "A", "task A", "new tasks (mean)"))
    per_seed = d.groupby(["seed", "n_tasks", "strength", "condition", "group"])["accuracy"].mean().reset_index()
    ks, pos = sorted(per_seed.n_tasks.unique()), _positions(per_seed.strength)
    with plt.rc_context(style.rc()):
        # issue 35: the seven series' bars sat on top of each other; spread them over most of a level's width,
        # without caps, and tilt the level labels instead of standing them on end
        fig, axes = plt.subplots(len(ks), 2, figsize=(style.COLUMN_WIDTH_IN, 3.2 * len(ks) + 0.9), sharex=True,
                                 squeeze=False)
        for r, k in enumerate(ks):
            for ax, grp in zip(axes[r], ("task A", "new tasks (mean)")):
                for i, name in enumerate(CONDITIONS):
                    f = _band(per_seed, "accuracy", n_tasks=k, condition=name, group=grp)
                    _errorbar(ax, f.strength.map(pos) + (i - 3) * 0.1, f, name, ls="--" if name in BASELINES else "-",
                              capsize=0, ms=3.5)
                ax.set_title(f"{grp}, {k} tasks")
                _ticks(ax, pos, rotation=45)
            axes[r][0].set_ylabel("accuracy\n(task's own head)")
        for ax in axes[-1]:
            ax.set_xlabel("shift strength t (levels, not to scale)")
        return legend_below(fig, axes[0][0], ncol=4)


def routing_cost_figure(routes: pd.DataFrame, gaps: pd.DataFrame, routed: pd.DataFrame, margin: float,
                        inference_batches=(1, 32), part: str = "cost"):
    """Where routing fails and what that costs, one column per number of tasks. ``part="cost"``: (a) a wrong bank
    minus the oracle (``gaps``: :func:`.findings.gap_table`), (b) router minus oracle per sample, zoomed, ``±margin``
    shaded. ``part="unknown"``: (a) ``nearest_first``'s routing at ``inference_batches``, (b) its routed head minus the
    oracle per inference batch (``routed``). Raises ``ValueError`` for another ``part``."""
    if part not in ("cost", "unknown"):
        raise ValueError(f"routing_cost_figure: part must be 'cost' or 'unknown', got {part!r}")
    ks, pos, b1 = sorted(gaps.n_tasks.unique()), _positions(gaps.strength), min(gaps.inference_batch)
    batches = sorted(routed.inference_batch.unique())
    bcolors, zero = style.sequential(batches), dict(color=style.REFERENCE["zero"], lw=0.6)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(2, len(ks), figsize=(style.COLUMN_WIDTH_IN, 6.4), sharex=True, squeeze=False)
        for c, k in enumerate(ks):
            top, ax = axes[0][c], axes[1][c]
            if part == "cost":
                for i, name in enumerate(("train_mode", "pinned")):
                    f = _gap(gaps, n_tasks=k, condition=name, inference_batch=b1)
                    _errorbar(top, f.strength.map(pos) + (i - 0.5) * 0.08, f, name, label=f"{name} - oracle")
                top.axhline(0, **zero)
                top.set_title(f"(a) wrong bank, {k} tasks")
                ax.axhspan(-margin, margin, color=style.REFERENCE["band"], zorder=0, label=f"margin ±{margin:g}")
                for i, name in enumerate(ROUTERS):
                    f = _gap(gaps, n_tasks=k, condition=name, inference_batch=b1)
                    _errorbar(ax, f.strength.map(pos) + (i - 1.5) * 0.07, f, name, label=f"{name} - oracle")
                ax.axhline(0, **zero)
                ax.set_ylim(-1.6 * margin, 1.6 * margin)
                ax.set_title(f"(b) router - oracle (zoom), {k} tasks")
            else:
                for b in inference_batches:
                    f = _band(routes, "routing_accuracy", n_tasks=k, condition="nearest_first", inference_batch=b)
                    _errorbar(top, f.strength.map(pos), f, "nearest_first", label=f"nearest_first, batch {b}",
                              color=bcolors.get(b, style.GREY))
                top.axhline(ROUTE_OK, color=style.REFERENCE["chance"], ls="--", lw=1,
                            label=f"{ROUTE_OK:g} (routing works)")
                top.axhline(1 / k, color=style.GREY, ls=":", lw=1, label="chance (1/K)")
                top.set_title(f"(a) routing accuracy, {k} tasks")
                for i, b in enumerate(batches):
                    f = _gap(routed, n_tasks=k, condition="nearest_first", inference_batch=b)
                    _errorbar(ax, f.strength.map(pos) + (i - 1.5) * 0.07, f, "nearest_first", color=bcolors[b],
                              label=f"routed head, batch {b}")
                ax.axhline(0, **zero)
                ax.set_title(f"(b) routed head - oracle, {k} tasks")
            _ticks(ax, pos)
            ax.set_xlabel("strength t")
        labels = (["wrong bank - oracle\n(accuracy)", "router - oracle\n(accuracy)"] if part == "cost" else
                  ["routing accuracy", "routed head - oracle\n(accuracy)"])
        for row, lab in zip(axes, labels):
            row[0].set_ylabel(lab)
        fig.tight_layout()
        for row in axes:
            row[-1].legend(*row[0].get_legend_handles_labels(), loc="best", fontsize=style.MIN_FONT_PT)
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def temperature_figure(table: pd.DataFrame, kept: float):
    """Mixture minus oracle against the temperature (``table``: :func:`.findings.temperature_table`), one line per
    strength, the ``kept`` temperature dotted."""
    ks, strengths = sorted(table.n_tasks.unique()), sorted(table.strength.unique())
    colors = style.sequential(strengths)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(1, len(ks), figsize=(style.COLUMN_WIDTH_IN, 3.4), squeeze=False)
        for ax, k in zip(axes[0], ks):
            for t in strengths:
                f = _gap(table, n_tasks=k, strength=t).sort_values("temperature")
                ax.errorbar(f.temperature, f["mean"], yerr=[f["mean"] - f["lo"], f["hi"] - f["mean"]],
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


def table_routing(routes: pd.DataFrame) -> pd.DataFrame:
    """``nearest_first``'s routing accuracy (mean over seeds, three decimals) per number of tasks and inference batch
    (rows) and strength (columns); ``routes``: :func:`.findings.seed_table`."""
    tab = routes[routes.condition == "nearest_first"].groupby(["n_tasks", "inference_batch", "strength"]).routing_accuracy.mean().unstack("strength")
    tab.columns = [f"t={t:g}" for t in tab.columns]
    tab.index = [f"{k} tasks, batch {b}" for k, b in tab.index]
    return tab.map(lambda v: f"{v:.3f}")
