"""Chapter 6 (bnstudy.study.experiments.unknown_task: run, findings, figures): config checks, one tiny unit, findings on
hand-made tables."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnstudy.study.config import SourceConfig
from bnstudy.study.engine import train_source
from bnstudy.study.experiments.unknown_task import figures, findings, run
from bnstudy.study.inference import Interval, number, with_numbers


def test_shift_of_task_b_is_chapter_3s_both_line():
    assert run.shift_of("B", 1.0) == (4.0, 5.0)
    assert run.shift_of("C", 0.5) == (-2.0, 3.0)
    assert run.shift_of("D", 1.0) == (0.0, 0.2)
    assert run.shift_of("A", 1.0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="strength"):
        run.shift_of("B", -1.0)


@pytest.mark.parametrize("override, match", [
    (dict(strengths=(0.0, 1.0)), "strengths"),
    (dict(strengths=(0.0, 1.0, 0.5)), "increasing"),
    (dict(n_eval=100), "n_eval"),
    (dict(n_tasks=(5,)), "n_tasks"),
    (dict(temperature=0), "temperature"),
    (dict(router_samples=32), "router_samples"),
    (dict(seeds=1), "seeds"),
])
def test_config_rejects_bad_values_naming_the_parameter(override, match):
    with pytest.raises(ValueError, match=match):
        run.make_config("quick", **override)


def test_profiles_build_and_full_has_ten_seeds():
    assert len(run.make_config("full").seeds) >= 10
    assert len(run.make_config("full").strengths) >= 3
    assert run.make_config("quick").inference_batches == (1, 2, 8, 32)


@pytest.fixture(scope="module")
def tiny_unit():
    src = train_source(SourceConfig(seed=0, stage1_steps=5, n_eval=16))
    u = run.UnitConfig(seed=0, n_tasks=2, strength=1.0, steps=3, n_eval=8, router_samples=8, inference_batches=(1, 2),
                      temperature=0.1, noise=3.0, momentum=0.1, lr=0.05, batch_size=8, n_classes=10,
                      check_temperatures=(1.0,))
    return run.run_unit(u, src)


def test_old_task_logits_bit_identical_under_the_oracle(tiny_unit):
    assert tiny_unit["oracle_logit_change"] == 0


def test_unit_records_every_condition_task_and_batch(tiny_unit):
    rec = pd.DataFrame(tiny_unit["records"])
    assert set(rec.condition) == set(run.CONDITIONS) | {"mixture_tau=1"}
    assert len(rec) == 2 * 2 * len(run.CONDITIONS) + 2  # the checked temperature: b = 1 only, per task
    assert (rec[rec.condition == "mixture_tau=1"].inference_batch == 1).all()
    assert (rec[rec.condition == "mixture"].temperature == 0.1).all()
    assert (rec[rec.condition == "oracle"].routing_accuracy == 1).all()
    assert rec[rec.condition.isin(["train_mode", "pinned"])].routing_accuracy.isna().all()
    # with two tasks the shared drifting statistics are the last bank: task B under train_mode == oracle
    b = rec[(rec.task == "B")].set_index(["condition", "inference_batch"]).accuracy
    assert b["train_mode", 1] == b["oracle", 1]


def _table():
    """Hand-made results: 3 seeds, 2 tasks, strengths 0 / 0.01 / 1, inference batches 1 and 32.

    Routing accuracy: 0.5 at t = 0; 0.6 at t = 0.01 with b = 1 but 1.0 with b = 32; 1.0 at t = 1.
    Accuracy: oracle 0.8 (+ seed jitter); every router equals it except the mixture at t = 1, b = 1
    (0.1 lower); train_mode 0.3 lower at t = 1 on average (task A 0.6 lower, task B its own bank);
    pinned 0.2 lower at t = 1. Routed head: nearest_first at t = 0.01, b = 1 loses 0.2 on task A.
    """
    recs = []
    for seed in range(3):
        jit = 0.001 * seed
        for t in (0.0, 0.01, 1.0):
            for b in (1, 32):
                for task in ("A", "B"):
                    for cond in run.CONDITIONS:
                        acc = 0.8 + jit
                        route = math.nan if cond in ("train_mode", "pinned") else (
                            1.0 if cond == "oracle" else 0.5 if t == 0 else (0.6 if b == 1 else 1.0) if t == 0.01
                            else 1.0)
                        if cond == "mixture" and t == 1.0 and b == 1:
                            acc -= 0.1 + 0.01 * seed
                        if cond == "train_mode" and t == 1.0 and task == "A":
                            acc -= 0.6 + 0.02 * seed
                        if cond == "pinned" and t == 1.0:
                            acc -= 0.2 + 0.01 * seed
                        routed = acc
                        if cond == "nearest_first" and t == 0.01 and b == 1 and task == "A":
                            routed = acc - 0.2 - 0.01 * seed
                        recs.append(dict(seed=seed, n_tasks=2, strength=t, task=task, condition=cond,
                                         inference_batch=b, routing_accuracy=route, accuracy=acc,
                                         accuracy_routed_head=routed, oracle_logit_change=0.0))
    return pd.DataFrame(recs)


def test_findings_on_a_hand_made_table():
    f = findings.findings(_table())
    assert number(f, "n_seeds") == 3 and number(f, "gentle") == 0.01 and number(f, "strong") == 1.0 and number(f, "zero") == 0.0 and number(f, "b1") == 1 and number(f, "bmax") == 32
    assert number(f, "route_gentle_b1_k2_nearest_first").mean == pytest.approx(0.6)
    assert number(f, "route_gentle_bmax_k2_nearest_first").mean == pytest.approx(1.0)
    assert number(f, "route_diff_gentle_b1_k2_classifier").mean == pytest.approx(0.0)
    # routing "works" where the page's family interval (6 comparisons) is above 0.9: 1.0 at t = 1 (b = 1), from
    # t = 0.01 with b = 32
    assert number(f, "works_from_b1_k2") == 1.0 and number(f, "works_from_bmax_k2") == 0.01
    assert number(f, "route_at_works_b1_k2").mean == pytest.approx(1.0)
    # wrong-bank differences (condition minus oracle): only at t = 1, so detectable from 1 on, nothing below routing
    assert number(f, "wrong_from_train_k2") == 1.0 and number(f, "wrong_from_pinned_k2") == 1.0
    assert number(f, "wrong_at_train_k2").mean == pytest.approx(-0.31) and number(f, "wrong_at_train_k2").high < 0
    assert number(f, "wrong_below_routing_k2") == pytest.approx(0.0)
    assert number(f, "wrong_from_train_text_k2").startswith("from t = 1 on (-0.3100, 99.17% interval")
    assert (number(f, "threshold_m"), number(f, "threshold_confidence")) == (6, pytest.approx(100 * (1 - 0.05 / 6)))
    assert number(f, "cost_after_routing") is True
    assert number(f, "train_task_a_k2").mean == pytest.approx(-0.62)
    # fully task-unknown at t = 0: routing at chance, but every head equals the oracle's here
    assert number(f, "routed_zero_b1_k2").mean == pytest.approx(0.0)
    assert number(f, "routed_task_a_gentle_b1_k2").mean == pytest.approx(0.591)
    assert number(f, "oracle_task_a_k2").mean == pytest.approx(0.801)
    assert (number(f, "worst_router"), number(f, "worst_strength"), number(f, "worst_batch"), number(f, "worst_n_tasks")) == ("mixture", 1.0, 1, 2)
    w = findings.worst_cell(findings.cell_tests(_table())).iloc[0]
    assert w.key == "worst_cell" and w.estimate == pytest.approx(-0.11)
    # 24 cells, one family: the mixture's -0.11 (SD 0.01, 3 seeds) has a Bonferroni interval at 1 - 0.05/24 wide
    # enough to reach past zero (t quantile about 21.9 with 2 degrees of freedom): no direction, not equivalent
    assert number(f, "n_cells") == 4 * 3 * 2 and number(f, "cells_confidence") == pytest.approx(100 * (1 - 0.05 / 24))
    assert w.verdict == "not decided" and w.low < 0 < w.high and w.p_adjusted >= w.p
    with pytest.raises(ValueError, match="worst_cell needs"):
        findings.worst_cell(findings.cell_tests(_table()).iloc[:0])
    assert number(f, "n_lower") == 0 and number(f, "n_higher") == 0 and number(f, "n_not_decided") == 1
    assert number(f, "n_equivalent") == number(f, "n_cells") - 1 and number(f, "n_equivalent_half") == number(f, "n_cells") - 1
    assert number(f, "oracle_new_tasks_k2").mean == pytest.approx(0.801)
    assert number(f, "max_bound_hard") == pytest.approx(0.0)
    # routing exactly at chance (0.5 with two tasks, no spread) at t = 0 is never shown above it
    assert (number(f, "n_chance_cells"), number(f, "n_above_chance")) == (4 * 2, 0)


def test_claims_on_a_hand_made_table_are_condition_minus_oracle_in_one_family():
    from bnstudy.study import inference
    c = findings.claims(_table()).set_index("key")
    comparisons = ["train_vs_oracle_k2", "pinned_vs_oracle_k2", "mixture_vs_oracle_k2", "router_vs_oracle_k2",
                   "routed_gentle_b1_k2", "routed_gentle_bmax_k2"]
    assert list(c.index) == comparisons + ["oracle_exact", "train_is_last_bank", "perfect_at_strong"]
    settings = findings.page_settings(run.make_config("quick"), c.reset_index())
    assert (settings["claims_m"], settings["claims_confidence"]) == (6, pytest.approx(100 * (1 - 0.05 / 6)))
    # train mode: -0.3 - 0.01 * seed (task A -0.6, task B its own bank): a Bonferroni interval at 1 - 0.05/6 below 0
    assert c.loc["train_vs_oracle_k2", "estimate"] == pytest.approx(-0.31)
    assert c.loc["train_vs_oracle_k2", "confidence"] == pytest.approx(1 - 0.05 / 6)
    assert c.loc["train_vs_oracle_k2", "verdict"] == "train mode lower"
    assert c.loc["pinned_vs_oracle_k2", "verdict"] == "pinned lower"
    assert c.loc["pinned_vs_oracle_k2", "estimate"] == pytest.approx(-0.21)
    assert c.loc["mixture_vs_oracle_k2", "verdict"] == "mixture lower"
    # identical to the oracle in every seed: zero spread, inside the margin
    assert c.loc["router_vs_oracle_k2", "verdict"] == "equivalent within ±0.02"
    assert c.loc["routed_gentle_b1_k2", "estimate"] == pytest.approx(-0.105)
    assert c.loc["routed_gentle_b1_k2", "verdict"] == "routed head lower"
    assert c.loc["routed_gentle_bmax_k2", "verdict"] == "equivalent within ±0.02"
    assert (c.loc[["oracle_exact", "train_is_last_bank", "perfect_at_strong"], "verdict"] == "exact, checked ==").all()
    assert all(inference.is_verdict(v, findings.DIRECTIONS) for v in c.verdict)
    # Holm over the comparisons only: the checks have no p-value
    assert c.loc[comparisons, "p_adjusted"].notna().all() and c.loc["oracle_exact", "p_adjusted"] != c.loc[
        "oracle_exact", "p_adjusted"]
    # one seed: too few seeds, never equivalent
    one = findings.claims(_table().query("seed == 0")).set_index("key")
    assert (one.loc[comparisons, "verdict"] == "too few seeds").all()


def test_findings_see_a_cost_before_routing_works():
    df = _table()
    hit = (df.condition == "train_mode") & (df.strength == 0.01) & (df.task == "A")
    df.loc[hit, "accuracy"] -= 0.1 + 0.01 * df.loc[hit, "seed"]
    f = findings.findings(df)
    assert number(f, "wrong_from_train_k2") == 0.01
    assert number(f, "cost_after_routing") is False
    no_cost = _table()
    no_cost = no_cost[~no_cost.condition.isin(["train_mode"])]
    no_cost = pd.concat([no_cost, _table().query("condition == 'train_mode'").assign(accuracy=lambda d: 0.8 + 0.001 * d.seed)])
    assert number(findings.findings(no_cost), "wrong_from_train_text_k2") == "at no strength tested"
    assert number(f, "wrong_below_routing_k2") < -0.05


def test_thresholds_are_read_off_the_pages_family_intervals_not_95_percent_ones():
    """Issue 35: a cost and a routing rate shown by a 95% interval but not by the page's family interval (6
    comparisons here, 3 seeds: t quantile 4.3 against about 10.9) count for neither threshold, so the cost no longer
    comes before routing, and the note that says which comes first flips with it."""
    df = _table()
    hit = (df.condition == "train_mode") & (df.strength == 0.01) & (df.task == "A") & (df.inference_batch == 1)
    df.loc[hit, "accuracy"] -= 0.2 + 0.04 * df.loc[hit, "seed"]  # seed means -0.1, -0.12, -0.14: 95% below zero only
    route = (df.condition == "nearest_first") & (df.strength == 0.01) & (df.inference_batch == 1)
    df.loc[route, "routing_accuracy"] = 0.94 + 0.01 * df.loc[route, "seed"]  # 95% lower end 0.925, family's 0.887
    from bnstudy.study.inference import decide, t_interval
    diffs = np.array([-0.1, -0.12, -0.14])
    assert decide(diffs).kind == "lower" and t_interval([0.94, 0.95, 0.96]).low > 0.9  # the old rule: both shown
    cells = findings.cell_tests(df)
    f, c = findings.findings(df, cells), findings.claims(df)
    assert number(f, "wrong_from_train_k2") == 1.0 and number(f, "works_from_b1_k2") == 1.0
    assert number(f, "route_at_works_b1_k2").low > 0.9 and number(f, "wrong_at_train_k2").high < 0
    assert number(f, "cost_after_routing") is True and findings.cost_before_routing(f) == []
    assert findings.page_words(f, cells, c)["cost_vs_routing_text"].startswith("With two tasks, each wrong-bank cost")
    # the flip: the same cost with a tight spread is shown at the family's level too, below where routing works
    df.loc[hit, "accuracy"] = 0.8 + 0.001 * df.loc[hit, "seed"] - 0.2 - 0.002 * df.loc[hit, "seed"]
    f = findings.findings(df)
    assert number(f, "wrong_from_train_k2") == 0.01 and findings.cost_before_routing(f) == [("train", 2)]
    assert findings.page_words(f, findings.cell_tests(df), c)["cost_vs_routing_text"] == (
        "Not everywhere does the cost wait for routing: the cost of train mode with two tasks is shown (at the page's "
        "family level) below the strength from which per-sample routing works.")


def test_checks_detect_a_broken_oracle_and_findings_missing_conditions():
    df = _table()
    df.loc[0, "oracle_logit_change"] = 1e-7
    c = findings.claims(df).set_index("key")
    assert c.loc["oracle_exact", "verdict"] == "not exact" and c.loc["oracle_exact", "estimate"] == pytest.approx(1e-7)
    assert c.loc["train_is_last_bank", "verdict"] == "exact, checked =="
    with pytest.raises(ValueError, match="mixture"):
        findings.findings(df[df.condition != "mixture"])
    # the page cites the code's identities by their claims (verdict and largest difference): they flip with the checks
    off = _table()
    off.loc[(off.condition == "train_mode") & (off.task == "B") & (off.n_tasks == 2), "accuracy"] += 0.01
    last = findings.claims(off).set_index("key").loc["train_is_last_bank"]
    assert last.verdict == "not exact" and last.estimate == pytest.approx(0.01)
    four = _table()
    four.loc[four.n_tasks == 2, "n_tasks"] = 4
    assert findings.claims(four).set_index("key").loc["train_is_last_bank", "n"] == 0  # no run with two tasks
    with pytest.raises(ValueError, match="mixture"):
        findings.claims(df[df.condition != "mixture"])


def test_routing_above_chance_is_a_one_sided_test_at_the_bonferroni_level_over_the_cells():
    df = _table()
    zero = (df.strength == 0.0) & df.condition.isin(run.ROUTERS)
    df.loc[zero, "routing_accuracy"] = 0.7 + 0.01 * df.loc[zero, "seed"]
    f = findings.findings(df)
    assert (number(f, "n_chance_cells"), number(f, "n_above_chance")) == (8, 8)
    assert findings.page_words(f, findings.cell_tests(df), findings.claims(df))["zero_shift_text"] == (
        "which lets every router do better than chance (1/K) at every inference batch size")
    # barely above chance in one cell (mean 0.51, SD 0.01, 3 seeds: one-sided p about 0.11): not shown there
    one = zero & (df.condition == "classifier") & (df.inference_batch == 32)
    df.loc[one, "routing_accuracy"] = 0.5 + 0.01 * df.loc[one, "seed"]
    g = findings.findings(df)
    assert number(g, "n_above_chance") == 7
    assert "7 of the 8 cells are shown above it" in findings.page_words(g, findings.cell_tests(df), findings.claims(df))["zero_shift_text"]


def test_the_batch_effect_note_says_whether_larger_batches_route_the_gentlest_shift_more_often():
    """The sentence after the gentlest shift's routing accuracies flips with them: larger batches routing more
    often with every task count, or not (the mechanism, pooling shrinks noise, is said either way)."""
    df = _table()
    gentle = df.strength == df.strength[df.strength > 0].min()
    for batch, acc in ((1, 0.6), (df.inference_batch.max(), 0.9)):
        df.loc[gentle & (df.inference_batch == batch) & (df.condition == "nearest_first"), "routing_accuracy"] = acc
    words = lambda d: findings.page_words(findings.findings(d), findings.cell_tests(d), findings.claims(d))  # noqa
    assert words(df)["batch_effect_text"].endswith("and here the larger batches route the gentlest shift more "
                                                   "often on average with every task count")
    df.loc[gentle & (df.inference_batch == 1) & (df.condition == "nearest_first"), "routing_accuracy"] = 0.95
    assert "yet here the larger batches do not route" in words(df)["batch_effect_text"]


def test_tidy_tables_have_one_row_per_seed_and_cell():
    df = _table()
    assert len(_routes(df)) == 3 * 3 * 2 * 4
    g = findings.gap_table(df)
    row = g[(g.condition == "train_mode") & (g.strength == 1.0) & (g.inference_batch == 1)].iloc[0]
    assert row["mean"] == pytest.approx(-0.31)
    # baselines make no routing decision: kept at the smallest inference batch only
    assert set(g[g.condition.isin(findings.BATCH_FREE)].inference_batch) == {1}
    assert set(findings.seed_table(df, ["accuracy", "accuracy_routed_head"]).query("condition == 'pinned'").inference_batch) == {1}
    assert len(findings.per_task_table(df)) == 3 * 2 * 2 * 5 + 3 * 2 * 2  # 5 conditions at 2 batches, 2 at one
    r = findings.gap_table(df, "accuracy_routed_head", run.ROUTERS)
    assert len(r) == 3 * 2 * 4
    cell = r[(r.condition == "nearest_first") & (r.strength == 0.01) & (r.inference_batch == 1)].iloc[0]
    assert cell["mean"] == pytest.approx(-0.105)


def _routes(df):
    return findings.seed_table(df, ["routing_accuracy"], run.ROUTERS)


def _temperature_table():
    recs = []
    for seed in range(3):
        for t in (0.1, 1.0):
            for task in ("A", "B"):
                base = dict(seed=seed, n_tasks=4, strength=t, task=task, inference_batch=1, routing_accuracy=1.0,
                            accuracy_routed_head=math.nan, oracle_logit_change=0.0)
                recs.append(dict(base, condition="oracle", accuracy=0.8, temperature=math.nan))
                recs.append(dict(base, condition="mixture", accuracy=0.8 - 0.01 * t - 0.001 * seed,
                                 temperature=0.1))
                recs.append(dict(base, condition="mixture_tau=1", accuracy=0.8 - 0.1 * t - 0.001 * seed,
                                 temperature=1.0))
    return pd.DataFrame(recs)


def test_temperature_table_and_findings_on_a_hand_made_table():
    t = findings.temperature_table(_temperature_table())
    assert len(t) == 2 * 2
    row = t[(t.temperature == 1.0) & (t.strength == 1.0)].iloc[0]
    assert row["mean"] == pytest.approx(-0.101)
    f = findings.temperature_findings(_temperature_table(), 0.1)
    assert number(f, "best") == 0.1 and number(f, "kept") == 0.1 and (number(f, "seed_first"), number(f, "seed_last"), number(f, "n_seeds")) == (0, 2, 3)
    # at tau = 0.1 the mixture is 0.001 - 0.011 lower with SD 0.001: shown lower at t = 1 (family of 2 strengths)
    assert number(f, "best_m") == 2 and not number(f, "best_no_direction")
    assert number(f, "worst_tau_1").mean == pytest.approx(-0.101)
    assert number(f, "worst_tau_0_1").mean == pytest.approx(-0.011)
    with pytest.raises(ValueError, match="kept temperature"):
        findings.temperature_findings(_temperature_table(), 0.3)


def test_temperature_check_uses_held_out_seeds_only():
    cfg = run.make_config("quick")
    check = run.temperature_check_config(cfg)
    assert not set(check.seeds) & set(cfg.seeds)
    assert check.n_tasks == (4,) and check.inference_batches == (1,) and check.check_temperatures
    assert check.steps == cfg.steps and check.temperature == cfg.temperature
    assert not set(run.temperature_check_config(run.make_config("full")).seeds) & set(range(10))
    with pytest.raises(ValueError, match="held-out seeds"):  # refused when the config is made, before any run
        run.temperature_check_config(run.make_config("quick", seeds=[10, 11]))


# --- the page's sentences, on hand-made findings and cells -----------------------------------------------------------

def test_findings_check_every_hard_router_and_chance_at_zero():
    f = findings.findings(_table())
    assert [number(f, f"route_strong_min_{r}") for r in ("nearest_first", "nearest_all", "classifier")] == [1.0] * 3
    # at t = 0 the hand-made routers route exactly at chance (0.5 with two tasks): not above it
    assert number(f, "route_zero_b1_k2_nearest_first").mean == pytest.approx(0.5)
    assert number(f, "n_above_chance") == 0
    df = _table()
    df.loc[(df.condition == "classifier") & (df.strength == 1.0) & (df.inference_batch == 32) & (df.seed == 1),
           "routing_accuracy"] = 0.9
    g, c = findings.findings(df), findings.claims(df)
    perfect = c.set_index("key").loc["perfect_at_strong"]
    assert perfect.verdict == "not exact" and perfect.estimate == pytest.approx(0.1)
    assert number(g, "route_strong_min_classifier") == pytest.approx(0.9)
    assert "not every hard router" in findings.page_words(g, findings.cell_tests(df), c)["strong_routing_text"]
    from bnstudy.study.pages import claims_items
    assert str(dict(claims_items("ch06", c))["ch06_perfect_at_strong_verdict"].data) == "**not exact**"


def test_cell_tests_match_the_findings_counts():
    df = _table()
    cells = findings.cell_tests(df)
    assert len(cells) == 4 * 3 * 2 and cells.groupby(["n_tasks", "strength", "inference_batch"]).size().eq(4).all()
    bad = cells[~cells.equivalent]
    assert list(map(tuple, bad[["condition", "strength", "inference_batch"]].to_numpy())) == [("mixture", 1.0, 1)]
    assert bad.verdict.tolist() == ["not decided"] and (cells.confidence == 1 - 0.05 / 24).all()
    assert cells.below.sum() == 0 and cells[cells.condition != "mixture"].bound.max() == pytest.approx(0.0)
    assert (cells.drop(bad.index).verdict == "equivalent within ±0.02").all()
    assert (cells.drop(bad.index).verdict_half == "equivalent within ±0.01").all()
    f = findings.findings(df, cells)
    assert number(f, "n_equivalent") == int(cells.equivalent.sum()) and number(f, "n_lower") == 0
    # a tighter shortfall (SD 0.001): the family interval lies below zero, a direction shown and counted
    tight = _table()
    hit = (tight.condition == "mixture") & (tight.strength == 1.0) & (tight.inference_batch == 1)
    tight.loc[hit, "accuracy"] = 0.7 - 0.001 * tight.loc[hit, "seed"]
    tc = findings.cell_tests(tight)
    assert tc[tc.below].verdict.tolist() == ["mixture lower"] and number(findings.findings(tight, tc), "n_lower") == 1
    below = tc[tc.below].iloc[0]
    assert (below.condition, below.n_tasks, below.strength, below.inference_batch) == ("mixture", 2, 1.0, 1)
    assert number(findings.findings(tight, tc), "n_higher") == 0


def test_works_phrase_names_each_threshold_once():
    both_floor = findings.works_phrase({"k2": 0.01, "k4": 0.01}, 0.01)
    assert both_floor == ("at every non-zero strength tested, for both task counts "
                          "(t ≥ 0.01; the threshold may lie lower)")
    assert findings.works_phrase({"k2": 0.1, "k4": 0.1}, 0.01) == "from t = 0.1 on, for both task counts"
    assert findings.works_phrase({"k2": math.nan, "k4": math.nan}, 0.01) == "at no strength tested, for both task counts"
    assert findings.works_phrase({"k2": 0.01, "k4": 0.03}, 0.0025) == (
        "from t = 0.01 on with two tasks and from t = 0.03 on with four")
    assert findings.works_phrase({"k2": 0.0025, "k4": math.nan}, 0.0025) == (
        "at every non-zero strength tested (t ≥ 0.0025) with two tasks and at no strength tested with four")


def test_equivalence_counts_leave_out_the_cells_equal_by_construction():
    """The page cites the counts of the cells not equal to the oracle by construction (issue 35: the referee's 275
    of 288), at the margin and at half of it, and the cells below and above the oracle."""
    df = _table()
    cells = findings.cell_tests(df)
    f, other = findings.findings(df, cells), cells[~cells.identical]
    assert 0 < number(f, "n_cells_other") == len(other) < len(cells)
    assert number(f, "n_equivalent_other") == int(other.equivalent.sum()) == len(other) - 1  # the mixture's cell
    assert number(f, "n_equivalent_half_other") == int(other.equivalent_half.sum()) < number(f, "n_equivalent_half")
    assert number(f, "half_margin") == run.TOST_MARGIN / 2
    assert (number(f, "n_lower"), number(f, "n_higher")) == (int(cells.below.sum()), int(cells.above.sum())) == (0, 0)


def test_page_settings_give_both_margins():
    s = findings.page_settings(run.make_config("quick"), findings.claims(_table()))
    assert s["ch3_margin"] == 0.02 and "margin_text" not in s


def test_table_routing_writes_three_decimals_everywhere():
    tab = figures.table_routing(_routes(_table()))
    assert list(tab.index) == ["2 tasks, batch 1", "2 tasks, batch 32"]
    assert list(tab.columns) == ["t=0", "t=0.01", "t=1"]
    assert tab.loc["2 tasks, batch 1"].tolist() == ["0.500", "0.600", "1.000"]


def test_phrases_read_for_either_outcome_and_never_clash_with_findings_names():
    from bnstudy.study.pages import claims_items, numbers_items
    df = _table()
    cells = findings.cell_tests(df)
    f, c = findings.findings(df, cells), findings.claims(df)
    p = findings.page_words(f, cells, c)
    names = [n for n, _ in numbers_items("ch06", f)]
    claim_names = [n for t in (c, findings.worst_cell(cells)) for n, _ in claims_items("ch06", t)]
    extra = [f"ch06_{k}" for k in [*findings.page_settings(run.make_config("quick"), c), *p]]
    assert len(set(extra)) == len(extra) and not set(extra) & (set(names) | set(claim_names))
    assert len(set(names) | set(claim_names)) == len(names) + len(claim_names)  # findings and claims never clash
    assert c.set_index("key").loc[["oracle_exact", "train_is_last_bank"], "estimate"].eq(0).all()  # cited as is
    assert p["cost_vs_routing_text"].startswith("With two tasks, each wrong-bank cost")  # one task count here
    assert p["known_head_text"].endswith("pick the bank wherever a wrong bank measurably costs on this grid")
    assert "every hard router (`nearest_first`, `nearest_all` and `classifier`)" in p["strong_routing_text"]
    assert number(f, "nall_worst_k2").mean == 0  # nearest_all equals nearest_first here: cited as the number
    assert p["zero_shift_text"] == ("which is not enough for every router to do better than chance (1/K) at every "
                                    "inference batch size (0 of the 8 cells are shown above it)")
    text = " ".join(p.values())
    for old in ("holds", "tie", "inconclusive", "unresolved", "undetermined", "not resolved", "not separated"):
        assert old not in text
    # a broken check and an early cost are said in words, with the task count
    df2 = _table()
    df2.loc[0, "oracle_logit_change"] = 1e-7
    hit = (df2.condition == "train_mode") & (df2.strength == 0.01) & (df2.task == "A")
    df2.loc[hit, "accuracy"] -= 0.1 + 0.01 * df2.loc[hit, "seed"]
    lose = (df2.condition == "nearest_all") & (df2.strength == 0.01) & (df2.inference_batch == 1)
    df2.loc[lose, "routing_accuracy"] = 0.5 - 0.01 * df2.loc[lose, "seed"]
    p2 = findings.page_words(findings.findings(df2), findings.cell_tests(df2), findings.claims(df2))
    assert findings.claims(df2).set_index("key").loc["oracle_exact", "estimate"] == pytest.approx(1e-7)
    assert p2["cost_vs_routing_text"] == ("Not everywhere does the cost wait for routing: the cost of train mode with "
                                          "two tasks is shown (at the page's family level) below the strength from "
                                          "which per-sample routing works.")
    assert p2["known_head_text"].endswith("but not everywhere a wrong bank measurably costs on this grid")
    from bnstudy.study.sphinxext import inline_markdown
    for texts in (p, p2):  # the guide pastes it across pages, where only bold and italics render
        assert inline_markdown(texts["cost_vs_routing_text"]) is not None, texts["cost_vs_routing_text"]
    worst = number(findings.findings(df2), "nall_worst_k2")  # the page cites it with its interval and strength
    assert (round(worst.mean, 3), round(worst.low, 3), round(worst.high, 3)) == (-0.110, -0.135, -0.085)
    assert number(findings.findings(df2), "nall_worst_t_k2") == 0.01


def test_mixture_notes_flip_with_the_mixture_verdict_and_the_held_out_temperatures():
    c = findings.claims(_table())
    tf = findings.temperature_findings(_temperature_table(), 0.1)
    says = lambda c, tf: findings.notes(findings.MIXTURE_NOTES, c, tf)  # noqa: E731
    assert says(c, tf) == {"mixture_text": "Prefer hard routing to the soft mixture.",
                           "temperature_text": "The held-out temperature check found no temperature better than "
                                               "τ = 0.1."}
    for kind, text in (("not decided", "The soft mixture gains nothing over hard routing."),
                       ("equivalent", "The soft mixture gains nothing over hard routing."),
                       ("higher", "The soft mixture beats the oracle here.")):
        assert says(c.assign(kind=c.kind.where(c.key != "mixture_vs_oracle_k2", kind)), tf)["mixture_text"] == text
    t = _temperature_table()
    t.loc[t.condition == "mixture_tau=1", "accuracy"] = 0.8 + 0.002 * (t.seed - 1)  # tau = 1: no difference
    tf1 = findings.temperature_findings(t, 0.1)
    assert number(tf1, "best") == 1.0 and number(tf1, "best_no_direction")
    assert says(c, tf1)["temperature_text"] == (
        "At τ = 1, the least bad temperature in the held-out check, the mixture's worst difference from the oracle "
        "is 0.0000 (-0.0050 to 0.0050) and no strength checked shows a direction (one family of 2), so the advice "
        "is for τ = 0.1 only (the main sweep was not rerun at τ = 1).")
    shown = tf1.copy()
    shown.loc[shown.key == "best_no_direction", "value"] = False
    assert says(c, shown)["temperature_text"] == (
        "At τ = 1, the held-out check's least bad temperature, the mixture's worst difference from the oracle is "
        "0.0000 (-0.0050 to 0.0050); the main sweep was not rerun at it.")


def test_sidecar_parameters_and_worker_minutes(monkeypatch):
    import json
    cfg = run.temperature_check_config(run.make_config("quick"))
    monkeypatch.setenv("BNSTUDY_RUN_PARAMETERS", json.dumps({"chapter": "06_unknown_task", "seeds": None,
                                                            "cache_dir": "/c"}))
    par = run.sidecar_parameters(cfg)
    assert par["seeds"] == cfg.seeds and par["n_tasks"] == (4,) and par["cache_dir"] == "/c"
    assert par["check_temperatures"] == cfg.check_temperatures and par["chapter"] == "06_unknown_task"
    t = pd.DataFrame(dict(seed=[0, 0, 1], n_tasks=[2, 2, 2], strength=[0.0, 0.0, 0.0], unit_wall_s=[60.0, 60.0, 30.0]))
    assert run.worker_minutes(t, t) == pytest.approx(3.0)


def test_chapter_three_cost_benefit_is_its_first_figure_as_the_page_says():
    import nbformat
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "chapters"
    ch3 = nbformat.read(root / "03_shift_strength.ipynb", 4)
    names = [m for c in ch3.cells if c.cell_type == "markdown"
             for m in __import__("re").findall(r":name:\s*(fig-\S+)", c.source)]
    assert names[0] == "fig-ch03-cost-benefit"
    ch6 = nbformat.read(root / "06_unknown_task.ipynb", 4)
    text = "\n".join(c.source for c in ch6.cells if c.cell_type == "markdown")
    # issue 25: the page cites chapter 3's figure by {numref}, never by a hand-typed "(chapter 3, Figure 1)"
    assert "{numref}`fig-ch03-cost-benefit`" in text and "(chapter 3, Figure 1)" not in text
    # the notebook stays thin: no code cell longer than 25 lines
    assert max(len(c.source.splitlines()) for c in ch6.cells if c.cell_type == "code") <= 25


# --- rows: the page analyses an earlier run's saved tables again ----------------------------------------------------

def test_run_tables_returns_the_sibling_tables_the_page_saves(monkeypatch):
    """run_tables runs the main sweep and the temperature check (held-out seeds) and returns exactly SIBLING_TABLES;
    the temperature table is checked against the check's own configuration, which its sidecar records."""
    from bnstudy.study.config import Execution
    seen = []

    def fake_run(config, execution=None):
        seen.append(config)
        return pd.DataFrame(dict(seed=list(config.seeds)))
    monkeypatch.setattr(run, "run", fake_run)
    monkeypatch.setattr(run, "run_families", lambda config, execution=None: pd.DataFrame(dict(seed=[-1])))
    cfg = run.make_config("quick")
    df, tables = run.run_tables(cfg, Execution(n_jobs=1))
    assert set(tables) == set(run.SIBLING_TABLES) == {"temperature", "families"} and run.ANALYSIS_PARAMETERS == ()
    assert list(tables["families"].seed) == [-1]
    check = run.temperature_check_config(cfg)
    assert seen == [cfg, check] and list(df.seed) == list(cfg.seeds) and list(tables["temperature"].seed) == [10, 11]
    params, resolved = run.sibling_parameters(cfg)["temperature"]
    assert params == resolved == check.asdict() and set(run.sibling_parameters(cfg)) <= set(run.SIBLING_TABLES)
    with pytest.raises(TypeError, match="run_tables needs an unknown_task.Config"):
        run.run_tables(object())


