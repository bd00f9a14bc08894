"""Chapter 4 (heads x optimizers): new heads and optimizer, the validation split, config checks, the
learning-rate rule, findings on hand-made tables with known answers, and the buffer audit."""

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bnstudy.study import inference
from bnstudy.study.config import Execution, RunConfig
from bnstudy.study.engine import eval_tag, make_optimizer
from bnstudy.study import models
from bnstudy.study.experiments.heads import figures, findings, run
from bnstudy.study.inference import number, numbers_table
from bnstudy.study.models import make_head
from bnstudy.study.modes import MODE_NAMES
from bnstudy.study.words import claim, notes

#: The page's direction words by name.
W = findings.vocabulary(0.02)


# --- shared-module additions ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["mlp2", "mlp_ln", "std_linear", "bn_linear", "ln_linear"])
def test_new_heads_map_features_to_logits(kind):
    head = make_head(kind, 64, 10, hidden=32)
    assert head(torch.randn(5, 64)).shape == (5, 10)


def test_input_normalizing_heads_normalize_the_features_then_apply_one_linear_layer():
    f = torch.randn(300, 8, dtype=torch.float64) * torch.arange(1, 9) + 5.0
    std = make_head("std_linear", 8, 3).double()
    assert torch.equal(std.norm(f), f)  # the identity until fitted
    std.norm.fit(f)
    z = std.norm(f)
    assert torch.allclose(z.mean(0), torch.zeros(8, dtype=z.dtype), atol=1e-12)
    assert torch.allclose(z.std(0), torch.ones(8, dtype=z.dtype))
    assert torch.allclose(std(f), std.fc(z))
    const = f.clone()
    const[:, 0] = 2.0  # a constant feature keeps SD 1: finite, centred
    std.norm.fit(const)
    assert float(std.norm.sd[0]) == 1.0 and torch.all(std.norm(const)[:, 0] == 0)
    with pytest.raises(ValueError, match=r"shape \(N >= 2, 8\)"):
        std.norm.fit(f[:1])
    bn, ln = make_head("bn_linear", 8, 3), make_head("ln_linear", 8, 3)
    assert isinstance(bn.norm, torch.nn.BatchNorm1d) and isinstance(ln.norm, torch.nn.LayerNorm)
    assert [type(m) for m in (bn.fc, ln.fc)] == [models.Linear] * 2
    from bnstudy.study.modes import get_mode
    assert get_mode("backbone_eval").batch_statistics("batch", "bn_linear")  # the head's BatchNorm trains
    assert not get_mode("backbone_eval").batch_statistics("batch", "ln_linear")


def test_the_engine_fits_std_linear_on_the_features_the_head_trains_on_and_leaves_the_stream_alone():
    from bnstudy.study.config import RunConfig
    from bnstudy.study.engine import transfer, train_source
    base = dict(seed=0, steps=4, stage1_steps=3, n_eval=40, mode="backbone_eval")
    cfgs = [RunConfig(head=h, **base) for h in ("linear", "std_linear")]
    src = train_source(cfgs[0].source)
    both, alone = transfer(cfgs, src), transfer(cfgs[:1], src)
    assert both[0]["task_b"] == alone[0]["task_b"]  # a std_linear mate draws nothing from the training stream
    assert both[1]["max_buffer_change"] == 0.0  # fitted on a copy: the pinned backbone's buffers never move


def test_mlp2_has_two_hidden_layers_and_mlp_ln_a_layernorm():
    h2 = make_head("mlp2", 64, 10, hidden=32)
    assert [m.out_features for m in h2 if isinstance(m, torch.nn.Linear)] == [32, 32, 10]
    hl = make_head("mlp_ln", 64, 10, hidden=32)
    assert isinstance(hl.norm, torch.nn.LayerNorm) and hl.norm.normalized_shape == (32,)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in hl.modules())


def test_existing_heads_draw_the_same_initialization_as_before():
    # the branches added for mlp2/mlp_ln must not change what linear/mlp/mlp_bn draw from the RNG
    torch.manual_seed(3)
    mlp = make_head("mlp", 64, 10, hidden=16)
    torch.manual_seed(3)
    w1 = torch.empty(16, 64).uniform_(-1 / 8, 1 / 8)
    assert torch.equal(mlp.fc1.weight, w1)


def test_sgd_plain_has_no_momentum_and_sgd_keeps_it():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert make_optimizer("sgd_plain", p, 0.1).param_groups[0]["momentum"] == 0
    assert make_optimizer("sgd", p, 0.1).param_groups[0]["momentum"] == 0.9
    with pytest.raises(ValueError, match="sgd_plain"):
        make_optimizer("rmsprop", p, 0.1)


def test_validation_split_has_its_own_tag_and_test_is_unchanged():
    assert eval_tag("B") == "B" and eval_tag("B", "test") == "B"
    assert eval_tag("B", "validation") != "B"
    with pytest.raises(ValueError, match="eval_split"):
        eval_tag("B", "train")
    with pytest.raises(ValueError, match="eval_split"):
        RunConfig(eval_split="train")


# --- config ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    (dict(tuning_seeds=(0,)), "tuning_seeds must be .*disjoint from seeds.*got \\[0\\]"),
    (dict(tuning_seeds=(-1,)), "tuning_seeds must be one or more seeds >= 0"),
    (dict(heads=("linear", "cnn")), "heads must be one or more of \\['linear', 'mlp', 'mlp2', 'mlp_bn', 'mlp_ln', 'std_linear', 'bn_linear', 'ln_linear'\\]"
                                    ".*got \\['linear', 'cnn'\\]"),
    (dict(heads=("linear", "linear")), "heads must not repeat"),
    (dict(optimizers=("sgd", "lbfgs", "adam")), "optimizers must be all of \\['sgd', 'sgd_plain', 'adam'\\]"),
    (dict(heads=("mlp",)), "heads must be .*including 'linear' and 'mlp_bn'.*got \\['mlp'\\]"),
    (dict(heads=("linear", "mlp")), "including 'linear' and 'mlp_bn'.*got \\['linear', 'mlp'\\]"),
    (dict(optimizers=("sgd", "adam")), "optimizers must be all of.*got \\['sgd', 'adam'\\]"),
    (dict(mid_strength=1.0), "mid_strength must be a number > 0 and < 1"),
    (dict(mid_strength=0.0), "mid_strength"),
    (dict(lr_sgd=(0.1, 0.01)), "lr_sgd must be one or more increasing learning rates > 0, got \\[0.1, 0.01\\]"),
    (dict(lr_sgd=(0.1, 0.1)), "lr_sgd must not repeat"),
    (dict(lr_adam=(0.0, 0.01)), "lr_adam must be one or more increasing learning rates > 0"),
    (dict(lr_adam=("fast",)), "lr_adam\\[0\\]"),
    (dict(margin=0.0), "margin"),
    (dict(seeds=1), "seeds must name at least 2"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(steps_check=150), "steps_check must be larger than steps"),
    (dict(steps_check_seeds=3), "steps_check_seeds must be from 2 .* to the number of seeds, got 3"),
    # one seed would give the step check no interval at all (t_interval of one value has none)
    (dict(steps_check_seeds=1), "steps_check_seeds must be from 2"),
    (dict(n_eval=0), "n_eval"),  # the run sizes: the engine's own check
])
def test_config_errors_name_the_parameter(override, message):
    with pytest.raises(ValueError, match=message):
        run.make_config("quick", **override)


def test_full_profile_grids_contain_the_quick_grids_and_reach_further():
    q, f = run.make_config("quick"), run.make_config("full")
    for o in run.OPTIMIZERS:
        assert set(q.lr_grid(o)) < set(f.lr_grid(o)) and min(f.lr_grid(o)) < min(q.lr_grid(o))
    # the first full run's edges: separate statistics at the top (sgd, adam), pinned at the bottom (sgd_plain)
    assert max(f.lr_sgd) > 0.16 and max(f.lr_adam) > 0.1 and min(f.lr_sgd_plain) < 0.005
    assert f.steps_check >= 4 * f.steps and f.steps_check_seeds == len(f.seeds) >= 10
    assert set(run.INPUT_NORM_HEADS) <= set(f.long_heads()) and "linear" in f.long_heads()
    assert len(f.seeds) >= 10 and set(f.heads) == set(run.HEADS)


def test_config_shifts_and_runs_are_paired_grids():
    cfg = run.make_config("quick", heads=("linear", "mlp_bn"), optimizers=("adam", "sgd", "sgd_plain"), mid_strength=0.25)
    assert cfg.shifts() == {"none": (0.0, 1.0), "mid": (1.0, 2.0), "ref": (4.0, 5.0)}
    lrs = {(h, o): 0.01 for h in cfg.heads for o in cfg.optimizers}
    runs = cfg.run_configs(lrs)
    assert len(runs) == len(cfg.seeds) * 3 * 2 * 3 * 4
    per_mode = {(h, o, m): 0.001 * (1 + MODE_NAMES.index(m)) for h in cfg.heads for o in cfg.optimizers
                for m in MODE_NAMES}
    assert all(r.lr == per_mode[(r.head, r.optimizer, r.mode)] for r in cfg.run_configs(per_mode))
    with pytest.raises(KeyError, match="mode='train_mode'"):
        cfg.run_configs({})
    check = cfg.steps_check_configs(per_mode)
    assert {r.steps for r in check} == {cfg.steps_check} and {r.mode for r in check} == set(run.STEPS_CHECK_MODES)
    assert {r.seed for r in check} == set(cfg.seeds[:cfg.steps_check_seeds])
    assert {r.head for r in check} == {"linear", "mlp_bn"} == set(cfg.long_heads())
    assert {r.optimizer for r in check} == set(cfg.optimizers) and all((r.brightness, r.contrast) == (4.0, 5.0)
                                                                       for r in check)
    long_search = cfg.steps_search_configs()  # the longer budget tunes its own rates on the tuning seeds
    assert {r.seed for r in long_search} == set(cfg.tuning_seeds) and {r.steps for r in long_search} == {cfg.steps_check}
    assert all(r.eval_split == "validation" and (r.brightness, r.contrast) == (4.0, 5.0) for r in long_search)
    assert {r.mode for r in long_search} == set(run.STEPS_CHECK_MODES)
    assert all(r.eval_split == "test" for r in runs)
    search = cfg.search_configs()
    assert {r.seed for r in search} == set(cfg.tuning_seeds)
    assert all(r.eval_split == "validation" for r in search)
    assert {(r.brightness, r.contrast) for r in search} == set(cfg.shifts().values())
    assert {r.lr for r in search if r.optimizer == "adam"} == set(cfg.lr_adam)


# --- the learning-rate rule ------------------------------------------------------------------------------------------

def _search(acc: dict) -> pd.DataFrame:
    rows = [dict(seed=s, head=h, optimizer=o, lr=lr, mode=m, task_b=a + 0.01 * (m == "train_mode"),
                 eval_split="validation")
            for (h, o, lr), a in acc.items() for s in (1000, 1001) for m in MODE_NAMES]
    return pd.DataFrame(rows)


def test_chosen_lr_is_the_best_mean_over_modes_with_ties_to_the_smaller():
    s = _search({("linear", "sgd", 0.01): 0.5, ("linear", "sgd", 0.1): 0.7, ("linear", "sgd", 1.0): 0.6,
                 ("mlp", "adam", 0.001): 0.8, ("mlp", "adam", 0.01): 0.8})
    assert run.chosen_lrs(s, "mean") == {("linear", "sgd"): 0.1, ("mlp", "adam"): 0.001}
    assert run.chosen_lrs(s) == {(h, o, m): lr for (h, o), lr in run.chosen_lrs(s, "mean").items() for m in MODE_NAMES}
    tab = run.search_table(s)
    crit = tab[(tab["mode"] == "mean") & (tab["lr"] == 0.1)]["val_accuracy"].iloc[0]
    assert crit == pytest.approx(0.7025)


