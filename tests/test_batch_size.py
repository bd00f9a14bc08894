"""Chapter 5 (issue 13): norm replacement, the fine-tuning engine, the noise estimate and the findings."""

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from bnstudy.study import engine, inference
from bnstudy.study.inference import number as N
from bnstudy.study.words import notes
from bnstudy.study.config import FinetuneConfig, SourceConfig
from bnstudy.study.experiments.batch_size import figures, findings, run
from bnstudy.freeze import FrozenBatchNorm
from bnstudy.study.models import ConvBackbone
from bnstudy.running_stats import replace_norm


# --- replace_norm ---------------------------------------------------------------------------------------------------

def _trained_like_bn(c, cls=nn.BatchNorm2d, **kw):
    bn = cls(c, **kw)
    with torch.no_grad():
        if bn.affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-1, 1)
        bn.running_mean.uniform_(-1, 1)
    return bn


@pytest.mark.parametrize("kind,groups", [("group", 8), ("layer", 1)])
def test_replace_norm_2d_carries_affine_and_matches_groupnorm(kind, groups):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3), _trained_like_bn(16, eps=1e-3), nn.ReLU())
    conv_before = {k: v.clone() for k, v in net[0].state_dict().items()}
    bn = net[1]
    out = replace_norm(net, kind)
    assert out is net
    gn = net[1]
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == groups and gn.num_channels == 16 and gn.eps == 1e-3
    assert torch.equal(gn.weight, bn.weight) and torch.equal(gn.bias, bn.bias)
    assert gn.weight is not bn.weight  # copies, not the same tensors
    x = torch.randn(4, 3, 10, 10)
    ref = nn.GroupNorm(groups, 16, eps=1e-3)
    ref.load_state_dict({"weight": bn.weight.detach(), "bias": bn.bias.detach()})
    h = net[0](x)
    assert torch.equal(gn(h), ref(h))
    assert net(x).shape == (4, 16, 8, 8)
    # nothing else touched: the conv is the same object with the same values; no running statistics left
    assert all(torch.equal(conv_before[k], v) for k, v in net[0].state_dict().items())
    assert not any("running" in k for k in net.state_dict())


def test_replace_norm_1d_on_features_and_sequences():
    torch.manual_seed(0)
    bn = _trained_like_bn(12, nn.BatchNorm1d)
    head = nn.Sequential(nn.Linear(5, 12), bn)
    replace_norm(head, "layer")
    x = torch.randn(3, 5)
    h = head[0](x)
    ln = nn.LayerNorm(12)
    ln.load_state_dict({"weight": bn.weight.detach(), "bias": bn.bias.detach()})
    assert torch.allclose(head[1](h), ln(h), atol=1e-6)  # one group over (C,) is LayerNorm(C)
    seq = replace_norm(_trained_like_bn(12, nn.BatchNorm1d), "group", num_groups=4)  # the module itself
    assert isinstance(seq, nn.GroupNorm) and seq(torch.randn(2, 12, 7)).shape == (2, 12, 7)


def test_replace_norm_keeps_flags_affine_false_and_sharing():
    bn = nn.BatchNorm2d(8, affine=False)
    shared = nn.BatchNorm2d(8)
    shared.weight.requires_grad_(False)
    net = nn.Sequential(bn, shared, shared).eval()
    replace_norm(net, "group")
    assert net[0].weight is None and not net[0].affine
    assert net[1] is net[2] and not net[1].weight.requires_grad
    assert not net[0].training


def test_replace_norm_leaves_frozen_and_instance_norms():
    frozen = FrozenBatchNorm.from_batchnorm(nn.BatchNorm2d(4).eval())
    inst = nn.InstanceNorm2d(4, track_running_stats=True)
    net = nn.Sequential(frozen, inst)
    replace_norm(net, "layer")
    assert net[0] is frozen and net[1] is inst


def test_replace_norm_errors_name_the_problem():
    with pytest.raises(ValueError, match="kind='instance'"):
        replace_norm(nn.BatchNorm2d(4), "instance")
    with pytest.raises(ValueError, match="does not divide the 6 channels of 'blk'"):
        replace_norm(_named({"blk": nn.BatchNorm2d(6)}), "group", num_groups=4)
    with pytest.raises(ValueError, match="num_groups is only for kind='group'"):
        replace_norm(nn.BatchNorm2d(4), "layer", num_groups=2)


def _named(d):
    m = nn.Module()
    for k, v in d.items():
        m.add_module(k, v)
    return m


def test_replace_norm_builds_the_group_pretrained_architecture():
    a = ConvBackbone(3, (16, 32, 64), "batch")
    b = ConvBackbone(3, (16, 32, 64), "group")
    replace_norm(a, "group")
    assert [(type(m), getattr(m, "num_groups", None)) for m in a.modules()] == \
        [(type(m), getattr(m, "num_groups", None)) for m in b.modules()]
    assert set(a.state_dict()) == set(b.state_dict())


# --- fine-tuning engine ---------------------------------------------------------------------------------------------

TINY = dict(seed=0, widths=(4, 8), stage1_steps=3, stage1_batch_size=8, n_eval=40, noise=1.0)


@pytest.fixture(scope="module")
def bn_source():
    return engine.train_source(SourceConfig(**TINY))


def test_finetune_config_checks_strategy_norm_and_divisibility():
    with pytest.raises(ValueError, match="strategy='group_pretrained' needs a source with norm='group'"):
        FinetuneConfig(strategy="group_pretrained")
    with pytest.raises(ValueError, match="samples must be a multiple of batch_size=3"):
        FinetuneConfig(batch_size=3, samples=10)
    with pytest.raises(ValueError, match="strategy='nope' is not allowed"):
        FinetuneConfig(strategy="nope")
    assert FinetuneConfig(batch_size=8, samples=64).steps == 8


@pytest.mark.parametrize("strategy", ["bn_frozen", "stats_frozen", "adabn", "to_group"])
def test_batch_independent_strategies_have_zero_train_eval_gap(bn_source, strategy):
    r = engine.finetune(FinetuneConfig(**TINY, strategy=strategy, batch_size=4, samples=16, adabn_samples=8),
                        bn_source)
    assert r["train_eval_gap"] == 0 and r["steps"] == 4 and not r["diverged"]


def test_bn_frozen_and_stats_frozen_keep_task_a_before_exact(bn_source):
    rows = [engine.finetune(FinetuneConfig(**TINY, strategy=s, batch_size=4, samples=8), bn_source)
            for s in ("bn_frozen", "stats_frozen", "bn_train")]
    assert rows[0]["task_a_before"] == rows[1]["task_a_before"] == rows[2]["task_a_before"] \
        == bn_source["task_a_accuracy"]