def test_run_workers_are_the_runs_own_when_the_rows_are_an_earlier_runs():
    from bnstudy.study.config import Execution
    assert run.run_workers(None, Execution(n_jobs=3)) == 3
    assert run.run_workers({"workers": 2}, Execution(n_jobs=1)) == 2
    assert run.run_workers({"workers": None}, Execution(n_jobs=1)) == 1  # not recorded: this execution's


@pytest.mark.slow
def test_notebook_with_rows_gives_the_page_its_own_run_gave(glued_payloads, quick_rebuild):
    """The session's quick page, then the page again from its saved tables (``rows``) with an empty cache: every glued
    value and every saved table are the same (the worker count and worker-minutes are the run's), only the timing
    sentence says the rows were analysed again, and nothing ran. The rebuilt page's own tables can be analysed again
    (its temperature sidecar still names the run that computed the rows), and a changed parameter is refused."""
    import json

    from papermill.exceptions import PapermillExecutionError

    from bnstudy.study import book, report
    r = quick_rebuild("06_unknown_task")
    a, b = glued_payloads(r.first), glued_payloads(r.again)
    assert set(a) == set(b)
    assert {k for k in a if a[k] != b[k]} == {"ch06_timing"}
    assert "did not run the experiment" in b["ch06_timing"] and "did not run" not in a["ch06_timing"]
    assert not r.cache2.exists() or not any(p.is_file() for p in r.cache2.rglob("*"))
    saved = sorted(p.name for p in r.results.glob("06_unknown_task*.csv"))
    assert saved == sorted(p.name for p in r.results2.glob("06_unknown_task*.csv"))
    assert {f"06_unknown_task_{s}.csv" for s in run.SIBLING_TABLES} <= set(saved)
    for name in saved:
        assert (r.results / name).read_bytes() == (r.results2 / name).read_bytes(), name
    temp = [json.loads(report.sidecar_path(d / "06_unknown_task_temperature.csv").read_text())["parameters"]
            for d in (r.results, r.results2)]
    assert temp[0]["seeds"] == temp[1]["seeds"] == [10, 11] and "rows_from" in temp[1]  # the check's own config
    twice = book.execute_chapter(r.nb_path, r.folder / "twice", "quick", parameters=dict(  # the rebuilt page's tables
        rows=str(r.results2 / "06_unknown_task.csv"), results_dir=str(r.folder / "results4"),
        figures_dir=str(r.folder / "figures4"), cache_dir=str(r.folder / "cache4")))
    assert {k for k, v in glued_payloads(twice).items() if v != b[k]} <= {"ch06_timing"}
    steps = run.make_config("quick").steps  # the profile the session's page ran
    with pytest.raises(PapermillExecutionError, match=f"parameter 'steps' is {steps + 1} here but was {r.recorded('steps')}"):
        book.execute_chapter(r.nb_path, r.folder / "bad", "quick", parameters=dict(
            steps=steps + 1, rows=str(r.rows), results_dir=str(r.folder / "results3"),
            figures_dir=str(r.folder / "figures3"), cache_dir=str(r.folder / "cache3")))


