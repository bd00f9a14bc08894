"""update_bn_stats / precise_bn_statistics: fvcore's tests for its precise BN, ported, plus the contract."""

import itertools

import pytest
import torch
from torch import nn

from bnstudy.freeze import pin_eval
from bnstudy.stats import precise_bn_statistics, update_bn_stats


@pytest.mark.parametrize("bn,dims,shape", [(nn.BatchNorm1d, [0, 2], (16, 8, 24)),
                                           (nn.BatchNorm2d, [0, 2, 3], (16, 8, 24, 8)),
                                           (nn.BatchNorm3d, [0, 2, 3, 4], (16, 8, 4, 12, 6))])
def test_update_bn_stats_is_the_mean_of_batch_means_and_unbiased_batch_variances(bn, dims, shape):
    torch.manual_seed(42)
    model = bn(shape[1]).train()
    tensors = [torch.randn(shape) for _ in range(8)]
    mean = torch.stack([t.mean(dim=dims) for t in tensors]).mean(0)
    var = torch.stack([t.var(dim=dims) for t in tensors]).mean(0)
    old_weight = model.weight.detach().clone()
    update_bn_stats(model, itertools.cycle(tensors), 8 * 100)
    assert torch.allclose(model.running_mean, mean, atol=1e-5)
    assert torch.allclose(model.running_var, var, atol=1e-5)
    assert torch.equal(model.weight, old_weight)
    assert model.training and model.momentum == 0.1 and int(model.num_batches_tracked) == 800


def test_update_bn_stats_with_too_few_batches_raises_and_restores_everything():
    model = nn.BatchNorm2d(32)
    model.running_mean.fill_(3.0)
    with pytest.raises(ValueError, match="num_iters=20 but batches yielded only 10"):
        update_bn_stats(model, itertools.repeat(torch.randn(16, 32, 4, 4), 10), 20)
    assert (model.running_mean == 3.0).all() and model.momentum == 0.1 and model.training
    with pytest.raises(ValueError, match="num_iters must be a positive integer"):
        update_bn_stats(model, [torch.randn(2, 32, 2, 2)], 0)
    with pytest.raises(ValueError, match="no BatchNorm layer"):
        update_bn_stats(nn.Linear(2, 2), [torch.randn(2, 2)])
    with pytest.raises(ValueError, match="batches is empty"):
        update_bn_stats(model, [])


def test_update_bn_stats_restores_flags_and_momentum_and_reaches_pinned_layers_only_with_stats():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=0.3), nn.Dropout(0.5),
                          nn.BatchNorm1d(4, momentum=None), nn.BatchNorm1d(4, track_running_stats=False))
    pin_eval(model[1])
    model.train()
    flags = [m.training for m in model.modules()]
    calls = update_bn_stats(model, [torch.randn(8, 3) for _ in range(4)])
    assert calls == {"1": 4, "3": 4}
    assert [m.training for m in model.modules()] == flags and model[1].momentum == 0.3 and model[3].momentum is None
    assert not (model[1].running_mean == 0).all()


def test_precise_bn_statistics_leaves_the_model_untouched_and_equals_update_bn_stats():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    xs = [torch.randn(8, 3) for _ in range(5)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    est = precise_bn_statistics(model, xs)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    update_bn_stats(model, xs)
    assert torch.equal(est["1"][0], model[1].running_mean) and torch.equal(est["1"][1], model[1].running_var)
