"""Chapter 2, what is drawn: the figures, from :func:`.run.trap_table`'s tidy tables (means over seeds with 95%
Student-t bands), and the display tables (plain text), from :func:`.findings.findings`' claims and numbers."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ... import style
from ...inference import number
from ...plots import _interval, _mean_ci_bar, interval_frame, min_text_size
from ...words import claim, claim_text
from .findings import CLAIMS, RULES, _pkey, dropout_ps


def _curve(table: pd.DataFrame, x: str, value: str) -> pd.DataFrame:
    return interval_frame(table, x, value).reset_index()


def _bands(ax, table: pd.DataFrame, x: str, lines) -> None:
    for q, label, color, marker in lines:
        c = _curve(table, x, q)
        ax.plot(c[x], c["mean"], marker=marker, ms=4, color=color, label=label)
        ax.fill_between(c[x], c["lo"], c["hi"], color=color, alpha=0.2)


def sorted_batches_figure(t4: pd.DataFrame, chance: float, tolerance: float):
    """Trap 4: task-A accuracy in eval and train mode against the share of each batch from one class (circled:
    flagged by the lint in most seeds), and below train minus eval mode and held-out accuracy after the pass minus
    before (inset: the latter zoomed, band +-``tolerance``)."""
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(6.6, 5.8), sharex=True, gridspec_kw={"height_ratios": [1.25, 1]})
    _bands(ax, t4, "sorted_fraction", (
        ("module_eval_accuracy", "eval mode (running statistics)", style.STATISTICS["running"], "o"),
        ("module_train_accuracy", "train mode (batch statistics)", style.STATISTICS["batch"], "s")))
    flagged = _curve(t4, "sorted_fraction", "sorted_lint")
    dep = _curve(t4, "sorted_fraction", "label_dependence")
    tm = _curve(t4, "sorted_fraction", "module_train_accuracy")
    hit = flagged["mean"] > 0.5
    ax.scatter(tm["sorted_fraction"][hit], tm["mean"][hit], s=70, facecolors="none", edgecolors="k", zorder=5,
               label="loader flagged by the lint")
    ax.axhline(chance, color=style.REFERENCE["chance"], ls=":", lw=1, label="chance")
    ax.set(ylabel="accuracy on task A", ylim=(0, 1.02))
    ax.secondary_xaxis("top").set(xticks=dep["sorted_fraction"].tolist(), xlabel="label dependence of the batches "
                                  "(audit)", xticklabels=[f"{v:.2f}".replace("-0.00", "0.00") for v in dep["mean"]])
    ax.legend(fontsize=9, loc="center left", bbox_to_anchor=(0.0, 0.45))
    d = t4.assign(train_minus_eval=t4["module_train_accuracy"] - t4["module_eval_accuracy"],
                  after_minus_before=t4["module_eval_accuracy_after_pass"] - t4["source_task_a_accuracy"])
    _bands(dx, d, "sorted_fraction", (
        ("train_minus_eval", "train mode - eval mode (same batches)", style.STATISTICS["batch"], "s"),
        ("after_minus_before", "held-out eval accuracy: after the pass - before", style.GREEN, "^")))
    dx.axhline(0, color=style.REFERENCE["chance"], lw=1)
    # the inset: upper right, above the zero line, its ticks on the right (not beside dx's)
    ins = dx.inset_axes([0.52, 0.66, 0.40, 0.22])
    c = _curve(d, "sorted_fraction", "after_minus_before")
    ins.axhspan(-tolerance, tolerance, color=style.REFERENCE["band"], zorder=0)
    ins.plot(c["sorted_fraction"], c["mean"], "^-", ms=3, color=style.GREEN)
    ins.fill_between(c["sorted_fraction"], c["lo"], c["hi"], color=style.GREEN, alpha=0.25)
    ins.axhline(0, color="0.4", lw=0.8)
    ins.set(ylim=(-1.5 * tolerance, 1.5 * tolerance), xlim=dx.get_xlim())
    ins.set_title(f"after - before, zoomed (band \u00b1{tolerance:g})", fontsize=9, pad=3)
    ins.tick_params(labelsize=9, labelbottom=False, left=False, labelleft=False, right=True, labelright=True)
    dx.set(ylabel="difference in accuracy\n(paired per seed)",
           xlabel="share of each batch drawn from one class (0 = shuffled, 1 = class-sorted)")
    dx.set_ylim(min(dx.get_ylim()[0], -0.05), 0.75)
    dx.legend(fontsize=9, loc="lower left")
    return min_text_size(fig)


def dropout_figure(t3: pd.DataFrame, tuned: pd.DataFrame, chosen: dict, chance: float, chance_factor: float = 1.5):
    """Trap 3: the main head's task-B accuracy, whole model pinned against the fix, per seed and mean with 95%
    interval: (a) at the run line's rate (``t3``), (b) at the rates ``chosen`` (setup -> rate) on validation data;
    (c) validation accuracy against the rate (``tuned``), the chosen rates starred, and the fix's auxiliary head."""
    setups = ["whole_model", "backbone_only"]
    names = {"whole_model": "whole model\npinned", "backbone_only": "backbone pinned\n(the fix)"}
    colors = {"whole_model": style.MODES["all_eval"], "backbone_only": style.MODES["backbone_eval"]}
    fig = plt.figure(figsize=(6.6, 6.4))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.05], hspace=0.55, wspace=0.35)
    ax_a = fig.add_subplot(grid[0, 0])
    ax_c, ax_b = fig.add_subplot(grid[0, 1], sharey=ax_a), fig.add_subplot(grid[1, :])

    def paired_panel(ax, piv, title):
        for _, row in piv.iterrows():
            ax.plot(range(len(setups)), row.values, "-o", color="0.6", alpha=0.6, ms=3)
        for i, c in enumerate(setups):
            _mean_ci_bar(ax, i + 0.12, piv[c], "black")
        ax.axhline(chance, color="0.4", ls=":", lw=1)
        ax.axhline(chance_factor * chance, color="0.4", ls="-.", lw=1)
        ax.text(-0.35, chance, "chance", color="0.4", ha="left", va="top", fontsize=9)
        ax.text(-0.35, chance_factor * chance, f"{chance_factor:g} x chance", color="0.4", ha="left",
                va="bottom", fontsize=9)
        ax.set_xticks(range(len(setups))); ax.set_xticklabels([names[c] for c in setups])
        ax.set_xlim(-0.4, len(setups) - 0.5); ax.set_ylim(0, 1); ax.set_title(title)

    run = t3[t3["case"].isin(setups)]
    paired_panel(ax_a, run.pivot(index="seed", columns="case", values="task_b_main")[setups],
                 f"(a) lr {run['lr'].iloc[0]:g}, {int(run['steps'].iloc[0]):,} steps")
    ax_a.set_ylabel("task-B test accuracy,\nmain head")
    plt.setp(ax_c.get_yticklabels(), visible=False)
    at = pd.concat([tuned[(tuned["setup"] == s) & (tuned["lr"] == chosen[s])] for s in setups])
    steps = int(tuned["steps"].iloc[0])
    paired_panel(ax_c, at.pivot(index="seed", columns="setup", values="task_b_main")[setups],
                 f"(b) chosen rates, {steps:,} steps")
    for s in setups:
        c = _curve(tuned[tuned["setup"] == s], "lr", "val_main")
        ax_b.plot(c["lr"], c["mean"], "-o", ms=4, color=colors[s], label=names[s].replace("\n", " "))
        ax_b.fill_between(c["lr"], c["lo"], c["hi"], color=colors[s], alpha=0.2)
        best = c[c["lr"] == chosen[s]]
        ax_b.plot(best["lr"], best["mean"], "*", ms=14, color=colors[s], mec="black", zorder=5)
    c = _curve(tuned[tuned["setup"] == "backbone_only"], "lr", "val_aux")
    ax_b.plot(c["lr"], c["mean"], "--^", ms=4, color=style.SKY, label="the fix's auxiliary head (no dropout)")
    ax_b.fill_between(c["lr"], c["lo"], c["hi"], color=style.SKY, alpha=0.15)
    ax_b.axhline(chance, color="0.4", ls=":", lw=1, label="chance")
    ax_b.set(xscale="log", ylim=(0, 1), xlabel="learning rate (SGD, momentum 0.9); star: chosen",
             ylabel="task-B validation\naccuracy", title=f"(c) validation accuracy after {steps:,} steps")
    ax_b.legend(fontsize=9, loc="upper left", ncol=2)
    return min_text_size(fig)