# --- the answer box: chosen by the findings, and it flips with them (issue 25) -------------------------------------

def _page_text(df):
    """Every findings-chosen text of the page for the rows ``df`` (:func:`findings.page_words`: the notes and
    phrases; the answer box cites them and the claims), as one dict."""
    return findings.page_words(findings.findings(df), findings.cell_tests(df), findings.claims(df))


def test_answer_and_every_chosen_sentence_flip_with_each_headline_verdict():
    base = _page_text(_table())
    # the hand-made table: routing works from t = 1 per sample, a wrong bank costs only there, the routed head loses
    assert base["works_b1_short_text"].startswith("from t = 1 on")
    assert base["works_at_text"] == "(routing there 1.000, 99.17% interval 1.000 to 1.000, with two tasks)"
    assert "each wrong-bank cost is shown (at the page's family level) only at or above" in base["cost_vs_routing_text"]
    assert base["unknown_head_text"].startswith("At gentle shifts, route pooled inference batches")
    # cells equal to the oracle by construction (every input routed to its own bank) said apart (issue 35)
    assert base["cell_counts_apart_text"] == (
        "11 of the 24 router cells send every input to its own bank in every seed and so equal the oracle by "
        "construction (no finding); of the other cells, 12 of 13 are **equivalent within ±0.02** of the oracle "
        "and 1 is **not decided**")
    assert base["lead"].startswith("**Yes, with batches.**")
    # flip 1: the routed head loses nothing, and train mode costs already where routing fails
    df = _table()
    df["accuracy_routed_head"] = df["accuracy"]
    hit = (df.condition == "train_mode") & (df.strength == 0.01) & (df.task == "A")
    df.loc[hit, "accuracy"] -= 0.1 + 0.01 * df.loc[hit, "seed"]
    flip = _page_text(df)
    assert "**routed head lower**" not in " ".join(flip.values())
    assert "no loss is shown on this grid" in flip["unknown_head_text"]
    assert flip["cost_vs_routing_text"].startswith("Not everywhere does the cost wait for routing")
    assert flip["known_head_text"].endswith("but not everywhere a wrong bank measurably costs on this grid")
    # flip 2: routing never works per sample; the mixture's shortfall is gone (every cell equivalent)
    df = _table()
    nf = df.condition == "nearest_first"
    df.loc[nf & (df.inference_batch == 1), "routing_accuracy"] = 0.5
    df.loc[df.condition == "mixture", "accuracy"] = 0.8 + 0.001 * df.loc[df.condition == "mixture", "seed"]
    df["accuracy_routed_head"] = df["accuracy"]
    flip = _page_text(df)
    assert flip["works_b1_short_text"].startswith("at no strength tested")
    assert flip["works_at_text"] == "(no strength tested passes that rule)"  # no routing there to quote, no nan
    assert "of the other cells, 13 of 13 are **equivalent within ±0.02**" in flip["cell_counts_apart_text"]
    assert "**not decided**" not in " ".join(flip.values())
    # and with no loss of the routed head, the advice needs no task label
    df = _table()
    df["accuracy_routed_head"] = df["accuracy"]
    assert _page_text(df)["unknown_head_text"].endswith("routing needs no task label there.")
    assert _page_text(df)["lead"].startswith("**Yes, on this grid.**")


