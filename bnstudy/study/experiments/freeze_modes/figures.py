"""Chapter 1, what is drawn: the page's figures and display tables; colours from :mod:`bnstudy.study.style`, shared
helpers in :mod:`bnstudy.study.plots`."""

from __future__ import annotations

import textwrap

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ... import style
from ...inference import Interval, number, t_interval
from ...plots import MODE_ORDER, MODE_PALETTE, _ci_text, _interval, interval_frame, min_text_size


def mode_strips(df: pd.DataFrame, columns: dict, chance: float | None = None, ylabel: str = "accuracy",
                interval=None, ylim=None):
    """A panel per ``columns`` item (column -> title): a dot per seed and mode, the mean and ``interval(values)``
    (default Student t) beside; a bar cut by ``ylim`` ends in a triangle; ``chance``: a dotted line."""
    interval = interval or _interval
    modes = [m for m in MODE_ORDER if m in set(df["mode"])]
    fig, axes = plt.subplots(1, len(columns), figsize=(3.3 * len(columns), 4.2), sharey=True, squeeze=False)
    clipped = False
    for ax, (col, title) in zip(axes[0], columns.items()):
        state = np.random.get_state()  # seaborn draws the jitter from numpy's global generator: seeded, so that
        np.random.seed(0)  # the same rows draw the same figure (a cited figure must not change between builds)
        try:
            sns.stripplot(data=df, x="mode", y=col, hue="mode", order=modes, palette=MODE_PALETTE, ax=ax,
                          alpha=0.55, size=5, jitter=0.15, legend=False)
        finally:
            np.random.set_state(state)
        ivs = [interval(df[df["mode"] == m][col]) for m in modes]
        x = np.arange(len(modes)) + 0.3
        mean, lo, hi = (np.array([getattr(iv, a) for iv in ivs]) for a in ("mean", "low", "high"))
        if ylim is not None:
            ax.set_ylim(*ylim)
            for xi, l, h in zip(x, lo, hi):
                for cut, y, marker in ((l < ylim[0], ylim[0], "v"), (h > ylim[1], ylim[1], "^")):
                    if cut:
                        ax.plot([xi], [y], marker=marker, color="black", ms=6, clip_on=False)
                        clipped = True
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


