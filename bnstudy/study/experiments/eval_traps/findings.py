"""Chapter 2, what is claimed, from :mod:`.run`'s tables: :func:`findings` (the claims table and the numbers table
the page cites), :func:`thread_findings` (the thread check's numbers) and :func:`page_words` (the sentences the
findings choose: :data:`NOTES`).

Every difference is *condition minus reference*, per seed (:data:`CLAIMS`). Accuracies are fractions 0..1; a plain
number is a mean over seeds, ``<name>_min`` / ``<name>_max`` the lowest and highest seed's value; intervals are
descriptive 95% Student-t intervals over seeds unless they are a claim's (the family's Bonferroni interval).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ...inference import Family, Question, ask, claims_table, count_verdicts, decide, exact_check, \
    intersection_union_p, number, numbers_table, one_sided_p, t_interval as ci
from ...words import Note, claim, claim_text, notes
from .run import AUX_WEIGHT, BATCH_TRAINING_MODES, FEATURE_KINDS, P_DROP, REESTIMATE_BATCHES, STAGE1_LR, \
    THREAD_QUANTITIES, chosen_rates, parse_dropout_case

#: Tolerances set by us, before the checks: "about chance" (1.5x chance), trap 4's "unchanged" (TOST against
#: +-TOL_AFTER), trap 5's "loses less than TOL_LOSS" (one-sided t tests against -TOL_LOSS, intersection-union),
#: trap 6's meter "agrees with held-out accuracy" (TOST against +-TOL_TIE).
CHANCE_FACTOR, TOL_AFTER, TOL_LOSS, TOL_TIE = 1.5, 0.02, 0.02, 0.05
#: The family-wise level of the chapter's claims and its two safe-batch rules (one family).
ALPHA = 0.05
#: ``lint_loader``'s default threshold on label dependence (with p < 1e-3); trap 4 quotes it.
LINT_MAX_DEPENDENCE = 0.05
#: The chapter's claims (key stems; ``t5t_reest_b<m>``: one per training batch m below ``min_batch``): what each
#: compares, condition minus reference, and its ``(higher, lower)`` verdict words.
_CHANCE, _WHOLE = ("above 1.5 times chance", "below 1.5 times chance"), ("whole model higher", "whole model lower")
CLAIMS = {
    "t1_tuned_price": ("trap 1 at tuned rates: drifting head minus pinned head", ("drifting higher", "drifting lower")),
    "t3_fix_chance": ("trap 3: the run line's fix minus 1.5 times chance", _CHANCE),
    "t3_tuned_fix_chance": ("trap 3: the tuned fix minus 1.5 times chance", _CHANCE),
    "t3_whole_vs_fix": ("trap 3 at the run line's rate: whole model minus the fix", _WHOLE),
    "t3_tuned_whole_vs_fix": ("trap 3 at tuned rates: whole model minus the fix", _WHOLE),
    "t3d_growth_raw": ("trap 3, raw features: dropout's effect at the highest rate minus at the lowest",
                       ("cost shrinks with the rate", "cost grows with the rate")),
    "t3d_std_vs_raw": ("trap 3: dropout's effect at the model's rate, standardized minus raw features",
                       ("standardized costs less", "standardized costs more")),
    "t4_after": ("trap 4: held-out accuracy after the sorted pass minus before",
                 ("higher after the pass", "lower after the pass")),
    "t4_first_flagged": ("trap 4: train mode minus eval mode at the first flagged share",
                         ("train mode higher", "train mode lower")),
    "t5t_reest": ("trap 5, training, re-estimated: batch statistics minus pinned at batch {m}",
                  ("batch statistics higher", "batch statistics lower")),
    "t6_meter_gap": ("trap 6, trained class-sorted: the meter minus held-out accuracy", ("meter higher", "meter lower")),
}
#: Every direction word the page may print (the book's glossary test reads it), in order.
DIRECTIONS: tuple[str, ...] = tuple(dict.fromkeys(w for _, words in CLAIMS.values() for w in words))
#: The two safe-batch rules, members of the family beside the claims table.
RULES = {"t5_safe_batch": "trap 5, inference: train mode loses less than the tolerance from the safe batch on",
         "t5t_safe_batch": "trap 5, training, re-estimated: batch statistics lose less than the tolerance from the "
                           "safe batch on"}
#: The paired differences the thread check reports, as (minuend, subtrahend) quantities.
THREAD_PAIRS = {"t1_price": ("t1_eval_once", "t1_pinned"), "t1_tuned_price": ("t1_tuned_drifting", "t3_tuned_whole"),
                "t3_fix_vs_whole": ("t3_fix", "t3_whole"), "t3_tuned_fix_vs_whole": ("t3_tuned_fix", "t3_tuned_whole")}
#: How the page names each thread-check quantity.
THREAD_WORDS = {"t1_eval_once": "trap 1's drifting head at the run line's rate",
                "t1_pinned": "trap 1's pinned head at the run line's rate",
                "t1_tuned_drifting": "trap 1's drifting head at its tuned rate",
                "t3_whole": "trap 3's whole-model main head at the run line's rate",
                "t3_fix": "trap 3's fix at the run line's rate",
                "t3_tuned_whole": "trap 3's whole-model main head at its tuned rate (trap 1's pinned partner)",
                "t3_tuned_fix": "trap 3's fix at its tuned rate"}


def thread_findings(tc: pd.DataFrame, main_threads: int = 1) -> pd.DataFrame:
    """The thread check's numbers table (glued ``ch02_threads_<key>``) from :func:`.run.thread_check`'s table:
    ``threads_other``, ``n_seeds``, ``n_runs`` (seed, quantity) pairs and ``n_differ`` of them changed,
    ``largest_<q>`` (the largest |other - main| of quantity q over seeds), ``max_diff`` / ``mean_diff`` over every
    pair, and ``paired_largest_<d>``: the largest change of a difference of :data:`THREAD_PAIRS` when both of its
    runs move to the other count. Raises ``ValueError`` unless the table has exactly two thread counts, one of them
    ``main_threads``, and every (seed, quantity) at both."""
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
    qs = [q for q in THREAD_QUANTITIES if q in set(d.index.get_level_values("quantity"))]
    pair = lambda x, m, s: x.xs(m, level="quantity") - x.xs(s, level="quantity")  # noqa: E731
    return numbers_table(dict(n_seeds=int(a.index.get_level_values("seed").nunique()), threads_other=other,
                              n_runs=int(len(d)), n_differ=int((d > 0).sum()),
                              largest={q: float(d.xs(q, level="quantity").max()) for q in qs},
                              max_diff=float(d.max()), mean_diff=float(d.mean()),
                              paired_largest={k: float((pair(b, m, s) - pair(a, m, s)).abs().max())
                                              for k, (m, s) in THREAD_PAIRS.items() if m in qs and s in qs}))


def thread_words(t: pd.DataFrame) -> dict:
    """``{"max_quantity": words}``: the quantity of :func:`thread_findings` with the largest change, in
    :data:`THREAD_WORDS` (the first on a tie)."""
    largest = {k[len("largest_"):]: float(v) for k, v in zip(t["key"], t["value"]) if k.startswith("largest_")}
    return {"max_quantity": THREAD_WORDS[max(largest, key=largest.get)]}


def _values(df: pd.DataFrame, trap: str, case: str, quantity: str) -> pd.Series:
    """One quantity per seed (indexed by seed); ``KeyError`` if the case or quantity is missing."""
    sel = df[(df["trap"] == trap) & (df["case"] == case)]
    if sel.empty or quantity not in sel or sel[quantity].isna().all():
        raise KeyError(f"no values of {quantity!r} for trap={trap!r}, case={case!r}")
    return sel.set_index("seed")[quantity].astype(float)


def _spread(name: str, s: pd.Series) -> dict:
    return {name: float(s.mean()), f"{name}_min": float(s.min()), f"{name}_max": float(s.max())}


#: Plain numbers, means over seeds: ``{(trap, case): {key: quantity}}``.
_MEANS = {
    ("train_call", "eval_once"): dict(t1_task_a_before="task_a_before", t1_bn_train="bn_train_fraction",
                                      t1_nbt="num_batches_tracked_change", t1_task_b_eval_once="task_b"),
    ("train_call", "pinned"): dict(t1_task_b_pinned="task_b", t1_task_a_after_pinned="task_a_after",
                                   t1_probe_pinned="max_probe_change"),
    ("no_grad", "teacher_train"): dict(t2_nbt="num_batches_tracked_change", t2_task_a_before="task_a_before",
                                       t2_acc_a_mates="accuracy_with_a_mates"),
    ("no_grad", "teacher_eval"): dict(t2_logit_mates_eval="max_logit_change_by_mates",
                                      t2_buffer_eval="max_buffer_change"),
    ("whole_eval", "whole_model"): dict(t3_aux_loss_whole="aux_loss_fraction",
                                        t3_dropout_whole="dropout_train_fraction",
                                        t3_task_b_main_whole="task_b_main", t3_loss_last_whole="main_loss_last"),
    ("whole_eval", "backbone_only"): dict(t3_aux_loss_fixed="aux_loss_fraction",
                                          t3_dropout_fixed="dropout_train_fraction",
                                          t3_loss_first_fixed="main_loss_first", t3_loss_last_fixed="main_loss_last"),
    ("sorted_training", "shuffled"): dict(t6_meter_shuffled="train_meter_accuracy",
                                          t6_eval_shuffled="heldout_eval_accuracy"),
    ("sorted_training", "class_sorted"): dict(t6_meter_sorted="train_meter_accuracy"),
}
#: Means over seeds with the lowest and highest seed's value (``<key>_min``, ``<key>_max``), as :data:`_MEANS`.
_SPREADS = {
    ("train_call", "eval_once"): dict(t1_buffer="max_buffer_change", t1_probe="max_probe_change",
                                      t1_task_a_after="task_a_after", t1_mean_shift="max_mean_shift_sd",
                                      t1_log_var="max_abs_log_var_ratio"),
    ("no_grad", "teacher_train"): dict(t2_task_a_after="task_a_after", t2_acc_b_mates="accuracy_with_b_mates",
                                       t2_logit_mates="max_logit_change_by_mates", t2_mean_shift="max_mean_shift_sd",
                                       t2_log_var="max_abs_log_var_ratio"),
    ("whole_eval", "whole_model"): dict(t3_task_b_aux_whole="task_b_aux"),
    ("sorted_training", "class_sorted"): dict(t6_eval_sorted="heldout_eval_accuracy"),
}


def _safe_from(batches: list, diff, family: Family) -> tuple[float, float]:
    """The smallest batch from which every larger one loses less than ``TOL_LOSS``, and its p: each batch's
    ``diff(b)`` (per seed, negative: a loss) one-sided against ``-TOL_LOSS``, "every batch from b on" by Berger's
    intersection-union test, shown below ``family.level``; ``(nan, nan)`` if no batch is."""
    p = {b: one_sided_p(diff(b), "greater", null=-TOL_LOSS) for b in batches}
    for i, b in enumerate(batches):
        p_iu = intersection_union_p([p[x] for x in batches[i:]])
        if p_iu < family.level:
            return float(b), p_iu
    return float("nan"), float("nan")


#: The identities of the code (exact checks, not findings), over every seed: with the pin every backbone buffer,
#: weight and probe logit changes by 0; in eval mode logits are bit-identical whatever the batch mates and nothing
#: moves; the auxiliary head is untouched with the whole model in eval mode; the fix with dropout off equals the
#: whole-model run; every scored logit equals the head without its dropout layer. The first two read ``_MOVES``
#: from the rows melted long (``quantity``, ``value``).
_MOVES = ("max_buffer_change", "num_batches_tracked_change", "max_param_change", "max_probe_change",
          "max_logit_change_by_mates")
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
    """``(claims, numbers)`` from :func:`.run.run`'s table (every trap and case, at least two seeds).

    The claims that are tests (:func:`~bnstudy.study.inference.decide`, words of :data:`CLAIMS`) and the two
    safe-batch rules (:data:`RULES`) form one family (``m = len(tests) + 2``: Bonferroni intervals, equivalence of
    ``t4_after`` within ``TOL_AFTER`` and ``t6_meter_gap`` within ``TOL_TIE`` at ``ALPHA/m``, Holm's p over the
    table), so they are ``decide`` calls, not ``ask`` questions (whose family is its questions alone). The checks are
    :data:`CHECKS` and ``t5_lint_matches`` (the small-batch lint fires exactly below ``min_batch``). Tuned rates:
    :func:`.run.chosen_rates`. Raises ``KeyError`` if a case is missing.
    """
    first = df.iloc[0]
    v = lambda trap, case, q: _values(df, trap, case, q)  # noqa: E731
    out = dict(n_seeds=int(df["seed"].nunique()), chance=1 / int(first["n_classes"]),
               source_acc=float(df.groupby("seed")["source_task_a_accuracy"].first().mean()),
               **{k: int(first[k]) for k in ("steps", "epoch_steps", "batch_size", "teacher_batches", "n_eval",
                                             "min_batch")})
    for (trap, case), keys in _MEANS.items():
        out.update({k: v(trap, case, q).mean() for k, q in keys.items()})
    for (trap, case), keys in _SPREADS.items():
        for k, q in keys.items():
            out.update(_spread(k, v(trap, case, q)))
    chance, min_batch = out["chance"], out["min_batch"]
    # trap 1: the drifting head (eval_once) and the pinned one, at the run line's rate
    tc = lambda case, q: v("train_call", case, q)  # noqa: E731
    price = tc("eval_once", "task_b") - tc("pinned", "task_b")
    has_loss = "head_loss_first" in df and df["head_loss_first"].notna().any()  # older tables predate the column
    out.update(t1_param=tc("eval_once", "max_param_change").max(),
               t1_lint_every_seed=bool((tc("eval_once", "frozen_bn_lint") == 1).all()),
               t1_price_b=ci(price), t1_price_b_pos_seeds=int((price > 0).sum()),
               t1_price_b_neg_seeds=int((price < 0).sum()),
               **{f"t1_loss_{w}_{case}": tc(case, f"head_loss_{w}").mean() if has_loss else float("nan")
                  for w in ("first", "last") for case in ("eval_once", "pinned")})
    # trap 3 at the run line's rate (tests: (key, per-seed differences, margin), decided once m is known)
    main = lambda case: v("whole_eval", case, "task_b_main")  # noqa: E731
    line = CHANCE_FACTOR * chance
    tests: list[tuple] = [("t3_fix_chance", main("backbone_only") - line, None),
                          ("t3_whole_vs_fix", main("whole_model") - main("backbone_only"), None)]
    # trap 3's learning-rate sweep, each setup at its validation-chosen rate
    tu = df[df["trap"] == "whole_eval_tuned"]
    if tu.empty:
        raise KeyError("no rows of trap='whole_eval_tuned' (trap 3's learning-rate sweep)")
    rates = chosen_rates(df)
    lr_w, lr_f = rates["whole_model"], rates["backbone_only"]
    at = lambda setup, lr: tu[(tu["setup"] == setup) & (tu["lr"] == lr)].set_index("seed")  # noqa: E731
    tw, tf = at("whole_model", lr_w), at("backbone_only", lr_f)
    tests += [("t3_tuned_fix_chance", tf["task_b_main"] - line, None),
              ("t3_tuned_whole_vs_fix", tw["task_b_main"] - tf["task_b_main"], None)]
    grid = sorted(float(x) for x in tu["lr"].unique())
    widths = re.split(r"[^0-9]+", str(first["widths"]).strip("()[] -"))  # "8-16" or "(8, 16)"
    lr_aux = float(tu[tu["setup"] == "backbone_only"].groupby("lr")["val_aux"].mean().idxmax())
    ta = at("backbone_only", lr_aux)
    pw, pf = (tu[tu["setup"] == s].pivot(index="seed", columns="lr", values="task_b_main")
              for s in ("whole_model", "backbone_only"))
    same = {lr: ci(pw[lr] - pf[lr]) for lr in grid if lr in pf and lr in pw}  # whole model - fix, same rate
    out.update(t3_n_features=int(widths[-1]), t3_p_drop_pct=100 * P_DROP, t3_chance_line=line,
               t3_fix_ci=ci(main("backbone_only")), t3_fix_seeds_below=int((main("backbone_only") <= line).sum()),
               t3_lr_aux=lr_aux, t3_tuned_aux=ci(ta["task_b_aux"]),
               t3_tuned_aux_vs_whole=ci(ta["task_b_aux"] - tw["task_b_main"]),
               t3_same_rate_low_lr=min(same), t3_same_rate_low=same[min(same)],
               t3_same_rate_high_lr=max(same), t3_same_rate_high=same[max(same)],
               t3_same_rate_min=min(x.mean for x in same.values()),
               t3_same_rate_max=max(x.mean for x in same.values()),
               t3_lr_whole=lr_w, t3_lr_fixed=lr_f,
               t3_lr_interior=bool(all(grid[0] < x < grid[-1] for x in (lr_w, lr_f))),
               t3_lr_runline=float(v("whole_eval", "whole_model", "lr").iloc[0]), t3_n_lrs=len(grid), t3_lr_min=grid[0],
               t3_lr_max=grid[-1], t3_tuned_steps=int(tu["steps"].iloc[0]),
               **_spread("t3_tuned_main_whole", tw["task_b_main"]),
               **_spread("t3_tuned_main_fixed", tf["task_b_main"]),
               t3_tuned_fixed_ci=ci(tf["task_b_main"]),
               t3_tuned_gain_fixed=ci(tf["task_b_main"] - tf["task_b_main_half"]),
               t3_tuned_gain_whole=ci(tw["task_b_main"] - tw["task_b_main_half"]),
               t3_tuned_loss_last_fixed=tf["main_loss_last"].mean(),
               t3_tuned_loss_last_whole=tw["main_loss_last"].mean(), t3_tuned_aux_fixed=tf["task_b_aux"].mean(),
               t3_aux_vs_fix_main=ci(ta["task_b_aux"] - tf["task_b_main"]),  # each at its own chosen rate
               t3_aux_vs_fix_main_same_rate=ci(tf["task_b_aux"] - tf["task_b_main"]),  # the fix's rate, one run
               t3_aux_weight=AUX_WEIGHT)
    # trap 1 at tuned rates: the drifting head (train_call_tuned) at its chosen rate minus the pinned one (trap 3's
    # whole-model sweep at its own chosen rate, tw; claim t1_tuned_price)
    dr = df[df["trap"] == "train_call_tuned"]
    lr_d = rates["drifting"]
    td = dr[dr["lr"] == lr_d].set_index("seed")
    grid = sorted(float(x) for x in dr["lr"].unique())
    price = (td["task_b_main"] - tw["task_b_main"]).dropna()
    half = (td["task_b_main_half"] - tw["task_b_main_half"]).dropna()
    out.update(t1_tuned_lr_drifting=lr_d, t1_tuned_lr_pinned=lr_w,
               t1_tuned_lr_interior=bool(grid[0] < lr_d < grid[-1]), t1_tuned_n_lrs=len(grid),
               t1_tuned_lr_min=grid[0], t1_tuned_lr_max=grid[-1],
               **_spread("t1_tuned_b_drifting", td["task_b_main"]), **_spread("t1_tuned_b_pinned", tw["task_b_main"]),
               t1_tuned_price_b_pos_seeds=int((price > 0).sum()), t1_tuned_price_b_neg_seeds=int((price < 0).sum()),
               t1_tuned_gain_drifting=ci(td["task_b_main"] - td["task_b_main_half"]),
               t1_tuned_loss_last_drifting=float(td["main_loss_last"].mean()),
               t1_tuned_loss_last_pinned=float(tw["main_loss_last"].mean()),
               t1_tuned_gain_pinned=ci(tw["task_b_main"] - tw["task_b_main_half"]),
               t1_tuned_price_b_half=ci(half), t1_tuned_price_change=ci((price - half).dropna()))
    # trap 3's dropout mechanism, paired within seed: the fix's main head at dropout p minus with dropout off, per
    # feature kind; raw features at the fix's tuned rate (its p = P_DROP run and, dropout off, the whole-model run
    # from the sweep), standardized ones at the rate the standardized fix chose
    dm = df[df["trap"] == "dropout_mechanism"]
    if dm.empty:
        raise KeyError("no rows of trap='dropout_mechanism' (trap 3's dropout mechanism)")
    parsed = dm["case"].map(parse_dropout_case)
    dm = dm.assign(kind=parsed.str[0], p=parsed.str[1])
    std_grid = sorted(float(x) for x in dm[(dm["kind"] == "std") & (dm["p"] == P_DROP)]["lr"].unique())
    lr_s = rates["std"]

    def acc(kind, p):
        if kind == "raw" and p in (P_DROP, 0):
            rows = tu[(tu["setup"] == ("backbone_only" if p else "whole_model")) & (tu["lr"] == lr_f)]
        else:
            rows = dm[(dm["kind"] == kind) & (dm["p"] == p) & (dm["lr"] == (lr_f if kind == "raw" else lr_s))]
        if rows.empty:
            raise KeyError(f"no dropout_mechanism rows for kind={kind!r}, p={p:g}")
        return rows.set_index("seed")["task_b_main"].astype(float)

    ps = sorted({float(p) for p in dm.loc[dm["p"] > 0, "p"].unique()} | {P_DROP})
    effect = {(k, p): acc(k, p) - acc(k, 0) for k in FEATURE_KINDS for p in ps}
    svr = {p: effect[("std", p)] - effect[("raw", p)] for p in ps}
    rel = {k: effect[(k, P_DROP)] / acc(k, 0) for k in FEATURE_KINDS}
    out.update(t3d_rel_effect={k: ci(x) for k, x in rel.items()}, t3d_rel_std_vs_raw=ci(rel["std"] - rel["raw"]),
               t3d_p_low=ps[0], t3d_p_high=ps[-1], t3d_p_page=P_DROP, t3d_lr_raw=lr_f, t3d_lr_std=lr_s,
               t3d_std_n_lrs=len(std_grid), t3d_std_lr_interior=bool(std_grid[0] < lr_s < std_grid[-1]),
               t3d_acc={f"{k}_{_pkey(p)}": float(acc(k, p).mean()) for k in FEATURE_KINDS for p in [0.0] + ps},
               t3d_effect={f"{k}_{_pkey(p)}": ci(x) for (k, p), x in effect.items()},
               t3d_std_vs_raw_at={_pkey(p): ci(x) for p, x in svr.items()})
    tests = [("t1_tuned_price", price, None)] + tests + [
        ("t3d_growth_raw", effect[("raw", ps[-1])] - effect[("raw", ps[0])], None),
        ("t3d_std_vs_raw", svr[P_DROP], None)]
    # trap 4: train mode minus eval mode on the same batches; the held-out set after the pass minus before
    t4 = df[df["trap"] == "sorted_batches"]
    fr = sorted(t4["sorted_fraction"].unique())
    case_of = dict(zip(t4["sorted_fraction"], t4["case"]))
    sb = lambda p, q: v("sorted_batches", case_of[p], q)  # noqa: E731
    t4d = lambda p: sb(p, "module_train_accuracy") - sb(p, "module_eval_accuracy")  # noqa: E731
    curve = [sb(p, "module_train_accuracy").mean() for p in fr]
    flagged = [p for p in fr if sb(p, "sorted_lint").mean() > 0.5]
    src = df.groupby("seed")["source_task_a_accuracy"].first()
    tests += [("t4_after", sb(fr[-1], "module_eval_accuracy_after_pass") - src, TOL_AFTER),  # same images
              ("t4_first_flagged", t4d(min(flagged)) if flagged else pd.Series(dtype=float), None)]
    out.update(t4_eval_shuffled=sb(fr[0], "module_eval_accuracy").mean(),
               t4_eval_sorted=sb(fr[-1], "module_eval_accuracy").mean(),
               t4_train_shuffled=curve[0], t4_train_half=curve[len(fr) // 2], t4_half=float(fr[len(fr) // 2]),
               **_spread("t4_train_sorted", sb(fr[-1], "module_train_accuracy")),
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
    # trap 5's training arm per training batch m: held-out eval-mode accuracy, batch statistics minus pinned (the
    # reference; same batches, per seed) as trained (the pinned arm's statistics are task A's, stale for its new
    # weights) and re-estimated with the weights fixed (only what training did to the weights); t5t_change: the
    # pinned arm as trained and each arm re-estimated, minus the source network (src)
    bt = df[df["trap"] == "batch_training"]
    if bt.empty:
        raise KeyError("no rows of trap='batch_training' (trap 5's training arm)")
    tbs = sorted(int(b) for b in bt["device_batch_size"].unique())
    bq = lambda mode, b, col: v("batch_training", f"{mode}_b{b}", col)  # noqa: E731
    ev, re_ = "heldout_eval_accuracy", "heldout_reestimated_accuracy"
    diff = lambda b, col: bq("batch_stats", b, col) - bq("pinned", b, col)  # noqa: E731
    below = [b for b in tbs if b < min_batch]
    change = lambda mode, b, col: ci(bq(mode, b, col) - src.reindex(bq(mode, b, col).index))  # noqa: E731
    steps = int(bt["steps"].iloc[0])
    per = lambda fn: {f"{mode}_b{b}": fn(mode, b) for mode in BATCH_TRAINING_MODES for b in tbs}  # noqa: E731
    out.update(t5t_steps=steps, t5t_largest=tbs[-1], t5t_smallest=tbs[0],
               t5t_samples={f"b{b}": steps * b for b in tbs},
               t5t_eval=per(lambda mode, b: float(bq(mode, b, ev).mean())),
               t5t_reest=per(lambda mode, b: float(bq(mode, b, re_).mean())),
               t5t_bs_vs_pinned={f"b{b}": ci(diff(b, ev)) for b in tbs},
               t5t_reest_bs_vs_pinned={f"b{b}": ci(diff(b, re_)) for b in tbs},
               t5t_change={**{f"pinned_b{b}": change("pinned", b, ev) for b in tbs},
                           **{f"{mode}_reest_b{b}": change(mode, b, re_) for mode in BATCH_TRAINING_MODES
                              for b in tbs}},
               t5t_loss_last=per(lambda mode, b: float(bq(mode, b, "train_loss_last").mean())),
               t5t_pinned_reest_below_n=sum(bool(change("pinned", b, re_).high < 0) for b in tbs))
    tests += [(f"t5t_reest_b{b}", diff(b, re_), None) for b in below]
    # trap 6: trained on shuffled or class-sorted batches
    st = lambda case, q: v("sorted_training", case, q)  # noqa: E731
    tests.append(("t6_meter_gap", st("class_sorted", "train_meter_accuracy")
                  - st("class_sorted", "heldout_eval_accuracy"), TOL_TIE))
    out.update(t6_sorted_vs_shuffled=ci(st("class_sorted", "heldout_eval_accuracy")
                                        - st("shuffled", "heldout_eval_accuracy")), t6_tie_margin=TOL_TIE)
    # the family: every test above and the two safe-batch rules
    family = Family(m=len(tests) + len(RULES), alpha=ALPHA)
    words = lambda key: CLAIMS["t5t_reest" if key.startswith("t5t_reest_b") else key][1]  # noqa: E731
    decided = [decide(d, key, margin=margin, family=family, higher=words(key)[0], lower=words(key)[1])
               for key, d, margin in tests]
    # trap 5 at inference: train mode minus eval mode per batch; the safe batch by one-sided tests at the family's level
    t5 = df[df["trap"] == "tiny_batch"]
    bs = sorted(int(b) for b in t5["device_batch_size"].unique())
    tb = lambda b, q: v("tiny_batch", f"batch_{b}", q)  # noqa: E731
    t5d = lambda b: tb(b, "module_train_accuracy") - tb(b, "module_eval_accuracy")  # noqa: E731
    lint_off = pd.concat([tb(b, "small_batch_lint") - float(b < min_batch) for b in bs])
    long = df.melt(id_vars=["trap", "case", "seed"], value_vars=list(_MOVES), var_name="quantity")
    claims = pd.concat([claims_table(decided), ask(dict(main=df, long=long), CHECKS, ALPHA),
                        claims_table([exact_check(lint_off, 0.0, "t5_lint_matches")])], ignore_index=True)
    count = {b: float(tb(b, "min_values_per_channel").iloc[0]) for b in bs}
    safe, safe_p = _safe_from(bs, t5d, family)
    rsafe, rsafe_p = _safe_from(tbs, lambda b: diff(b, re_), family)
    # the book's counts rule (the printed verdicts) over the training arm's rows of the family; as trained, the same
    # rule over those batches' comparisons as a family of their own (what pinning alone gives)
    reest_rows = claims[claims["key"].isin([f"t5t_reest_b{b}" for b in below])]
    verdict = claims.set_index("key")["verdict"]
    as_trained = Family(m=max(len(below), 1), alpha=ALPHA)
    out.update(t5_train={f"b{b}": float(tb(b, "module_train_accuracy").mean()) for b in bs}, t5_smallest=bs[0],
               t5_eval=tb(bs[0], "module_eval_accuracy").mean(),
               t5_train_vs_eval={f"b{b}": ci(t5d(b)) for b in bs}, t5_count={f"b{b}": c for b, c in count.items()},
               t5_safe_batch=safe, t5_safe_p=safe_p, t5_safe_count=count[int(safe)] if safe == safe else float("nan"),
               t5_tol=TOL_LOSS, t5t_safe_batch=rsafe, t5t_safe_p=rsafe_p,
               t5t_n_below=len(below), t5t_costs_n=count_verdicts(reest_rows, ALPHA)["lower"],
               t5t_costs_n_as_trained=sum(decide(diff(b, ev), family=as_trained).kind == "lower" for b in below),
               family_m=family.m, family_confidence=100 * family.confidence,
               t3d_hypothesis=bool(verdict.get("t3d_growth_raw") == "cost grows with the rate"
                                   and verdict.get("t3d_std_vs_raw") == "standardized costs less"),
               stage1_lr=STAGE1_LR, t5t_reest_batches=REESTIMATE_BATCHES)
    return claims, numbers_table(out)


def _pkey(p: float) -> str:
    """A dropout rate as a glue-safe key: 0.1 -> ``p10``, 0 -> ``off``."""
    return "off" if p == 0 else f"p{round(p * 100):02d}"


# --- the page's words, chosen by the findings ----------------------------------------------------------------------
# Every outcome sentence of the page is Markdown citing glued values, or a note (NOTES) chosen here from the claims
# table C and the numbers table N, so that it stays true for any rows (issue 25).

_isnan = lambda x: x is None or (isinstance(x, (float, np.floating)) and x != x)  # noqa: E731
_kind = lambda C, key: str(claim(C, key)["kind"])  # noqa: E731
_verdict = lambda C, key: str(claim(C, key)["verdict"])  # noqa: E731
_ci = lambda C, key: claim_text(claim(C, key), clip=(-1.0, 1.0))  # noqa: E731
_NO_GROWTH = "these data do not show that the dropout cost grows with the dropout rate on raw features"
_NO_STD = "these data do not show that standardizing the features shrinks the dropout cost"
_hyp = lambda grows, less: lambda C, N: ((_verdict(C, "t3d_growth_raw") == "cost grows with the rate") == grows  # noqa: E731
                                         and (_verdict(C, "t3d_std_vs_raw") == "standardized costs less") == less)
_loss_keys = ("t1_loss_first_pinned", "t1_loss_last_pinned", "t1_loss_first_eval_once", "t1_loss_last_eval_once")
_T3 = "t3_tuned_whole_vs_fix"
_t3_is = lambda *kinds: lambda C, N: _kind(C, _T3) in kinds  # noqa: E731
_t3_fill = lambda C, N: dict(ci=_ci(C, _T3))  # noqa: E731
_t4_fill = lambda C, N: dict(share=number(N, "t4_first_flagged"), ci=_ci(C, "t4_first_flagged"))  # noqa: E731
_t4_flagged = lambda C, N: not _isnan(number(N, "t4_first_flagged"))  # noqa: E731
#: Trap 5's safe batch in words, where no batch is safe (the same for both arms) and where one is.
_NONE_SAFE = "loses less than {tol:.2f} at no batch size tried (no batch from which every larger one does)"
_SAFE = "loses less than {tol:.2f} from batch {batch:.0f} on"
_safe_fill = lambda key, p: lambda C, N: dict(tol=number(N, "t5_tol"), batch=number(N, key),  # noqa: E731
                                              p=number(N, p), min_batch=number(N, "min_batch"))
_t5t = lambda C, N: number(N, "t5t_safe_batch")  # noqa: E731

#: The page's rule-triggered notes (:func:`bnstudy.study.words.notes`: exactly one note of each key holds).
NOTES = (
    Note("lead", lambda C, N: number(N, "t1_bn_train") > 0,
         "**Calling eval() on the backbone once does not keep it there.** The loop's next train() call undoes it: pin "
         "the backbone in eval mode instead."),
    Note("lead", lambda C, N: not number(N, "t1_bn_train") > 0,
         "**Here eval() on the backbone survived the training loop.** Pin it in eval mode all the same, and audit the "
         "first epoch."),
    Note("t3_summary", _t3_is("higher"),
         "On this network the whole model in eval mode helped the new task rather than harmed it. At learning rates "
         "tuned on validation data the whole-model run's main head scores higher than the fix's: whole model minus "
         "the fix is {ci}. The trap is a silent change of what is trained, which the audit reports, not a loss of "
         "accuracy here.", fill=_t3_fill),
    Note("t3_summary", _t3_is("lower"),
         "On this network the whole model in eval mode costs the new task. At learning rates tuned on validation data "
         "the fix's main head scores higher than the whole-model run's: whole model minus the fix is {ci}.",
         fill=_t3_fill),
    Note("t3_summary", lambda C, N: not _t3_is("higher", "lower")(C, N),
         "At learning rates tuned on validation data these seeds do not tell the two main heads apart: whole model "
         "minus the fix is {ci}.", fill=_t3_fill),
    Note("t3_fix_reading", _t3_is("higher"),
         "On this network the fix scores lower on task B than the whole model in eval mode: whole model minus the fix "
         "is {ci}. What it restores is the model as written, its auxiliary loss and its dropout, not accuracy. Use it "
         "where those parts are meant to train, and measure the accuracy either way.", fill=_t3_fill),
    Note("t3_fix_reading", _t3_is("lower"),
         "On this network the fix scores higher on task B than the whole model in eval mode: whole model minus the "
         "fix is {ci}.", fill=_t3_fill),
    Note("t3_fix_reading", lambda C, N: not _t3_is("higher", "lower")(C, N),
         "Whether the fix scores higher on task B these seeds do not tell: whole model minus the fix is {ci}. What it "
         "restores is the model as written, its auxiliary loss and its dropout.", fill=_t3_fill),
    Note("t3d_hypothesis_words", _hyp(True, True),
         "The data are consistent with it: the cost grows with the dropout rate on raw features, and standardizing the "
         "features shrinks it. They do not single it out: most accounts of dropout predict growth with the rate, and "
         "standardizing changes offset and scale together."),
    Note("t3d_hypothesis_words", _hyp(False, True), f"It is not shown as stated: {_NO_GROWTH}."),
    Note("t3d_hypothesis_words", _hyp(True, False), f"It is not shown as stated: {_NO_STD}."),
    Note("t3d_hypothesis_words", _hyp(False, False), f"It is not shown as stated: {_NO_GROWTH}; {_NO_STD}."),
    Note("t4_summary", lambda C, N: not _t4_flagged(C, N),
         "`lint_loader` flagged none of the label-sorted loaders tried."),
    Note("t4_summary", lambda C, N: _t4_flagged(C, N) and _kind(C, "t4_first_flagged") == "lower",
         "Batches that follow the label cost train-mode accuracy: where `lint_loader` first flags the loader (a "
         "one-class share of {share:.2f}), train mode minus eval mode on the same batches is {ci}.", fill=_t4_fill),
    Note("t4_summary", lambda C, N: _t4_flagged(C, N) and _kind(C, "t4_first_flagged") != "lower",
         "Where `lint_loader` first flags the loader (a one-class share of {share:.2f}), train mode minus eval mode on "
         "the same batches is {ci}.", fill=_t4_fill),
    Note("t5_safe_text", lambda C, N: _isnan(number(N, "t5_safe_batch")), _NONE_SAFE,
         fill=_safe_fill("t5_safe_batch", "t5_safe_p")),
    Note("t5_safe_text", lambda C, N: not _isnan(number(N, "t5_safe_batch")), _SAFE + " (intersection-union p "
         "{p:.1e})", fill=_safe_fill("t5_safe_batch", "t5_safe_p")),
    Note("t5t_safe_text", lambda C, N: _isnan(_t5t(C, N)), _NONE_SAFE, fill=_safe_fill("t5t_safe_batch", "t5t_safe_p")),
    *(Note("t5t_safe_text", rule, _SAFE + " (intersection-union p {p:.1e}), " + where + " the `small_batch` lint's "
           "threshold of {min_batch:.0f}", fill=_safe_fill("t5t_safe_batch", "t5t_safe_p"))
      for where, rule in (("below", lambda C, N: _t5t(C, N) < number(N, "min_batch")),
                          ("at", lambda C, N: _t5t(C, N) == number(N, "min_batch")),
                          ("above", lambda C, N: _t5t(C, N) > number(N, "min_batch")))),
    Note("t5_safe_count_text", lambda C, N: _isnan(number(N, "t5_safe_count")), "n/a (no safe batch)"),
    Note("t5_safe_count_text", lambda C, N: not _isnan(number(N, "t5_safe_count")),
         "{count:.0f} at the safe batch ({batch:.0f})",
         fill=lambda C, N: dict(count=number(N, "t5_safe_count"), batch=number(N, "t5_safe_batch"))),
    Note("t6_seed", lambda C, N: _kind(C, "t6_meter_gap") == "higher",
         "That is seed article 002's warning: under class-sorted batches the training meter looked better than "
         "held-out accuracy."),
    Note("t6_seed", lambda C, N: _kind(C, "t6_meter_gap") != "higher",
         "Seed article 002 warns that the meter \"can look healthy\" under class-sorted batches; here the meter was "
         "not shown to look better than held-out accuracy, and both stood against the {shuffled:.3f} the meter read "
         "on shuffled batches.", fill=lambda C, N: dict(shuffled=number(N, "t6_meter_shuffled"))),
    Note("t1_loss_note", lambda C, N: any(_isnan(number(N, k)) for k in _loss_keys),
         "not recorded in the run behind this page (its table predates the column)"),
    Note("t1_loss_note", lambda C, N: not any(_isnan(number(N, k)) for k in _loss_keys),
         "pinned {first_pinned:.2f} and {last_pinned:.2f} nats; drifting {first_eval_once:.2f} and "
         "{last_eval_once:.2f}", fill=lambda C, N: {k[len("t1_loss_"):]: number(N, k) for k in _loss_keys}),
)


def dropout_ps(N: pd.DataFrame) -> list[float]:
    """Trap 3's dropout rates p > 0, ascending, from the numbers table's ``t3d_acc_raw_p<100 p>`` rows."""
    return sorted(int(k[len("t3d_acc_raw_p"):]) / 100 for k in N["key"] if k.startswith("t3d_acc_raw_p"))


def page_words(C: pd.DataFrame, N: pd.DataFrame) -> dict:
    """Every findings-chosen text of the page, ``{key: Markdown}`` (glued as ``ch02_<key>``): the notes of
    :data:`NOTES`, every claim in the book's one shape (``<key>_text``, interval ends cut to [-1, 1]) and trap 3's
    dropout rates (``t3d_ps``, ``"0.1, 0.3, 0.5"``). Raises ``ValueError`` unless exactly one note of each key
    holds."""
    return {**notes(NOTES, C, N), **{f"{k}_text": _ci(C, k) for k in C["key"]},
            "t3d_ps": ", ".join(f"{p:g}" for p in dropout_ps(N))}
