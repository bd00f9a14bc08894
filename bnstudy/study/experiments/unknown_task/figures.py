"""Chapter 6, what is drawn: the routing, accuracy, routing-cost and temperature figures and the routing
table (moved out of :mod:`bnstudy.study.plots`). Colours from :mod:`bnstudy.study.style` only."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ... import style
from ...plots import fit_page, interval_frame
from .run import ROUTE_OK

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
    inference batch size; rows: number of tasks, columns: routers (``table``: findings.routing_table). Chance
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
    composition), rows: number of tasks. ``df``: run.run's table (per task). Per seed the new tasks
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
    routing_table), the :data:`~.run.ROUTE_OK` (0.9) line dashed; (b) the fully task-unknown case, ``nearest_first`` picking bank and head,
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
                ax.axhline(ROUTE_OK, color=style.REFERENCE["chance"], ls="--", lw=1, label=f"{ROUTE_OK:g} (routing works)")
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
    against the temperature (log axis), one line per shift strength (``table``: findings.temperature_table);
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


def table_routing(routes: pd.DataFrame, router: str = "nearest_first") -> pd.DataFrame:
    """Table 1: ``router``'s routing accuracy (mean over seeds) per number of tasks and inference batch (rows)
    and strength (columns), every value written with three decimals (``routes``: :func:`.findings.routing_table`)."""
    sel = routes[routes.condition == router]
    if sel.empty:
        raise ValueError(f"table_routing: no rows for router {router!r}; routers in the table: "
                         f"{sorted(routes.condition.unique())}")
    tab = sel.groupby(["n_tasks", "inference_batch", "strength"]).routing_accuracy.mean().unstack("strength")
    tab.columns = [f"t={t:g}" for t in tab.columns]
    tab.index = [f"{k} tasks, batch {b}" for k, b in tab.index]
    return tab.map(lambda v: f"{v:.3f}")
