"""Chapter 3's experiment: config checks, the sweep's points, paired cost/benefit, crossover and findings."""

import copy
import functools
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnstudy.study.config import Execution, RunConfig
from bnstudy.study.experiments.shift_strength import figures, findings, run
from bnstudy.study.inference import _slug, count_verdicts, is_verdict, number, numbers_table, with_numbers
from bnstudy.study.modes import MODE_NAMES

NO_EXTRA = dict(blur_levels=(), noise_levels=(), same_both_levels=(), same_noise_levels=())
SMALL = dict(brightness_levels=(0.0, 1.0, 2.0), contrast_levels=(1.0, 2.0, 3.0), both_levels=(0.0, 0.5, 1.0),
             grid_brightness=(0.0, 2.0), grid_contrast=(1.0, 2.0), budget_levels=(1.0,), budget_steps=(300,),
             **NO_EXTRA)


# --- shifts and config ---------------------------------------------------------------------------------------------

def test_both_line_passes_through_chapter_one_shift_at_strength_one():
    assert run.shift_of("both", 0.0) == (0.0, 1.0)
    assert run.shift_of("both", 1.0) == (RunConfig().brightness, RunConfig().contrast)
    assert run.shift_of("brightness", 2.0) == (2.0, 1.0)
    assert run.shift_of("contrast", 3.0) == (0.0, 3.0)
    with pytest.raises(ValueError, match="shift_type"):
        run.shift_of("hue", 1.0)
    with pytest.raises(ValueError, match="contrast must be > 0"):
        run.shift_of("contrast", 0.0)


def test_profiles_set_every_size_and_overrides_win():
    q = run.make_config("quick")
    assert q.seeds == (0, 1, 2) and q.steps == 100 and q.budget_steps == (200,) and q.budget_levels == (0.25, 1.0)
    f = run.make_config("full")
    assert len(f.seeds) == 16 and f.both_levels[-1] == 1.5 and 0.0625 in f.budget_levels
    assert q.blur_levels and q.noise_levels and q.same_both_levels and q.same_noise_levels
    c = run.make_config("quick", seeds=[0, 5], steps=None, contrast_levels=[1, 4])
    assert c.seeds == (0, 5) and c.steps == 100 and c.contrast_levels == (1.0, 4.0)
    assert "2 seeds (0, 5)" in c.describe()


@pytest.mark.parametrize("overrides, match", [
    (dict(noise=-1), "noise must be a finite number >= 0"),
    (dict(seeds="[0,5]"), "-y"),
    (dict(seeds=1), "at least 2 seeds"),
    (dict(profile="huge"), "profile='huge' is not allowed"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(brightness_levels=(1.0, 0.0)), "brightness_levels must be strictly increasing"),
    (dict(brightness_levels=(1.0,)), "brightness_levels needs at least 2"),
    (dict(contrast_levels=(0.0, 1.0)), "contrast_levels: .*contrast must be > 0"),
    (dict(both_levels="[0, 1]"), "both_levels must be a list.*-y"),
    (dict(grid_contrast=()), "both be given or both be empty"),
    (dict(budget_steps=(0,)), r"budget_steps\[0\] must be an integer >= 1"),
    (dict(line_modes=("frozen",)), r"line_modes\[0\]='frozen' is not allowed"),
    (dict(grid_modes=("train_mode",)), "grid_modes must include"),
    (dict(mismatch_batches=0), "mismatch_batches must be an integer >= 1"),
    (dict(min_effect=-0.1), "min_effect"),
    (dict(batch_size=0), "batch_size must be an integer >= 1"),
    (dict(brightness=2.0), "unknown shift_strength parameters"),
    (dict(brightness_levels=(), contrast_levels=(), both_levels=(), grid_brightness=(), grid_contrast=(),
          budget_levels=(), **NO_EXTRA),
     "nothing to run"),
    (dict(blur_levels=(0.0, -1.0)), "blur_levels"),
    (dict(noise_levels=(0.0, -1.0)), "noise_levels"),
    (dict(tie_margin=0.0), "tie_margin must be a finite number > 0"),
])
def test_bad_parameters_fail_up_front_naming_the_parameter(overrides, match):
    with pytest.raises(ValueError, match=match):
        run.make_config(**{"profile": "quick", **overrides})


def test_each_distinct_point_runs_once_with_the_modes_it_needs():
    cfg = run.make_config("quick", seeds=2, steps=7, brightness_levels=(0.0, 1.0), contrast_levels=(),
                         both_levels=(), grid_brightness=(0.0, 3.0), grid_contrast=(1.0, 3.0),
                         budget_levels=(0.25,), budget_steps=(9,), **NO_EXTRA)
    runs = cfg.run_configs()
    keys = [(c.seed, c.mode, c.brightness, c.contrast, c.steps) for c in runs]
    assert len(keys) == len(set(keys))
    modes = {}
    for s, m, b, c, n in keys:
        modes.setdefault((b, c, n), set()).add(m)
    assert modes[(0.0, 1.0, 7)] == set(MODE_NAMES)          # on the line and the grid: all four, once
    assert modes[(1.0, 1.0, 7)] == set(MODE_NAMES)
    assert modes[(3.0, 3.0, 7)] == set(run.GRID_MODES)       # grid only
    assert modes[(1.0, 2.0, 7)] == modes[(1.0, 2.0, 9)] == set(run.GRID_MODES)  # budget t = 0.25, both step counts
    assert len(runs) == 2 * (2 * 4 + 3 * 2 + 2 * 2)
    assert [c.seed for c in runs] == sorted(c.seed for c in runs)  # seeds outermost


# --- a results table made by hand ------------------------------------------------------------------------------------

def _effects(b, c, steps):
    """(cost, benefit) at a shift: no cost or benefit at no shift; brightness costs more than it helps; on the
    both line benefit 0.2 t and cost 0.3 t^2, so the curves cross at t = 0.6 (0.5 + 0.5 * 0.025 / 0.125)."""
    t = b / 4.0
    if c == 1.0:                    # brightness line
        return 0.1 * b, 0.02 * b
    if b == 0.0:                    # contrast line
        return 0.05 * (c - 1), 0.01 * (c - 1)
    if math.isclose(c, 1 + 4 * t):  # both line
        return 0.3 * t * t, 0.2 * t * (0.5 if steps > 100 else 1.0)
    return 0.1 * b + 0.05 * (c - 1), 0.0  # grid only: costs add up


def _table(cfg, effects=_effects, sep_b_offset=0.0):
    rows = []
    for r in cfg.run_configs():
        cost, benefit = effects(r.brightness, r.contrast, r.steps)
        tm = r.mode == "train_mode"
        rows.append(dict(r.asdict(), task_a_before=0.9, task_a_after=0.9 - cost if tm else 0.9,
                         task_b=0.5 + benefit if tm else (0.5 + benefit - sep_b_offset if r.mode == "separate_stats"
                                                          else 0.5),
                         mismatch_kl=0.01 + r.brightness ** 2 / 2 + (r.contrast - 1) ** 2,
                         mismatch_kl_train=2 * (0.01 + r.brightness ** 2 / 2 + (r.contrast - 1) ** 2),
                         wall_s=0.5))
    return run.annotate(pd.DataFrame(rows), cfg)


def _cfg(**kw):
    return run.make_config("quick", seeds=3, **{**SMALL, "both_levels": (0.0, 0.25, 0.5, 1.0), **kw})


def claim(C, key):
    """The row ``key`` of the claims table ``C``."""
    return C.set_index("key").loc[key]


