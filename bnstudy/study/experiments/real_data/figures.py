"""Chapter 7, what is drawn from :mod:`.findings`' tables: three figures (column width, colours from
:mod:`bnstudy.study.style`) and the verdict grid."""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

from ... import style
from ...data import SEVERITY_LEVELS
from ...plots import MODE_ORDER, fit_page
from ...words import claim, claim_text
from .findings import CLIP, CORRUPTION_LABELS, networks_of, network_label, verdict_table

#: The page's order of networks and corruptions; others follow in the order of the rows.
NETWORK_ORDER = ("small_cnn", "resnet18", "mobilenet_v3_small")
CORRUPTION_ORDER = ("none", "brightness", "contrast", "gaussian_noise", "blur", "inversion")


def _ordered(col: pd.Series, order: tuple) -> list:
    present = list(dict.fromkeys(col))
    return [v for v in order if v in present] + [v for v in present if v not in order]


def _yerr(h: pd.DataFrame, mean: str, low: str, high: str, lo: float, hi: float) -> list:
    return [h[mean] - h[low].clip(lo, hi), h[high].clip(lo, hi) - h[mean]]


def ch07_accuracy_figure(acc: pd.DataFrame, chance: float):
    """Accuracy per freeze mode at the reference, one panel per network (``acc``: :func:`.findings.accuracy_table`)."""
    nets = _ordered(acc["network"], NETWORK_ORDER)
    metrics = {"task_a_before": "task A before", "task_a_after": "task A after", "task_b": "task B"}
    colors = (style.GREY, style.VERMILLION, style.BLUE)
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(1, len(nets), figsize=(style.COLUMN_WIDTH_IN, 3.6), sharey=True, squeeze=False)
        for ax, net in zip(axes[0], nets):
            g = acc[acc["network"] == net]
            modes = [m for m in MODE_ORDER if m in set(g["mode"])]
            for k, (metric, label) in enumerate(metrics.items()):
                h = g[g["metric"] == metric].set_index("mode").loc[modes]
                ax.errorbar(np.arange(len(modes)) + (k - 1) * 0.22, h["mean"], yerr=_yerr(h, "mean", "ci_low",
                            "ci_high", 0, 1), fmt="o", ms=4, capsize=2, label=label, color=colors[k],
                            mfc="none" if metric == "task_a_before" else None, zorder=3 + k)
            ax.axhline(chance, color=style.REFERENCE["chance"], ls=":", lw=1, label="chance")
            ax.set_xticks(range(len(modes)), modes, rotation=90)
            ax.set_title(network_label(net)); ax.set_ylim(0, 1.02)
        axes[0][0].set_ylabel("held-out accuracy")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0, 1, 0.88))
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), bbox_to_anchor=(0.5, 1.0), frameon=False)
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def _clip_ylim(ax) -> None:  # accuracy differences live in [-1, 1]; t intervals over few seeds can overshoot
    ax.set_ylim(max(-1.05, ax.get_ylim()[0]), min(1.05, ax.get_ylim()[1]))


