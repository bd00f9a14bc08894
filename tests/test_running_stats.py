"""update_bn_stats / precise_bn_statistics: fvcore's tests for its precise BN, ported, plus the contract."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import bnstudy
import bnstudy.running_stats
from bnstudy.freeze import pin_eval
from bnstudy.running_stats import precise_bn_statistics, update_bn_stats


# Tolerance of the exact-statistics checks: the estimate is pooled in float64 and written into a float32 buffer,
# so it may differ from the float64 statistics of the concatenated data by float32 rounding (2**-24 relative)
# plus float64 accumulation error: rtol = atol = 1e-6 is about 16 float32 ulps.
EXACT = dict(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bn,dims,shape", [(nn.BatchNorm1d, [0], (16, 8)),
                                           (nn.BatchNorm1d, [0, 2], (16, 8, 24)),
                                           (nn.BatchNorm2d, [0, 2, 3], (16, 8, 24, 8)),
                                           (nn.BatchNorm3d, [0, 2, 3, 4], (16, 8, 4, 12, 6))])
def test_update_bn_stats_equals_the_exact_statistics_of_the_concatenated_unequal_batches(bn, dims, shape):
    torch.manual_seed(42)
    model = bn(shape[1]).train()
    sizes = [shape[0], 3, shape[0] * 2, 2, 1 if len(shape) > 2 else 2]  # unequal; a last batch of one sample
    tensors = [torch.randn((n,) + shape[1:]) * (1 + i) + 3 * i for i, n in enumerate(sizes)]
    data = torch.cat(tensors).double()
    old_weight = model.weight.detach().clone()
    calls = update_bn_stats(model, tensors)
    assert torch.allclose(model.running_mean.double(), data.mean(dim=dims), **EXACT)
    assert torch.allclose(model.running_var.double(), data.var(dim=dims, unbiased=True), **EXACT)
    assert torch.equal(model.weight, old_weight)
    assert model.training and model.momentum == 0.1 and int(model.num_batches_tracked) == len(sizes)
    assert calls == {"": len(sizes)}


def test_update_bn_stats_weights_a_small_last_batch_by_its_rows_not_as_a_whole_batch():
    # The new-user trial's instance: batches of 900 and 10 rows. Equal weight per batch (fvcore) gave a mean
    # of 4.82 on channel 0 against the true 4.97; weighting by values per channel gives the true statistics.
    torch.manual_seed(0)
    data = torch.randn(1000, 4) * torch.tensor([1., 2., 3., 4.]) + torch.tensor([5., -1., 0., 2.])
    bn = nn.BatchNorm1d(4)
    update_bn_stats(bn, [data[:900], data[900:910]])
    exact = data[:910].double()
    assert torch.allclose(bn.running_mean.double(), exact.mean(0), **EXACT)
    assert torch.allclose(bn.running_var.double(), exact.var(0), **EXACT)
    assert round(float(bn.running_mean[0]), 2) == round(float(exact[:, 0].mean()), 2)
    equal_weight = (data[:900].mean(0) + data[900:910].mean(0)) / 2  # what the old estimator wrote
    assert abs(float(equal_weight[0] - exact[:, 0].mean())) > 0.05


def test_update_bn_stats_of_a_deeper_layer_is_the_exact_statistics_of_what_it_receives_in_train_mode():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2), nn.BatchNorm1d(2))
    xs = [torch.randn(n, 3) + 1 for n in (50, 7, 2)]
    seen = []
    h = model[4].register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().double()))
    update_bn_stats(model, xs)
    h.remove()
    data = torch.cat(seen)  # each batch normalised by its own statistics in layer 1, as precise BN runs it
    assert torch.allclose(model[4].running_mean.double(), data.mean(0), **EXACT)
    assert torch.allclose(model[4].running_var.double(), data.var(0), **EXACT)


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
    with pytest.warns(UserWarning, match=r"re-estimated 1 BatchNorm layer pinned in eval mode by pin_eval \(1\)"):
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


def test_update_bn_stats_modules_restricts_the_estimate_and_the_rest_normalises_with_stored_statistics():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 4), nn.BatchNorm1d(4))
    pin_eval(model[1])
    model[1].running_mean.fill_(0.5)
    before = model[1].running_mean.clone()
    xs = [torch.randn(8, 3) for _ in range(3)]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit choice of layers does not warn about the pinned one
        calls = update_bn_stats(model, xs, modules=["3"])
    assert calls == {"3": 3} and torch.equal(model[1].running_mean, before)
    with torch.no_grad():
        feats = torch.cat([model[2](model[1].eval()(model[0](x))) for x in xs]).double()
    assert torch.allclose(model[3].running_mean.double(), feats.mean(0), **EXACT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert update_bn_stats(model, xs, modules=model) == {"1": 3, "3": 3}  # the whole model, by choice
    with pytest.raises(ValueError, match="modules is empty"):
        update_bn_stats(model, xs, modules=[])
    with pytest.raises(ValueError, match="modules=\\['0'\\] hold no BatchNorm layer"):
        update_bn_stats(model, xs, modules="0")


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(2, 40), min_size=1, max_size=6), shift=st.floats(-1e3, 1e3),
       scale=st.floats(1e-2, 1e2), seed=st.integers(0, 2**16))
def test_update_bn_stats_is_exact_for_any_split_of_the_data_into_batches(sizes, shift, scale, seed):
    # However the rows are split, the estimate is the statistics of all rows (mean; unbiased variance).
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(sum(sizes), 3, generator=g) * scale + shift
    bn = nn.BatchNorm1d(3)
    update_bn_stats(bn, list(data.split(sizes)))
    exact = data.double()
    tol = 1e-6 * (abs(shift) + scale)  # float32 rounding of the inputs and of the written value, relative to |x|
    assert torch.allclose(bn.running_mean.double(), exact.mean(0), rtol=1e-6, atol=tol)
    assert torch.allclose(bn.running_var.double(), exact.var(0), rtol=1e-5, atol=tol * scale)


def test_stats_near_init_is_silent_after_precise_bn_and_returns_after_a_reset():
    """Found in issue 24's read: after update_bn_stats, num_batches_tracked counts the estimate's batches (an
    equal-weight average, no share of the reset values), and lint_model's stats_near_init took it for a few EMA
    updates since a reset. The mark survives deepcopy and FrozenBatchNorm conversion; a reset drops it."""
    import copy
    import bnstudy
    from bnstudy.norms import PRECISE_MARK
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    batches = [torch.randn(16, 3, 8, 8) + 2 for _ in range(10)]
    bnstudy.update_bn_stats(model, batches)
    bnstudy.pin_eval(model)

    def codes(m):
        return [lint.code for lint in bnstudy.lint_model(m, warn=False)]

    assert int(model[1].num_batches_tracked) == 10 and "stats_near_init" not in codes(model)
    assert "stats_near_init" not in codes(copy.deepcopy(model))
    assert "stats_near_init" not in codes(bnstudy.freeze_batchnorm(copy.deepcopy(model)))
    unmarked = copy.deepcopy(model)
    delattr(unmarked[1], PRECISE_MARK)  # what the lint said before: 0.9**10 = 35% from the reset
    assert "stats_near_init" in codes(unmarked)
    bnstudy.unpin(model)
    model[1].reset_running_stats()
    model.train()
    model(batches[0])
    model(batches[1])
    bnstudy.pin_eval(model)
    assert "stats_near_init" in codes(model) and not hasattr(model[1], PRECISE_MARK)


def _meta_model():
    with torch.device("meta"):
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))


@pytest.mark.parametrize("call", [
    lambda m, b: bnstudy.update_bn_stats(m, b),
    lambda m, b: bnstudy.precise_bn_statistics(m, b),
    lambda m, b: bnstudy.running_stats.bn_input_statistics(m, b),
    lambda m, b: bnstudy.statistics_mismatch(m, b),
    lambda m, b: bnstudy.running_stats.mismatch_from_statistics(m, {}),
    lambda m, b: bnstudy.compare_statistics(m, b),
    lambda m, b: bnstudy.adapt_bn_statistics(m.eval()).__enter__(),
], ids=["update_bn_stats", "precise_bn_statistics", "bn_input_statistics", "statistics_mismatch",
        "mismatch_from_statistics", "compare_statistics", "adapt_bn_statistics"])
def test_every_estimator_refuses_a_model_on_the_meta_device_before_running_it(call):
    """New-user report (stop 53): a meta-device model reached torch (``Tensor.item() cannot be called on meta
    tensors``) or was accepted (adapt_bn_statistics). The kind: every running-statistics call that reads a user
    model's values; each refuses it as lint_model and FreezeAudit do, naming the parameter and the fix."""
    m = _meta_model()
    with pytest.raises(ValueError, match=r"model must hold its values.*'meta' device.*to_empty"):
        call(m, [torch.randn(2, 3, 8, 8)])
    assert m[1].running_mean.device.type == "meta"  # nothing was changed


