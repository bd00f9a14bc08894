"""Chapter 3, what is drawn: the per-level effects, the net in its views, the budget points, the grid's heatmaps,
the retention scatter and the mismatch candidates (colours from :mod:`bnstudy.study.style` only). Figures at most 9 in wide
(the page's width), text at least 9 pt."""

from __future__ import annotations

import textwrap

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

from ... import style
from ...plots import MODE_ORDER, MODE_PALETTE, min_text_size
from .run import LINES, REFERENCE_SHIFT

#: Each line's axis label and where chapter 1's shift sits on it (figures).
LINE_XLABELS = {"brightness": "brightness offset b (contrast 1)", "contrast": "contrast gain c (brightness 0)",
                "both": f"strength t (b = {REFERENCE_SHIFT[0]:g}t, c = 1 + {REFERENCE_SHIFT[1] - 1:g}t)",
                "blur": "blur std (pixels)", "noise": "extra noise std", "same_both": "strength t (as both)",
                "same_noise": "extra noise std"}
REFERENCE_STRENGTH = {"brightness": REFERENCE_SHIFT[0], "contrast": REFERENCE_SHIFT[1], "both": 1.0, "same_both": 1.0}


CH3_FONT = {"font.size": 9.5, "axes.titlesize": 9.5, "axes.labelsize": 9.5, "xtick.labelsize": 9,
            "ytick.labelsize": 9, "legend.fontsize": 9, "legend.title_fontsize": 9}
#: Task A's and task B's differences (train_mode - backbone_eval) and their sum: style.EFFECTS ("cost" is task A's).
EFFECT_COLORS = {k: style.color("effect", k) for k in ("cost", "benefit", "net")}
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


def ch3_level_effects(levels, xlabels: dict, reference: dict, points):
    """Task A's and task B's differences per level in accuracy (``levels``: findings.level_table, its raw view)
    with their family intervals, one panel per line, log strength axis, the two series dodged; ``reference[line]``:
    chapter 1's shift, dotted; ``points`` (findings.seed_points): each seed's value. No crossover is drawn (the
    page says why)."""
    with plt.rc_context(CH3_FONT):
        lv = levels[levels["view"] == "raw"]
        lines = list(dict.fromkeys(lv["line"]))
        fig, axes = _ch3_grid(len(lines))
        for ax, t in zip(axes, lines):
            for name, f, mk in (("cost", 0.93, "v"), ("benefit", 1.07, "^")):
                g = _ch3_signed(lv[(lv["line"] == t) & (lv["metric"] == name)].sort_values("strength"), name)
                p = points[(points["line"] == t) & (points["metric"] == name)]
                ax.plot(p["strength"] * f, (-1 if name == "cost" else 1) * p["value"], ".", ms=2.5, alpha=0.35,
                        color=EFFECT_COLORS[name], zorder=1,
                        label=f"{' '.join(CH3_EFFECT_LABELS[name].split(' ')[:2])}, one seed")
                ax.errorbar(g["strength"] * f, g["mean"], yerr=[g["mean"] - g["ci_low"], g["ci_high"] - g["mean"]],
                            fmt=mk + "-", ms=5, lw=1, capsize=2, color=EFFECT_COLORS[name], label=CH3_EFFECT_LABELS[name])
            if t in reference and lv.loc[lv["line"] == t, "strength"].between(0, np.inf).any():
                ax.axvline(reference[t], color="grey", ls=":", lw=1.2, label="chapter 1's shift")
            ax.axhline(0, color="black", lw=0.6)
            _ch3_log_levels(ax, lv.loc[lv["line"] == t, "strength"])
            ax.set_title(t.replace("_", " ") + (" (same classes)" if t.startswith("same") else ""))
            ax.set_xlabel(textwrap.fill(xlabels.get(t, "strength"), 26))
        for ax in axes[::3]:
            ax.set_ylabel("difference in accuracy")
        _ch3_legend(fig, axes, ncol=2)
    return fig