def test_the_lead_says_not_without_a_cost_when_the_routed_head_loses_with_batches_too():
    from bnstudy.study.words import notes
    f, c = findings.findings(_table()), findings.claims(_table())
    lost = c.copy()
    lost.loc[lost.key.str.startswith("routed_gentle_bmax_k"), "kind"] = "lower"
    assert notes(findings.LEAD, lost, f)["lead"].startswith("**Not without a cost.**")
    assert notes(findings.LEAD, c, f)["lead"].startswith("**Yes, with batches.**")


def test_a_cell_equals_the_oracle_by_construction_only_with_every_input_routed_home_in_every_seed():
    """Issue 35: a router cell whose every seed routes every input to its own bank computes the oracle's outputs,
    so it is said apart, not counted as a finding; one misrouted seed, or one seed whose accuracy differs, makes it
    an ordinary cell."""
    df = _table()
    cells = findings.cell_tests(df)
    home = cells[cells.identical].iloc[0]
    at = ((df.condition == home.condition) & (df.n_tasks == home.n_tasks) & (df.strength == home.strength)
          & (df.inference_batch == home.inference_batch) & (df.seed == df.seed.min()))
    for column, value in (("routing_accuracy", 0.99), ("accuracy", None)):
        moved = df.copy()
        moved.loc[at, column] = value if value is not None else moved.loc[at, column] - 0.01
        again = findings.cell_tests(moved).set_index(["condition"] + findings.CELL)
        assert not again.loc[(home.condition, home.n_tasks, home.strength, home.inference_batch), "identical"]
    f = findings.findings(df, cells)
    assert number(f, "n_identical") + number(f, "n_cells_other") == number(f, "n_cells") == len(cells)
    assert number(f, "n_equivalent_other") + number(f, "n_not_decided_other") + number(f, "n_lower_other") + \
        number(f, "n_higher_other") == number(f, "n_cells_other")