def test_chosen_lr_per_mode_takes_each_modes_own_best_rate():
    rows = [dict(seed=s, head="linear", optimizer="sgd", lr=lr, mode=m, eval_split="validation",
                 task_b=({0.01: 0.6, 0.1: 0.4} if m in run.PINNED_MODES else {0.01: 0.5, 0.1: 0.8})[lr])
            for s in (1000, 1001) for lr in (0.01, 0.1) for m in MODE_NAMES]
    s = pd.DataFrame(rows)
    pm = run.chosen_lrs(s)
    assert pm == {("linear", "sgd", m): (0.01 if m in run.PINNED_MODES else 0.1) for m in MODE_NAMES}
    assert run.chosen_lrs(s, "mean") == {("linear", "sgd"): 0.1}  # mean over modes 0.55 vs 0.6
    with pytest.raises(ValueError, match="rule"):
        run.chosen_lrs(s, "median")
    SF = findings.search_findings(s)
    assert number(SF, "gap_own_rates_linear_sgd") == pytest.approx(0.8 - 0.6)  # separate - backbone_eval
    assert number(SF, "gap_mean_rate_linear_sgd") == pytest.approx(0.8 - 0.4)
    assert number(SF, "lr_pinned_linear_sgd") == 0.01 and number(SF, "lr_separate_linear_sgd") == 0.1
    with pytest.raises(ValueError, match="separate_stats"):
        findings.search_findings(s[s["mode"] != "separate_stats"])


def test_lr_edges_name_the_end():
    grids = {"sgd": (0.01, 0.1, 1.0), "adam": (0.001,)}
    e = findings.lr_edges({("linear", "sgd", "separate_stats"): 1.0, ("linear", "sgd", "backbone_eval"): 0.01,
                     ("linear", "sgd", "all_eval"): 0.1, ("linear", "adam"): 0.001}, grids)
    assert e == [(("linear", "sgd", "separate_stats"), 1.0, "top"), (("linear", "sgd", "backbone_eval"), 0.01, "bottom")]
    cells = lambda lrs: number(findings.lr_choice_findings(lrs, grids), "lr_edge_cells")  # noqa: E731
    assert cells({k: v for k, v, _ in e}) == \
        "linear/sgd/separate_stats at the top (1), linear/sgd/backbone_eval at the bottom (0.01)"
    assert cells({("linear", "sgd", "all_eval"): 0.1}) == "none"


def test_each_shift_gets_its_own_rates():
    """The search covers every shift and each shift's runs use that shift's choice (referee s7 item 1: rates
    tuned at chapter 1's shift and reused without a shift gave pinned 0.005 against separate 0.16 on nearly
    identical features)."""
    rows = [dict(seed=s, shift=sh, head="linear", optimizer="sgd", lr=lr, mode=m, eval_split="validation",
                 task_b=({0.01: 0.6, 0.1: 0.4} if m in run.PINNED_MODES and sh == "ref" else {0.01: 0.5, 0.1: 0.8})[lr])
            for s in (1000, 1001) for sh in ("none", "mid", "ref") for lr in (0.01, 0.1) for m in MODE_NAMES]
    s = pd.DataFrame(rows)
    by = run.chosen_lrs_by_shift(s)
    assert by["ref"][("linear", "sgd", "backbone_eval")] == 0.01 and by["none"][("linear", "sgd", "backbone_eval")] == 0.1
    assert by["ref"] == run.chosen_lrs(s, shift="ref")
    with pytest.raises(ValueError, match="covers shifts \\['none', 'mid', 'ref'\\]; give shift="):
        run.chosen_lrs(s)
    with pytest.raises(ValueError, match="shift must be one of the searched shifts"):
        run.chosen_lrs(s, shift="far")
    with pytest.raises(ValueError, match="covers shifts"):
        findings.search_findings(s)
    assert number(findings.search_findings(s[s["shift"] == "ref"]), "gap_own_rates_linear_sgd") == pytest.approx(0.8 - 0.6)
    tab = run.search_table(s)
    assert set(tab["shift"]) == {"none", "mid", "ref"} and len(tab) == 3 * 2 * (len(MODE_NAMES) + 1)
    cfg = run.make_config("quick")
    runs = cfg.run_configs({sh: {(h, o, m): 0.1 if sh == "none" else 0.01 for h in cfg.heads for o in cfg.optimizers
                                 for m in MODE_NAMES} for sh in ("none", "mid", "ref")})
    assert {r.lr for r in runs if (r.brightness, r.contrast) == (0.0, 1.0)} == {0.1}
    assert {r.lr for r in runs if (r.brightness, r.contrast) != (0.0, 1.0)} == {0.01}
    search = cfg.search_configs()
    assert {(r.brightness, r.contrast) for r in search} == set(cfg.shifts().values())
    with pytest.raises(ValueError, match="needs the search's shift column"):
        run.chosen_lrs_by_shift(s.drop(columns="shift"))


def test_chosen_lr_refuses_a_search_scored_on_the_test_set():
    s = _search({("linear", "sgd", 0.01): 0.5}).assign(eval_split="test")
    with pytest.raises(ValueError, match="validation"):
        run.chosen_lrs(s)


# --- findings on hand-made tables ------------------------------------------------------------------------------------

SEEDS = range(6)
NOISE = np.array([0.01, -0.01, 0.005, -0.005, 0.0, 0.002])
WIGGLE = np.array([0.004 * (-1) ** s for s in SEEDS])  # the per-seed spread of every gap: mean 0


def _table(gaps: dict, train_adv: dict | None = None, bn_diff: float = 0.0) -> pd.DataFrame:
    """task_b(separate) = 0.6 + noise; pinned = separate - gap - wiggle, so the per-seed gap separate_stats -
    backbone_eval is gap + wiggle; train_mode = separate + train_adv[opt]; mlp_bn's all_eval = backbone_eval +
    bn_diff. gaps: {(shift, head, opt): gap}."""
    rows = []
    for (shift, head, opt), gap in gaps.items():
        for s in SEEDS:
            sep = 0.6 + NOISE[s]
            pin = sep - gap - WIGGLE[s]
            tb = {"separate_stats": sep, "train_mode": sep + (train_adv or {}).get(opt, 0.0),
                  "backbone_eval": pin, "all_eval": pin + (bn_diff if head == "mlp_bn" else 0)}
            for m in MODE_NAMES:
                a0 = 0.9
                rows.append(dict(seed=s, shift=shift, head=head, optimizer=opt, mode=m, task_b=tb[m], n_classes=10,
                                 task_a_before=a0, task_a_after=a0 - (0.5 if m == "train_mode" else 0.0)))
    return pd.DataFrame(rows)


def _verdict(C, key):
    return claim(C, key)["verdict"]


def _page(df, lrs=None, grids=None, margin=0.02):
    """The page's claims table and numbers table of ``df``."""
    C = findings.claims(df, margin)
    return C, findings.findings(df, lrs, grids, margin, C=C)


def _lrs(F) -> dict:
    """The chosen rates a numbers table holds (``lrs_<key>`` rows), by ``<key>``."""
    return {k[len("lrs_"):]: v for k, v in zip(F["key"], F["value"]) if k.startswith("lrs_")}


def test_gap_verdicts_direction_equivalence_and_the_sign():
    df = _table({("ref", "linear", "sgd"): 0.15, ("ref", "linear", "adam"): 0.0,
                 ("ref", "mlp_bn", "sgd"): -0.10, ("ref", "mlp_bn", "adam"): 0.01})
    C, R = _page(df, margin=0.02)
    assert _verdict(C, "gap_ref_linear_sgd") == W["gap_higher"] == "separate_stats higher"  # pinning costs
    assert _verdict(C, "gap_ref_linear_adam") == "equivalent within \u00b10.02"
    assert _verdict(C, "gap_ref_mlp_bn_sgd") == W["gap_lower"]
    assert claim(C, "gap_ref_linear_sgd")["estimate"] == pytest.approx(0.15, abs=1e-12)  # separate - backbone_eval
    # +0.01 with a tight interval: inside the margin, but the interval excludes 0, and a direction shown takes
    # precedence (the old rule called it "within margin")
    assert claim(C, "gap_ref_mlp_bn_adam")["low"] > 0 and _verdict(C, "gap_ref_mlp_bn_adam") == W["gap_higher"]
    assert [number(R, f"{k}_ref") for k in ("n_separate_higher", "n_separate_lower", "n_equivalent", "n_not_decided")
            ] == [2, 1, 1, 0]
    assert number(R, "separate_higher_ref") == "linear/sgd, mlp_bn/adam" and number(R, "equivalent_ref") == "linear/adam"
    # a tiny margin: the exact tie is no longer shown equivalent, and no tie is claimed without the test
    assert _verdict(findings.claims(df, margin=0.001), "gap_ref_linear_adam") == inference.NOT_DECIDED
    # absolute accuracies beside the gap; the best pinned cell by absolute accuracy
    gt = findings.gap_table(df).set_index("key")
    assert gt.loc["gap_ref_linear_sgd", "task_b_separate"] == pytest.approx(0.6 + NOISE.mean())
    assert gt.loc["gap_ref_linear_sgd", "task_b_pinned"] == pytest.approx(0.6 + NOISE.mean() - 0.15)
    best = findings.best_pinned_claim(C, R)
    assert number(R, "best_pinned_cell") == "mlp_bn/sgd" and best["estimate"].iloc[0] == pytest.approx(-0.10)
    assert list(best["key"]) == ["best_pinned_gap"] and best["verdict"].iloc[0] == W["gap_lower"]
    assert best.drop(columns="key").equals(C[C["key"] == "gap_ref_mlp_bn_sgd"].drop(columns="key"))
    assert number(R, "n_eval") == 0 and math.isnan(number(R, "eval_se"))
    p = 0.6 + NOISE.mean()
    assert number(findings.findings(df.assign(n_eval=1000)), "eval_se") == pytest.approx((p * (1 - p) / 1000) ** 0.5)
    se = (p * (1 - p) / 1000) ** 0.5
    assert number(findings.findings(df.assign(n_eval=1000), margin=0.05), "margin_in_se") == pytest.approx(0.05 / se)
    assert math.isnan(number(R, "margin_in_se"))


def test_a_cell_whose_bonferroni_interval_spans_zero_is_counted_not_decided_even_where_holm_would_call_it():
    """The glossary's one verdict per claim (issue 35): counts count the printed verdicts; a cell whose Holm p is
    below 0.05 but whose printed Bonferroni interval spans zero is "not decided" in its table and in every count."""
    df = _table({("ref", "linear", "sgd"): 0.10, ("ref", "linear", "adam"): 0.0})
    b = (df["optimizer"] == "adam") & (df["mode"] == "backbone_eval")
    df.loc[b, "task_b"] -= np.array([0.02, 0.05, -0.005, 0.03, 0.01, 0.04]) - WIGGLE  # per-seed gaps of cell b
    C, F = _page(df)
    b = claim(C, "gap_ref_linear_adam")
    assert b["verdict"] == inference.NOT_DECIDED and b["low"] < 0  # 97.5% interval spans 0
    assert b["p_adjusted"] < 0.05 and b["count_kind"] == inference.NOT_DECIDED  # Holm would call it; the count does not
    assert number(F, "n_separate_higher_ref") == 1 and number(F, "n_not_decided_ref") == 1
    assert number(F, "separate_higher_ref") == "linear/sgd"


