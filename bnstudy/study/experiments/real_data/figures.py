"""Chapter 7, what is drawn: the accuracy, effects and mismatch figures and the verdict grid (moved from
:mod:`bnstudy.study.plots`, colours from :mod:`bnstudy.study.style`), drawn from :mod:`.findings`' tables."""

from __future__ import annotations

import math

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

from ... import style
from ...plots import MODE_ORDER, fit_page
from .findings import CLIP, CORRUPTION_LABELS, NETWORK_LABELS, networks_of, network_label, verdict_table

# --- chapter 7 (issue 15): real digits and torchvision networks ---------------------------------------------------

#: Chapter 7's network order in every figure (smallest first).
CH07_NETWORK_ORDER = ("small_cnn", "resnet18", "mobilenet_v3_small")


#: Chapter 7's corruptions in the page's order (brightness, contrast, noise, blur, inversion).
CH07_CORRUPTION_ORDER = ("brightness", "contrast", "gaussian_noise", "blur", "inversion")


def _ch07_label(name: str, kind: str = "network") -> str:
    """A readable name for a chapter-7 network or corruption (real_data's label maps)."""
    return (NETWORK_LABELS if kind == "network" else CORRUPTION_LABELS).get(name, name)


def _ch07_nets(col: pd.Series) -> list:
    present = list(dict.fromkeys(col))
    return [n for n in CH07_NETWORK_ORDER if n in present] + [n for n in present if n not in CH07_NETWORK_ORDER]


def ch07_accuracy_figure(acc: pd.DataFrame, chance: float):
    """Accuracy per freeze mode at the reference corruption, one panel per network, 95% bars over seeds cut to
    [0, 1] (``acc``: findings.accuracy_table): task A before and after stage 2, and task B. Drawn at the column
    width with text of at least 9 pt; colours from :mod:`bnstudy.study.style`."""
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
    corruption severity: rows are corruptions, columns networks (``eff``: findings.effects_table); bars are its
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
                        from ...data import SEVERITY_LEVELS
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
    network, one point per corruption and severity (``cond``: findings.condition_table): x the median
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


def verdict_grid(claims: pd.DataFrame, numbers: pd.DataFrame) -> pd.DataFrame:
    """The verdict table for the page (:func:`.findings.verdict_table` of the claims and numbers tables): one row
    per claim, one column per network (readable names; verdict and number)."""
    t = verdict_table(claims, numbers)

    def cell(r):
        if r["detail"]:
            return r["detail"]
        if r["kind"] == "check":
            return r["verdict"] if r["value"] == 0 else f"{r['verdict']} (largest |difference| {r['value']:.3g})"
        if math.isnan(r["ci_low"]):
            return f"{r['verdict']} ({r['value']:.3f})"
        lo, hi = CLIP.get(r["key"], (-1.0, 1.0))  # printed ends cut to what the quantity allows
        return (f"{r['verdict']} ({r['value']:.3f} [{min(max(r['ci_low'], lo), hi):.3f}, "
                f"{min(max(r['ci_high'], lo), hi):.3f}])")
    t["cell"] = t.apply(cell, axis=1)
    t = t.drop(columns="key")
    nets = networks_of(numbers)
    g = t.pivot_table(index=["kind", "claim"], columns="network", values="cell", aggfunc="first", sort=False)
    g = g[nets].reset_index()
    return g.rename(columns={n: network_label(n) for n in nets})
