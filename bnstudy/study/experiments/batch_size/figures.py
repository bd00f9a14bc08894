"""Chapter 5, what is drawn: its figures and the display tables of its page. Colours from :mod:`bnstudy.study.style` only."""

from __future__ import annotations

import textwrap
import warnings

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd

from ... import style
from ...inference import Family, number, t_interval
from ...plots import legibility, min_text_size
from .findings import CELL, _edge, entries, winners
from .run import BN_STRATEGIES, STRATEGIES, STRATEGY_LABELS, TARGETS, best_rate_table


def _ch05_fit(fig: plt.Figure) -> plt.Figure:
    """Text raised to ``style.MIN_FONT_PT`` and the figure shrunk until it fits ``style.COLUMN_WIDTH_IN`` (so the
    browser does not shrink the text below it; :func:`legibility`)."""
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
    """Mean and Student's t interval over seeds per ``by``: columns ``by, mean, lo, hi``."""
    return df.groupby(by)[value].apply(lambda v: pd.Series(tuple(t_interval(v, confidence)),
                                                           index=["mean", "lo", "hi"])).unstack().reset_index()


def _log2_axis(ax, ticks) -> None:
    """A log x axis labelled at ``ticks`` only (no minor-tick labels crowding them)."""
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(list(ticks), [str(t) for t in ticks])