def test_equivalence_feasibility_is_the_largest_sd_a_zero_gap_can_pass():
    from scipy import stats
    fam = inference.Family(15)
    sd = findings.equivalence_max_sd(0.02, 10, fam)
    assert sd == pytest.approx(0.02 * 10 ** 0.5 / stats.t.ppf(1 - 0.05 / 15, 9))  # TOST at alpha/m, one-sided
    for f, kind in ((0.99, "equivalent"), (1.01, "not decided")):  # a zero-mean gap with SD just below / above
        d = np.array([1.0, -1.0] * 5) * sd * f * np.sqrt(9 / 10)  # sample SD (ddof=1) = sd * f
        assert np.std(d, ddof=1) == pytest.approx(sd * f)
        assert inference.decide(d, margin=0.02, family=fam).kind == kind
    assert math.isnan(findings.equivalence_max_sd(0.02, 1, fam))
    df = _table({("ref", "linear", "sgd"): 0.1, ("ref", "linear", "adam"): 0.0})
    R = findings.findings(df)
    assert number(R, "equiv_max_sd") == pytest.approx(findings.equivalence_max_sd(0.02, len(SEEDS), inference.Family(2)))
    assert number(R, "n_equiv_feasible_ref") == 2
    assert number(R, "equiv_sd_median_ref") == pytest.approx(np.std(WIGGLE, ddof=1))


def test_adam_sgd_interaction_is_paired_and_corrected_over_heads():
    gaps = {("ref", "linear", "sgd"): 0.12, ("ref", "linear", "adam"): 0.02,
            ("ref", "mlp", "sgd"): 0.02, ("ref", "mlp", "adam"): 0.04,
            ("ref", "mlp_bn", "sgd"): 0.05, ("ref", "mlp_bn", "adam"): 0.05}
    df = _table(gaps)
    # per-seed noise in adam's mlp_bn cell only, so its difference has a spread and spans zero and the margin
    m = (df["head"] == "mlp_bn") & (df["optimizer"] == "adam") & df["mode"].isin(run.PINNED_MODES)
    df.loc[m, "task_b"] += np.where(df.loc[m, "seed"] % 2 == 0, 0.03, -0.03)
    C, F = _page(df)
    assert claim(C, "adam_vs_sgd_linear")["estimate"] == pytest.approx(-0.10)  # gap(adam) - gap(sgd)
    assert {h: _verdict(C, f"adam_vs_sgd_{h}") for h in ("linear", "mlp", "mlp_bn")} == {
        "linear": W["adam_lower"], "mlp": W["adam_higher"], "mlp_bn": inference.NOT_DECIDED}
    assert number(F, "interaction_confidence") == pytest.approx(1 - 0.05 / 3) and number(F, "interaction_m") == 3
    t = findings.family(C, "interaction")
    d = findings.gap_values(df, "ref", "mlp_bn", "adam") - findings.gap_values(df, "ref", "mlp_bn", "sgd")
    assert t.set_index("head").loc["mlp_bn", "low"] == pytest.approx(inference.t_interval(d, 1 - 0.05 / 3).low)
    shown = figures.interaction_display(t)
    assert shown.loc["linear", "verdict"] == W["adam_lower"] and shown.loc["linear"].iloc[0].startswith("-0.100 [")


def test_one_seed_is_too_few_and_never_equivalent():
    df = _table({("ref", "linear", "sgd"): 0.0, ("ref", "linear", "adam"): 0.0})
    C, F = _page(df[df["seed"] == 0])
    assert _verdict(C, "gap_ref_linear_sgd") == inference.TOO_FEW and math.isnan(claim(C, "gap_ref_linear_sgd")["low"])
    assert number(F, "n_too_few_ref") == 2 and number(F, "n_equivalent_ref") == 0


def test_gap_intervals_are_bonferroni_corrected_over_the_cells():
    df = _table({("ref", h, o): 0.05 for h in ("linear", "mlp_bn") for o in ("sgd", "adam")})
    C, F = _page(df)
    assert number(F, "n_cells") == 4 and number(F, "confidence") == pytest.approx(1 - 0.05 / 4)
    d = findings.gap_values(df, "ref", "linear", "sgd")
    wide, narrow = inference.t_interval(d, 1 - 0.05 / 4), inference.t_interval(d)
    assert claim(C, "gap_ref_linear_sgd")["low"] == pytest.approx(wide.low) and wide.low < narrow.low


def test_the_reference_is_backbone_eval_and_bn_head_modes_differ():
    # all_eval 0.05 above backbone_eval for mlp_bn: the old "best pinned mode" took all_eval; the reference stays
    df = _table({("ref", "linear", "sgd"): 0.1, ("ref", "mlp_bn", "sgd"): 0.1}, bn_diff=0.05)
    C = findings.claims(df)
    assert claim(C, "gap_ref_mlp_bn_sgd")["estimate"] == pytest.approx(0.1)
    assert claim(C, "bn_ref_sgd")["estimate"] == pytest.approx(0.05) and _verdict(C, "bn_ref_sgd") == W["bn_higher"]
    C0, F0 = _page(_table({("ref", "linear", "sgd"): 0.0}))  # no head with its own BatchNorm: no bn claims
    assert "bn" not in set(C0["family"]) and number(F0, "bn_m") == 0 and math.isnan(number(F0, "bn_confidence"))
    # reported at every shift, not only chapter 1's, as one family
    C2, F2 = _page(_table({(s, "mlp_bn", "sgd"): 0.1 for s in ("none", "mid", "ref")}, bn_diff=-0.07))
    bn = C2[C2["family"] == "bn"]
    assert set(bn["key"]) == {"bn_none_sgd", "bn_mid_sgd", "bn_ref_sgd"} and number(F2, "bn_m") == 3
    assert bn["estimate"].to_numpy() == pytest.approx([-0.07] * 3) and set(bn["verdict"]) == {W["bn_lower"]}


def test_finding3_is_read_from_the_linear_heads_gap_claim():
    gaps = {("ref", "linear", "sgd"): 0.1, ("ref", "linear", "sgd_plain"): 0.0, ("ref", "linear", "adam"): -0.1,
            ("ref", "mlp", "sgd"): 0.1, ("ref", "mlp", "sgd_plain"): 0.1, ("ref", "mlp", "adam"): 0.1}
    C, F = _page(_table(gaps))
    assert {o: _verdict(C, f"gap_ref_linear_{o}") for o in ("sgd", "sgd_plain", "adam")} == {
        "sgd": W["gap_higher"], "sgd_plain": "equivalent within \u00b10.02", "adam": W["gap_lower"]}
    assert {o: number(F, f"f3_heads_holding_{o}") for o in ("sgd", "sgd_plain", "adam")} == {
        "sgd": 2, "sgd_plain": 1, "adam": 1}
    df = _table({("ref", "linear", "adam"): 0.03})
    m = df["mode"].isin(run.PINNED_MODES)
    df.loc[m, "task_b"] += np.where(df.loc[m, "seed"] % 2 == 0, 0.04, -0.04)  # spans 0 and the margin
    assert _verdict(findings.claims(df), "gap_ref_linear_adam") == inference.NOT_DECIDED


def test_identities_are_exact_checks_that_fail_when_broken():
    C, F = _page(_table({("ref", "linear", "sgd"): 0.1, ("ref", "mlp", "sgd"): 0.1}))
    keys = ("check_train_is_separate", "check_pinned_keep_a", "check_task_a_loss_shared")
    assert [_verdict(C, k) for k in keys] == [inference.EXACT] * 3
    assert number(F, "train_mode_task_a_change").mean == pytest.approx(-0.5)  # after - before: lost, negative
    C1 = findings.claims(_table({("ref", "linear", "sgd"): 0.1}, train_adv={"sgd": 0.001}))
    assert _verdict(C1, "check_train_is_separate") == inference.NOT_EXACT
    assert claim(C1, "check_train_is_separate")["estimate"] == pytest.approx(0.001)
    df = _table({("ref", "linear", "sgd"): 0.1, ("ref", "mlp", "sgd"): 0.1})
    df.loc[(df["mode"] == "train_mode") & (df["head"] == "mlp") & (df["seed"] == 1), "task_a_after"] += 0.001
    assert _verdict(findings.claims(df), "check_task_a_loss_shared") == inference.NOT_EXACT


def test_keep_a_check_fails_when_a_pinned_mode_changes_task_a():
    df = _table({("ref", "linear", "sgd"): 0.1})
    df.loc[(df["mode"] == "all_eval") & (df["seed"] == 2), "task_a_after"] -= 0.001
    assert _verdict(findings.claims(df), "check_pinned_keep_a") == inference.NOT_EXACT


def test_findings_needs_every_mode_and_the_reference_shift():
    df = _table({("ref", "linear", "sgd"): 0.1})
    for page in (findings.findings, findings.claims):
        with pytest.raises(ValueError, match="separate_stats"):
            page(df[df["mode"] != "separate_stats"])
        with pytest.raises(ValueError, match="ref"):
            page(df.assign(shift="none"))


def test_lr_edge_count():
    df = _table({("ref", "linear", "sgd"): 0.1})
    R = findings.findings(df, lrs={("linear", "sgd"): 0.16, ("linear", "adam"): 0.003}, grids=run.LR_GRIDS)
    assert number(R, "n_lr_at_edge") == 1 and _lrs(R) == {"linear_sgd": 0.16, "linear_adam": 0.003}
    assert number(R, "lr_edge_cells") == "linear/sgd at the top (0.16)"
    R = findings.findings(df, lrs={("linear", "sgd", "separate_stats"): 0.005}, grids=run.LR_GRIDS)
    assert _lrs(R) == {"linear_sgd_separate_stats": 0.005}
    assert number(R, "lr_edge_cells") == "linear/sgd/separate_stats at the bottom (0.005)"


def test_steps_findings_pair_the_two_budgets():
    short = _table({("ref", "linear", "sgd"): 0.1, ("ref", "linear", "adam"): 0.02}).assign(steps=800)
    long = short[short["mode"].isin(run.STEPS_CHECK_MODES) & (short["seed"] < 4)].copy().assign(steps=3200)
    sep = long["mode"] == "separate_stats"
    long.loc[sep, "task_b"] += 0.05  # separate gains 0.05; pinned gains 0.05 + 0.04 (sgd) -> gap narrows by 0.04
    long.loc[~sep, "task_b"] += np.where(long.loc[~sep, "optimizer"] == "sgd", 0.09, 0.05)
    S = findings.steps_findings(short, long)
    assert [number(S, k) for k in ("steps_short", "steps_long", "n_seeds", "n_cells")] == [800, 3200, 4, 2]
    assert number(S, "separate_gain_linear_sgd").mean == pytest.approx(0.05)
    assert number(S, "pinned_gain_linear_sgd").mean == pytest.approx(0.09)
    C = findings.steps_claims(short, long).set_index("key")
    assert C.loc["gap_long_linear_sgd", "estimate"] == pytest.approx(0.06)
    assert C.loc["gap_long_linear_sgd", "verdict"] == W["gap_long_higher"]
    assert C.loc["steps_change_linear_sgd", "estimate"] == pytest.approx(-0.04)
    assert C.loc["steps_change_linear_sgd", "verdict"] == W["steps_smaller"]
    # no change at all in any seed: zero spread at 0, inside the margin (the old rule: "inconclusive")
    assert C.loc["steps_change_linear_adam", "verdict"] == "equivalent within \u00b10.02"
    assert set(C["m"]) == {2} and C["confidence"].iloc[0] == pytest.approx(1 - 0.05 / 2)
    with pytest.raises(ValueError, match="no rows"):
        findings.steps_findings(short, long.iloc[:0])


def test_tidy_tables_have_one_value_per_row():
    df = _table({("ref", "linear", "sgd"): 0.1, ("none", "linear", "sgd"): 0.0})
    gt = findings.gap_table(df)
    assert len(gt) == 2 and all(inference.is_verdict(v, findings.DIRECTIONS) for v in gt["verdict"])
    at = findings.summary_table(df, ["shift", "head", "optimizer", "mode"], ["task_b", "task_a_after"])
    assert len(at) == 2 * 4 * 2 and not at.isna().any().any()


