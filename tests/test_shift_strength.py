"""Chapter 3's experiment: the sweep grid, paired cost/benefit, and the crossover estimate."""

import math

import numpy as np
import pandas as pd
import pytest

from bnstudy import train
from bnstudy.experiments import shift_strength as ss


def test_both_line_passes_through_chapter_one_shift_at_strength_one():
    assert ss.shift_of("both", 0.0) == (0.0, 1.0)
    assert ss.shift_of("both", 1.0) == (train.DEFAULTS["brightness"], train.DEFAULTS["contrast"])
    assert ss.shift_of("brightness", 2.0) == (2.0, 1.0)
    assert ss.shift_of("contrast", 3.0) == (0.0, 3.0)
    with pytest.raises(ValueError, match="shift_type"):
        ss.shift_of("hue", 1.0)
    with pytest.raises(ValueError, match="contrast must be > 0"):
        ss.shift_of("contrast", 0.0)


def test_make_configs_runs_each_distinct_point_once_with_the_modes_it_needs():
    levels = {"brightness": (0.0, 1.0), "contrast": (1.0, 2.0), "both": (0.0, 0.25)}
    grid = {"brightness": (0.0, 1.0), "contrast": (1.0, 2.0)}
    cfgs = ss.make_configs([0, 1], levels, grid, steps=7)
    keys = [(c["seed"], c["mode"], c["brightness"], c["contrast"]) for c in cfgs]
    assert len(keys) == len(set(keys))
    assert all(c["steps"] == 7 for c in cfgs)
    # (0, 1) is on every line: all four modes; (1, 2) is on the grid and the both line (t=0.25): all four;
    # nothing is grid-only here except none, so add a grid-only point and check it gets only the grid modes.
    per_point = {}
    for s, m, b, c in keys:
        per_point.setdefault((b, c), set()).add(m)
    assert per_point[(0.0, 1.0)] == set(ss.MODE_NAMES)
    assert per_point[(1.0, 2.0)] == set(ss.MODE_NAMES)
    cfgs2 = ss.make_configs([0], {"brightness": (0.0, 1.0)}, {"brightness": (0.0, 3.0), "contrast": (1.0, 3.0)})
    pts = {}
    for c in cfgs2:
        pts.setdefault((c["brightness"], c["contrast"]), set()).add(c["mode"])
    assert pts[(3.0, 3.0)] == set(ss.GRID_MODES)
    assert pts[(1.0, 1.0)] == set(ss.MODE_NAMES)


