"""Chapter 9's design (issue 39, in progress): the parameters' checks, one tiny unit of each kind with its identities
(checks of the code, not findings), and the pre-registered questions on hand-made rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from bnstudy.freeze import batchnorm_layers
from bnstudy.study.experiments.momentum_affine import claims as C
from bnstudy.study.experiments.momentum_affine import run as R
from bnstudy.study.models import Classifier, ConvBackbone, make_head


@pytest.mark.parametrize("override, param", [(dict(tuning_seeds=(0,)), "tuning_seeds"),
                                             (dict(targets=("far",)), "targets"),
                                             (dict(batch_sizes=(3,)), "batch_sizes"),
                                             (dict(batch_sizes=(32, 8)), "batch_sizes"),
                                             (dict(budgets=(10, 5)), "budgets"),
                                             (dict(momenta=(0.1, 0.3)), "momenta"),
                                             (dict(momenta=(0.0, 1.5)), "momenta"),
                                             (dict(reference_samples=100), "reference_samples"),
                                             (dict(precise_samples=100), "precise_samples"),
                                             (dict(shifts=("fog",)), "shifts"),
                                             (dict(train_classes=("other",)), "train_classes"),
                                             (dict(shift_strength=0.0), "shift_strength"),
                                             (dict(train_batch=1), "train_batch"),
                                             (dict(train_lrs=(0.0, 0.1)), "train_lrs"),
                                             (dict(frankle_lrs=(0.1, 0.01)), "frankle_lrs"),
                                             (dict(base_lr=-1.0), "base_lr"),
                                             (dict(seeds=1), "seeds")])
def test_bad_parameters_are_refused_by_name(override, param):
    with pytest.raises(ValueError, match=param):
        R.make_config("quick", **override)


def test_profiles_are_valid_and_tuning_seeds_are_never_reported():
    for profile in R.PROFILES:
        cfg = R.make_config(profile)
        assert not set(cfg.seeds) & set(cfg.tuning_seeds)
        for units in (cfg.momentum_units(), cfg.train_units(), cfg.frankle_units()):
            assert {u.seed for u in units} == set(cfg.all_seeds)
        assert {cfg.role(s) for s in cfg.seeds} == {"report"} and {cfg.role(s) for s in cfg.tuning_seeds} == {"tune"}
    with pytest.raises(ValueError, match="seed"):
        cfg.role(999)
    full = R.make_config("full")
    assert len(full.seeds) >= 10 and full.tuning_seeds == (100, 101, 102)
    assert len(full.budgets) >= 3 and len(full.batch_sizes) >= 2 and len(full.targets) == 2
    assert len(R.momentum_settings(full.momenta, full.train_size, 8, 400)) >= 7  # 6 momenta + the cumulative average
    assert full.shifts == R.SHIFTS and len(full.train_lrs) >= 3 and len(full.frankle_lrs) >= 3


def test_kornblith_rule_and_the_settings():
    assert R.kornblith_momentum(8192, 8) == 10 * 8 / 8192
    assert R.kornblith_momentum(8192, 64) == 10 * 64 / 8192
    assert R.kornblith_momentum(512, 32) == 0.1  # capped: fewer than 100 steps per epoch
    with pytest.raises(ValueError, match="batch_size"):
        R.kornblith_momentum(64, 128)
    s = R.momentum_settings((0.0, 0.1), 512, 8, 400)
    assert s == {"m0": (0.0, 0), "m0.1": (0.1, 0), "cma": (None, 0), "cma_loaded": (None, 400),
                 "kornblith": (0.1, 0)}


def _source(seed=0):
    torch.manual_seed(seed)
    bb = ConvBackbone(3)
    with torch.no_grad():
        for x in (torch.randn(32, 3, 32, 32) * 2 + 1 for _ in range(3)):
            bb.train()(x)
    head = make_head("linear", bb.out_features, 10)
    return dict(backbone=bb.state_dict(), head_a=head.state_dict(), task_a_accuracy=math.nan)


def test_one_training_run_serves_every_momentum_exactly():
    """A train-mode BatchNorm's output does not depend on its buffers, so the weights of a fine-tuning run are the
    same at every momentum, and the tracker's statistics for momentum m are, ==, those of a BatchNorm2d of momentum m
    (and of momentum=None, with the loaded counter or a reset one); m = 0 keeps the source statistics exactly."""
    src = _source()
    settings = R.momentum_settings((0.0, 0.03, 0.3), 512, 8, 3)
    torch.manual_seed(1)
    data = [(torch.randn(8, 3, 32, 32) * 3 + 2, torch.randint(10, (8,))) for _ in range(4)]

    def model(momentum, reset=False):
        bb = ConvBackbone(3, momentum=momentum)
        bb.load_state_dict(src["backbone"])
        if reset:
            for bn in batchnorm_layers(bb).values():
                bn.num_batches_tracked.zero_()
        torch.manual_seed(2)
        return Classifier(bb, make_head("linear", 64, 10)).train()

    def train(m, tracker=None):
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        for x, y in data:
            if tracker:
                tracker.active = True
            loss = F.cross_entropy(m(x), y)
            if tracker:
                tracker.active = False
            opt.zero_grad()
            loss.backward()
            opt.step()

    tracked = model(0.1)
    tracker = R.StatisticsTracker(tracked.backbone, settings)
    train(tracked, tracker)
    tracker.close()
    for name, momentum, reset in (("m0.03", 0.03, False), ("m0.3", 0.3, False), ("cma", None, True),
                                  ("cma_loaded", None, False)):
        other = model(momentum, reset)
        train(other)
        assert all(torch.equal(a, b) for a, b in zip(tracked.parameters(), other.parameters()))
        mine = tracker.stats(name)
        for n, bn in batchnorm_layers(other.backbone).items():
            assert torch.equal(mine[n][0], bn.running_mean) and torch.equal(mine[n][1], bn.running_var), (name, n)
    source = {n: (bn.running_mean, bn.running_var) for n, bn in batchnorm_layers(model(0.1).backbone).items()}
    kept = tracker.stats("m0")
    assert all(torch.equal(kept[n][0], source[n][0]) and torch.equal(kept[n][1], source[n][1]) for n in source)


def test_statistics_error_is_the_documented_relative_distance():
    ref = {"a": (torch.tensor([0.0, 0.0]), torch.tensor([4.0, 4.0])), "b": (torch.zeros(1), torch.ones(1))}
    assert R.statistics_error(ref, ref) == (0.0, 0.0)
    off = {"a": (torch.tensor([2.0, 0.0]), torch.tensor([4.0, 8.0])), "b": (torch.zeros(1), torch.ones(1))}
    em, ev = R.statistics_error(off, ref)
    assert em == pytest.approx((2 / math.sqrt(8) + 0) / 2) and ev == pytest.approx((4 / math.sqrt(32) + 0) / 2)
    with pytest.raises(ValueError, match="layers"):
        R.statistics_error({"a": ref["a"]}, ref)


def test_one_momentum_unit_runs_and_keeps_its_identities():
    u = R.MomentumUnit(seed=0, target="shifted", batch_size=8, budgets=(2, 4), momenta=(0.0, 0.1), lr=0.01,
                       train_size=64, n_eval=40, reference_samples=256, precise_samples=16)
    out = R.run_momentum_unit(u, _source())
    df = pd.DataFrame(out["records"])
    conditions = ["m0", "m0.1", "cma", "cma_loaded", "kornblith", "precise", "reference"]
    assert sorted(df.condition.unique()) == sorted(conditions) and len(df) == 2 * len(conditions)
    assert not df.duplicated(["budget", "condition"]).any()
    assert set(df.columns) >= {"budget", "condition", "momentum", "accuracy", "task_a", "mean_error", "var_error",
                               "stats_error", "change_from_source", "loss"}
    assert (df[df.condition == "m0"].change_from_source == 0).all()  # momentum 0 keeps the source statistics
    assert (df[df.condition == "reference"].stats_error == 0).all()
    assert df.accuracy.between(0, 1).all() and df.task_a.between(0, 1).all()
    assert out["steps_per_epoch"] == 8 and out["kornblith"] == 0.1 and out["lr"] == 0.01
    assert (df[df.condition == "kornblith"].momentum == 0.1).all() and df[df.condition == "cma"].momentum.isna().all()
    # the statistics of m = 0.1 and of Kornblith's rule (0.1 here) are the same setting: the same numbers
    k, m = (df[df.condition == c].reset_index(drop=True) for c in ("kornblith", "m0.1"))
    assert k.drop(columns=["condition"]).equals(m.drop(columns=["condition"]))


def _trainable_share(trainable):
    return trainable / 24346  # backbone 23,472 conv weights + 224 BatchNorm weights and biases; head 650


def test_one_train_unit_pins_what_it_says_and_counts_parameters_exactly():
    u = R.TrainUnit(seed=0, classes="new", shift="blur", strength=1.0, steps=3, batch_size=8, lrs=(0.01, 0.1),
                    train_size=64, n_eval=40)
    out = R.run_train_unit(u, _source())
    df = pd.DataFrame(out["records"])
    assert sorted(df.condition.unique()) == sorted(R.TRAIN_CONDITIONS) and len(df) == 2 * len(R.TRAIN_CONDITIONS)
    counts = dict(head=650, head_train=650, affine_pinned=874, affine_train=874, first_block=650 + 432 + 32,
                  full=24346)
    for c, n in counts.items():
        rows = df[df.condition == c]
        assert (rows.trainable == n).all() and (rows.parameters == 24346).all()
        assert (rows.trainable_share == _trainable_share(n)).all()
    assert (df[df.condition.isin(C.PINNED)].max_buffer_change == 0).all()
    assert (df[~df.condition.isin(C.PINNED)].max_buffer_change > 0).all()  # train mode moves the statistics
    assert (df.max_frozen_change == 0).all()
    assert torch.equal(R.shifted_task(0, "same", "blur", 1.0).templates, R.make_task(0, "A").templates)
    assert torch.equal(R.shifted_task(0, "new", "affine", 1.0).templates, R.make_task(0, "B").templates)
    assert R.shifted_task(0, "new", "affine", 1.0).contrast == 5.0  # chapter 1's shift at strength 1
    # the head-only condition's backbone is shared by its rates and never changes: head A scores the same at each
    assert df[df.condition == "head"].task_a.nunique() == 1
    assert df.accuracy.between(0, 1).all()


def test_one_frankle_unit_compares_equal_counts():
    u = R.FrankleUnit(seed=0, steps=3, batch_size=8, lrs=(0.01,), n_eval=40)
    df = pd.DataFrame(R.run_frankle_unit(u)["records"]).set_index("condition")
    assert list(df.index) == list(R.FRANKLE_CONDITIONS)
    assert df.loc["random_same", "trainable"] == df.loc["bn_affine", "trainable"] == 224 + 650
    assert df.loc["head", "trainable"] == 650 and df.loc["all", "trainable"] == 24346
    assert (df.max_frozen_change == 0).all()
    masks = R.random_masks(ConvBackbone(3), 0)
    assert {n: int(m.sum()) for n, m in masks.items()} == {f"blocks.{i}.conv.weight": 2 * w
                                                           for i, w in enumerate((16, 32, 64))}
    assert all((m.flatten(1).sum(1) == 2).all() for m in masks.values())  # two per output channel
    with pytest.raises(ValueError, match="condition"):
        R.configure_frankle("gamma_only", ConvBackbone(3), 0)
    with pytest.raises(ValueError, match="condition"):
        R.configure_train("last_block", ConvBackbone(3))


def test_frankle_sweep_writes_both_roles_with_the_documented_columns(tmp_path):
    from bnstudy.study.config import Execution
    cfg = R.make_config("quick", frankle_steps=2, frankle_lrs=(0.01,), n_eval=20, train_batch=8)
    ex = Execution(cache_dir=str(tmp_path), n_jobs=1, backend="sequential", progress=False)
    df = R.run_frankle(cfg, ex)
    assert list(df.columns) == list(R.FRANKLE_COLUMNS)
    assert set(df.role) == {"report", "tune"} and set(df.seed) == set(cfg.all_seeds)
    assert df.equals(R.run_frankle(cfg, ex))  # read back from the cache


def test_the_tables_of_a_tiny_run_answer_every_question(tmp_path, monkeypatch):
    """run_tables on a tiny config (stage 1 replaced by a stand-in source, the sweeps in this process) gives the
    documented columns, both roles, and rows from which the claims table asks every family."""
    from bnstudy.study.config import Execution
    monkeypatch.setattr(R, "ensure_sources", lambda *a, **k: None)
    monkeypatch.setattr(R, "load_source", lambda cfg, *a, **k: _source(cfg.seed))
    cfg = R.make_config("quick", seeds=(0, 1), tuning_seeds=(100,), targets=("shifted",), batch_sizes=(8,),
                        budgets=(2, 4), train_size=64, n_eval=40, reference_samples=256, precise_samples=16,
                        shifts=("affine",), train_classes=("same",), train_steps=3, train_batch=8,
                        train_lrs=(0.01, 0.1), frankle_steps=3, frankle_lrs=(0.01, 0.1))
    ex = Execution(cache_dir=str(tmp_path), n_jobs=1, backend="sequential", progress=False)
    main, siblings = R.run_tables(cfg, ex)
    assert set(siblings) == set(R.SIBLING_TABLES)
    for table, columns in ((main, R.MOMENTUM_COLUMNS), (siblings["train"], R.TRAIN_COLUMNS),
                           (siblings["frankle"], R.FRANKLE_COLUMNS)):
        assert list(table.columns) == list(columns) and set(table.role) == {"report", "tune"}
    assert (main.steps_per_epoch == 8).all() and (main.kornblith == 0.1).all()
    cl = C.claims(main, siblings["train"], siblings["frankle"])
    assert list(dict.fromkeys(cl.family)) == list(C.QUESTIONS)
    assert not (cl.kind == "too few seeds").any() and (cl[cl.family == "checks"].kind == "exact").all()


# --- the pre-registered questions (claims.py) on hand-made rows ------------------------------------------------------

REPORT, TUNE = tuple(range(10)), (100, 101, 102)


def _momentum_rows(best="m0.01", noise=0.003, seed_shift=0):
    rng = np.random.default_rng(1 + seed_shift)
    grid = {"m0": 0.0, "m0.001": 0.001, "m0.01": 0.01, "m0.1": 0.1, "m0.3": 0.3}
    out = []
    for seed in REPORT + TUNE:
        base = 0.6 + 0.02 * rng.standard_normal()
        for b in (8, 64):
            for t in (100, 400):
                lg = lambda m: np.log10(max(m, 1e-4))  # noqa: E731
                accs = {c: base - 0.05 * abs(lg(m) - lg(grid[best])) for c, m in grid.items()}
                accs.update(cma=base - 0.03, cma_loaded=base - 0.2, kornblith=accs["m0.01"], precise=accs[best],
                            reference=accs[best] + 0.001)
                for c, a in accs.items():
                    mom = grid.get(c, 0.01 if c == "kornblith" else math.nan)
                    out.append(dict(seed=seed, role="report" if seed in REPORT else "tune", target="shifted",
                                    batch_size=b, budget=t, condition=c, momentum=mom,
                                    accuracy=a + noise * rng.standard_normal(), task_a=0.3,
                                    stats_error=abs(np.log10(max(mom, 1e-4)) + 2) if mom == mom else 0.1,
                                    change_from_source=0.0 if c == "m0" else 1.0))
    return pd.DataFrame(out)


def _rate_rows(conditions, by_shift=True, best_lr=0.1, edge_condition=None, rates=(0.01, 0.1, 1.0), seed_shift=0):
    rng = np.random.default_rng(7 + seed_shift)
    out = []
    for seed in REPORT + TUNE:
        cells = (("new", "affine"), ("new", "noise"), ("same", "blur")) if by_shift else ((None, None),)
        for classes, shift in cells:
            for k, c in enumerate(conditions):
                for lr in rates:
                    peak = rates[-1] if c == edge_condition else best_lr
                    acc = 0.5 + 0.02 * k - 0.1 * abs(np.log10(lr / peak)) + 0.004 * rng.standard_normal()
                    row = dict(seed=seed, role="report" if seed in REPORT else "tune", condition=c, lr=lr,
                               accuracy=acc, task_a=0.8 - 0.05 * k, max_frozen_change=0.0,
                               trainable=874 if c in ("bn_affine", "random_same") else 650)
                    if by_shift:
                        row.update(classes=classes, shift=shift, max_buffer_change=0.0 if c in C.PINNED else 0.5)
                    out.append(row)
    return pd.DataFrame(out)


def test_settings_are_chosen_on_the_tuning_seeds_only_and_edges_are_flagged():
    rows = _momentum_rows(best="m0.01")
    picks = C.momentum_choices(rows)
    assert (picks.condition == "m0.01").all() and not picks.at_edge.any() and len(picks) == 4
    assert C.global_choice(rows) == dict(condition="m0.01", accuracy=pytest.approx(picks.accuracy.mean(), abs=0.01),
                                         at_edge=False)
    # the reported seeds never inform a choice: reported rows that prefer another momentum change nothing
    other = _momentum_rows(best="m0.3", seed_shift=1)
    mixed = pd.concat([other[other.role == "report"], rows[rows.role == "tune"]])
    pd.testing.assert_frame_equal(C.momentum_choices(mixed), picks)
    # the largest momentum is the grid's open end; m = 0 (the source statistics) is closed
    assert C.momentum_choices(other).at_edge.all() and C.global_choice(other)["at_edge"]
    src = _momentum_rows(best="m0")
    assert (C.momentum_choices(src).condition == "m0").all() and not C.momentum_choices(src).at_edge.any()
    # rates: an interior choice is not flagged; a choice at either end is
    train = _rate_rows(R.TRAIN_CONDITIONS, edge_condition="full")
    r = C.rate_choices(train).set_index(["classes", "shift", "condition"])
    assert r.loc[("new", "affine", "head"), "lr"] == 0.1 and not r.loc[("new", "affine", "head"), "at_edge"]
    assert r.loc[("same", "blur", "full"), "lr"] == 1.0 and r.loc[("same", "blur", "full"), "at_edge"]
    shifted = _rate_rows(R.TRAIN_CONDITIONS, best_lr=0.01, seed_shift=3)
    mixed = pd.concat([shifted[shifted.role == "report"], train[train.role == "tune"]])
    pd.testing.assert_frame_equal(C.rate_choices(mixed), C.rate_choices(train))
    chosen = C.chosen_rows(train)
    assert set(chosen.role) == {"report"} and len(chosen) == 10 * 3 * len(R.TRAIN_CONDITIONS)
    assert (chosen[chosen.condition == "head"].lr == 0.1).all()
    # a diverged run (NaN) counts as 0 in a choice
    nan = train.copy()
    nan.loc[(nan.role == "tune") & (nan.lr == 0.1), "accuracy"] = math.nan
    assert (C.rate_choices(nan).lr != 0.1).all()
    assert C.rate_choices(train).at_edge.sum() == 3
    assert not C.rate_choices(_rate_rows(R.FRANKLE_CONDITIONS, by_shift=False), ("condition",)).at_edge.any()


def test_every_question_is_answered_from_hand_made_rows():
    rows = _momentum_rows()
    train = _rate_rows(R.TRAIN_CONDITIONS)
    frankle = _rate_rows(R.FRANKLE_CONDITIONS, by_shift=False)
    cl = C.claims(rows, train, frankle)
    assert list(dict.fromkeys(cl.family)) == list(C.QUESTIONS)
    assert not cl.kind.isna().any() and not (cl.kind == "too few seeds").any()
    keys = set(cl.key)
    cells = [f"shifted_b{b}_t{t}" for b in (8, 64) for t in (100, 400)]
    grid = ["m0", "m0.001", "m0.01", "m0.1", "m0.3", "cma"]
    assert {f"mom_{c}_{cell}" for c in grid + ["cma_loaded", "kornblith"] for cell in cells} <= keys
    assert {f"rule_{r}_{cell}" for r in C.RULES for cell in cells} <= keys
    assert {f"order_{b}_vs_{a}_{cell}" for a, b in zip(grid[:4], grid[1:5]) for cell in cells} <= keys
    assert {f"train_{c}_{k}_{s}" for c in C.TRAIN_COMPARED for k, s in (("new", "affine"), ("same", "blur"))} <= keys
    assert {"bn_mode_affine_new_affine", "bn_mode_affine_retain_new_noise", "bn_mode_head_same_blur",
            "frankle_bn_affine_vs_random_same", "frankle_bn_affine_vs_head"} <= keys
    assert (cl[cl.family == "checks"].kind == "exact").all() and len(cl[cl.family == "checks"]) == 1 + 2 + 6 + 4 + 1
    by = cl.set_index("key")
    assert by.loc["mom_m0.01_shifted_b8_t100", "kind"] == "equivalent"  # the best setting is precise BN's accuracy
    assert by.loc["mom_cma_loaded_shifted_b8_t100", "kind"] == "lower"
    assert by.loc["rule_kornblith_shifted_b64_t400", "kind"] == "equivalent"  # Kornblith's value is the best here
    assert by.loc["train_head_new_affine", "kind"] == "lower"  # full sits 0.1 above head in the hand-made rows
    # a family's comparisons share one Bonferroni correction: one confidence per family
    assert cl[cl.family != "checks"].groupby("family").confidence.nunique().eq(1).all()
    # a failed identity reads "not exact"
    bad = train.copy()
    bad.loc[bad.condition == "affine_pinned", "max_buffer_change"] = 1e-7
    checks = C.claims(rows, bad, frankle).set_index("key")
    assert checks.loc["check_pinned_buffers_affine_pinned", "kind"] == "not exact"


# --- the page (claims.page_numbers, NOTES, tables; the notebook) ------------------------------------------------------

def _page_tables():
    rows = _momentum_rows().assign(unit_wall_s=1.0, steps_per_epoch=lambda d: 512 // d.batch_size,
                                   kornblith=lambda d: (10 * d.batch_size / 512).clip(upper=0.1))
    train = _rate_rows(R.TRAIN_CONDITIONS).assign(unit_wall_s=1.0, trainable_share=0.05)
    frankle = _rate_rows(R.FRANKLE_CONDITIONS, by_shift=False).assign(unit_wall_s=1.0)
    cl = C.claims(rows, train, frankle)
    cfg = R.make_config("quick", batch_sizes=(8, 64), budgets=(100, 400), train_size=512, precise_samples=128)
    return rows, train, frankle, cl, C.page_numbers(rows, train, frankle, cl, cfg)


def test_every_note_key_has_exactly_one_sentence_and_each_rule_flips():
    from bnstudy.study.inference import with_numbers
    rows, train, frankle, cl, N = _page_tables()
    words = C.page_words(cl, N)
    assert {"lead_momentum", "rule_holds", "cma_loaded", "frozen_stats", "lead_affine", "affine_retention",
            "anchor_frankle", "anchor_wu"} <= set(words)
    at = lambda key, **kw: C.notes(C.NOTES, cl, with_numbers(N, kw))[key]  # noqa: E731
    zero = lambda p: {f"{p}_{k}": 0 for k in ("higher", "equivalent", "not_decided", "lower")}  # noqa: E731
    pr = lambda **kw: at("lead_momentum", **{**zero("rule_precise"), "rule_precise_cells": 4, **kw})  # noqa: E731
    assert pr(rule_precise_equivalent=4).startswith("**Re-estimate the statistics after training")
    assert pr(rule_precise_equivalent=3, rule_precise_lower=1).startswith("**Not precise BN everywhere.**")
    assert pr(rule_precise_equivalent=1, rule_precise_not_decided=3).startswith("**Not decided.**")
    rules = {**zero("rule_kornblith"), **zero("rule_global_m"), **zero("rule_pytorch"),
             **{f"rule_{r}_cells": 4 for r in ("kornblith", "global_m", "pytorch")}}
    held = lambda **kw: at("rule_holds", **{**rules, **kw})  # noqa: E731
    assert held(rule_kornblith_equivalent=4).startswith("A rule held in every cell")
    assert "Kornblith's rule was within" in held(rule_kornblith_equivalent=4)
    assert held(rule_kornblith_equivalent=3, rule_kornblith_lower=1).startswith("No momentum rule")
    cma = lambda lo, r: at("cma_loaded", mom_cma_loaded_lower=lo, mom_cma_loaded_cells=4,  # noqa: E731
                           mom_cma_lower=r, mom_cma_cells=4)
    assert "do not fine-tune with a cumulative average" in cma(2, 2) and "With the counter reset" in cma(2, 1)
    assert "; with the counter reset, in 3." in cma(1, 3)
    m0 = lambda lo: at("frozen_stats", mom_m0_lower=lo, mom_m0_cells=4)  # noqa: E731
    assert "(momentum 0: the source statistics" in m0(3) and "(momentum 0) fell" in m0(1)
    aff = lambda **kw: at("lead_affine", **{**zero("bn_mode_affine"), "bn_mode_affine_cells": 6, **kw})  # noqa
    assert aff(bn_mode_affine_lower=2).startswith("**Pin the statistics")
    assert aff(bn_mode_affine_higher=2).startswith("**Train-mode statistics were above pinned ones on the new task in 2 of 6")
    assert aff(bn_mode_affine_higher=1, bn_mode_affine_lower=1).startswith("**Whether to pin depends")
    assert aff(bn_mode_affine_equivalent=6).startswith("**Pinned or train-mode statistics: no difference")
    assert "in 2 of" in at("affine_retention", bn_mode_affine_retain_lower=2) and "in none of" in at(
        "affine_retention", bn_mode_affine_retain_lower=0)
    fr = lambda kind: at("anchor_frankle", frankle_bn_affine_vs_random_same_kind=kind)  # noqa: E731
    assert fr("higher").startswith("**Same direction.**") and fr("lower").startswith("**Opposite direction.**")
    assert fr("equivalent").startswith("**Not shown.**") and fr("not decided").endswith("not decided.")
    big = "m1" if "err_m1_cells" in set(N.key) else "m0_3"
    wu = lambda b, s: at("anchor_wu", **{f"err_{big}_higher": b, f"err_{big}_cells": 4,  # noqa: E731
                                         "err_m0_001_higher": s, "err_m0_001_cells": 4})
    assert wu(4, 2).startswith("**Same direction.**") and wu(1, 4).startswith("**In part.**")


def test_every_note_can_be_pasted_on_another_page():
    """The front page and the guide paste these sentences (bnstudy.study.sphinxext pastes bold and italics only: no
    code spans, links or underscores), so every alternative of every key must be pasteable, not only today's."""
    from bnstudy.study.sphinxext import inline_markdown
    class Ones(dict):
        def __missing__(self, key):
            return 1.0  # every field a number, as the fills give

    bad = [n.key for n in C.NOTES if inline_markdown(n.text.format_map(Ones())) is None]
    assert not bad, bad