def _two_input_model():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.bn = nn.Linear(3, 4), nn.BatchNorm1d(4)

        def forward(self, ids, mask):
            return self.bn(self.lin(ids * mask))
    return Two()


@pytest.mark.parametrize("fn", ["update_bn_stats", "precise_bn_statistics", "bn_input_statistics",
                                "statistics_mismatch", "compare_statistics"])
def test_a_forward_that_fails_says_which_function_and_batch_and_how_the_batch_was_read(fn):
    """New-user report (stop 54): ``update_bn_stats`` on a model with ``forward(ids, mask)`` and batches
    ``[(ids, mask)]`` raised torch's bare ``TypeError: forward() missing 1 required positional argument``, and a
    double model on float batches a bare ``RuntimeError``. The kind: the model's own forward failing inside any
    estimator. The error keeps its type and torch's words (chained), and adds the function, the batch, how the input
    was read and the way out (``forward=``); the model's statistics and mode are left as they were."""
    import bnstudy.running_stats as rs
    run = getattr(rs, fn)
    m = _two_input_model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    batches = [(torch.randn(8, 3), torch.ones(8, 3))]
    how = "other was read as data \\(batches\\): " if fn == "compare_statistics" else ""
    with pytest.raises(TypeError, match=rf"^{fn}: {how}the model's forward failed at model\(x\) on batch 0, "
                                        r"x = a tensor of shape \(8, 3\) .*forward=lambda model, batch"
                                        r".*missing 1 required") as e:
        run(m, batches)
    assert isinstance(e.value.__cause__, TypeError) and m.training and m.bn.momentum == 0.1
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    run(m, batches, forward=lambda model, b: model(*b))  # the way out the message names
    double = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    with pytest.raises(RuntimeError, match=rf"^{fn}: {how}the model's forward failed at model\(x\) on batch 0.*dtype"):
        run(double, [torch.randn(8, 3)])


@pytest.mark.parametrize("fn", ["update_bn_stats", "precise_bn_statistics", "bn_input_statistics",
                                "statistics_mismatch", "mismatch_from_statistics", "compare_statistics",
                                "adapt_bn_statistics"])
def test_an_uninitialised_lazy_module_is_refused_before_anything_runs(fn):
    """New-user report (stop 54): an uninitialised ``LazyBatchNorm2d`` gave torch's "Attempted to use an
    uninitialized parameter" from ``update_bn_stats``. The kind: every estimator that checks its model is
    materialised (meta tensors) now also refuses lazy tensors, naming them."""
    import bnstudy
    import bnstudy.running_stats as rs
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d())
    batches = [torch.randn(4, 3, 8, 8)]
    args = {"mismatch_from_statistics": ({},), "compare_statistics": (batches,)}.get(fn, (batches,))
    call = (lambda: bnstudy.adapt_bn_statistics(m).__enter__()) if fn == "adapt_bn_statistics" else \
        (lambda: getattr(rs, fn)(m, *args))
    with pytest.raises(ValueError, match=r"model has lazy modules still uninitialised \('1\.weight', '1\.bias', "
                                         r"'1\.running_mean' and 1 more\); run one forward pass"):
        call()