def test_every_glued_verdict_is_a_word_of_the_vocabulary():
    """The book-wide rule: every glued ``*_verdict`` passes ``inference.is_verdict(text, DIRECTIONS)``, and the
    page's direction words are declared."""
    from bnstudy.study.pages import claims_items
    gaps = {(s, h, o): g for s in ("none", "ref") for h, g in (("linear", 0.1), ("mlp_bn", -0.05))
            for o in ("sgd", "adam")}
    df = _table(gaps, bn_diff=0.01)
    C = findings.claims(df)
    assert set(C["family"]) == {"gap", "interaction", "bn", "checks", "hc", "sc"}
    items = claims_items("ch04", findings.printed(C))
    verdicts = {k: v.data.strip("*") for k, v in items if k.endswith("_verdict")}
    assert len(verdicts) == len(C) and all(inference.is_verdict(v, findings.DIRECTIONS) for v in verdicts.values())
    assert not inference.is_verdict("inconclusive", findings.DIRECTIONS) and len(set(findings.DIRECTIONS)) == len(findings.DIRECTIONS)
    assert "ch04_gap_ref_linear_sgd_verdict" in verdicts and "ch04_check_pinned_keep_a_verdict" in verdicts


# --- the audit -------------------------------------------------------------------------------------------------------

def test_audit_matches_declaration_catches_an_unexpected_move():
    t = pd.DataFrame([dict(mode="all_eval", part="head_b", declared=False, moved=False, max_change=0.0)])
    check = lambda table: claim(findings.audit_claims(table), "audit_matches")  # noqa: E731
    assert check(t).verdict == inference.EXACT and check(t.assign(moved=True)).verdict == inference.NOT_EXACT
    assert check(t).family == "checks"


def test_bn_head_buffers_move_exactly_where_each_mode_declares():
    table, audits = run.audit_buffers(seed=0, steps=2, stage1_steps=3)
    assert claim(findings.audit_claims(table), "audit_matches").verdict == inference.EXACT
    t = table.set_index(["mode", "part"])["moved"]
    assert t[("backbone_eval", "head_b")] and not t[("all_eval", "head_b")]  # the two pinned modes now differ
    assert not t[("backbone_eval", "backbone")] and t[("separate_stats", "backbone_b")]
    assert set(audits) == set(MODE_NAMES)


# --- the geometry-gap link and the execution cost ------------------------------------------------------------------

def _geom(curv: dict, probe: dict) -> pd.DataFrame:
    """Geometry rows: separate curvature 1 and probe 0.5; pinned curvature curv[(seed, shift)], probe 0.5 +
    probe[(seed, shift)]."""
    rows = []
    for (s, shift), c in curv.items():
        rows.append(dict(seed=s, shift=shift, statistics="separate", curvature=1.0, probe_accuracy=0.5))
        rows.append(dict(seed=s, shift=shift, statistics="pinned", curvature=c, probe_accuracy=0.5 + probe[(s, shift)]))
    return pd.DataFrame(rows)


def _gap_rows(gap: dict, head="linear", opt="sgd") -> pd.DataFrame:
    """Runs whose per-seed gap (separate_stats - backbone_eval) is gap[(seed, shift)]."""
    rows = []
    for (s, shift), g in gap.items():
        tb = {"separate_stats": 0.5, "train_mode": 0.5, "backbone_eval": 0.5 - g, "all_eval": 0.5 - g - 0.01}
        rows += [dict(seed=s, shift=shift, head=head, optimizer=opt, mode=m, task_b=tb[m]) for m in MODE_NAMES]
    return pd.DataFrame(rows)


def _row(t, scope, measure):
    return t[(t["scope"] == scope) & (t["measure"] == measure)].iloc[0]


def test_link_shows_the_predicted_sign_when_the_gap_rises_with_the_curvature_ratio():
    seeds = range(10)
    curv = {(s, "ref"): 10.0 + s for s in seeds}
    probe = {(s, "ref"): 0.01 * ((-1) ** s) * (s % 3) for s in seeds}  # unrelated to the gap
    gap = {(s, "ref"): 0.01 * s for s in seeds}  # perfectly increasing in the curvature ratio
    t = findings.link_table(_gap_rows(gap), _geom(curv, probe), n_boot=300)
    r = _row(t, "ref", "curvature_ratio")
    assert r["estimate"] == pytest.approx(1.0) and r["verdict"] == W["link_positive"] and r["n"] == 10
    assert r["low"] > 0 and r["predicted_sign"] == 1
    assert set(t["m"]) == {4} and t["confidence"].iloc[0] == pytest.approx(1 - 0.05 / 4)  # one family
    # the same rho and interval as inference's rank correlation at the family's confidence
    x = [curv[(s, "ref")] for s in seeds]
    y = [gap[(s, "ref")] for s in seeds]
    probe_r = _row(t, "ref", "probe_cost")
    rho, iv, p = inference.rank_correlation([-probe[(s, "ref")] for s in seeds], y, 1 - 0.05 / 4)
    assert (probe_r["estimate"], probe_r["low"], probe_r["high"], probe_r["p"]) == pytest.approx(
        (rho, iv.low, iv.high, p))
    assert inference.rank_correlation(x, y)[0] == pytest.approx(1.0)
    # a gap falling with the curvature ratio: the other sign, not the predicted one
    down = findings.link_table(_gap_rows({k: -v for k, v in gap.items()}), _geom(curv, probe), n_boot=300)
    assert _row(down, "ref", "curvature_ratio")["verdict"] == W["link_negative"]
    L, D = findings.link_findings(t), findings.link_findings(down)
    assert number(L, "n_tests") == 4 and number(L, "n_predicted_ref") >= 1 and number(D, "n_opposite") >= 1
    assert number(D, "n_predicted_ref") == int((_row(down, "ref", "probe_cost")["verdict"] == W["link_positive"]))


def test_link_needs_enough_seeds_and_the_gap_head():
    curv = {(s, "ref"): 10.0 + s for s in range(3)}
    probe = {k: 0.0 for k in curv}
    t = findings.link_table(_gap_rows({k: 0.01 * k[0] for k in curv}), _geom(curv, probe), n_boot=50)
    assert set(t["verdict"]) == {inference.TOO_FEW} and t["low"].isna().all()  # 3 points: no rank correlation
    assert findings.link_table(_gap_rows({k: 0.0 for k in curv}, head="mlp"), _geom(curv, probe)).empty
    with pytest.raises(ValueError, match="curvature"):
        findings.link_table(_gap_rows({k: 0.0 for k in curv}), _geom(curv, probe).drop(columns="curvature"))


def test_link_pooled_over_shifts_uses_every_seed_and_shift():
    seeds = range(6)
    curv = {(s, sh): (1.0 if sh == "none" else 10.0) + s for s in seeds for sh in ("none", "ref")}
    probe = {k: 0.0 for k in curv}
    gap = {(s, sh): (0.0 if sh == "none" else 0.1) + 0.001 * s for s in seeds for sh in ("none", "ref")}
    t = findings.link_table(_gap_rows(gap), _geom(curv, probe), n_boot=200)
    pooled = _row(t, "all", "curvature_ratio")
    assert pooled["n_points"] == 12 and pooled["n"] == 6 and pooled["estimate"] > 0.9
    assert math.isnan(pooled["p"])  # a bootstrap over whole seeds: no p-value
    assert math.isnan(_row(t, "all", "probe_cost")["estimate"])  # constant measure


def test_cost_findings_say_whether_the_cache_was_cold():
    F = findings.cost_findings({"source": (2, 2), "ch04_heads": (10, 10)})
    assert [number(F, k) for k in ("n_computed", "n_units", "n_cached", "cache_state")] == [12, 12, 0, "cold"]
    assert number(findings.cost_findings({"source": (0, 2), "ch04_heads": (4, 10)}), "cache_state") == "partly warm"
    assert number(findings.cost_findings({"source": (0, 2)}), "cache_state") == "warm"
    with pytest.raises(ValueError, match="computed <= total"):
        findings.cost_findings({"x": (3, 2)})


def test_sweep_counts_tell_computed_from_cached_units(tmp_path):
    from bnstudy.study.sweep import reset_sweep_counts, run_sweep, sweep_counts
    reset_sweep_counts()
    ex = Execution(cache_dir=str(tmp_path), n_jobs=1, progress=False)
    cfgs = [dict(x=i) for i in range(3)]
    run_sweep(cfgs[:2], _double_group, namespace="t", execution=ex)
    run_sweep(cfgs, _double_group, namespace="t", execution=ex)
    assert sweep_counts() == {"t": (3, 3)}  # distinct units: the two read back were computed here, so cold
    reset_sweep_counts()
    assert sweep_counts() == {}
    run_sweep(cfgs + [dict(x=7)], _double_group, namespace="t", execution=ex)  # a later page: three were cached
    assert sweep_counts() == {"t": (1, 4)}
    assert number(findings.cost_findings(sweep_counts()), "cache_state") == "partly warm"
    assert run.units_counts(pd.read_csv(io.StringIO(run.units_table(sweep_counts()).to_csv(index=False)))) == \
        {"t": (1, 4)}
    reset_sweep_counts()


def _double_group(configs):
    return [dict(y=2 * c["x"]) for c in configs]


# --- a tiny real run --------------------------------------------------------------------------------------------------

def test_tiny_run_end_to_end(tmp_path):
    cfg = run.make_config("quick", heads=("linear", "mlp_bn"), steps=3,
                         stage1_steps=3, n_eval=50, lr_sgd=(0.1, 1.0), lr_sgd_plain=(1.0,), lr_adam=(0.01,), feature_seeds=1,
                         steps_check=6)
    ex = Execution(cache_dir=str(tmp_path), n_jobs=1, progress=False)
    search = run.lr_search(cfg, ex)
    assert set(search["eval_split"]) == {"validation"}
    assert set(search["shift"]) == {"none", "mid", "ref"} and len(search) == len(cfg.search_configs())
    lrs = run.chosen_lrs_by_shift(search)
    df = run.run(cfg, ex, lrs)
    assert len(df) == 2 * 3 * 2 * 3 * 4 and set(df["shift"]) == {"none", "mid", "ref"}
    for r in df.itertuples():  # every run at its own shift's chosen rate
        assert r.lr == lrs[r.shift][(r.head, r.optimizer, r.mode)]
    C, _ = _page(df, lrs["ref"], run.LR_GRIDS)
    assert _verdict(C, "check_pinned_keep_a") == _verdict(C, "check_train_is_separate") == inference.EXACT
    assert set(lrs["none"]) == {(h, o, m) for h in cfg.heads for o in cfg.optimizers for m in MODE_NAMES}
    long_search = run.steps_search(cfg, ex)
    long_lrs = run.chosen_lrs(long_search, shift="ref")
    long = run.steps_check(cfg, ex, long_lrs)
    # two heads, three optimizers, two modes, two seeds; every run at the rate tuned at the longer budget
    assert len(long) == 2 * 3 * 2 * 2 and set(long["steps"]) == {cfg.steps_check}
    assert all(r.lr == long_lrs[(r.head, r.optimizer, r.mode)] for r in long.itertuples())
    C = findings.steps_claims(df, long)
    assert {k for k in C["key"] if k.startswith("gap_long_")} == {f"gap_long_{h}_{o}" for h in cfg.heads
                                                                 for o in cfg.optimizers}
    geom = run.feature_geometry(cfg, ex)
    sep = geom[geom["statistics"] == "separate"]
    assert np.allclose(sep["scale_ratio"], 1.0) and np.allclose(sep["offset_sd"], 0.0)
    findings.geometry_findings(geom)
    findings.link_table(df, geom, n_boot=20)  # runs on real rows (one feature seed: too few for a verdict)


# --- rows: the page analyses an earlier run's saved tables again ----------------------------------------------------