def batch_loss_figure(t5: pd.DataFrame, min_batch: int, tolerance: float):
    """Trap 5: train-mode minus eval-mode accuracy per per-device batch size (shaded: where the lint fires; dashed:
    ``-tolerance``; top axis: values per channel of the last BatchNorm), and below the same zoomed from batch 4."""
    from matplotlib.ticker import NullLocator
    d = t5.assign(loss=t5["module_train_accuracy"] - t5["module_eval_accuracy"])
    c = _curve(d, "device_batch_size", "loss")
    bs = c["device_batch_size"].tolist()
    fig, (ax, zx) = plt.subplots(2, 1, figsize=(6.6, 5.6), sharex=True, gridspec_kw={"height_ratios": [1, 1]})
    for a, zoom in ((ax, False), (zx, True)):
        a.axvspan(0.8, min_batch, color="0.9", zorder=0, label=f"lint fires (batch < {min_batch})")
        a.axhline(0, color="0.4", lw=1)
        a.axhline(-tolerance, color="0.3", ls="--", lw=1, label=f"tolerance -{tolerance:g}")
        a.errorbar(c["device_batch_size"], c["mean"], yerr=[c["mean"] - c["lo"], c["hi"] - c["mean"]], fmt="s-",
                   color=style.STATISTICS["batch"], ms=4, capsize=4, label="mean, 95% CI over seeds")
        a.set_ylabel("train mode -\neval mode" + (" (zoom)" if zoom else ""))
    zoomed = c[c["device_batch_size"] >= 4]
    hi = max(float(zoomed["hi"].max()) if len(zoomed) else 0.0, 0.0)
    lo = min(float(zoomed["lo"].min()) if len(zoomed) else 0.0, -tolerance)
    zx.set_ylim(lo - 0.25 * (hi - lo + 1e-3), hi + 0.15 * (hi - lo + 1e-3))
    zx.set_xscale("log", base=2)
    zx.set(xticks=bs, xticklabels=[str(int(b)) for b in bs], xlim=(0.8, max(bs) * 1.25),
           xlabel="per-device batch size m")
    cnt = d.groupby("device_batch_size")["min_values_per_channel"].first()
    top = ax.secondary_xaxis("top")
    top.set(xticks=bs, xticklabels=[f"{int(cnt[b])}" for b in bs],
            xlabel="values per channel, last BatchNorm (m x H x W; not tested as the count)")
    for a in (zx, top):
        a.xaxis.set_minor_locator(NullLocator())
    ax.legend(loc="lower right", fontsize=9)
    return min_text_size(fig)