def ch07_effects_figure(eff: pd.DataFrame):
    """Task A and task B ``train_mode - backbone_eval`` against severity, one row per corruption (severity 0 in each),
    one column per network (``eff``: :func:`.findings.effects_table`)."""
    nets = _ordered(eff["network"], NETWORK_ORDER)
    corrs = [c for c in _ordered(eff["corruption"], CORRUPTION_ORDER) if c != "none"]
    sevs = sorted(set(int(v) for v in eff["severity"]))
    with plt.rc_context(style.rc()):
        fig, axes = plt.subplots(len(corrs), len(nets), figsize=(style.COLUMN_WIDTH_IN, 1.75 * len(corrs) + 1.0),
                                 sharex=True, sharey=True, squeeze=False)
        for i, corr in enumerate(corrs):
            for ax, net in zip(axes[i], nets):
                g = eff[(eff["network"] == net) & eff["corruption"].isin(["none", corr])]
                for name in ("cost", "benefit"):
                    h = g[g["effect"] == name].sort_values("severity")
                    ax.errorbar(h["severity"], h["mean"], yerr=_yerr(h, "mean", "ci_low", "ci_high", -1, 1),
                                fmt="o-", ms=3, capsize=2, lw=1, color=style.EFFECTS[name],
                                label=f"task {'A' if name == 'cost' else 'B'} difference")
                ax.axhline(0, color=style.REFERENCE["zero"], lw=0.6)
                ax.set_xticks(sevs)
            label = CORRUPTION_LABELS.get(corr, corr)
            if corr == "inversion":  # its x axis is not monotone in pixel statistics: give the mix s
                label += "\n(s = " + ", ".join(f"{SEVERITY_LEVELS['inversion'][v - 1]:g}" for v in sevs if v > 0) + ")"
            axes[i][0].set_ylabel(label)
        for ax, net in zip(axes[0], nets):
            ax.set_title(network_label(net))
        for ax in axes[-1]:
            ax.set_xlabel("severity")
        _clip_ylim(axes[0][0])
        fig.supylabel("train_mode − backbone_eval (accuracy)")
        h, lab = axes[0][0].get_legend_handles_labels()
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        fig.legend(h, lab, loc="upper center", ncol=2, bbox_to_anchor=(0.5, 1.0), frameon=False)
        return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def ch07_mismatch_figure(cond: pd.DataFrame, rho: dict):
    """The task-A difference against the median mismatch over seeds, one panel per network, one point per condition
    (``cond``: :func:`.findings.condition_table`); ``rho``: ``{network: Interval}`` (Spearman rho) for the titles."""
    nets = _ordered(cond["network"], NETWORK_ORDER)
    corrs = _ordered(cond["corruption"], CORRUPTION_ORDER)
    colors = {c: style.color("shift", c) for c in corrs}  # the same colour per kind of shift as chapter 3's
    markers = dict(zip(corrs, "osD^vPX*"))
    with plt.rc_context(style.rc()):
        ncol = 2 if len(nets) > 1 else 1
        nrow = -(-(len(nets) + 1) // ncol) if len(nets) > 1 else 1
        fig, grid = plt.subplots(nrow, ncol, figsize=(style.COLUMN_WIDTH_IN, 3.3 * nrow), sharey=True, squeeze=False)
        flat = [a for row in grid for a in row]
        axes = flat[:len(nets)]
        for ax in flat[len(nets):]:
            ax.axis("off")
        for ax, net in zip(axes, nets):
            g = cond[cond["network"] == net]
            none = g[g["corruption"] == "none"]
            for corr in corrs:
                h = g[g["corruption"] == corr].sort_values("severity")
                if corr != "none":
                    line = pd.concat([none, h])
                    ax.plot(line["mismatch_kl"], line["cost"], "-", lw=0.7, color=colors[corr], alpha=0.6)
                ax.errorbar(h["mismatch_kl"], h["cost"], yerr=_yerr(h, "cost", "cost_lo", "cost_hi", -1, 1),
                            xerr=[h["mismatch_kl"] - h["mismatch_kl_q25"], h["mismatch_kl_q75"] - h["mismatch_kl"]],
                            fmt=markers[corr], ms=5, capsize=2, lw=0.8, color=colors[corr],
                            label=CORRUPTION_LABELS.get(corr, corr))
            ax.set_xscale("log"); ax.axhline(0, color="black", lw=0.6)
            ax.grid(False, axis="x")  # a vertical gridline next to the left spine read as a doubled axis line
            r = rho[net].clipped(-1, 1)  # a t interval over few seeds can overshoot
            ax.set_title(f"{network_label(net)}\nper-seed Spearman ρ {r.mean:.2f} [{r.low:.2f}, {r.high:.2f}]",
                         fontsize=10)
            # ticks at 1, 2 and 5 per decade, plain numbers, major and minor of one length (labels at one height)
            ax.xaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(2, 5)))
            ax.tick_params(axis="x", which="both", labelsize=style.MIN_FONT_PT, length=3.5, width=0.8)
            for fmt in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
                fmt(matplotlib.ticker.FormatStrFormatter("%.2g"))
            ax.set_xlabel("median mismatch KL over seeds (nats)")
        _clip_ylim(axes[0])
        for ax in grid[:, 0]:
            ax.set_ylabel("task-A difference: train_mode\n− backbone_eval (accuracy)")
        h, lab = axes[0].get_legend_handles_labels()
        spare = flat[len(nets)] if len(flat) > len(nets) else None
        (spare or axes[-1]).legend(h, lab, title="corruption", loc="center" if spare is not None else "best")
        fig.tight_layout()
    return fit_page(fig, style.COLUMN_WIDTH_IN, style.MIN_FONT_PT)


def verdict_grid(claims: pd.DataFrame, numbers: pd.DataFrame) -> pd.DataFrame:
    """The page's verdict table (:func:`.findings.verdict_table`), one column per network: each cell the claim in the
    book's one shape (cut to :data:`.findings.CLIP`), a check's verdict or the counts."""
    def cell(r):
        if r["detail"]:
            return r["detail"]
        if r["kind"] == "check":
            return r["verdict"] if r["value"] == 0 else f"{r['verdict']} (largest |difference| {r['value']:.3g})"
        said = claim_text(claim(claims, f"{r['key']}_{r['network']}"), clip=CLIP.get(r["key"], (-1.0, 1.0)))
        return said.replace("**", "")  # an HTML table: no Markdown
    t = verdict_table(claims, numbers)
    t["cell"] = t.apply(cell, axis=1)
    nets = networks_of(numbers)
    g = t.drop(columns="key").pivot_table(index=["kind", "claim"], columns="network", values="cell", aggfunc="first",
                                          sort=False)
    return g[nets].reset_index().rename(columns={n: network_label(n) for n in nets})