def test_finetune_same_images_across_batch_sizes():
    from bnstudy.study.tasks import generator, make_task
    task = make_task(0, "B", 10, 1.0)
    a = torch.cat([x for x, _ in engine._unit_batches(task, 16, 2, generator(1, "s"))])
    b = torch.cat([x for x, _ in engine._unit_batches(task, 16, 8, generator(1, "s"))])
    assert torch.equal(a, b)


def test_shared_finetune_data_rows_equal_runs_made_alone(tmp_path, monkeypatch):
    """Issue 9's chapter-5 lever: one group per seed and target drawing the stream, AdaBN images and held-out
    sets once (:class:`engine.FinetuneData`) gives rows ``==`` to every run drawing its own."""
    from bnstudy.study.config import Execution
    from bnstudy.study.sweep import code_version
    kw = dict(TINY, samples=16, adabn_samples=10)  # 10: not a multiple of every batch size
    cfgs = [FinetuneConfig(**kw, norm=run.STRATEGY_NORM[st], strategy=st, batch_size=b, lr=0.01 * b / 4,
                           brightness=br, contrast=ct)
            for br, ct in run.TARGETS.values() for b in (2, 4, 8) for st in run.STRATEGIES]
    cfgs.append(FinetuneConfig(**kw, norm="batch", strategy="stats_frozen", batch_size=1))  # odd: the unit path
    root, version = str(tmp_path), code_version()
    engine.ensure_sources([c.source for c in cfgs], Execution(cache_dir=root, n_jobs=1, progress=False), version)
    shared = run._finetune_group(cfgs, root, version)
    monkeypatch.setattr(run, "SHARE_DATA", False)
    alone = run._finetune_group(cfgs, root, version)
    for a, b in zip(shared, alone):
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b


def test_train_mode_logits_leave_model_untouched_and_order_rows():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).eval()
    before = copy.deepcopy(model.state_dict())
    x = torch.randn(9, 3)
    order = torch.randperm(9)
    out = engine.train_mode_logits(model, x, 4, order, "cpu")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and not model.training
    # last chunk of 1 is joined to the previous: chunks are order[:4], order[4:9]
    ref = copy.deepcopy(model).train()
    assert torch.allclose(out[order[4:]], ref(x[order[4:]]))


# --- noise estimate -------------------------------------------------------------------------------------------------

def test_noise_records_match_the_iid_prediction_for_independent_values():
    # independent N(0, 4) values: measured Var(batch mean)/sigma^2 should be ~ 1/(m H W)
    g = torch.Generator().manual_seed(0)
    n, c, hw = 4096, 16, 4
    v = 2 * torch.randn(n, c, hw, generator=g, dtype=torch.float64)
    mom = {"l": dict(s1=v.mean(2), s2=(v * v).mean(2), hw=hw, var=v.var((0, 2), unbiased=False),
                     mu4=((v - v.mean((0, 2), keepdim=True)) ** 4).mean((0, 2)))}
    recs = run.noise_records(mom, (2, 16, 128))
    for r in recs:
        assert r["pred_mean_rel"] == 1 / (r["batch_size"] * hw)
        assert 0.75 < r["var_mean_rel"] / r["pred_mean_rel"] < 1.3
        assert 0.6 < r["var_var_rel"] / r["pred_var_rel"] < 1.5
    # perfectly correlated positions: effective count is m, not m H W
    vc = v[:, :, :1].expand(n, c, hw)
    mom_c = {"l": dict(s1=vc.mean(2), s2=(vc * vc).mean(2), hw=hw, var=mom["l"]["var"], mu4=mom["l"]["mu4"])}
    r = run.noise_records(mom_c, (16,))[0]
    assert 0.75 < r["n_eff_frac"] * hw < 1.3


# --- findings on hand-made tables -----------------------------------------------------------------------------------

def _table(acc_fn, seeds=range(6), strategies=("stats_frozen", "bn_train", "adabn", "to_group"),
           batch_sizes=(2, 8, 32), targets=("close", "shifted")):
    rows = []
    rng = np.random.default_rng(0)
    for s in seeds:
        for t in targets:
            for b in batch_sizes:
                for st in strategies:
                    a = acc_fn(st, b, t) + 0.002 * rng.standard_normal()
                    rows.append(dict(seed=s, target_name=t, batch_size=b, strategy=st, target=a,
                                     task_a_after=0.9, n_classes=10, mismatch_kl=0.1 if t == "close" else 2 + 0.1 * s,
                                     train_eval_gap=(-0.1 if st == "bn_train" and b == 2 else 0.0)))
    return pd.DataFrame(rows)


def _acc(st, b, t):
    if st == "bn_train":
        return 0.8 if b >= 8 else 0.5  # breaks at batch 2 only
    if st == "adabn":
        return 0.85 if t == "shifted" else 0.7
    if st == "to_group":
        return 0.75
    return 0.7


def test_break_batch_finds_the_known_threshold_and_never_otherwise():
    df = _table(_acc)
    assert findings.break_batch(df, "close", "bn_train", 32, 0.02)[0] == 2
    assert findings.break_batch(df, "close", "to_group", 32, 0.02)[0] == 0
    assert findings.break_word(0) == "never" and findings.break_word(8) == "<= 8"
    # a drop smaller than the margin is not a break
    df2 = _table(lambda st, b, t: 0.8 - (0.01 if b == 2 else 0))
    assert findings.break_batch(df2, "close", "bn_train", 32, 0.02)[0] == 0


def _ps_claim(df, target, b=2):
    """The recommendation's claim (best per-sample norm minus best BN) at one cell, alone in its family."""
    return findings._family("recommend", {"k": findings.bn_vs_per_sample(df, target, b)[2]}, "ps").iloc[0]


def _noise_claim(d):
    return findings._family("noise", {"deepest_noisiest": d}, "noise").iloc[0]


def test_winners_and_recommendation_flip_with_the_table():
    df = _table(_acc)
    w = findings.winners(df)[0].set_index(["target_name", "batch_size"])
    assert w.loc[("close", 2), "winner"] == "to_group" and w.loc[("close", 2), "verdict"] == "winner higher"
    assert w.loc[("shifted", 32), "winner"] == "adabn"
    # winner minus runner-up is >= 0 by construction; the family interval is Bonferroni over the 6 rows
    assert w.loc[("close", 2), "diff_mean"] == pytest.approx(0.05, abs=0.005)
    assert _ps_claim(df, "close").verdict == "per-sample norm higher"
    assert _ps_claim(df, "shifted").verdict == "per-sample norm lower"
    assert findings.bn_vs_per_sample(df, "shifted", 2)[:2] == ("adabn", "to_group")
    df_tie = _table(lambda st, b, t: 0.7)
    df_tie["target"] = 0.7 + 0.01 * df_tie["seed"]  # every strategy equal within a seed: zero spread, d == 0
    c = _ps_claim(df_tie, "close")
    assert c.verdict == "not decided" and c.estimate == 0 and c.p == 1.0
    assert set(findings.winners(df_tie)[0].verdict) == {"not decided"}
    one = _ps_claim(df[df.seed == 0], "close")
    assert one.verdict == "too few seeds" and one.n == 1  # a single seed decides nothing
    for v in findings.winners(df)[0].verdict:
        assert inference.is_verdict(v, findings.DIRECTIONS)


