"""The statistics-mismatch measure (bnstudy.running_stats.statistics_mismatch) and its parts."""

import math

import pytest
import torch
from torch import nn

from bnstudy.freeze import is_pinned, pin_eval
from bnstudy.study.models import ConvBackbone
from bnstudy.running_stats import (MISMATCH_MEASURES, bn_input_statistics, gaussian_kl, mismatch_from_statistics,
                           statistics_mismatch)


def _data(n=4, b=32, seed=0, shape=(3, 8, 8)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn((b, *shape), generator=g) for _ in range(n)]


def _known_bn(mean=0.0, var=1.0, channels=3):
    bn = nn.BatchNorm2d(channels)
    bn.running_mean.fill_(mean)
    bn.running_var.fill_(var)
    return nn.Sequential(bn).eval()


def _calibrated_backbone(seed=0):
    torch.manual_seed(seed)
    bb = ConvBackbone(3, (8, 8))
    bb.train()
    with torch.no_grad():
        for x in _data(n=40, seed=seed + 1, shape=(3, 16, 16)):
            bb(x)
    return bb.eval()


def test_mismatch_is_zero_when_running_statistics_equal_the_data_statistics():
    xs = _data()
    x = torch.cat(xs).double()
    model = _known_bn()
    bn = model[0]
    bn.running_mean.copy_(x.mean((0, 2, 3)).float())
    bn.running_var.copy_(x.var((0, 2, 3), unbiased=False).float())
    for measure in MISMATCH_MEASURES:
        per_layer = statistics_mismatch(model, xs, measure)
        assert list(per_layer) == ["0"]
        assert abs(per_layer["0"]) < 1e-6


def test_mismatch_is_zero_at_the_adabn_fixed_point_of_a_deep_network():
    # Store each layer's own train-pass statistics of one batch: eval mode then reproduces train mode
    # exactly, so every layer's eval-pass input matches what it stores, deep layers included.
    bb = ConvBackbone(3, (8, 8, 8))
    x = _data(n=1, b=64, shape=(3, 16, 16))
    for name, (mean, var) in bn_input_statistics(bb, x, "train").items():
        layer = dict(bb.named_modules())[name]
        layer.running_mean.copy_(mean.float())
        layer.running_var.copy_(var.float())
    kl = statistics_mismatch(bb, x, "kl")
    assert len(kl) == 3
    assert max(kl.values()) < 1e-6


def test_kl_grows_monotonically_with_a_pure_brightness_shift_on_a_known_layer():
    xs = _data(n=8)
    model = _known_bn(mean=0.0, var=1.0)
    shifts = [0.0, 0.25, 0.5, 1.0, 2.0, 4.0]
    kl = [statistics_mismatch(model, [x + b for x in xs], "kl")["0"] for b in shifts]
    ms = [statistics_mismatch(model, [x + b for x in xs], "mean_shift")["0"] for b in shifts]
    assert all(k1 > k0 for k0, k1 in zip(kl, kl[1:]))
    assert all(m1 > m0 for m0, m1 in zip(ms, ms[1:]))
    # On this layer the data are ~N(0, 1) and the stored Gaussian is N(0, 1): KL ~ b^2 / 2, shift ~ b.
    for b, k, m in zip(shifts[2:], kl[2:], ms[2:]):
        assert k == pytest.approx(b * b / 2, rel=0.05)
        assert m == pytest.approx(b, rel=0.05)


def test_brightness_shift_raises_the_first_layer_mismatch_of_a_calibrated_backbone_monotonically():
    bb = _calibrated_backbone()
    xs = _data(n=4, shape=(3, 16, 16), seed=5)
    first = [statistics_mismatch(bb, [x + b for x in xs])["blocks.0.norm"] for b in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert first[0] < 0.01
    assert all(k1 > k0 for k0, k1 in zip(first, first[1:]))


def test_kl_sees_a_contrast_change_that_the_mean_shift_misses():
    xs = _data(n=8)
    model = _known_bn(mean=0.0, var=1.0)
    stretched = [3.0 * x for x in xs]
    assert statistics_mismatch(model, stretched, "mean_shift")["0"] < 0.05
    kl = statistics_mismatch(model, stretched, "kl")["0"]
    assert kl == pytest.approx(0.5 * (9 - 1 - math.log(9)), rel=0.05)


def test_gaussian_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(3)
    mp, mq = torch.randn(10, generator=g, dtype=torch.float64), torch.randn(10, generator=g, dtype=torch.float64)
    vp, vq = torch.rand(10, generator=g, dtype=torch.float64) + 0.1, torch.rand(10, generator=g, dtype=torch.float64) + 0.1
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mp, vp.sqrt()), torch.distributions.Normal(mq, vq.sqrt()))
    assert torch.allclose(gaussian_kl(mp, vp, mq, vq), ref)


