"""Chapter 5, what is drawn: its figures (moved out of :mod:`bnstudy.plots`) and the display tables of its page.
Colours come from :mod:`bnstudy.style` only."""

from __future__ import annotations

import warnings

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd

from ... import style
from ...inference import Family, number
from ...plots import legibility, min_text_size
from .findings import _edge, entries, winners
from .run import STRATEGIES, STRATEGY_LABELS, TARGETS, best_rate_table


# --- figures (moved from bnstudy.plots) ------------------------------------------------------------------------

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
    from ...inference import t_interval
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
    from ...inference import t_interval
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


# --- display tables --------------------------------------------------------------------------------------------

def lr_display(tune: pd.DataFrame) -> pd.DataFrame:
    """The learning-rate check for the page: per strategy (rows) and target/batch size (columns), the best
    factor and its mean target accuracy against the reported rate's (means over the tuning seeds); a factor at an
    end of the grid is marked ``*`` (the best of the rates tried; the true best may lie beyond)."""
    means = tune.groupby(["target_name", "strategy", "batch_size", "lr_factor"])["target"].mean()
    grid = sorted(set(tune.lr_factor))
    best = best_rate_table(tune).drop_duplicates(["target_name", "strategy", "batch_size"])
    cols = {}
    for (t, b), g in best.groupby(["target_name", "batch_size"]):
        col = {}
        for r in g.itertuples():
            star = "*" if _edge(r.best_factor, grid) else ""
            col[STRATEGY_LABELS[r.strategy]] = (f"x{r.best_factor:g}{star}: {means[(t, r.strategy, b, r.best_factor)]:.3f} "
                                                f"(x1: {means[(t, r.strategy, b, 1.0)]:.3f})")
        cols[f"{t}, batch {b}"] = col
    out = pd.DataFrame(cols)
    return out.loc[[STRATEGY_LABELS[s] for s in STRATEGIES if STRATEGY_LABELS[s] in out.index]]


def winners_display(df: pd.DataFrame) -> pd.DataFrame:
    """The winners table for the page: target, batch size, winner, runner-up, winner minus runner-up with its
    family interval (Bonferroni over the table's rows), the verdict, the Holm-adjusted p-value, and flags:
    diverged runs in the two cells, winner near chance (:func:`near_chance_cells`)."""
    w = winners(df, chance=1 / int(df.n_classes.iloc[0]) if "n_classes" in df else None)[0]
    notes = []
    for r in w.itertuples():
        n = []
        if r.near_chance:
            n.append("winner near chance")
        if r.diverged_runs:
            n.append(f"{r.diverged_runs} diverged run(s)")
        notes.append("; ".join(n))
    conf = Family(max(len(w), 1)).confidence
    return pd.DataFrame({"target": w.target_name, "batch size": w.batch_size,
                         "winner": w.winner.map(STRATEGY_LABELS), "runner-up": w.runner_up.map(STRATEGY_LABELS),
                         f"winner minus runner-up ({100 * conf:.4g}% interval)":
                             [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in zip(w.diff_mean, w.diff_lo, w.diff_hi)],
                         "verdict": w.verdict, "Holm p": [f"{p:.3g}" for p in w.p_adjusted], "flags": notes})


def breaks_display(f: pd.DataFrame, strategies) -> pd.DataFrame:
    """Break thresholds per strategy and target (rows), below and above the reference, any cause and beyond the
    control (columns), from the numbers table ``f`` (:func:`.findings.findings`: ``breaks_<target>_<strategy>``
    and the like); verdict tokens (``"control"`` for the control itself, ``"n/a"`` for strategies without batch
    statistics). With ``breaks_stats_above_restat_<target>``, a row per target for BN in train mode with
    re-estimated statistics (above the reference only)."""
    breaks, stats, above, stats_above, restat = (entries(f, stem) for stem in (
        "breaks", "breaks_stats", "breaks_above", "breaks_stats_above", "breaks_stats_above_restat"))
    targets = sorted({t for t in TARGETS if any(f"{t}_{s}" in breaks for s in STRATEGIES)})
    ref = number(f, "reference_batch")
    rows = []
    for t in targets:
        for s in strategies:
            k = f"{t}_{s}"
            if k not in breaks:
                continue
            rows.append({"target": t, "strategy": STRATEGY_LABELS[s],
                         f"below {ref}: any cause": breaks[k],
                         f"below {ref}: beyond the control": stats.get(k, "control"),
                         f"above {ref}: any cause": above[k],
                         f"above {ref}: beyond the control": stats_above.get(k, "control")})
            if s == "bn_train" and t in restat:
                rows.append({"target": t, "strategy": "BN in train mode, statistics re-estimated",
                             f"below {ref}: any cause": "", f"below {ref}: beyond the control": "",
                             f"above {ref}: any cause": "",
                             f"above {ref}: beyond the control": restat[t]})
    return pd.DataFrame(rows)