def _precise(enough_at, seeds=range(8)):
    recs = []
    for s in seeds:
        recs.append(dict(seed=s, kind="exact", batch_size=0, n_samples=0, mean_err=0, var_err=0, accuracy=0.9))
        recs.append(dict(seed=s, kind="source", batch_size=0, n_samples=0, mean_err=0, var_err=0, accuracy=0.2))
        for m in (2, 32):
            for n in (64, 256, 1024, 4096, 16384):
                gap = -0.2 if n < enough_at[m] else 0.0
                recs.append(dict(seed=s, kind="precise", batch_size=m, n_samples=n, mean_err=1 / n, var_err=1 / n,
                                 accuracy=0.9 + gap + 0.001 * ((s % 3) - 1)))
    return recs


def _strip(recs):
    return [{k: v for k, v in r.items() if k != "seed"} for r in recs]


def test_samples_enough_and_claim_words():
    enough = {2: 10 ** 9, 32: 1024}
    diag = pd.DataFrame([dict(seed=s, precise_records=_strip(_precise(enough, [s]))) for s in range(8)])
    pt = run.precise_table(diag)
    assert set(pt.acc_vs_exact[pt.kind == "exact"]) == {0.0}
    assert findings.samples_enough(pt, 32, 0.01) == 1024
    assert findings.samples_enough(pt, 2, 0.01) == 0
    assert findings.claim_word(1024, 16384) == "within the range"
    assert findings.claim_word(256, 16384) == "fewer suffice"
    assert findings.claim_word(16384, 16384) == "more needed"
    assert findings.claim_word(0, 16384) == "more needed" and findings.claim_word(0, 4096) == "not reached"


def _diag(n_seeds=6):
    noise = [dict(layer=0, layer_name="b0", hw=16, channels=4, batch_size=m, n_batches=8, var_mean_rel=2 / (16 * m),
                  pred_mean_rel=1 / (16 * m), var_var_rel=1.0 / m, pred_var_rel=1.0, n_eff_frac=0.5) for m in (2, 4)]
    return pd.DataFrame([dict(seed=s, noise_records=noise, precise_records=_strip(_precise({2: 10 ** 9, 32: 256}, [s])),
                              mismatch_kl_close=0.1, mismatch_kl_shifted=2 + 0.1 * s) for s in range(n_seeds)])


def test_findings_end_to_end_on_a_hand_made_table():
    df = _table(_acc, strategies=("stats_frozen", "bn_train", "adabn", "to_group", "group_pretrained"))
    df["diverged"] = False
    df["source_task_a_accuracy"] = 0.99
    claims, F = findings.findings(df, _diag(), reference=32)
    C = claims.set_index("key")
    assert N(F, "breaks_close_bn_train") == "<= 2" and N(F, "breaks_close_to_group") == "never"
    assert N(F, "breaks_stats_close_bn_train") == "<= 2" and "breaks_stats_close_group_pretrained" not in set(F.key)
    assert C.loc["did_close_bn_train_b2", "estimate"] == pytest.approx(-0.3, abs=0.01)
    assert C.loc["did_close_bn_train_b2", "verdict"] == "lower beyond the control"
    for key, control in (("did_close_bn_train_b2", "group_pretrained"), ("drop_close_bn_train_b2", None)):
        iv = findings.break_batch(df, "close", "bn_train", 32, 0.02, control=control)[1][2]
        assert list(C.loc[key, ["estimate", "low", "high", "n"]]) == [iv.mean, iv.low, iv.high, iv.n]  # the break's own
    assert "did_close_group_pretrained_b2" not in C.index and "did_close_to_group_b2" not in C.index
    # per-sample (to_group 0.75) minus best BN (bn_train 0.5) at batch 2; at 32 adabn (0.85) beats to_group (0.75)
    assert C.loc["recommend_close_b2", "verdict"] == "per-sample norm higher"
    assert C.loc["recommend_close_b2", "estimate"] == pytest.approx(0.05, abs=0.005)  # to_group 0.75 vs stats_frozen 0.7
    assert C.loc["recommend_shifted_b32", "verdict"] == "per-sample norm lower"
    assert C.loc["recommend_shifted_b32", "estimate"] == pytest.approx(-0.1, abs=0.005)
    assert N(F, "best_ps_close_b2") == run.STRATEGY_LABELS["to_group"]  # labels, never raw slugs
    assert N(F, "family_size_recommend") == 4 and N(F, "family_size_adabn") == 4 and N(F, "family_size_check") == 1
    assert list(C[C.family == "recommend"].confidence) == [pytest.approx(1 - 0.05 / 4)] * 4  # Bonferroni over 4
    assert C.loc["gap_zero_elsewhere", "verdict"] == "exact, checked =="
    assert C.loc["gap_close_b2", "estimate"] == pytest.approx(-0.1)
    assert C.loc["gap_close_b2", "verdict"] == "train-mode accuracy lower"  # zero spread: interval [-0.1, -0.1]
    assert C.loc["gap_close_b32", "verdict"] == "not decided" and C.loc["gap_close_b32", "estimate"] == 0
    assert C.loc["deepest_noisiest", "verdict"] == "too few seeds"  # one layer: no other layer to compare with
    assert N(F, "noise_ratio_m2_l0") == pytest.approx(2.0)
    assert N(F, "noise_var_ratio_m2_l0") == pytest.approx(0.5) and N(F, "noise_var_ratio_top_l0") == pytest.approx(0.25)
    assert N(F, "noise_largest_batch") == 4
    assert N(F, "spread_top_close_to_group") == pytest.approx(0.002, abs=0.0015) and "spread_close_bn_train" in set(F.key)
    assert N(F, "noise_slope_mean_l0") == pytest.approx(-1.0) and N(F, "noise_slope_var_l0") == pytest.approx(-1.0)
    assert N(F, "retention_close_bn_train_b2").mean == pytest.approx(0.9)
    assert N(F, "precise_mean_err_ratio_b2_b32") == pytest.approx(1.0) and N(F, "precise_var_err_ratio_b2_b32") == pytest.approx(1.0)
    assert set(findings.entries(F, "precise_var_err")) == {"ratio_b2_b32"}  # the page cites the ratio, not each N
    assert N(F, "precise_enough_b32") == "256" and N(F, "precise_claim_b32") == "fewer suffice"
    assert N(F, "precise_enough_b2") == "none tried"
    assert N(F, "precise_mean_enough_b32") == "256"  # 1/n < 0.01 from n = 256 on (the grid starts at 64)
    assert C.loc["adabn_vs_frozen_shifted_b32", "estimate"] == pytest.approx(0.15, abs=0.01)
    assert C.loc["adabn_vs_frozen_shifted_b32", "verdict"] == "AdaBN higher"
    assert C.loc["adabn_vs_frozen_close_b32", "verdict"] == "not decided"  # both 0.7: noise only
    assert all(inference.is_verdict(v, findings.DIRECTIONS) for v in claims.verdict)
    assert not claims.key.duplicated().any()
    assert N(F, "n_winner_same_targets") == 0  # close: to_group (b2), bn_train; shifted: adabn at every batch size
    assert N(F, "n_diverged") == 0 and N(F, "diverged_where") == "none" and not F.key.str.startswith("lr_").any()
    assert N(F, "acc_top_close_bn_train").mean == pytest.approx(0.8, abs=0.01) and N(F, "largest_batch") == 32
    with pytest.raises(ValueError, match="reference=16"):
        findings.findings(df, _diag(), reference=16)