@pytest.mark.parametrize("kwargs, match", [
    (dict(levels={"hue": (0, 1)}), "shift type"),
    (dict(levels={"brightness": (1.0, 0.0)}), "increasing"),
    (dict(levels={"brightness": (1.0,)}), "at least 2"),
    (dict(line_modes=("frozen",)), "freeze mode"),
    (dict(brightness=2.0), "swept"),
    (dict(grid={"brightness": (0, 1)}), "exactly the keys"),
])
def test_make_configs_rejects_bad_input_naming_it(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ss.make_configs([0, 1], **kwargs)


def _runs():
    # Two seeds, two shifts, three modes; numbers chosen so each effect is known.
    rows = []
    for seed, off in ((0, 0.0), (1, 0.1)):
        for (b, c) in ((0.0, 1.0), (2.0, 1.0)):
            strong = b > 0
            rows += [
                dict(seed=seed, brightness=b, contrast=c, mode="train_mode", task_a_before=1.0,
                     task_a_after=0.4 - off if strong else 1.0, task_b=0.6, mismatch_kl=2.0 if strong else 0.1,
                     on_brightness=True, on_contrast=not strong, on_both=not strong, both_strength=math.nan,
                     in_grid=False),
                dict(seed=seed, brightness=b, contrast=c, mode="backbone_eval", task_a_before=1.0,
                     task_a_after=1.0, task_b=0.5 - off if strong else 0.6),
                dict(seed=seed, brightness=b, contrast=c, mode="separate_stats", task_a_before=1.0,
                     task_a_after=1.0, task_b=0.6),
            ]
    return pd.DataFrame(rows)


def test_paired_effects_compute_cost_and_benefit_within_each_seed_and_shift():
    eff = ss.paired_effects(_runs()).set_index(["seed", "brightness"])
    assert eff.loc[(0, 2.0), "cost"] == pytest.approx(0.6)
    assert eff.loc[(1, 2.0), "cost"] == pytest.approx(0.7)
    assert eff.loc[(1, 2.0), "benefit"] == pytest.approx(0.2)
    assert eff.loc[(1, 2.0), "net"] == pytest.approx(-0.5)
    assert eff.loc[(0, 0.0), ["cost", "benefit"]].tolist() == [0.0, 0.0]
    assert eff.loc[(0, 2.0), "mismatch_kl"] == 2.0
    with pytest.raises(ValueError, match="pinned"):
        ss.paired_effects(_runs(), pinned="train_mode")
    with pytest.raises(ValueError, match="all_eval"):
        ss.paired_effects(_runs(), pinned="all_eval")


def test_mode_effects_measure_gain_against_the_pinned_run_of_the_same_seed():
    me = ss.mode_effects(_runs()).set_index(["seed", "brightness", "mode"])
    assert me.loc[(1, 2.0, "separate_stats"), "task_b_gain"] == pytest.approx(0.2)
    assert me.loc[(1, 2.0, "backbone_eval"), "task_b_gain"] == 0.0
    assert me.loc[(1, 2.0, "train_mode"), "task_a_change"] == pytest.approx(-0.7)


def test_first_crossing_interpolates_the_sign_change_of_benefit_minus_cost():
    x = [0.0, 1.0, 2.0, 3.0]
    benefit = [0.0, 0.3, 0.4, 0.45]
    cost = [0.0, 0.1, 0.6, 0.9]
    # d = benefit - cost: 0 (tie, skipped), 0.2, -0.2, -0.45: crossing half-way between 1 and 2.
    assert ss.first_crossing(x, cost, benefit) == pytest.approx(1.5)


def test_first_crossing_skips_ties_where_both_effects_are_below_min_effect():
    x = [0.0, 1.0, 2.0, 3.0]
    benefit = [0.004, 0.0, 0.1, 0.2]
    cost = [0.0, 0.003, 0.3, 0.6]
    assert math.isnan(ss.first_crossing(x, cost, benefit, min_effect=0.01))
    # With no tolerance the noise at the weak end would count as a crossing.
    assert ss.first_crossing(x, cost, benefit, min_effect=0.0) < 1.0


def _noisy_curves(crossing_at=2.0, n_seeds=12, seed=1):
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 4.0, 9)
    benefit = 0.1 * x + rng.normal(0, 0.01, (n_seeds, len(x)))
    cost = 0.05 * x * x / crossing_at * 2 + rng.normal(0, 0.01, (n_seeds, len(x)))
    return x, cost, benefit


def test_crossover_interval_brackets_a_known_crossing():
    x, cost, benefit = _noisy_curves(crossing_at=2.0)
    res = ss.crossover(x, cost, benefit, n_boot=300, seed=0)
    assert res["estimate"] == pytest.approx(2.0, abs=0.15)
    assert res["ci_low"] <= 2.0 <= res["ci_high"]
    assert res["ci_high"] - res["ci_low"] < 1.0
    assert res["p_cross"] > 0.95 and res["dominant"] == "cost"


def test_crossover_reports_no_crossing_when_cost_exceeds_benefit_at_every_resolved_level():
    x = np.linspace(0.0, 4.0, 9)
    rng = np.random.default_rng(0)
    cost = 0.2 * x + rng.normal(0, 0.005, (10, 9))
    benefit = 0.05 * x + rng.normal(0, 0.005, (10, 9))
    res = ss.crossover(x, cost, benefit, n_boot=200)
    assert math.isnan(res["estimate"]) and math.isnan(res["ci_low"])
    assert res["p_cross"] == 0.0 and res["dominant"] == "cost"
    assert res["first_resolved"] == pytest.approx(0.5)


def test_crossover_is_reproducible_for_a_bootstrap_seed():
    x, cost, benefit = _noisy_curves()
    assert ss.crossover(x, cost, benefit, n_boot=100, seed=3) == ss.crossover(x, cost, benefit, n_boot=100, seed=3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(cost=np.zeros((3, 4))), "seeds, levels"),
    (dict(cost=np.zeros((1, 5)), benefit=np.zeros((1, 5))), "at least 2 seeds"),
    (dict(n_boot=0), "n_boot"),
    (dict(confidence=1.5), "confidence"),
    (dict(strength=[0, 2, 1, 3, 4]), "increasing"),
])
def test_crossover_rejects_bad_input_naming_it(kwargs, match):
    args = dict(strength=np.arange(5.0), cost=np.zeros((3, 5)), benefit=np.zeros((3, 5)))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ss.crossover(**args)