def test_cell_counts_use_the_books_counts_rule():
    # the router cells carry Holm's adjusted p (a p-value only); the findings count their printed verdicts
    from bnstudy.study import inference
    for df in (_table(), _tight_mixture_table()):
        cells = findings.cell_tests(df)
        assert cells["p_adjusted"].tolist() == pytest.approx(list(inference.holm(cells["p"])), nan_ok=True)
        f, counts = findings.findings(df, cells), inference.count_verdicts(cells)
        assert (number(f, "n_equivalent"), number(f, "n_lower"), number(f, "n_higher"), number(f, "n_not_decided")) == (
            counts["equivalent"], counts["lower"], counts["higher"], counts["not decided"])
    # one verdict per claim: a cell whose Holm p is below 0.05 but whose printed interval spans zero is not decided
    cells = findings.cell_tests(_table())
    cells.loc[0, ["p_adjusted", "estimate", "kind"]] = [0.01, -0.05, "not decided"]
    after = inference.count_verdicts(cells)
    assert after["lower"] == int((cells["kind"] == "lower").sum())
    assert after["not decided"] == int((cells["kind"] == "not decided").sum()) >= 1


def _tight_mixture_table():
    df = _table()
    hit = (df.condition == "mixture") & (df.strength == 1.0) & (df.inference_batch == 1)
    df.loc[hit, "accuracy"] = 0.7 - 0.001 * df.loc[hit, "seed"]
    return df


