"""Chapter 8, what is drawn: accuracy against the test batch size (log2 axis) per stream and shift family, the
prior-weighted mix against test-batch statistics, and the mismatch against the gain of test-batch statistics. Means
and 95% Student-t intervals over seeds (an accuracy cut to [0, 1], a difference to [-1, 1])."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ... import style
from ...plots import interval_frame, legend_below
from .claims import NAMES, STREAM_NAMES, STREAMS_ORDER, parsed

METHODS_DRAWN = ("source", "test_batch", "prior_tuned", "dua", "tent_tuned", "routed")
MARKERS = dict(zip(METHODS_DRAWN, ("s", "o", "^", "D", "v", "P")))


def accuracy_figure(table: pd.DataFrame, strength: float):
    """Accuracy (head A) against the test batch size at shift strength ``strength``: columns the streams, rows the
    shift families; one line per method of :data:`METHODS_DRAWN` (mean over seeds of each seed's mean over the
    stream's domains, band 95% interval), the oracle bank dotted. ``table``: :func:`..claims.conditions`."""
    t = table[table["strength"] == strength]
    fams = list(dict.fromkeys(t["family"]))
    fig, axes = plt.subplots(len(fams), len(STREAMS_ORDER), figsize=(7.3, 2.2 * len(fams) + 0.6), sharex=True,
                             sharey=True, squeeze=False)
    for i, f in enumerate(fams):
        for j, s in enumerate(STREAMS_ORDER):
            ax, cell = axes[i, j], t[(t["family"] == f) & (t["stream"] == s)]
            for m in METHODS_DRAWN:
                fr = interval_frame(cell[cell["condition"] == m], "test_batch", "accuracy").sort_index()
                if not len(fr):
                    continue
                c = style.color("test_time", m)
                # TENT often equals test-batch statistics (its tuned rate 0): dashed over the solid line beneath
                ax.plot(fr.index, fr["mean"], marker=MARKERS[m], ms=3.5, color=c, label=NAMES[m],
                        ls="--" if m == "tent_tuned" else "-")
                ax.fill_between(fr.index, fr["lo"].clip(0, 1), fr["hi"].clip(0, 1), color=c, alpha=0.2, lw=0)
            o = cell[cell["condition"] == "oracle"].groupby("test_batch")["accuracy"].mean()
            ax.plot(o.index, o.values, ls=":", color=style.color("test_time", "oracle"), label=NAMES["oracle"])
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1)
            if i == 0:
                ax.set_title(STREAM_NAMES[s])
            if j == 0:
                ax.set_ylabel(f"{f}\naccuracy")
            if i == len(fams) - 1:
                ax.set_xlabel("test batch size")
    return legend_below(fig, axes[0, 0], ncol=4)


def mix_figure(claims_table: pd.DataFrame):
    """The prior-weighted mix at its tuned ``N`` minus test-batch statistics against the test batch size, per
    stream (columns, each on its own y scale: the class-sorted differences are an order of magnitude larger) and
    shift family (colour), one marker per strength; bars: the ``mix`` family's intervals (Bonferroni over the
    family, cut to [-1, 1]); shaded: the equivalence margin."""
    p = parsed(claims_table[claims_table["family"] == "mix"])
    fig, axes = plt.subplots(1, len(STREAMS_ORDER), figsize=(7.3, 2.8), sharey=False, squeeze=False)
    strengths = sorted(p["strength"].unique())
    for j, s in enumerate(STREAMS_ORDER):
        ax = axes[0, j]
        m = float(p["margin"].iloc[0]) if len(p) else 0.0
        ax.axhspan(-m, m, color=style.color("reference", "band"), lw=0)
        ax.axhline(0, color=style.color("reference", "zero"), lw=0.8)
        for k, (f, g) in enumerate(p[p["stream"] == s].groupby("shift", sort=False)):
            for n, t in enumerate(strengths):
                r = g[g["strength"] == t].sort_values("test_batch")
                x = r["test_batch"] * 2 ** (0.12 * (k - 1) + 0.04 * n)
                ax.errorbar(x, r["estimate"], yerr=[r["estimate"] - r["low"].clip(-1, 1),
                                                    r["high"].clip(-1, 1) - r["estimate"]],
                            fmt="o" if n else "s", mfc="white" if n == 0 else None, ms=3.5, lw=0.8, capsize=1.5,
                            color=style.color("shift", f), label=f"{f}, t = {t:g}")
        ax.set_xscale("log", base=2)
        ax.set_title(STREAM_NAMES[s])
        ax.set_xlabel("test batch size")
    axes[0, 0].set_ylabel("mix minus test-batch\nstatistics (accuracy)")
    return legend_below(fig, axes[0, 0], ncol=3)


def mismatch_figure(mm: pd.DataFrame):
    """Chapter 3's mismatch of the source network on a domain (before any adaptation, log scale) against the gain
    of test-batch statistics over the source statistics at the largest test batch on the single-shift stream,
    one point per seed, family, strength and domain, coloured by family. ``mm``: :func:`..claims.mismatch_rows`."""
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    for f, g in mm.groupby("family", sort=False):
        ax.scatter(g["mismatch"], g["gain"], s=12, alpha=0.7, color=style.color("shift", f), label=f)
    ax.axhline(0, color=style.color("reference", "zero"), lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("mismatch before adapting (mean KL over layers)")
    ax.set_ylabel("test-batch statistics\nminus source (accuracy)")
    return legend_below(fig, ax, ncol=3)