def analyse(df, n_boot=20, n_boot_select=20):
    """``(claims, numbers)`` of ``df`` (:func:`findings.claims`, :func:`findings.findings` reading those claims)."""
    C = findings.claims(df, n_boot=n_boot)
    return C, findings.findings(df, n_boot=n_boot, n_boot_select=n_boot_select, claims_=C)


def said(key, C, F):
    """The sentence the page's notes (:data:`findings.NOTES`) say under ``key``."""
    return findings.notes([n for n in findings.NOTES if n.key == key], C, F)[key]


#: The hand-made tables whose findings several tests read (computed once per test process, see shared_findings).
SHARED_TABLES = {
    "cfg": lambda: _table(_cfg()),                                   # _effects on the three lines, no seed spread
    "ten": lambda: _table10(_cfg10(), seed_noise=0.001),             # issue 10's table, tiny seed spread
}


@functools.lru_cache(maxsize=None)
def _shared_findings(name):
    return analyse(SHARED_TABLES[name](), n_boot=20, n_boot_select=20)


def shared_findings(name):
    """``analyse(SHARED_TABLES[name](), n_boot=20, n_boot_select=20)``: ``(claims, numbers)``, computed once per test process
    (each call takes seconds) and handed out as a deep copy, so no test can change another's findings. Shared by
    the tests of this module and of test_shift_strength_referee that ask the same question of the same table; their
    assertions do not depend on the number of resamples (tables without seed spread, or point estimates, counts
    and wording)."""
    return copy.deepcopy(_shared_findings(name))


def test_findings_find_the_known_crossover_and_name_the_lines():
    C, F = shared_findings("cfg")
    assert number(F, "cross_page_raw_both").startswith("0.6 [")
    assert number(F, "threshold_lines_raw_thr0_01") == "both"                        # only the both line crosses
    assert number(F, "cross_page_raw_brightness").startswith("none [")
    assert number(F, "cost_brightness_max").mean == pytest.approx(0.2) and number(F, "benefit_brightness_max").mean == pytest.approx(0.04)
    assert number(F, "cost_t1").mean == pytest.approx(0.3) and number(F, "benefit_t1").mean == pytest.approx(0.2)
    assert number(F, "cost_noshift").mean == 0 and number(F, "benefit_noshift").mean == 0
    assert number(F, "counts_raw_brightness_lower") == 2 and number(F, "counts_raw_both_higher") == 2
    assert number(F, "n_seeds") == 3 and number(F, "chance") == 0.1 and number(F, "ch1_steps") == 800


def test_findings_verdicts_flip_when_the_data_do():
    C, F = shared_findings("cfg")
    # zero spread over seeds (every seed the same effect): the interval is the point, a direction is shown
    assert claim(C, "budget_change_strongest")["verdict"] == "longer budget lower"
    assert claim(C, "budget_change_1")["estimate"] == pytest.approx(-0.1)
    assert claim(C, "grid_compound")["verdict"] == "combined shift costs more"
    assert claim(C, "sep_task_a")["verdict"] == "exact, checked =="
    assert number(F, "budget_t") == 1.0 and (number(F, "budget_s_lo"), number(F, "budget_s_hi")) == (100, 300)
    assert number(F, "grid_cost_corner") == pytest.approx(0.25) and number(F, "grid_cost_bonly") == pytest.approx(0.2)

    def flipped(b, c, steps):
        if b > 0 and c > 1 and not math.isclose(c, 1 + b):   # grid only: no dearer than a pure shift
            return 0.1, 0.0
        if b > 0 and math.isclose(c, 1 + b):               # both line: cost above benefit everywhere
            return 0.3 * b / 4, 0.1 * b / 4
        return _effects(b, c, steps)
    df = _table(_cfg(), flipped, sep_b_offset=0.05)
    one = df.index[df["mode"].eq("separate_stats") & df["on_both"]][0]
    df.loc[one, "task_a_after"] -= 1e-12          # separate_stats touching task A at all: no longer exact
    CG, G = analyse(df, n_boot=10, n_boot_select=10)
    assert claim(CG, "grid_compound")["verdict"] == "combined shift costs less"   # corner 0.1 below 0.2, every seed
    assert claim(CG, "sep_task_a")["verdict"] == "not exact" and number(G, "sep_vs_train_max_b_diff") == pytest.approx(0.05)
    assert number(G, "threshold_lines_raw_thr0_01") == "none"   # no line crosses


def test_budget_direction_grows_and_stays():
    def grows(b, c, steps):
        cost, ben = _effects(b, c, steps)
        return cost, (ben * 4 if steps > 100 and b > 0 and c > 1 else ben)
    assert claim(analyse(_table(_cfg(), grows), n_boot=10, n_boot_select=10)[0],
                 "budget_change_strongest")["verdict"] == "longer budget higher"
    same = lambda b, c, steps: _effects(b, c, 100)
    assert claim(analyse(_table(_cfg(), same), n_boot=10, n_boot_select=10)[0],
                 "budget_change_strongest")["verdict"] == "not decided"


def test_every_verdict_of_the_findings_is_a_word_of_the_vocabulary():
    C, F = shared_findings("ten")
    assert len(C) and not C["key"].duplicated().any()
    assert all(is_verdict(v, findings.DIRECTIONS) for v in C["verdict"])
    assert not any(is_verdict(w) for w in findings.DIRECTIONS)   # the page's own words, declared
    lv = findings.level_table(_table10(_cfg10(), seed_noise=0.001), margin=0.02)
    assert all(is_verdict(v, findings.DIRECTIONS) for v in lv["verdict"])
    # the numbers table holds no claim: its glued names and the claims' never meet (one glue_chapter call)
    from bnstudy.study.pages import claims_items, numbers_items
    assert not {n for n, _ in numbers_items("ch03", F)} & {n for n, _ in claims_items("ch03", C)}


def test_findings_of_the_mismatch_measure():
    C, F = shared_findings("cfg")
    assert number(F, "rho_kl_eval_train_rho") == pytest.approx(1.0)
    # three levels per affine line: fewer than 4 pairs, no rank correlation (inference.rank_correlation's rule)
    assert math.isnan(number(F, "rho_kl_cost_brightness_rho")) and math.isnan(number(F, "rho_kl_cost_contrast_rho"))
    four = _cfg(brightness_levels=(0.0, 1.0, 2.0, 3.0), contrast_levels=(1.0, 2.0, 3.0, 4.0))
    G = findings.findings(_table(four), n_boot=10, n_boot_select=10)
    assert number(G, "rho_kl_cost_brightness_rho") == pytest.approx(1.0)   # cost rises with mismatch
    assert number(G, "rho_kl_cost_contrast_rho") == pytest.approx(1.0)
    assert number(F, "noshift_kl") == pytest.approx(0.01)
    # safe: cost < 0.01 with 95% confidence (only no shift); harmed: cost > 0.01 (every other shift)
    assert number(F, "safe_max_kl") == pytest.approx(0.01) and number(F, "harm_min_kl") > number(F, "safe_max_kl")
    assert number(F, "n_conditions") == len({p[:5] for p in _cfg().points() if p[5] == 100})


def test_figure_tables_are_tidy_and_hold_the_effects():
    df = _table(_cfg())
    lt = findings.level_table(df, n_boot=20)  # the per-level effects the figures draw, one row per level and view
    assert set(lt.columns) == set(findings.LEVEL_COLUMNS)
    row = lt[(lt["line"] == "both") & (lt["strength"] == 1.0) & (lt["metric"] == "net") & (lt["view"] == "raw")]
    assert row["mean"].item() == pytest.approx(-0.1)
    bt = findings.budget_table(df)
    assert set(bt["steps"]) == {100, 300} and set(bt["t"]) == {1.0}
    gt = findings.grid_table(df)
    assert len(gt) == 4 * 3
    st = findings.scatter_table(df)
    assert set(st["mode"]) == set(MODE_NAMES)
    for t in (lt, bt, gt, st, findings.condition_table(df)):
        assert not any(t[c].map(lambda v: isinstance(v, (list, tuple, dict))).any() for c in t.columns)