def test_analysis_parameters_decide_no_run():
    """The parameters a rows rebuild may change must not change any run: else its rows would not be the page's."""
    cfg, other = run.make_config("quick"), run.make_config("quick", margin=0.05)
    assert set(run.ANALYSIS_PARAMETERS) <= set(cfg.asdict())
    lrs = {(h, o, m): 0.01 for h in cfg.heads for o in cfg.optimizers for m in MODE_NAMES}
    assert cfg.search_configs() == other.search_configs() and cfg.run_configs(lrs) == other.run_configs(lrs)
    assert cfg.steps_check_configs(lrs) == other.steps_check_configs(lrs)


@pytest.mark.slow
def test_notebook_with_rows_gives_the_page_its_own_run_gave(glued_payloads, quick_rebuild):
    """The session's quick page, then the page again from its saved tables (``rows``) with an empty cache: every
    glued number, verdict and table is the same, only the timing sentence says the rows were analysed again, and
    nothing ran. A notebook that ignored ``rows`` would fill the empty cache and say it ran the experiment. An
    analysis parameter may change on a rebuild; a run parameter is refused."""
    from papermill.exceptions import PapermillExecutionError

    from bnstudy.study import book
    r = quick_rebuild("04_heads")
    a, b = glued_payloads(r.first), glued_payloads(r.again)
    assert set(a) == set(b)
    assert {k for k in a if a[k] != b[k] and not k.startswith("ch04_fig")} == {"ch04_timing"}
    assert "did not run the experiment" in b["ch04_timing"] and "did not run" not in a["ch04_timing"]
    assert not r.cache2.exists() or not any(p.is_file() for p in r.cache2.rglob("*"))
    for t in ("",) + tuple(f"_{s}" for s in run.SIBLING_TABLES) + ("_lr_search", "_accuracy", "_geometry", "_link"):
        assert (r.results / f"04_heads{t}.csv").read_bytes() == (r.results2 / f"04_heads{t}.csv").read_bytes(), t
    units = pd.read_csv(r.results / "04_heads_units.csv")
    state = "cold" if (units["computed"] == units["total"]).all() else "warm"  # the run's cache state, reported
    assert state in a["ch04_cost_cache_state"] and state in b["ch04_cost_cache_state"]  # the run's, not this one's
    margin = run.make_config("quick").margin  # the profile the session's page ran
    wider = book.execute_chapter(r.nb_path, r.folder / "wider", "quick", parameters=dict(  # an analysis parameter
        rows=str(r.rows), margin=margin + 0.02, results_dir=str(r.folder / "results4"),
        figures_dir=str(r.folder / "figures4"), cache_dir=str(r.folder / "cache4")))
    assert glued_payloads(wider)["ch04_margin"] != a["ch04_margin"]
    steps = run.make_config("quick").steps
    with pytest.raises(PapermillExecutionError, match=f"parameter 'steps' is {steps + 10} here but was {r.recorded('steps')}"):
        book.execute_chapter(r.nb_path, r.folder / "bad", "quick", parameters=dict(
            steps=steps + 10, rows=str(r.rows), results_dir=str(r.folder / "results3"),
            figures_dir=str(r.folder / "figures3"), cache_dir=str(r.folder / "cache3")))


def test_link_texts_say_not_computed_instead_of_printing_nan():
    # the quick profile's link rows: 2 seeds, so at one point per seed no rho at all; the page once printed
    # "rho = +nan (+nan to +nan): too few seeds"
    curv = {(s, sh): 10.0 + s + (sh == "ref") for s in range(2) for sh in ("none", "ref")}
    probe = {k: 0.01 * k[0] for k in curv}
    t = findings.link_table(_gap_rows({k: 0.01 * k[0] + 0.1 * (k[1] == "ref") for k in curv}), _geom(curv, probe),
                      n_boot=50)
    texts = findings.link_texts(t)
    assert set(texts) == {f"{r.scope}_{r.optimizer}_{r.measure}" for r in t.itertuples()}
    assert texts["ref_sgd_curvature_ratio"] == "not computed (2 seeds, one point each)"
    assert _row(t, "ref", "curvature_ratio")["verdict"] == inference.TOO_FEW
    # pooled: 4 points give a rho, but 2 seeds are too few to resample (3 distinct bootstrap samples)
    assert texts["all_sgd_curvature_ratio"].startswith("= +") and texts["all_sgd_curvature_ratio"].endswith(
        ", no interval")
    assert _row(t, "all", "curvature_ratio")["verdict"] == inference.TOO_FEW
    assert not any("nan" in v for v in texts.values())
    shown = figures.link_display(t)
    assert "nan" not in shown.to_string() and list(shown.columns) == ["predicted", "rho", "n_seeds", "n_points",
                                                                       "verdict"]
    assert list(shown.index.names) == ["scope", "optimizer", "measure"]  # no bare row numbers on the page
    # enough seeds: the value and its interval; the verdict is glued on its own
    seeds = range(10)
    curv = {(s, "ref"): 10.0 + s for s in seeds}
    t = findings.link_table(_gap_rows({(s, "ref"): 0.01 * s * (1 + 0.5 * (s % 2)) for s in seeds}),
                      _geom(curv, {k: 0.0 for k in curv}), n_boot=100)
    r = _row(t, "ref", "curvature_ratio")
    assert findings.link_texts(t)["ref_sgd_curvature_ratio"] == f"= {r['estimate']:+.2f} ({r['low']:+.2f} to {r['high']:+.2f})"


def test_lr_choice_findings_name_each_shifts_rates_and_edges():
    L = findings.lr_choice_findings({("linear", "sgd", "backbone_eval"): 0.01, ("linear", "sgd", "separate_stats"): 0.1},
                              {"sgd": (0.01, 0.1, 1.0)})
    assert _lrs(L) == {"linear_sgd_backbone_eval": 0.01, "linear_sgd_separate_stats": 0.1}
    assert (number(L, "n_lr"), number(L, "n_lr_at_edge")) == (2, 1)
    assert number(L, "lr_edge_cells") == "linear/sgd/backbone_eval at the bottom (0.01)"


def test_head_contrast_is_paired_against_the_linear_head_and_corrected():
    """Referee s7 item 7: 'heads with pinned lower' compared significance; the direct test is the paired
    per-seed difference gap(head) - gap(linear), Bonferroni over head x optimizer contrasts."""
    gaps = {("ref", "linear", "sgd"): 0.10, ("ref", "mlp", "sgd"): 0.02, ("ref", "mlp_bn", "sgd"): 0.15,
            ("ref", "linear", "adam"): 0.02, ("ref", "mlp", "adam"): 0.02, ("ref", "mlp_bn", "adam"): 0.02}
    df = _table(gaps)
    m = (df["head"] == "mlp") & (df["optimizer"] == "adam") & df["mode"].isin(run.PINNED_MODES)
    df.loc[m, "task_b"] += np.where(df.loc[m, "seed"] % 2 == 0, 0.03, -0.03)  # a spread: spans zero and the margin
    C, F = _page(df)
    t = findings.family(C, "hc")
    v = t.set_index(["head", "optimizer"])["verdict"]
    assert v[("mlp", "sgd")] == W["head_smaller"] and v[("mlp_bn", "sgd")] == W["head_larger"]
    assert v[("mlp", "adam")] == inference.NOT_DECIDED and len(t) == 4
    assert v[("mlp_bn", "adam")] == "equivalent within \u00b10.02"  # the same gap in every seed
    assert t["confidence"].iloc[0] == pytest.approx(1 - 0.05 / 4)
    assert t.set_index(["head", "optimizer"]).loc[("mlp", "sgd"), "estimate"] == pytest.approx(-0.08)
    assert [number(F, f"hc_{k}") for k in ("n_smaller", "n_larger", "smaller_cells", "larger_cells")] == [
        1, 1, "mlp/sgd", "mlp_bn/sgd"]
    disp = figures.contrast_display(t)
    assert list(disp.index) == ["mlp", "mlp_bn"] and list(disp.columns) == ["sgd", "adam"]
    assert disp.loc["mlp", "sgd"].startswith("-0.080 [") and disp.loc["mlp", "sgd"].endswith(W["head_smaller"])
    assert "hc" not in set(findings.claims(df[df["head"] != "linear"])["family"])  # no reference head: no contrast


def test_finding_3_names_a_linear_rate_at_the_grid_edge():
    """Referee s7 item 4: a verdict that rests on a rate at the end of its grid says so."""
    df = _table({("ref", "linear", "sgd"): 0.1, ("ref", "linear", "adam"): 0.1})
    lrs = {("linear", "sgd", m): 0.05 for m in MODE_NAMES} | {("linear", "adam", m): 0.01 for m in MODE_NAMES}
    lrs[("linear", "sgd", "backbone_eval")] = 0.005
    R = findings.findings(df, lrs, {"sgd": (0.005, 0.05, 0.5), "adam": (0.001, 0.01, 0.1)})
    assert (number(R, "f3_rate_edge_sgd"), number(R, "f3_rate_edge_adam")) == ("a rate at the grid's edge",
                                                                              "rates inside the grid")


def test_shift_contrast_pairs_each_cell_across_shifts_and_is_corrected():
    """Referee s7b N1: whether the shift makes the gap is a paired per-seed difference gap(ref) - gap(none),
    not a comparison of how many cells each panel resolves."""
    gaps = {("ref", "linear", "sgd"): 0.10, ("none", "linear", "sgd"): 0.0,
            ("ref", "mlp", "sgd"): 0.0, ("none", "mlp", "sgd"): 0.0,
            ("ref", "mlp_bn", "sgd"): -0.05, ("none", "mlp_bn", "sgd"): 0.0}
    C, F = _page(_table(gaps))
    t = findings.family(C, "sc")
    v = t.set_index("head")["verdict"]
    assert v["linear"] == W["shift_larger"] and v["mlp_bn"] == W["shift_smaller"]
    assert t.set_index("head").loc["linear", "estimate"] == pytest.approx(0.10)
    # mlp: identical gaps at both shifts in every seed, zero spread at 0: equivalent (the old rule: inconclusive)
    assert v["mlp"] == "equivalent within \u00b10.02" and t["confidence"].iloc[0] == pytest.approx(1 - 0.05 / 3)
    assert [number(F, f"sc_{k}") for k in ("n_larger", "n_smaller", "larger_cells", "smaller_cells")] == [
        1, 1, "linear/sgd", "mlp_bn/sgd"]
    assert number(F, "sc_m") == 3
    assert list(figures.contrast_display(t).columns) == ["sgd"]
    assert "sc" not in set(findings.claims(_table({("ref", "linear", "sgd"): 0.1}))["family"])  # no unshifted rows


def test_head_contrast_says_when_a_smaller_gap_comes_from_a_worse_separate_side():
    """Referee s7b N6: mlp's 'smaller gap' came with a lower separate_stats accuracy than the linear head's."""
    df = _table({("ref", "linear", "sgd"): 0.10, ("ref", "mlp", "sgd"): 0.02})
    m = (df["head"] == "mlp") & (df["optimizer"] == "sgd")
    df.loc[m, "task_b"] -= 0.05  # every mode of mlp 0.05 lower: the same gap, a worse separate side
    C, F = _page(df)
    t = findings.family(C, "hc")
    assert t["separate"].iloc[0] == pytest.approx(t["separate_reference"].iloc[0] - 0.05)
    assert [number(F, f"hc_{k}") for k in ("n_smaller", "n_smaller_worse_separate", "smaller_worse_separate_cells")] == [
        1, 1, "mlp/sgd"]
    df.loc[m & (df["mode"] == "separate_stats"), "task_b"] += 0.10  # the separate side now better: not counted
    C, F = _page(df)
    assert number(F, "hc_n_smaller_worse_separate") == 0 and number(F, "hc_smaller_worse_separate_cells") == "none"


