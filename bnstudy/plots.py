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

# --- chapter 7 (issue 15): real digits and torchvision networks ---------------------------------------------------

#: Chapter 7's network order in every figure (smallest first).
CH07_NETWORK_ORDER = ("small_cnn", "resnet18", "mobilenet_v3_small")


#: Chapter 7's corruptions in the page's order (brightness, contrast, noise, blur, inversion).
CH07_CORRUPTION_ORDER = ("brightness", "contrast", "gaussian_noise", "blur", "inversion")


def _ch07_label(name: str, kind: str = "network") -> str:
    """A readable name for a chapter-7 network or corruption (real_data's label maps)."""
    from .experiments.real_data import CORRUPTION_LABELS, NETWORK_LABELS
    return (NETWORK_LABELS if kind == "network" else CORRUPTION_LABELS).get(name, name)


def _ch07_nets(col: pd.Series) -> list:
    present = list(dict.fromkeys(col))
    return [n for n in CH07_NETWORK_ORDER if n in present] + [n for n in present if n not in CH07_NETWORK_ORDER]


def ch07_accuracy_figure(acc: pd.DataFrame, chance: float):
    """Accuracy per freeze mode at the reference corruption, one panel per network, 95% bars over seeds cut to
    [0, 1] (``acc``: real_data.accuracy_table): task A before and after stage 2, and task B. Drawn at the column
    width with text of at least 9 pt; colours from :mod:`bnstudy.style`."""
    nets = _ch07_nets(acc["network"])
    metrics = {"task_a_before": "task A before", "task_a_after": "task A after", "task_b": "task B"}
    colors = (style.GREY, style.VERMILLION, style.BLUE)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(1, len(nets), figsize=(style.COLUMN_WIDTH_IN, 3.6), sharey=True, squeeze=False)
        for ax, net in zip(axes[0], nets):
            g = acc[acc["network"] == net]
            modes = [m for m in MODE_ORDER if m in set(g["mode"])]
            for k, (metric, label) in enumerate(metrics.items()):
                h = g[g["metric"] == metric].set_index("mode").loc[modes]
                lo, hi = h["ci_low"].clip(0, 1), h["ci_high"].clip(0, 1)
                x = np.arange(len(modes)) + (k - 1) * 0.22
                ax.errorbar(x, h["mean"], yerr=[h["mean"] - lo, hi - h["mean"]], fmt="o", ms=4, capsize=2,
                            label=label, color=colors[k], mfc="none" if metric == "task_a_before" else None,
                            zorder=3 + k)
            ax.axhline(chance, color=style.REFERENCE["chance"], ls=":", lw=1, label="chance")
            ax.set_xticks(range(len(modes)))
            ax.set_xticklabels(modes, rotation=90)
            ax.set_title(_ch07_label(net)); ax.set_ylim(0, 1.02)
        axes[0][0].set_ylabel("held-out accuracy")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0, 1, 0.88))
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), bbox_to_anchor=(0.5, 1.0), frameon=False)
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def ch07_effects_figure(eff: pd.DataFrame):
    """Cost (task A) and benefit (task B) of drifting statistics, each ``train_mode - backbone_eval``, against
    corruption severity: rows are corruptions, columns networks (``eff``: real_data.effects_table); bars are its
    intervals (the network's condition family), cut to [-1, 1]. Severity 0 (no corruption) is drawn in every row.
    Drawn at the column width with text of at least 9 pt (five rows of three panels: five columns would shrink it)."""
    nets = _ch07_nets(eff["network"])
    present = [c for c in dict.fromkeys(eff["corruption"]) if c != "none"]
    corrs = [c for c in CH07_CORRUPTION_ORDER if c in present] + [c for c in present if c not in CH07_CORRUPTION_ORDER]
    sevs = sorted(set(int(v) for v in eff["severity"]))
    colors = {"cost": style.EFFECTS["cost"], "benefit": style.EFFECTS["benefit"]}
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(len(corrs), len(nets), figsize=(style.COLUMN_WIDTH_IN, 1.75 * len(corrs) + 1.0),
                                 sharex=True, sharey=True, squeeze=False)
        for i, corr in enumerate(corrs):
            for j, net in enumerate(nets):
                ax = axes[i][j]
                g = eff[(eff["network"] == net) & eff["corruption"].isin(["none", corr])]
                for name in ("cost", "benefit"):
                    h = g[g["effect"] == name].sort_values("severity")
                    lo, hi = h["ci_low"].clip(-1, 1), h["ci_high"].clip(-1, 1)
                    ax.errorbar(h["severity"], h["mean"], yerr=[h["mean"] - lo, hi - h["mean"]], fmt="o-", ms=3,
                                capsize=2, lw=1, color=colors[name],
                                label=f"{name} (task {'A' if name == 'cost' else 'B'})")
                ax.axhline(0, color=style.REFERENCE["zero"], lw=0.6)
                if i == 0:
                    ax.set_title(_ch07_label(net))
                if j == 0:
                    label = _ch07_label(corr, "corruption")
                    if corr == "inversion":  # its x axis is not monotone in pixel statistics: give the mix s
                        from .data import SEVERITY_LEVELS
                        shown = [v for v in sevs if v > 0]
                        label += "\n(s = " + ", ".join(f"{SEVERITY_LEVELS['inversion'][v - 1]:g}" for v in shown) + ")"
                    ax.set_ylabel(label)
                if i == len(corrs) - 1:
                    ax.set_xlabel("severity")
                ax.set_xticks(sevs)
        # accuracy differences live in [-1, 1]
        axes[0][0].set_ylim(max(-1.05, axes[0][0].get_ylim()[0]), min(1.05, axes[0][0].get_ylim()[1]))
        fig.supylabel("train_mode − backbone_eval (accuracy)")
        h, lab = axes[0][0].get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        fig.legend(h, lab, loc="upper center", ncol=2, bbox_to_anchor=(0.5, 1.0), frameon=False)
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def ch07_mismatch_figure(cond: pd.DataFrame, rho: dict | None = None):
    """Cost of drifting statistics against the statistics mismatch measured before stage 2, one panel per
    network, one point per corruption and severity (``cond``: real_data.condition_table): x the median
    mismatch over seeds with its quartiles as horizontal bars, y the mean cost (task A, ``train_mode -
    backbone_eval``) with its interval (the network's condition family); each
    corruption's points joined in severity order from the uncorrupted point. ``rho``: optional ``{network:
    Interval or float}`` (Spearman rho) written in each panel's title. Corruptions differ in colour and marker."""
    nets = _ch07_nets(cond["network"])
    present = list(dict.fromkeys(cond["corruption"]))
    corrs = [c for c in ("none",) + CH07_CORRUPTION_ORDER if c in present] + \
        [c for c in present if c not in ("none",) + CH07_CORRUPTION_ORDER]
    # one warm hue only (orange): brightness, Gaussian noise and inversion were orange, vermilion and tan before
    colors = {c: style.color("shift", c) for c in corrs}  # the same colour per kind of shift as chapter 3's
    markers = dict(zip(corrs, "osD^vPX*"))
    rc = plt.rc_context(style.rc())
    rc.__enter__()
    ncol = 2 if len(nets) > 1 else 1
    nrow = -(-(len(nets) + 1) // ncol) if len(nets) > 1 else 1
    fig, grid = plt.subplots(nrow, ncol, figsize=(style.COLUMN_WIDTH_IN, 3.3 * nrow), sharey=True, squeeze=False)
    flat = [a for row in grid for a in row]
    axes = [flat[:len(nets)]]
    for ax in flat[len(nets):]:
        ax.axis("off")
    for ax, net in zip(axes[0], nets):
        g = cond[cond["network"] == net]
        none = g[g["corruption"] == "none"]
        for corr in corrs:
            h = g[g["corruption"] == corr].sort_values("severity")
            if corr != "none":
                line = pd.concat([none, h])
                ax.plot(line["mismatch_kl"], line["cost"], "-", lw=0.7, color=colors[corr], alpha=0.6)
            xerr = None
            if "mismatch_kl_q25" in h:
                xerr = [h["mismatch_kl"] - h["mismatch_kl_q25"], h["mismatch_kl_q75"] - h["mismatch_kl"]]
            ax.errorbar(h["mismatch_kl"], h["cost"], yerr=[h["cost"] - h["cost_lo"].clip(-1, 1),
                                                           h["cost_hi"].clip(-1, 1) - h["cost"]],
                        xerr=xerr, fmt=markers[corr], ms=5, capsize=2, lw=0.8, color=colors[corr],
                        label=_ch07_label(corr, "corruption"))
        ax.set_xscale("log"); ax.axhline(0, color="black", lw=0.6)
        ax.grid(False, axis="x")  # a vertical gridline next to the left spine read as a doubled axis line
        title = _ch07_label(net)
        if rho is not None and net in rho:
            r = rho[net]
            if hasattr(r, "low"):
                r = r.clipped(-1, 1)  # a correlation lies in [-1, 1]; a t interval over few seeds can overshoot
            title += (f"\nper-seed Spearman ρ {r.mean:.2f} [{r.low:.2f}, {r.high:.2f}]" if hasattr(r, "low")
                      else f"\nSpearman ρ = {r:.2f}")
        ax.set_title(title, fontsize=10)
        # ticks at 1, 2 and 5 per decade, plain numbers (a narrow log range otherwise labels every minor tick);
        # major and minor ticks of one length, so that their labels sit at one height
        ax.xaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(2, 5)))
        ax.tick_params(axis="x", which="both", labelsize=style.MIN_FONT_PT, length=3.5, width=0.8)
        for fmt in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
            fmt(matplotlib.ticker.FormatStrFormatter("%.2g"))
        ax.set_xlabel("median mismatch KL over seeds (nats)")
    # accuracy differences live in [-1, 1]; t intervals over few seeds can overshoot
    axes[0][0].set_ylim(max(-1.05, axes[0][0].get_ylim()[0]), min(1.05, axes[0][0].get_ylim()[1]))
    for ax in grid[:, 0]:
        ax.set_ylabel("cost: task A, train_mode\n− backbone_eval (accuracy)")
    h, lab = axes[0][0].get_legend_handles_labels()
    spare = flat[len(nets)] if len(flat) > len(nets) else None
    (spare or axes[0][-1]).legend(h, lab, title="corruption", loc="center" if spare is not None else "best")
    fig.tight_layout()
    rc.__exit__(None, None, None)
    return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


# --- chapters 1 and 2, issue 10: the head's optimizer swept, training budget, trap 3's dropout, trap 5's loss,
# --- training on class-sorted batches; and a floor on text size -------------------------------------------------

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


def _ci_text(mean, lo, hi, n, min_seeds=3, digits=3) -> str:
    if n < min_seeds:
        return f"{mean:.{digits}f} (range of {n} seeds)"
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"




def fit_page(fig: plt.Figure, width: float = 6.6, min_size: float = 9.0) -> plt.Figure:
    """Shrink ``fig`` to at most ``width`` inches wide (aspect kept) and raise text below ``min_size`` pt.

    A figure wider than the page is scaled down by the browser, and its text with it; at most the
    page's width (about 6.6 in at 100 dpi in the book's theme), text set at 9 pt stays 9 pt.
    """
    w, h = fig.get_size_inches()
    if w > width:
        fig.set_size_inches(width, h * width / w)
    return min_text_size(fig, min_size)
