"""Chapter 6 (bnstudy.experiments.unknown_task): config checks, one tiny unit, findings on hand-made tables."""

import math

import numpy as np
import pandas as pd
import pytest

from bnstudy.config import SourceConfig
from bnstudy.engine import train_source
from bnstudy.experiments import unknown_task as ut


def test_shift_of_task_b_is_chapter_3s_both_line():
    assert ut.shift_of("B", 1.0) == (4.0, 5.0)
    assert ut.shift_of("C", 0.5) == (-2.0, 3.0)
    assert ut.shift_of("D", 1.0) == (0.0, 0.2)
    assert ut.shift_of("A", 1.0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="strength"):
        ut.shift_of("B", -1.0)


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
        ut.make_config("quick", **override)


def test_profiles_build_and_full_has_ten_seeds():
    assert len(ut.make_config("full").seeds) >= 10
    assert len(ut.make_config("full").strengths) >= 3
    assert ut.make_config("quick").inference_batches == (1, 2, 8, 32)


def test_holm_and_tost_on_known_values():
    assert np.allclose(ut.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    assert ut.tost([0.001, -0.002, 0.0, 0.001], 0.02)
    assert not ut.tost([0.1, 0.12, 0.09, 0.11], 0.02)


@pytest.fixture(scope="module")
def tiny_unit():
    src = train_source(SourceConfig(seed=0, stage1_steps=5, n_eval=16))
    u = ut.UnitConfig(seed=0, n_tasks=2, strength=1.0, steps=3, n_eval=8, router_samples=8, inference_batches=(1, 2),
                      temperature=0.1, noise=3.0, momentum=0.1, lr=0.05, batch_size=8, n_classes=10,
                      check_temperatures=(1.0,))
    return ut.run_unit(u, src)


def test_old_task_logits_bit_identical_under_the_oracle(tiny_unit):
    assert tiny_unit["oracle_logit_change"] == 0


def test_unit_records_every_condition_task_and_batch(tiny_unit):
    rec = pd.DataFrame(tiny_unit["records"])
    assert set(rec.condition) == set(ut.CONDITIONS) | {"mixture_tau=1"}
    assert len(rec) == 2 * 2 * len(ut.CONDITIONS) + 2  # the checked temperature: b = 1 only, per task
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
                    for cond in ut.CONDITIONS:
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
    f = ut.findings(_table())
    assert f.n_seeds == 3 and f.gentle == 0.01 and f.strong == 1.0 and f.zero == 0.0 and f.b1 == 1 and f.bmax == 32
    assert f.oracle_exact == "holds" and f.perfect_at_strong == "holds" and f.train_is_last_bank == "holds"
    assert f.route_gentle_b1["k2_nearest_first"].mean == pytest.approx(0.6)
    assert f.route_gentle_bmax["k2_nearest_first"].mean == pytest.approx(1.0)
    assert f.route_diff_gentle_b1["k2_classifier"].mean == pytest.approx(0.0)
    assert f.works_from_b1["k2"] == 1.0 and f.works_from_b1_text["k2"] == "from t = 1 on"
    assert f.works_from_bmax["k2"] == 0.01 and "every non-zero strength" in f.works_from_bmax_text["k2"]
    assert f.route_at_works_b1["k2"].mean == pytest.approx(1.0)
    # wrong-bank costs: only at t = 1, so detectable from 1 on, and nothing below the routing threshold
    assert f.wrong_from_train["k2"] == 1.0 and f.wrong_from_pinned["k2"] == 1.0
    assert f.wrong_at_train["k2"].mean == pytest.approx(0.31)
    assert f.wrong_below_routing["k2"] == pytest.approx(0.0)
    assert f.wrong_from_train_text["k2"].startswith("from t = 1 on (0.3100, 95% interval")
    assert f.cost_after_routing == "holds"
    assert f.gap_strong_b1["k2_mixture"].mean == pytest.approx(-0.11)
    assert f.gap_strong_b1["k2_nearest_first"].mean == pytest.approx(0.0)
    assert f.oracle_vs_train["k2"].mean == pytest.approx(0.31)
    assert f.train_task_a["k2"].mean == pytest.approx(0.62)
    assert f.oracle_vs_pinned["k2"].mean == pytest.approx(0.21)
    # fully task-unknown: task A loses 0.2 + 0.01 * seed, halved over two tasks
    assert f.routed_gentle_b1["k2"].mean == pytest.approx(-0.105)
    assert f.routed_gentle_bmax["k2"].mean == pytest.approx(0.0)
    assert f.routed_task_a_gentle_b1["k2"].mean == pytest.approx(0.591)
    assert f.oracle_task_a["k2"].mean == pytest.approx(0.801)
    assert (f.worst_router, f.worst_strength, f.worst_batch, f.worst_n_tasks) == ("mixture", 1.0, 1, 2)
    assert f.n_cells == 4 * 3 * 2
    assert f.n_worse == 1 and f.n_worse_zero == 0 and f.worse == "mixture, 2 tasks, t = 1 (b = 1)"
    assert f.n_equivalent == f.n_cells - 1 and f.not_equivalent == "mixture, 2 tasks, t = 1 (b = 1)"
    assert f.n_equivalent_half == f.n_cells - 1 and f.routers_not_within_half == "mixture"
    assert f.oracle_new_tasks["k2"].mean == pytest.approx(0.801)
    assert f.max_bound_hard == pytest.approx(0.0)


def test_findings_see_a_cost_before_routing_works():
    df = _table()
    hit = (df.condition == "train_mode") & (df.strength == 0.01) & (df.task == "A")
    df.loc[hit, "accuracy"] -= 0.1 + 0.01 * df.loc[hit, "seed"]
    f = ut.findings(df)
    assert f.wrong_from_train["k2"] == 0.01
    assert f.cost_after_routing == "does not hold"
    no_cost = _table()
    no_cost = no_cost[~no_cost.condition.isin(["train_mode"])]
    no_cost = pd.concat([no_cost, _table().query("condition == 'train_mode'").assign(accuracy=lambda d: 0.8 + 0.001 * d.seed)])
    assert ut.findings(no_cost).wrong_from_train_text["k2"] == "at no strength tested"
    assert f.wrong_below_routing["k2"] > 0.05


def test_findings_detect_a_broken_oracle_and_missing_conditions():
    df = _table()
    df.loc[0, "oracle_logit_change"] = 1e-7
    assert ut.findings(df).oracle_exact == "does not hold"
    with pytest.raises(ValueError, match="mixture"):
        ut.findings(df[df.condition != "mixture"])


def test_tidy_tables_have_one_row_per_seed_and_cell():
    df = _table()
    assert len(ut.routing_table(df)) == 3 * 3 * 2 * 4
    g = ut.gap_table(df)
    row = g[(g.condition == "train_mode") & (g.strength == 1.0) & (g.inference_batch == 1)].iloc[0]
    assert row["mean"] == pytest.approx(-0.31)
    # baselines make no routing decision: kept at the smallest inference batch only
    assert set(g[g.condition.isin(ut.BATCH_FREE)].inference_batch) == {1}
    assert set(ut.accuracy_table(df).query("condition == 'pinned'").inference_batch) == {1}
    assert len(ut.per_task_table(df)) == 3 * 2 * 2 * 5 + 3 * 2 * 2  # 5 conditions at 2 batches, 2 at one
    r = ut.routed_head_table(df)
    assert len(r) == 3 * 2 * 4
    cell = r[(r.condition == "nearest_first") & (r.strength == 0.01) & (r.inference_batch == 1)].iloc[0]
    assert cell["mean"] == pytest.approx(-0.105)


def test_tost_p_on_known_values():
    assert ut.tost_p([0.0, 0.0, 0.0], 0.02) == 0.0 and ut.tost_p([0.05, 0.05], 0.02) == 1.0
    v = np.array([0.001, -0.002, 0.0, 0.001])
    assert ut.tost_p(v, 0.02) < 0.001
    assert ut.tost_p([0.1, 0.12, 0.09, 0.11], 0.02) > 0.99
    # symmetric: the mean's sign does not matter
    assert ut.tost_p(v, 0.003) == pytest.approx(ut.tost_p(-v, 0.003))


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
    t = ut.temperature_table(_temperature_table())
    assert len(t) == 2 * 2
    row = t[(t.temperature == 1.0) & (t.strength == 1.0)].iloc[0]
    assert row["mean"] == pytest.approx(-0.101)
    f = ut.temperature_findings(_temperature_table(), 0.1)
    assert f.best == 0.1 and f.kept == 0.1 and (f.seed_first, f.seed_last, f.n_seeds) == (0, 2, 3)
    assert f.worst["tau_1"].mean == pytest.approx(-0.101)
    assert f.worst["tau_0.1"].mean == pytest.approx(-0.011)
    with pytest.raises(ValueError, match="kept temperature"):
        ut.temperature_findings(_temperature_table(), 0.3)


def test_temperature_check_uses_held_out_seeds_only():
    cfg = ut.make_config("quick")
    check = ut.temperature_check_config(cfg)
    assert not set(check.seeds) & set(cfg.seeds)
    assert check.n_tasks == (4,) and check.inference_batches == (1,) and check.check_temperatures
    assert check.steps == cfg.steps and check.temperature == cfg.temperature
    assert not set(ut.temperature_check_config(ut.make_config("full")).seeds) & set(range(10))
    with pytest.raises(ValueError, match="reported seeds"):
        ut.temperature_check_config(ut.make_config("quick", seeds=[10, 11]))