def test_the_page_tables_count_the_families_verdicts():
    rows, train, frankle, cl, N = _page_tables()
    main = C.momentum_main_table(rows, cl)
    assert list(main.index) == ["m = 0", "m = 0.001", "m = 0.01", "m = 0.1", "m = 0.3", "cumulative average",
                                "momentum=None on the loaded model", "Kornblith's rule", "precise BN after training"]
    p = C.parsed(cl)
    for t in (100, 400):
        col = main[(f"{t} steps", "vs precise")]
        g = p[(p.q == "mom") & (p.condition == "cma_loaded") & (p.budget == t)]
        assert col["momentum=None on the loaded model"] == "/".join(str(int(g.kind.eq(k).sum())) for k in C.KINDS)
        assert col["precise BN after training"] == "—"
    rt = C.rules_table(cl, rows).set_index("rule")
    assert sum(int(x) for x in rt.loc["Kornblith's rule", "all cells"].split("/")) == 4
    tt = C.train_table(train, cl)
    assert tt[("new classes", "vs full")]["full fine-tuning"] == "reference"
    assert tt[("new classes", "vs full")]["head only, statistics pinned"] == "0/0/0/2"  # full is 0.1 above head
    head_new = p[(p.q == "train") & (p.condition == "head") & (p.classes == "new")]
    assert len(head_new) == 2 and (head_new.kind == "lower").all()
    from bnstudy.study.inference import number
    assert number(N, "exact_failed") == 0 and number(N, "train_cells") == len(C.rate_choices(train))


