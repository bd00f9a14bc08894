"""Chapter 2 (bnstudy.study.experiments.eval_traps: run, findings, figures): config checks, findings on hand-made tables,
and a tiny real run."""


import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bnstudy.study.config import Execution
from bnstudy.study.experiments.eval_traps import figures, findings, run
from bnstudy.study.inference import number, with_numbers
from bnstudy.study.words import claim


# --- config ------------------------------------------------------------------------------------------------------

def test_make_config_uses_the_profile_and_checks_every_parameter_up_front():
    assert run.make_config("quick").seeds == (0, 1, 2)
    assert run.make_config("full").seeds == tuple(range(10))
    assert run.make_config("quick", seeds=None).seeds == (0, 1, 2)
    with pytest.raises(ValueError, match=r"profile='fast' is not allowed; choose one of \['quick', 'full'\]"):
        run.make_config("fast")
    # the message names the config's module, now ``run`` (config.from_profile's rule; naming the chapter folder
    # there would change config.py, which every run's cache key hashes whole: left to the lead)
    with pytest.raises(ValueError, match=r"unknown eval_traps parameters \['stepz'\]"):
        run.make_config("quick", stepz=3)
    with pytest.raises(ValueError, match=r"sorted_fractions must be one or more shares in \[0, 1\], got \[0.0, 1.5\]"):
        run.make_config("quick", sorted_fractions=(0.0, 1.5))
    with pytest.raises(ValueError, match=r"batch_sizes must be one or more integers >= 1, got \[0, 2\]"):
        run.make_config("quick", batch_sizes=(0, 2))
    with pytest.raises(ValueError, match=r"batch_sizes\[1\] must be an integer, got 2.5"):
        run.make_config("quick", batch_sizes=(1, 2.5))
    with pytest.raises(ValueError, match="batch_size must be an integer >= 2, got 1"):
        run.make_config("quick", batch_size=1)
    with pytest.raises(ValueError, match=r"n_eval must be an integer >= 2 \* batch_size, got 40"):
        run.make_config("quick", n_eval=40)
    with pytest.raises(ValueError, match="noise must be >= 0, got -1"):
        run.make_config("quick", noise=-1)
    with pytest.raises(ValueError, match=r"widths must be one or more integers >= 1, got \[8, 0\]"):
        run.make_config("quick", widths=(8, 0))
    with pytest.raises(ValueError, match="stage1_batch_size must be an integer >= 2, got 1"):
        run.make_config("quick", stage1_batch_size=1)
    with pytest.raises(ValueError, match=r"t3_lrs must be one or more rates > 0, got \[0.01, 0.0\]"):
        run.make_config("quick", t3_lrs=(0.01, 0.0))
    with pytest.raises(ValueError, match="momentum must be in \\(0, 1\\], got 0"):
        run.make_config("quick", momentum=0)
    with pytest.raises(ValueError, match="lr must be a finite number, got 'fast'"):
        run.make_config("quick", lr="fast")
    with pytest.raises(ValueError, match="seeds must not repeat"):
        run.make_config("quick", seeds=[1, 1])
    with pytest.raises(ValueError, match="sorted_fractions must not repeat a value"):
        run.make_config("quick", sorted_fractions=(0.5, 0.5))
    with pytest.raises(ValueError, match="sorted_fraction must be a finite number"):
        run.sorted_fraction_labels(2, 4, 3, -0.1, torch.Generator())


def test_run_configs_one_per_seed_trap_and_case_with_unique_keys():
    cfg = run.make_config("quick", seeds=[0, 5], sorted_fractions=(0.0, 1.0), batch_sizes=(1, 16), t3_lrs=(0.01, 0.1))
    runs = cfg.run_configs()
    assert len(runs) == 2 * (2 + 2 + 3 + 2 + 2 + 2 + 2 * 2 + len(cfg.t1_lrs) + 2 * len(cfg.t5_train_batch_sizes)
                             + len(cfg.t3_std_lrs))
    tuned = [r for r in runs if r.trap == "whole_eval_tuned"]
    assert {(r.lr, r.steps) for r in tuned} == {(0.01, cfg.t3_steps), (0.1, cfg.t3_steps)}
    assert len({(r.seed, r.trap, r.case) for r in runs}) == len(runs)
    assert {r.seed for r in runs} == {0, 5}
    t5 = [r for r in runs if r.trap == "tiny_batch"]
    assert [r.device_batch_size for r in t5[:2]] == [1, 16] and all(r.sorted_fraction is None for r in t5)
    assert runs[0].source.widths == cfg.widths and runs[0].source.seed == 0
    assert "2 seeds (0, 5)" in cfg.describe()


def test_sorted_fraction_labels_put_the_stated_share_in_one_class():
    labels = run.sorted_fraction_labels(6, 8, 5, 0.75, torch.Generator().manual_seed(0))
    assert all(torch.bincount(y, minlength=5).max() >= 6 for y in labels)


# --- findings on hand-made tables --------------------------------------------------------------------------------

def _table(seeds=(0, 1, 2), price=(0.1, 0.12, 0.08), pinned_probe=0.0, aux_whole=0.1, shuffled_lint=0.0,
           sorted_train=(0.9, 0.7, 0.3), lint_b16=0.0, after=0.95, nodrop=(0.9, 0.92, 0.91),
           b4_train=(0.6, 0.6, 0.6), sorted_eval=(0.2, 0.3, 0.25), tuned_fixed=(0.4, 0.45, 0.5),
           tuned_whole=(0.6, 0.62, 0.64), fixed_peak=0.001, runline_fixed=0.8, after_seeds=(0.0, 0.0, 0.0),
           sorted_meter=0.95, eval_dropout_off=1.0, half_lint=(1.0, 1.0, 1.0), runline_seeds=(0.0, 0.0, 0.0),
           aux_whole_change=0.0, head_loss=None, sorted_train_seed2=None, drift_test=(0.7, 0.72, 0.74),
           drift_peak=0.02, bt_b4=(0.91, 0.92, 0.93), bt_b16=(0.95, 0.95, 0.95), bt_pinned_b4=None, bt_reest_b4=None,
           whole_at_fix=None, dm_raw=None, dm_std=None, std_peak=0.05):
    """A results table in run()'s shape whose right answers are known.

    Trap 3's dropout mechanism: ``whole_at_fix`` (per seed) is the whole-model head at the fix's rate (the raw
    dropout-off run; else 0.2), ``dm_raw`` {p: per seed} the raw fix at p = 0.1 and 0.5 (p = 0.3 is ``tuned_fixed``),
    ``dm_std`` {p: per seed} the standardized fix at p = 0, 0.1, 0.3, 0.5, whose rate sweep peaks at ``std_peak``.
    """
    dm_raw = dm_raw or {0.1: (0.5, 0.52, 0.55), 0.5: (0.1, 0.12, 0.11)}
    dm_std = dm_std or {0.0: (0.8, 0.82, 0.84), 0.1: (0.79, 0.8, 0.82), 0.3: (0.77, 0.79, 0.8), 0.5: (0.75, 0.77, 0.79)}
    rows = []
    base = dict(n_classes=10, steps=60, epoch_steps=10, batch_size=32, teacher_batches=3, n_eval=512, min_batch=16,
                lr=0.05, widths="8-16")
    for i, s in enumerate(seeds):
        r = lambda trap, case, **q: rows.append(dict(seed=s, trap=trap, case=case, source_task_a_accuracy=0.95,
                                                     **{**base, **q}))
        r("train_call", "eval_once", bn_train_fraction=1.0, num_batches_tracked_change=60.0, max_param_change=0.0,
          max_buffer_change=2.0 + i, max_probe_change=5.0 + i, task_a_before=0.95, task_a_after=0.2 + 0.1 * i,
          task_b=0.9, frozen_bn_lint=1.0, max_mean_shift_sd=1.0 + i, max_abs_log_var_ratio=0.5 * (i + 1),
          **({} if head_loss is None else dict(head_loss_first=head_loss[0], head_loss_last=head_loss[1])))
        r("train_call", "pinned", bn_train_fraction=0.0, num_batches_tracked_change=0.0, max_param_change=0.0,
          max_buffer_change=0.0, max_probe_change=pinned_probe, task_a_before=0.95, task_a_after=0.95,
          task_b=0.9 - price[i], frozen_bn_lint=0.0,
          **({} if head_loss is None else dict(head_loss_first=2 * head_loss[0], head_loss_last=2 * head_loss[1])))
        r("no_grad", "teacher_train", num_batches_tracked_change=3.0, max_buffer_change=1.0 + i, max_probe_change=4.0,
          task_a_before=0.95, task_a_after=0.5, accuracy_with_a_mates=0.9, accuracy_with_b_mates=0.3,
          max_logit_change_by_mates=3.0 + i, max_mean_shift_sd=0.4, max_abs_log_var_ratio=2.0 + i)
        r("no_grad", "teacher_eval", num_batches_tracked_change=0.0, max_buffer_change=0.0, max_probe_change=0.0,
          task_a_before=0.95, task_a_after=0.95, accuracy_with_a_mates=0.95, accuracy_with_b_mates=0.95,
          max_logit_change_by_mates=0.0)
        t3 = dict(main_loss_first=6.0, eval_dropout_off=eval_dropout_off)
        r("whole_eval", "whole_model", aux_loss_fraction=0.0, aux_max_param_change=aux_whole_change if i == 1 else 0.0, dropout_train_fraction=0.0,
          task_b_aux=aux_whole, task_b_main=0.8, main_loss_last=2.0, **t3)
        r("whole_eval", "backbone_only", aux_loss_fraction=1.0, aux_max_param_change=0.3,
          dropout_train_fraction=1.0, task_b_aux=0.7, task_b_main=runline_fixed + runline_seeds[i], main_loss_last=12.0, **t3)
        r("whole_eval", "backbone_only_dropout_off", aux_loss_fraction=1.0, aux_max_param_change=0.3,
          dropout_train_fraction=0.0, task_b_aux=0.7, task_b_main=nodrop[i], main_loss_last=2.0, **t3)
        # trap 3's sweep: validation peaks at 0.01 (whole model) and at fixed_peak (the fix); test values at the peak
        for setup, peak, test in (("whole_model", 0.01, tuned_whole[i]), ("backbone_only", fixed_peak, tuned_fixed[i])):
            for lr in (0.0005, 0.001, 0.01, 0.1):
                at = lr == peak
                b_main = test if at else (whole_at_fix[i] if (whole_at_fix and setup == "whole_model"
                                                              and lr == fixed_peak) else 0.2)
                r("whole_eval_tuned", f"{setup}_lr{lr:g}", setup=setup, lr=lr, steps=600,
                  val_main=0.5 + 0.1 * at, task_b_main=b_main, task_b_main_half=(test - 0.05) if at else 0.2,
                  val_aux=0.5, task_b_aux=0.55, main_loss_first=6.0, main_loss_last=1.5 + at,
                  eval_dropout_off=eval_dropout_off)
        # trap 3's dropout mechanism: the standardized fix's sweep (p = 0.3), then the chosen-rate runs
        dm = lambda kind, p, lr, acc, val=0.5: r("dropout_mechanism", run.dropout_case(kind, p, lr), setup="backbone_only",
                                                 lr=lr, steps=600, kind=kind, p_drop=p, val_main=val, task_b_main=acc,
                                                 task_b_main_half=acc, val_aux=0.5, task_b_aux=0.55, main_loss_first=3.0,
                                                 main_loss_last=1.0, eval_dropout_off=1.0)
        for lr in (0.01, 0.05, 0.2):
            if lr != std_peak:
                dm("std", 0.3, lr, 0.3)
        for p, accs in dm_std.items():
            dm("std", p, std_peak, accs[i], 0.6)
        for p, accs in dm_raw.items():
            dm("raw", p, fixed_peak, accs[i])
        # trap 1 at tuned rates: the drifting head's validation peaks at drift_peak, test value there drift_test
        for lr in (0.005, 0.01, 0.02, 0.05):
            at = lr == drift_peak
            r("train_call_tuned", f"drifting_lr{lr:g}", setup="drifting", lr=lr, steps=600, val_main=0.5 + 0.1 * at,
              task_b_main=drift_test[i] if at else 0.3, task_b_main_half=(drift_test[i] - 0.02) if at else 0.3,
              val_aux=0.5, task_b_aux=0.55, main_loss_first=3.0, main_loss_last=1.0 + at, eval_dropout_off=1.0)
        # trap 5's training arm: pinned keeps 0.95; batch statistics lose bt_b4 at 4, bt_b16 at 16, nothing at 32
        for b, bstats in ((4, bt_b4[i]), (16, bt_b16[i]), (32, 0.95)):
            pin = bt_pinned_b4[i] if (b == 4 and bt_pinned_b4) else 0.95
            for mode, acc in (("batch_stats", bstats), ("pinned", pin)):
                reest = bt_reest_b4[mode][i] if (b == 4 and bt_reest_b4) else min(acc + 0.01, 1.0)
                r("batch_training", f"{mode}_b{b}", device_batch_size=b, mode=mode, steps=100,
                  heldout_eval_accuracy=acc, heldout_reestimated_accuracy=reest,
                  train_loss_last=1.0 if mode == "batch_stats" else 0.1)
        r("sorted_training", "shuffled", train_meter_accuracy=0.9, heldout_eval_accuracy=0.9 - 0.01 * i,
          heldout_batch_stats_accuracy=0.9)
        r("sorted_training", "class_sorted", train_meter_accuracy=sorted_meter, heldout_eval_accuracy=sorted_eval[i],
          heldout_batch_stats_accuracy=0.3)
        curve = sorted_train_seed2 if (sorted_train_seed2 is not None and i == 2) else sorted_train
        for p, acc, lint in zip((0.0, 0.5, 1.0), curve, (shuffled_lint, half_lint[i], 1.0)):
            r("sorted_batches", f"fraction_{p:g}", sorted_fraction=p, module_eval_accuracy=0.95,
              module_train_accuracy=acc, module_eval_accuracy_after_pass=after + after_seeds[i], label_dependence=p,
              sorted_lint=lint)
        for b, acc, lint in ((1, 0.1, 1.0), (4, b4_train[i], 1.0), (16, 0.95, lint_b16), (32, 0.95, 0.0)):
            r("tiny_batch", f"batch_{b}", device_batch_size=b, module_eval_accuracy=0.95, module_train_accuracy=acc,
              small_batch_lint=lint, min_values_per_channel=64.0 * b)
    return pd.DataFrame(rows)