def sorted_training_figure(t6: pd.DataFrame, chance: float, tie_margin: float):
    """Trap 6: the training meter and held-out accuracy (eval mode; train mode on shuffled batches) of networks
    trained on shuffled or class-sorted batches, and below the paired differences per seed, with the equivalence
    band +-``tie_margin`` on the class-sorted meter row."""
    qs = [("train_meter_accuracy", "training meter\n(train mode,\nits own batches)"),
          ("heldout_eval_accuracy", "held-out,\neval mode"),
          ("heldout_batch_stats_accuracy", "held-out,\ntrain mode\n(shuffled batches)")]
    cases = ("shuffled", "class_sorted")
    fig, (ax, px) = plt.subplots(2, 1, figsize=(6.6, 6.4), gridspec_kw={"height_ratios": [2.2, 1]})
    w = 0.38
    for j, case in enumerate(cases):
        g = t6[t6["case"] == case]
        for i, (q, _) in enumerate(qs):
            iv = _interval(g[q])
            x = i + (j - 0.5) * w
            ax.bar(x, iv.mean, width=w * 0.92, color=(style.GREY, style.VERMILLION)[j], alpha=0.75,
                   label=("trained on " + case.replace("_", "-") + " batches") if i == 0 else None)
            low = max(iv.low, 0.0)
            ax.errorbar(x, iv.mean, yerr=[[iv.mean - low], [iv.high - iv.mean]], color="black", capsize=5,
                        lw=1.6, zorder=5)
            if iv.low < 0:
                ax.plot([x], [0.0], marker="v", color="black", ms=6, clip_on=False, zorder=6)
            ax.scatter(np.full(len(g), x) + 0.09, g[q], s=8, color="0.3", alpha=0.5, zorder=3)
    ax.set_xticks(range(len(qs))); ax.set_xticklabels([n for _, n in qs], fontsize=9)
    ax.axhline(chance, color="0.4", ls=":", lw=1)
    ax.text(-0.55, chance, "chance", color="0.4", ha="left", va="bottom", fontsize=9)
    ax.set_xlim(-0.6, len(qs) - 0.4)
    ax.set_ylim(0, 1.3); ax.set_yticks(np.linspace(0, 1, 6)); ax.set_ylabel("accuracy on task A (fraction)")
    ax.legend(loc="upper center", ncol=1, fontsize=9)
    piv = {q: t6.pivot(index="seed", columns="case", values=q) for q in ("train_meter_accuracy",
                                                                          "heldout_eval_accuracy")}
    diffs = [(f"meter - held-out, trained {case.replace('_', '-')}", piv["train_meter_accuracy"][case]
              - piv["heldout_eval_accuracy"][case]) for case in cases]
    diffs.append(("held-out: trained class-sorted - shuffled", piv["heldout_eval_accuracy"]["class_sorted"]
                  - piv["heldout_eval_accuracy"]["shuffled"]))
    for i, (name, v) in enumerate(diffs):
        if i == 1:  # the class-sorted meter row
            px.fill_betweenx([i - 0.3, i + 0.3], -tie_margin, tie_margin, color=style.REFERENCE["band"], lw=0, zorder=0,
                             label=f"equivalence margin \u00b1{tie_margin:g}")
        px.scatter(v, np.full(len(v), i) + 0.18, s=8, color="0.3", alpha=0.5, zorder=3)
        iv = _interval(v)
        px.errorbar([iv.mean], [i], xerr=[[iv.mean - iv.low], [iv.high - iv.mean]], fmt="D", color="black", ms=5,
                    capsize=4, lw=1.6, zorder=4)
    px.axvline(0, color="0.4", lw=1)
    lo = min(min(float(v.min()) for _, v in diffs), -tie_margin, 0.0)
    hi = max(max(float(v.max()) for _, v in diffs), tie_margin, 0.0)
    px.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    for i, (name, _) in enumerate(diffs):  # each row's label above it, inside the panel
        px.text(lo - 0.03 * (hi - lo), i - 0.32, name, fontsize=9, va="bottom", ha="left")
    px.set(yticks=[], ylim=(len(diffs) - 0.55, -0.95),
           xlabel="paired difference per seed (accuracy): mean, 95% CI, dots = seeds")
    px.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    return min_text_size(fig)


