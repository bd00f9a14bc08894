"""Chapter 2, what is claimed: the claims table and the numbers tables the page glues, from :mod:`.run`'s tables.

:func:`findings` (a claims table from :mod:`bnstudy.study.inference`, every verdict the page prints, and a flat numbers
table of the descriptive numbers its prose cites), :func:`thread_findings` (the thread check's run-to-run variation,
a numbers table) and the page's words chosen by the findings (:func:`page_words`: its sentences and the
rule-triggered :data:`NOTES`). Every difference is *condition minus reference* (:data:`CLAIMS`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ...inference import Family, Interval, Question, ask, claims_table, count_verdicts, decide, exact_check, \
    intersection_union_p, number, numbers_table, one_sided_p, t_interval
from ...words import Note, claim, notes
from .run import AUX_WEIGHT, BATCH_TRAINING_MODES, FEATURE_KINDS, P_DROP, REESTIMATE_BATCHES, STAGE1_LR, \
    THREAD_QUANTITIES, parse_dropout_case

#: Stated tolerances the prose quotes: "within 0.01" (trap 4's curve), "about chance" (1.5x chance), and the
#: equivalence margin of "unchanged" (trap 4: TOST against +-TOL_AFTER at the family's level). All set by us.
TOL_CURVE, CHANCE_FACTOR, TOL_AFTER = 0.01, 1.5, 0.02
#: Trap 5: a batch size "loses less than TOL_LOSS" when the one-sided t test of (train mode - eval mode accuracy)
#: against -TOL_LOSS rejects at the family's level (:func:`bnstudy.study.inference.one_sided_p`).
TOL_LOSS = 0.02
#: The chapter's family-wise level: its claims (:func:`findings`' claims table) and its two safe-batch rules form
#: one :class:`bnstudy.study.inference.Family`, Bonferroni intervals at ``1 - ALPHA/m``, Holm's adjusted p for counts.
ALPHA = 0.05
#: The direction words of this page's verdicts (:func:`bnstudy.study.inference.decide`), each naming the direction of
#: *condition minus reference* of its claim (see :data:`CLAIMS`), as ``(higher, lower)`` pairs flattened.
DIRECTIONS: tuple[str, ...] = (
    "drifting higher", "drifting lower",  # trap 1: drifting (train-mode BatchNorm) head - pinned head
    "above 1.5 times chance", "below 1.5 times chance",  # trap 3: the fix's main head - 1.5 x chance
    "whole model higher", "whole model lower",  # trap 3: whole model pinned - the fix (backbone pinned)
    "cost shrinks with the rate", "cost grows with the rate",  # trap 3: dropout's effect at the top p - at the lowest
    "standardized costs less", "standardized costs more",  # trap 3: dropout's effect, standardized - raw features
    "higher after the pass", "lower after the pass",  # trap 4: held-out accuracy after the sorted pass - before
    "train mode higher", "train mode lower",  # trap 4: train mode - eval mode on the same batches
    "batch statistics higher", "batch statistics lower",  # trap 5: trained with batch statistics - pinned
    "meter higher", "meter lower",  # trap 6: the training meter - held-out accuracy
)
#: The chapter's claims (key stems of its claims table; ``t5t_reest_b<m>`` one per training batch m below
#: ``min_batch``): what each compares, condition minus reference, and its ``(higher, lower)`` words.
CLAIMS = {
    "t1_tuned_price": ("trap 1 at tuned rates: drifting head minus pinned head", DIRECTIONS[0:2]),
    "t3_fix_chance": ("trap 3: the run line's fix minus 1.5 times chance", DIRECTIONS[2:4]),
    "t3_tuned_fix_chance": ("trap 3: the tuned fix minus 1.5 times chance", DIRECTIONS[2:4]),
    "t3_whole_vs_fix": ("trap 3 at the run line's rate: whole model minus the fix", DIRECTIONS[4:6]),
    "t3_tuned_whole_vs_fix": ("trap 3 at tuned rates: whole model minus the fix", DIRECTIONS[4:6]),
    "t3d_growth_raw": ("trap 3, raw features: dropout's effect at the highest rate minus at the lowest",
                       DIRECTIONS[6:8]),
    "t3d_std_vs_raw": ("trap 3: dropout's effect at the model's rate, standardized minus raw features",
                       DIRECTIONS[8:10]),
    "t4_after": ("trap 4: held-out accuracy after the sorted pass minus before", DIRECTIONS[10:12]),
    "t4_first_flagged": ("trap 4: train mode minus eval mode at the first flagged share", DIRECTIONS[12:14]),
    "t5t_reest": ("trap 5, training, re-estimated: batch statistics minus pinned at batch {m}", DIRECTIONS[14:16]),
    "t6_meter_gap": ("trap 6, trained class-sorted: the meter minus held-out accuracy", DIRECTIONS[16:18]),
}
#: The two safe-batch rules (intersection-union tests of one-sided t tests at the family's level), family members
#: beside the claims table.
RULES = {"t5_safe_batch": "trap 5, inference: train mode loses less than the tolerance from the safe batch on",
         "t5t_safe_batch": "trap 5, training, re-estimated: batch statistics lose less than the tolerance from the "
                           "safe batch on"}
#: Trap 6: the equivalence margin for "the training meter agrees with held-out accuracy" (TOST against +-TOL_TIE at
#: the family's level). Set by us before the check, not fitted.
TOL_TIE = 0.05
#: ``lint_loader``'s default threshold on label dependence (with p < 1e-3); trap 4 quotes it.
LINT_MAX_DEPENDENCE = 0.05
#: The paired differences the page reports, as (minuend, subtrahend) quantities of the thread check.
THREAD_PAIRS = {"t1_price": ("t1_eval_once", "t1_pinned"), "t1_tuned_price": ("t1_tuned_drifting", "t3_tuned_whole"),
                "t3_fix_vs_whole": ("t3_fix", "t3_whole"), "t3_tuned_fix_vs_whole": ("t3_tuned_fix", "t3_tuned_whole")}



def thread_findings(tc: pd.DataFrame, main_threads: int = 1) -> pd.DataFrame:
    """Run-to-run variation of chapter 2's cited accuracies between two torch thread counts (fractions 0..1), as a
    numbers table (:func:`bnstudy.study.inference.numbers_table`; glued as ``ch02_threads_<key>``) from
    :func:`thread_check`'s table (``seed, quantity, threads, accuracy``).

    ``threads_main`` / ``threads_other``: the two counts; ``n_seeds`` seeds, ``n_runs`` (seed, quantity) pairs,
    ``n_differ`` of them changed. Per quantity of :data:`THREAD_QUANTITIES`: ``largest_<quantity>`` |other - main|
    over seeds and ``typical_<quantity>`` (the mean |change| over seeds); ``max_diff`` / ``mean_diff`` over every
    pair (:func:`thread_words` names the quantity with the largest). ``paired_largest_<difference>``: per difference
    of :data:`THREAD_PAIRS`, the largest |change| of that per-seed paired difference when both of its runs move to
    the other count (the page's paired differences are computed within one count).

    Raises ``ValueError`` unless the table has exactly two thread counts, one of them ``main_threads``, and every
    (seed, quantity) at both.
    """
    ths = sorted(int(t) for t in tc["threads"].unique())
    if len(ths) != 2 or main_threads not in ths:
        raise ValueError(f"thread_findings needs exactly two thread counts including main_threads={main_threads}, "
                         f"got {ths}")
    other = [t for t in ths if t != main_threads][0]
    a, b = (tc[tc["threads"] == t].set_index(["seed", "quantity"])["accuracy"].astype(float).sort_index()
            for t in (main_threads, other))
    if not a.index.equals(b.index):
        raise ValueError("thread_findings needs every (seed, quantity) at both thread counts")
    d = (b - a).abs()
    qs = [q for q in THREAD_QUANTITIES if q in d.index.get_level_values("quantity")] + \
        sorted(set(d.index.get_level_values("quantity")) - set(THREAD_QUANTITIES))
    per = {q: d.xs(q, level="quantity") for q in qs}
    pair = lambda x, m, s_: x.xs(m, level="quantity") - x.xs(s_, level="quantity")
    paired = {k: float((pair(b, m, s_) - pair(a, m, s_)).abs().max()) for k, (m, s_) in THREAD_PAIRS.items()
              if m in per and s_ in per}
    return numbers_table(dict(n_seeds=int(a.index.get_level_values("seed").nunique()), threads_main=main_threads,
                              threads_other=other, n_runs=int(len(d)), n_differ=int((d > 0).sum()),
                              largest={q: float(v.max()) for q, v in per.items()},
                              typical={q: float(v.mean()) for q, v in per.items()},
                              max_diff=float(d.max()), mean_diff=float(d.mean()), paired_largest=paired))


def thread_words(t: pd.DataFrame) -> dict:
    """The thread check's words (``{"max_quantity": ...}``, glued plain as ``ch02_threads_max_quantity``): how the
    page names the quantity with the largest change (:data:`THREAD_WORDS`; the first of :func:`thread_findings`'
    order on a tie, ``""`` for a quantity it has no words for)."""
    largest = {k[len("largest_"):]: float(v) for k, v in zip(t["key"], t["value"]) if k.startswith("largest_")}
    return {"max_quantity": THREAD_WORDS.get(max(largest, key=largest.get), "")}


#: How the page names each thread-check quantity.
THREAD_WORDS = {"t1_eval_once": "trap 1's drifting head at the run line's rate",
                "t1_pinned": "trap 1's pinned head at the run line's rate",
                "t1_tuned_drifting": "trap 1's drifting head at its tuned rate",
                "t3_whole": "trap 3's whole-model main head at the run line's rate",
                "t3_fix": "trap 3's fix at the run line's rate",
                "t3_tuned_whole": "trap 3's whole-model main head at its tuned rate (trap 1's pinned partner)",
                "t3_tuned_fix": "trap 3's fix at its tuned rate"}



# --- findings ---------------------------------------------------------------------------------------------------

def _values(df: pd.DataFrame, trap: str, case: str, quantity: str) -> pd.Series:
    """One quantity per seed (indexed by seed); ``KeyError`` if the case or quantity is missing."""
    sel = df[(df["trap"] == trap) & (df["case"] == case)]
    if sel.empty or quantity not in sel or sel[quantity].isna().all():
        raise KeyError(f"no values of {quantity!r} for trap={trap!r}, case={case!r}")
    return sel.set_index("seed")[quantity].astype(float)


def _safe_from(batches: list, diff, family: Family) -> tuple[float, float]:
    """The smallest batch from which every larger one loses less than ``TOL_LOSS``: for each batch ``b``,
    ``diff(b)`` (per-seed condition minus reference, negative: a loss) is tested one-sided against ``-TOL_LOSS``
    (:func:`bnstudy.study.inference.one_sided_p`, ``"greater"``); the claim "every batch from ``b`` on" is Berger's
    intersection-union test over those batches (:func:`bnstudy.study.inference.intersection_union_p`), shown when its p
    is below ``family.level``. Returns ``(batch, p)`` with ``p`` that test's p; ``(nan, nan)`` if no batch is."""
    p = {b: one_sided_p(diff(b), "greater", null=-TOL_LOSS) for b in batches}
    for i, b in enumerate(batches):
        p_iu = intersection_union_p([p[x] for x in batches[i:]])
        if p_iu < family.level:
            return float(b), p_iu
    return float("nan"), float("nan")


#: The quantities of the code's identities that several columns enter (``t1_pinned``: every backbone buffer, weight
#: and probe logit of the pinned run changes by exactly 0; ``t2_eval``: in eval mode, logits bit-identical whatever
#: the batch mates, no buffer or probe change), read from the rows melted long (``quantity``, ``value``).
_MOVES = ("max_buffer_change", "num_batches_tracked_change", "max_param_change", "max_probe_change",
          "max_logit_change_by_mates")
#: The identities of the code (exact checks, not findings) as questions (:func:`bnstudy.study.inference.ask`), each over
#: every seed: ``t1_pinned``, ``t2_eval`` (above), ``t3_aux_untouched`` (the auxiliary head's weights unchanged with
#: the whole model in eval mode), ``t3_nodrop_equals_whole`` (the fix with dropout off minus the whole-model run's
#: main head, per seed) and ``t3_eval_dropout_off`` (every scored logit equals the head without its dropout layer,
#: in every run of trap 3 and its sweep).
CHECKS = (
    Question("t1_pinned", value="value", at=dict(trap="train_call", case="pinned", quantity=_MOVES[:4]), table="long",
             exact=0.0),
    Question("t2_eval", value="value", at=dict(trap="no_grad", case="teacher_eval", quantity=(
        "max_logit_change_by_mates", "max_buffer_change", "max_probe_change")), table="long", exact=0.0),
    Question("t3_aux_untouched", value="aux_max_param_change", at=dict(trap="whole_eval", case="whole_model"),
             exact=0.0),
    Question("t3_nodrop_equals_whole", "backbone_only_dropout_off", "whole_model", value="task_b_main",
             at=dict(trap="whole_eval"), by="case", exact=0.0),
    Question("t3_eval_dropout_off", value="eval_dropout_off", at=dict(trap=("whole_eval", "whole_eval_tuned")),
             exact=1.0),
)


def findings(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Chapter 2's findings from :func:`run`'s table (every trap and case, at least two seeds): ``(claims,
    numbers)``, its claims table (:func:`bnstudy.study.inference.claims_table`; every verdict the page prints is a
    ``verdict`` of it; read a row with :func:`bnstudy.study.words.claim`) and its numbers table
    (:func:`bnstudy.study.inference.numbers_table`, read one with :func:`bnstudy.study.inference.number`); the notebook glues
    both with :func:`bnstudy.study.pages.glue_chapter` as ``ch02_<key>_<column>`` and ``ch02_<key>``.

    Every difference is *condition minus reference*, per seed (:data:`CLAIMS` names each claim's). Claims that
    are tests (:func:`bnstudy.study.inference.decide`, words :data:`DIRECTIONS`) form one family with the two safe-batch
    rules (:data:`RULES`): ``m = len(tests) + 2``, Bonferroni intervals at ``1 - ALPHA/m``, equivalence (trap 4's
    ``t4_after`` within ``TOL_AFTER``, trap 6's ``t6_meter_gap`` within ``TOL_TIE``) at ``ALPHA/m``, Holm's
    adjusted p over the table. The identities of the code are :func:`bnstudy.study.inference.exact_check` rows:
    ``t1_pinned`` (every backbone buffer, weight and probe logit changed by exactly 0 with the pin),
    ``t2_eval`` (in eval mode, logits bit-identical whatever the batch mates, no buffer or probe change),
    ``t3_aux_untouched`` (the auxiliary head's weights unchanged with the whole model in eval mode),
    ``t3_nodrop_equals_whole`` (the fix with dropout off equals the whole-model run's main head),
    ``t3_eval_dropout_off`` (every scored logit equals the head without its dropout layer) and
    ``t5_lint_matches`` (the small-batch lint fires exactly below ``min_batch``), each over every seed.
    The checks that fit :class:`bnstudy.study.inference.Question` are :data:`CHECKS`, asked by
    :func:`bnstudy.study.inference.ask`; ``t5_lint_matches`` compares the lint with a rule of the batch size and stays an
    :func:`~bnstudy.study.inference.exact_check`. The comparisons stay :func:`~bnstudy.study.inference.decide` calls: their
    family has the two safe-batch rules as members too (``ask``'s family is its questions alone), and most compare
    with a constant (1.5 times chance), two columns of one row, rates chosen on validation data, or a difference of
    differences, which a ``Question`` does not express.
    Rates: per setup the rate with the best mean *validation* accuracy (ties: the smaller). Raises ``KeyError``
    if a case is missing.

    The numbers (accuracies are fractions 0..1): a plain number is the mean over seeds; ``<name>_min`` /
    ``<name>_max`` are the lowest and highest seed's value (for a per-seed largest value, ``<name>`` is its mean over
    seeds). Intervals are 95% Student-t intervals over seeds of a per-seed difference, *condition minus reference*,
    descriptive (no verdict). Booleans are plain facts of the run (a lint fired in every seed, a chosen rate lies
    inside its grid), not statistical claims. ``t1_price_b``: ``task_b(eval_once) - task_b(pinned)`` at the run
    line's untuned rate (referee ch2 item 2); ``t1_loss_*``: the head's mean training cross-entropy (nats) over the
    first / last epoch (NaN for runs made before it was recorded). ``t3_same_rate_*``: whole model minus fix at the
    same rate (paired), at the grid's lowest / highest rate and the lowest / highest mean over the grid;
    ``t3_tuned_aux``: the fix's auxiliary head (no dropout, same run) at the rate with its best validation accuracy
    (``t3_lr_aux``). ``t3d_effect_*``: dropout's effect, fix at p minus fix with dropout off (negative: dropout
    costs). ``t5_safe_batch`` / ``t5t_safe_batch``: the smallest batch from which every larger one loses less than
    ``TOL_LOSS`` (one-sided t tests at the family's level, intersection-union; ``*_p`` the largest of those
    p-values), NaN if none. ``t5t_costs_n``: batches below ``min_batch`` where batch statistics score lower than
    pinned (re-estimated), Holm-adjusted p below ``ALPHA`` over the claims table, of ``t5t_n_below``;
    ``t5t_costs_n_as_trained``: the same count for the comparison as trained, over those batches' own claims table
    (:func:`_as_trained_claims`). ``family_m``: the family's size (the claims that are tests, plus the two
    safe-batch rules); ``family_confidence``: its intervals' confidence in percent.
    """
    first = df.iloc[0]
    v = lambda trap, case, q: _values(df, trap, case, q)
    spread = lambda name, s: {name: float(s.mean()), f"{name}_min": float(s.min()), f"{name}_max": float(s.max())}
    ci = t_interval  # a descriptive 95% interval over seeds
    out = dict(n_seeds=int(df["seed"].nunique()), chance=1 / int(first["n_classes"]),
               source_acc=float(df.groupby("seed")["source_task_a_accuracy"].first().mean()),
               **{k: int(first[k]) for k in ("steps", "epoch_steps", "batch_size", "teacher_batches", "n_eval",
                                             "min_batch")})
    chance, min_batch = out["chance"], out["min_batch"]
    tests: list[tuple] = []  # (key, per-seed differences, margin, (higher, lower)): decided once m is known
    # trap 1
    tc = lambda case, q: v("train_call", case, q)
    price = tc("eval_once", "task_b") - tc("pinned", "task_b")
    out.update(t1_bn_train=tc("eval_once", "bn_train_fraction").mean(),
               t1_nbt=tc("eval_once", "num_batches_tracked_change").mean(),
               t1_param=tc("eval_once", "max_param_change").max(),
               **spread("t1_buffer", tc("eval_once", "max_buffer_change")),
               **spread("t1_probe", tc("eval_once", "max_probe_change")),
               **spread("t1_task_a_before", tc("eval_once", "task_a_before")),
               **spread("t1_task_a_after", tc("eval_once", "task_a_after")),
               t1_task_b_eval_once=tc("eval_once", "task_b").mean(), t1_task_b_pinned=tc("pinned", "task_b").mean(),
               t1_task_a_after_pinned=tc("pinned", "task_a_after").mean(),
               t1_probe_pinned=tc("pinned", "max_probe_change").mean(),
               t1_buffer_pinned=tc("pinned", "max_buffer_change").mean(),
               t1_lint_every_seed=bool((tc("eval_once", "frozen_bn_lint") == 1).all()),
               t1_price_b=ci(price), t1_price_b_pos_seeds=int((price > 0).sum()),
               t1_price_b_neg_seeds=int((price < 0).sum()),
               **{f"t1_loss_{w}_{k}": (tc(case, f"head_loss_{w}").mean() if "head_loss_first" in df
                                       and df["head_loss_first"].notna().any() else float("nan"))
                  for w in ("first", "last") for case, k in (("eval_once", "eval_once"), ("pinned", "pinned"))},
               **spread("t1_mean_shift", tc("eval_once", "max_mean_shift_sd")),
               **spread("t1_log_var", tc("eval_once", "max_abs_log_var_ratio")))
    # trap 2
    ng = lambda case, q: v("no_grad", case, q)
    out.update(t2_nbt=ng("teacher_train", "num_batches_tracked_change").mean(),
               **spread("t2_buffer", ng("teacher_train", "max_buffer_change")),
               t2_probe=ng("teacher_train", "max_probe_change").mean(),
               t2_task_a_before=ng("teacher_train", "task_a_before").mean(),
               **spread("t2_task_a_after", ng("teacher_train", "task_a_after")),
               **spread("t2_acc_a_mates", ng("teacher_train", "accuracy_with_a_mates")),
               **spread("t2_acc_b_mates", ng("teacher_train", "accuracy_with_b_mates")),
               **spread("t2_logit_mates", ng("teacher_train", "max_logit_change_by_mates")),
               t2_logit_mates_eval=ng("teacher_eval", "max_logit_change_by_mates").mean(),
               t2_acc_mates_eval=ng("teacher_eval", "accuracy_with_b_mates").mean(),
               t2_buffer_eval=ng("teacher_eval", "max_buffer_change").mean(),
               **spread("t2_mean_shift", ng("teacher_train", "max_mean_shift_sd")),
               **spread("t2_log_var", ng("teacher_train", "max_abs_log_var_ratio")))
    # trap 3 at the run line's rate
    we = lambda case, q: v("whole_eval", case, q)
    main = lambda case: we(case, "task_b_main")
    line = CHANCE_FACTOR * chance
    tests.append(("t3_fix_chance", main("backbone_only") - line, None))
    tests.append(("t3_whole_vs_fix", main("whole_model") - main("backbone_only"), None))
    out.update(t3_aux_loss_whole=we("whole_model", "aux_loss_fraction").mean(),
               t3_dropout_whole=we("whole_model", "dropout_train_fraction").mean(),
               **spread("t3_task_b_aux_whole", we("whole_model", "task_b_aux")),
               t3_aux_loss_fixed=we("backbone_only", "aux_loss_fraction").mean(),
               t3_aux_change_fixed=we("backbone_only", "aux_max_param_change").mean(),
               t3_dropout_fixed=we("backbone_only", "dropout_train_fraction").mean(),
               **spread("t3_task_b_aux_fixed", we("backbone_only", "task_b_aux")),
               t3_task_b_main_whole=main("whole_model").mean(), t3_task_b_main_fixed=main("backbone_only").mean(),
               t3_task_b_main_nodrop=main("backbone_only_dropout_off").mean(),
               t3_dropout_effect=ci(main("backbone_only") - main("backbone_only_dropout_off")))
    # trap 3's learning-rate sweep
    tu = df[df["trap"] == "whole_eval_tuned"]
    if tu.empty:
        raise KeyError("no rows of trap='whole_eval_tuned' (trap 3's learning-rate sweep)")

    def chosen(setup):  # the rate with the best mean validation accuracy (ties: the smaller rate)
        g = tu[tu["setup"] == setup]
        if g.empty:
            raise KeyError(f"no rows of setup={setup!r} in trap='whole_eval_tuned'")
        lr = float(g.groupby("lr")["val_main"].mean().idxmax())
        return lr, g[g["lr"] == lr].set_index("seed")

    grid = sorted(float(x) for x in tu["lr"].unique())
    lr_w, tw = chosen("whole_model")
    lr_f, tf = chosen("backbone_only")
    tests.append(("t3_tuned_fix_chance", tf["task_b_main"] - line, None))
    tests.append(("t3_tuned_whole_vs_fix", tw["task_b_main"] - tf["task_b_main"], None))
    widths = re.split(r"[^0-9]+", str(first["widths"]).strip("()[] -"))  # "8-16" or "(8, 16)"
    aux_of = lambda setup: tu[tu["setup"] == setup].groupby("lr")
    lr_aux = float(aux_of("backbone_only")["val_aux"].mean().idxmax())
    ta = tu[(tu["setup"] == "backbone_only") & (tu["lr"] == lr_aux)].set_index("seed")
    pw = tu[tu["setup"] == "whole_model"].pivot(index="seed", columns="lr", values="task_b_main")
    pf = tu[tu["setup"] == "backbone_only"].pivot(index="seed", columns="lr", values="task_b_main")
    same = {lr: ci(pw[lr] - pf[lr]) for lr in grid if lr in pf and lr in pw}  # whole model - fix, same rate
    out.update(t3_n_features=int(widths[-1]), t3_p_drop_pct=100 * P_DROP, t3_chance_line=line,
               t3_fix_ci=ci(main("backbone_only")), t3_fix_seeds_below=int((main("backbone_only") <= line).sum()),
               t3_lr_aux=lr_aux, t3_tuned_aux=ci(ta["task_b_aux"]),
               t3_tuned_aux_vs_whole=ci(ta["task_b_aux"] - tw["task_b_main"]),
               t3_same_rate_low_lr=min(same), t3_same_rate_low=same[min(same)],
               t3_same_rate_high_lr=max(same), t3_same_rate_high=same[max(same)],
               t3_same_rate_min=min(x.mean for x in same.values()),
               t3_same_rate_max=max(x.mean for x in same.values()),
               t3_loss_first_fixed=we("backbone_only", "main_loss_first").mean(),
               t3_loss_last_fixed=we("backbone_only", "main_loss_last").mean(),
               t3_loss_last_whole=we("whole_model", "main_loss_last").mean(),
               t3_lr_whole=lr_w, t3_lr_fixed=lr_f,
               t3_lr_interior=bool(all(grid[0] < x < grid[-1] for x in (lr_w, lr_f))),
               t3_lr_runline=float(we("whole_model", "lr").iloc[0]), t3_n_lrs=len(grid), t3_lr_min=grid[0],
               t3_lr_max=grid[-1], t3_tuned_steps=int(tu["steps"].iloc[0]),
               **spread("t3_tuned_main_whole", tw["task_b_main"]), **spread("t3_tuned_main_fixed", tf["task_b_main"]),
               t3_tuned_fixed_ci=ci(tf["task_b_main"]),
               t3_tuned_gain_fixed=ci(tf["task_b_main"] - tf["task_b_main_half"]),
               t3_tuned_gain_whole=ci(tw["task_b_main"] - tw["task_b_main_half"]),
               t3_tuned_loss_last_fixed=tf["main_loss_last"].mean(), t3_tuned_loss_last_whole=tw["main_loss_last"].mean(),
               t3_tuned_aux_fixed=tf["task_b_aux"].mean(),
               t3_aux_vs_fix_main=ci(ta["task_b_aux"] - tf["task_b_main"]),  # each at its own chosen rate
               t3_aux_vs_fix_main_same_rate=ci(tf["task_b_aux"] - tf["task_b_main"]),  # the fix's rate, one run
               t3_aux_weight=AUX_WEIGHT)
    # trap 1 at tuned rates (its pinned partner: trap 3's whole-model sweep), trap 3's dropout mechanism
    tuned1, price_tuned = _tuned_trap1_findings(df, tu, lr_w, tw)
    out.update(tuned1)
    tests.insert(0, ("t1_tuned_price", price_tuned, None))
    mech, growth_raw, std_vs_raw = _dropout_mechanism_findings(df, tu, lr_f)
    out.update(mech)
    tests += [("t3d_growth_raw", growth_raw, None), ("t3d_std_vs_raw", std_vs_raw, None)]
    # trap 4: train mode minus eval mode on the same batches; the held-out set after the pass minus before
    t4 = df[df["trap"] == "sorted_batches"]
    fr = sorted(t4["sorted_fraction"].unique())
    case_of = dict(zip(t4["sorted_fraction"], t4["case"]))
    sb = lambda p, q: v("sorted_batches", case_of[p], q)
    t4d = lambda p: sb(p, "module_train_accuracy") - sb(p, "module_eval_accuracy")
    curve = [sb(p, "module_train_accuracy").mean() for p in fr]
    flagged = [p for p in fr if sb(p, "sorted_lint").mean() > 0.5]
    src = df.groupby("seed")["source_task_a_accuracy"].first()
    tests.append(("t4_after", sb(fr[-1], "module_eval_accuracy_after_pass") - src, TOL_AFTER))  # same images
    tests.append(("t4_first_flagged", t4d(min(flagged)) if flagged else pd.Series(dtype=float), None))
    out.update(t4_eval_shuffled=sb(fr[0], "module_eval_accuracy").mean(),
               t4_eval_sorted=sb(fr[-1], "module_eval_accuracy").mean(),
               t4_train_shuffled=curve[0], t4_train_half=curve[len(fr) // 2], t4_half=float(fr[len(fr) // 2]),
               **spread("t4_train_sorted", sb(fr[-1], "module_train_accuracy")),
               t4_monotone=bool(all(bool((sb(q, "module_train_accuracy") <= sb(p, "module_train_accuracy")).all())
                                    for p, q in zip(fr, fr[1:]))),
               t4_first_flagged=float(min(flagged)) if flagged else float("nan"),
               t4_dep_first_flagged=sb(min(flagged), "label_dependence").mean() if flagged else float("nan"),
               t4_dep_shuffled=sb(fr[0], "label_dependence").mean(),
               t4_shuffled_clean=bool((sb(fr[0], "sorted_lint") == 0).all()),
               t4_flagged_every_seed=bool(bool(flagged) and (sb(min(flagged), "sorted_lint") == 1).all()),
               t4_after_sorted=sb(fr[-1], "module_eval_accuracy_after_pass").mean(),
               t4_train_vs_eval_shuffled=ci(t4d(fr[0])), t4_train_vs_eval_half=ci(t4d(fr[len(fr) // 2])),
               t4_train_vs_eval_sorted=ci(t4d(fr[-1])), t4_lint_max_dependence=LINT_MAX_DEPENDENCE,
               t4_tol_after=TOL_AFTER)
    # trap 5's training arm: batch statistics minus pinned (the reference), per training batch
    bt, below = _batch_training_findings(df, src)
    out.update(bt)
    tests += [(f"t5t_reest_b{b}", d, None) for b, d in below["reest"].items()]
    # trap 6: trained on shuffled or class-sorted batches
    st = lambda case, q: v("sorted_training", case, q)
    tests.append(("t6_meter_gap", st("class_sorted", "train_meter_accuracy")
                  - st("class_sorted", "heldout_eval_accuracy"), TOL_TIE))
    out.update(t6_meter_shuffled=st("shuffled", "train_meter_accuracy").mean(),
               t6_meter_sorted=st("class_sorted", "train_meter_accuracy").mean(),
               t6_eval_shuffled=st("shuffled", "heldout_eval_accuracy").mean(),
               **spread("t6_eval_sorted", st("class_sorted", "heldout_eval_accuracy")),
               t6_batch_stats_sorted=st("class_sorted", "heldout_batch_stats_accuracy").mean(),
               t6_gap_shuffled=ci(st("shuffled", "train_meter_accuracy") - st("shuffled", "heldout_eval_accuracy")),
               t6_sorted_vs_shuffled=ci(st("class_sorted", "heldout_eval_accuracy")
                                        - st("shuffled", "heldout_eval_accuracy")),
               t6_tie_margin=TOL_TIE)
    # the family: every test above and the two safe-batch rules
    family = Family(m=len(tests) + len(RULES), alpha=ALPHA)
    words = lambda key: CLAIMS["t5t_reest" if key.startswith("t5t_reest_b") else key][1]
    decided = [decide(d, key, margin=margin, family=family, higher=words(key)[0], lower=words(key)[1])
               for key, d, margin in tests]
    # trap 5 at inference: train mode minus eval mode per batch; the safe batch by one-sided tests at the family's level
    t5 = df[df["trap"] == "tiny_batch"]
    bs = sorted(int(b) for b in t5["device_batch_size"].unique())
    tb = lambda b, q: v("tiny_batch", f"batch_{b}", q)
    t5d = lambda b: tb(b, "module_train_accuracy") - tb(b, "module_eval_accuracy")
    train_acc = {b: tb(b, "module_train_accuracy").mean() for b in bs}
    ok = [b for b in bs if train_acc[b] >= tb(b, "module_eval_accuracy").mean() - TOL_CURVE]
    lint_off = pd.concat([tb(b, "small_batch_lint") - float(b < min_batch) for b in bs])
    long = df.melt(id_vars=["trap", "case", "seed"], value_vars=list(_MOVES), var_name="quantity")
    claims = pd.concat([claims_table(decided), ask(dict(main=df, long=long), CHECKS, ALPHA),
                        claims_table([exact_check(lint_off, 0.0, "t5_lint_matches")])], ignore_index=True)
    has_counts = "min_values_per_channel" in t5 and not t5["min_values_per_channel"].isna().all()
    count = {b: (float(tb(b, "min_values_per_channel").iloc[0]) if has_counts else float("nan")) for b in bs}
    safe, safe_p = _safe_from(bs, t5d, family)
    out.update(t5_train={f"b{b}": float(a) for b, a in train_acc.items()}, t5_smallest=bs[0],
               t5_eval=tb(bs[0], "module_eval_accuracy").mean(),
               t5_first_ok=float(min(ok)) if ok else float("nan"),
               t5_train_vs_eval={f"b{b}": ci(t5d(b)) for b in bs}, t5_count={f"b{b}": c for b, c in count.items()},
               t5_safe_batch=safe, t5_safe_p=safe_p, t5_safe_count=count[int(safe)] if safe == safe else float("nan"),
               t5_tol=TOL_LOSS)
    tbs = below["batches"]
    rsafe, rsafe_p = _safe_from(tbs, below["reest_all"], family)
    asafe, _ = _safe_from(tbs, below["as_trained_all"], family)
    # the book's counts rule (Holm directions, printed kinds otherwise) over the training arm's rows of the family
    reest_rows = claims[claims["key"].isin([f"t5t_reest_b{b}" for b in below["reest"]])]
    out.update(t5t_safe_batch=rsafe, t5t_safe_p=rsafe_p, t5t_safe_batch_as_trained=asafe,
               t5t_n_below=len(below["reest"]), t5t_costs_n=count_verdicts(reest_rows, ALPHA)["lower"],
               t5t_costs_n_as_trained=count_verdicts(_as_trained_claims(below["as_trained"]), ALPHA)["lower"],
               family_m=family.m, family_confidence=100 * family.confidence)
    hyp = (claims.set_index("key")["verdict"].get("t3d_growth_raw") == "cost grows with the rate"
           and claims.set_index("key")["verdict"].get("t3d_std_vs_raw") == "standardized costs less")
    out.update(t3d_hypothesis=bool(hyp), stage1_lr=STAGE1_LR, t5t_reest_batches=REESTIMATE_BATCHES)
    return claims, numbers_table({k: (float(x) if isinstance(x, (np.floating, np.integer)) else
                                      bool(x) if isinstance(x, np.bool_) else x) for k, x in out.items()})


def _as_trained_claims(as_trained: dict) -> pd.DataFrame:
    """Trap 5's training arm *as trained* (batch statistics minus pinned, each arm with the running statistics it
    ended with), one claim ``t5t_as_trained_b<m>`` per training batch m below ``min_batch`` (``as_trained``:
    m -> per-seed differences), as a claims table of their own family (m = those batches, at least 1; level
    :data:`ALPHA`): they answer another question than the chapter's claims (what pinning alone gives, without a
    re-estimation pass), so they are not members of its family and do not widen its intervals. Counted by the
    book's counts rule (:func:`bnstudy.study.inference.count_verdicts`) as ``t5t_costs_n_as_trained``."""
    family = Family(m=max(len(as_trained), 1), alpha=ALPHA)
    higher, lower = CLAIMS["t5t_reest"][1]
    return claims_table([decide(d, f"t5t_as_trained_b{b}", family=family, higher=higher, lower=lower)
                         for b, d in as_trained.items()])


def _tuned_trap1_findings(df: pd.DataFrame, tu: pd.DataFrame, lr_pinned: float, tw: pd.DataFrame
                          ) -> tuple[dict, pd.Series]:
    """Trap 1 at tuned rates: the drifting head (``train_call_tuned``) at its validation-chosen rate against the
    pinned one (trap 3's ``whole_model`` sweep, at its own chosen rate ``lr_pinned``; rows ``tw`` by seed).
    Returns its numbers and the per-seed test difference drifting minus pinned (the claim ``t1_tuned_price``)."""
    dr = df[df["trap"] == "train_call_tuned"]
    if dr.empty:
        raise KeyError("no rows of trap='train_call_tuned' (trap 1's learning-rate sweep)")
    lr_d = float(dr.groupby("lr")["val_main"].mean().idxmax())  # ties: the smaller rate (idxmax's first)
    td = dr[dr["lr"] == lr_d].set_index("seed")
    grid = sorted(float(x) for x in dr["lr"].unique())
    price = (td["task_b_main"] - tw["task_b_main"]).dropna()  # drifting minus pinned
    pw = tu[(tu["setup"] == "whole_model") & (tu["lr"] == lr_d)].set_index("seed")["task_b_main"]
    same = t_interval((td["task_b_main"] - pw).dropna()) if len(pw) else Interval(*(float("nan"),) * 3, 0)
    sp = lambda name, s: {name: float(s.mean()), f"{name}_min": float(s.min()), f"{name}_max": float(s.max())}
    half = (td["task_b_main_half"] - tw["task_b_main_half"]).dropna()
    return dict(t1_tuned_lr_drifting=lr_d, t1_tuned_lr_pinned=lr_pinned,
                t1_tuned_lr_interior=bool(grid[0] < lr_d < grid[-1]), t1_tuned_n_lrs=len(grid),
                t1_tuned_lr_min=grid[0], t1_tuned_lr_max=grid[-1],
                **sp("t1_tuned_b_drifting", td["task_b_main"]), **sp("t1_tuned_b_pinned", tw["task_b_main"]),
                t1_tuned_price_b_pos_seeds=int((price > 0).sum()), t1_tuned_price_b_neg_seeds=int((price < 0).sum()),
                t1_tuned_price_b_same_rate=same,
                t1_tuned_gain_drifting=t_interval(td["task_b_main"] - td["task_b_main_half"]),
                t1_tuned_loss_last_drifting=float(td["main_loss_last"].mean()),
                t1_tuned_loss_last_pinned=float(tw["main_loss_last"].mean()),
                t1_tuned_gain_pinned=t_interval(tw["task_b_main"] - tw["task_b_main_half"]),
                t1_tuned_price_b_half=t_interval(half),
                t1_tuned_price_change=t_interval((price - half).dropna())), price


def _pkey(p: float) -> str:
    """A dropout rate as a glue-safe key: 0.1 -> ``p10``, 0 -> ``off``."""
    return "off" if p == 0 else f"p{round(p * 100):02d}"


def _dropout_mechanism_findings(df: pd.DataFrame, tu: pd.DataFrame, lr_f: float) -> tuple[dict, pd.Series, pd.Series]:
    """Trap 3's dropout mechanism (``dropout_mechanism`` rows, referee ch2c N5), paired within seed.

    Per feature kind (``raw``, ``std``) and dropout rate p, the main head's test accuracy of the fix (``t3d_acc``,
    keys ``<kind>_p10`` ..., ``<kind>_off`` for dropout pinned off) and dropout's effect ``t3d_effect`` = fix at p
    minus fix with dropout off (negative: dropout costs), both at the kind's rate (mean [95% interval] over seeds).
    Raw features run at the fix's rate chosen in ``whole_eval_tuned`` (``lr_f``; its p = :data:`P_DROP` run and its
    dropout-off partner, the whole-model run at ``lr_f``, are taken from ``tu``); standardized ones at the rate the
    standardized fix (p = :data:`P_DROP`) chose on validation over its grid (``t3d_lr_std``; ``t3d_std_lr_interior``:
    not at an end of that grid). ``t3d_std_vs_raw_at``: per p, standardized effect minus raw effect;
    ``t3d_growth_std``: the standardized effect at the highest p minus at the lowest. ``t3d_rel_effect``: per kind,
    the effect at the page's p as a share of the same kind's no-dropout accuracy (per seed), and
    ``t3d_rel_std_vs_raw`` standardized minus raw share: standardizing also raises the no-dropout head, so the
    absolute effects alone could shrink by scale. Returns the numbers and the two claims' per-seed differences:
    the raw effect at the highest p minus at the lowest (``t3d_growth_raw``) and, at the page's p, standardized
    minus raw effect (``t3d_std_vs_raw``). Raises ``KeyError`` when rows are missing.
    """
    dm = df[df["trap"] == "dropout_mechanism"]
    if dm.empty:
        raise KeyError("no rows of trap='dropout_mechanism' (trap 3's dropout mechanism)")
    parsed = dm["case"].map(parse_dropout_case)
    dm = dm.assign(kind=parsed.str[0], p=parsed.str[1])
    std_fix = dm[(dm["kind"] == "std") & (dm["p"] == P_DROP)]
    grid = sorted(float(x) for x in std_fix["lr"].unique())
    lr_s = float(std_fix.groupby("lr")["val_main"].mean().idxmax())

    def acc(kind, p):
        if kind == "raw" and p == P_DROP:
            rows = tu[(tu["setup"] == "backbone_only") & (tu["lr"] == lr_f)]
        elif kind == "raw" and p == 0:
            rows = tu[(tu["setup"] == "whole_model") & (tu["lr"] == lr_f)]  # the fix with dropout off, exactly
        else:
            rows = dm[(dm["kind"] == kind) & (dm["p"] == p) & (dm["lr"] == (lr_f if kind == "raw" else lr_s))]
        if rows.empty:
            raise KeyError(f"no dropout_mechanism rows for kind={kind!r}, p={p:g}")
        return rows.set_index("seed")["task_b_main"].astype(float)

    ps = sorted(float(p) for p in dm.loc[dm["p"] > 0, "p"].unique())
    ps = sorted(set(ps) | {P_DROP})
    effect = {(k, p): acc(k, p) - acc(k, 0) for k in FEATURE_KINDS for p in ps}
    growth = {k: effect[(k, ps[-1])] - effect[(k, ps[0])] for k in FEATURE_KINDS}
    svr = {p: effect[("std", p)] - effect[("raw", p)] for p in ps}
    rel = {k: effect[(k, P_DROP)] / acc(k, 0) for k in FEATURE_KINDS}
    return dict(t3d_rel_effect={k: t_interval(x) for k, x in rel.items()},
                t3d_rel_std_vs_raw=t_interval(rel["std"] - rel["raw"]),
                t3d_p_low=ps[0], t3d_p_high=ps[-1], t3d_p_page=P_DROP,
                t3d_lr_raw=lr_f, t3d_lr_std=lr_s, t3d_std_n_lrs=len(grid),
                t3d_std_lr_interior=bool(grid[0] < lr_s < grid[-1]),
                t3d_acc={f"{k}_{_pkey(p)}": float(acc(k, p).mean()) for k in FEATURE_KINDS for p in [0.0] + ps},
                t3d_effect={f"{k}_{_pkey(p)}": t_interval(x) for (k, p), x in effect.items()},
                t3d_std_vs_raw_at={_pkey(p): t_interval(x) for p, x in svr.items()},
                t3d_growth_std=t_interval(growth["std"])), growth["raw"], svr[P_DROP]


def _batch_training_findings(df: pd.DataFrame, src: pd.Series) -> tuple[dict, dict]:
    """Trap 5's training arm (``batch_training``), per training batch m (paired per seed, same batches).

    Two comparisons of held-out eval-mode accuracy, batch statistics minus pinned (the reference): ``t5t_bs_vs_pinned``
    *as trained* (each arm with the running statistics it ended with: the pinned arm's are task A's, stale for its
    new weights) and ``t5t_reest_bs_vs_pinned`` *after re-estimating* each arm's running statistics with the weights
    fixed (which leaves only what training did to the weights; referee ch2c N1), descriptive 95% intervals.
    ``t5t_change``: change from the source network (``src``, by seed) per arm, keys ``<mode>_b<m>`` (as trained)
    and ``<mode>_reest_b<m>``; ``t5t_reest_gain``: the batch-statistics arm re-estimated minus as trained;
    ``t5t_samples``: samples seen per run at m (the step count is fixed, so the sample count grows with m);
    ``t5t_pinned_reest_below_n``: batches where the pinned arm, re-estimated, has a 95% interval below the source.
    Returns the numbers and, for :func:`findings`, ``{"batches", "reest": {m: diff} below min_batch, "as_trained":
    {m: diff} below min_batch, "reest_all": m -> diff, "as_trained_all": m -> diff}``."""
    bt = df[df["trap"] == "batch_training"]
    if bt.empty:
        raise KeyError("no rows of trap='batch_training' (trap 5's training arm)")
    bs = sorted(int(b) for b in bt["device_batch_size"].unique())
    q = lambda mode, b, col: _values(df, "batch_training", f"{mode}_b{b}", col)
    ev, re_ = "heldout_eval_accuracy", "heldout_reestimated_accuracy"
    diff = lambda b, col: q("batch_stats", b, col) - q("pinned", b, col)
    min_batch = int(df["min_batch"].iloc[0])
    below = [b for b in bs if b < min_batch]
    change = lambda mode, b, col: t_interval(q(mode, b, col) - src.reindex(q(mode, b, col).index))
    steps = int(bt["steps"].iloc[0])
    nums = dict(t5t_steps=steps, t5t_largest=bs[-1], t5t_smallest=bs[0],
                t5t_samples={f"b{b}": steps * b for b in bs},
                t5t_eval={f"{mode}_b{b}": float(q(mode, b, ev).mean()) for mode in BATCH_TRAINING_MODES for b in bs},
                t5t_reest={f"{mode}_b{b}": float(q(mode, b, re_).mean()) for mode in BATCH_TRAINING_MODES for b in bs},
                t5t_bs_vs_pinned={f"b{b}": t_interval(diff(b, ev)) for b in bs},
                t5t_reest_bs_vs_pinned={f"b{b}": t_interval(diff(b, re_)) for b in bs},
                t5t_change={**{f"{mode}_b{b}": change(mode, b, ev) for mode in BATCH_TRAINING_MODES for b in bs},
                            **{f"{mode}_reest_b{b}": change(mode, b, re_) for mode in BATCH_TRAINING_MODES
                               for b in bs}},
                t5t_reest_gain={f"b{b}": t_interval(q("batch_stats", b, re_) - q("batch_stats", b, ev)) for b in bs},
                t5t_loss_last={f"{mode}_b{b}": float(q(mode, b, "train_loss_last").mean())
                               for mode in BATCH_TRAINING_MODES for b in bs},
                t5t_pinned_reest_below_n=sum(bool(change("pinned", b, re_).high < 0) for b in bs))
    return nums, dict(batches=bs, reest={b: diff(b, re_) for b in below}, as_trained={b: diff(b, ev) for b in below},
                      reest_all=lambda b: diff(b, re_), as_trained_all=lambda b: diff(b, ev))


# --- the page's words, chosen by the findings ----------------------------------------------------------------------
# Every sentence of the page that states an outcome is one of these (glued by the notebook through glue_chapter's
# words), so that it stays true for any rows: the words follow the numbers and verdicts, never the other way round
# (issue 25). Sentences that only choose between fixed outcomes are rule-triggered notes (NOTES); those that quote
# several numbers are functions of the claims table C and the numbers table N.

#: What the page prints for a number that does not exist (a safe batch that no batch reached, a share never flagged).
NA = "n/a"


def _isnan(x) -> bool:
    return x is None or (isinstance(x, (float, np.floating)) and x != x)


def _verdict(C: pd.DataFrame, key: str) -> str:
    return str(claim(C, key)["verdict"])


def _kind(C: pd.DataFrame, key: str) -> str:
    return str(claim(C, key)["kind"])


_GROWS, _STD_LESS = "cost grows with the rate", "standardized costs less"
_NO_GROWTH = "these data do not show that the dropout cost grows with the dropout rate on raw features"
_NO_STD = "these data do not show that standardizing the features shrinks the dropout cost"
_hyp = lambda grows, less: lambda C, N: ((_verdict(C, "t3d_growth_raw") == _GROWS) == grows  # noqa: E731
                                         and (_verdict(C, "t3d_std_vs_raw") == _STD_LESS) == less)
_safe_t5t = lambda N: number(N, "t5t_safe_batch")  # noqa: E731
_loss_keys = ("t1_loss_first_pinned", "t1_loss_last_pinned", "t1_loss_first_eval_once", "t1_loss_last_eval_once")

#: The page's rule-triggered notes (:class:`bnstudy.study.words.Note`; exactly one of each key holds): trap 3's dropout
#: hypothesis read from its two claims' verdicts (``t3d_hypothesis_words``: it needs both directions shown, "cost grows
#: with the rate" and "standardized costs less", and says which part is missing otherwise); where trap 5's training
#: arm is safe against the ``small_batch`` lint's threshold (``t5t_threshold_word``); trap 6 against seed article
#: 002's warning that the training meter "can look healthy" under class-sorted batches (``t6_seed``); trap 5's safe
#: batch's p and sample count, ``n/a`` without a safe batch; and trap 1's head losses, or that the run's table
#: predates them (``t1_loss_note``).
NOTES = (
    Note("t3d_hypothesis_words", _hyp(True, True),
         "The data are consistent with it: the cost grows with the dropout rate on raw features, and standardizing the "
         "features shrinks it. They do not single it out: most accounts of dropout predict growth with the rate, and "
         "standardizing changes offset and scale together."),
    Note("t3d_hypothesis_words", _hyp(False, True), f"It is not shown as stated: {_NO_GROWTH}."),
    Note("t3d_hypothesis_words", _hyp(True, False), f"It is not shown as stated: {_NO_STD}."),
    Note("t3d_hypothesis_words", _hyp(False, False), f"It is not shown as stated: {_NO_GROWTH}; {_NO_STD}."),
    Note("t5t_threshold_word", lambda C, N: _isnan(_safe_t5t(N)),
         "nowhere in the grid tried: no batch is safe by this rule,"),
    Note("t5t_threshold_word", lambda C, N: _safe_t5t(N) < number(N, "min_batch"), "below"),
    Note("t5t_threshold_word", lambda C, N: _safe_t5t(N) == number(N, "min_batch"), "at"),
    Note("t5t_threshold_word", lambda C, N: _safe_t5t(N) > number(N, "min_batch"), "above"),
    Note("t6_seed", lambda C, N: _kind(C, "t6_meter_gap") == "higher",
         "That is seed article 002's warning: under class-sorted batches the training meter looked better than "
         "held-out accuracy."),
    Note("t6_seed", lambda C, N: _kind(C, "t6_meter_gap") != "higher",
         "Seed article 002 warns that the meter \"can look healthy\" under class-sorted batches; here the meter {word} "
         "held-out accuracy, and both stood against the {shuffled:.3f} the meter read on shuffled batches.",
         fill=lambda C, N: dict(word=_T6_WORDS[_kind(C, "t6_meter_gap")], shuffled=number(N, "t6_meter_shuffled"))),
    Note("t5_safe_p_text", lambda C, N: _isnan(number(N, "t5_safe_p")), "n/a (no batch is safe by this rule)"),
    Note("t5_safe_p_text", lambda C, N: not _isnan(number(N, "t5_safe_p")), "{p:.1e}",
         fill=lambda C, N: dict(p=number(N, "t5_safe_p"))),
    Note("t5_safe_count_text", lambda C, N: _isnan(number(N, "t5_safe_count")), NA),
    Note("t5_safe_count_text", lambda C, N: not _isnan(number(N, "t5_safe_count")),
         "{count:.0f} at the safe batch ({batch:.0f})",
         fill=lambda C, N: dict(count=number(N, "t5_safe_count"), batch=number(N, "t5_safe_batch"))),
    Note("t1_loss_note", lambda C, N: any(_isnan(number(N, k)) for k in _loss_keys),
         "not recorded in the run behind this page (its table predates the column)"),
    Note("t1_loss_note", lambda C, N: not any(_isnan(number(N, k)) for k in _loss_keys),
         "pinned {first_pinned:.2f} and {last_pinned:.2f} nats; drifting {first_eval_once:.2f} and "
         "{last_eval_once:.2f}", fill=lambda C, N: {k[len("t1_loss_"):]: number(N, k) for k in _loss_keys}),
)


def _change(before: float, after: float, spec: str = ".3f") -> str:
    """How a quantity moved, in words that follow its sign: "fell from a to b", "rose from a to b", "stayed at a"."""
    a, b = format(before, spec), format(after, spec)
    if a == b:
        return f"stayed at {a}"
    return f"{'fell' if after < before else 'rose'} from {a} to {b}"


def _claim_ci(C: pd.DataFrame, key: str, clip: tuple = (-1.0, 1.0)) -> str:
    """A claim's estimate and family interval (cut to ``clip``, what a difference of accuracies allows) and its bold
    verdict: ``"+0.123 (+0.010 to +0.236): **drifting higher**"``; without an interval, the estimate and verdict.
    (Not :func:`bnstudy.study.words.claim_text`: this page prints signed numbers and the verdict after a colon.)"""
    r = claim(C, key)
    iv = Interval(float(r["estimate"]), float(r["low"]), float(r["high"]), int(r["n"])).clipped(*clip)
    if _isnan(iv.low):
        return f"{iv.mean:+.3f}: **{r['verdict']}**"
    return f"{iv.mean:+.3f} ({iv.low:+.3f} to {iv.high:+.3f}): **{r['verdict']}**"


def trap1_sentence(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """Trap 1 in one sentence: whether ``model.train()`` undid ``backbone.eval()`` (BatchNorm in train mode in some
    share of its calls), what task A did, and whether any backbone weight moved."""
    n = lambda k: number(N, k)  # noqa: E731
    weights = ("although no backbone weight moved" if n("t1_param") == 0 else
               f"and the backbone's weights moved by up to {n('t1_param'):.3g}")
    moved = _change(n("t1_task_a_before"), n("t1_task_a_after"))
    if n("t1_bn_train") > 0:
        return (f"`model.backbone.eval()` is undone by the training loop's next `model.train()`: the backbone's "
                f"BatchNorm layers ran in train mode in {n('t1_bn_train'):.0%} of their calls and rewrote their "
                f"running statistics, and task A {moved}, {weights}.")
    return (f"Here `model.backbone.eval()` survived the training loop's `model.train()` (BatchNorm in train mode in "
            f"none of its calls), and task A {moved}, {weights}.")


def trap2_sentence(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """Trap 2 in one sentence: a train-mode teacher under ``no_grad``, its statistics and its task-A accuracy."""
    n = lambda k: number(N, k)  # noqa: E731
    moved = _change(n("t2_task_a_before"), n("t2_task_a_after"))
    if n("t2_nbt") > 0:
        return (f"A teacher left in train mode under `torch.no_grad()` rewrote its running statistics in "
                f"{n('t2_nbt'):.0f} batches, and its task-A accuracy {moved}.")
    return (f"A teacher left in train mode under `torch.no_grad()` did not rewrite its running statistics here, and "
            f"its task-A accuracy {moved}.")


_T3_WORDS = {
    "higher": "the whole-model run's main head scores higher than the fix's",
    "lower": "the fix's main head scores higher than the whole-model run's",
    "equivalent": "the two main heads are equivalent",
    "not decided": "these seeds do not tell the two main heads apart",
    "too few seeds": "there are too few seeds to compare the two main heads",
}


def trap3_sentence(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """Trap 3 in one sentence: what the whole model in eval mode switches off, and the tuned main heads' verdict."""
    n = lambda k: number(N, k)  # noqa: E731
    off = n("t3_aux_loss_whole") < n("t3_aux_loss_fixed") or n("t3_dropout_whole") < n("t3_dropout_fixed")
    lead = ("Putting the whole model in eval mode instead switches off what is being trained" if off else
            "Putting the whole model in eval mode instead switched off nothing that is being trained here")
    return (f"{lead}: the auxiliary loss "
            f"entered {n('t3_aux_loss_whole'):.0%} of the steps and dropout {n('t3_dropout_whole'):.0%} of its calls, "
            f"against {n('t3_aux_loss_fixed'):.0%} and {n('t3_dropout_fixed'):.0%} with only the backbone pinned; at "
            f"learning rates tuned on validation data {_T3_WORDS[_kind(C, 't3_tuned_whole_vs_fix')]} (whole model "
            f"minus the fix {_claim_ci(C, 't3_tuned_whole_vs_fix')}).")


_T4_WORDS = {"lower": "Batches that follow the label cost train mode accuracy",
             "higher": "Batches that follow the label raise train-mode accuracy here",
             "equivalent": "Batches that follow the label leave train-mode accuracy within the margin",
             "not decided": "Whether batches that follow the label cost train-mode accuracy is not shown here",
             "too few seeds": "Whether batches that follow the label cost train-mode accuracy needs more seeds"}
_T6_WORDS = {"higher": "overstated", "lower": "understated", "equivalent": "matched",
             "not decided": "is not shown to differ from", "too few seeds": "cannot be compared with"}


def trap4_sentence(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """Trap 4 in one sentence: train mode minus eval mode on the same batches where the loader lint first fires."""
    share = number(N, "t4_first_flagged")
    if _isnan(share):
        return "`lint_loader` flagged none of the label-sorted loaders tried."
    return (f"{_T4_WORDS[_kind(C, 't4_first_flagged')]}: where `lint_loader` first flags the loader (a one-class share "
            f"of {share:.2f}), train mode minus eval mode on the same batches is "
            f"{_claim_ci(C, 't4_first_flagged')}.")


def trap6_sentence(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """Trap 6 in one sentence: a network trained on class-sorted batches, held out and by its training meter."""
    return (f"A network trained on class-sorted batches reached {number(N, 't6_eval_sorted'):.3f} on held-out data, "
            f"against {number(N, 't6_eval_shuffled'):.3f} trained on shuffled ones, and its training meter "
            f"{_T6_WORDS[_kind(C, 't6_meter_gap')]} that held-out accuracy (meter minus held-out "
            f"{_claim_ci(C, 't6_meter_gap')}).")


def safe_batch_text(batch: float, tol: float) -> str:
    """ "loses less than 0.02 from batch 8 on", or that no batch in the grid does (a NaN safe batch)."""
    if _isnan(batch):
        return f"loses less than {tol:.2f} at no batch size tried (no batch from which every larger one does)"
    return f"loses less than {tol:.2f} from batch {batch:.0f} on"


def small_batch_sentence(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """Trap 5 in one sentence: the smallest safe batch at inference in train mode and in training."""
    n = lambda k: number(N, k)  # noqa: E731
    safe, min_batch, tol, smallest = n("t5t_safe_batch"), n("min_batch"), n("t5_tol"), n("t5_smallest")
    where = ("" if _isnan(safe) else
             f", {'below' if safe < min_batch else 'at' if safe == min_batch else 'above'}"
             f" the `small_batch` lint's threshold of {min_batch}")
    return (f"With BatchNorm on batch statistics at inference the network {safe_batch_text(n('t5_safe_batch'), tol)}"
            f" (at batch {smallest} it scores {n(f't5_train_b{smallest}'):.3f} against "
            f"{n('t5_eval'):.3f} in eval mode), and trained further on batch statistics, then re-estimated, it "
            f"{safe_batch_text(safe, tol)}{where}.")


def dropout_ps(N: pd.DataFrame) -> list[float]:
    """Trap 3's dropout rates p > 0 of the dropout mechanism, ascending, read from the numbers table's
    ``t3d_acc_raw_p<100 p>`` rows."""
    return sorted(int(k[len("t3d_acc_raw_p"):]) / 100 for k in N["key"] if k.startswith("t3d_acc_raw_p"))


def answer(C: pd.DataFrame, N: pd.DataFrame) -> str:
    """The answer box's outcome sentences (Markdown, one paragraph), each chosen by the findings so that it is true
    for any rows: traps 1 and 2 (:func:`trap1_sentence`, :func:`trap2_sentence`), trap 3 (:func:`trap3_sentence`),
    trap 4 (:func:`trap4_sentence`) and trap 5 (:func:`small_batch_sentence`); trap 6 is on the page."""
    return " ".join(fn(C, N) for fn in (trap1_sentence, trap2_sentence, trap3_sentence, trap4_sentence,
                                        small_batch_sentence))


def page_words(C: pd.DataFrame, N: pd.DataFrame) -> dict:
    """Every findings-chosen text of the page, ``{glue key suffix: Markdown}`` (glued plain as ``ch02_<key>`` by
    :func:`bnstudy.study.pages.glue_chapter`): the answer, one summary per trap, the safe-batch texts, the dropout rates
    tried and the rule-triggered :data:`NOTES`."""
    tol = number(N, "t5_tol")
    return {"answer": answer(C, N), "t1_summary": trap1_sentence(C, N), "t2_summary": trap2_sentence(C, N),
            "t3_summary": trap3_sentence(C, N), "sorted_summary": f"{trap4_sentence(C, N)} {trap6_sentence(C, N)}",
            "t5_summary": small_batch_sentence(C, N), "t5_safe_text": safe_batch_text(number(N, "t5_safe_batch"), tol),
            "t5t_safe_text": safe_batch_text(number(N, "t5t_safe_batch"), tol),
            "t3_tuned_whole_vs_fix_text": _claim_ci(C, "t3_tuned_whole_vs_fix"), "t4_summary": trap4_sentence(C, N),
            "t6_summary": trap6_sentence(C, N), "t3d_ps": ", ".join(f"{p:g}" for p in dropout_ps(N)),
            **notes(NOTES, C, N)}