def _v(f, key):
    """The verdict of claim ``key`` of :func:`findings.findings`' ``(claims, numbers)``."""
    return claim(f[0], key)["verdict"]


def _c(f, key):
    """Claim ``key``'s row of :func:`findings.findings`' claims table."""
    return claim(f[0], key)


def _n(f, key):
    """Number ``key`` of :func:`findings.findings`' numbers table (an ``Interval`` for an interval row)."""
    return number(f[1], key)


def test_findings_on_a_table_whose_answers_are_known():
    f = findings.findings(_table())
    assert (_n(f, "n_seeds"), _n(f, "chance"), _n(f, "steps"), _n(f, "min_batch")) == (3, 0.1, 60, 16) and \
        _n(f, "source_acc") == pytest.approx(0.95)
    assert _n(f, "t1_buffer") == pytest.approx(3.0) and (_n(f, "t1_buffer_min"), _n(f, "t1_buffer_max")) == (2.0, 4.0)
    assert _n(f, "t1_task_a_after") == pytest.approx(0.3)
    assert _v(f, "t1_pinned") == "exact, checked ==" and _n(f, "t1_lint_every_seed") is True
    assert _n(f, "t1_price_b").mean == pytest.approx(0.1) and \
        _n(f, "t1_price_b").low > 0  # drifting - pinned, descriptive
    assert (_n(f, "t1_price_b_pos_seeds"), _n(f, "t1_price_b_neg_seeds")) == (3, 0)
    assert np.isnan(_n(f, "t1_loss_first_pinned"))  # a table from before the loss was recorded: not measured
    assert _n(f, "t1_param") == 0.0  # the largest change of any backbone weight over seeds
    assert (_n(f, "t2_logit_mates"), _n(f, "t2_logit_mates_min"), _n(f, "t2_logit_mates_max")) == \
        pytest.approx((4.0, 3.0, 5.0))
    assert _v(f, "t2_eval") == "exact, checked ==" and _n(f, "t2_acc_b_mates") == pytest.approx(0.3)
    assert _v(f, "t3_aux_untouched") == "exact, checked =="
    assert (_n(f, "t4_train_shuffled"), _n(f, "t4_train_half"), _n(f, "t4_half"), _n(f, "t4_train_sorted")) == \
        pytest.approx((0.9, 0.7, 0.5, 0.3))
    assert _n(f, "t4_monotone") is True and _n(f, "t4_shuffled_clean") is True and \
        _n(f, "t4_flagged_every_seed") is True
    assert (_n(f, "t4_first_flagged"), _n(f, "t4_dep_first_flagged")) == (0.5, 0.5)
    # after the sorted pass: exactly the source's accuracy in every seed (zero spread): equivalent within the margin
    c = _c(f, "t4_after")
    assert c["estimate"] == pytest.approx(0.0) and c["p_equivalence"] == 0.0 and c["verdict"] == "equivalent within ±0.02"
    assert [k for k in f[1]["key"] if k.startswith("t5_train_b")] == ["t5_train_b1", "t5_train_b4", "t5_train_b16",
                                                                      "t5_train_b32"]
    assert [_n(f, f"t5_train_b{b}") for b in (1, 4, 16, 32)] == pytest.approx([0.1, 0.6, 0.95, 0.95])
    assert _n(f, "t5_smallest") == 1 and _n(f, "t5_eval") == pytest.approx(0.95)
    assert _v(f, "t5_lint_matches") == "exact, checked =="
    assert _c(f, "t3_whole_vs_fix")["estimate"] == pytest.approx(0.0) and _v(f, "t3_whole_vs_fix") == "not decided"
    assert _v(f, "t3_nodrop_equals_whole") == "not exact" and _c(f, "t3_nodrop_equals_whole")["estimate"] == \
        pytest.approx(0.12)
    assert _v(findings.findings(_table(nodrop=(0.8, 0.8, 0.8))), "t3_nodrop_equals_whole") == "exact, checked =="
    # trap 5 at inference: train - eval mode (negative: train mode loses); safe from 16 (zero loss there and at 32)
    assert _n(f, "t5_train_vs_eval_b4").mean == pytest.approx(-0.35) and _n(f, "t5_safe_batch") == 16.0
    assert _n(f, "t5_safe_count") == 1024.0 and _n(f, "t5_count_b1") == 64.0 and _n(f, "t5_safe_p") == 0.0
    assert _n(f, "t6_meter_sorted") == pytest.approx(0.95) and _n(f, "t6_eval_sorted") == pytest.approx(0.25)
    c = _c(f, "t6_meter_gap")  # meter - held-out: 0.70 on average, far outside the +-0.05 margin
    assert c["estimate"] == pytest.approx(0.70) and c["low"] > 0 and c["verdict"] == "meter higher"
    assert _n(f, "t6_sorted_vs_shuffled").mean == pytest.approx(-0.64)  # class-sorted - shuffled
    assert (_n(f, "t1_mean_shift"), _n(f, "t1_mean_shift_min"), _n(f, "t1_mean_shift_max")) == \
        pytest.approx((2.0, 1.0, 3.0))
    assert _n(f, "t1_log_var") == pytest.approx(1.0) and _n(f, "t2_log_var") == pytest.approx(3.0)
    assert _n(f, "t2_mean_shift") == pytest.approx(0.4)
    assert (_n(f, "t3_lr_whole"), _n(f, "t3_lr_fixed"), _n(f, "t3_lr_interior"), _n(f, "t3_tuned_steps")) == \
        (0.01, 0.001, True, 600)
    assert (_n(f, "t3_n_lrs"), _n(f, "t3_lr_min"), _n(f, "t3_lr_max"), _n(f, "t3_lr_runline")) == (4, 0.0005, 0.1, 0.05)
    assert (_n(f, "t3_tuned_main_whole"), _n(f, "t3_tuned_main_fixed")) == pytest.approx((0.62, 0.45))
    # whole model - fix at tuned rates: +0.17 with 3 seeds of spread 0.05: the 95% interval excludes 0, the family's
    # (13 comparisons, Bonferroni) does not: not decided
    c = _c(f, "t3_tuned_whole_vs_fix")
    assert c["estimate"] == pytest.approx(0.17) and c["low"] < 0 < c["high"] and c["verdict"] == "not decided"
    from bnstudy.study.inference import t_interval
    assert t_interval(np.array([0.6, 0.62, 0.64]) - np.array([0.4, 0.45, 0.5])).low > 0
    assert _n(f, "t3_tuned_fixed_ci").mean == pytest.approx(0.45)
    assert _n(f, "t3_tuned_gain_fixed").mean == pytest.approx(0.05) and _n(f, "t3_tuned_loss_last_fixed") == \
        pytest.approx(2.5)
    c = _c(f, "t3_fix_chance")  # 0.8 in every seed: 0.65 above the line, no spread
    assert c["estimate"] == pytest.approx(0.65) and c["verdict"] == "above 1.5 times chance"
    assert _v(f, "t3_eval_dropout_off") == "exact, checked =="
    assert (_n(f, "t3_n_features"), _n(f, "t3_chance_line"), _n(f, "t3_fix_seeds_below")) == \
        (16, pytest.approx(0.15), 0)
    # same-rate differences, whole model - fix: 0 at 0.0005 and 0.1, -0.25 at 0.001 (the fix's peak), +0.42 at 0.01
    assert (_n(f, "t3_same_rate_low_lr"), _n(f, "t3_same_rate_high_lr")) == (0.0005, 0.1)
    assert (_n(f, "t3_same_rate_low").mean, _n(f, "t3_same_rate_high").mean) == pytest.approx((0.0, 0.0))
    assert (_n(f, "t3_same_rate_min"), _n(f, "t3_same_rate_max")) == pytest.approx((-0.25, 0.42))
    assert _n(f, "t3_lr_aux") == 0.0005 and _n(f, "t3_tuned_aux").mean == pytest.approx(0.55)
    assert _n(f, "t3_tuned_aux_vs_whole").mean == pytest.approx(-0.07)
    assert (_n(f, "t3_loss_first_fixed"), _n(f, "t3_loss_last_fixed"), _n(f, "t3_loss_last_whole")) == \
        pytest.approx((6.0, 12.0, 2.0))
    # trap 4, train - eval mode on the same batches
    assert [_n(f, f"t4_train_vs_eval_{x}").mean for x in ("shuffled", "half", "sorted")] == \
        pytest.approx([-0.05, -0.25, -0.65])
    c = _c(f, "t4_first_flagged")
    assert c["estimate"] == pytest.approx(-0.25) and c["verdict"] == "train mode lower"
    assert (_n(f, "t5_tol"), _n(f, "t6_tie_margin"), _n(f, "t4_lint_max_dependence")) == (0.02, 0.05, 0.05)
    # trap 1 at tuned rates: drifting at 0.02 (interior) against the pinned whole-model head at 0.01; +0.10 everywhere
    assert (_n(f, "t1_tuned_lr_drifting"), _n(f, "t1_tuned_lr_pinned"), _n(f, "t1_tuned_lr_interior")) == \
        (0.02, 0.01, True)
    assert (_n(f, "t1_tuned_n_lrs"), _n(f, "t1_tuned_lr_min"), _n(f, "t1_tuned_lr_max")) == (4, 0.005, 0.05)
    assert (_n(f, "t1_tuned_b_drifting"), _n(f, "t1_tuned_b_pinned")) == pytest.approx((0.72, 0.62))
    c = _c(f, "t1_tuned_price")
    assert c["estimate"] == pytest.approx(0.10) and c["verdict"] == "drifting higher"
    assert (_n(f, "t1_tuned_price_b_pos_seeds"), _n(f, "t1_tuned_price_b_neg_seeds")) == (3, 0)
    assert _n(f, "t1_tuned_gain_drifting").mean == pytest.approx(0.02)
    assert (_n(f, "t1_tuned_loss_last_drifting"), _n(f, "t1_tuned_loss_last_pinned")) == pytest.approx((2.0, 2.5))
    # trap 5's training arm: batch statistics - pinned
    assert (_n(f, "t5t_steps"), _n(f, "t5t_smallest"), _n(f, "t5t_largest")) == (100, 4, 32)
    assert _n(f, "t5t_bs_vs_pinned_b4").mean == pytest.approx(-0.03) and _n(f, "t5t_bs_vs_pinned_b32").mean == \
        pytest.approx(0.0)
    assert _n(f, "t5t_eval_batch_stats_b4") == pytest.approx(0.92) and _n(f, "t5t_eval_pinned_b4") == \
        pytest.approx(0.95)
    assert _n(f, "t5t_safe_batch") == 16.0 and _n(f, "t5t_n_below") == 1 and \
        findings.page_words(*f)["t5t_safe_text"].endswith(f"from batch 16 on (intersection-union p "
                                                          f"{_n(f, 't5t_safe_p'):.1e}), at the `small_batch` lint's "
                                                          f"threshold of 16")
    # -0.03 at batch 4, spread 0.01 over 3 seeds: not decided at the family's level, so no cost counted
    assert _v(f, "t5t_reest_b4") == "not decided" and _n(f, "t5t_costs_n") == 0
    assert _n(f, "t5t_loss_last_pinned_b16") == pytest.approx(0.1)
    assert _n(f, "t5t_change_pinned_b4").mean == pytest.approx(0.0)