# --- display tables ----------------------------------------------------------------------------------------------

def _ci_text(iv) -> str:  # mean [95% interval]
    return f"{iv.mean:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"


def batch_training_table(N: pd.DataFrame) -> pd.DataFrame:
    """Trap 5's training arm, one row per training batch: samples seen, held-out accuracy of each mode as trained
    and re-estimated, batch statistics minus pinned both ways, each mode's change from the source, last-epoch loss."""
    n = lambda k: number(N, k)  # noqa: E731
    two = lambda key, f=".3f": " / ".join(format(n(key.format(m)), f) for m in ("batch_stats", "pinned"))  # noqa: E731
    rows = [{"training batch": b, "samples seen": f"{n(f't5t_samples_b{b}'):d}",
             "as trained (batch stats / pinned)": two(f"t5t_eval_{{}}_b{b}"),
             "re-estimated (batch stats / pinned)": two(f"t5t_reest_{{}}_b{b}"),
             "batch stats minus pinned, as trained": _ci_text(n(f"t5t_bs_vs_pinned_b{b}")),
             "batch stats minus pinned, re-estimated": _ci_text(n(f"t5t_reest_bs_vs_pinned_b{b}")),
             "batch stats re-estimated minus source": _ci_text(n(f"t5t_change_batch_stats_reest_b{b}")),
             "pinned re-estimated minus source": _ci_text(n(f"t5t_change_pinned_reest_b{b}")),
             "last-epoch loss (batch stats / pinned)": two(f"t5t_loss_last_{{}}_b{b}", ".2f")}
            for b in sorted(int(k[len("t5t_bs_vs_pinned_b"):]) for k in N["key"]
                            if re.fullmatch(r"t5t_bs_vs_pinned_b\d+", k))]
    return pd.DataFrame(rows).set_index("training batch")


