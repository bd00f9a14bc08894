"""Invariants of the four freeze modes, checked exactly on a small packed run."""


import pytest
import torch
from torch import nn

from bnstudy import freeze as fz
from bnstudy import train
from bnstudy.models import ConvBackbone, make_head

SMALL = dict(widths=(4, 8), stage1_steps=30, steps=40, n_eval=40, batch_size=16, stage1_batch_size=16, epoch_steps=10)


@pytest.fixture(scope="module")
def rows():
    cfgs = [dict(SMALL, seed=s) for s in (0, 1)]
    sources = train.train_source(cfgs)
    out = {}
    for mode in fz.MODE_NAMES:
        out[mode] = train.transfer([dict(c, mode=mode) for c in cfgs], sources)
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


def test_separate_stats_keeps_old_logits_bit_identical(rows):
    for r in rows["separate_stats"]:
        assert r["max_old_logit_change"] == 0.0
        assert r["task_a_after"] == r["task_a_before"]
    for r in rows["train_mode"]:
        assert r["max_old_logit_change"] > 0.0


def test_pinned_modes_keep_old_logits_bit_identical(rows):
    for mode in ("backbone_eval", "all_eval"):
        for r in rows[mode]:
            assert r["max_old_logit_change"] == 0.0, mode


def test_modes_share_the_source_backbone_within_a_seed(rows):
    befores = {mode: [r["task_a_before"] for r in rs] for mode, rs in rows.items()}
    assert len({tuple(v) for v in befores.values()}) == 1


def _small_model():
    bb = ConvBackbone(3, (4, 8))
    return fz.TransferModel(bb, make_head("linear", 8, 10), make_head("linear", 8, 10))


def test_pinned_backbone_survives_parent_train_call():
    m = _small_model()
    fz.BACKBONE_EVAL.apply(m)
    m.train()
    assert not any(mod.training for mod in m.backbone.modules())
    assert m.head_b.training
    before = {k: v.clone() for k, v in m.backbone.state_dict().items()}
    m.forward_b(torch.randn(8, 3, 16, 16))
    after = m.backbone.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_separate_stats_copy_shares_parameters_but_not_buffers():
    m = _small_model()
    fz.SEPARATE_STATS.apply(m)
    pa = dict(m.backbone.named_parameters())
    pb = dict(m.backbone_b.named_parameters())
    assert all(pa[k] is pb[k] for k in pa)
    ba = dict(m.backbone.named_buffers())
    bb = dict(m.backbone_b.named_buffers())
    assert all(ba[k].data_ptr() != bb[k].data_ptr() for k in ba)
    m.forward_b(torch.randn(8, 3, 16, 16) * 3 + 1)
    assert not torch.equal(ba["blocks.0.norm.running_mean"], bb["blocks.0.norm.running_mean"])
    assert torch.equal(ba["blocks.0.norm.running_mean"], torch.zeros(4))


def test_running_mean_decays_as_one_minus_momentum_to_the_t():
    """After t identical batches the start value keeps exactly the weight (1-m)^t."""
    m = 0.1
    bn = nn.BatchNorm1d(3, momentum=m)
    start = torch.tensor([5.0, -2.0, 1.0])
    bn.running_mean.copy_(start)
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(0)) + torch.tensor([1.0, 2.0, 3.0])
    target = x.mean(0)
    bn.train()
    for t in range(1, 80):
        bn(x)
        expected = (1 - m) ** t * start + (1 - (1 - m) ** t) * target
        assert torch.allclose(bn.running_mean, expected, atol=1e-5), t
    assert (1 - m) ** 66 < 1e-3 < (1 - m) ** 65


def test_measured_drift_follows_the_decay_in_train_mode():
    cfg = dict(SMALL, seed=3, steps=70)
    src = train.train_source([cfg])
    row = train.transfer([dict(cfg, mode="train_mode")], src)[0]
    steps = row["drift_steps"]
    m = row["momentum"]
    for layer in ("drift_weight_l0", "drift_weight_l1"):
        w = dict(zip(steps, row[layer]))
        assert w[0] == pytest.approx(1.0)
        for t in (1, 2, 3, 5, 8):
            assert w[t] == pytest.approx((1 - m) ** t, abs=0.08), (layer, t)
        assert abs(w[66]) < 0.1


@pytest.mark.parametrize("bad, match", [
    (dict(mode="frozen"), "mode='frozen' is not a freeze mode"),
    (dict(batch_size=1), "batch_size must be >= 2"),
    (dict(steps=0), "steps must be a positive integer"),
    (dict(steps=-5), "steps must be a positive integer"),
    (dict(stage1_batch_size=1), "stage1_batch_size must be >= 2"),
    (dict(norm="instance"), "norm='instance' is not allowed"),
    (dict(lr=0), "lr must be > 0"),
    (dict(contrast=0), "contrast must be > 0"),
    (dict(colour=1), "unknown config keys"),
])
def test_bad_parameters_raise_clear_value_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        train.complete_config(bad)


def test_batch_size_one_is_allowed_when_no_bn_is_in_train_mode():
    assert train.complete_config(dict(batch_size=1, mode="backbone_eval"))["batch_size"] == 1


def test_get_mode_lists_allowed_names():
    with pytest.raises(ValueError, match="train_mode"):
        fz.get_mode("nope")


def test_pinned_model_survives_pickling_and_stays_pinned(tmp_path):
    m = _small_model()
    fz.pin_eval(m.backbone)
    torch.save(m, tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=False)
    back.train()
    assert fz.is_pinned(back.backbone)
    assert not any(mod.training for mod in back.backbone.modules())
    assert back.head_b.training


def test_pin_eval_rejects_non_modules():
    with pytest.raises(TypeError, match="nn.Module"):
        fz.pin_eval(None)


@pytest.mark.parametrize("bad, match", [
    (dict(brightness="bright"), "brightness must be a finite number, got 'bright'"),
    (dict(noise=float("nan")), "noise must be a finite number"),
    (dict(widths=[16, 0]), "widths must be a sequence of positive integers"),
    (dict(seed=1.5), "seed must be a non-negative integer"),
])
def test_non_numeric_parameters_name_the_key(bad, match):
    with pytest.raises(ValueError, match=match):
        train.complete_config(bad)


@pytest.mark.parametrize("seeds", [-3, 2.5, "3", [0, 0], [0, 1.5], 1])
def test_bad_seeds_give_a_clear_error(seeds):
    from bnstudy.experiments.common import seeds_for
    with pytest.raises(ValueError, match="seeds"):
        seeds_for("quick", seeds)