#: The direction words of the chapter's claims.
_WORDS = {w for _, words in findings.CLAIMS.values() for w in words}


def test_every_verdict_is_a_word_of_the_vocabulary_and_the_family_is_one_bonferroni_family():
    from bnstudy.study.inference import Family, decide, is_verdict
    for kw in ({}, _HOLDS, dict(drift_test=(0.7, 0.5, 0.74)), dict(price=(0.15, -0.05, 0.09))):
        f = findings.findings(_table(**kw))
        assert all(is_verdict(v, _WORDS) for v in f[0]["verdict"])
        tests = f[0][~f[0]["kind"].isin(["exact", "not exact"])]
        # 11 comparisons (one batch below 16) and 2 rules
        assert _n(f, "family_m") == len(tests) + len(findings.RULES) == 13
        assert _n(f, "family_confidence") == pytest.approx(100 * (1 - 0.05 / 13))
        assert (tests["confidence"] == Family(13).confidence).all()
    # each claim is decide() on the per-seed difference it names, at the family's level: trap 1's, by hand
    f = findings.findings(_table(drift_test=(0.7, 0.66, 0.74)))  # drifting - pinned: 0.1, 0.04, 0.1
    d = decide([0.1, 0.04, 0.1], "t1_tuned_price", family=Family(13), higher="drifting higher", lower="drifting lower")
    c = _c(f, "t1_tuned_price")
    assert (c["estimate"], c["low"], c["high"], c["p"], c["verdict"]) == pytest.approx(
        (d.estimate, d.low, d.high, d.p, d.verdict))
    # Holm over the table's p-values (exact checks have none and stay NaN)
    from bnstudy.study.inference import holm
    assert list(f[0]["p_adjusted"]) == pytest.approx(list(holm(f[0]["p"])), nan_ok=True)
    assert f[0].loc[f[0]["kind"] == "exact", "p_adjusted"].isna().all()
    assert len(_WORDS) == 18 and all(len(words) == 2 for _, words in findings.CLAIMS.values())


def test_the_chance_rule_reads_the_family_interval_against_the_line():
    # the run line's fix against 1.5 x chance (0.15): accuracy minus the line, decided like every comparison
    f = findings.findings(_table(runline_fixed=0.12))  # at chance in every seed: below the line, no spread
    assert _v(f, "t3_fix_chance") == "below 1.5 times chance" and _n(f, "t3_fix_seeds_below") == 3
    f = findings.findings(_table(runline_fixed=0.15, runline_seeds=(-0.05, 0.0, 0.06)))  # interval across the line
    assert _v(f, "t3_fix_chance") == "not decided" and _n(f, "t3_fix_seeds_below") == 2
    f = findings.findings(_table(tuned_fixed=(0.12, 0.1, 0.14)))  # mean 0.12, interval across 0.15
    assert _v(f, "t3_tuned_fix_chance") == "not decided"
    f = findings.findings(_table(tuned_fixed=(0.5, 0.5, 0.5)))
    assert _v(f, "t3_tuned_fix_chance") == "above 1.5 times chance"


def test_checklist_table_is_plain_text_with_one_row_per_trap():
    f = findings.findings(_table())
    t = figures.checklist_table(*f)
    assert list(t.columns) == ["what the audit reported (this run)", "fix"] and len(t) == 6
    assert t.index.name == "trap" and t.index[0].startswith("1. model.train()")
    assert not t.reset_index().apply(lambda c: c.str.contains(r"\*\*|\{glue")).any().any()  # no Markdown or roles
    assert "per-seed largest 4.00 (range 3.00-5.00)" in t.iloc[1, 0]
    assert "whole model minus fix +0.170 (" in t.iloc[2, 1] and "not decided)" in t.iloc[2, 1]
    assert "above 1.5 times chance" in t.iloc[2, 1]
    assert t.iloc[5, 0].endswith("; meter higher)")
    f = findings.findings(_table(sorted_eval=(0.2, 0.96, 0.25)))  # one seed's held-out accuracy high: neither shown
    assert figures.checklist_table(*f).iloc[5, 0].endswith("; not decided)")


def test_batch_training_table_has_one_row_per_training_batch():
    t = figures.batch_training_table(findings.findings(_table())[1])
    assert list(t.index) == [4, 16, 32] and t.loc[4, "batch stats minus pinned, as trained"].startswith("-0.030 [")
    assert t.loc[4, "batch stats minus pinned, re-estimated"].startswith("-0.030 [") and t.loc[32, "samples seen"] == "3200"
    assert t.loc[32, "last-epoch loss (batch stats / pinned)"] == "1.00 / 0.10"


def test_as_trained_count_is_the_counts_rule_over_its_own_family():
    # batch statistics lower as trained at batch 4 (0.1, tiny spread): counted by count_verdicts over the as-trained
    # comparisons' own claims table, which leaves the chapter's family (and its intervals) as it was
    f = findings.findings(_table(bt_b4=(0.80, 0.81, 0.805), bt_pinned_b4=(0.90, 0.911, 0.905)))
    assert _n(f, "t5t_costs_n_as_trained") == 1 and _n(f, "family_m") == 13