def test_findings_need_every_line():
    df = _table(_cfg())
    with pytest.raises(ValueError, match="contrast line"):
        findings.findings(df.assign(on_contrast=False))


# --- paired effects and the crossover (kept from the first version) -----------------------------------------------

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
    eff = findings.paired_effects(_runs()).set_index(["seed", "brightness"])
    assert eff.loc[(0, 2.0), "cost"] == pytest.approx(0.6)
    assert eff.loc[(1, 2.0), "cost"] == pytest.approx(0.7)
    assert eff.loc[(1, 2.0), "benefit"] == pytest.approx(0.2)
    assert eff.loc[(1, 2.0), "net"] == pytest.approx(-0.5)
    assert eff.loc[(0, 0.0), ["cost", "benefit"]].tolist() == [0.0, 0.0]
    assert eff.loc[(0, 2.0), "mismatch_kl"] == 2.0
    with pytest.raises(ValueError, match="pinned"):
        findings.paired_effects(_runs(), pinned="train_mode")
    with pytest.raises(ValueError, match="all_eval"):
        findings.paired_effects(_runs(), pinned="all_eval")
    runs = _runs()
    with pytest.raises(ValueError, match=r"1 repeated \(seed, .*mode\) rows"):   # a run given twice
        findings.paired_effects(pd.concat([runs, runs.iloc[:1]]))


def test_mode_effects_measure_gain_against_the_pinned_run_of_the_same_seed():
    me = findings.mode_effects(_runs()).set_index(["seed", "brightness", "mode"])
    assert me.loc[(1, 2.0, "separate_stats"), "task_b_gain"] == pytest.approx(0.2)
    assert me.loc[(1, 2.0, "backbone_eval"), "task_b_gain"] == 0.0
    assert me.loc[(1, 2.0, "train_mode"), "task_a_change"] == pytest.approx(-0.7)


def test_first_crossing_interpolates_the_sign_change_of_benefit_minus_cost():
    x = [0.0, 1.0, 2.0, 3.0]
    benefit = [0.0, 0.3, 0.4, 0.45]
    cost = [0.0, 0.1, 0.6, 0.9]
    # d = benefit - cost: 0 (tie, skipped), 0.2, -0.2, -0.45: crossing half-way between 1 and 2.
    assert findings.first_crossing(x, cost, benefit) == pytest.approx(1.5)


def test_first_crossing_skips_ties_where_both_effects_are_below_min_effect():
    x = [0.0, 1.0, 2.0, 3.0]
    benefit = [0.004, 0.0, 0.1, 0.2]
    cost = [0.0, 0.003, 0.3, 0.6]
    assert math.isnan(findings.first_crossing(x, cost, benefit, min_effect=0.01))
    # With no tolerance the noise at the weak end would count as a crossing.
    assert findings.first_crossing(x, cost, benefit, min_effect=0.0) < 1.0


def _noisy_curves(crossing_at=2.0, n_seeds=12, seed=1):
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 4.0, 9)
    benefit = 0.1 * x + rng.normal(0, 0.01, (n_seeds, len(x)))
    cost = 0.05 * x * x / crossing_at * 2 + rng.normal(0, 0.01, (n_seeds, len(x)))
    return x, cost, benefit


def test_crossover_interval_brackets_a_known_crossing():
    x, cost, benefit = _noisy_curves(crossing_at=2.0)
    res = findings.crossover(x, cost, benefit, n_boot=300, seed=0)
    assert res["estimate"] == pytest.approx(2.0, abs=0.15)
    assert res["ci_low"] <= 2.0 <= res["ci_high"]
    assert res["ci_high"] - res["ci_low"] < 1.0
    assert res["p_cross"] > 0.95 and res["dominant"] == "cost"


def test_crossover_reports_no_crossing_when_cost_exceeds_benefit_at_every_resolved_level():
    x = np.linspace(0.0, 4.0, 9)
    rng = np.random.default_rng(0)
    cost = 0.2 * x + rng.normal(0, 0.005, (10, 9))
    benefit = 0.05 * x + rng.normal(0, 0.005, (10, 9))
    res = findings.crossover(x, cost, benefit, n_boot=200)
    assert math.isnan(res["estimate"]) and math.isnan(res["ci_low"])
    assert res["p_cross"] == 0.0 and res["dominant"] == "cost"
    assert res["first_resolved"] == pytest.approx(0.5)


def test_crossover_is_reproducible_for_a_bootstrap_seed():
    x, cost, benefit = _noisy_curves()
    assert findings.crossover(x, cost, benefit, n_boot=100, seed=3) == findings.crossover(x, cost, benefit, n_boot=100, seed=3)


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
        findings.crossover(**args)


# --- a tiny real run -----------------------------------------------------------------------------------------------

TINY = dict(seeds=2, steps=3, stage1_steps=3, n_eval=20, widths=(4, 4), batch_size=8, stage1_batch_size=8,
            brightness_levels=(0.0, 2.0), contrast_levels=(1.0, 2.0), both_levels=(0.0, 0.5),
            grid_brightness=(0.0, 2.0), grid_contrast=(1.0, 2.0), mismatch_batches=1, budget_levels=(), **NO_EXTRA)


def test_run_needs_a_config():
    with pytest.raises(TypeError, match="make_config"):
        run.run(dict(TINY))


def test_tiny_sweep_gives_one_paired_row_per_run_with_its_mismatch(cache_dir):
    ex = Execution(cache_dir=cache_dir, n_jobs=1, progress=False)
    df = run.run(run.make_config("quick", **TINY), ex)
    # Points: (0,1) (2,1) (0,2) (2,3) on lines, (2,2) grid-only. Lines x 4 modes, grid-only x 2 modes.
    assert len(df) == 2 * (4 * 4 + 1 * 2)
    assert not df.duplicated(["seed", "mode", "brightness", "contrast"]).any()
    assert df["mismatch_kl"].notna().all() and (df["mismatch_kl"] >= 0).all()
    # The mismatch depends on the seed and the shift, never on the freeze mode.
    assert (df.groupby(["seed", "brightness", "contrast"])["mismatch_kl"].nunique() == 1).all()
    assert df.loc[df.on_both, "both_strength"].notna().all() and df.loc[~df.on_both, "both_strength"].isna().all()
    assert df.loc[(df.brightness == 2.0) & (df.contrast == 2.0), "in_grid"].all()
    eff = findings.paired_effects(df)
    assert len(eff) == 2 * 5
    x, seeds, cost = findings.line_matrix(eff, "both", "cost")
    assert list(x) == [0.0, 0.5] and cost.shape == (2, 2)
    again = run.run(run.make_config("quick", **TINY), ex)
    pd.testing.assert_frame_equal(df, again)


