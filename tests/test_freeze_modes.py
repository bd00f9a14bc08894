"""Chapter 1's experiment module: config checks and findings on hand-made tables with known answers."""

import math

import numpy as np
import pandas as pd
import pytest

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