def test_batch_training_verdicts_use_the_re_estimated_comparison():
    # Referee ch2c N1: pinned scores lower as trained (stale statistics) but its weights are better: re-estimating
    # both arms' statistics reverses the sign. The claims follow the re-estimated comparison.
    f = findings.findings(_table(bt_b4=(0.93, 0.94, 0.935), bt_pinned_b4=(0.90, 0.91, 0.905),
                           bt_reest_b4=dict(batch_stats=(0.90, 0.91, 0.905), pinned=(0.95, 0.951, 0.949))))
    assert _n(f, "t5t_bs_vs_pinned_b4").mean == pytest.approx(0.03) and _n(f, "t5t_bs_vs_pinned_b4").low > 0
    c = _c(f, "t5t_reest_b4")  # -0.045, spread 0.001: batch statistics lower even at the family's level
    assert c["estimate"] == pytest.approx(-0.045) and c["verdict"] == "batch statistics lower"
    assert _n(f, "t5t_costs_n") == 1 and _n(f, "t5t_costs_n_as_trained") == 0
    assert _n(f, "t5t_safe_batch") == 16.0
    assert _n(f, "t5t_change_pinned_reest_b4").mean == pytest.approx(0.95 - 0.95) and _n(f, "t5t_samples_b4") == 400
    assert _n(f, "t5t_reest_pinned_b4") == pytest.approx(0.95)


def test_multiplicity_table_lists_the_family():
    f = findings.findings(_table())
    t = figures.multiplicity_table(*f)
    assert len(t) == _n(f, "family_m") and list(t.index[-2:]) == list(findings.RULES.values())
    assert t.loc[findings.CLAIMS["t1_tuned_price"][0], "verdict"] == "drifting higher"
    assert t.loc[findings.RULES["t5_safe_batch"], "estimate [family interval]"] == "safe batch 16"
    assert t.loc["trap 5, training, re-estimated: batch statistics minus pinned at batch 4", "verdict"] == "not decided"
    # trap 1 at tuned rates: the pinned head's second-half gain and the price at half budget
    assert _n(f, "t1_tuned_gain_pinned").mean == pytest.approx(0.05) and _n(f, "t1_tuned_price_b_half").mean == \
        pytest.approx(0.13)
    assert _n(f, "t1_tuned_price_change").mean == pytest.approx(-0.03)


def test_findings_say_when_a_claim_is_not_shown():
    f = findings.findings(_table(price=(0.15, -0.05, 0.09)))  # the run line's difference: descriptive, spans zero
    assert _n(f, "t1_price_b").low < 0 < _n(f, "t1_price_b").high and \
        (_n(f, "t1_price_b_pos_seeds"), _n(f, "t1_price_b_neg_seeds")) == (2, 1)
    f = findings.findings(_table(head_loss=(20.0, 10.0)))  # the head's training loss, recorded: eval_once, pinned = 2x
    assert (_n(f, "t1_loss_first_eval_once"), _n(f, "t1_loss_last_eval_once")) == pytest.approx((20.0, 10.0))
    assert (_n(f, "t1_loss_first_pinned"), _n(f, "t1_loss_last_pinned")) == pytest.approx((40.0, 20.0))
    assert _v(findings.findings(_table(pinned_probe=1e-7)), "t1_pinned") == "not exact"
    assert _v(findings.findings(_table(aux_whole_change=1e-6)), "t3_aux_untouched") == "not exact"
    assert _v(findings.findings(_table(aux_whole=0.2)), "t3_aux_untouched") == "exact, checked =="  # an identity only
    assert _n(findings.findings(_table(shuffled_lint=1.0)), "t4_shuffled_clean") is False
    assert _n(findings.findings(_table(sorted_train=(0.9, 0.92, 0.3))), "t4_monotone") is False
    assert _n(findings.findings(_table(sorted_train=(0.9, 0.905, 0.3))), "t4_monotone") is False  # no allowance
    assert _n(findings.findings(_table(sorted_train_seed2=(0.5, 0.6, 0.3))), "t4_monotone") is False  # one seed rises
    f = findings.findings(_table(after=0.9))  # 0.05 lower after the pass in every seed: a direction, not equivalence
    assert _v(f, "t4_after") == "lower after the pass"
    assert _v(findings.findings(_table(lint_b16=1.0)), "t5_lint_matches") == "not exact"
    # batch 4 loses 0.005 in every seed: within the 0.02 tolerance, so the safe batch moves down to 4
    assert _n(findings.findings(_table(b4_train=(0.945, 0.945, 0.945))), "t5_safe_batch") == 4.0
    # batch 4 loses 0.015 +- 0.01 over 3 seeds: the one-sided test at 0.05/13 does not reject, safe only from 16
    assert _n(findings.findings(_table(b4_train=(0.925, 0.935, 0.945))), "t5_safe_batch") == 16.0
    f = findings.findings(_table(sorted_eval=(0.2, 0.96, 0.25)))  # one seed's sorted model does well: not decided
    assert _v(f, "t6_meter_gap") == "not decided"
    f = findings.findings(_table(fixed_peak=0.0005))  # the fix's best rate at the grid's lower end
    assert _n(f, "t3_lr_fixed") == 0.0005 and _n(f, "t3_lr_interior") is False
    f = findings.findings(_table(tuned_fixed=(0.6, 0.62, 0.64)))  # the fix as good as the whole model, every seed
    assert _c(f, "t3_tuned_whole_vs_fix")["estimate"] == pytest.approx(0.0)
    assert _v(f, "t3_tuned_whole_vs_fix") == "not decided"
    f = findings.findings(_table(tuned_fixed=(0.5, 0.52, 0.54)))  # 0.1 lower in every seed: shown
    assert _v(f, "t3_tuned_whole_vs_fix") == "whole model higher"
    assert _v(findings.findings(_table(eval_dropout_off=0.0)), "t3_eval_dropout_off") == "not exact"
    # a mean change inside +-0.02 whose interval is not: not decided, not equivalent
    f = findings.findings(_table(after_seeds=(0.01, -0.015, 0.012)))
    assert abs(_c(f, "t4_after")["estimate"]) < 0.02 and _v(f, "t4_after") == "not decided"
    assert _n(findings.findings(_table(half_lint=(1.0, 0.0, 1.0))), "t4_flagged_every_seed") is False
    # trap 1 at tuned rates: one seed's drifting head below the pinned one -> not decided; grid end flagged
    f = findings.findings(_table(drift_test=(0.7, 0.5, 0.74)))
    assert _v(f, "t1_tuned_price") == "not decided" and _n(f, "t1_tuned_price_b_neg_seeds") == 1
    assert _n(findings.findings(_table(drift_peak=0.05)), "t1_tuned_lr_interior") is False
    # trap 5's training arm: no loss at 4 -> safe from 4, nothing below min_batch shown
    f = findings.findings(_table(bt_b4=(0.95, 0.95, 0.95), bt_b16=(0.95, 0.95, 0.95)))
    assert _n(f, "t5t_safe_batch") == 4.0 and _n(f, "t5t_costs_n") == 0
    f = findings.findings(_table(bt_b16=(0.94, 0.92, 0.95)))  # batch 16 loses up to 0.03: safe only from 32
    assert _n(f, "t5t_safe_batch") == 32.0
    f = findings.findings(_table(sorted_eval=(0.25, 0.26, 0.255), sorted_meter=0.255))  # meter within +-0.05
    assert _v(f, "t6_meter_gap") == "equivalent within ±0.05"


def test_findings_reject_a_table_without_a_case():
    df = _table()
    with pytest.raises(KeyError, match="pinned"):
        findings.findings(df[df["case"] != "pinned"])
    with pytest.raises(KeyError, match="whole_eval_tuned"):
        findings.findings(df[df["trap"] != "whole_eval_tuned"])
    with pytest.raises(KeyError, match="train_call_tuned"):
        findings.findings(df[df["trap"] != "train_call_tuned"])
    with pytest.raises(KeyError, match="batch_training"):
        findings.findings(df[df["trap"] != "batch_training"])


def test_single_layer_facts():
    s = run.single_layer_cases(0)
    assert s["t5_error"].startswith("ValueError: Expected more than 1 value per channel")
    assert "norm" in s["t5_lint1"] and s["t5_loader"] == "[last_batch_single] loader"
    assert s["t5_bn2d_mean"] < 1e-5 and s["t5_dev2"] < 1e-3
    assert s["t4_sorted_rm"] > s["t4_data_mean"] + 1 and abs(s["t4_shuffled_rm"] - s["t4_data_mean"]) < 1
    table = run.single_layer_table(0)
    assert list(table.columns) == ["seed", *s] and run.single_layer_from_table(table) == s
    with pytest.raises(ValueError, match="needs single_layer_table's one row, got 2 rows"):
        run.single_layer_from_table(pd.concat([table, table]))


# --- a tiny real run: each trap shows, and each fix holds exactly ------------------------------------------------

