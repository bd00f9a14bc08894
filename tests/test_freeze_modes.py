"""Chapter 1's experiment module: config checks and findings on hand-made tables with known answers."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from bnstudy.experiments import freeze_modes as ch
from bnstudy.modes import MODE_NAMES


def table(task_a_after_tm=(0.1, 0.12, 0.11), task_b=None, buffer_tm=(5.0, 6.0, 7.0), logit_sep=0.0):
    """3 seeds x 4 modes; task A starts at 0.9 and stays there except in train_mode."""
    task_b = task_b or dict(train_mode=(0.40, 0.42, 0.41), backbone_eval=(0.30, 0.31, 0.29),
                            all_eval=(0.30, 0.31, 0.29), separate_stats=(0.40, 0.42, 0.41))
    rows = []
    for s in range(3):
        for m in MODE_NAMES:
            rows.append(dict(seed=s, mode=m, n_classes=10, momentum=0.1, task_a_before=0.9,
                             task_a_after=task_a_after_tm[s] if m == "train_mode" else 0.9,
                             task_b=task_b[m][s], max_param_change=0.0,
                             max_buffer_change=buffer_tm[s] if m == "train_mode" else 0.0,
                             max_old_logit_change=(3.0 if m == "train_mode" else (logit_sep if m == "separate_stats" else 0.0))))
    return pd.DataFrame(rows)


def test_findings_on_a_table_where_every_finding_holds():
    f = ch.findings(table())
    assert (f.f1_weights_unchanged, f.f2_chance, f.f2_buffers_move, f.f3_pinned_keep_a, f.f3_pinned_lower_b,
            f.f4_separate_exact, f.f4_separate_matches_b) == ("holds",) * 7
    assert f.gap_b["backbone_eval"].mean == pytest.approx(0.11)
    assert f.diff_b_separate.mean == 0 and f.separate_equals_train_b_every_seed
    assert f.n_seeds == 3 and f.chance == 0.1 and f.steps_gone == 66


def test_findings_flip_when_the_data_say_otherwise():
    tb = dict(train_mode=(0.40, 0.30, 0.35), backbone_eval=(0.35, 0.36, 0.34), all_eval=(0.35, 0.36, 0.34),
              separate_stats=(0.50, 0.41, 0.47))
    f = ch.findings(table(task_a_after_tm=(0.5, 0.55, 0.52), task_b=tb, buffer_tm=(5.0, 0.5, 7.0), logit_sep=1e-7))
    assert f.f2_chance == "holds in part"          # far below 0.9, not near chance
    assert f.f2_buffers_move == "does not hold"    # one seed moved by less than one unit
    assert f.f3_pinned_lower_b == "does not hold"  # the paired interval includes 0
    assert f.f4_separate_exact == "does not hold"  # a logit moved by 1e-7: exact means == 0
    assert f.f4_separate_matches_b == "does not hold"  # separate beats train_mode in every seed
    assert not f.separate_equals_train_b_every_seed


def test_task_a_that_does_not_fall_is_reported_as_not_holding():
    assert ch.findings(table(task_a_after_tm=(0.9, 0.88, 0.91))).f2_chance == "does not hold"


def test_findings_need_all_four_modes():
    with pytest.raises(ValueError, match="missing \\['separate_stats'\\]"):
        ch.findings(table().query("mode != 'separate_stats'"))


@pytest.mark.parametrize("m", [0.1, 0.01, 0.5, 0.3, 1.0])
def test_steps_until_is_the_first_step_below_the_weight(m):
    t = ch.steps_until(m, 1e-3)
    assert (1 - m) ** t < 1e-3
    assert t == 1 or (1 - m) ** (t - 1) >= 1e-3


def test_steps_until_for_the_books_momentum_is_66():
    assert ch.steps_until(0.1) == 66


def test_drift_findings_on_a_hand_made_drift_table():
    m = 0.1
    steps = sorted({0, 1, 2, 3, 5, 8, 12, 17, 25, 35, 50, 66, 80, 100})
    rows = []
    for s in range(2):
        for layer, noise in (("block 1", 0.01), ("block 2", 0.02)):
            for t in steps:
                w = (1 - m) ** t + (noise if t >= 88 else 0.0) * (1 if s else -1)
                rows.append(dict(seed=s, layer=layer, step=t, weight=w))
    d = ch.drift_findings(pd.DataFrame(rows), m, 100)
    assert d.floor_first_step == 100 and d.floor_last_step == 100
    assert d.floor["block 1"] == pytest.approx(0.01, abs=1e-4) and d.floor["block 2"] == pytest.approx(0.02, abs=1e-4)
    assert d.last_step == 35  # 0.9^35 = 0.025 > 0.02 >= 0.9^50
    assert d.theory_12 == pytest.approx(0.9 ** 12) and d.weight_12["block 1"] == pytest.approx(0.9 ** 12)


@pytest.mark.parametrize("kw, match", [
    (dict(momentum=None), "momentum must be a number in \\(0, 1\\] for this chapter"),
    (dict(momentum=0), "momentum must be a finite number > 0.0"),
    (dict(steps=50), "steps must be >= 100 for this chapter's drift analysis with momentum=0.1"),
    (dict(noise=-1), "noise must be a finite number >= 0.0, got -1"),
    (dict(seeds="[0,5]"), "-y"),
    (dict(modes=("train_mode", "frozen")), "modes\\[1\\]='frozen' is not allowed"),
    (dict(colour="red"), "unknown freeze_modes parameters \\['colour'\\]"),
])
def test_every_parameter_is_checked_before_any_work(kw, match):
    with pytest.raises(ValueError, match=match):
        ch.make_config("quick", **kw)


def test_profiles_set_the_seed_count_and_describe_names_the_seeds():
    assert len(ch.make_config("full").seeds) == 10 and len(ch.make_config("quick").seeds) == 3
    assert "2 seeds (0, 5)" in ch.make_config("quick", seeds=[0, 5]).describe()
    assert ch.make_config("quick", seeds=[0, 5]).seeds == (0, 5)


def test_tidy_tables_hold_the_list_columns_one_value_per_row():
    df = table().assign(drift_steps=[[0, 1]] * 12, drift_weight_l0=[[1.0, 0.9]] * 12,
                        old_logit_change_q=[list(np.linspace(0, 1, 21))] * 12)
    d = ch.drift_table(df)
    assert len(d) == 3 * 2 and set(d.layer) == {"block 1"}
    assert len(ch.logit_quantile_table(df)) == 12 * 21
    assert "drift_steps" not in ch.results_table(df).columns


# --- issue 10: the head's optimizer swept, the reference, the thread check ----------------------------------------

def sweep_table(gap_sgd=(0.10, 0.12, 0.11), gap_adam=(0.01, -0.02, 0.0), gain=0.0):
    """A head-sweep table: 2 tuning seeds, 3 reported, 3 confirmation; checkpoints 400 and 800.

    On the tuning seeds' validation split lr 0.05 (sgd) and 0.01 (adam) win; a *test* row of the
    tuning seeds at another lr is higher still and must be ignored. ``gain``: what every reported
    head gains from step 400 to 800.
    """
    rows = []
    add = lambda **r: rows.append(r)
    for s in (100, 101):
        for path in ("batch_stats", "pinned"):
            for opt, lrs, best in (("sgd", (0.02, 0.05), 0.05), ("adam", (0.001, 0.01), 0.01)):
                for lr in lrs:
                    add(seed=s, role="tune", path=path, optimizer=opt, lr=lr, step=800, split="validation",
                        accuracy=0.6 if lr == best else 0.5)
                    add(seed=s, role="tune", path=path, optimizer=opt, lr=lr, step=800, split="test",
                        accuracy=0.9 if lr != best else 0.1)
    for role, seeds in (("report", (0, 1, 2)), ("confirm", (200, 201, 202))):
        for i, s in enumerate(seeds):
            for opt, lr, gaps in (("sgd", 0.05, gap_sgd), ("adam", 0.01, gap_adam), ("reference", 0.0, gap_sgd)):
                for step in (400, 800):
                    base = 0.5 + (gain if step == 800 else 0.0)
                    add(seed=s, role=role, path="pinned", optimizer=opt, lr=lr, step=step, split="test",
                        accuracy=base)
                    add(seed=s, role=role, path="batch_stats", optimizer=opt, lr=lr, step=step, split="test",
                        accuracy=base + gaps[i])
                    if opt != "reference":  # a worse lr's test row: never chosen
                        add(seed=s, role=role, path="pinned", optimizer=opt, lr=lr * 10, step=step, split="test",
                            accuracy=0.0)
    return pd.DataFrame(rows)


def test_lrs_are_chosen_on_the_tuning_seeds_validation_split_only():
    assert ch.choose_lrs(sweep_table(), 800) == {("adam", "batch_stats"): 0.01, ("adam", "pinned"): 0.01,
                                                ("sgd", "batch_stats"): 0.05, ("sgd", "pinned"): 0.05}
    t = ch.chosen_table(sweep_table(), ch.choose_lrs(sweep_table(), 800))
    assert set(t["role"]) == {"report", "confirm"} and (t["accuracy"] > 0).all()


def test_optimizer_findings_give_a_verdict_per_optimizer_and_for_the_reference():
    f = ch.optimizer_findings(sweep_table(), 800, reference_grads=[1e-7, 2e-6])
    assert f.gap["sgd"].mean == pytest.approx(0.11) and f.f3["sgd"] == "holds"
    assert f.gap["adam"].mean == pytest.approx(-0.01 / 3) and f.f3["adam"] == "does not hold"
    assert f.f3["reference"] == "holds" and f.f3_confirm["sgd"] == "holds" and f.f3_confirm["adam"] == "does not hold"
    assert f.lr["sgd_pinned"] == 0.05 and f.acc["sgd_pinned"] == pytest.approx(0.5)
    assert f.still_improving == {"sgd_batch_stats": "no", "sgd_pinned": "no", "adam_batch_stats": "no",
                                 "adam_pinned": "no"}
    assert f.reference_converged and (f.prev_step, f.last_step) == (400, 800)
    assert f.gap_by_step["sgd_400"].mean == pytest.approx(0.11) and f.gap_last["adam"].mean == pytest.approx(-0.01 / 3)


def test_heads_still_gaining_between_the_last_checkpoints_are_flagged():
    # every seed gains 0.03 (no spread: the interval collapses to 0.03 > 0)
    f = ch.optimizer_findings(sweep_table(gain=0.03), 800, reference_grads=[1e-3])
    assert f.still_improving["sgd_pinned"] == "yes" and f.gain_last["sgd_pinned"].mean == pytest.approx(0.03)
    assert not f.reference_converged
    with pytest.raises(ValueError, match="main_step"):
        ch.optimizer_findings(sweep_table(), 1600)


def test_engine_check_compares_the_sweep_with_the_engines_runs():
    main = table().assign(optimizer="sgd", lr=0.05)
    main.loc[main["mode"].isin(["train_mode", "separate_stats"]), "task_b"] = 0.5 + 0.11
    main.loc[main["mode"].isin(["backbone_eval", "all_eval"]), "task_b"] = 0.5
    f = ch.optimizer_findings(sweep_table(gap_sgd=(0.11, 0.11, 0.11)), 800, [0.0], main=main)
    assert f.engine_check == pytest.approx(0.0, abs=1e-12)


def test_fit_logistic_converges_and_separates_separable_classes():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(300) % 3
    x = torch.randn(300, 5, generator=g) * 0.3 + torch.nn.functional.one_hot(y, 5).float() * 4 + 100
    predict, gnorm = ch.fit_logistic(x, y, 3)
    assert gnorm < 1e-5 and (predict(x).argmax(-1) == y).all()
    with pytest.raises(ValueError, match="fit_logistic needs"):
        ch.fit_logistic(x, y[:5], 3)


def test_thread_findings_on_a_hand_made_table():
    rows = [dict(seed=s, mode=m, threads=t, task_a_after=0.9,
                 task_b=0.5 + (0.1 if m in ("train_mode", "separate_stats") else 0) + (0.04 if (t, s, m) == (2, 1, "train_mode") else 0))
            for t in (1, 2) for s in (0, 1) for m in MODE_NAMES]
    f = ch.thread_findings(pd.DataFrame(rows))
    assert (f.n_runs, f.n_differ) == (8, 1) and f.max_diff_b == pytest.approx(0.04)
    assert f.mean_diff_b == pytest.approx(0.005) and f.gap_diff_max == pytest.approx(0.04) and f.max_diff_a == 0
    with pytest.raises(ValueError, match="two thread counts"):
        ch.thread_findings(pd.DataFrame(rows).query("threads == 1"))


def test_separate_stats_and_pinned_identities_are_exact_checks():
    tb = dict(train_mode=(0.40, 0.42, 0.41), backbone_eval=(0.30, 0.31, 0.29), all_eval=(0.30, 0.31, 0.2901),
              separate_stats=(0.40, 0.42, 0.41))
    f = ch.findings(table(task_b=tb))
    assert f.f4_separate_matches_b == "holds" and not f.pinned_equal_b_every_seed
    tb["separate_stats"] = (0.40, 0.42, 0.4101)  # a tie inside any interval is still not the identity
    assert ch.findings(table(task_b=tb)).f4_separate_matches_b == "does not hold"


@pytest.mark.parametrize("kw, match", [
    (dict(tuning_seeds=(0, 100)), "must not share a seed"),
    (dict(checkpoints=(400, 1600)), "checkpoints must include steps=800"),
    (dict(sgd_lrs=(0.1, -1)), "sgd_lrs\\[1\\] must be a finite number > 0.0"),
    (dict(thread_seeds=5), "thread_seeds must be <= the number of seeds"),
])
def test_sweep_parameters_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        ch.make_config("quick", **kw)


def test_the_sweeps_heads_equal_the_engines_transfer_exactly():
    """The two-path shortcut computes the engine's task-B heads: same init, batches, modes (``==``)."""
    from bnstudy.config import RunConfig
    from bnstudy.engine import train_source, transfer
    from bnstudy.modes import MODE_NAMES as modes
    kw = dict(seed=3, widths=(4, 8), stage1_steps=5, n_eval=40, steps=6, batch_size=8, epoch_steps=3, lr=0.05)
    rcs = [RunConfig(mode=m, **kw) for m in modes]
    src = train_source(rcs[0].source)
    rows = {r["mode"]: r["task_b"] for r in transfer(rcs, src)}
    base = {k: v for k, v in rcs[0].asdict().items() if k not in ("seed", "mode", "steps", "optimizer", "lr")}
    run = ch.HeadSweepRun(seed=3, role="report", run=base, checkpoints=(3, 6), sgd_lrs=(0.05,), adam_lrs=(0.01,),
                          ref_step=6, n_val=40, n_fit=60)
    out = pd.DataFrame(ch.head_curves(run, src)["records"])
    got = out[(out["optimizer"] == "sgd") & (out["step"] == 6) & (out["split"] == "test")].set_index("path")["accuracy"]
    for path, ms in ch.PATHS.items():
        for m in ms:
            assert got[path] == rows[m], (path, m)
    assert len(out[out["optimizer"] == "reference"]) == 4  # 2 paths x (validation, test), at ref_step only