def test_break_against_the_control_removes_a_drop_the_control_shares():
    """M1 (ii): a strategy that falls exactly as the per-sample control falls has no batch-statistics break;
    one that falls further does; breaks above the reference are reported on their own side."""
    def acc(st, b, t):
        base = {2: 0.6, 8: 0.75, 32: 0.8, 128: 0.5}[b]  # the protocol: every strategy falls away from 32
        return base - (0.2 if st == "bn_train" and b == 2 else 0.0)
    df = _table(acc, strategies=("stats_frozen", "bn_train", "group_pretrained"), batch_sizes=(2, 8, 32, 128))
    assert findings.break_batch(df, "close", "stats_frozen", 32, 0.02)[0] == 8  # any cause: 0.75 at 8 is a break
    assert findings.break_batch(df, "close", "stats_frozen", 32, 0.02, control="group_pretrained")[0] == 0
    assert findings.break_batch(df, "close", "bn_train", 32, 0.02, control="group_pretrained")[0] == 2
    m, ivs = findings.break_batch(df, "close", "bn_train", 32, 0.02, control="group_pretrained")
    assert ivs[2].mean == pytest.approx(-0.2, abs=0.01)
    assert findings.break_batch(df, "close", "stats_frozen", 32, 0.02, side="above")[0] == 128
    assert findings.break_batch(df, "close", "stats_frozen", 32, 0.02, control="group_pretrained", side="above")[0] == 0
    assert findings.break_word(128, "above") == ">= 128"
    with pytest.raises(ValueError, match="side must be"):
        findings.break_batch(df, "close", "bn_train", 32, 0.02, side="left")
    df["diverged"] = (df.strategy == "stats_frozen") & (df.batch_size == 128) & (df.target_name == "shifted")
    df["source_task_a_accuracy"] = 0.99
    _, F = findings.findings(df, _diag(), reference=32)
    assert N(F, "breaks_above_close_stats_frozen") == ">= 128" and N(F, "breaks_stats_above_close_stats_frozen") == "never"
    assert N(F, "n_break_above") == 6 and N(F, "n_stats_break_below") == 2
    assert N(F, "n_small_beats_large") == 4  # stats_frozen and group_pretrained, both targets: 0.6 at 2 against 0.5 at 128
    assert N(F, "family_size_small_beats_large") == 6  # one family of the 6 strategy/target pairs
    assert N(F, "near_chance_where") == "none"
    assert N(F, "n_diverged") == 6 and N(F, "diverged_where") == "shifted target, BN stats frozen, affine trained, batch 128: 6 of 6 runs"
    tbl = figures.breaks_display(F, ("stats_frozen", "bn_train", "group_pretrained"))
    assert list(tbl.columns) == ["target", "strategy", "below 32: any cause", "below 32: beyond the control",
                                 "above 32: any cause", "above 32: beyond the control"]
    assert tbl.iloc[2]["below 32: beyond the control"] == "control"
    acc_t = findings.accuracy_table(df)
    cell = acc_t[(acc_t.target_name == "shifted") & (acc_t.strategy == "stats_frozen") & (acc_t.batch_size == 128)]
    assert set(cell.diverged_runs) == {6}


def test_winners_flag_near_chance_diverged_and_the_printed_verdict():
    df = _table(lambda st, b, t: 0.12 if b == 2 else (0.8 if st == "bn_train" else 0.7))
    df["diverged"] = (df.batch_size == 2) & (df.strategy == "stats_frozen")
    w = findings.winners(df, chance=0.1)[0].set_index(["target_name", "batch_size"])
    assert w.loc[("close", 2), "near_chance"] and not w.loc[("close", 32), "near_chance"]
    assert w.loc[("close", 32), "separated"] and not w.loc[("close", 2), "separated"]
    assert w.loc[("close", 32), "verdict"] == "winner higher" and w.loc[("close", 2), "verdict"] == "not decided"
    disp = figures.winners_display(df)
    assert "winner near chance" in disp["flags"].iloc[0] and "diverged" in disp["flags"].iloc[0]
    assert "verdict" in disp.columns and "Holm p" in disp.columns
    assert "winner minus runner-up (99.17% interval)" in disp.columns  # Bonferroni over the 6 rows: 1 - 0.05/6
    assert len(findings.near_chance_cells(df, 0.1)) == 8  # 4 strategies x 2 targets at batch 2


def test_deepest_noisiest_is_a_paired_claim_over_seeds():
    """The deepest layer's batch-mean spread minus the largest other layer's, per seed: a direction where every seed
    agrees, "not decided" where the seeds disagree."""
    def nt(deep):
        return pd.DataFrame([dict(seed=s, layer=l, batch_size=2, var_mean_rel=v)
                             for s in range(6) for l, v in ((0, 0.04), (1, 0.09), (2, deep(s)))])
    d = findings._deepest_minus_others(nt(lambda s: 0.16 + 0.001 * s))
    assert d.values == pytest.approx(np.sqrt(0.16 + 0.001 * np.arange(6)) - 0.3)  # minus layer 1, the noisier other
    assert _noise_claim(d).verdict == "deepest layer noisier"
    mixed = findings._deepest_minus_others(nt(lambda s: 0.16 if s % 2 else 0.04))
    assert _noise_claim(mixed).verdict == "not decided"