def ch3_net_views(levels, margin: float, xlabels: dict):
    """The net per level in the raw and the ``vs no shift`` view of ``levels`` (findings.level_table) with family
    intervals and the band ``±margin`` shaded, one panel per line, on a linear y axis shared by the panels (issue 35:
    a symmetric-log axis made a loss of 0.7 look like one of 0.1). Filled markers: a direction shown; open diamonds:
    equivalent within the margin; open circles: not decided."""
    labels = {"raw": "benefit − cost", "vs no shift": "benefit above its no-shift value − cost"}
    views = list(labels)
    with plt.rc_context(CH3_FONT):
        lines = list(dict.fromkeys(levels["line"]))
        fig, axes = _ch3_grid(len(lines), height=2.9)
        col = {"raw": style.color("effect", "net"), "vs no shift": style.PURPLE}
        drawn = levels[(levels["metric"] == "net") & levels["view"].isin(views)]
        drawn = _ch3_signed(drawn, "net") if len(drawn) else drawn
        ylim = (min(-0.1, float(drawn["ci_low"].min()) if len(drawn) else -0.1) - 0.05,
                max(0.1, float(drawn["ci_high"].max()) if len(drawn) else 0.1) + 0.05)
        for ax, t in zip(axes, lines):
            ax.axhspan(-margin, margin, color="grey", alpha=0.25, lw=0, label=f"equivalence band ±{margin:g}")
            for k, view in enumerate(views):
                f = 0.93 + 0.14 * k
                g = levels[(levels["line"] == t) & (levels["metric"] == "net") & (levels["view"] == view)]
                g = _ch3_signed(g.sort_values("strength"), "net")
                ax.errorbar(g["strength"] * f, g["mean"], yerr=[g["mean"] - g["ci_low"], g["ci_high"] - g["mean"]],
                            fmt="-", lw=1, capsize=2, color=col[view], label=labels[view])
                res = g["kind"].isin(["lower", "higher"])
                tie = ~res & (g["kind"] == "equivalent")
                ax.plot(g["strength"][res] * f, g["mean"][res], "o", ms=4.5, color=col[view])
                ax.plot(g["strength"][~res & ~tie] * f, g["mean"][~res & ~tie], "o", ms=4.5, mfc="white",
                        color=col[view])
                ax.plot(g["strength"][tie] * f, g["mean"][tie], "D", ms=4, mfc="white", color=col[view])
            ax.axhline(0, color="black", lw=0.6)
            ax.set_ylim(*ylim)
            ax.yaxis.set_major_locator(plt.MultipleLocator(0.25))
            _ch3_log_levels(ax, levels.loc[levels["line"] == t, "strength"], ylim=ylim)
            ax.set_title(t.replace("_", " ") + (" (same classes)" if t.startswith("same") else ""))
            ax.set_xlabel(textwrap.fill(xlabels.get(t, "strength"), 26))
        for ax in axes[::3]:
            ax.set_ylabel("difference in accuracy")
        _ch3_legend(fig, axes, ncol=2)
    return fig