def test_budget_check_reruns_its_points_at_each_step_count_without_duplicating_the_sweep(cache_dir):
    cfg = run.make_config("quick", **{**TINY, "budget_levels": (0.5,), "budget_steps": (3, 5),
                                     "brightness_levels": (), "contrast_levels": (), "grid_brightness": (),
                                     "grid_contrast": ()})
    df = run.run(cfg, Execution(cache_dir=cache_dir, n_jobs=1, progress=False))
    # both line (0, 0.5) x 4 modes at 3 steps, plus t=0.5 at 5 steps for the two budget modes.
    assert len(df) == 2 * (2 * 4 + 2)
    assert not df.duplicated(["seed", "mode", "brightness", "contrast", "steps"]).any()
    assert set(df.loc[df.part == "budget", "steps"]) == {5}
    eff = findings.paired_effects(df)
    assert set(eff.loc[eff.both_strength == 0.5, "steps"]) == {3, 5}


# --- issue 10: multiplicity, equivalence, the normalized view, leave-one-type-out, the budget ----------------------

def test_level_table_uses_the_family_interval_and_tost_of_inference():
    from bnstudy.study.inference import Family, t_interval, tost_p
    df = _table10(_cfg10(), seed_noise=0.01)
    lv = findings.level_table(df, margin=0.02)
    net = lv[(lv["metric"] == "net") & (lv["view"] == "raw")].set_index(["line", "strength"])
    eff = findings.paired_effects(findings._main(df))
    g = eff[eff["s_both"] == 1.0]["net"]
    m = int(net["m_tests"].iloc[0])
    iv = t_interval(g, Family(m).confidence)          # Bonferroni: confidence 1 - 0.05/m
    assert (net.loc[("both", 1.0), "ci_low"], net.loc[("both", 1.0), "ci_high"]) == pytest.approx((iv.low, iv.high))
    assert net.loc[("both", 1.0), "tost_p"] == pytest.approx(tost_p(g, 0.02))


def _cfg10(**kw):
    return run.make_config("quick", seeds=3, **{**SMALL, "both_levels": (0.0, 0.25, 0.5, 1.0), "blur_levels": (0.0, 1.0),
                                               "same_both_levels": (0.0, 1.0), **kw})


def _table10(cfg, seed_noise=0.0):
    """Known effects. Task A 0.6 before (room 0.5 over chance 0.1); train_mode's task B 0.35 (room 0.25), pinned
    0.35 - benefit. Affine lines as _effects; blur: cost 0.05 benefit 0; same classes at t=1: cost 0.3, benefit 0.2."""
    rows = []
    for r in cfg.run_configs():
        if r.corruption == "blur":
            cost, ben = 0.05, 0.0
        elif r.task_b_classes == "same":
            cost, ben = (0.3, 0.2) if r.brightness > 0 else (0.0, 0.0)
        else:
            cost, ben = _effects(r.brightness, r.contrast, r.steps)
        wob = seed_noise * (r.seed - 1)
        tm = r.mode == "train_mode"
        rows.append(dict(r.asdict(), task_a_before=0.6, task_a_after=0.6 - cost - wob if tm else 0.6,
                         task_b=0.35 if tm else 0.35 - ben, mismatch_kl=0.01 + r.brightness ** 2 / 2 + (r.contrast - 1) ** 2
                         + r.corruption_level, mismatch_kl_train=0.02, mismatch_mean_shift=r.brightness + 0.01 +
                         r.corruption_level, wall_s=0.1))
    return run.annotate(pd.DataFrame(rows), cfg)


def test_normalized_view_divides_each_effect_by_its_tasks_room_above_chance():
    df = _table10(_cfg10())
    eff = findings.normalized_effects(findings.paired_effects(findings._main(df)), 0.1)
    both1 = eff[(eff["s_both"] == 1.0)]
    assert both1["room_a"].to_numpy() == pytest.approx(0.5) and both1["room_b"].to_numpy() == pytest.approx(0.25)
    assert both1["cost_n"].iloc[0] == pytest.approx(0.3 / 0.5) and both1["benefit_n"].iloc[0] == pytest.approx(0.2 / 0.25)
    assert both1["net_n"].iloc[0] == pytest.approx(0.8 - 0.6)   # raw net -0.1, normalized +0.2: the verdict flips


def test_level_table_counts_the_tests_and_gives_the_verdict_per_level():
    cfg = _cfg10()
    lv = findings.level_table(_table10(cfg, seed_noise=0.001), margin=0.02)
    n_levels = sum(sum(1 for s in levels if run.point_of(t, s)[1:] != ("none", 0.0, 0.0, 1.0))
                   for t, levels in cfg.levels().items())
    assert (lv["m_tests"] == n_levels).all() and n_levels == 2 + 2 + 3 + 1 + 1
    net = lv[lv["metric"] == "net"].set_index(["line", "strength", "view"])
    assert net.loc[("both", 1.0, "raw"), "verdict"] == "train mode lower"      # -0.1, tiny spread
    assert net.loc[("both", 1.0, "normalized"), "verdict"] == "train mode higher"
    assert net.loc[("both", 0.25, "raw"), "verdict"] == "train mode higher"     # 0.05 - 0.01875, tiny spread
    assert net.loc[("blur", 1.0, "raw"), "mean"] == pytest.approx(-0.05)
    assert net.loc[("both", 1.0, "raw"), "breakeven_rate"] == pytest.approx(0.2 / 0.3)
    lo, hi = net.loc[("both", 1.0, "raw"), ["breakeven_low", "breakeven_high"]]
    # three seeds: below inference.MIN_BOOTSTRAP_UNITS (4), so no bootstrap interval, and the table says so
    assert np.isnan(lo) and np.isnan(hi)
    vt = findings.verdict_table(lv)
    assert vt.loc[("both", "1"), "break-even rate [95%]"] == f"{0.2 / 0.3:.2f} (point estimate only)"
    assert vt.loc[("both", "1"), "verdict (accuracy)"] == "train mode lower"


def test_seed_points_are_the_per_seed_values_behind_the_level_means():
    cfg = _cfg10()
    df = _table10(cfg, seed_noise=0.001)
    pts = findings.seed_points(df)
    lv = findings.level_table(df, margin=0.02)
    raw = lv[(lv["view"] == "raw") & lv["metric"].isin(["cost", "benefit"])]
    means = pts.groupby(["line", "strength", "metric"])["value"].mean()
    assert len(means) == len(raw)                                   # every plotted level has its points, no more
    for r in raw.itertuples():
        assert means.loc[(r.line, r.strength, r.metric)] == pytest.approx(r.mean)
        assert (pts[(pts["line"] == r.line) & (pts["strength"] == r.strength)]["seed"].nunique() == r.n_seeds)
    both1 = pts[(pts["line"] == "both") & (pts["strength"] == 1.0) & (pts["metric"] == "cost")]
    assert both1["value"].to_numpy() == pytest.approx(0.3, abs=0.01)   # _table10's cost at t = 1, per seed
    assert not ((pts["strength"] == 0) & (pts["line"] == "both")).any()  # the no-shift point is left out


def test_threshold_table_moves_the_crossing_with_the_tie_threshold():
    th = findings.threshold_table(_table10(_cfg10()), (0.0, 0.02), n_boot=20)
    both = th[(th["line"] == "both") & (th["view"] == "raw")].set_index("threshold")
    assert both.loc[0.0, "estimate"] == pytest.approx(0.6) and both.loc[0.02, "estimate"] == pytest.approx(0.6)
    br = th[(th["line"] == "brightness") & (th["view"] == "raw")].set_index("threshold")
    assert np.isnan(br.loc[0.02, "estimate"])
    assert set(findings.threshold_display(th).columns) == {"tie < 0", "tie < 0.02"}