def test_near_chance_is_a_one_sided_test_above_the_line():
    """Near chance: not shown above chance + NEAR_CHANCE by a one-sided t test at 0.05/m, Bonferroni over the cells; a mean
    above the line with a wide spread is still near chance, one far above it with a small spread is not, and a
    single seed is never shown above."""
    line = 0.1 + findings.NEAR_CHANCE
    rows = []
    for s in range(6):
        noisy = line + 0.02 + (0.2 if s % 2 else -0.2)  # mean 0.02 above the line, SD about 0.2
        tight = line + 0.1 + 0.001 * s
        for st, a in (("noisy", noisy), ("tight", tight)):
            rows.append(dict(target_name="close", strategy=st, batch_size=2, seed=s, target=a))
    df = pd.DataFrame(rows)
    near = findings.near_chance_cells(df, 0.1)
    assert list(near.strategy) == ["noisy"]
    p_tight = inference.one_sided_p(df[df.strategy == "tight"].target, "greater", null=line)
    assert p_tight < 1e-6
    assert list(findings.near_chance_cells(df[df.seed == 0], 0.1).strategy) == ["noisy", "tight"]  # n = 1: not shown


def _tune(seeds=(1000, 1001)):
    """stats_frozen gains 0.1 at twice the rate (and then beats bn_train at batch 2); the rest is best at x1."""
    rows = []
    for s in seeds:
        for t in ("close", "shifted"):
            for b in (2, 32):
                for st in ("stats_frozen", "bn_train", "group_pretrained"):
                    for f in (0.5, 1.0, 2.0):
                        a = {"stats_frozen": 0.7, "bn_train": 0.75 if b == 2 else 0.85, "group_pretrained": 0.7}[st]
                        a += (0.1 if f == 2.0 else 0.0) if st == "stats_frozen" else (0.0 if f == 1.0 else -0.05)
                        a -= 0.2 if st == "bn_train" and b == 2 else 0.0
                        rows.append(dict(seed=s, target_name=t, batch_size=b, strategy=st, lr_factor=f,
                                         target=a + 0.001 * (s % 7), diverged=False))
    return pd.DataFrame(rows)


def test_lr_check_picks_best_rates_and_reports_winner_changes():
    out = findings.lr_check(_tune(), reference=32)
    best = run.best_rate_table(_tune()).drop_duplicates(findings.CELL).set_index(findings.CELL)["best_factor"]
    assert best[("close", "stats_frozen", 2)] == 2.0 and best[("close", "bn_train", 2)] == 1.0
    assert out["n_cells"] == 12 and out["n_moved"] == 4
    assert out["gain_max"] == pytest.approx(0.1)
    assert out["winner_pair"]["close_b2"].startswith((run.STRATEGY_LABELS["stats_frozen"],
                                                      run.STRATEGY_LABELS["group_pretrained"]))
    assert out["winner_pair"]["close_b32"] == f"unchanged ({run.STRATEGY_LABELS['bn_train']})"
    C = out["claims"].set_index("key")
    assert C.loc["lr_did_base_close", "estimate"] == pytest.approx(-0.3, abs=0.01)
    assert set(out["claims"].family) == {"lr_did"} and "did_base" not in out
    assert findings.break_word(findings.break_batch(_tune()[_tune().lr_factor == 1.0], "close", "bn_train", 32, 0.02,
                                                    "group_pretrained")[0]) == "<= 2"
    best = run.best_rate_table(_tune())
    assert set(best[best.strategy == "stats_frozen"].lr_factor) == {2.0}
    tbl = figures.lr_display(_tune())
    assert tbl.loc[run.STRATEGY_LABELS["stats_frozen"], "close, batch 2"].startswith("x2*: 0.8")  # x2 is the end of this grid


def test_stats_enough_and_censored_words():
    diag = pd.DataFrame([dict(seed=s, precise_records=_strip(_precise({2: 10 ** 9, 32: 64}, [s]))) for s in range(4)])
    pt = run.precise_table(diag)
    assert findings.stats_enough(pt, 32, "mean_err", 0.01) == 256  # 1/64, 1/256: the first below 0.01 is 256
    assert findings.stats_enough(pt, 32, "mean_err", 1e-9) == 0
    # a one-sided test, not a mean under the line: errors whose mean is under the tolerance but spread widely
    # around it are not shown below it
    pt2 = pt.copy()
    sel = (pt2.kind == "precise") & (pt2.batch_size == 32) & (pt2.n_samples == 16384)
    pt2.loc[sel, "mean_err"] = np.where(pt2.loc[sel, "seed"] % 2 == 0, 0.0, 0.019)  # mean 0.0095 < 0.01
    assert findings.stats_enough(pt2, 32, "mean_err", 0.01) == 0
    assert findings.enough_word(64, 64) == "<= 64" and findings.enough_word(256, 64) == "256" and findings.enough_word(0, 64) == "none tried"


def test_adabn_statistics_do_not_depend_on_the_fine_tuning_batch_size(bn_source):
    """M6: AdaBN re-estimates in batches of adabn_batch_size, so its task_a_before (head A on the re-estimated,
    untrained backbone) is the same at every fine-tuning batch size."""
    rows = [engine.finetune(FinetuneConfig(**TINY, strategy="adabn", batch_size=b, samples=16, adabn_samples=16,
                                           adabn_batch_size=16), bn_source) for b in (2, 8)]
    assert rows[0]["task_a_before"] == rows[1]["task_a_before"]
    r = engine.finetune(FinetuneConfig(**TINY, strategy="bn_train", batch_size=4, samples=16, adabn_samples=8),
                        bn_source)
    assert 0 <= r["target_restat"] <= 1 and math.isnan(rows[0]["target_restat"])


def test_tune_configs_use_separate_seeds_and_every_factor():
    cfg = run.make_config("quick")
    tc = cfg.tune_configs()
    assert not {c.seed for c in tc} & set(cfg.seeds) and {c.seed for c in tc} == {1000, 1001}
    assert len(tc) == 2 * 2 * len(cfg.tune_batch_sizes) * 8 * len(cfg.lr_factors)
    c = next(c for c in tc if c.batch_size == 2 and c.strategy == "bn_train" and c.lr == cfg.lr_for(2) * 2.0)
    assert c.adabn_batch_size == cfg.adabn_batch_size
    with pytest.raises(ValueError, match="tune_seeds must be seeds other than the reported ones, got \\[0, 5\\]"):
        run.make_config("quick", tune_seeds=[0, 5])
    with pytest.raises(ValueError, match="lr_factors must be increasing factors > 0 that contain 1.0"):
        run.make_config("quick", lr_factors=(0.5, 2.0))
    with pytest.raises(ValueError, match="tune_batch_sizes must be batch sizes that contain lr_batch"):
        run.make_config("quick", tune_batch_sizes=(2, 8))
    assert run.make_config("quick", tune_seeds=0, decision_batch_sizes=()).tune_configs() == []
    with pytest.raises(ValueError, match="tune_seeds must be at least 2 seeds where decision_batch_sizes is set"):
        run.make_config("quick", tune_seeds=0)