def _markdown_prose(nb_path) -> str:
    """The notebook's markdown without glue roles, {numref} roles, math and code spans: the typed words."""
    import json
    import re
    cells = json.loads(Path(nb_path).read_text())["cells"]
    t = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for rx in (r"\{glue:\w+\}`[^`]*`", r"\{numref\}`[^`]*`", r"\$\$.*?\$\$", r"\$[^$]*\$", r"`[^`]*`",
               r"(?m)^:(name|alt|class):.*$"):
        t = re.sub(rx, "", t, flags=re.S)
    return re.sub(r"\s+", " ", t)


def typed_outcomes(text: str, directions) -> list[str]:
    """Outcome words typed in ``text`` (a notebook's prose outside glue): a direction word, an equivalence or
    "not decided" verdict, or a decimal number other than the design constants 0.05 (the level) and 1.5."""
    import re
    hits = [w for w in list(directions) + ["equivalent within", "not decided"] if w.lower() in text.lower()]
    hits += [m for m in re.findall(r"(?<![\w.])\d+\.\d+", text) if m not in ("0.05", "1.5")]
    return hits


def test_typed_outcome_check_finds_a_typed_verdict():
    assert typed_outcomes("The router is router lower here, 0.843 of the time.", findings.DIRECTIONS) == \
        ["router lower", "0.843"]
    assert typed_outcomes("At the level 0.05 nothing is typed.", findings.DIRECTIONS) == []


