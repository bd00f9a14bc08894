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
                      temperature=0.1, noise=3.0, momentum=0.1, lr=0.05, batch_size=8, n_classes=10)
    return ut.run_unit(u, src)


def test_old_task_logits_bit_identical_under_the_oracle(tiny_unit):
    assert tiny_unit["oracle_logit_change"] == 0


def test_unit_records_every_condition_task_and_batch(tiny_unit):
    rec = pd.DataFrame(tiny_unit["records"])
    assert set(rec.condition) == set(ut.CONDITIONS)
    assert len(rec) == 2 * 2 * len(ut.CONDITIONS)
    assert (rec[rec.condition == "oracle"].routing_accuracy == 1).all()
    assert rec[rec.condition.isin(["train_mode", "pinned"])].routing_accuracy.isna().all()
    # with two tasks the shared drifting statistics are the last bank: task B under train_mode == oracle
    b = rec[(rec.task == "B")].set_index(["condition", "inference_batch"]).accuracy
    assert b["train_mode", 1] == b["oracle", 1]


def _table():
    """Hand-made results: 3 seeds, 2 tasks, strengths 0 / 0.01 / 1, inference batches 1 and 32.

    Routing accuracy: 0.5 at t = 0; 0.6 at t = 0.01 with b = 1 but 1.0 with b = 32; 1.0 at t = 1.
    Accuracy: oracle 0.8 (+ seed jitter); every router equals it except the mixture at t = 1, b = 1
    (0.1 lower); train_mode 0.3 lower at t = 1; pinned 0.2 lower at t = 1.
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
                        if cond == "train_mode" and t == 1.0:
                            acc -= 0.3 + 0.01 * seed
                        if cond == "pinned" and t == 1.0:
                            acc -= 0.2 + 0.01 * seed
                        recs.append(dict(seed=seed, n_tasks=2, strength=t, task=task, condition=cond,
                                         inference_batch=b, routing_accuracy=route, accuracy=acc,
                                         accuracy_routed_head=acc, oracle_logit_change=0.0))
    return pd.DataFrame(recs)


def test_findings_on_a_hand_made_table():
    f = ut.findings(_table())
    assert f.n_seeds == 3 and f.gentle == 0.01 and f.strong == 1.0 and f.b1 == 1 and f.bmax == 32
    assert f.oracle_exact == "holds"
    assert f.route_gentle_b1["k2_nearest_first"].mean == pytest.approx(0.6)
    assert f.route_gentle_bmax["k2_nearest_first"].mean == pytest.approx(1.0)
    assert f.works_from_b1["k2_nearest_first"] == 1.0
    assert f.works_from_bmax["k2_nearest_first"] == 0.01
    assert f.gap_strong_b1["k2_mixture"].mean == pytest.approx(-0.11)
    assert f.gap_strong_b1["k2_nearest_first"].mean == pytest.approx(0.0)
    assert f.oracle_vs_train["k2"].mean == pytest.approx(0.31)
    assert f.oracle_vs_pinned["k2"].mean == pytest.approx(0.21)
    assert (f.worst_router, f.worst_strength, f.worst_batch, f.worst_n_tasks) == ("mixture", 1.0, 1, 2)
    assert f.n_worse == 1 and f.n_cells == 4 * 3 * 2
    assert f.gentle_equivalent["k2_nearest_first"] == "holds"


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