def dropout_mechanism_table(N: pd.DataFrame) -> pd.DataFrame:
    """Trap 3's dropout mechanism, one row per head dropout rate p: the fix's accuracy on raw / standardized
    features, dropout's effect (p minus off) on each, and standardized minus raw effect."""
    n = lambda k: number(N, k)  # noqa: E731
    rows = [{"dropout p": p, "accuracy (raw / standardized)": f"{n(f't3d_acc_raw_{_pkey(p)}'):.3f} / "
                                                              f"{n(f't3d_acc_std_{_pkey(p)}'):.3f}",
             "raw features": _ci_text(n(f"t3d_effect_raw_{_pkey(p)}")),
             "standardized features": _ci_text(n(f"t3d_effect_std_{_pkey(p)}")),
             "standardized minus raw": _ci_text(n(f"t3d_std_vs_raw_at_{_pkey(p)}"))} for p in dropout_ps(N)]
    return pd.DataFrame(rows).set_index("dropout p")


def multiplicity_table(C: pd.DataFrame, N: pd.DataFrame) -> pd.DataFrame:
    """The chapter's family: each test of the claims table (what, estimate [family interval], p, Holm p, verdict),
    then the two safe-batch rules (safe batch, intersection-union p)."""
    fmt = lambda p: "-" if p != p else "< 0.001" if p < 0.001 else f"{p:.3f}"
    rows = []
    for r in C.itertuples(index=False):
        if r.kind in ("exact", "not exact"):
            continue
        what = CLAIMS["t5t_reest" if r.key.startswith("t5t_reest_b") else r.key][0].format(m=r.key[len("t5t_reest_b"):])
        est = (f"{r.estimate:+.3f}" if r.low != r.low else f"{r.estimate:+.3f} [{r.low:+.3f}, {r.high:+.3f}]")
        rows.append({"comparison": what, "estimate [family interval]": est, "p": fmt(r.p),
                     "Holm p": fmt(r.p_adjusted), "verdict": r.verdict})
    for key, what in RULES.items():
        b, p = number(N, key), number(N, "t5_safe_p" if key == "t5_safe_batch" else "t5t_safe_p")
        rows.append({"comparison": what, "estimate [family interval]": "-" if b != b else f"safe batch {b:.0f}",
                     "p": fmt(p), "Holm p": "-", "verdict": "-"})
    return pd.DataFrame(rows).set_index("comparison")