def test_the_notebook_types_no_outcome_outside_glue():
    nb = Path(__file__).resolve().parent.parent / "chapters" / "06_unknown_task.ipynb"
    assert typed_outcomes(_markdown_prose(nb), findings.DIRECTIONS) == []


def test_answer_box_is_the_first_thing_under_the_title_and_every_figure_has_alt_text():
    import json
    nb = Path(__file__).resolve().parent.parent / "chapters" / "06_unknown_task.ipynb"
    cells = json.loads(nb.read_text())["cells"]
    first = "".join(cells[0]["source"]).split("\n")
    assert first[0].startswith("# ") and first[2] == "```{admonition} The answer" and first[3] == ":class: answer"
    box = "".join(cells[0]["source"]).split("\n```\n")[0]  # the answer box: the lead, the claims and what to do
    assert all(f"{{glue:md}}`ch06_{k}`" in box for k in ("lead", "routed_gentle_b1_k2_verdict", "unknown_head_text"))
    md = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert md.count("```{glue:figure} ch06_fig_") == md.count(":alt: ") == 6
    assert not any("show-code" in c["metadata"].get("tags", []) for c in cells)


def test_printed_numbers_clip_intervals_to_the_quantitys_range():
    from bnstudy.study.pages import numbers_items
    over = Interval(0.99, 0.95, 1.03, 3)
    h = with_numbers(findings.findings(_table()), {"route_strong_b1": {"k2_nearest_first": over},
                                                    "train_task_a": {"k2": Interval(-0.5, -1.2, 0.2, 3)}})
    g = dict(numbers_items("ch06", h))
    assert g["ch06_route_strong_b1_k2_nearest_first_ci_high"] == 1.0 and g["ch06_train_task_a_k2_ci_low"] == -1.0
    assert number(h, "train_task_a_k2").low == -1.2  # the numbers table keeps the raw intervals


def test_a_missing_task_value_drops_its_seed_and_a_repeated_row_is_refused():
    """A task's NaN must not average the condition over fewer tasks than the oracle (the seed is left out), and a
    repeated run must not be averaged away (a new user's report; every comparison of the page reads seed_means)."""
    df = _table()
    full = findings.claims(df).set_index("key")
    hit = (df.seed == 0) & (df.task == "B") & (df.condition == "train_mode")
    nan = findings.claims(df.assign(accuracy=df.accuracy.mask(hit))).set_index("key")
    assert nan.loc["train_vs_oracle_k2", "n"] == full.loc["train_vs_oracle_k2", "n"] - 1
    with pytest.raises(ValueError, match="repeated .* rows"):
        findings.claims(pd.concat([df, df.iloc[:3]]))


# --- shift families that are not brightness/contrast (issue 35) ----------------------------------------------------

def test_family_shifts_are_blur_and_noise_per_task_and_task_a_is_never_shifted():
    assert run.corruption_of("A", "mix", 2.0) == (0.0, 0.0)
    assert run.corruption_of("B", "mix", 0.5) == (1.0, 1.5)
    assert run.corruption_of("C", "blur", 0.1) == (0.1, 0.0)
    assert run.corruption_of("D", "noise", 1.0) == (0.0, 4.5)
    with pytest.raises(ValueError, match="shift_family"):
        run.corruption_of("B", "gamma", 1.0)
    with pytest.raises(ValueError, match="strength"):
        run.corruption_of("B", "blur", -1.0)


def test_family_units_keep_the_brightness_contrast_units_unchanged_and_add_their_own():
    """The brightness/contrast units (the release's) are built exactly as before; a family unit carries every field
    of one plus ``shift_family``, and its tasks are the unshifted templates, blurred then noised."""
    import torch
    from bnstudy.study.tasks import gaussian_blur, generator, make_task
    cfg = run.make_config("quick", shift_families=("blur", "mix"), family_strengths=(0.5, 1.0))
    assert [u.strength for u in cfg.units()][:3] == list(cfg.strengths) and "shift_family" not in cfg.units()[0].asdict()
    fam = cfg.family_units()
    assert len(fam) == 2 * len(cfg.seeds) * len(cfg.n_tasks) * 2 and {u.shift_family for u in fam} == {"blur", "mix"}
    u = next(u for u in fam if u.shift_family == "mix" and u.n_tasks == 4 and u.strength == 1.0)
    assert {k: v for k, v in u.asdict().items() if k != "shift_family"} == \
        next(v for v in cfg.units((1.0,)) if v.seed == u.seed and v.n_tasks == 4).asdict()
    tasks = run.unit_tasks(u)
    base = make_task(u.seed, "B", u.n_classes, u.noise)
    y = torch.arange(4)
    g1, g2 = generator(1), generator(1)
    x = base.sample(y, g1)
    want = gaussian_blur(x, 2.0) + 3.0 * torch.randn(x.shape, generator=g1)
    assert torch.equal(tasks[1].sample(y, g2), want)
    assert tasks[0] is not None and not hasattr(tasks[0], "blur")  # task A: the plain template task
    aff = run.unit_tasks(cfg.units()[-1])
    assert [(t.brightness, t.contrast) for t in aff] == [run.shift_of(n, cfg.units()[-1].strength)
                                                          for n in run.TASK_NAMES[:len(aff)]]


@pytest.mark.parametrize("override, match", [(dict(shift_families=("gamma",)), "shift_families"),
                                             (dict(shift_families=("blur", "blur")), "shift_families"),
                                             (dict(family_strengths=(1.0, 0.5)), "family_strengths"),
                                             (dict(family_strengths=(0.0, 1.0)), "family_strengths"),
                                             (dict(family_strengths=()), "family_strengths")])
def test_family_config_rejects_bad_values_naming_the_parameter(override, match):
    with pytest.raises(ValueError, match=match):
        run.make_config("quick", **override)
    assert run.make_config("quick", shift_families=(), family_strengths=()).family_units() == []


def test_family_strengths_without_shift_families_are_refused_naming_both_and_the_defaults_stay_accepted():
    """A non-default family_strengths with no shift family was silently ignored (no family runs at it); it is
    refused naming both parameters. The profiles' own values with shift_families empty (the notebook's
    shift_families=[] leaves family_strengths at the profile's), the class default and an empty list stay accepted,
    and the config's units are those of the config without the families."""
    with pytest.raises(ValueError, match=r"^family_strengths must be its default \[0\.25, 1\.0, 2\.0\] or empty "
                                         r"when shift_families is empty .*, got \[0\.5, 1\.0\]"):
        run.make_config("quick", shift_families=(), family_strengths=(0.5, 1.0))
    with pytest.raises(ValueError, match=r"family_strengths must be its default \[0\.1, 0\.25, 0\.5, 1\.0, 2\.0\]"):
        run.make_config("full", shift_families=(), family_strengths=(0.25, 1.0, 2.0, 3.0))
    for profile in run.PROFILES:
        for strengths in (None, ()):  # None: the profile's
            cfg = run.make_config(profile, shift_families=(), family_strengths=strengths)
            assert cfg.family_units() == [] and cfg.units() == run.make_config(profile).units()
    assert run.Config(shift_families=()).family_units() == []  # the class default
    assert run.Config(profile="full", **run.READ_DEFAULTS).family_units() == []  # rows from before the families
    assert run.make_config("quick", shift_families=("blur",), family_strengths=(0.5, 1.0)).family_strengths == (0.5, 1.0)