def test_first_layer_input_is_the_same_in_eval_and_train_pass():
    # Nothing is normalised before the first BN layer, so the two passes can only differ deeper.
    bb = _calibrated_backbone()
    xs = [x + 2.0 for x in _data(n=2, shape=(3, 16, 16))]
    ev, tr = bn_input_statistics(bb, xs, "eval"), bn_input_statistics(bb, xs, "train")
    assert torch.allclose(ev["blocks.0.norm"][0], tr["blocks.0.norm"][0])
    assert torch.allclose(ev["blocks.0.norm"][1], tr["blocks.0.norm"][1])
    assert not torch.allclose(ev["blocks.1.norm"][0], tr["blocks.1.norm"][0])


def test_statistics_mismatch_leaves_the_model_untouched():
    bb = _calibrated_backbone()
    pin_eval(bb)
    before = {k: v.clone() for k, v in bb.state_dict().items()}
    statistics_mismatch(bb, _data(n=2, shape=(3, 16, 16)), network_mode="train")
    after = bb.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert is_pinned(bb) and not bb.training


def test_per_channel_values_average_to_the_layer_value():
    bb = _calibrated_backbone()
    xs = [x + 1.0 for x in _data(n=2, shape=(3, 16, 16))]
    per_ch = statistics_mismatch(bb, xs, per_channel=True)
    mean = statistics_mismatch(bb, xs)
    assert per_ch["blocks.1.norm"].shape == (8,)
    assert float(per_ch["blocks.1.norm"].mean()) == pytest.approx(mean["blocks.1.norm"])
    stats = bn_input_statistics(bb, xs)
    assert mismatch_from_statistics(bb, stats) == pytest.approx(mean)


@pytest.mark.parametrize("kwargs, match", [
    (dict(measure="l2"), "measure"),
    (dict(network_mode="training"), "network_mode"),
])
def test_statistics_mismatch_rejects_unknown_choices_naming_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        statistics_mismatch(_known_bn(), _data(n=1), **kwargs)


def test_statistics_mismatch_rejects_a_model_without_batchnorm_and_empty_batches():
    with pytest.raises(ValueError, match="no BatchNorm"):
        statistics_mismatch(nn.Sequential(nn.Conv2d(3, 3, 1)), _data(n=1))
    with pytest.raises(ValueError, match="batches is empty"):
        statistics_mismatch(_known_bn(), [])


def test_mismatch_from_statistics_rejects_statistics_of_another_model():
    stats = {"blocks.0.norm": (torch.zeros(3), torch.ones(3))}
    with pytest.raises(ValueError, match="not a BN layer"):
        mismatch_from_statistics(_known_bn(), stats)
    with pytest.raises(ValueError, match="shape"):
        mismatch_from_statistics(_known_bn(channels=4), {"0": (torch.zeros(3), torch.ones(3))})


# --- issue 10: the added candidates, on layers whose answer is known -------------------------------------------------

def _stats_of(model, mean, var):
    (name,) = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    return {name: (torch.full((3,), mean, dtype=torch.float64), torch.full((3,), var, dtype=torch.float64))}


def test_log_var_ratio_and_wasserstein_on_known_statistics():
    model = _known_bn(mean=0.0, var=1.0)          # stored N(0, 1); eps 1e-5 is added to both variances
    eps = 1e-5
    # New data N(0, 4 - eps): variance ratio exactly 4, same mean.
    st = _stats_of(model, 0.0, 4.0 - eps)
    (lvr,) = mismatch_from_statistics(model, st, "log_var_ratio").values()
    assert lvr == pytest.approx(math.log(4.0 / (1 + eps)), rel=1e-12)
    (w2,) = mismatch_from_statistics(model, st, "wasserstein").values()
    assert w2 == pytest.approx((2.0 - math.sqrt(1 + eps)) / math.sqrt(1 + eps), rel=1e-12)
    (ms,) = mismatch_from_statistics(model, st, "mean_shift").values()
    assert ms == 0.0                               # blind to the variance change
    # A pure mean shift of 3 stored standard deviations: the log variance ratio is blind to it, W2 = mean shift.
    st = _stats_of(model, 3.0 * math.sqrt(1 + eps), 1.0)
    (lvr,) = mismatch_from_statistics(model, st, "log_var_ratio").values()
    (w2,) = mismatch_from_statistics(model, st, "wasserstein").values()
    assert lvr == 0.0 and w2 == pytest.approx(3.0, rel=1e-12)


def test_mismatch_candidate_rejects_an_unknown_measure():
    from bnstudy.running_stats import mismatch_candidate
    z = torch.ones(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="not a mismatch_candidate"):
        mismatch_candidate("kl", z, z, z, z)