def _not_run(what: str):
    """A small figure that says ``what`` was not run (a design that leaves a part out, e.g. empty ``budget_steps``):
    the page keeps its figure and caption instead of failing on an empty table."""
    fig, ax = plt.subplots(figsize=(style.COLUMN_WIDTH_IN, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, f"not run: {what}", ha="center", va="center")
    return fig


def ch3_budget_points(bp):
    """Every budget point (``bp``: findings.budget_points), one column per ``t``: task-B accuracy of the drifting and
    the pinned head (top) and the two differences and their sum (bottom) against stage-2 steps, series dodged. An
    empty ``bp`` (no budget check in the design) gives a figure that says so."""
    if not len(bp):
        return _not_run("the budget check (budget_levels or budget_steps empty)")
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
    """Task A's and task B's differences and their sum on the grid (``grid``: findings.grid_table), one panel each;
    cells show the mean and the half-width of the 95% interval. An empty ``grid`` (no grid in the design) gives a
    figure that says so."""
    if not len(grid):
        return _not_run("the brightness x contrast grid (grid_brightness and grid_contrast empty)")
    with plt.rc_context(CH3_FONT):
        gb, gc = sorted(grid["brightness"].unique()), sorted(grid["contrast"].unique())
        wide = {m: _ch3_signed(grid[grid["metric"] == m], m).set_index(["brightness", "contrast"])
                for m in ("cost", "benefit", "net")}
        titles = {"cost": "task-A difference", "benefit": "task-B difference", "net": "sum of both"}
        # two panels a row (issue 35: at three a row the cells' two lines of text ran into each other)
        fig, grid_axes = plt.subplots(2, 2, figsize=(style.COLUMN_WIDTH_IN, 6.0))
        axes = [grid_axes[0][0], grid_axes[0][1], grid_axes[1][0]]
        grid_axes[1][1].axis("off")
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
        for ax in (axes[0], axes[2]):
            ax.set_ylabel("brightness offset b")
        grid_axes[1][1].text(0.05, 0.5, "colour: difference in accuracy\n(train_mode − backbone_eval);\nin each cell "
                             "the mean over seeds\nand ± the half-width of its\n95% interval", ha="left", va="center",
                             fontsize=9, transform=grid_axes[1][1].transAxes)
        fig.tight_layout()
    return min_text_size(fig)


#: Fig. 6's marks per condition kind: the second family (task B with task A's classes) gets open markers and
#: colours of its own, so each twin line is told apart from its twin (``noise`` / ``same_noise`` were two pinks).
#: Every line of :data:`LINES` gets its mark from its name (``same_*``: open diamonds), so a new line needs only its
#: colour in ``style.SHIFTS`` (``style.color`` raises naming it until then).
CH3_KIND_MARKS = {**{k: ("D", style.color("shift", k), False) if k.startswith("same_") else
                     ("o", style.color("shift", k), True) for k in LINES},
                  "no shift": ("s", style.GREY, True), "no shift, same classes": ("s", style.GREY, False)}


def ch3_candidates(conditions, selection: dict, candidates: dict, winner: str):
    """Task A's difference against each mismatch candidate (``conditions``: findings.condition_table, grid-only shifts
    left out), log measure axis; the second family in open markers. The last panel: each candidate's score minus the
    ``winner``'s with its 95% bootstrap interval (``selection``: ``mismatch_selection(...)["candidates"]``; filled
    where it excludes 0)."""
    with plt.rc_context(CH3_FONT):
        names = [n for n in candidates if candidates[n] in conditions.columns]
        ncol = 2  # issue 35: three narrow panels a row crowded their tick labels into each other
        nrow = int(np.ceil((len(names) + 1) / ncol))
        fig, axs = plt.subplots(nrow, ncol, figsize=(style.COLUMN_WIDTH_IN, 2.7 * nrow + 1.3), squeeze=False)
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
            # labels at powers of ten only, upright (at most a handful per panel, none overlapping)
            ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0,), numticks=6))
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_title(f"{n}: score {selection[n]['score']:.3f}")
            ax.set_xlabel(f"{n} (before stage 2)")
            ax.set_ylim(-1.0, 0.1)
        for i, ax in enumerate(axes[:len(names)]):
            if i % ncol == 0:
                ax.set_ylabel("task-A difference\n(train_mode − backbone_eval)")
        ax = axes[len(names)]
        others = [n for n in names if n != winner]
        for i, n in enumerate(others):
            v, lo, hi = (selection[n][k] for k in ("diff", "diff_lo", "diff_hi"))
            ax.errorbar([v], [i], xerr=[[v - lo], [hi - v]], fmt="o", color="0.15", mfc="0.15" if lo > 0 else "white",
                        capsize=3, ms=6, mew=1.2)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(others))); ax.set_yticklabels(others); ax.invert_yaxis()
        ax.set_xlabel(f"score minus {winner}'s\n(accuracy; 95% bootstrap)")
        ax.set_title("against the lowest score")
        _ch3_legend(fig, axes[:len(names)], ncol=3, order=list(CH3_KIND_MARKS))
        fig.tight_layout(rect=(0, 0.12, 1, 1))
    return min_text_size(fig)


# Paths of train_mode along the three affine lines: bnstudy.study.style's shift-path palette (no mode uses its colours).
CH3_PATH_COLORS = style.palette("shift_path")


def ch3_retention(scatter):
    """Task-B gain over ``backbone_eval`` against task-A change (``scatter``: findings.scatter_table), a marker shape
    and size per mode (so coinciding modes stay visible); ``train_mode``'s points joined along each line."""
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