def test_config_errors_name_the_parameter():
    with pytest.raises(ValueError, match="lr_batch must be one of batch_sizes .*, got 64"):
        run.make_config("quick", lr_batch=64)
    with pytest.raises(ValueError, match="batch_sizes must be even integers >= 2"):
        run.make_config("quick", batch_sizes=(3, 32), samples=96)
    with pytest.raises(ValueError, match="strategies\\[0\\]='x' is not allowed"):
        run.make_config("quick", strategies=("x",))
    cfg = run.make_config("quick")
    assert cfg.lr_for(2) == pytest.approx(cfg.base_lr / 16)
    assert len(cfg.run_configs()) == len(cfg.seeds) * 2 * len(cfg.batch_sizes) * 8
    with pytest.raises(ValueError, match="precise_samples must be increasing multiples of 2"):
        run.make_config("quick", precise_samples=(3, 32))
    assert math.isclose(run.make_config("full").lr_for(256), 0.08)


# --- rows: the page analyses an earlier run's saved tables again ----------------------------------------------------

def test_diag_rebuilt_from_the_saved_tables_gives_the_same_tables_and_mismatch(tmp_path):
    rng = np.random.default_rng(1)
    diag = pd.DataFrame([dict(seed=s,
                              noise_records=[dict(layer=l, batch_size=b, rel_sd=float(rng.random())) for l in (0, 1)
                                             for b in (2, 8)],
                              precise_records=[dict(kind=k, batch_size=2, n_samples=n, accuracy=float(rng.random()))
                                               for k, n in (("exact", 64), ("precise", 4), ("precise", 16))],
                              mismatch_kl_close=float(rng.random()), mismatch_kl_shifted=float(rng.random()))
                         for s in (0, 3)])
    runs = pd.DataFrame([dict(seed=s, target_name=t, batch_size=b, mismatch_kl=diag.set_index("seed").loc[s, f"mismatch_kl_{t}"])
                         for s in (0, 3) for t in ("close", "shifted") for b in (2, 8)])
    saved = {}
    for name, table in (("noise", run.noise_table(diag)), ("precise", run.precise_table(diag)), ("runs", runs)):
        table.to_csv(tmp_path / f"{name}.csv", index=False)               # through the CSV, as the page reads them
        saved[name] = pd.read_csv(tmp_path / f"{name}.csv")
    back = run.diag_from_tables(saved["noise"], saved["precise"], saved["runs"])
    pd.testing.assert_frame_equal(run.noise_table(back), run.noise_table(diag), check_exact=True)
    pd.testing.assert_frame_equal(run.precise_table(back), run.precise_table(diag), check_exact=True)
    pd.testing.assert_frame_equal(back[["seed", "mismatch_kl_close", "mismatch_kl_shifted"]],
                                  diag[["seed", "mismatch_kl_close", "mismatch_kl_shifted"]], check_exact=True)


def test_analysis_parameters_decide_no_run():
    """The parameters a rows rebuild may change must not change any run: else its rows would not be the page's."""
    cfg = run.make_config("quick")
    other = run.make_config("quick", break_margin=0.05, equivalence_margin=0.03)
    assert set(run.ANALYSIS_PARAMETERS) <= set(cfg.asdict())
    assert cfg.run_configs() == other.run_configs() and cfg.tune_configs() == other.tune_configs()
    assert cfg.diag_configs() == other.diag_configs()
    assert all(f not in run.ANALYSIS_PARAMETERS for f in ("lr_batch", "base_lr", "seeds"))


@pytest.mark.slow
def test_notebook_with_rows_gives_the_page_its_own_run_gave(glued_payloads, quick_rebuild):
    """The session's quick page, then the page again from its saved tables (``rows``) with an empty cache: every
    glued number, verdict and table is the same, only the cost sentence says the rows were analysed again, and
    nothing ran. A notebook that ignored ``rows`` would fill the empty cache and say it ran the experiment."""
    from papermill.exceptions import PapermillExecutionError

    from bnstudy.study import book
    r = quick_rebuild("05_batch_size")
    a, b = glued_payloads(r.first), glued_payloads(r.again)
    assert set(a) == set(b)
    assert not [k for k in a if a[k] != b[k] and not k.startswith("ch05_fig") and k != "ch05_timing"]
    assert "did not run the experiment" in b["ch05_timing"] and "did not run" not in a["ch05_timing"]
    assert not r.cache2.exists() or not any(p.is_file() for p in r.cache2.rglob("*"))
    for t in ("",) + tuple(f"_{s}" for s in run.SIBLING_TABLES):
        assert (r.results / f"05_batch_size{t}.csv").read_bytes() == (r.results2 / f"05_batch_size{t}.csv").read_bytes()
    samples = run.make_config("quick").samples  # the profile the session's page ran
    refused = f"parameter 'samples' is {2 * samples} here but was {r.recorded('samples')}"
    with pytest.raises(PapermillExecutionError, match=refused):
        book.execute_chapter(r.nb_path, r.folder / "bad", "quick", parameters=dict(
            samples=2 * samples, rows=str(r.rows), results_dir=str(r.folder / "results3"),
            figures_dir=str(r.folder / "figures3"), cache_dir=str(r.folder / "cache3")))


# --- second referee round (referee_ch5b): B1-B5 ----------------------------------------------------------------------

def _tune5(seeds=(1000, 1001), bn_best=4.0, gn_best=2.0):
    """Five factors at batch 2 and 32: bn_train peaks at ``bn_best``, group_/layer_pretrained at ``gn_best``."""
    rows = []
    for s in seeds:
        for t in ("close", "shifted"):
            for b in (2, 32):
                for st in ("bn_train", "group_pretrained", "layer_pretrained"):
                    for f in (0.25, 0.5, 1.0, 2.0, 4.0):
                        peak = bn_best if st == "bn_train" else gn_best
                        a = 0.8 - 0.05 * abs(np.log2(f) - np.log2(peak)) + 0.001 * (s % 7)
                        rows.append(dict(seed=s, target_name=t, batch_size=b, strategy=st, lr_factor=f, target=a,
                                         diverged=(st == "bn_train" and f == 0.25 and s == 1000)))
    return pd.DataFrame(rows)