def test_run_rejects_swept_and_unknown_keys(cache_dir):
    with pytest.raises(ValueError, match="swept"):
        ss.run(dict(contrast=2.0, cache_dir=cache_dir))
    with pytest.raises(ValueError, match="unknown config keys"):
        ss.run(dict(shift=2.0, cache_dir=cache_dir))
    with pytest.raises(ValueError, match="mismatch_batches"):
        ss.run(dict(mismatch_batches=0, cache_dir=cache_dir))


TINY = dict(seeds=2, steps=3, stage1_steps=3, n_eval=20, widths=(4, 4), batch_size=8, stage1_batch_size=8,
            brightness_levels=(0.0, 2.0), contrast_levels=(1.0, 2.0), both_levels=(0.0, 0.5),
            grid_brightness=(0.0, 2.0), grid_contrast=(1.0, 2.0), mismatch_batches=1, n_jobs=1, budget_levels=(),
            progress=False, pack_size=8)


def test_tiny_sweep_gives_one_paired_row_per_run_with_its_mismatch(cache_dir):
    df = ss.run({**TINY, "cache_dir": cache_dir})
    # Points: (0,1) (2,1) (0,2) (2,3) on lines, (2,2) grid-only. Lines x 4 modes, grid-only x 2 modes.
    assert len(df) == 2 * (4 * 4 + 1 * 2)
    assert not df.duplicated(["seed", "mode", "brightness", "contrast"]).any()
    assert df["mismatch_kl"].notna().all() and (df["mismatch_kl"] >= 0).all()
    # The mismatch depends on the seed and the shift, never on the freeze mode.
    assert (df.groupby(["seed", "brightness", "contrast"])["mismatch_kl"].nunique() == 1).all()
    assert df.loc[df.on_both, "both_strength"].notna().all() and df.loc[~df.on_both, "both_strength"].isna().all()
    assert df.loc[(df.brightness == 2.0) & (df.contrast == 2.0), "in_grid"].all()
    eff = ss.paired_effects(df)
    assert len(eff) == 2 * 5
    x, seeds, cost = ss.line_matrix(eff, "both", "cost")
    assert list(x) == [0.0, 0.5] and cost.shape == (2, 2)
    again = ss.run({**TINY, "cache_dir": cache_dir})
    pd.testing.assert_frame_equal(df, again)


def test_budget_check_reruns_its_points_at_each_step_count_without_duplicating_the_sweep(cache_dir):
    cfg = {**TINY, "cache_dir": cache_dir, "budget_levels": (0.5,), "budget_steps": (3, 5),
           "brightness_levels": (), "contrast_levels": (), "grid_brightness": (), "grid_contrast": ()}
    df = ss.run(cfg)
    # both line (0, 0.5) x 4 modes at 3 steps, plus t=0.5 at 5 steps for the two budget modes.
    assert len(df) == 2 * (2 * 4 + 2)
    assert not df.duplicated(["seed", "mode", "brightness", "contrast", "steps"]).any()
    assert set(df.loc[df.part == "budget", "steps"]) == {5}
    eff = ss.paired_effects(df)
    assert set(eff.loc[eff.both_strength == 0.5, "steps"]) == {3, 5}


def test_every_mode_in_a_block_lists_the_same_seeds_and_shifts_so_packs_align():
    levels = {"brightness": (0.0, 1.0), "contrast": (1.0, 2.0)}
    grid = {"brightness": (0.0, 3.0), "contrast": (1.0, 3.0)}
    blocks = ss.make_config_blocks([0, 1], levels, grid)
    assert len(blocks) == 2
    for block in blocks:
        seqs = {}
        for c in block:
            seqs.setdefault(c["mode"], []).append((c["seed"], c["brightness"], c["contrast"]))
        assert len({tuple(v) for v in seqs.values()}) == 1
    assert {c["mode"] for c in blocks[1]} == set(ss.GRID_MODES)