def test_an_m_of_one_closes_the_momentum_grid():
    """m = 1 (the last batch alone) is the grid's closed end: a choice there is not flagged; a largest m below 1
    is an open end."""
    rows = _momentum_rows(best="m0.3")
    assert C.momentum_choices(rows).at_edge.all()
    top = rows[rows.condition == "m0.3"].assign(condition="m1", momentum=1.0,
                                                accuracy=lambda d: d.accuracy + 0.05)
    closed = pd.concat([rows, top], ignore_index=True)
    picks = C.momentum_choices(closed)
    assert (picks.condition == "m1").all() and not picks.at_edge.any() and not C.global_choice(closed)["at_edge"]


def test_the_page_types_no_outcome_and_leads_with_its_answer():
    import json
    from pathlib import Path

    from test_unknown_task import _markdown_prose, typed_outcomes

    nb = Path(__file__).resolve().parent.parent / "chapters" / "09_momentum_affine.ipynb"
    compound = [d for d in C.DIRECTIONS if " " in d]
    assert typed_outcomes(_markdown_prose(nb), compound) == []
    cells = json.loads(nb.read_text())["cells"]
    first = "".join(cells[0]["source"]).split("\n")
    assert first[0].startswith("# ") and first[2] == "```{admonition} The answer" and first[3] == ":class: answer"
    box = "\n".join(first[:first.index("```", 4)])
    assert "{glue:md}`ch09_lead_momentum`" in box and "{glue:md}`ch09_lead_affine`" in box
    md = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert md.count("```{glue:figure} ch09_fig_") == md.count(":alt: ") == 3
    assert not [line for line in md.split("\n") if line.startswith(("+ ", "* "))]  # no accidental list items
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(len("".join(c["source"]).split("\n")) <= 25 for c in code)