def test_chosen_factors_and_edge_flags():
    tune = _tune5()
    ch = run.chosen_factors(tune, 2)
    assert ch[("close", "bn_train")] == 4.0 and ch[("shifted", "group_pretrained")] == 2.0
    with pytest.raises(ValueError, match="batch_size=8 is not a batch size"):
        run.chosen_factors(tune, 8)
    out = findings.lr_check(tune, reference=32, control="group_pretrained")
    assert out["n_moved"] == 12 and out["n_edge"] == 4  # bn_train at x4 (the edge), 2 targets x 2 batch sizes
    assert out["n_diverged"] == 4 and out["n_runs"] == len(tune)
    tbl = figures.lr_display(tune)
    assert tbl.loc[run.STRATEGY_LABELS["bn_train"], "close, batch 2"].startswith("x4*:")
    assert tbl.loc[run.STRATEGY_LABELS["group_pretrained"], "close, batch 2"].startswith("x2:")


def test_tuned_configs_run_the_contenders_at_the_chosen_rates_on_reported_seeds():
    cfg = run.make_config("quick", tune_seeds=2)
    ch = {(t, s): 2.0 for t in run.TARGETS for s in run.CONTENDERS}
    tc = cfg.tuned_configs(ch)
    assert len(tc) == len(cfg.seeds) * 2 * 3 and {c.seed for c in tc} == set(cfg.seeds)
    assert {c.batch_size for c in tc} == {min(cfg.batch_sizes)} and {c.strategy for c in tc} == set(run.CONTENDERS)
    assert all(c.lr == pytest.approx(2.0 * cfg.lr_for(2)) for c in tc)
    with pytest.raises(ValueError, match="factors has no rate for target 'close', strategy 'bn_train'"):
        cfg.tuned_configs({})


def test_findings_per_source_accuracy_na_for_per_sample_and_restat_verdict():
    """B4: per-sample strategies are n/a beyond the control; bn_train's above-verdict is also given with
    re-estimated statistics (here the large-batch drop is running-average lag, gone after the re-estimate).
    B5: source accuracy per source network, never pooled; head A right after replacing BN (task_a_before)."""
    def acc(st, b, t):
        return 0.8 - (0.2 if st == "bn_train" and b == 128 else 0.0) - (0.1 if st == "to_layer" and b == 128 else 0)
    df = _table(acc, strategies=("bn_train", "to_layer", "group_pretrained"), batch_sizes=(2, 32, 128))
    df["diverged"] = False
    df["source_task_a_accuracy"] = df.strategy.map({"bn_train": 0.997, "to_layer": 0.997, "group_pretrained": 0.974})
    df["task_a_before"] = df.strategy.map({"bn_train": 0.997, "to_layer": 0.321, "group_pretrained": 0.974})
    df["target_restat"] = np.where(df.strategy == "bn_train", 0.8, np.nan)
    claims, F = findings.findings(df, _diag(), reference=32)
    assert N(F, "breaks_stats_above_close_bn_train") == ">= 128" and N(F, "breaks_stats_above_restat_close") == "never"
    assert N(F, "breaks_above_close_to_layer") == ">= 128" and N(F, "breaks_stats_above_close_to_layer") == "n/a"
    assert N(F, "breaks_stats_close_to_layer") == "n/a" and N(F, "n_stats_break_below") == 0
    assert findings.entries(F, "source_acc") == {"batch": pytest.approx(0.997), "group": pytest.approx(0.974)}
    assert N(F, "replaced_before_to_layer").mean == pytest.approx(0.321) and "replaced_before_to_group" not in set(F.key)
    tbl = figures.breaks_display(F, ("bn_train", "to_layer", "group_pretrained"))
    row = tbl[tbl.strategy == "BN in train mode, statistics re-estimated"].iloc[0]
    assert row["above 32: beyond the control"] == "never"
    assert not F.key.str.startswith("rate_").any()
    C = claims.set_index("key")
    # the re-estimate recovers the 0.2 lost at batch 128: re-estimated minus before = +0.2
    assert C.loc["restat_gain_close", "estimate"] == pytest.approx(0.2, abs=0.01)
    assert C.loc["restat_gain_close", "verdict"] == "re-estimated higher"


# --- the verdicts the page cites, chosen by the findings (issue 25) ---------------------------------------------------

def _answer_of(acc_fn):
    df = _table(acc_fn, strategies=("stats_frozen", "bn_train", "adabn", "to_group", "group_pretrained"),
                batch_sizes=(2, 8, 32, 128))
    df["diverged"] = False
    claims, F = findings.findings(df, _diag(), reference=32)
    return F, claims


def test_flip_the_small_batch_verdicts_and_the_page_follows():
    """The flip test (issue 25): a table where BatchNorm in train mode breaks at batch 2 and a per-sample norm wins
    there, and the same with the two swapped (BatchNorm ahead, nothing breaking); the break tokens and the
    small-batch verdicts the page cites change with the table and never keep the old outcome."""
    def ps_wins(st, b, t):
        return {"bn_train": 0.8 if b >= 8 else 0.5, "to_group": 0.75, "group_pretrained": 0.78}.get(st, 0.6)

    def bn_wins(st, b, t):
        return {"bn_train": 0.85, "to_group": 0.6, "group_pretrained": 0.62}.get(st, 0.8)

    (F1, c1), (F2, c2) = _answer_of(ps_wins), _answer_of(bn_wins)
    assert N(F1, "breaks_stats_close_bn_train") == "<= 2" and N(F2, "breaks_stats_close_bn_train") == "never"
    v1, v2 = (dict(zip(c.key, c.verdict)) for c in (c1, c2))
    assert v1["recommend_close_b2"] == "per-sample norm higher" and v2["recommend_close_b2"] == "per-sample norm lower"
    md = _page_markdown()
    assert "{glue:md}`ch05_breaks_stats_close_bn_train`" in md and "{glue:md}`ch05_recommend_close_b2_verdict`" in md


def test_the_answer_leaves_the_untuned_train_eval_gap_to_the_body():
    """Issue 35: the train-mode minus eval-mode gap is measured at the untuned linear-scaling rate: context for the
    body (its own section), never in the answer box, whatever its verdict."""
    for acc in (lambda st, b, t: 0.8, lambda st, b, t: 0.8 - (0.2 if st == "bn_train" and b == 2 else 0.0)):
        _, claims = _answer_of(acc)
        assert (claims["key"] == "gap_close_b2").any()
    box = _page_markdown().split(":::")[1]
    assert "The answer" in box and "ch05_gap_" not in box and "train mode minus eval" not in box