def _family_table(routed_loss_b1=0.0, routed_loss_bmax=0.0):
    """Two families of :func:`_table` (strengths 0.01 / 1 as the family grid, t = 0 dropped), the nearest_first
    routed head at the gentlest strength losing ``routed_loss_*`` (per batch) in the blur family."""
    t = _table()
    t = t[t.strength > 0]
    out = []
    for fam in ("blur", "noise"):
        f = t.assign(shift_family=fam)
        if fam == "blur":
            sel = f.condition == "nearest_first"  # at both family strengths (the claims ask the gentlest and the next)
            f.loc[sel & (f.inference_batch == 1), "accuracy_routed_head"] -= routed_loss_b1 + 0.01 * f.seed
            f.loc[sel & (f.inference_batch == 32), "accuracy_routed_head"] -= routed_loss_bmax + 0.01 * f.seed
        out.append(f)
    return pd.concat(out, ignore_index=True)


def test_family_claims_are_condition_minus_oracle_per_family_and_task_count_in_one_family():
    fdf = _family_table(routed_loss_b1=0.3)
    C = findings.family_claims(fdf)
    assert len(C) == 2 * (len(findings.FAMILY_QUESTIONS) + 2) and C.confidence.nunique() == 1  # + the next level's two
    assert {"fam_blur_routed_next_b1_k2", "fam_noise_routed_next_bmax_k2"} <= set(C.key)
    assert np.isclose(C.confidence.iloc[0], 1 - 0.05 / len(C))
    blur = findings.claim(C, "fam_blur_routed_b1_k2")
    # task A loses 0.2 (+0.01 seed) in _table, averaged with task B over two tasks, plus 0.3 (+0.01 seed) here
    assert np.isclose(blur.estimate, -(0.1 + 0.005 + 0.3 + 0.01)) and blur.kind == "lower"
    assert findings.claim(C, "fam_noise_pinned_k2").kind == "lower"
    F = findings.family_findings(fdf, C)
    assert number(F, "fam_gentle") == 0.01 and number(F, "fam_strong") == 1.0 and number(F, "fam_m") == len(C)
    assert number(F, "fam_noise_works_from_bmax_k2") == 0.01 and math.isnan(number(F, "fam_noise_works_from_b1_k2")) \
        is False and number(F, "fam_noise_works_from_b1_k2") == 1.0
    blur_cells = findings.cell_tests(fdf[fdf.shift_family == "blur"].drop(columns="shift_family"))
    assert len(blur_cells) == 2 * 2 * 4  # routers x strengths x batches, one task count (the fam_cells_text cells)
    # routed perfectly with the oracle's accuracy in every seed: equal by construction, said apart
    same = findings.claim(C, "fam_noise_routed_bmax_k2")
    assert findings.family_claim_text(same).startswith("0 in every seed")
    assert not findings.family_claim_text(blur).startswith("0 in every seed")
    assert findings.family_claims(fdf.iloc[:0]).empty


@pytest.mark.parametrize("b1, bmax, says", [(0.3, 0.0, "whether batches avoid the loss is not decided"),
                                            (0.3, 0.3, "keep a task label, since pooled batches lose there too"),
                                            (0.0, 0.0, "routing by statistics serves these shifts too")])
def test_family_answer_flips_with_the_routed_head_verdicts(b1, bmax, says):
    fdf = _family_table(b1, bmax)
    if b1 == 0.0:  # no loss at all: the routed head equals the oracle's accuracy
        fdf["accuracy_routed_head"] = fdf["accuracy"]
    C = findings.family_claims(fdf)
    words = findings.family_words(fdf, C, findings.family_findings(fdf, C))
    assert says in words["fam_answer"]
    assert set(words) == {"fam_intro_text", "fam_oracle_text", "fam_unknown_text", "fam_routing_text",
                          "fam_wrong_text", "fam_cells_text", "fam_answer"}
    tab = findings.family_table(fdf, C, findings.family_findings(fdf, C))
    assert list(tab.index) == ["blur, 2", "noise, 2"]
    fig = figures.family_routing_figure(findings.family_routes(fdf))
    assert len(fig.axes) == 2
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_family_design_text_is_made_from_the_shift_table():
    text = findings.family_design_text(("mix",))
    assert text == ("**mix**: B blurred (std 2t px) and noised (extra std 3t), C blurred (std 2t px), "
                    "D noised (extra std 3t)")


def test_reported_seeds_that_are_the_temperature_checks_are_refused_before_any_run():
    with pytest.raises(ValueError, match=r"seeds must be disjoint from the temperature check's held-out seeds \[10, 11\]"):
        run.make_config("quick", seeds=[10, 11])
    with pytest.raises(ValueError, match="seeds must be disjoint"):
        run.make_config("full", seeds=12)  # seeds 0..11 include the full check's 10 and 11
    assert run.temperature_check_config(run.make_config("full")).seeds == (10, 11, 12, 13, 14)


@pytest.mark.parametrize("b1, bmax, says", [
    (["lower"], ["lower"], "keep a task label, since pooled batches"),
    (["lower"], ["equivalent"], "route batches rather than single images"),
    (["lower"], ["not decided"], "for some pairs whether batches avoid the loss is not decided"),
    (["equivalent", "not decided"], ["equivalent"], "its absence is not shown either"),
    (["equivalent"], ["higher"], "routing by statistics serves these shifts too")])
def test_family_advice_never_reads_an_open_comparison_as_no_loss(b1, bmax, says):
    assert says in findings.family_advice(b1, bmax)


@pytest.mark.parametrize("kinds, lead", [
    (dict(b1="lower", bmax="lower"), "**Not without a cost.**"),
    (dict(b1="lower", bmax="equivalent"), "**Yes, with batches.**"),
    (dict(b1="lower", bmax="not decided"), "**Not one image at a time.**"),
    (dict(b1="not decided", bmax="equivalent"), "**Not decided.**"),
    (dict(b1="equivalent", bmax="equivalent"), "**Yes, on this grid.**")])
def test_the_lead_never_reads_not_decided_as_no_loss(kinds, lead):
    """The fresh-user report: two seeds, intervals from -1 to 1, and the lead said "Yes, on this grid"."""
    from bnstudy.study.words import notes
    C = pd.DataFrame([dict(key=f"routed_gentle_{b}_k{k}", kind=kinds[b]) for b in ("b1", "bmax") for k in (2, 4)])
    F = pd.DataFrame(dict(key=["works_from_b1_k2", "works_from_b1_k4"], value=[0.1, 0.1]))
    assert notes(findings.LEAD, C, F)["lead"].startswith(lead)
    # what to do flips with the same outcome: a task label kept wherever a loss is shown or left open
    head = notes(findings.HEAD, C, F)["unknown_head_text"]
    assert ("keep a task label" in head or "keep one until it is" in head) == (lead != "**Yes, on this grid.**") \
        and ("not decided" in head) == (lead in ("**Not one image at a time.**", "**Not decided.**"))


def test_an_empty_family_table_says_so_everywhere():
    empty = pd.DataFrame(columns=list(run.FAMILY_COLUMNS))
    C = findings.family_claims(empty)
    words = findings.family_words(empty, C, None)
    assert set(words.values()) == {findings.NO_FAMILY} and "fam_answer" in words and "fam_intro_text" in words
    import matplotlib.pyplot as plt
    plt.close(figures.empty_figure(findings.NO_FAMILY))


def test_family_answer_names_only_the_families_run():
    fdf = _family_table(0.3, 0.0)
    fdf = fdf[fdf.shift_family == "blur"]
    C = findings.family_claims(fdf)
    ans = findings.family_words(fdf, C, findings.family_findings(fdf, C))["fam_answer"]
    assert ans.startswith("Under blur (one shift family,") and "1 (family, task count) pair:" in ans