def test_link_counts_are_split_by_scope():
    t = pd.DataFrame([dict(scope=sc, kind=k, predicted_sign=1, m=3, confidence=1 - 0.05 / 3)
                      for sc, k in (("ref", "not decided"), ("all", "higher"), ("ref", "lower"))])
    L = findings.link_findings(t)
    assert [number(L, k) for k in ("n_predicted", "n_opposite", "n_tests")] == [1, 1, 3]
    assert [number(L, k) for k in ("n_predicted_ref", "n_tests_ref", "n_predicted_all", "n_tests_all")] == [0, 2, 1, 1]
    assert number(L, "m") == 3


# --- the page's answer, chosen by the findings (issue 25) --------------------------------------------------------------

FLIP_CELLS = [("ref", h, o) for h in ("linear", "mlp_bn") for o in ("sgd", "sgd_plain", "adam")]


def _flip_findings(gap: float) -> tuple:
    """The claims and numbers of a table in which every cell at chapter 1's shift has per-seed gap ``gap`` (+ a
    small wiggle): ``+0.15`` (pinning costs), ``-0.15`` (the two conditions' values swapped) or ``0`` (equivalent)."""
    return _page(_table({c: gap for c in FLIP_CELLS}), margin=0.02)


#: The two budgets' steps as the page's numbers (``steps_*`` of :func:`findings.page_numbers`), for notes that name them.
STEPS = numbers_table(dict(steps_short=800, steps_long=3200))


#: The per-feature heads' lift at the longer budget (``pf_long_*`` of :func:`findings.input_norm_findings`), for a
#: numbers table made without a longer budget: ``lift_plain`` quotes it.
LONG_LIFT = numbers_table(dict(pf_long_n_lift=2, pf_long_n_lift_higher=2, pf_long_lift_min=0.1, pf_long_lift_max=0.1,
                               pf_long_n_sep=2, pf_long_n_sep_higher=0, pf_long_sep_min=0.0, pf_long_sep_max=0.0))


def _said(key: str, C: pd.DataFrame, F: pd.DataFrame, **parts) -> str:
    """The note of ``findings.NOTES`` under ``key`` on claims ``C`` and the page's numbers (``F`` and ``parts``,
    :func:`findings.page_numbers`; ``steps`` defaults to :data:`STEPS`, ``long`` to a longer budget with no cell)."""
    N = findings.page_numbers(F, **{"steps": STEPS, "long": numbers_table(dict(n_higher=0, m=0)), **parts})
    return notes([n for n in findings.NOTES if n.key == key], C, N)[key]