def noise_figure(noise: pd.DataFrame):
    """Spread of batch means and variances (relative to sigma^2, sigma^4) against batch size per BN layer, measured
    (mean and 95% interval over seeds) and the independent-values prediction (dashed)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = style.sequential(sorted(noise.layer.unique()))
    for ax, (val, pred, title, dashed) in zip(axes, (
            ("var_mean_rel", "pred_mean_rel", "variance of the batch mean / $\\sigma^2$", "1/(m H W)"),
            ("var_var_rel", "pred_var_rel", "variance of the batch variance / $\\sigma^4$", "(kurtosis - 1)/(m H W)"))):
        for layer, g in noise.groupby("layer"):
            r = _ci_rows(g, "batch_size", val)
            ax.plot(r.batch_size, r["mean"], "o-", color=colors[layer], label=f"block {layer + 1} (H x W = {int(g.hw.iloc[0])})")
            ax.fill_between(r.batch_size, r.lo.clip(lower=1e-12), r.hi, color=colors[layer], alpha=0.25)
            p = g.groupby("batch_size")[pred].mean()
            ax.plot(p.index, p.values, "--", color=colors[layer])
        ax.set(yscale="log", xlabel="batch size m", ylabel=title)
        _log2_axis(ax, sorted(noise.batch_size.unique()))
        ax.set_title(f"dashed: {dashed}", fontsize=9)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=9, title="solid: measured",
               bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return _ch05_fit(fig)


def strategy_accuracy_figure(df: pd.DataFrame, value: str, ylabel: str, labels: dict, chance: float | None = None,
                             reference: int | None = None, groups: dict | None = None, flag=None):
    """``value`` against batch size per strategy (mean, 95% interval over seeds), one column per target, one row
    per ``groups`` entry ``{row title: strategies}``; ``reference``: a vertical line; ``flag``: cells (``CELL``
    columns) drawn as black crosses."""
    targets = sorted(df.target_name.unique())
    strategies = [s for s in labels if s in set(df.strategy)]
    colors = style.palette("strategy", strategies)
    groups = groups or {"": strategies}
    fig, axes = plt.subplots(len(groups), len(targets), figsize=(5.2 * len(targets), 3.6 * len(groups) + 0.8),
                             sharey=True, squeeze=False)
    flagged = set() if flag is None else {(r.target_name, r.strategy, r.batch_size) for r in flag.itertuples()}
    crosses = "cell with diverged runs"
    for row, (gname, members) in zip(axes, groups.items()):
        for ax, t in zip(row, targets):
            for s in [s for s in strategies if s in members]:
                r = _ci_rows(df[(df.target_name == t) & (df.strategy == s)], "batch_size", value)
                ax.plot(r.batch_size, r["mean"], "-" if s in BN_STRATEGIES else "--", marker="o", ms=4,
                        color=colors[s], label=labels[s])
                ax.fill_between(r.batch_size, r.lo, r.hi, color=colors[s], alpha=0.15)
                for rr in r.itertuples():
                    if (t, s, rr.batch_size) in flagged:
                        ax.plot(rr.batch_size, rr.mean, "x", color="black", ms=10, mew=2, label=crosses if not any(
                            h.get_label() == crosses for h in ax.lines[:-1]) else None)
            if chance is not None:
                ax.axhline(chance, color="grey", lw=0.8, ls=":")
            if reference is not None:
                ax.axvline(reference, color="grey", lw=0.8, ls="-.")
            ax.set(xlabel="fine-tuning batch size", title=f"target: {t}" + (f" - {gname}" if gname else ""))
            if ax is row[0]:  # one y label a row: the panels share the axis (issue 35: the second ran into the first)
                ax.set_ylabel(textwrap.fill(ylabel, 24))
            _log2_axis(ax, sorted(df.batch_size.unique()))
    legend = {}
    for ax in axes.flat:
        for h, n in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(n, h)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=2, fontsize=9, bbox_to_anchor=(0.5, -0.01))
    fig.tight_layout(rect=(0, 0.24 if len(groups) == 1 else 0.14, 1, 1))
    return _ch05_fit(fig)


def tradeoff_figure(trade: pd.DataFrame, labels: dict):
    """Source retention against target accuracy per strategy (95% intervals both ways), one panel per target;
    filled markers at the smallest batch size, open at the largest shown, an arrow from one to the other."""
    targets = sorted(trade.target_name.unique())
    strategies = [s for s in labels if s in set(trade.strategy)]
    colors = style.palette("strategy", strategies)
    sizes = sorted(trade.batch_size.unique())
    cell = trade.drop_duplicates(CELL).set_index(CELL)
    fig, axes = plt.subplots(1, len(targets), figsize=(5.2 * len(targets), 6.0), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], targets):
        for s in strategies:
            for b in (b for b in sizes if (t, s, b) in cell.index):
                r = cell.loc[(t, s, b)]
                ax.errorbar(r.target_mean, r.retention_mean, xerr=[[r.target_mean - r.target_lo], [r.target_hi - r.target_mean]],
                            yerr=[[r.retention_mean - r.retention_lo], [r.retention_hi - r.retention_mean]],
                            fmt="o", color=colors[s], mfc=colors[s] if b == sizes[0] else "white", ms=7,
                            label=labels[s] if b == sizes[0] else None)
        for s in strategies:
            if len(sizes) > 1 and (t, s, sizes[0]) in cell.index and (t, s, sizes[-1]) in cell.index:
                a, b = cell.loc[(t, s, sizes[0])], cell.loc[(t, s, sizes[-1])]
                ax.annotate("", xy=(b.target_mean, b.retention_mean), xytext=(a.target_mean, a.retention_mean),
                            arrowprops=dict(arrowstyle="->", color=colors[s], lw=0.9, alpha=0.7))
        ax.set(xlabel="target accuracy (adaptation)", ylabel="source task accuracy\nafter fine-tuning",
               title=f"target: {t}\nfilled: batch {sizes[0]}, open: batch {sizes[-1]}")
        ax.yaxis.set_tick_params(labelleft=True)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=9, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    return _ch05_fit(fig)


def precise_bn_figure(pt: pd.DataFrame, claim: tuple, margin: float, tolerance: float):
    """Precise BN against the number of samples, per batch size: statistic errors (95% intervals; ``tolerance``
    dashed) and the accuracy difference to the exact statistics (90% intervals, the TOST's; ``+-margin`` dashed)."""
    d = pt[pt.kind == "precise"]
    # two panels a row, the legend in the fourth cell (issue 35: three a row ran the labels into each other)
    fig, grid = plt.subplots(2, 2, figsize=(9, 7))
    axes, spare = [grid[0][0], grid[0][1], grid[1][0]], grid[1][1]
    colors = style.sequential(sorted(d.batch_size.unique()))
    for ax, (val, lab) in zip(axes, (("mean_err", "mean error / population std"), ("var_err", "|log variance ratio|"),
                                     ("acc_vs_exact", "accuracy difference to exact statistics"))):
        acc = val == "acc_vs_exact"
        for m, g in d.groupby("batch_size"):
            r = _ci_rows(g, "n_samples", val, 0.90 if acc else 0.95)
            ax.plot(r.n_samples, r["mean"], "o-", color=colors[m], label=f"batch size {m}", alpha=0.85)
            ax.fill_between(r.n_samples, r.lo, r.hi, color=colors[m], alpha=0.2)
        ax.axvspan(*claim, color="grey", alpha=0.12)
        for y in ((-margin, margin) if acc else (tolerance,)):
            ax.axhline(y, color="black", lw=0.8, ls="--")
        ax.set(xscale="log", xlabel="samples used by precise BN", ylabel=textwrap.fill(lab, 22))
        if acc:
            ax.axhline(0, color="grey", lw=0.8)
        else:
            ax.set_yscale("log")
    spare.axis("off")
    spare.legend(*axes[0].get_legend_handles_labels(), loc="center")
    fig.tight_layout()
    return _ch05_fit(fig)


def mismatch_advantage_figure(mt: pd.DataFrame, labels: dict):
    """Per seed and target: each strategy's target accuracy minus stats-frozen's against the statistics mismatch
    before fine-tuning; means with 95% intervals per target."""
    strategies = [s for s in labels if s in set(mt.strategy)]
    colors = style.palette("strategy", strategies)
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


# --- display tables -------------------------------------------------------------------------------------------------

def lr_display(tune: pd.DataFrame) -> pd.DataFrame:
    """The learning-rate check per strategy (rows) and target/batch size (columns): the best factor and its mean
    target accuracy against the reported rate's; ``*``: a factor at an end of the grid."""
    means = tune.groupby(CELL + ["lr_factor"])["target"].mean()
    grid = sorted(set(tune.lr_factor))
    best = best_rate_table(tune).drop_duplicates(CELL)
    out = pd.DataFrame({f"{t}, batch {b}": {
        STRATEGY_LABELS[r.strategy]: f"x{r.best_factor:g}{'*' if _edge(r.best_factor, grid) else ''}: "
                                     f"{means[(t, r.strategy, b, r.best_factor)]:.3f} (x1: {means[(t, r.strategy, b, 1.0)]:.3f})"
        for r in g.itertuples()} for (t, b), g in best.groupby(["target_name", "batch_size"])})
    return out.loc[[STRATEGY_LABELS[s] for s in STRATEGIES if STRATEGY_LABELS[s] in out.index]]


def winners_display(df: pd.DataFrame) -> pd.DataFrame:
    """The winners table: target, batch size, winner, runner-up, the difference with its family interval
    (Bonferroni over the rows), verdict, Holm p and flags (winner near chance, diverged runs in the two cells)."""
    w = winners(df, chance=1 / int(df.n_classes.iloc[0]) if "n_classes" in df else None)[0]
    flags = ["; ".join((["winner near chance"] if r.near_chance else [])
                       + ([f"{r.diverged_runs} diverged run(s)"] if r.diverged_runs else [])) for r in w.itertuples()]
    conf = Family(max(len(w), 1)).confidence
    return pd.DataFrame({"target": w.target_name, "batch size": w.batch_size,
                         "winner": w.winner.map(STRATEGY_LABELS), "runner-up": w.runner_up.map(STRATEGY_LABELS),
                         f"winner minus runner-up ({100 * conf:.4g}% interval)":
                             [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in zip(w.diff_mean, w.diff_lo, w.diff_hi)],
                         "verdict": w.verdict, "Holm p": [f"{p:.3g}" for p in w.p_adjusted], "flags": flags})


def breaks_display(f: pd.DataFrame, strategies) -> pd.DataFrame:
    """Break tokens per strategy and target (rows), below and above the reference, any cause and beyond the control
    (columns), from the numbers table ``f``; a row for BN in train mode with re-estimated statistics where given."""
    breaks, stats, above, stats_above, restat = (entries(f, stem) for stem in (
        "breaks", "breaks_stats", "breaks_above", "breaks_stats_above", "breaks_stats_above_restat"))
    ref = number(f, "reference_batch")
    cols = [f"{side} {ref}: {cause}" for side in ("below", "above") for cause in ("any cause", "beyond the control")]
    rows = []
    for t in TARGETS:
        for s in (s for s in strategies if f"{t}_{s}" in breaks):
            k = f"{t}_{s}"
            rows.append(dict(target=t, strategy=STRATEGY_LABELS[s], **dict(zip(cols, (
                breaks[k], stats.get(k, "control"), above[k], stats_above.get(k, "control"))))))
            if s == "bn_train" and t in restat:
                rows.append(dict(target=t, strategy="BN in train mode, statistics re-estimated",
                                 **dict(zip(cols, ("", "", "", restat[t])))))
    return pd.DataFrame(rows)


def decision_figure(cells: pd.DataFrame, small: int, chance: float, near_chance: float):
    """The batch-size-2 decision: per budget (panels) and target (marker), each strategy's accuracy at batch size
    ``small`` at its own tuned rate (:func:`.decision.cell_table`'s rows); hollow: a rate at an end of its grid;
    dotted: chance; dashed: ``chance + near_chance``."""
    c = cells[cells.batch_size == small]
    budgets = [b for b in ("samples", "steps") if b in set(c.budget)]
    order = (c[c.budget == budgets[0]].groupby("arm")["mean"].mean().sort_values().index.tolist())
    fig, axes = plt.subplots(1, len(budgets), figsize=(9, 0.42 * len(order) + 1.6), sharey=True, squeeze=False)
    markers, offset = {"close": "o", "shifted": "s"}, {"close": -0.15, "shifted": 0.15}
    for ax, bu in zip(axes[0], budgets):
        for t, g in c[c.budget == bu].groupby("target_name"):
            for r in g.itertuples():
                y = order.index(r.arm) + offset.get(t, 0)
                col = style.color("strategy", r.arm)
                ax.errorbar(r.mean, y, xerr=[[r.mean - r.ci_low], [r.ci_high - r.mean]], fmt="none", ecolor=col,
                            elinewidth=1.2, capsize=2)
                ax.plot(r.mean, y, markers.get(t, "o"), color=col, markerfacecolor="white" if r.at_edge else col,
                        markersize=6, label=f"{t} target" if r.arm == order[-1] else None)
        ax.axvline(chance, color=style.GREY, linestyle=":", linewidth=1)
        ax.axvline(chance + near_chance, color=style.GREY, linestyle="--", linewidth=0.8)
        ax.set(title="fixed samples" if bu == "samples" else "fixed optimizer steps",
               xlabel=f"task-B accuracy at batch {small}")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(order)))
    axes[0][0].set_yticklabels([textwrap.fill(STRATEGY_LABELS.get(a, a), 24) for a in order])
    handles = [plt.Line2D([], [], marker=markers[t], linestyle="", color=style.GREY, label=f"{t} target")
               for t in markers if t in set(c.target_name)]
    handles.append(plt.Line2D([], [], marker="o", linestyle="", color=style.GREY, markerfacecolor="white",
                              label="rate at a grid edge"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _ch05_fit(fig)
