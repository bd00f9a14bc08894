"""The estimators on real loaders (issue 36, case 3, and its kinds): a last batch of one sample, empty batches,
models whose forward takes several inputs or a dict."""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bnstudy
from bnstudy.running_stats import bn_input_statistics, precise_bn_statistics, statistics_mismatch, update_bn_stats


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 4), nn.BatchNorm1d(4))


def _stats(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_update_bn_stats_skips_a_last_batch_of_one_sample_with_a_warning_and_keeps_the_estimate():
    torch.manual_seed(1)
    data = torch.randn(9, 3) * 2 + 1
    loader = DataLoader(TensorDataset(data), batch_size=4)  # batches of 4, 4 and 1: torch's kernel refuses the 1
    assert [lint.code for lint in bnstudy.lint_loader(loader, warn=False)] == ["last_batch_single"]
    model, ref = _mlp(), _mlp()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):  # what torch itself does
        ref.train()(data[8:])
    ref = _mlp()
    update_bn_stats(ref, [data[:4], data[4:8]])
    with pytest.warns(RuntimeWarning, match=r"skipped 1 of 3 batches.*batch 2 \(1 sample, counted from 0\).*"
                                            r"last_batch_single.*drop_last=True"):
        calls = update_bn_stats(model, loader)
    assert calls == {"1": 2, "4": 2}
    for k, v in _stats(ref).items():  # the estimate of the two usable batches, bit for bit
        assert torch.equal(model.state_dict()[k], v), k
    # the same through the copy-based estimators
    with pytest.warns(RuntimeWarning, match="skipped 1 of 3"):
        est = precise_bn_statistics(_mlp(), loader)
    assert torch.equal(est["1"][0], ref[1].running_mean) and torch.equal(est["4"][1], ref[4].running_var)


def test_update_bn_stats_with_no_usable_batch_refuses_and_restores_every_statistic():
    model = _mlp()
    with torch.no_grad():
        model[1].running_mean.fill_(3.0)
    before = _stats(model)
    with pytest.raises(ValueError, match=r"no batch could be used: batch 0 \(1 sample.*batch 1 \(0 samples"):
        update_bn_stats(model, [torch.randn(1, 3), torch.randn(0, 3)])
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_an_empty_batch_is_skipped_and_one_image_into_batchnorm2d_is_pooled_like_any_batch():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    images = torch.randn(5, 3, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one image holds 16 values per channel: torch accepts it, no warning
        update_bn_stats(model, [images[:4], images[4:]])
    x = model[0](images).transpose(0, 1).reshape(4, -1).double()
    assert torch.allclose(model[1].running_mean.double(), x.mean(1), atol=1e-6)
    assert torch.allclose(model[1].running_var.double(), x.var(1), atol=1e-5)
    other = copy.deepcopy(model)
    with pytest.warns(RuntimeWarning, match=r"batch 1 \(0 samples, counted from 0\): it holds no sample"):
        assert update_bn_stats(other, [images[:4], images[:0], images[4:]]) == {"1": 2}
    assert torch.equal(other[1].running_var, model[1].running_var)


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a, self.b = nn.Linear(3, 4), nn.Linear(2, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x, mask):
        return self.bn(self.a(x) + self.b(mask))


def test_forward_runs_a_model_with_several_inputs_in_every_estimator_and_comparison():
    torch.manual_seed(4)
    batches = [{"x": torch.randn(6, 3), "mask": torch.randn(6, 2)} for _ in range(3)]
    model = TwoInputs()
    call = lambda m, b: m(b["x"], b["mask"])  # noqa: E731
    with pytest.raises(TypeError, match="missing 1 required positional argument"):  # without it: model(b["x"])
        update_bn_stats(TwoInputs(), batches)
    assert update_bn_stats(model, batches, forward=call) == {"bn": 3}
    seen = torch.cat([model.a(b["x"]) + model.b(b["mask"]) for b in batches]).detach().double()
    assert torch.allclose(model.bn.running_mean.double(), seen.mean(0), atol=1e-6)
    assert torch.allclose(model.bn.running_var.double(), seen.var(0), atol=1e-5)
    est = precise_bn_statistics(TwoInputs(), batches, forward=lambda m, b: m(**b))
    assert torch.equal(est["bn"][0], model.bn.running_mean)
    df = bnstudy.compare_statistics(model, batches, forward=call)
    assert df.agrees.all() and float(df.max_mean_shift.max()) == 0.0
    assert statistics_mismatch(model, batches, "mean_shift", forward=call)["bn"] < 1e-5
    assert set(bn_input_statistics(model, batches, forward=call)) == {"bn"}
    with pytest.raises(ValueError, match="give input_fn .* or forward .*, not both"):
        update_bn_stats(model, batches, input_fn=lambda b: b["x"], forward=call)
    with pytest.raises(TypeError, match="forward must be a function forward"):
        update_bn_stats(model, batches, forward="x")


def test_bn_input_statistics_in_train_mode_skips_a_batch_of_one_sample_like_update_bn_stats():
    torch.manual_seed(5)
    data = torch.randn(9, 3)
    model = _mlp()
    ref = bn_input_statistics(model, [data[:4], data[4:8]], network_mode="train")
    with pytest.warns(RuntimeWarning, match=r"skipped 1 of 3 batches.*batch 2 \(1 sample"):
        got = bn_input_statistics(model, DataLoader(TensorDataset(data), batch_size=4), network_mode="train")
    assert all(torch.equal(got[k][i], ref[k][i]) for k in ref for i in (0, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eval mode normalises one sample with stored statistics: nothing to skip
        bn_input_statistics(model, [data[:4], data[8:]], network_mode="eval")