def test_isotonic_prediction_and_leave_one_type_out_error():
    pred = findings.isotonic_predict([1, 2, 3], [1.0, 0.0, 2.0], [2.5, 0.0, 9.0])
    assert pred == pytest.approx([1.25, 0.5, 2.0])          # pooled (0.5, 0.5, 2), constant beyond the ends
    x = [0.0, 1.0, 2.0, 3.0, 4.0]
    y = [0.0, 0.1, 0.2, 0.3, 0.4]
    kinds = ["no shift", "a", "b", "a", "b"]
    assert findings.loo_errors(x, y, kinds, ["a", "b"]) == pytest.approx({"a": 0.0, "b": 0.05})


def test_mismatch_selection_picks_the_measure_that_predicts_a_held_out_type():
    df = _table10(_cfg10())
    # A candidate equal to the cost itself (plus a constant) must win with zero error; the KL of _table10 puts
    # the blur line at a different cost for the same value, so it cannot.
    df = df.assign(mismatch_oracle=0.0)
    eff = findings.paired_effects(findings._main(df))
    cost = eff.set_index(["seed", *run.POINT_COLS])["cost"]
    key = pd.MultiIndex.from_frame(df[["seed", *run.POINT_COLS]])
    df["mismatch_oracle"] = 0.001 + cost.reindex(key).to_numpy()
    sel = findings.mismatch_selection(df, {"KL": "mismatch_kl", "oracle": "mismatch_oracle"}, n_boot=30, twins=None)
    assert sel["winner"] == "oracle" and sel["candidates"]["oracle"]["score"] == pytest.approx(0.0, abs=1e-12)
    # With twin lines held out together (the default) the oracle still wins, but its error is no longer 0: the
    # both line's costs must be read off the other lines without same_both's.
    sel_t = findings.mismatch_selection(df, {"KL": "mismatch_kl", "oracle": "mismatch_oracle"}, n_boot=30)
    assert sel_t["winner"] == "oracle" and sel_t["candidates"]["oracle"]["score"] > 0
    assert sel["candidates"]["KL"]["score"] > 0 and "blur" in sel["types"]
    assert sel["candidates"]["oracle"]["rho"] == pytest.approx(1.0)
    assert set(findings.selection_table(sel)["held_out"]) >= {"mean", "blur", "both"}


def test_equal_measure_spread_finds_lines_with_equal_mismatch_and_different_cost():
    cond = pd.DataFrame(dict(m=[1.0, 10.0, 1.0, 10.0], cost=[0.0, 0.5, 0.0, 0.1],
                             on_brightness=[True, True, False, False], on_contrast=[False, False, True, True]))
    out = findings.equal_measure_spread(cond, "m")
    assert out["value"] == pytest.approx(10.0) and (out["line_low"], out["line_high"]) == ("contrast", "brightness")
    assert (out["cost_low"], out["cost_high"]) == (pytest.approx(0.1), pytest.approx(0.5))


def test_convergence_flags_a_head_still_improving():
    cfg = _cfg10(budget_levels=(0.25, 1.0), budget_steps=(200, 300))
    df = _table10(cfg)
    # The pinned head gains 0.001 * seed + 0.02 from 200 to 300 steps at t = 1: still improving (even at the
    # family's confidence 1 - 0.05/6 with 3 seeds); elsewhere flat.
    bump = (df["mode"] == "backbone_eval") & (df["steps"] == 300) & (df["both_strength"] == 1.0)
    df.loc[bump, "task_b"] += 0.02 + 0.001 * df.loc[bump, "seed"]
    cv = findings.convergence_table(df).set_index(["t", "mode"])
    assert cv.loc[(1.0, "backbone_eval"), "verdict"] == "longer budget higher"
    assert cv.loc[(1.0, "train_mode"), "verdict"] == "not decided"             # 0 change in every seed, no margin
    assert cv.loc[(1.0, "benefit"), "verdict"] == "longer budget lower"
    assert (cv["m"] == len(cv)).all()                                           # the table's rows: one family
    assert cv.loc[(0.25, "backbone_eval"), "steps_from"] == 200
    C, F = analyse(df, n_boot=10, n_boot_select=10)
    assert number(F, "n_heads_improving") == 1 and number(F, "n_heads_checked") == 4
    assert claim(C, "convergence_1_backbone_eval")["verdict"] == "longer budget higher"
    assert claim(C, "convergence_weakest_backbone_eval")["verdict"] == "not decided"
    bp = findings.budget_points(df)
    assert set(bp["steps"]) == {100, 200, 300} and {"train_mode", "backbone_eval", "paired"} <= set(bp["mode"])


def test_findings_of_issue_ten_on_a_hand_made_table():
    C, F = shared_findings("ten")
    assert number(F, "room_a") == pytest.approx(0.5) and number(F, "room_b_new") == pytest.approx(0.25)
    assert number(F, "exchange_rate") == pytest.approx(0.5)
    assert claim(C, "at_t1_both_raw")["verdict"] == "train mode lower"
    assert claim(C, "at_t1_both_normalized")["verdict"] == "train mode higher"
    assert claim(C, "weakest_raw_both")["estimate"] == claim(C, "raw_both_0_25")["estimate"]
    assert number(F, "family_benefit").mean == pytest.approx(0.2) and number(F, "family_cost").mean == pytest.approx(0.3)
    assert number(F, "extra_blur_cost").mean == pytest.approx(0.05)
    assert number(F, "threshold_lines_raw_thr0_02") == "both"
    assert number(F, "counts_raw_both_levels") == 3 and number(F, "m_tests") == 9


def test_task_b_options_default_to_todays_task_and_change_it_when_asked():
    from bnstudy.study.tasks import generator, make_task, make_task_b, task_b_of
    a, b = make_task(3, "B", 10, 3.0, 1.0, 2.0), make_task_b(3, 10, 3.0, 1.0, 2.0)
    y = torch_arange()
    assert (a.sample(y, generator(1)) == b.sample(y, generator(1))).all()        # exactly today's task B
    assert (task_b_of(RunConfig(seed=3)).templates == make_task(3, "B", 10, 3.0).templates).all()
    same = make_task_b(3, 10, 3.0, classes="same")
    assert (same.templates == make_task(3, "A", 10, 3.0).templates).all()      # the AdaBN setting
    blur = make_task_b(3, 10, 0.0, corruption="blur", level=1.0).sample(y, generator(1))
    assert blur.std() < make_task_b(3, 10, 0.0).sample(y, generator(1)).std()
    with pytest.raises(ValueError, match="corruption="):
        make_task_b(3, corruption="jpeg")
    with pytest.raises(ValueError, match="corruption_level"):
        RunConfig(corruption="noise", corruption_level=-1.0)


def torch_arange():
    import torch
    return torch.arange(10)


def test_gaussian_blur_keeps_a_constant_image_and_its_mean():
    import torch
    from bnstudy.study.tasks import gaussian_blur
    x = torch.full((1, 3, 8, 8), 2.5)
    assert torch.allclose(gaussian_blur(x, 1.0), x)
    z = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert gaussian_blur(z, 0.0) is z
    with pytest.raises(ValueError, match="radius"):
        gaussian_blur(z, 6.0)


def test_tiny_sweep_runs_the_new_lines_through_the_engine(cache_dir):
    cfg = run.make_config("quick", **{**TINY, "brightness_levels": (0.0, 2.0), "contrast_levels": (1.0, 2.0),
                                     "both_levels": (0.0, 0.5), "grid_brightness": (), "grid_contrast": (),
                                     "blur_levels": (0.0, 1.0), "same_noise_levels": (0.0, 2.0)})
    df = run.run(cfg, Execution(cache_dir=cache_dir, n_jobs=1, progress=False))
    assert set(df["task_b_classes"]) == {"new", "same"} and set(df["corruption"]) == {"none", "blur", "noise"}
    assert df["mismatch_wasserstein"].notna().all() and df["mismatch_log_var_ratio"].notna().all()
    same0 = df[(df.task_b_classes == "same") & (df.corruption == "none")]
    assert same0["on_same_noise"].all() and same0["s_same_noise"].eq(0).all()
    eff = findings.paired_effects(df)
    x, _, _ = findings.line_matrix(eff, "blur", "cost")
    assert list(x) == [0.0, 1.0]