def test_the_large_batch_sentence_names_a_collapse_only_where_a_break_is_found():
    def flat(st, b, t):
        return 0.8

    def collapse(st, b, t):
        return 0.8 - (0.3 if b == 128 else 0.0)

    F_flat, c_flat = _answer_of(flat)
    F_col, c_col = _answer_of(collapse)
    flat_text = notes(findings.NOTES, c_flat, F_flat)["large_batch"]
    assert N(F_flat, "n_break_above") == 0 and "no strategy and target pair is shown to break" in flat_text
    assert "lose accuracy" not in flat_text
    assert N(F_col, "n_break_above") > 0 and "lose accuracy" in notes(findings.NOTES, c_col, F_col)["large_batch"]


def _page_markdown() -> str:
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parent.parent / "chapters" / "05_batch_size.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_the_notebook_leads_with_the_answer_and_types_no_collapse_or_nan():
    """Issue 25: the answer box first (the decision's one answer, what to do, the re-estimate note); "the
    large-batch collapse" only as the findings choose it (the ``large_batch`` note), no hand-typed table numbers,
    no typed NaN, no code shown."""
    import json
    import re
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parent.parent / "chapters" / "05_batch_size.ipynb").read_text())
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith("# ") and "{admonition} The answer\n:class: answer" in first
    for key in ("decision_answer", "decision_use", "decision_code", "decision_depends", "restat_advice",
                "precise_enough"):
        assert f"`ch05_{key}`" in first, key
    md = _page_markdown()
    assert "large-batch collapse" not in md and "the collapse above" not in md
    assert not re.search(r"\((?:see )?(?:Table|Fig\.|Figure) \d+\)", md)
    assert not re.search(r"(?<![\w-])nan(?![\w-])", md, flags=re.I)
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            tags = set(c["metadata"].get("tags", []))
            assert "show-code" not in tags and tags & {"remove-cell", "remove-input"}
            compile("".join(c["source"]), "cell", "exec")


# --- the page's rule-triggered notes (bnstudy.study.words.Note): every note of findings.NOTES flips with its rule ----------

def _note_tables(ratio=2.5, n_above=0):
    claims = pd.DataFrame(dict(key=["recommend_close_b2"], verdict=["not decided"]))
    f = inference.numbers_table(dict(smallest_batch=2, reference_batch=32, n_break_above=n_above,
                                     precise_var_err_ratio_b2_b32=ratio, equivalence_margin=0.01,
                                     stat_tolerance=0.01, precise_enough=dict(b2="16", b32="<= 32"),
                                     precise_stats_enough=dict(b2="none tried", b32="512")))
    return claims, f


def test_restat_and_large_batch_notes_flip_with_their_numbers():
    claims, f = _note_tables(ratio=2.5)
    assert "in batches of 2 the variance's error is 2.5 times that in batches of 32" in \
        notes(findings.NOTES, claims, f)["restat_advice"]
    for ratio in (1.0, 0.5, float("nan")):  # not larger in batches of 2 (or unknown): no comparison claimed
        text = notes(findings.NOTES, claims, inference.with_numbers(f, dict(precise_var_err_ratio_b2_b32=ratio)))
        assert text["restat_advice"] == ("Re-estimate BatchNorm statistics with `bnstudy.update_bn_stats(backbone, "
                                         "target_loader)` (a forward pass without gradients).")
    assert notes(findings.NOTES, claims, f)["large_batch"] == (
        "Above the reference batch size of 32, no strategy and target pair is shown to break from any cause.")
    text = notes(findings.NOTES, claims, inference.with_numbers(f, dict(n_break_above=3)))["large_batch"]
    assert text.startswith("Above the reference batch size of 32, 3 strategy and target pairs are shown to break")
    assert "lose accuracy" in text


def test_the_precise_enough_note_follows_both_criteria_and_flips_where_batches_of_2_never_get_there():
    claims, f = _note_tables()
    text = notes(findings.NOTES, claims, f)["precise_enough"]
    assert text.startswith("Precise BN's re-estimate is within ±0.01 of the exact statistics' accuracy already at "
                           "N = 32, the smallest N tried, in batches of 32 and from N = 16 on in batches of 2 (a weak test")
    assert "at its ceiling" in text and "<=" not in text and "**" not in text
    assert "below 0.01 from N = 512 on in batches of 32 but at none of the N tried in batches of 2" in text
    g = inference.with_numbers(f, {"precise_stats_enough_b2": "<= 4", "precise_enough_b32": "none tried"})
    text = notes(findings.NOTES, claims, g)["precise_enough"]
    assert "accuracy at none of the N tried in batches of 32" in text
    assert text.endswith("from N = 512 on in batches of 32 and already at N = 4, the smallest N tried, in batches "
                         "of 2.") and "none of the N tried in batches of 2" not in text


def test_per_seed_means_drop_a_seed_with_a_missing_run_and_refuse_repeated_rows():
    """``replaced_before`` and ``deepest_noisiest`` aggregate within a seed (over runs / over layers) before the
    interval or the verdict: a missing value drops that seed (it is not averaged or maximised over fewer runs or
    layers), and a repeated row is refused rather than merged."""
    df = _table(_acc, seeds=range(4), strategies=("to_layer",))
    df["task_a_before"] = 0.3 + 0.1 * df["seed"] + 0.01 * (df["target_name"] == "shifted")
    df.loc[(df.seed == 0) & (df.target_name == "shifted") & (df.batch_size == 8), "task_a_before"] = math.nan
    m = findings._seed_means(df, "task_a_before")
    assert math.isnan(m.loc[0]) and m.loc[1:].values == pytest.approx([0.405, 0.505, 0.605])
    iv = inference.t_interval(m)
    assert iv.n == 3 and iv.mean == pytest.approx(0.505)  # seed 0 left out, not averaged over 5 of its 6 runs
    with pytest.raises(ValueError, match=r"repeated \(seed, target_name, strategy, batch_size\) rows"):
        findings._seed_means(pd.concat([df, df.iloc[[3]]]), "task_a_before")

    nt = pd.DataFrame([dict(seed=s, layer=l, batch_size=2, var_mean_rel=v)
                       for s in range(4) for l, v in ((0, 0.04), (1, 0.09), (2, 0.16))])
    nt.loc[(nt.seed == 1) & (nt.layer == 1), "var_mean_rel"] = math.nan  # else layer 0 would stand in for it
    d = findings._deepest_minus_others(nt)
    assert math.isnan(d.loc[1]) and d.drop(1).values == pytest.approx([0.1] * 3)
    assert _noise_claim(d).n == 3
    with pytest.raises(ValueError):
        findings._deepest_minus_others(pd.concat([nt, nt.iloc[[0]]]))