def _md() -> str:
    """The chapter notebook's Markdown."""
    import json
    nb = json.loads((Path(__file__).resolve().parent.parent / "chapters" / "04_heads.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_the_answer_box_says_the_counts_in_the_books_shape_and_the_probe_reading():
    C, F = _flip_findings(0.15)
    geo = numbers_table(dict(probe_cost=inference.Interval(0.05, 0.03, 0.07, 10)))
    assert _said("plain", C, F) == ("**Give the new task its own statistics.** At chapter 1's shift and 800 steps they "
                                    "beat a pinned backbone with every head and optimizer tried.")
    assert _said("lead", C, F).startswith("No head or optimizer tried makes up for pinned")
    assert findings.page_counts(C, C, 0.02)["gap_counts_ref"] == ("6 of the 6 head and optimizer cells show separate "
                                                                  "statistics above the pinned backbone")
    assert _said("probe", C, F, geo=geo) == ("A least-squares probe solved in closed form, free of any optimizer, reads "
                                             "+0.050 (+0.030 to +0.070) on separate minus pinned features: pinning "
                                             "loses some linearly decodable information about task B.")
    assert _said("probe_tail", C, F, geo=geo) == ("The trained linear head with SGD and momentum falls short by more "
                                                  "than the probe's upper end (+0.070), a shortfall of optimization "
                                                  "(rate and step budget) rather than of the features.")
    # the box cites the linear head's verdicts and the best pinned cell's claim by their derived keys
    box = _md().split(":::", 2)[1]
    for key in ("gap_ref_linear_sgd_verdict", "gap_ref_linear_sgd_plain_verdict", "gap_ref_linear_adam_verdict",
                "best_pinned_gap_verdict", "best_pinned_cell", "plain", "lead", "gap_counts_ref", "probe"):
        assert f"`ch04_{key}`" in box, key
    assert "`ch04_lift_plain`" not in box  # the input advice is said once there, by advice_lift


def test_flip_every_headline_verdict_and_the_answer_no_longer_asserts_it():
    """The flip test (issue 25): swap the two conditions' values in every cell, then remove the difference; the
    answer's notes, counts and advice change with the verdicts and never keep the old outcome."""
    cost, reversed_, none = (_flip_findings(g) for g in (0.15, -0.15, 0.0))
    counts = [findings.page_counts(C, C, 0.02)["gap_counts_ref"] for C, _ in (cost, reversed_, none)]
    assert "above the pinned backbone" in counts[0] and "above" not in counts[1] and "above" not in counts[2]
    assert "below the pinned backbone" in counts[1] and "below" not in counts[0]
    assert "**equivalent within ±0.02**" in counts[2] and "equivalent" not in counts[0]
    lead = "No head or optimizer tried makes up for pinned statistics"
    said = {k: [_said(k, *P) for P in (cost, reversed_, none)] for k in ("lead", "plain", "advice_separate")}
    assert said["lead"][0].startswith(lead) and lead not in said["lead"][1] and lead not in said["lead"][2]
    assert said["lead"][2].startswith("Every head and optimizer tried makes up for pinned statistics")
    assert said["lead"][1].startswith("No head and optimizer cell shows a cost of pinned statistics")
    assert said["plain"][0].startswith("**Give the new task") and said["plain"][1].startswith("**Pin the backbone.**")
    assert said["plain"][2].startswith("**Either works on this evidence.**")
    # the advice: the separate-statistics call only where pinning is shown to cost
    assert "shared_weight_copy" in said["advice_separate"][0]
    assert "Separate statistics scored higher in 6 of the 6 head and optimizer cells" in said["advice_separate"][0]
    for text in said["advice_separate"][1:]:
        assert "shared_weight_copy" not in text and "no cell shows a cost" in text
    assert "bnstudy.pin_eval(model.backbone)" in _md().split("**What to do.**", 1)[1].split(":::", 1)[0]
    # a mix: some cells cost, the others equivalent
    mixed = _page(_table({c: (0.15 if c[1] == "linear" else 0.0) for c in FLIP_CELLS}), margin=0.02)
    assert _said("lead", *mixed).startswith("Some heads and optimizers make up for pinned statistics")
    # a cost in some cells, the others not decided: none is shown to make up for it
    df = _table({c: (0.15 if c[1] == "linear" else 0.0) for c in FLIP_CELLS})
    m = (df["head"] == "mlp_bn") & df["mode"].isin(run.PINNED_MODES)
    df.loc[m, "task_b"] += np.where(df.loc[m, "seed"] % 2 == 0, 0.08, -0.08)  # wide: neither a cost nor a tie
    C, F = _page(df, margin=0.02)
    assert _said("lead", C, F).startswith("No head or optimizer tried is shown to make up")
    assert "3 are **not decided**" in findings.page_counts(C, C, 0.02)["gap_counts_ref"]


#: The gap family's verdict kinds at chapter 1's shift -> the answer's lead (``lead`` of findings.NOTES), one case per
#: note.
LEADS = [(["higher"] * 3, "No head or optimizer tried makes up"),
         (["equivalent"] * 3, "Every head and optimizer tried makes up for pinned statistics at chapter 1's shift, "
                              "within ±0.02"),
         (["equivalent", "not decided", "not decided"], "No head and optimizer cell shows a cost of pinned statistics "
                                                       "at chapter 1's shift, and not every one"),
         (["lower", "equivalent", "not decided"], "No head and optimizer cell shows a cost of pinned statistics at "
                                                 "chapter 1's shift"),
         (["higher", "not decided", "not decided"], "No head or optimizer tried is shown to make up"),
         (["higher", "equivalent", "equivalent"], "Some heads and optimizers make up"),
         (["higher", "lower", "equivalent"], "Whether a head or optimizer makes up for pinned statistics at chapter 1's "
                                            "shift depends on the cell"),
         (["higher", "equivalent", "not decided"], "Whether a head or optimizer makes up")]


@pytest.mark.parametrize("kinds, lead", LEADS)
def test_the_answers_lead_is_chosen_by_the_counts_alone(kinds, lead):
    """Each lead note holds for its own counts and no other does (notes() raises on none or two); flipping the
    counts flips the lead."""
    C = pd.DataFrame(dict(family="gap", shift="ref", kind=kinds, estimate=0.0, p_adjusted=1.0, margin=0.02))
    said = notes([n for n in findings.NOTES if n.key == "lead"], C, pd.DataFrame())["lead"]
    assert said.startswith(lead) and "nan" not in said


def test_probe_and_geometry_sentences_flip_with_their_numbers():
    I = inference.Interval
    lost, kept, gained = I(0.05, 0.03, 0.07, 10), I(0.01, -0.004, 0.027, 10), I(-0.05, -0.07, -0.03, 10)

    def probe(iv, linear_gap_low=0.0):
        said = notes([n for n in findings.NOTES if n.key in ("probe", "probe_tail")],
                     pd.DataFrame(dict(key=["gap_ref_linear_sgd"], low=[linear_gap_low])),
                     numbers_table(dict(geo_probe_cost=iv)))
        return said["probe"] + " " + said["probe_tail"]
    assert "pinning loses some linearly decodable information" in probe(lost)
    assert "detects no linearly decodable information lost" in probe(kept) and "(-0.004 to +0.027)" in probe(kept)
    assert "pinned features are the more linearly decodable" in probe(gained)
    for s in (probe(kept), probe(gained)):
        assert "loses some" not in s
    assert "shortfall of optimization" in probe(kept, linear_gap_low=0.1)
    assert "shortfall" not in probe(kept, linear_gap_low=0.01)  # the head's gap within the probe's
    assert "not shown to fall short by more than the probe's upper end (+0.027)" in probe(kept, linear_gap_low=0.01)
    assert "without an interval" in probe(I(0.01, math.nan, math.nan, 1)) and "nan" not in \
        probe(I(0.01, math.nan, math.nan, 1), linear_gap_low=0.1)
    # the curvature note (bnstudy.study.words.Note): each of its four sentences holds for its own numbers, alone
    said = lambda ratio, centred: notes(  # noqa: E731
        [n for n in findings.NOTES if n.key == "geo_sentence_curvature"], pd.DataFrame(),
        numbers_table(dict(geo_curvature_ratio=ratio, geo_curvature_centered_ratio=centred)))["geo_sentence_curvature"]
    wide, offset, flat, unknown = said(5.0, 4.0), said(5.0, 1.2), said(0.9, 0.9), said(5.0, math.nan)
    assert "from the wider features, not from the common offset" in wide
    assert "from the common offset, not from the wider features" in offset
    assert "no curvature" in flat and "wider" not in flat
    assert unknown == "The centred ratio is not available." and said(math.nan, 4.0) == unknown
    assert len({wide, offset, flat, unknown}) == 4
    # the boundary: a centred excess of exactly half the excess is the wider features' (>=)
    assert said(5.0, 3.0) == wide and said(5.0, 2.99) == offset and said(1.0, 5.0) == flat


def test_vocabulary_is_every_direction_and_the_shared_words():
    v = findings.vocabulary(0.02)
    assert set(findings.DIRECTIONS) <= set(v.values()) and v["equivalent"] == "equivalent within ±0.02"
    assert all(inference.is_verdict(w, findings.DIRECTIONS) for w in v.values())


def _markdown_outside_glue(nb_path) -> list[tuple[int, str]]:
    """Each markdown cell's text with glue roles, cross-references, code spans and math removed."""
    import json
    import re
    out = []
    for i, c in enumerate(json.loads(open(nb_path).read())["cells"]):
        if c["cell_type"] != "markdown":
            continue
        t = "".join(c["source"])
        for rx in (r"\{glue(:\w+)?\}`[^`]*`", r"\{numref\}`[^`]*`", r"`[^`]*`", r"\$\$.*?\$\$", r"\$[^$]*\$"):
            t = re.sub(rx, " ", t, flags=re.S)
        out.append((i, t))
    return out


#: Numbers the chapter's prose may type: settings and names, not results.
SETTING_NUMBERS = (r"chapters? \d", r"finding[- ]3", r"stage[- ][12]", r"\b64\b", r"momentum\s+0\.9",
                   r"brightness 4, contrast 5", r"95%", r"0\.05/m", r"mean 0, variance 1", r"value of 1", r"below 1",
                   r"BatchNorm1d")


def test_the_notebook_types_no_outcome_outside_glue():
    """Issue 25: every verdict word and every result number in the chapter's markdown is glued (the words through
    ``ch04_w_*``), never typed; only the settings in SETTING_NUMBERS are typed digits."""
    import re
    from pathlib import Path
    nb = Path(__file__).resolve().parent.parent / "chapters" / "04_heads.ipynb"
    words = [re.escape(w) for w in findings.DIRECTIONS] + [r"\bequivalent\b", r"not decided", r"too few seeds",
                                                     r"exact, checked", r"\bnot exact\b"]
    bad = []
    for i, t in _markdown_outside_glue(nb):
        bad += [f"cell {i}: {m.group(0)!r}" for w in words for m in re.finditer(w, t, flags=re.I)]
        for rx in SETTING_NUMBERS:
            t = re.sub(rx, " ", t, flags=re.I)
        bad += [f"cell {i}: digits {m.group(0)!r} in ...{t[max(0, m.start() - 30):m.end() + 10]!r}"
                for m in re.finditer(r"\d", t)]
    assert not bad, bad
    # the scan sees a typed outcome
    assert re.search(re.escape(W["gap_higher"]), "the gap reads separate_stats higher here", flags=re.I)


def test_the_notebook_shows_no_code():
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parent.parent / "chapters" / "04_heads.ipynb").read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            tags = c["metadata"].get("tags", [])
            assert "show-code" not in tags and ({"remove-cell", "remove-input"} & set(tags)), c["source"][:2]
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith("# ") and "{admonition} The answer\n:class: answer" in first
    box = first.split(":::", 2)[1]  # the answer box: its notes and counts, then what to do and its notes
    assert box.index("{glue:md}`ch04_plain`") < box.index("{glue:md}`ch04_lead`") < box.index("**What to do.**")
    assert box.index("**What to do.**") < box.index("{glue:md}`ch04_advice_lift`") < box.index(
        "{glue:md}`ch04_advice_separate`")


def test_the_chapter_is_data_no_records_and_printed_ends_are_cut_per_family():
    """The lean chapter shape: no class in findings (claims are QUESTIONS asked by bnstudy.study.inference.ask, numbers a
    flat numbers table), and the page's interval ends are cut to each family's range (CLIPS), the claims keep theirs."""
    assert not [v for v in vars(findings).values() if isinstance(v, type) and v.__module__ == findings.__name__]
    assert set(findings.QUESTIONS) - {"audit"} <= set(findings.CLIPS)
    C = findings.claims(_table({("ref", "linear", "sgd"): 0.1, ("none", "linear", "sgd"): 0.0}))
    wide = C.assign(low=-1.5, high=1.5)
    shown = findings.printed(wide).set_index("key")
    assert (shown.loc["gap_ref_linear_sgd", "low"], shown.loc["gap_ref_linear_sgd", "high"]) == (-1.0, 1.0)
    assert shown.loc["sc_linear_sgd", "high"] == 1.5  # a difference of two gaps may reach 2
    assert shown.loc["check_train_is_separate", "high"] == 1.5  # checks: no range
    assert (wide["high"] == 1.5).all()  # the claims keep the raw ends


def test_the_plain_lead_follows_the_counts_at_chapter_1s_shift():
    """Issue 37's plain lead (``plain`` of ``NOTES``, the answer's first sentence and the front page's): each outcome of the
    gap family's printed verdicts at chapter 1's shift says its own sentence, exactly one holds, and it quotes the
    counts."""
    def claims(verdicts):
        return pd.DataFrame(dict(family="gap", shift="ref", key=[f"gap_ref_{i}" for i in range(len(verdicts))],
                                 kind=verdicts, verdict=verdicts, estimate=0.0, low=0.0, high=0.0))

    said = lambda v: _said("plain", claims(v), STEPS.iloc[:0])  # noqa: E731
    assert said(["higher"] * 3).startswith("**Give the new task its own statistics.**")
    assert said(["higher", "higher", "not decided"]) == ("**Prefer the new task's own statistics.** At chapter 1's "
                                                         "shift and 800 steps they beat a pinned backbone with 2 of the 3 heads and "
                                                         "optimizers tried and lose with none.")
    assert said(["higher", "lower", "not decided"]).startswith("**It depends on the head.**")
    assert said(["higher", "lower", "not decided"]).endswith("with 1 of the 3 heads and optimizers tried and lose with 1.")
    assert said(["lower", "not decided"]).startswith("**Pin the backbone.**")
    assert said(["not decided", "equivalent"]).startswith("**Either works on this evidence.**")


def test_fig_4_2_stays_readable_on_a_phone():
    """Issue 37: Fig. 4.2 shown 360 px wide on a phone keeps its smallest text (the heads' names) at least 9 px tall
    and level; drawn three panels side by side at the column width, they shrank to about 6 px, rotated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bnstudy.study import plots, style

    gaps = pd.DataFrame([dict(shift=s, head=h, optimizer=o, estimate=0.02, low=-0.01, high=0.05)
                         for s in ("none", "mid", "ref") for h in ("linear", "mlp", "mlp2", "mlp_bn", "mlp_ln")
                         for o in ("sgd", "sgd_plain", "adam")])
    fig = figures.gap_figure(gaps, {"none": "no shift", "mid": "t = 0.25", "ref": "chapter 1's shift"}, 0.02)
    leg = plots.legibility(fig)
    assert leg["phone_font_px"] >= style.PHONE_MIN_FONT_PX, leg
    assert leg["page_font_pt"] >= style.MIN_FONT_PT, leg
    ticks = [t for ax in fig.axes for t in ax.get_xticklabels() if t.get_text()]
    assert {t.get_text() for t in ticks} == {"linear", "mlp", "mlp2", "mlp_bn", "mlp_ln"}
    assert all(t.get_rotation() == 0 for t in ticks)
    plt.close(fig)


# --- the longer budget and the heads that normalize their input (issue 35) ------------------------------------------

def _budgets(short_gaps: dict, long_gaps: dict):
    """A short sweep (800 steps) and a longer budget (3200) at chapter 1's shift: {(head, opt): gap} each."""
    short = _table({("ref", h, o): g for (h, o), g in short_gaps.items()}).assign(steps=800)
    long = _table({("ref", h, o): g for (h, o), g in long_gaps.items()}).assign(steps=3200)
    long = long[long["mode"].isin(run.STEPS_CHECK_MODES)].reset_index(drop=True)
    return short, long


def test_the_longer_budget_is_counted_and_said_at_its_own_budget():
    short, long = _budgets({("linear", "sgd"): 0.15, ("std_linear", "sgd"): 0.12, ("linear", "adam"): 0.10,
                            ("std_linear", "adam"): 0.12},
                           {("linear", "sgd"): 0.0, ("std_linear", "sgd"): 0.12, ("linear", "adam"): -0.10})
    S, SF = findings.steps_claims(short, long), findings.steps_findings(short, long)
    L = findings.long_findings(S, SF)
    assert [number(L, k) for k in ("m", "n_higher", "n_lower")] == [3, 1, 1]
    assert number(L, "n_narrower") == 2 and number(L, "n_wider") == 0  # linear/sgd and linear/adam narrow
    assert number(L, "best_pinned_cell") == "linear/adam"  # pinned = separate + 0.10 there
    C, F = _page(short)
    assert _said("plain", C, F, steps=SF).startswith("**Give the new task its own statistics.** At chapter 1's shift "
                                                     "and 800 steps they beat")
    assert findings.page_counts(C, S, 0.02)["gap_counts_long"] == (
        "1 of the 3 head and optimizer cells is **equivalent within ±0.02** of the pinned backbone, 1 shows separate "
        "statistics below the pinned backbone (a direction shown) and 1 shows separate statistics above it")
    assert findings.page_counts(C, S, 0.02)["steps_counts"] == (
        "1 of the 3 gaps at the longer budget is **equivalent within ±0.02** of the short budget's and 2 show the gap "
        "below the short budget's (a direction shown)")
    # the advice counts both budgets, and still advises separate statistics when only the longer budget shows a cost
    assert "scored higher in 4 of the 4 head and optimizer cells (1 of 3 at the longer budget)" in _said(
        "advice_separate", C, F, long=L)
    flat, flat_long = _budgets({("linear", "sgd"): 0.0}, {("linear", "sgd"): 0.12})
    C0, F0 = _page(flat)
    L0 = findings.long_findings(findings.steps_claims(flat, flat_long), findings.steps_findings(flat, flat_long))
    assert "shared_weight_copy" in _said("advice_separate", C0, F0, long=L0)
    assert "shared_weight_copy" not in _said("advice_separate", C0, F0, long=L0.assign(
        value=[0 if k == "n_higher" else v for k, v in zip(L0["key"], L0["value"])]))


def test_every_plain_lead_opens_at_chapter_1s_shift_so_the_budget_can_be_named():
    for note in [n for n in findings.NOTES if n.key == "plain"]:
        assert note.text.split("** ", 1)[1].startswith(findings.AT_SHIFT)


def test_input_normalizing_heads_are_counted_together_and_the_sentence_follows_their_verdicts():
    gaps = {("ref", "linear", "sgd"): 0.15, ("ref", "std_linear", "sgd"): 0.12, ("ref", "bn_linear", "sgd"): 0.0}
    C, _ = _page(_table(gaps))
    I = findings.input_norm_findings(C)  # noqa: E741
    assert number(I, "pf_m") == 2 and number(I, "pf_n_higher") == 1  # std_linear's gap shown, bn_linear's equivalent
    assert number(I, "pf_n_lift_higher") == 2 and number(I, "pf_lift_max") == pytest.approx(0.15)  # bn_linear's
    assert number(I, "pf_lift_min") == pytest.approx(0.03) and number(I, "pf_n_smaller") == 2
    assert number(I, "pf_gap_min") == pytest.approx(0.0, abs=5e-4) and number(I, "pf_gap_max") == pytest.approx(0.12)
    assert number(I, "pf_gap_high") > 0.12
    # their gaps counted in the book's one shape (the page cites it where it names their gap range)
    assert findings.page_counts(C, C, 0.02)["inorm_pf_gap_counts"] == (
        "1 of the 2 head and optimizer cells is **equivalent within ±0.02** of the pinned backbone and 1 shows separate "
        "statistics above the pinned backbone")
    assert "{glue:md}`ch04_inorm_pf_gap_counts` (estimates" in _md()
    C3, _ = _page(_table({("ref", "linear", "sgd"): 0.15}))
    assert not len(findings.input_norm_findings(C3))


def test_the_lift_of_per_feature_heads_is_a_paired_family_for_both_statistics_and_the_plain_advice_follows_it():
    base = {("ref", "linear", "sgd"): 0.15, ("ref", "linear", "adam"): 0.15}
    df = _table({**base, ("ref", "std_linear", "sgd"): 0.02, ("ref", "std_linear", "adam"): 0.02})
    # _table: separate = 0.6 + noise for every head, pinned = separate - gap - wiggle: std_linear's pinned side is
    # 0.13 above linear's per seed, its separate side equal to linear's
    C, F = _page(df)
    lift = findings.family(C, "lift").set_index("key")
    assert lift.loc["lift_ref_pinned_std_linear_sgd", "estimate"] == pytest.approx(0.13)
    assert lift.loc["lift_ref_pinned_std_linear_sgd", "verdict"] == W["lift_higher"]
    assert lift.loc["lift_ref_separate_std_linear_sgd", "verdict"] == "equivalent within \u00b10.02"
    assert set(lift["m"]) == {4} and list(lift["statistics"]) == ["pinned", "pinned", "separate", "separate"]
    I = findings.input_norm_findings(C)  # noqa: E741
    assert [number(I, k) for k in ("pf_m", "pf_n_lift_higher", "pf_n_sep_higher", "pf_n_smaller")] == [2, 2, 0, 2]
    text = _said("lift_plain", C, F, inorm=pd.concat([I, LONG_LIFT]))
    assert text.startswith("Normalizing each feature before the new linear head") and "Whatever" not in text
    assert "raised task-B accuracy in 2 of 2 cells with the pinned backbone (+0.130 to +0.130) and in 0 of 2" in text
    assert _said("advice_lift", C, F, inorm=I) == ""  # not raised with both statistics: no advice on the input
    both = _table({("ref", "linear", "sgd"): 0.15, ("ref", "linear", "adam"): 0.15,
                   ("ref", "std_linear", "sgd"): 0.15, ("ref", "std_linear", "adam"): 0.15})
    both.loc[both["head"] == "std_linear", "task_b"] += 0.1  # both statistics 0.1 higher: the gap unchanged
    Cb, Fb = _page(both)
    Ib = pd.concat([findings.input_norm_findings(Cb), LONG_LIFT])
    assert _said("lift_plain", Cb, Fb, inorm=Ib).startswith("Whatever the statistics, consider normalizing each "
                                                           "feature")
    assert "and narrowed the gap between them in 0 of 2" in _said("lift_plain", Cb, Fb, inorm=Ib)
    advice = _said("advice_lift", Cb, Fb, inorm=Ib)
    assert "Whatever the statistics, consider a normalization of each feature" in advice
    assert "pin `model.backbone`, not the whole model" in advice
    assert _md().split("**What to do.**", 1)[1].startswith(" Where only one set of statistics can be deployed")
    same, Fs = _page(_table({**base, ("ref", "std_linear", "sgd"): 0.15, ("ref", "std_linear", "adam"): 0.15}))
    assert "in none of the 2 cells tried" in _said("lift_plain", same, Fs, inorm=findings.input_norm_findings(same))
    C0, F0 = _page(_table(base))
    assert _said("lift_plain", C0, F0, inorm=findings.input_norm_findings(C0)) == ""  # no per-feature head


def test_the_plain_lift_quotes_the_longer_budget_where_it_ran():
    short, long = _budgets({("linear", "sgd"): 0.15, ("std_linear", "sgd"): 0.02, ("linear", "adam"): 0.15,
                            ("std_linear", "adam"): 0.02},
                           {("linear", "sgd"): 0.15, ("std_linear", "sgd"): 0.15})
    C, F = _page(short)
    I = findings.input_norm_findings(C, findings.steps_claims(short, long))  # noqa: E741
    # at the longer budget std_linear's pinned side equals linear's (same gap): no lift there
    assert [number(I, k) for k in ("pf_long_n_lift", "pf_long_n_lift_higher", "pf_long_n_sep")] == [1, 0, 1]
    text = _said("lift_plain", C, F, inorm=I)
    assert ("; at 3,200 steps, in 0 of 1 (+0.000 to +0.000) and 0 of 1 (+0.000 to +0.000), with its effect on "
            "the gap not tested there.") in text


def test_the_plain_lift_attaches_the_narrowed_gap_to_the_short_budget_and_says_the_longer_one_did_not_test_it():
    """Issue 35 referee: the "narrowed the gap" count is family ``hc``, at the short budget only; the longer budget has
    no head contrast, so the sentence names the short budget's steps beside that count and says the gap's change
    between heads was not tested at the longer one."""
    short, long = _budgets({("linear", "sgd"): 0.15, ("std_linear", "sgd"): 0.02, ("linear", "adam"): 0.15,
                            ("std_linear", "adam"): 0.02},
                           {("linear", "sgd"): 0.15, ("std_linear", "sgd"): 0.15})
    C, F = _page(short)
    S, SF = findings.steps_claims(short, long), findings.steps_findings(short, long)
    I = findings.input_norm_findings(C, S)  # noqa: E741
    text = _said("lift_plain", C, F, steps=SF, inorm=I)
    short_part, long_part = text.split("; at 3,200 steps, ")
    assert "at chapter 1's shift and 800 steps" in short_part and "narrowed the gap between them in 2 of 2" in short_part
    assert "narrowed" not in long_part and long_part.endswith("with its effect on the gap not tested there.")
    assert "hc" not in set(S["family"])  # no head contrast at the longer budget: nothing there to count
    assert "narrowed" not in _said("plain", C, F, steps=SF)  # the plain lead and the lift are glued apart


def _gaining(gains):
    """A short and a longer budget over four cells where both modes' task B rises by ``gains[seed]`` in every cell."""
    cells = {("linear", "sgd"): 0.1, ("std_linear", "sgd"): 0.1, ("linear", "adam"): 0.1, ("std_linear", "adam"): 0.1}
    short, long = _budgets(cells, cells)
    long = long.copy()
    long["task_b"] = long["task_b"] + np.asarray(gains)[long["seed"].to_numpy()]
    return short, long


def test_each_modes_gain_from_the_longer_budget_is_counted_on_bonferroni_intervals_over_the_cells():
    """Issue 35 referee: counts use the family (Bonferroni) intervals (the glossary's rule). A gain whose 95% interval
    lies above zero but whose interval at 1 - 0.05/m does not is not counted; a clear gain is, in every cell."""
    gains = np.array([0.01, 0.03, 0.02, 0.04, 0.00, 0.02])
    assert inference.t_interval(gains).low > 0 > inference.t_interval(gains, 1 - 0.05 / 4).low
    short, long = _gaining(gains)
    S, SF = findings.steps_claims(short, long), findings.steps_findings(short, long)
    assert number(SF, "n_cells") == 4 and number(SF, "gain_confidence") == pytest.approx(1 - 0.05 / 4)
    iv = number(SF, "pinned_gain_linear_sgd")
    assert (iv.low, iv.high) == pytest.approx(tuple(inference.t_interval(gains, 1 - 0.05 / 4))[1:3])
    L = findings.long_findings(S, SF)
    assert number(L, "n_pinned_gains") == number(L, "n_separate_gains") == 0  # 95% intervals would count 4 each
    assert _said("gains", S, SF, steps=SF, long=L).startswith("Neither mode is shown to gain accuracy from 800 to 3,200 steps")
    short, long = _gaining(gains + 0.1)
    S, SF = findings.steps_claims(short, long), findings.steps_findings(short, long)
    L = findings.long_findings(S, SF)
    assert number(L, "n_pinned_gains") == number(L, "n_separate_gains") == 4
    text = _said("gains", S, SF, steps=SF, long=L)
    assert ("Both modes still gained accuracy from 800 to 3,200 steps (pinned in 4 of 4 cells, separate in 4, on "
            "Bonferroni intervals over the cells)") in text
    long.loc[long["mode"] == "separate_stats", "task_b"] -= gains[long.loc[long["mode"] == "separate_stats", "seed"]] + 0.1
    S, SF = findings.steps_claims(short, long), findings.steps_findings(short, long)
    assert _said("gains", S, SF, steps=SF, long=findings.long_findings(S, SF)).startswith(
        "Only the pinned mode still gained accuracy from 800 to 3,200 steps (4 of 4 cells, the separate in none")


def test_table_4_6_and_its_methods_say_the_gains_are_bonferroni_intervals():
    import json
    nb = json.loads((Path(__file__).resolve().parent.parent / "chapters" / "04_heads.ipynb").read_text())
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    caption = md[md.index(":name: tbl-ch04-long"):].split("```", 1)[0]
    assert "mean [95% interval]" not in caption and "Bonferroni over the {glue:text}`ch04_steps_n_cells` cells" in caption
    assert "{glue:text}`ch04_steps_gain_confidence:.4f`" in caption
    assert "(95% t intervals) says whether the short budget" not in md


def test_fig_4_2_with_every_head_keeps_level_names_that_do_not_overlap():
    """Eight heads in Fig. 4.2's 4-inch width: the long names break after their underscore and stay level, and no two
    tick labels overlap (the first layout rotated them; a phone reader tilts no head)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gaps = pd.DataFrame([dict(shift="ref", head=h, optimizer=o, estimate=0.02, low=-0.01, high=0.05)
                         for h in run.HEADS for o in ("sgd", "sgd_plain", "adam")])
    fig = figures.gap_figure(gaps, {"ref": "chapter 1's shift"}, 0.02)
    from bnstudy.study import plots, style
    assert plots.legibility(fig)["phone_font_px"] >= style.PHONE_MIN_FONT_PX
    fig.canvas.draw()
    ticks = [t for ax in fig.axes for t in ax.get_xticklabels() if t.get_text()]
    assert [t.get_text().replace("\n", "") for t in ticks] == list(run.HEADS)
    assert all(t.get_rotation() == 0 for t in ticks)
    boxes = [t.get_window_extent() for t in ticks]
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), [(b.x0, b.x1) for b in boxes]
    plt.close(fig)


def test_the_gains_and_the_advice_on_statistics_flip_with_hand_made_numbers():
    """Each note of ``gains`` and ``advice_separate`` (findings.NOTES) holds for its own hand-made numbers and gives
    way to another when the numbers turn round."""
    gains = lambda p, q: _said("gains", pd.DataFrame(), STEPS, steps=numbers_table(dict(  # noqa: E731
        steps_short=800, steps_long=3200, n_cells=5)), long=numbers_table(dict(n_pinned_gains=p, n_separate_gains=q)))
    assert gains(5, 4).startswith("Both modes still gained accuracy from 800 to 3,200 steps (pinned in 5 of 5 cells, "
                                  "separate in 4")
    assert gains(5, 0).startswith("Only the pinned mode still gained") and "(5 of 5 cells, the separate in none" in \
        gains(5, 0)
    assert gains(0, 3).startswith("Only the separate mode still gained") and "(3 of 5 cells, the pinned in none" in \
        gains(0, 3)
    assert gains(0, 0) == ("Neither mode is shown to gain accuracy from 800 to 3,200 steps in any of the 5 cells (on "
                           "Bonferroni intervals over the cells).")
    cost, none = _flip_findings(0.15), _flip_findings(0.0)
    pf = lambda n_higher: numbers_table(dict(pf_m=6, pf_n_lift_higher=6, pf_n_sep_higher=6, pf_n_higher=n_higher,  # noqa
                                             pf_gap_min=0.011, pf_gap_max=0.017, pf_gap_high=0.062))
    left = _said("advice_separate", *cost, inorm=pf(0))
    assert "the gap left is not decided (+0.011 to +0.017, interval ends up to +0.062)" in left
    assert "shared_weight_copy" in left
    shown = _said("advice_separate", *cost, inorm=pf(2))
    assert "gap left" not in shown and "shared_weight_copy" in shown
    assert "no cell shows a cost" in _said("advice_separate", *none, inorm=pf(0))
    # a cost only at the longer budget still calls for separate statistics
    assert "(3 of 6 at the longer budget)" in _said("advice_separate", *none, long=numbers_table(dict(n_higher=3, m=6)))