def test_selection_findings_name_the_winner_and_its_limits():
    df = _table10(_cfg10())
    df["mismatch_kl_train"] = 2 * df["mismatch_kl"]        # not constant, so no candidate ties every shift
    F = findings.findings(df, n_boot=10, n_boot_select=30)
    assert number(F, "winner") in findings.CANDIDATES and number(F, "n_other_candidates") == 2  # _table10 has 3
    assert 0 <= number(F, "n_beaten") <= number(F, "n_other_candidates") == 2
    stem = f"selection_{_slug(number(F, 'winner'))}_per_type_"
    sel = {k[len(stem):]: number(F, k) for k in F["key"] if k.startswith(stem)}
    assert number(F, "winner_worst_error") == max(sel.values())
    assert sel[_slug(number(F, "winner_worst_type"))] == number(F, "winner_worst_error")
    # the safe and harm groups are worded from their values (the mean shift, 0.01 at every contrast-only shift,
    # puts costly shifts at the no-shift value: the groups meet)
    assert number(F, "winner_threshold_clean") == ("overlap" if number(F, "winner_harm_min") < number(F, "winner_safe_max") else "do not overlap")
    assert (number(F, "n_lower_raw") + number(F, "n_higher_raw") + number(F, "n_equivalent_raw") + number(F, "n_not_decided_raw")
            + number(F, "n_too_few_raw")) == number(F, "m_tests")                    # every level has exactly one verdict


