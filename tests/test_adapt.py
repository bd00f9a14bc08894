"""bnstudy.adapt_bn_statistics (issue 38's library call): test-time adaptation of BatchNorm statistics with a prior
weight (Schneider et al. 2020), checked against statistics computed by hand in numpy (float64) and against what
torch itself does in train and eval mode."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import bnstudy
from bnstudy import FrozenBatchNorm, adapt, adapt_bn_statistics


def _bn(kind: str, c: int, seed: int = 0) -> nn.Module:
    """A BatchNorm layer in eval mode with non-trivial stored statistics and affine parameters."""
    g = torch.Generator().manual_seed(seed)
    bn = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[kind](c)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=g))
        bn.running_var.copy_(torch.rand(c, generator=g) * 3 + 0.2)
        bn.weight.copy_(torch.randn(c, generator=g))
        bn.bias.copy_(torch.randn(c, generator=g))
    return bn.eval()


def _by_hand(bn: nn.Module, x: torch.Tensor, prior: float) -> np.ndarray:
    """Schneider et al.'s mix in float64: w = N / (N + n), n = x.shape[0]; the batch's variance is the biased one."""
    a = x.detach().double().numpy()
    axes = (0,) + tuple(range(2, a.ndim))
    n = a.shape[0]
    w = 1.0 if np.isinf(prior) else prior / (prior + n)
    rm, rv = bn.running_mean.double().numpy(), bn.running_var.double().numpy()
    mean = w * rm + (1 - w) * a.mean(axis=axes)
    var = w * rv + (1 - w) * a.var(axis=axes)
    shape = (1, -1) + (1,) * (a.ndim - 2)
    z = (a - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + bn.eps)
    return z * bn.weight.detach().double().numpy().reshape(shape) + bn.bias.detach().double().numpy().reshape(shape)


def _state(m: nn.Module) -> dict:
    return {k: v.clone() for k, v in m.state_dict().items()}


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from([1, 2, 3]), c=st.integers(1, 5), n=st.integers(1, 9), side=st.integers(1, 4),
       prior=st.one_of(st.just(0.0), st.floats(0.25, 512.0), st.just(float("inf"))), seed=st.integers(0, 10_000))
def test_the_output_is_the_prior_weighted_mix_computed_by_hand(kind, c, n, side, prior, seed):
    bn = _bn(kind, c, seed)
    g = torch.Generator().manual_seed(seed + 1)
    shape = (n, c) if kind == 1 and side == 1 else (n, c) + (side,) * kind
    x = torch.randn(shape, generator=g) * 2 + 0.5
    if prior == 0 and n == 1:
        with pytest.raises(ValueError, match="prior=0"), adapt_bn_statistics(bn, prior=prior):
            bn(x)
        return
    if prior == 0 and np.prod(shape) // c == 1:
        return  # one value per channel and no prior: variance 0, nothing to compare
    before = _state(bn)
    with adapt_bn_statistics(bn, prior=prior) as h:
        y = bn(x)
    np.testing.assert_allclose(y.double().detach().numpy(), _by_hand(bn, x, prior), rtol=1e-4, atol=1e-4)
    assert h.calls == {"": 1}
    assert _same_state(before, _state(bn))  # the buffers are never written
    assert not adapt._ACTIVE


def test_prior_zero_is_a_train_mode_forward_without_its_side_effect_and_inf_is_eval_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5),
                          nn.BatchNorm1d(5))
    for x in (torch.randn(32, 3, 6, 6), torch.randn(32, 3, 6, 6)):
        model.train()(x)  # non-trivial stored statistics
    model.eval()
    x = torch.randn(16, 3, 6, 6) * 1.5 + 0.3
    before = _state(model)
    train_copy = copy.deepcopy(model).train()
    with adapt_bn_statistics(model, prior=0) as h:
        y0 = model(x)
    torch.testing.assert_close(y0, train_copy(x), rtol=1e-5, atol=1e-5)
    assert not _same_state(before, _state(train_copy))  # train mode rewrote the copy's statistics ...
    assert _same_state(before, _state(model))  # ... the adapted model's are untouched
    assert h.layers == ("1", "5") and h.calls == {"1": 1, "5": 1}
    with adapt_bn_statistics(model, prior=float("inf")):
        yinf = model(x)
    assert torch.equal(yinf, model(x))  # the stored statistics: torch's eval kernel, bit for bit


def test_a_single_sample_is_refused_without_a_prior_and_mixed_with_one():
    bn = _bn(2, 3)
    x = torch.randn(1, 3, 4, 4)
    with pytest.raises(ValueError, match=r"adapt_bn_statistics: prior=0 .* one sample"):
        with adapt_bn_statistics(bn, prior=0):
            bn(x)
    assert not adapt._ACTIVE  # restored after the error
    with adapt_bn_statistics(bn, prior=16) as h:
        y = bn(x)
    assert h.weight(1) == pytest.approx(16 / 17)
    np.testing.assert_allclose(y.detach().double().numpy(), _by_hand(bn, x, 16.0), rtol=1e-5, atol=1e-5)


def test_nothing_changes_when_the_block_raises_and_flags_stay_as_they_were():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).eval()
    before = _state(model)
    with pytest.raises(KeyError):
        with adapt_bn_statistics(model):
            model(torch.randn(8, 4))
            raise KeyError("user error")
    assert not adapt._ACTIVE and not model[1].training
    assert _same_state(before, _state(model))


@pytest.mark.parametrize("prior, err, match", [(-1, ValueError, "prior must be a number of samples >= 0"),
                                                 (float("nan"), ValueError, "prior must be"),
                                                 ("16", TypeError, "prior must be"), (True, TypeError, "prior must be")])
def test_a_bad_prior_is_refused_naming_it(prior, err, match):
    bn = _bn(1, 2)
    with pytest.raises(err, match="adapt_bn_statistics: " + match):
        with adapt_bn_statistics(bn, prior=prior):
            pass
    assert not adapt._ACTIVE


def test_refusals_before_anything_changes():
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        with adapt_bn_statistics("model"):
            pass
    with pytest.raises(ValueError, match="no BatchNorm layer"):
        with adapt_bn_statistics(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))):
            pass
    with pytest.raises(ValueError, match="FrozenBatchNorm layers"):
        with adapt_bn_statistics(nn.Sequential(FrozenBatchNorm(3))):
            pass
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 3), nn.BatchNorm1d(3)).eval()
    model[3].train()
    with pytest.raises(ValueError, match=r"train mode \(\['3'\]\).*model.eval\(\)"):
        with adapt_bn_statistics(model):
            pass
    assert not adapt._ACTIVE
    with pytest.raises(ValueError, match="modules='0' is not|modules=\\['0'\\] hold no BatchNorm"):
        with adapt_bn_statistics(model, modules="0"):
            pass


def test_train_mode_inside_the_block_and_nested_blocks_are_refused():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).eval()
    with adapt_bn_statistics(model):
        with pytest.raises(ValueError, match="already adapted by an enclosing"):
            with adapt_bn_statistics(model):
                pass
        model.train()
        with pytest.raises(RuntimeError, match="switched to train mode"):
            model(torch.randn(4, 4))
        model.eval()
    assert not adapt._ACTIVE


def test_modules_restricts_the_adapted_layers():
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), nn.Linear(3, 3), nn.BatchNorm1d(3)).eval()
    x = torch.randn(8, 4) * 3
    with adapt_bn_statistics(model, prior=0, modules="0") as h:
        y = model(x)
    assert h.layers == ("0.1",)
    with adapt_bn_statistics(model, prior=0, modules=[model[0]]):
        assert torch.equal(model(x), y)
    # the head's layer kept its stored statistics: the same as adapting nothing past the first block
    hidden = model[1](model[0][1].train()(model[0][0](x)))
    model.eval()
    torch.testing.assert_close(y, model[2](hidden), rtol=1e-5, atol=1e-5)


def test_the_affine_parameters_train_inside_the_block_as_in_tent():
    bn = _bn(2, 3)
    bn.weight.grad = None
    with adapt_bn_statistics(bn, prior=0):
        out = bn(torch.randn(8, 3, 4, 4))
        loss = -(out.softmax(1) * out.log_softmax(1)).sum(1).mean()  # entropy, TENT's objective
        loss.backward()
    assert bn.weight.grad is not None and bool(bn.weight.grad.abs().sum() > 0)


def test_compiled_models_are_refused_and_copies_made_inside_the_block_are_plain_eval_mode():
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).eval()
    with pytest.raises(TypeError, match="model is compiled"):
        with adapt_bn_statistics(torch.compile(model)):
            pass
    x = torch.randn(8, 4) * 3
    eval_out = model(x)
    with adapt_bn_statistics(model, prior=0):
        inside = copy.deepcopy(model)
        pickled = pickle.loads(pickle.dumps(model))
        assert torch.equal(inside(x), eval_out) and not torch.equal(model(x), eval_out)
        assert torch.equal(pickled(x), eval_out)
    assert torch.equal(inside(x), eval_out) and torch.equal(model(x), eval_out)


def test_the_front_door_exports_it():
    assert "adapt_bn_statistics" in bnstudy.__all__ and bnstudy.adapt_bn_statistics is adapt_bn_statistics


def test_a_shared_layer_is_selected_through_either_owner_and_disjoint_blocks_do_not_add_up():
    bn = nn.BatchNorm2d(3)

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(3, 3, 1), bn)
            self.b = nn.Sequential(nn.Conv2d(3, 3, 1), bn)

        def forward(self, x):
            return self.b(self.a(x))

    m = Shared().eval()
    x = torch.randn(4, 3, 5, 5)
    with adapt_bn_statistics(m, prior=4, modules="b") as h:
        m(x)
    assert h.layers == ("a.1",) and h.calls == {"a.1": 2}
    other = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).eval()
    with adapt_bn_statistics(m, prior=4) as h1, adapt_bn_statistics(other, prior=0) as h2:
        m(x)
        y = other(torch.randn(8, 4))
    assert h1.calls == {"a.1": 2} and h2.calls == {"1": 1} and y.shape == (8, 3)


def test_prior_zero_ignores_stored_statistics_even_when_they_are_not_finite():
    bn = _bn(2, 3)
    with torch.no_grad():
        bn.running_var[0] = float("inf")
        bn.running_mean[1] = float("nan")
    x = torch.randn(8, 3, 4, 4)
    with adapt_bn_statistics(bn, prior=0):
        y = bn(x)
    torch.testing.assert_close(y, copy.deepcopy(bn).train()(x), rtol=1e-5, atol=1e-5)


def test_huge_and_negative_zero_priors_are_numbers_of_samples():
    bn = _bn(1, 2)
    with adapt_bn_statistics(bn, prior=10 ** 400) as h:
        assert h.prior == float("inf")
    with adapt_bn_statistics(bn, prior=-0.0) as h:
        assert h.prior == 0.0 and str(h.prior) == "0.0"
    with pytest.raises(ValueError, match="prior must be"):
        with adapt_bn_statistics(bn, prior=-10 ** 400):
            pass


def test_wrong_inputs_get_torchs_own_eval_errors_whatever_the_prior():
    bn = nn.BatchNorm2d(3).eval()
    for prior in (0, 16, float("inf")):
        with adapt_bn_statistics(bn, prior=prior):
            with pytest.raises((RuntimeError, ValueError)):
                bn(torch.randn(4, 1, 5, 5))
            with pytest.raises((RuntimeError, ValueError)):
                bn(torch.randn(4, 3, 5))


@pytest.mark.parametrize("call", [lambda m: bnstudy.freeze_batchnorm(m), lambda m: bnstudy.freeze_modules(m, ["1"]),
                                  lambda m: bnstudy.replace_norm(m, "group", num_groups=1),
                                  lambda m: bnstudy.update_bn_stats(m, [torch.randn(8, 4)]),
                                  lambda m: bnstudy.precise_bn_statistics(m, [torch.randn(8, 4)])])
def test_conversions_and_estimates_inside_the_block_are_refused_naming_it(call):
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).eval()
    before = _state(model)
    with adapt_bn_statistics(model):
        with pytest.raises(ValueError, match=r"^\w+: (model|module) has BatchNorm layers inside an open "
                                             r"bnstudy.adapt_bn_statistics block \(\['1'\]\)"):
            call(model)
    assert _same_state(before, _state(model)) and isinstance(model[1], nn.BatchNorm1d)
    call(model)  # after the block it runs


def test_a_layer_called_with_its_input_as_a_keyword_is_refused_clearly_and_the_block_restores():
    """A fresh user's fault: ``bn(input=x)`` inside the block raised IndexError; torch's global hooks see positional
    arguments only, so the block refuses the call by name, and leaves the model as it was."""
    import bnstudy
    bn = torch.nn.BatchNorm1d(4).eval()
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    with pytest.raises(TypeError, match="keyword argument"):
        with bnstudy.adapt_bn_statistics(bn, prior=3):
            bn(input=torch.randn(6, 4))
    assert all(torch.equal(v, bn.state_dict()[k]) for k, v in before.items())
    assert torch.equal(bn(torch.ones(2, 4)), torch.nn.functional.batch_norm(
        torch.ones(2, 4), bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps))