TINY = dict(seeds=[0, 1], stage1_steps=30, n_eval=64, steps=6, epoch_steps=3, batch_size=8, teacher_batches=2,
            sorted_fractions=(0.0, 1.0), batch_sizes=(1, 2, 16), t3_lrs=(0.01, 0.05), t3_steps=6, t1_lrs=(0.01, 0.05),
            t5_train_batch_sizes=(2, 16), t5_train_steps=4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = run.make_config("quick", **TINY)
    ex = Execution(cache_dir=str(tmp_path_factory.mktemp("cache")), n_jobs=1, progress=False)
    return cfg, ex, run.run(cfg, ex)


def _q(df, trap, case, quantity):
    vals = df[(df["trap"] == trap) & (df["case"] == case)][quantity]
    assert len(vals) == len(TINY["seeds"])
    return vals


def test_tiny_run_is_tidy_and_each_trap_shows_and_each_fix_holds_exactly(tiny):
    cfg, ex, t = tiny
    rates = run.chosen_rates(t)
    assert len(t) == len(cfg.run_configs()) + len(cfg.dropout_configs(rates["backbone_only"], rates["std"]))
    assert not t.duplicated(["seed", "trap", "case"]).any()
    dm = t[t["trap"] == "dropout_mechanism"]  # trap 3's dropout mechanism: every run scored with dropout off
    assert set(dm["kind"]) == {"raw", "std"} and (dm["eval_dropout_off"] == 1).all()
    assert set(dm.loc[dm["kind"] == "std", "p_drop"]) == {0.0, 0.1, 0.3, 0.5}
    assert "train_mode" not in set(t["case"]) and not any("train_mode" in c for c in t.columns)
    assert set(t.loc[t["trap"] == "no_grad", "module_mode"]) == {"train", "eval"}
    assert (_q(t, "train_call", "eval_once", "num_batches_tracked_change") == TINY["steps"]).all()
    assert (_q(t, "train_call", "eval_once", "max_buffer_change") > 0).all()
    assert (_q(t, "train_call", "eval_once", "max_param_change") == 0).all()
    assert (_q(t, "train_call", "eval_once", "frozen_bn_lint") == 1).all()
    for q in ("max_buffer_change", "num_batches_tracked_change", "max_probe_change", "n_lint_warnings"):
        assert (_q(t, "train_call", "pinned", q) == 0).all(), q
    assert (_q(t, "no_grad", "teacher_train", "num_batches_tracked_change") == TINY["teacher_batches"]).all()
    assert (_q(t, "no_grad", "teacher_train", "no_grad_lint") == 1).all()
    assert (_q(t, "no_grad", "teacher_train", "max_logit_change_by_mates") > 0).all()
    for q in ("max_logit_change_by_mates", "max_buffer_change", "max_probe_change"):
        assert (_q(t, "no_grad", "teacher_eval", q) == 0).all(), q
    for q, v in (("aux_max_param_change", 0), ("aux_loss_fraction", 0), ("dropout_train_fraction", 0),
                 ("forward_mode_lint", 1), ("dropout_lint", 1)):
        assert (_q(t, "whole_eval", "whole_model", q) == v).all(), q
    assert (_q(t, "whole_eval", "backbone_only", "aux_max_param_change") > 0).all()
    assert (_q(t, "whole_eval", "backbone_only", "aux_loss_fraction") == 1).all()
    assert (_q(t, "whole_eval", "backbone_only_dropout_off", "dropout_train_fraction") == 0).all()
    assert (_q(t, "whole_eval", "backbone_only_dropout_off", "aux_loss_fraction") == 1).all()
    # dropout is the only difference for the main head: off, the fix trains it exactly as the whole-eval run
    assert (_q(t, "whole_eval", "backbone_only_dropout_off", "task_b_main").values
            == _q(t, "whole_eval", "whole_model", "task_b_main").values).all()
    for case in ("shuffled", "class_sorted"):
        assert _q(t, "sorted_training", case, "heldout_eval_accuracy").between(0, 1).all()
    # trap 3's sweep: every (setup, rate) once per seed, at the sweep's budget, dropout off when scored
    tuned = t[t["trap"] == "whole_eval_tuned"]
    assert len(tuned) == 2 * 2 * len(TINY["seeds"]) and set(tuned["steps"]) == {6}
    assert set(tuned["setup"]) == set(run.TUNED_SETUPS) and (tuned["eval_dropout_off"] == 1).all()
    assert tuned[["val_main", "task_b_main", "task_b_main_half"]].stack().between(0, 1).all()
    drift = t[t["trap"] == "train_call_tuned"]
    assert len(drift) == 2 * len(TINY["seeds"]) and set(drift["setup"]) == {run.DRIFT_SETUP}
    for b in (2, 16):  # trap 5's training arm: both modes, accuracies are fractions
        for mode in run.BATCH_TRAINING_MODES:
            assert _q(t, "batch_training", f"{mode}_b{b}", "heldout_reestimated_accuracy").between(0, 1).all()
    assert (_q(t, "train_call", "eval_once", "max_abs_log_var_ratio") > 0).all()
    assert (_q(t, "train_call", "pinned", "max_mean_shift_sd") == 0).all()
    assert (_q(t, "tiny_batch", "batch_2", "min_values_per_channel") == 2 * 8 * 8).all()  # m x H x W, last block
    assert (_q(t, "sorted_batches", "fraction_1", "sorted_lint") == 1).all()
    assert (_q(t, "sorted_batches", "fraction_0", "sorted_lint") == 0).all()
    for b, flagged in ((1, 1), (2, 1), (16, 0)):
        assert (_q(t, "tiny_batch", f"batch_{b}", "small_batch_lint") == flagged).all()
    # accuracies are exact fractions of the evaluated samples
    n = TINY["n_eval"]
    assert ((_q(t, "train_call", "pinned", "task_a_after") * n).round(9) % 1 == 0).all()
    # the cache: a second run computes nothing and returns the same table
    again = run.run(cfg, ex)
    pd.testing.assert_frame_equal(t, again)
    f = findings.findings(t)
    assert _v(f, "t1_pinned") == "exact, checked ==" and _v(f, "t2_eval") == "exact, checked =="


def test_thread_check_reruns_the_cited_runs_at_the_other_thread_count(tiny):
    cfg, ex, t = tiny
    tc = run.thread_check(cfg, t, ex)
    assert set(tc["threads"]) == {1, 2} and set(tc["seed"]) == set(cfg.seeds[:cfg.thread_seeds])
    assert set(tc["quantity"]) == set(run.THREAD_QUANTITIES) and len(tc) == 2 * len(run.THREAD_QUANTITIES) * cfg.thread_seeds
    main = tc[tc["threads"] == 1].set_index("quantity")["accuracy"]
    assert main["t1_pinned"] == _q(t, "train_call", "pinned", "task_b").iloc[0]  # the main rows, unchanged
    f = findings.thread_findings(tc)
    assert number(f, "n_runs") == len(run.THREAD_QUANTITIES) * cfg.thread_seeds and 0 <= number(f, "max_diff") <= 1
    assert {k for k in f["key"] if k.startswith("paired_largest_")} == {f"paired_largest_{k}" for k in
                                                                      findings.THREAD_PAIRS}


def test_first_seed_audit_recomputes_the_cached_row(tiny):
    cfg, ex, t = tiny
    a, lints = run.first_seed_audit(cfg, "train_call", "eval_once", ex)
    assert any(x.code == "frozen_bn_in_train_mode" for x in lints)
    cached = t[(t["seed"] == 0) & (t["trap"] == "train_call") & (t["case"] == "eval_once")].iloc[0]
    assert float(a.outputs()["max_abs_change"].max()) == cached["max_probe_change"]
    with pytest.raises(ValueError, match="no case 'nope'"):
        run.first_seed_audit(cfg, "train_call", "nope", ex)


def test_chapter2_figures_draw_the_tie_margin_and_keep_the_inset_clear():
    import matplotlib
    matplotlib.use("Agg")
    df = _table()
    t6 = df[df["trap"] == "sorted_training"]
    fig = figures.sorted_training_figure(t6, 0.1, findings.TOL_TIE)
    px = fig.axes[1]
    assert px.get_legend() is not None and "0.05" in px.get_legend().get_texts()[0].get_text()
    assert len(px.get_yticks()) == 0  # row labels sit inside the panel
    t4 = df[df["trap"] == "sorted_batches"]
    fig = figures.sorted_batches_figure(t4, 0.1, findings.TOL_AFTER)
    ins = fig.axes[1].child_axes[0]
    assert "\u00b1" in ins.get_title() and ins.get_xlim() == fig.axes[1].get_xlim()


# --- trap 3's dropout mechanism and the thread check (referee ch2c N4, N5) ------------------------------------------

_HOLDS = dict(whole_at_fix=(0.8, 0.82, 0.84), tuned_fixed=(0.4, 0.45, 0.5),  # raw drop at 0.3: 0.40, 0.37, 0.34
              dm_raw={0.1: (0.75, 0.771, 0.792), 0.5: (0.2, 0.22, 0.24)},  # raw drop at 0.1: 0.05, 0.049, 0.048
              dm_std={0.0: (0.8, 0.8, 0.8), 0.1: (0.79, 0.79, 0.79), 0.3: (0.77, 0.771, 0.772),
                      0.5: (0.75, 0.75, 0.75)})


def test_dropout_mechanism_findings_on_a_table_where_the_hypothesis_holds():
    f = findings.findings(_table(**_HOLDS))
    assert (_n(f, "t3d_lr_raw"), _n(f, "t3d_lr_std"), _n(f, "t3d_std_n_lrs"), _n(f, "t3d_std_lr_interior")) == \
        (0.001, 0.05, 3, True)
    assert findings.page_words(*f)["t3d_ps"] == "0.1, 0.3, 0.5" and \
        (_n(f, "t3d_p_low"), _n(f, "t3d_p_high"), _n(f, "t3d_p_page")) == (0.1, 0.5, 0.3)
    assert _n(f, "t3d_acc_raw_off") == pytest.approx(0.82) and _n(f, "t3d_acc_std_p30") == pytest.approx(0.771)
    # dropout's effect, fix at p - fix with dropout off: negative, a cost
    assert _n(f, "t3d_effect_raw_p30").mean == pytest.approx(-0.37) and _n(f, "t3d_effect_raw_p10").mean == \
        pytest.approx(-0.049)
    assert _n(f, "t3d_effect_raw_p50").mean == pytest.approx(-0.6) and _n(f, "t3d_effect_std_p30").mean == \
        pytest.approx(-0.029)
    c = _c(f, "t3d_growth_raw")  # effect at 0.5 - effect at 0.1: -0.551, the cost grows with the rate
    assert c["estimate"] == pytest.approx(-0.551) and c["high"] < 0 and c["verdict"] == "cost grows with the rate"
    c = _c(f, "t3d_std_vs_raw")  # standardized effect - raw effect at 0.3: +0.341
    assert c["estimate"] == pytest.approx(0.341) and c["verdict"] == "standardized costs less"
    assert _n(f, "t3d_std_vs_raw_at_p30").mean == pytest.approx(0.341)
    assert _n(f, "t3d_hypothesis") is True and findings.page_words(*f)["t3d_hypothesis_words"].startswith(
        "The data are consistent with it")
    # the effect as a share of each kind's no-dropout accuracy, per seed (raw: -0.37 / 0.82 on average)
    assert _n(f, "t3d_rel_effect_raw").mean == pytest.approx(-0.452, abs=1e-3) and \
        _n(f, "t3d_rel_effect_std").mean > -0.04
    assert _n(f, "t3d_rel_std_vs_raw").low > 0
    t = figures.dropout_mechanism_table(f[1])
    assert list(t.index) == [0.1, 0.3, 0.5] and t.loc[0.3, "raw features"].startswith("-0.370 [")
    assert t.loc[0.3, "standardized minus raw"].startswith("+0.341 [")


def test_dropout_mechanism_says_which_part_of_the_hypothesis_fails():
    # the raw cost does not grow: p = 0.5 as good as p = 0.1 in one seed, worse in another
    f = findings.findings(_table(**{**_HOLDS, "dm_raw": {0.1: (0.75, 0.77, 0.79), 0.5: (0.76, 0.5, 0.8)}}))
    assert _v(f, "t3d_growth_raw") == "not decided" and _n(f, "t3d_hypothesis") is False
    words = findings.page_words(*f)["t3d_hypothesis_words"]
    assert "do not show that the dropout cost grows with the dropout rate" in words and "standardizing" not in words
    # standardizing does not shrink the cost: the standardized effect as large as the raw one
    f = findings.findings(_table(**{**_HOLDS, "dm_std": {0.0: (0.8, 0.8, 0.8), 0.1: (0.7, 0.7, 0.7),
                                                   0.3: (0.4, 0.43, 0.46), 0.5: (0.3, 0.3, 0.3)}}))
    assert _c(f, "t3d_std_vs_raw")["estimate"] == pytest.approx(0.0, abs=1e-9)
    assert _v(f, "t3d_std_vs_raw") == "not decided" and _n(f, "t3d_hypothesis") is False
    assert "that standardizing the features shrinks" in findings.page_words(*f)["t3d_hypothesis_words"]
    # the standardized fix's best rate at an end of its grid is flagged
    assert _n(findings.findings(_table(**_HOLDS, std_peak=0.2)), "t3d_std_lr_interior") is False
    # the hypothesis' words follow the two verdicts alone (the notes' flips: test_each_note_flips_with_its_rule)
    C, N = findings.findings(_table(**_HOLDS))
    assert _hypothesis(C, N, "cost grows with the rate", "standardized costs less").startswith("The data are")
    words = _hypothesis(C, N, "cost shrinks with the rate", "standardized costs less")
    assert words.startswith("It is not shown as stated") and "grows with the dropout rate" in words


def _with_verdicts(C, **verdicts):
    """The claims table ``C`` with the verdicts of the keys given replaced."""
    C = C.copy()
    for key, verdict in verdicts.items():
        C.loc[C["key"] == key, "verdict"] = verdict
    return C


def _hypothesis(C, N, growth, std_vs_raw):
    """Trap 3's hypothesis note with the verdicts of its two claims set to ``growth`` and ``std_vs_raw``."""
    from bnstudy.study.words import notes
    return notes(findings.NOTES, _with_verdicts(C, t3d_growth_raw=growth, t3d_std_vs_raw=std_vs_raw),
                 N)["t3d_hypothesis_words"]


def test_each_note_flips_with_its_rule():
    """Every rule-triggered note (findings.NOTES): exactly one holds per key, and turning its rule round says the
    other sentence."""
    from bnstudy.study.words import notes
    C, N = findings.findings(_table(**_HOLDS))
    said = lambda c=C, n=N: notes(findings.NOTES, c, n)  # noqa: E731
    base = said()
    assert set(base) == {"lead", "t3d_hypothesis_words", "t5t_safe_text", "t6_seed", "t5_safe_text", "t4_summary",
                         "t5_safe_count_text", "t1_loss_note", "t3_summary", "t3_fix_reading"} == \
        {note.key for note in findings.NOTES}
    # the plain lead (the answer's first sentence, the front page's line): by whether BN ran in train mode in trap 1
    assert base["lead"].startswith("**Calling eval() on the backbone once does not keep it there.**")
    assert said(n=with_numbers(N, {"t1_bn_train": 0.0}))["lead"].startswith(
        "**Here eval() on the backbone survived the training loop.**")
    # trap 3's hypothesis: one sentence per pair of verdicts
    grows, less, nd = "cost grows with the rate", "standardized costs less", "not decided"
    texts = {(g, s_): _hypothesis(C, N, g, s_) for g in (grows, nd) for s_ in (less, nd)}
    assert texts[(grows, less)] == base["t3d_hypothesis_words"] and base["t3d_hypothesis_words"].startswith(
        "The data are consistent with it") and len(set(texts.values())) == 4
    assert "grows with the dropout rate" in texts[(nd, less)] and "standardizing" not in texts[(nd, less)]
    assert "standardizing the features shrinks" in texts[(grows, nd)] and "grows with" not in texts[(grows, nd)]
    assert texts[(nd, nd)] == ("It is not shown as stated: these data do not show that the dropout cost grows with "
                               "the dropout rate on raw features; these data do not show that standardizing the "
                               "features shrinks the dropout cost.")
    # trap 5's training arm: its safe batch against the small_batch lint's threshold (16)
    p_t5t = f"(intersection-union p {number(N, 't5t_safe_p'):.1e})"
    assert base["t5t_safe_text"] == f"loses less than 0.02 from batch 16 on {p_t5t}, at the `small_batch` lint's " \
                                    f"threshold of 16"
    for batch, word in ((4.0, "below"), (16.0, "at"), (32.0, "above")):
        assert said(n=with_numbers(N, {"t5t_safe_batch": batch}))["t5t_safe_text"] == \
            f"loses less than 0.02 from batch {batch:.0f} on {p_t5t}, {word} the `small_batch` lint's threshold of 16"
    assert said(n=with_numbers(N, {"t5t_safe_batch": float("nan")}))["t5t_safe_text"] == \
        "loses less than 0.02 at no batch size tried (no batch from which every larger one does)"
    # trap 6 against seed article 002: the meter overstates, then understates
    assert base["t6_seed"] == ("That is seed article 002's warning: under class-sorted batches the training meter "
                               "looked better than held-out accuracy.")
    lower = C.copy()
    lower.loc[lower["key"] == "t6_meter_gap", "kind"] = "lower"
    assert said(c=lower)["t6_seed"] == (f"Seed article 002 warns that the meter \"can look healthy\" under "
                                        f"class-sorted batches; here the meter was not shown to look better than "
                                        f"held-out accuracy, and both stood against the "
                                        f"{number(N, 't6_meter_shuffled'):.3f} the meter read on shuffled batches.")
    # trap 5's safe batch: its p and sample count, n/a without one
    assert (base["t5_safe_text"], base["t5_safe_count_text"]) == \
        ("loses less than 0.02 from batch 16 on (intersection-union p 0.0e+00)", "1024 at the safe batch (16)")
    none = said(n=with_numbers(N, {"t5_safe_batch": float("nan"), "t5_safe_p": float("nan"),
                                   "t5_safe_count": float("nan")}))
    assert (none["t5_safe_text"], none["t5_safe_count_text"]) == \
        ("loses less than 0.02 at no batch size tried (no batch from which every larger one does)",
         "n/a (no safe batch)")
    # trap 4 at the first flagged share: a cost only where the claim shows one; none flagged
    assert base["t4_summary"].startswith("Batches that follow the label cost train-mode accuracy: where `lint_loader` "
                                         "first flags the loader (a one-class share of 0.50)")
    higher = _with_verdicts(C, t4_first_flagged="train mode higher")
    higher.loc[higher["key"] == "t4_first_flagged", "kind"] = "higher"
    assert said(c=higher)["t4_summary"].startswith("Where `lint_loader` first flags the loader (a one-class share of "
                                                   "0.50), train mode minus eval mode on the same batches is ") and \
        "**train mode higher**" in said(c=higher)["t4_summary"] and "cost" not in said(c=higher)["t4_summary"]
    assert said(n=with_numbers(N, {"t4_first_flagged": float("nan")}))["t4_summary"] == \
        "`lint_loader` flagged none of the label-sorted loaders tried."
    # trap 1's head losses: not recorded in this table; recorded in another
    assert base["t1_loss_note"] == "not recorded in the run behind this page (its table predates the column)"
    assert notes(findings.NOTES, *findings.findings(_table(head_loss=(20.0, 10.0))))["t1_loss_note"] == \
        "pinned 40.00 and 20.00 nats; drifting 20.00 and 10.00"


def test_findings_need_the_dropout_mechanism_rows():
    df = _table()
    with pytest.raises(KeyError, match="dropout_mechanism"):
        findings.findings(df[df["trap"] != "dropout_mechanism"])
    with pytest.raises(KeyError, match="kind='raw', p=0.5"):
        findings.findings(df[df["case"] != run.dropout_case("raw", 0.5, 0.001)])


def test_dropout_and_thread_configs_and_their_checks():
    cfg = run.make_config("quick", seeds=[0, 5, 7], thread_seeds=2, t3_std_lrs=(0.01, 0.1))
    assert [r.case for r in cfg.run_configs() if r.trap == "dropout_mechanism" and r.seed == 0] == \
        ["std_p0.3_lr0.01", "std_p0.3_lr0.1"]
    dc = cfg.dropout_configs(0.001, 0.1)
    assert [r.case for r in dc if r.seed == 5] == ["raw_p0.1_lr0.001", "raw_p0.5_lr0.001", "std_p0.1_lr0.1",
                                                  "std_p0.5_lr0.1", "std_p0_lr0.1"]
    assert all(r.steps == cfg.t3_steps for r in dc) and run.parse_dropout_case("std_p0_lr0.1") == ("std", 0.0, 0.1)
    rates = run.chosen_rates(_table(**_HOLDS))
    assert rates == {"whole_model": 0.01, "backbone_only": 0.001, "drifting": 0.02, "std": 0.05}
    tc = cfg.thread_configs({"drifting": 0.02, "whole_model": 0.01, "backbone_only": 0.001})
    assert {r.seed for r in tc} == {0, 5} and len(tc) == 2 * 7
    assert {r.case for r in tc if r.trap == "whole_eval_tuned"} == {"whole_model_lr0.01", "backbone_only_lr0.001"}
    assert run.make_config("quick").thread_seeds == 1 and run.make_config("full").thread_seeds == 2
    assert "thread_seeds=2" in cfg.describe() and "t3_dropout_ps=[0.1, 0.3, 0.5]" in cfg.describe()
    with pytest.raises(ValueError, match="thread_seeds must be an integer from 0 to the number of seeds, got 4"):
        run.make_config("quick", thread_seeds=4)
    with pytest.raises(ValueError, match="thread_seeds must be an integer from 0 to the number of seeds, got -1"):
        run.make_config("quick", thread_seeds=-1)
    rule = r"t3_dropout_ps must be two or more rates in \(0, 0.9\], the model's own 0.3 among them"
    for ps in ((0.1, 0.5), (0.3, 1.0), (0.3,), (0.0, 0.3)):
        with pytest.raises(ValueError, match=rule):
            run.make_config("quick", t3_dropout_ps=ps)
    with pytest.raises(ValueError, match="t3_dropout_ps must not repeat"):
        run.make_config("quick", t3_dropout_ps=(0.3, 0.3))
    with pytest.raises(ValueError, match=r"t3_std_lrs must be one or more rates > 0, got \[0.0\]"):
        run.make_config("quick", t3_std_lrs=(0.0,))
    with pytest.raises(ValueError, match="case must look like"):
        run.parse_dropout_case("big_p0.1_lr0.1")


def _threads(main=(0.5, 0.6), other=(0.52, 0.57), quantities=("t1_eval_once", "t1_pinned")):
    rows = []
    for th, vals in ((1, main), (2, other)):
        for s, v in enumerate(vals):
            for k, q in enumerate(quantities):
                rows.append(dict(seed=s, quantity=q, threads=th, accuracy=v - 0.1 * k))
    return pd.DataFrame(rows)


def test_thread_findings_on_a_hand_made_table():
    f = findings.thread_findings(_threads())
    n = lambda key: number(f, key)  # noqa: E731
    assert (n("n_seeds"), n("threads_other"), n("n_runs"), n("n_differ")) == (2, 2, 4, 4)
    assert n("largest_t1_eval_once") == pytest.approx(0.03)
    assert (n("max_diff"), n("mean_diff")) == pytest.approx((0.03, 0.025))
    assert findings.thread_words(f) == {"max_quantity": findings.THREAD_WORDS["t1_eval_once"]}
    assert [k for k in f["key"] if k.startswith("paired_largest_")] == ["paired_largest_t1_price"]
    assert n("paired_largest_t1_price") == pytest.approx(0.0)  # both runs moved alike: the difference kept
    f = findings.thread_findings(_threads(other=(0.5, 0.6)))  # nothing moved
    assert n("n_differ") == 0 and n("max_diff") == 0.0
    with pytest.raises(ValueError, match="exactly two thread counts including main_threads=1"):
        findings.thread_findings(_threads().assign(threads=2))
    with pytest.raises(ValueError, match="every \\(seed, quantity\\) at both"):
        findings.thread_findings(_threads().iloc[:-1])


# --- rows: the page analyses an earlier run's saved tables again ----------------------------------------------------

def test_run_tables_returns_the_sibling_tables_the_page_saves(tiny, tmp_path):
    """run_tables gives exactly SIBLING_TABLES: the thread check and the printed audits, so a page rebuilt from the
    saved tables trains nothing; the printouts come back from their CSV character for character."""
    from bnstudy.study import report
    cfg, ex, t = tiny
    df, tables = run.run_tables(cfg, ex)
    assert set(tables) == set(run.SIBLING_TABLES) and run.ANALYSIS_PARAMETERS == ()
    pd.testing.assert_frame_equal(df, t)
    pd.testing.assert_frame_equal(tables["threads"], run.thread_check(cfg, t, ex))
    report.save_table(df, tmp_path / "02_eval_traps.csv")  # the rows a page given rows reads: the same trap tables
    back = run.rows_table(report.load_rows(tmp_path / "02_eval_traps.csv", {})[0])
    for trap in run.TRAPS:
        assert run.trap_table(back, trap).to_csv(index=False) == run.trap_table(df, trap).to_csv(index=False), trap
    pd.testing.assert_frame_equal(run.rows_table(df), df)
    audits = tables["audits"]
    assert list(zip(audits["trap"], audits["case"])) == [(trap, case) for trap, case, _ in run.PRINTED_AUDITS]
    assert set(audits["seed"]) == {cfg.seeds[0]}
    for trap, case, codes in run.PRINTED_AUDITS:  # the printed lints above the audit's own printout
        a, lints = run.first_seed_audit(cfg, trap, case, ex)
        shown = [str(x) for x in lints if x.code in codes]
        assert run.printout(audits, trap, case) == "\n".join(shown + ([""] if shown else []) + [str(a)])
        assert bool(shown) == bool(codes) and run.printout(audits, trap, case).endswith(str(a))
    report.save_table(audits, tmp_path / "02_eval_traps_audits.csv")
    back, _ = report.load_rows(tmp_path / "02_eval_traps_audits.csv", {})
    for trap, case, _ in run.PRINTED_AUDITS:  # multi-line text with quotes and commas survives the CSV
        text = run.printout(back, trap, case)
        assert text == run.printout(audits, trap, case) and "\n" in text
    single = tables["single_layer"]
    assert list(single["seed"]) == [cfg.seeds[0]]
    report.save_table(single, tmp_path / "02_eval_traps_single_layer.csv")
    back, _ = report.load_rows(tmp_path / "02_eval_traps_single_layer.csv", {})
    assert run.single_layer_from_table(back) == run.single_layer_from_table(single)  # floats and texts exactly
    assert run.single_layer_from_table(single)["t5_error"].startswith("ValueError")
    empty = single.assign(t5_lint1="")
    report.save_table(empty, tmp_path / "empty.csv")
    assert run.single_layer_from_table(report.load_rows(tmp_path / "empty.csv", {})[0])["t5_lint1"] == ""
    with pytest.raises(KeyError, match="no single printout of trap='train_call', case='pinned'"):
        run.printout(audits, "train_call", "pinned")
    with pytest.raises(TypeError, match="run_tables needs an eval_traps.Config"):
        run.run_tables(object(), ex)


def _printed(path) -> list[str]:
    """The printed output (stdout; a sweep's progress bars go to stderr) of each code cell of an executed notebook."""
    import nbformat
    return ["".join(o.get("text", "") for o in c.get("outputs", []) if o.get("name") == "stdout")
            for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


@pytest.mark.slow
def test_notebook_with_rows_gives_the_page_its_own_run_gave(glued_payloads, quick_rebuild):
    """The session's quick page, then the page again from its saved tables (``rows``) with an empty cache: every glued
    value and table, every saved table and the printed audits are the same, only the timing sentence and the run line
    say the rows were analysed again, and nothing ran (the empty cache stays empty: no source, run, thread check or
    audit was computed). A notebook that ignored ``rows`` would fill the empty cache."""
    from papermill.exceptions import PapermillExecutionError

    from bnstudy.study import book
    r = quick_rebuild("02_eval_traps")
    a, b = glued_payloads(r.first), glued_payloads(r.again)
    assert set(a) == set(b)
    assert {k for k in a if a[k] != b[k]} == {"ch02_timing"}
    assert "did not run the experiment" in b["ch02_timing"] and "did not run" not in a["ch02_timing"]
    assert not r.cache2.exists() or not any(p.is_file() for p in r.cache2.rglob("*"))
    saved = sorted(p.name for p in r.results.glob("02_eval_traps*.csv"))
    assert saved == sorted(p.name for p in r.results2.glob("02_eval_traps*.csv"))
    assert {f"02_eval_traps_{s}.csv" for s in run.SIBLING_TABLES} <= set(saved)
    for name in saved:
        assert (r.results / name).read_bytes() == (r.results2 / name).read_bytes(), name
    pa, pb = _printed(r.first), _printed(r.again)
    differ = [i for i, (x, y) in enumerate(zip(pa, pb)) if x != y]
    assert len(pa) == len(pb) and len(differ) == 1 and pa[differ[0]].startswith("Ran with")  # only the run line
    assert "analysing the rows computed by the run at git commit" in " ".join(pb[differ[0]].split())
    assert sum("FreezeAudit" in x or "buffer" in x for x in pb) >= 3  # the three audits are printed from the table
    steps = run.make_config("quick").steps  # the profile the session's page ran
    with pytest.raises(PapermillExecutionError, match=f"parameter 'steps' is {steps + 1} here but was {r.recorded('steps')}"):
        book.execute_chapter(r.nb_path, r.folder / "bad", "quick", parameters=dict(
            steps=steps + 1, rows=str(r.rows), results_dir=str(r.folder / "results3"),
            figures_dir=str(r.folder / "figures3"), cache_dir=str(r.folder / "cache3")))


def test_single_layer_facts_are_the_same_in_every_process():
    """The release's verification (issue 23) found t5_bn2d_mean differing between executions: its layers were
    initialized from torch's global generator. Seeded now, a fresh process gives the same facts."""
    import subprocess
    import sys
    code = ("from bnstudy.study.experiments.eval_traps.run import single_layer_table as t; import torch; "
            "torch.manual_seed({}); print(t(0).to_json())")
    # the two processes run side by side (each mostly imports torch): the same check in half the wall time
    procs = [subprocess.Popen([sys.executable, "-c", code.format(s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for s in (1, 2)]
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    a, b = (out for out, _ in outs)
    assert a == b


def test_the_printed_audits_train_at_the_executions_thread_count_whatever_the_process_uses(tmp_path):
    """The release's verification (CI, issue 23) found chapter 2's printed audit differing between a plain process and
    pytest's (head.1.weight max |change| 2.577 against 2.548): its heads trained at the process's thread count. They
    train at the execution's now, so the process's own count does not matter."""
    import torch
    cfg = run.make_config("full")  # the release's settings: at quick's tiny sizes the thread count changes nothing
    from bnstudy.study.config import Execution
    before = torch.get_num_threads()
    tables = []
    for n in (1, 2):
        torch.set_num_threads(n)
        tables.append(run.audit_table(cfg, Execution(progress=False, cache_dir=str(tmp_path)), cases=run.PRINTED_AUDITS))
    torch.set_num_threads(before)
    assert tables[0].equals(tables[1])


# --- the page's sentences: chosen by the findings, never typed (issue 25) -----------------------------------------

def _set(df, trap, case, **values):
    """``df`` with ``values`` written into the rows of ``(trap, case)`` (every seed)."""
    df = df.copy()
    sel = (df["trap"] == trap) & (df["case"] == case)
    for k, v in values.items():
        df.loc[sel, k] = v
    return df


def test_the_answer_box_cites_notes_and_claims_that_state_what_the_findings_say():
    """The answer box is the lead and one line per trap, citing notes, claims in words and numbers (no sentence is
    built for it); on a hand-made table they say what the findings are."""
    import nbformat
    nb = Path(__file__).resolve().parents[1] / "chapters" / "02_eval_traps.ipynb"
    box = nbformat.read(nb, as_version=4).cells[0].source.split(":::")[1]
    for key in ("lead", "t1_bn_train", "t1_task_a_after", "t1_param", "t2_nbt", "t2_task_a_after", "t3_summary",
                "t4_summary", "t5_safe_text", "t5t_safe_text", "t6_meter_gap_text"):
        assert f"`ch02_{key}" in box, key
    f = findings.findings(_table())
    assert (_n(f, "t1_task_a_before"), _n(f, "t1_task_a_after"), _n(f, "t1_param")) == pytest.approx((0.95, 0.3, 0.0))
    assert (_n(f, "t2_nbt"), _n(f, "t2_task_a_before"), _n(f, "t2_task_a_after")) == pytest.approx((3, 0.95, 0.5))
    s = findings.page_words(*f)
    # trap 3 at tuned rates: +0.17, not decided at the family's level (see test_findings_on_a_table_whose_answers_...)
    assert "these seeds do not tell the two main heads apart" in s["t3_summary"] and \
        "**not decided**" in s["t3_summary"]
    assert "cost train-mode accuracy" in s["t4_summary"] and "**train mode lower**" in s["t4_summary"] and \
        "share of 0.50" in s["t4_summary"]
    assert s["t5_safe_text"].startswith("loses less than 0.02 from batch 16 on") and \
        s["t5t_safe_text"].endswith("at the `small_batch` lint's threshold of 16")
    assert "**meter higher**" in s["t6_meter_gap_text"] and \
        s["t6_seed"].startswith("That is seed article 002's warning")
    assert s["t5_safe_count_text"] == "1024 at the safe batch (16)"
    assert not any("{glue" in v or "nan" in v.lower().replace("(", " ").split() for v in s.values())


def test_flip_each_headline_verdict_and_the_page_words_follow():
    """The flip test: hand-made tables in which each headline outcome of the page turns round; every findings-chosen
    sentence changes with it and no longer asserts the old outcome, and the glued numbers the page states traps 1
    and 2 with follow the table."""
    f0 = findings.findings(_table())
    base = findings.page_words(*f0)
    for df, key, old, new in (
            (_set(_table(), "train_call", "eval_once", task_a_after=0.99), "t1_task_a_after", 0.3, 0.99),
            (_set(_table(), "train_call", "eval_once", bn_train_fraction=0.0), "t1_bn_train", 1.0, 0.0),
            (_set(_table(), "train_call", "eval_once", max_param_change=0.5), "t1_param", 0.0, 0.5),
            (_set(_table(), "no_grad", "teacher_train", task_a_after=0.99), "t2_task_a_after", 0.5, 0.99),
            (_set(_table(), "no_grad", "teacher_train", num_batches_tracked_change=0.0), "t2_nbt", 3.0, 0.0)):
        assert _n(f0, key) == pytest.approx(old) and _n(findings.findings(df), key) == pytest.approx(new), key
    flips = {  # name: (table, sentence key, old words that must go, new words that must come)
        "BatchNorm never in train mode": (_set(_table(), "train_call", "eval_once", bn_train_fraction=0.0),
                                          "lead", "does not keep it there", "survived the training loop"),
        "the fix's main head higher": (_table(tuned_fixed=(0.7, 0.72, 0.74)), "t3_summary",
                                       "do not tell the two main heads apart",
                                       "the fix's main head scores higher than the whole-model run's"),
        "the whole model's main head higher": (_table(tuned_fixed=(0.5, 0.52, 0.54)), "t3_summary",
                                               "do not tell the two main heads apart",
                                               "the whole-model run's main head scores higher than the fix's"),
        "train mode higher on sorted batches": (_table(sorted_train=(0.9, 0.99, 0.3)), "t4_summary",
                                                "cost train-mode accuracy", "**train mode higher**"),
        "the meter lower": (_table(sorted_eval=(0.3, 0.3, 0.3), sorted_meter=0.1), "t6_meter_gap_text",
                            "**meter higher**", "**meter lower**"),
        "the meter within the margin": (_table(sorted_eval=(0.25, 0.26, 0.255), sorted_meter=0.255),
                                        "t6_meter_gap_text", "**meter higher**", "**equivalent within ±0.05**"),
        "safe from batch 4": (_table(b4_train=(0.945, 0.945, 0.945)), "t5_safe_text",
                              "loses less than 0.02 from batch 16 on", "loses less than 0.02 from batch 4 on"),
        "no batch safe": (_set(_set(_table(), "tiny_batch", "batch_16", module_train_accuracy=0.5), "tiny_batch",
                               "batch_32", module_train_accuracy=0.5), "t5_safe_text",
                          "loses less than 0.02 from batch 16 on", "loses less than 0.02 at no batch size tried"),
    }
    for name, (df, key, old, new) in flips.items():
        s = findings.page_words(*findings.findings(df))
        assert old in base[key] and old not in s[key] and new in s[key], name
        assert s[key] != base[key], name
        assert not any(" nan" in v.lower() or "nan " in v.lower() for v in s.values()), name
    # the meter against seed 002: the sentence that agrees with the seed goes when the meter stops overstating
    s = findings.page_words(*findings.findings(_table(sorted_eval=(0.3, 0.3, 0.3), sorted_meter=0.1)))
    assert base["t6_seed"].startswith("That is seed article 002's warning") and \
        "not shown to look better" in s["t6_seed"]
    assert "That is seed article 002's warning" not in s["t6_seed"]
    # no safe batch: printed as n/a, never nan
    s = findings.page_words(*findings.findings(flips["no batch safe"][0]))
    assert s["t5_safe_count_text"] == "n/a (no safe batch)"


def test_safe_batch_is_berger_intersection_union_over_the_larger_batches():
    from bnstudy.study.inference import intersection_union_p, one_sided_p
    f = findings.findings(_table(b4_train=(0.93, 0.94, 0.945)))
    diffs = {b: np.full(3, 0.0) for b in (16, 32)}
    assert _n(f, "t5_safe_batch") == 16.0
    assert _n(f, "t5_safe_p") == \
        intersection_union_p([one_sided_p(diffs[b], "greater", null=-findings.TOL_LOSS) for b in (16, 32)])


def _markdown_outside_glue(nb_path) -> str:
    """The notebook's markdown with glue roles, cross-references, inline code, math and code fences removed: what the
    page says in typed words."""
    import nbformat
    text = "\n".join(c.source for c in nbformat.read(nb_path, as_version=4).cells if c.cell_type == "markdown")
    # code fences (the audit example), never a directive's fence: what a dropdown holds is prose and is checked
    text = re.sub(r"(?m)^```(?!`|\{)[^\n]*\n.*?\n```$", " ", text, flags=re.S)
    text = re.sub(r"\{glue:[a-z]+\}`[^`]*`|\{(?:numref|ref|cite)\}`[^`]*`", " ", text)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$[^$]*\$", " ", text)
    return text


def test_the_notebook_types_no_outcome_outside_glue():
    """Issue 25: no verdict word, direction word or result digit is typed in the chapter's markdown; each comes from
    the findings through a glue role. Definitions of the vocabulary (the checks' two words) are allowed."""
    nb = Path(__file__).resolve().parents[1] / "chapters" / "02_eval_traps.ipynb"
    text = _markdown_outside_glue(nb)
    low = text.lower()
    found = [w for w in _WORDS if w.lower() in low]
    found += re.findall(r"\bequivalent\b|\bnot decided\b|\btoo few seeds\b", low)
    found += re.findall(r"(?<![\w.])\d+\.\d{3,}\b", text)  # a result printed with three decimals
    found += [m for m in re.findall(r"(?<![\w.])\d+\.\d{2}\b", text) if m not in ("0.05", "0.25", "0.75")]
    found += re.findall(r"\b(?:fell|rose|stayed at|does far better|barely fits|did show)\b", low)
    found += re.findall(r"\bnan\b", low)
    assert not found, found


def test_the_typed_outcome_check_can_fail(tmp_path):
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "Train mode minus eval mode was {glue:text}`ch02_x:.3f`: train mode lower, not decided, 0.912, task A fell.\n\n"
        ":::{admonition} Methods\n:class: dropdown methods\n\n```{glue:figure} ch02_t\n:name: t\n\nmeter higher\n```\n"
        ":::\n\n```python\nx = 0.123\n```")])
    p = tmp_path / "x.ipynb"
    nbformat.write(nb, p)
    text = _markdown_outside_glue(p).lower()
    assert "ch02_x" not in text and "train mode lower" in text and "not decided" in text and "0.912" in text
    assert "meter higher" in text and "0.123" not in text  # folded prose is checked; code is not prose


@pytest.mark.parametrize("kind, verdict, says, fix", [
    ("higher", "whole model higher", "helped the new task rather than harmed it", "the fix scores lower on task B"),
    ("lower", "whole model lower", "the whole model in eval mode costs the new task",
     "the fix scores higher on task B than the whole model in eval mode"),
    ("not decided", "not decided", "these seeds do not tell the two main heads apart", "these seeds do not tell"),
])
def test_flip_trap_3_is_framed_as_the_tuned_comparison_shows(kind, verdict, says, fix):
    """Issue 35 (point 8): trap 3 reads as a harm only where the tuned comparison shows one; where the whole model in
    eval mode scores higher, the summary and the fix say so."""
    C, N = findings.findings(_table())
    C = C.copy()
    hit = C["key"] == "t3_tuned_whole_vs_fix"
    C.loc[hit, ["kind", "verdict"]] = [kind, verdict]
    from bnstudy.study.words import notes
    said = notes(findings.NOTES, C, N)
    s, f = said["t3_summary"], said["t3_fix_reading"]
    assert says in s and fix in f and f"**{verdict}**" in s and f"**{verdict}**" in f
    assert ("harmed" in s) == (kind == "higher")
