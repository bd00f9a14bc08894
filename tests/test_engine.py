"""The engine: freeze-mode invariants checked exactly, lockstep equal to separate runs, determinism."""

import pytest
import torch

from bnstudy.study import engine
from bnstudy.study.config import RunConfig
from bnstudy.study.modes import MODE_NAMES

SMALL = dict(widths=(4, 8), stage1_steps=30, steps=40, n_eval=40, batch_size=16, stage1_batch_size=16, epoch_steps=10)


def _cfgs(seed, **kw):
    return [RunConfig(**{**SMALL, **kw}, seed=seed, mode=m) for m in MODE_NAMES]


@pytest.fixture(scope="module")
def rows():
    out = {m: [] for m in MODE_NAMES}
    for seed in (0, 1):
        cfgs = _cfgs(seed)
        for r in engine.transfer(cfgs, engine.train_source(cfgs[0].source)):
            out[r["mode"]].append(r)
    return out


def test_no_mode_changes_any_weight(rows):
    for mode, rs in rows.items():
        for r in rs:
            assert r["max_param_change"] == 0.0, mode


def test_train_mode_rewrites_buffers_and_pinned_modes_do_not(rows):
    for r in rows["train_mode"]:
        assert r["max_buffer_change"] > 0.1
        assert r["num_batches_tracked_change"] == SMALL["steps"]
    for mode in ("backbone_eval", "all_eval", "separate_stats"):
        for r in rows[mode]:
            assert r["max_buffer_change"] == 0.0, mode
            assert r["num_batches_tracked_change"] == 0, mode


def test_separate_stats_and_pinned_modes_keep_old_logits_bit_identical(rows):
    for mode in ("separate_stats", "backbone_eval", "all_eval"):
        for r in rows[mode]:
            assert r["max_old_logit_change"] == 0.0, mode
            assert r["task_a_after"] == r["task_a_before"], mode
    for r in rows["train_mode"]:
        assert r["max_old_logit_change"] > 0.0


def test_modes_share_the_source_backbone_within_a_seed(rows):
    befores = {mode: tuple(r["task_a_before"] for r in rs) for mode, rs in rows.items()}
    assert len(set(befores.values())) == 1


def test_lockstep_rows_equal_runs_made_one_mode_at_a_time():
    cfgs = _cfgs(2, steps=25)
    src = engine.train_source(cfgs[0].source)
    together = engine.transfer(cfgs, src)
    for c, row in zip(cfgs, together):
        alone = engine.transfer([c], src)[0]
        for k in row:
            if k != "wall_s":
                assert alone[k] == row[k], (c.mode, k)


@pytest.mark.parametrize("kw", [dict(), dict(train_size=150)])
def test_lockstep_across_heads_optimizers_and_step_counts_equals_runs_made_alone(kw):
    # Issue 9: one lockstep group per seed and shift for everything that only shapes head B; a run of fewer steps
    # stops on a prefix of the shared stream. Every row value must be == the same run made alone.
    variants = [dict(head="linear", optimizer="sgd", lr=0.05, steps=25),
                dict(head="mlp_bn", optimizer="adam", lr=0.003, steps=25),
                dict(head="mlp_ln", optimizer="sgd_plain", lr=0.1, steps=12),
                dict(head="linear", optimizer="sgd", lr=0.05, steps=7)]
    cfgs = [RunConfig(**{**SMALL, **kw, **v}, seed=3, mode=m) for v in variants for m in MODE_NAMES]
    assert engine.lockstep_groups(cfgs) == [list(range(len(cfgs)))]
    src = engine.train_source(cfgs[0].source)
    together = engine.transfer(cfgs, src)
    for c, row in zip(cfgs, together):
        alone = engine.transfer([c], src)[0]
        for k in row:
            if k != "wall_s":
                assert alone[k] == row[k], (c.mode, c.head, c.steps, k)


def test_split_groups_keeps_every_worker_busy_and_rows_equal():
    # Issue 9: 3 lockstep groups on 2 workers (chapter 4's learning-rate search) become 6 sub-groups, modes of a
    # head/optimizer/lr kept together; each sub-group's rows are == the whole group's.
    variants = [dict(head="linear", optimizer="sgd", lr=0.05, steps=20),
                dict(head="mlp_bn", optimizer="adam", lr=0.003, steps=20),
                dict(head="linear", optimizer="sgd", lr=0.05, steps=8)]
    cfgs = [RunConfig(**{**SMALL, **v}, seed=s, mode=m) for s in (0, 1, 2) for v in variants for m in MODE_NAMES]
    groups = engine.lockstep_groups(cfgs)
    assert len(groups) == 3
    split = engine.split_groups(cfgs, groups, 2)
    assert len(split) == 6 and sorted(i for g in split for i in g) == list(range(len(cfgs)))
    for g in split:
        assert len(engine.lockstep_groups([cfgs[i] for i in g])) == 1
        assert {cfgs[i].mode for i in g} == set(MODE_NAMES)  # whole bundles
    assert engine.split_groups(cfgs, groups, 1) == groups and engine.split_groups(cfgs, groups, 3) == groups
    assert engine.split_groups(cfgs, [[i] for i in range(len(cfgs))], 2) == [[i] for i in range(len(cfgs))]
    g0 = groups[0]
    src = engine.train_source(cfgs[g0[0]].source)
    whole = dict(zip(g0, engine.transfer([cfgs[i] for i in g0], src)))
    for g in split[:2]:
        assert set(g) <= set(g0)
        for i, row in zip(g, engine.transfer([cfgs[i] for i in g], src)):
            assert {k: v for k, v in row.items() if k != "wall_s"} == \
                {k: v for k, v in whole[i].items() if k != "wall_s"}