def checklist_table(C: pd.DataFrame, N: pd.DataFrame) -> pd.DataFrame:
    """The checklist, one row per trap: what the audit reported in this run, and the fix (referee ch2 item 6); a
    claim in the page's shape (:func:`~bnstudy.study.words.claim_text`, plain text), a descriptive interval as
    [a, b]."""
    n = lambda k: number(N, k)  # noqa: E731
    ci = lambda iv: f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]"
    cl = lambda key: claim_text(claim(C, key), clip=(-1.0, 1.0)).replace("**", "")  # noqa: E731
    smallest = n("t5t_smallest")
    small = f"t5t_reest_b{smallest}"
    t5t = (f"batch statistics minus pinned at batch {smallest}: {cl(small)}"
           if small in set(C["key"]) else f"no training batch below {n('min_batch')}")
    rows = [
        ("1. model.train() every epoch undoes backbone.eval()",
         f"frozen_bn_in_train_mode on every backbone BN; BN in train mode for {n('t1_bn_train'):.0%} of calls; running "
         f"means moved by a per-seed largest {n('t1_mean_shift'):.2f} former running SDs (range "
         f"{n('t1_mean_shift_min'):.2f}-{n('t1_mean_shift_max'):.2f}); num_batches_tracked +{n('t1_nbt'):.0f}; largest "
         f"change of any backbone weight {n('t1_param'):.0f}; probe logits moved by a per-seed largest "
         f"{n('t1_probe'):.2f} (range {n('t1_probe_min'):.2f}-{n('t1_probe_max'):.2f}); task A "
         f"{n('t1_task_a_before'):.3f} to {n('t1_task_a_after'):.3f}",
         f"pin_eval(backbone) or freeze_batchnorm(backbone): every buffer and probe logit changed by "
         f"{n('t1_probe_pinned'):.0f}"),
        ("2. no_grad teacher or validation pass left in train mode",
         f"train_mode_under_no_grad on every BN; {n('t2_nbt'):.0f} batches moved running means by a per-seed largest "
         f"{n('t2_mean_shift'):.2f} former running SDs (range {n('t2_mean_shift_min'):.2f}-"
         f"{n('t2_mean_shift_max'):.2f}); the same images' logits moved by a per-seed largest "
         f"{n('t2_logit_mates'):.2f} (range {n('t2_logit_mates_min'):.2f}-{n('t2_logit_mates_max'):.2f}) with other "
         f"batch mates",
         f"eval() before any forward pass without a loss: buffer change {n('t2_buffer_eval'):.0f}, logits "
         f"bit-identical whatever the batch mates"),
        ("3. whole model in eval: dropout off, forward changes",
         f"forward_changes_with_mode (AuxOutputs in train, a tensor in eval); dropout_off_in_training on head.0; "
         f"auxiliary head moved {claim(C, 't3_aux_untouched')['estimate']:.0f} (in the loss in "
         f"{n('t3_aux_loss_whole'):.0%} of steps)",
         f"pin only the frozen part (pin_eval(backbone) or pin_norm_eval): dropout on in {n('t3_dropout_fixed'):.0%} "
         f"of calls, auxiliary loss in {n('t3_aux_loss_fixed'):.0%} of steps. Main head with dropout at lr "
         f"{n('t3_lr_runline'):g}: {ci(n('t3_fix_ci'))}, against 1.5 times chance "
         f"{claim(C, 't3_fix_chance')['verdict']}. At rates chosen on validation data: {ci(n('t3_tuned_fixed_ci'))} "
         f"with dropout against {n('t3_tuned_main_whole'):.3f} without, whole model minus fix "
         f"{cl('t3_tuned_whole_vs_fix')}; the same run's auxiliary head (no dropout) {ci(n('t3_tuned_aux'))}. Tune "
         f"the head's rate and decide whether to keep the dropout"),
        ("4. label-sorted batches",
         f"label_sorted_batches from a one-class share of {n('t4_first_flagged'):.2f} on the grid tried (label "
         f"dependence {n('t4_dep_first_flagged'):.3f}, lint threshold {n('t4_lint_max_dependence'):g}); train-mode "
         f"accuracy {n('t4_train_shuffled'):.3f} shuffled, {n('t4_train_sorted'):.3f} sorted; eval mode on the same "
         f"class-sorted batches {n('t4_eval_sorted'):.3f}",
         "shuffle the loader (or sample batches at random from every class)"),
        ("5. batches of 1 and 2",
         f"single_value_per_channel / single_sample_batch at 1, small_batch below {n('min_batch')}; train-mode "
         f"inference: accuracy {n('t5_train_b1'):.3f} at batch 1 against {n('t5_eval'):.3f} in eval mode, loss below "
         f"{n('t5_tol'):.2f} from batch {n('t5_safe_batch'):.0f}; training {n('t5t_steps')} more steps, batch "
         f"statistics against pinned, both re-estimated afterwards: {t5t}; loss below {n('t5_tol'):.2f} from batch "
         f"{n('t5t_safe_batch'):.0f}; as trained, the pinned network's stale statistics cost it "
         f"{ci(n(f't5t_change_pinned_b{smallest}'))} against the source at batch {smallest}; "
         f"last_batch_single for 17 samples at batch size 16",
         "drop_last=True; when the per-device batch is small, pin BN in eval (pin_eval or FrozenBatchNorm) for "
         "training, then re-estimate its statistics with the weights fixed (bnstudy.update_bn_stats) before "
         "evaluating; after a domain shift, the same: re-estimate, then freeze"),
        ("6. training on class-sorted batches",
         f"label_sorted_batches from lint_loader; held-out accuracy {n('t6_eval_sorted'):.3f} against "
         f"{n('t6_eval_shuffled'):.3f} trained on shuffled batches; training meter {n('t6_meter_sorted'):.3f}; meter "
         f"minus held-out {cl('t6_meter_gap')}",
         "shuffle"),
    ]
    return pd.DataFrame(rows, columns=["trap", "what the audit reported (this run)", "fix"]).set_index("trap")