def test_source_backbone_trains_its_source_when_the_cache_has_none(tmp_path):
    import torch
    # The page's mismatch cell runs after run.run, or, when it analyses an earlier run's rows, with no source cached.
    cfg = run.make_config("quick", seeds=[0, 1], stage1_steps=5)
    mc = cfg.mismatch_config(0, 0.0, 1.0)
    first = run.source_backbone(mc, tmp_path)
    again = run.source_backbone(mc, tmp_path)                      # read back, not retrained
    assert not first.training
    for (k, a), (_, b) in zip(first.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k


def test_breakeven_interval_brackets_the_rate_and_refuses_where_the_cost_may_be_zero():
    cost = np.array([0.28, 0.30, 0.32, 0.29, 0.31])
    ben = np.array([0.19, 0.21, 0.20, 0.22, 0.18])
    lo, hi = findings.breakeven_interval(cost, ben, n_boot=500)
    assert lo < ben.mean() / cost.mean() < hi and hi - lo < 0.2
    assert findings.breakeven_interval(cost, ben, n_boot=500) == (lo, hi)            # reproducible (seed 0)
    lo0, hi0 = findings.breakeven_interval(np.array([0.02, -0.03, 0.01, -0.01, 0.02]), ben, n_boot=500)
    assert np.isnan(lo0) and np.isnan(hi0)                                       # mean cost often <= 0: no bound
    assert all(np.isnan(findings.breakeven_interval(cost[:1], ben[:1], n_boot=50)))  # too few seeds (inference: n < 2)
    with pytest.raises(ValueError, match="n_boot"):
        findings.breakeven_interval(cost, ben, n_boot=0)
    with pytest.raises(ValueError, match="equal length"):
        findings.breakeven_interval(cost, ben[:3])


def test_rate_reading_flags_point_estimates_and_rates_above_one_where_the_net_is_unresolved():
    assert findings.rate_reading(math.nan, math.nan, math.nan, "equivalent") == "n/a"
    assert findings.rate_reading(0.5, 0.4, 0.6, "lower") == "0.50 [0.40, 0.60]"
    assert findings.rate_reading(1.39, math.nan, math.nan, "equivalent") == \
        "1.39 (point estimate only), net: no direction shown"
    assert findings.rate_reading(1.39, 0.8, 2.5, "not decided") == "1.39 [0.80, 2.50], net: no direction shown"
    assert findings.rate_reading(1.39, 1.1, 2.5, "higher") == "1.39 [1.10, 2.50]"


def test_rate_findings_do_not_read_rates_above_one_at_unresolved_levels_as_drifting_paying():
    kinds = {"equivalent within \u00b10.02": "equivalent", "not decided": "not decided", "train mode lower": "lower",
             "train mode higher": "higher"}
    row = lambda line, x, rate, lo, hi, v: dict(line=line, strength=x, view="raw", metric="net", breakeven_rate=rate,
                                                breakeven_low=lo, breakeven_high=hi, verdict=v, kind=kinds[v])
    lv = pd.DataFrame([row("brightness", 0.5, 1.39, 0.7, 2.9, "equivalent within \u00b10.02"),
                       row("noise", 3.0, 1.48, math.nan, math.nan, "not decided"),
                       row("both", 1.0, 0.36, 0.3, 0.43, "train mode lower"),
                       row("contrast", 2.0, math.nan, math.nan, math.nan, "equivalent within \u00b10.02"),
                       dict(row("both", 1.0, 9.0, 8.0, 10.0, "train mode higher"), view="normalized")])
    R = findings.rate_findings(lv)
    assert (R["rate_n"], R["rate_n_point_only"], R["rate_n_above_1"], R["rate_n_above_1_ci"],
            R["rate_n_above_1_paid"]) == (3, 1, 2, 0, 0)
    assert R["rate_above_1_levels"] == ("brightness 0.5: 1.39 [0.70, 2.90], equivalent within \u00b10.02; "
                                        "noise 3: 1.48 (point estimate only), not decided")
    reading = lambda R: said("rate_above_1_reading", None, numbers_table(R))  # noqa: E731  (the note's rule)
    assert "none shows that drifting pays" in reading(R)
    paid = findings.rate_findings(pd.DataFrame([row("both", 0.25, 2.0, 1.5, 2.6, "train mode higher")]))
    assert paid["rate_n_above_1_ci"] == 1 and reading(paid).startswith("at 1 of them")
    assert reading(findings.rate_findings(lv.iloc[2:3])) == "no break-even rate lies above 1"


# --- the page (issue 25): the answer and every findings-chosen sentence follow the data ----------------------------

def _swap_modes(df):
    """The same table with train_mode's and backbone_eval's accuracies swapped in every seed and shift: each
    difference train_mode - backbone_eval changes sign, so every headline verdict flips."""
    out = df.copy()
    keys = [k for k in findings.PAIR_KEYS if k in out.columns]
    tm, pn = out["mode"].eq("train_mode"), out["mode"].eq("backbone_eval")
    cols = ["task_a_after", "task_b"]
    a = out[tm].set_index(keys)[cols]
    b = out[pn].set_index(keys)[cols]
    out.loc[tm, cols] = b.reindex(out[tm].set_index(keys).index).to_numpy()
    out.loc[pn, cols] = a.reindex(out[pn].set_index(keys).index).to_numpy()
    return out


def _page(C, F):
    return findings.page_texts(C, F)


def test_answer_and_chosen_sentences_flip_when_the_data_do():
    df = SHARED_TABLES["ten"]()
    C, F = shared_findings("ten")
    CG, G = analyse(_swap_modes(df), n_boot=20, n_boot_select=20)
    nF, nG = count_verdicts(findings.view_claims(C, "raw")), count_verdicts(findings.view_claims(CG, "raw"))
    assert (nF["higher"], nF["lower"]) == (nG["lower"], nG["higher"]) and nF["lower"] != nF["higher"]
    assert (number(F, "n_higher_raw"), number(F, "n_lower_raw")) == (nF["higher"], nF["lower"])
    # chapter 1's shift: train mode lower (net -0.1) on the data, higher once swapped; the answer cites that claim
    assert claim(C, "at_t1_both_raw")["verdict"] == "train mode lower"
    assert claim(CG, "at_t1_both_raw")["verdict"] == "train mode higher"
    box = _markdown_cells()[0]
    assert "their sum reads\n{glue:text}`ch03_at_t1_both_raw_estimate:+.3f`" in box
    assert "{glue:md}`ch03_at_t1_both_raw_verdict`" in box
    # task A's difference is printed as train_mode - backbone_eval: negative on the data (-0.300), positive swapped
    assert "task A's accuracy by\n{glue:text}`ch03_task_a_t1_family_mean:+.3f`" in box
    assert number(F, "task_a_t1_family").mean == pytest.approx(-0.3)
    assert number(G, "task_a_t1_family").mean == pytest.approx(0.3)
    # the count sentence follows the counts: a direction shown below zero on the data, above it swapped
    below = r"\b{} (?:of the \d+ shifted levels )?shows? the sum below zero"
    assert re.search(below.format(nF["lower"]), _page(C, F)["counts_sentence"])
    assert re.search(below.format(nG["lower"]), _page(CG, G)["counts_sentence"])
    assert re.search(rf"\b{nG['higher']} (?:of the \d+ shifted levels )?shows? the sum above",
                     _page(CG, G)["counts_sentence"])
    # the mismatch note: KL ranks the shifts by task A's loss on the data; swapped, the loss is a gain
    assert number(F, "rho_kl_rho") > 0 > number(G, "rho_kl_rho")
    assert said("mismatch_rank", C, F).endswith("ranks the shifts by task A's loss")
    assert said("mismatch_rank", CG, G).endswith("ranks the shifts against task A's loss")
    # every findings-chosen sentence that states an outcome differs once the data flip
    for key in ("counts_sentence", "mismatch_rank"):   # the lead: its flip test below (both counts > 0 here)
        assert _page(C, F)[key] != _page(CG, G)[key], key


def _counted(F, higher, lower):
    """``F`` with the raw view's counts of printed verdicts set by hand (the notes' rules read them)."""
    return with_numbers(F, {"n_higher_raw": higher, "n_lower_raw": lower})


@pytest.mark.parametrize("higher, lower, vs0, starts", [
    (0, 5, 0, "no shift in the sweep was shown to favour drifting statistics"),
    (0, 0, 0, "no shift in the sweep was shown to favour drifting statistics"),
    (3, 0, 0, "drifting statistics were shown to pay at 3 level-views"),
    (2, 4, 1, "drifting statistics were shown to pay at 3 level-views"),
    (0, 4, 2, "drifting statistics were shown to pay at 2 level-views"),
])
def test_favour_is_chosen_by_the_counts_of_printed_verdicts(higher, lower, vs0, starts):
    C, F = shared_findings("ten")
    F = with_numbers(_counted(F, higher, lower), {"n_higher_vs_no_shift": vs0})
    assert said("favour", C, F) == starts     # the note of each outcome, and only it, holds


@pytest.mark.parametrize("higher, lower, starts", [
    (0, 5, "**No.** On the seed's protocol (one head rate for both paths, not tuned per path), at no shift tested was a net gain "
            "shown for drifting statistics (the new task's gain against the old one's cost)"),
    (0, 0, "**Not shown either way.** On the seed's protocol (one head rate for both paths, not tuned per path), "),
    (3, 0, "**Yes, at some shifts.** On the seed's protocol (one head rate for both paths, not tuned per path), "),
    (2, 4, "**It depends on the shift.** On the seed's protocol (one head rate for both paths, not tuned per path), "),
])
def test_the_answers_plain_lead_is_chosen_by_the_counts_of_printed_verdicts(higher, lower, starts):
    """Issue 37: the answer box opens with one plain sentence, a note per outcome of the raw view's counts."""
    C, F = shared_findings("ten")
    assert said("lead", C, _counted(F, higher, lower)).startswith(starts)


@pytest.mark.parametrize("lo, hi, ends", [
    (0.2, 0.9, "ranks the shifts by task A's loss"),
    (-0.9, -0.2, "ranks the shifts against task A's loss"),
    (-0.3, 0.8, "was not shown to rank the shifts by task A's loss"),
    (math.nan, math.nan, "was not shown to rank the shifts by task A's loss"),
])
def test_mismatch_rank_is_chosen_by_the_kl_rank_correlations_interval(lo, hi, ends):
    C, F = shared_findings("ten")
    F = with_numbers(F, {"rho_kl_lo": lo, "rho_kl_hi": hi})
    assert said("mismatch_rank", C, F) == "A statistics mismatch measured before any training (KL, eval pass) " + ends


def test_threshold_dependence_is_chosen_by_whether_the_crossing_lines_differ_between_tie_thresholds():
    """Referee 03 (point 2): whether the crossing lines depend on the tie threshold is a note on the numbers table."""
    C, F = shared_findings("ten")
    keys = ["threshold_lines_raw_thr" + _slug(f"{t:g}") for t in findings.TIE_THRESHOLDS]
    same = with_numbers(F, {k: "**none**" for k in keys})
    differ = with_numbers(same, {keys[0]: "brightness and both"})
    assert said("threshold_dependence", C, same) == \
        "So which lines cross is the same at every tie threshold of the table"
    assert said("threshold_dependence", C, differ) == "So which lines cross depends on the tie threshold"


def test_the_cost_benefit_takeaway_cites_the_counts_of_printed_verdicts():
    """The figures' takeaway is one fixed sentence citing the raw view's counts (true for any outcome), in both
    captions that state it."""
    takeaway = ("By its corrected interval ({numref}`tbl-ch03-levels`), the sum in accuracy points lies below zero at\n"
                "{glue:text}`ch03_n_lower_raw:,.0f` of the {glue:text}`ch03_m_tests:,.0f` levels and above zero at "
                "{glue:text}`ch03_n_higher_raw:,.0f` of them.")
    assert sum(md.count(takeaway) for md in _markdown_cells()) == 2


def test_counts_are_the_printed_bonferroni_verdicts():
    from bnstudy.study.inference import count_verdicts
    C, F = shared_findings("ten")
    for view in findings.VIEWS:
        vc = findings.view_claims(C, view)
        n = count_verdicts(vc)
        # read off the printed intervals, not off Holm's p
        assert (n["lower"], n["higher"]) == (int((vc["high"] < 0).sum()), int((vc["low"] > 0).sum()))
        assert n["m"] == number(F, "m_tests")
        assert tuple(number(F, f"n_{k}_{_slug(view)}") for k in ("lower", "higher", "equivalent", "not_decided")) == \
            (n["lower"], n["higher"], n["equivalent"], n["not decided"])


def test_page_values_print_task_a_as_train_mode_minus_backbone_eval_clipped():
    from bnstudy.study.pages import numbers_items
    C, F = shared_findings("ten")
    v = {k: number(F, k) for k in F["key"] if k.startswith("task_a_")}
    assert v["task_a_t1"].mean == pytest.approx(-number(F, "cost_t1").mean) and v["task_a_t1"].mean < 0
    assert v["task_a_t1"].low <= v["task_a_t1"].mean <= v["task_a_t1"].high
    assert v["task_a_grid_corner"] == pytest.approx(-number(F, "grid_cost_corner"))
    # printed cut to what accuracy allows; the numbers table keeps the raw interval
    g = dict(numbers_items("ch03", with_numbers(F, {"task_a": {"t1": findings.Interval(-0.9, -1.6, -0.2, 3)}})))
    assert (g["ch03_task_a_t1_ci_low"], g["ch03_task_a_t1_ci_high"]) == (-1.0, -0.2)
    wide = findings.task_a_difference(findings.Interval(0.9, 0.2, 1.6, 3)).clipped(-1, 1)
    assert (wide.low, wide.high) == (-1.0, -0.2)


def test_threshold_sentence_is_chosen_by_whether_the_groups_overlap():
    C, F = shared_findings("cfg")
    clean = with_numbers(F, dict(winner_threshold_clean="do not overlap", winner_safe_max=0.01, winner_harm_min=0.5))
    mixed = with_numbers(F, dict(winner_threshold_clean="overlap", winner_safe_max=0.6, winner_harm_min=0.5))
    one_side = with_numbers(F, dict(winner_safe_max=0.01, winner_harm_min=math.nan))
    assert said("threshold_sentence", C, clean).startswith("On these shifts a value")
    assert said("threshold_sentence", C, mixed).startswith("No value of it separates")
    assert said("threshold_sentence", C, one_side).startswith("The sweep has shifts on only one side")


# --- the notebook: no typed outcome outside glue ------------------------------------------------------------------

NOTEBOOK = Path(__file__).resolve().parents[1] / "chapters" / "03_shift_strength.ipynb"
#: Words that state an outcome; the page may only show them through glue (verdicts, chosen sentences).
OUTCOME_WORDS = (*findings.DIRECTIONS, "equivalent within", "not decided", "too few seeds", "costs more", "costs less",
                 "destroyed", "no break", "only at t")


def _prose(text: str) -> str:
    """Markdown without glue roles, math, inline code and directive option lines: what the page types itself."""
    text = re.sub(r"\{glue:(?:text|md|any)\}`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\$[^$]*\$", " ", text)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"^:[a-z]+:.*$", " ", text, flags=re.M)
    return re.sub(r"^`{3,}.*$", " ", text, flags=re.M)