def test_lockstep_refuses_runs_on_different_streams_or_repeated_runs():
    a = RunConfig(**SMALL, seed=0)
    with pytest.raises(ValueError, match="differ in \\['batch_size'\\]"):
        engine.transfer([a, a.replace(batch_size=8)], {})
    with pytest.raises(ValueError, match="must be distinct"):
        engine.transfer([a.replace(head="mlp"), a.replace(head="mlp")], {})


def test_same_config_gives_the_same_numbers_twice():
    c = _cfgs(4, steps=15)[:1]
    a = engine.transfer(c, engine.train_source(c[0].source))[0]
    b = engine.transfer(c, engine.train_source(c[0].source))[0]
    assert {k: v for k, v in a.items() if k != "wall_s"} == {k: v for k, v in b.items() if k != "wall_s"}


def test_global_rng_state_does_not_change_a_run():
    c = _cfgs(5, steps=10)[:1]
    torch.manual_seed(123)
    a = engine.transfer(c, engine.train_source(c[0].source))[0]
    torch.manual_seed(999)
    torch.rand(1000)
    b = engine.transfer(c, engine.train_source(c[0].source))[0]
    assert a["task_b"] == b["task_b"] and a["drift_weight_l0"] == b["drift_weight_l0"]


def test_transfer_refuses_configs_that_differ_in_more_than_head_b_settings():
    a, b = _cfgs(0)[:2]
    with pytest.raises(ValueError, match="they differ in \\['brightness'\\]"):
        engine.transfer([a, b.replace(brightness=1.0)], {})
    with pytest.raises(ValueError, match="must be distinct"):
        engine.transfer([a, a], {})


def test_measured_drift_follows_the_decay_in_train_mode():
    c = RunConfig(**{**SMALL, "steps": 70}, seed=3)
    row = engine.transfer([c], engine.train_source(c.source))[0]
    m = row["momentum"]
    for layer in ("drift_weight_l0", "drift_weight_l1"):
        w = dict(zip(row["drift_steps"], row[layer]))
        assert w[0] == pytest.approx(1.0)
        for t in (1, 2, 3, 5, 8):
            assert w[t] == pytest.approx((1 - m) ** t, abs=0.08), (layer, t)
        assert abs(w[66]) < 0.1


def test_accuracy_is_an_exact_fraction_of_counts():
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert engine.accuracy(logits, torch.tensor([0, 1, 1])) == 2 / 3


def test_memory_format_follows_what_the_mode_says():
    assert engine.memory_format_for("train_mode") == engine.TRAIN_MEMORY_FORMAT
    assert engine.memory_format_for("separate_stats") == engine.TRAIN_MEMORY_FORMAT
    assert engine.memory_format_for("backbone_eval") == engine.EVAL_MEMORY_FORMAT


# --- issue 9: finite training sets and fixed (cached) features ----------------------------------------------------

def test_finite_set_is_a_fixed_function_of_seed_task_and_size():
    from bnstudy.study.tasks import SetBatches, make_task, train_set
    task = make_task(0, "B", 10, 3.0, 4.0, 5.0)
    (xa, ya), (xb, yb) = train_set(task, 100, 0, "B"), train_set(task, 100, 0, "B")
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.bincount(ya).tolist() == [10] * 10
    assert not torch.equal(train_set(task, 100, 1, "B")[0], xa)
    for sampler in ("shuffled", "class_sorted"):
        s1, s2 = (SetBatches(xa, ya, 16, engine.generator(0, "stream", "B"), sampler) for _ in range(2))
        seen = []
        for _ in range(13):
            i1, i2 = s1.next_indices(), s2.next_indices()
            assert torch.equal(i1, i2)
            seen.append(i1)
            if sampler == "class_sorted":
                assert len(set(ya[i1].tolist())) == 1
        if sampler == "shuffled":  # an epoch (6 batches of 16 from 100) never repeats a row
            assert len(set(torch.cat(seen[:6]).tolist())) == 96


def test_finite_set_run_is_deterministic_and_differs_from_the_stream():
    c = _cfgs(6, steps=20, train_size=200)
    src = engine.train_source(c[0].source)
    a = engine.transfer(c, src)
    b = engine.transfer(c, engine.train_source(c[0].source))
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k != "wall_s"} == {k: v for k, v in rb.items() if k != "wall_s"}
    assert src["backbone"]["blocks.0.conv.weight"].ne(
        engine.train_source(c[0].source.replace(train_size=None))["backbone"]["blocks.0.conv.weight"]).any()


def _uncached_transfer(monkeypatch, cfgs, src):
    monkeypatch.setattr(engine, "SHARE_FEATURES", False)
    out = engine.transfer(cfgs, src)
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("kw", [dict(train_size=150), dict(train_size=150, head="mlp_bn", sampler="class_sorted"),
                                dict(train_size=None), dict(norm="group", train_size=150)])
def test_cached_features_give_rows_equal_to_the_full_forward(monkeypatch, kw):
    cfgs = _cfgs(7, steps=23, **kw)
    src = engine.train_source(cfgs[0].source)
    cached = engine.transfer(cfgs, src)
    plain = _uncached_transfer(monkeypatch, cfgs, src)
    assert engine.feature_groups  # both paths ran: shared/cached (default) and full forwards (SHARE_FEATURES off)
    for c, r1, r2 in zip(cfgs, cached, plain):
        for k in r1:
            if k != "wall_s":
                assert r1[k] == r2[k], (c.mode, k)


def test_train_size_is_checked():
    with pytest.raises(ValueError, match="train_size must be an integer >= 16"):
        RunConfig(**SMALL, train_size=8)
    with pytest.raises(ValueError, match="batch_size must be <= train_size"):
        RunConfig(**{**SMALL, "stage1_batch_size": 4, "batch_size": 32}, train_size=20)