def drift_figure(drift: pd.DataFrame, floor: pd.Series, momentum: float, gone_step: int, compare: pd.DataFrame,
                 residual_max_step: int, max_step: int = 100):
    """Weight left on task A's running_mean per layer (mean, 95% band) against ``(1-m)^t``: the decay up to
    ``max_step``, then the later steps with each layer's noise ``floor``; below, the residual up to
    ``residual_max_step``, ``compare`` (the engine's less precise target) as dotted means."""
    last = int(drift.step.max())
    fig = plt.figure(figsize=(6.6, 7.0))
    gs = fig.add_gridspec(2, 2, width_ratios=[2, 1], height_ratios=[1.25, 1])
    ax0 = fig.add_subplot(gs[0, 0])
    axes = [ax0, fig.add_subplot(gs[0, 1], sharey=ax0)]
    rax = fig.add_subplot(gs[1, :])
    layers = sorted(drift["layer"].unique())
    colors = style.sequential(layers)  # blocks are ordered: the book's one sequential scale (bnstudy.study.style)
    markers = dict(zip(layers, "os^Dv"))
    for k, ax in enumerate(axes):
        show = drift[drift.step <= max_step] if k == 0 else drift[drift.step >= max_step]
        for layer in layers:
            g = interval_frame(show[show.layer == layer], "step", "weight")
            ax.plot(g.index, g["mean"], marker=markers[layer], ls="-", color=colors[layer], ms=3, label=f"{layer} (measured)")
            ax.fill_between(g.index, g["lo"], g["hi"], color=colors[layer], alpha=0.2)
            if k == 1:
                f = floor[layer]
                ax.axhspan(-f, f, color=colors[layer], alpha=0.08, lw=0)
                for y in (-f, f):
                    ax.axhline(y, color=colors[layer], lw=0.8, ls=(0, (4, 2)))
        t = np.linspace(0, max_step, 400) if k == 0 else np.linspace(max_step, last, 400)
        ax.plot(t, (1 - momentum) ** t, "k--", lw=1.2, label=f"$(1-m)^t$, m = {momentum:g}")
        if k == 0:
            ax.axvline(gone_step, color="grey", ls=":", lw=1)
            ax.set_ylabel("weight left on task A's running_mean")
        ax.set_yscale("symlog", linthresh=1e-2, linscale=0.5); ax.set_ylim(-0.05, 1.5)
        ax.set_xlabel("stage-2 step t (train_mode)")
    axes[1].set_title("noise floor (\u00b1 RMS)", fontsize=10)
    axes[0].set_title("decay", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    for layer in layers:
        sub = drift[(drift.layer == layer) & (drift.step >= 1) & (drift.step <= residual_max_step)]
        g = interval_frame(sub.assign(res=sub["weight"] - (1 - momentum) ** sub["step"]), "step", "res")
        rax.plot(g.index, g["mean"], marker=markers[layer], ls="-", color=colors[layer], ms=3)
        rax.fill_between(g.index, g["lo"], g["hi"], color=colors[layer], alpha=0.2)
        c = compare[(compare.layer == layer) & (compare.step >= 1) & (compare.step <= residual_max_step)]
        c = c.assign(res=c["weight"] - (1 - momentum) ** c["step"]).groupby("step")["res"].mean()
        rax.plot(c.index, c.values, ls=":", lw=1.4, color=colors[layer])
    rax.axhline(0, color="k", ls="--", lw=1.2)
    rax.set_xlabel("stage-2 step t (train_mode)")
    rax.set_ylabel("measured - $(1-m)^t$")
    rax.set_title("residual (95% bands)", fontsize=10)
    handles.append(Line2D([], [], ls=":", lw=1.4, color="0.3"))
    labels.append("residual on the 20-batch target (means)")
    fig.tight_layout(rect=(0, 0.11, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=2, bbox_to_anchor=(0.5, 0.0), fontsize=9)
    return fig


def quantile_figure(lq: pd.DataFrame):
    """Absolute old-logit change per quantile and mode (mean, 95% band cut at 0); coinciding modes get nested
    markers, and the legend says which lie exactly at zero."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    styles = [("o", 9, "none"), ("s", 6.5, "none"), ("^", 4.5, None), ("x", 5, None)]
    for i, mode in enumerate([m for m in MODE_ORDER if m in set(lq["mode"])]):
        sub = lq[lq["mode"] == mode]
        g = interval_frame(sub, "quantile", "change")
        marker, ms, mfc = styles[i % len(styles)]
        ax.plot(g.index, g["mean"], marker=marker, ms=ms, mfc=mfc, ls="-", lw=1, color=MODE_PALETTE[mode],
                label=f"{mode} (all exactly 0)" if (sub["change"] == 0).all() else mode, zorder=3 + i)
        ax.fill_between(g.index, g["lo"].clip(lower=0), g["hi"], color=MODE_PALETTE[mode], alpha=0.2)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=-2e-4)
    ax.set_xlabel("quantile over held-out images and classes"); ax.set_ylabel("|logit after - logit before|")
    ax.legend(loc="center right", fontsize=9)
    return fig


def summary_table(summary: pd.DataFrame, by: str, labels: dict, order=None) -> pd.DataFrame:
    """A long summary as a display table: a row per ``by`` value, a column per ``labels`` metric (-> title)."""
    cell = summary.assign(value=[f"{m:.3f} [{lo:.3f}, {hi:.3f}]"
                                 for m, lo, hi in summary[["mean", "ci_low", "ci_high"]].values])
    table = cell.pivot(index=by, columns="metric", values="value")
    table = table.loc[order if order is not None else table.index, list(labels)]
    table.columns = list(labels.values())
    return table


OPTIMIZER_COLORS = {"sgd": style.OPTIMIZERS["sgd"], "adam": style.OPTIMIZERS["adam"], "reference": style.GREY,
                    "sgd-std": style.SKY, "adam-std": style.PINK}
CH01_GAP_LABELS = {"sgd": "SGD +\nmomentum", "adam": "Adam", "sgd-std": "SGD,\nstandardized", "adam-std": "Adam,\nstandardized",
                    "reference": "logistic regr.\n(converged,\n4000 samples)"}
PATH_STYLES = {"batch_stats": ("-", "o", "train_mode = separate_stats"),
               "pinned": ("--", "s", "backbone_eval = all_eval")}


def optimizer_gap_figure(gaps: pd.DataFrame, verdicts: dict, margin: float | None = None):
    """Paired task-B gap per head optimizer and the reference (:func:`.findings.gap_table`): a dot per seed, and the
    interval and verdict of the column's claim in ``verdicts`` (:func:`.findings.gap_figure_claims`), so the bar and
    the verdict the page states cannot disagree (issue 35); ``margin``: the reference test's band. Raises
    ``ValueError`` for a claim whose estimate is not the column's mean."""
    opts = [o for o in ("sgd", "adam", "sgd-std", "adam-std", "reference") if o in set(gaps["optimizer"])]
    # at most the column's width, so that 9 pt text stays 9 pt on the page (bnstudy.study.style)
    fig, ax = plt.subplots(figsize=(min(style.COLUMN_WIDTH_IN - 0.2, max(6.4, 1.35 * len(opts) + 1.4)), 4.2))
    ax.axhline(0, color=style.REFERENCE["zero"], lw=1)
    if margin is not None and "reference" in opts:
        i = opts.index("reference")
        ax.fill_between([i - 0.45, i + 0.45], -margin, margin, color=style.REFERENCE["band"], lw=0)
    for i, o in enumerate(opts):
        for j, (role, fill) in enumerate((("report", True), ("confirm", False))):
            g = gaps[(gaps["optimizer"] == o) & (gaps["role"] == role)]
            if len(g):
                jit = np.linspace(-0.04, 0.04, len(g)) if len(g) > 1 else np.zeros(1)
                ax.scatter(i - 0.22 + j * 0.14 + jit, g["gap"], s=24,
                           facecolors=OPTIMIZER_COLORS[o] if fill else "none", edgecolors=OPTIMIZER_COLORS[o],
                           alpha=0.85, zorder=3)
        mean, c = float(gaps[gaps["optimizer"] == o]["gap"].mean()), verdicts[o]
        if not np.isclose(float(c["estimate"]), mean, atol=1e-9):
            raise ValueError(f"optimizer_gap_figure: the claim for {o!r} has estimate {float(c['estimate']):.6g}, "
                             f"not the column's mean {mean:.6g}")
        iv = Interval(float(c["estimate"]), float(c["low"]), float(c["high"]), int(c["n"])).clipped(-1, 1)
        ax.errorbar([i + 0.2], [iv.mean], yerr=[[iv.mean - iv.low], [iv.high - iv.mean]], fmt="D",
                    color=style.REFERENCE["zero"], ms=6, capsize=5, lw=1.6, zorder=4)
        ax.text(i, 0.98, f"{textwrap.fill(str(c['verdict']), 12)}\n({100 * float(c['confidence']):.3g}%)",
                transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=style.MIN_FONT_PT)
    ax.set_xticks(range(len(opts)))
    ax.set_xticklabels([CH01_GAP_LABELS[o] for o in opts])
    ax.set_xlim(-0.6, len(opts) - 0.4)
    lo, hi = ax.get_ylim()  # room above the data for the verdicts' three lines
    ax.set_ylim(lo, hi + 0.45 * (hi - lo))
    ax.set_ylabel("difference in task-B accuracy\n(train_mode - backbone_eval)")
    handles = [Line2D([], [], marker="o", ls="", color=style.GREY, label="reported seed"),
               Line2D([], [], marker="o", ls="", mfc="none", color=style.GREY, label="confirmation seed"),
               Line2D([], [], marker="D", ls="-", color=style.REFERENCE["zero"],
                      label="all seeds: mean, verdict's interval")]
    if margin is not None:
        handles.append(Patch(color=style.REFERENCE["band"], label=f"reference test's margin \u00b1{margin:g}"))
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=2, bbox_to_anchor=(0.5, 0.0), fontsize=9)
    return min_text_size(fig)


def budget_figure_ch01(chosen: pd.DataFrame):
    """Task-B accuracy of the ``chosen`` heads against head-training steps, a panel per optimizer, a line per path,
    the reference per path as a horizontal line and band."""
    rep = chosen[chosen["role"].isin(["report", "confirm"])]
    opts = [o for o in ("sgd", "adam") if o in set(rep["optimizer"])]
    fig, axes = plt.subplots(1, len(opts), figsize=(3.4 * len(opts) + 0.4, 3.9), sharey=True, squeeze=False)
    ref_style = {"batch_stats": (style.OPTIMIZERS["sgd"], None, 0.22), "pinned": (style.GREY, "////", 0.25)}
    for ax, o in zip(axes[0], opts):
        for path, (ls, marker, label) in PATH_STYLES.items():
            g = interval_frame(rep[(rep["optimizer"] == o) & (rep["path"] == path)], "step", "accuracy")
            ax.plot(g.index, g["mean"], ls=ls, marker=marker, ms=4, color=OPTIMIZER_COLORS[o], label=label)
            ax.fill_between(g.index, g["lo"], g["hi"], color=OPTIMIZER_COLORS[o], alpha=0.18, lw=0)
            r = rep[(rep["optimizer"] == "reference") & (rep["path"] == path)]
            if len(r):
                iv, (color, hatch, alpha) = t_interval(r["accuracy"]), ref_style[path]
                ax.axhspan(iv.low, iv.high, facecolor=color if hatch is None else "none", edgecolor=color,
                           hatch=hatch, alpha=alpha, lw=0)
                ax.axhline(iv.mean, color=color, ls=ls, lw=1.2,
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


def lr_figure(lrt: pd.DataFrame, chosen: dict | None = None):
    """The tuning seeds' validation accuracy against learning rate per optimizer and path (the seeds' range as a
    band: a t interval of 2-3 seeds would be mostly its quantile); ``chosen`` rates ringed; standardized heads below."""
    present = set(lrt["optimizer"])
    base = [o for o in ("sgd", "adam") if o in present or o + "-std" in present]
    rows = [[o if o in present else None for o in base]]
    if any(o + "-std" in present for o in base):
        rows.append([o + "-std" if o + "-std" in present else None for o in base])
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
    handles.append(Line2D([], [], marker="o", ms=3, ls="", color=style.GREY))
    labels.append(f"one tuning seed (band: range of {int(lrt['seed'].nunique())} seeds)")
    fig.tight_layout(rect=(0, 0.7 / (3.0 * len(rows) + 0.7), 1, 1))   # the legend's 0.7 inch below the panels
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=9)
    return min_text_size(fig)


EXPLORE_LABELS = {"sgd": "SGD + momentum", "adam": "Adam", "sgd-std": "SGD + momentum, standardized features",
                  "adam-std": "Adam, standardized features"}
PATH_LABELS = {"batch_stats": "train_mode path", "pinned": "pinned path"}


def _p(p) -> str:
    return "-" if pd.isna(p) else "< 0.001" if p < 0.001 else f"{p:.3f}"


def _diff(mean, low, high, n) -> str:
    """A difference with its interval, or its mean and range of seeds below two seeds."""
    return _ci_text(mean, low, high, int(n), min_seeds=2)


def ch01_exploratory_display(ex: pd.DataFrame) -> pd.DataFrame:
    """:func:`~bnstudy.study.experiments.freeze_modes.findings.exploratory_tests` as a display table."""
    label = lambda r: EXPLORE_LABELS.get(r["optimizer"], r["optimizer"])  # noqa: E731
    return pd.DataFrame([{
        "head": f"main run: {label(r)}, lr {r['lr']:g} (reported seeds)" if r["test"] == "main" else
        f"{label(r)}, lr chosen on validation (all seeds)", "steps": int(r["step"]), "seeds": int(r["n"]),
        "difference [family interval]": _diff(r["mean"], r["ci_low"], r["ci_high"], r["n"]), "p": _p(r["p"]),
        "p (Holm)": _p(r["p_holm"]), "verdict": r["verdict"]} for _, r in ex.iterrows()]).set_index("head")


def ch01_std_display(claims: pd.DataFrame, numbers: pd.DataFrame, reference: dict | None = None) -> pd.DataFrame:
    """The standardized heads per optimizer: the gap at every checkpoint, then each path's accuracy and gain over the
    plain head; ``reference`` (``{path: accuracy}``) as a last row. ``ValueError`` when they were not run."""
    gap_at = {k.removeprefix("std_gap_at_"): number(numbers, k) for k in numbers["key"] if k.startswith("std_gap_at_")}
    if not gap_at:
        raise ValueError("ch01_std_display needs standardized heads (the tuning numbers have no std_gap_at)")
    reduced = {k.removeprefix("reduction_") for k in claims[claims["family"] == "reduction"]["key"]}
    steps = sorted({int(k.rsplit("_", 1)[1]) for k in gap_at})
    main_step = number(numbers, "main_step")
    rows = []
    for o in [o for o in ("sgd", "adam") if o in reduced]:
        row = {"head (standardized features)": EXPLORE_LABELS[o]}
        for st in steps:
            iv = gap_at[f"{o}_{st}"]
            row[f"gap, {st:,} steps"] = _diff(iv.mean, iv.low, iv.high, iv.n)
        for p, label in PATH_LABELS.items():
            g = number(numbers, f"std_gain_{o}_{p}")
            row[f"{label}, {main_step:,} steps (gain)"] = (f"{number(numbers, f'std_acc_{o}_{p}'):.3f} "
                                                         f"(+{_diff(g.mean, g.low, g.high, g.n)})")
        rows.append(row)
    if reference:
        rows.append({"head (standardized features)": "reference (converged)", **{f"gap, {st:,} steps": "-" for st in steps},
                     **{f"{label}, {main_step:,} steps (gain)": f"{reference[p]:.3f}" for p, label in PATH_LABELS.items()}})
    return pd.DataFrame(rows).set_index("head (standardized features)")


def ch01_sensitivity_display(sens: pd.DataFrame) -> pd.DataFrame:
    """The reference's sensitivity fits (:func:`~bnstudy.study.experiments.freeze_modes.findings.reference_sensitivity`)."""
    return pd.DataFrame([{"L2 penalty": f"{r['l2']:g}", "fit samples": int(r["n_fit"]), "seeds": int(r["n"]),
                          "train_mode path": f"{r['acc_batch_stats']:.3f}", "pinned path": f"{r['acc_pinned']:.3f}",
                          "difference [family interval]": _diff(r["mean"], r["ci_low"], r["ci_high"], r["n"]),
                          "verdict": r["verdict"]} for _, r in sens.iterrows()]).set_index("L2 penalty")


def ch01_lr_choice_display(choice: pd.DataFrame) -> pd.DataFrame:
    """The learning rate chosen when selecting at each checkpoint (rows: optimizer and path)."""
    return pd.DataFrame({f"{EXPLORE_LABELS.get(o, o)}, {PATH_LABELS.get(p, p)}": {
        f"selected at {int(r['step']):,} steps": f"{r['lr']:g}" + ("" if r["position"] == "interior"
                                                                 else f" ({r['position']} tried)")
        for _, r in g.iterrows()} for (o, p), g in choice.groupby(["optimizer", "path"], sort=False)}).T.rename_axis("head")