def _markdown_cells():
    nb = json.loads(NOTEBOOK.read_text())
    return [("".join(c["source"])) for c in nb["cells"] if c["cell_type"] == "markdown"]


def test_notebook_markdown_types_no_outcome_words():
    hits = [(w, i) for i, md in enumerate(_markdown_cells()) for w in OUTCOME_WORDS if w in _prose(md).lower()]
    assert not hits, f"typed outcome words outside glue (word, markdown cell): {hits}"


def test_notebook_markdown_types_no_decimal_numbers():
    # a decimal in the prose is a result or a setting typed by hand: glue it (settings too, so a rerun stays true)
    hits = [(m, i) for i, md in enumerate(_markdown_cells()) for m in re.findall(r"\d+\.\d+", _prose(md))]
    assert not hits, f"typed decimals outside glue (number, markdown cell): {hits}"


def test_typed_outcome_checks_can_fail():
    assert "train mode lower" in _prose("the sum reads train mode lower at 3 levels").lower()
    assert re.findall(r"\d+\.\d+", _prose("with p = 0.872 beside {glue:text}`ch03_x:.3f`")) == ["0.872"]
    assert not re.findall(r"\d+\.\d+", _prose("{glue:text}`ch03_x:.3f` and $t = 0.5$"))


def test_answer_box_comes_first_and_glues_the_answer():
    first = _markdown_cells()[0]
    title, rest = first.split("\n", 1)
    assert title.startswith("# ") and rest.lstrip().startswith("```{admonition} The answer\n:class: answer")
    box = rest.split("\n```\n", 1)[0]
    for key in ("lead", "at_t1_both_raw_verdict", "counts_sentence", *(f"weakest_raw_{t}_verdict" for t in run.LINES),
                "mismatch_rank", "indistinct"):
        assert f"{{glue:md}}`ch03_{key}`" in box, key
    assert "`bnstudy.pin_eval(" in box   # the box (longer now that it cites its numbers) says what to do
    nb = json.loads(NOTEBOOK.read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            tags = c["metadata"].get("tags", [])
            assert "show-code" not in tags and ({"remove-input", "remove-cell"} & set(tags)), tags


def test_the_sensitivity_beside_the_answer_quotes_the_margin_counts_and_the_crossings_at_every_threshold():
    """Issue 35 (point 4): the answer box shows how its verdicts move with the margin and the tie threshold, every
    number glued from the numbers table (so a changed count or crossing changes the sentence)."""
    C, F = shared_findings("ten")
    box = " ".join(_markdown_cells()[0].split("**What to do.**")[0].split())
    for m in findings.MARGINS:
        for kind in ("lower", "equivalent"):
            key = f"margin_counts_raw_m{_slug(f'{m:g}')}_{kind}"
            assert f"{{glue:text}}`ch03_{key}:,.0f`" in box and number(F, key) >= 0, key
    for t in findings.TIE_THRESHOLDS:
        key = "threshold_lines_raw_thr" + _slug(f"{t:g}")
        assert f"{{glue:md}}`ch03_{key}`" in box and number(F, key), key
    assert box.count("(the page's threshold)") == 1
    assert "{glue:md}`ch03_threshold_lines_raw_thr0_01` (the page's threshold)" in box
    assert "{glue:md}`ch03_threshold_dependence`" in box    # referee 03: whether the crossings move is a note
    assert number(F, "min_effect") == 0.01
    assert _page(C, F)["thresholds_text"] == "0, 0.005, 0.01 and 0.02"


# --- a maintainer adding a line (stop 53: a helper followed docs/chapter-code.md and added a gamma line) ------------

def test_rows_from_before_a_line_was_designed_read_as_not_on_it():
    """The release's rows have no ``on_<line>`` / ``s_<line>`` columns of a line added later: the page read them with
    a KeyError. The kind: any line of LINES missing from older rows."""
    eff = pd.DataFrame({"on_both": [True, False], "s_both": [1.0, float("nan")]})
    assert findings._present_lines(eff) == ["both"]
    for line in run.LINES:
        s = findings.strength_of(eff, line)
        assert len(s) == 2 and (line == "both" or s.isna().all())


def test_every_line_has_its_words_colour_and_marks_and_the_run_line_names_it():
    """A line forgotten in one of these used to fall back silently (a grey mark, the x label "strength", a run line
    without it)."""
    assert set(figures.LINE_XLABELS) == set(run.LINES)
    assert set(run.LINES) <= set(figures.CH3_KIND_MARKS)
    assert all(color != "0.5" for _, color, _ in figures.CH3_KIND_MARKS.values())
    line = run.make_config("full").describe()
    words = {"brightness": "brightness", "contrast": "contrast", "both": "both t", "blur": "blur",
             "noise": "added noise", "same_both": "same classes: both t", "same_noise": "added noise"}
    assert all(words.get(t, t) in line for t in run.LINES)


def test_a_design_without_budget_check_or_grid_draws_a_figure_that_says_so():
    import matplotlib.pyplot as plt
    for fig in (figures.ch3_budget_points(pd.DataFrame(columns=["t"])),
                figures.ch3_heatmaps(pd.DataFrame(columns=["brightness", "contrast", "metric"]))):
        assert any(t.get_text().startswith("not run: ") for ax in fig.axes for t in ax.texts)
        plt.close(fig)
