"""Every refusal of a front-door function starts with that function's name, as update_bn_stats' and pin_eval's do,
also when it comes from deep inside: a conversion helper (a layer with hooks: "cannot turn ..."), FrozenBatchNorm's
own checks, or an inner public function (statistics_mismatch -> bn_input_statistics, precise_bn_statistics ->
update_bn_stats). test_public_arguments scans the wrong-argument refusals of every public callable; this file scans
the refusals that depend on the model or the data, and a property test draws defective layers for each conversion
and compares its verdict with what torch computes."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn
from torch.nn import functional as F

import bnstudy
from bnstudy import audit, freeze
from bnstudy import running_stats as stats
from bnstudy.freeze import FrozenBatchNorm, UnfrozenBatchNorm2d

X = torch.randn(8, 4)


def _model(bn=None):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), bn if bn is not None else nn.BatchNorm1d(4), nn.Linear(4, 2)).eval()


def _hooked():
    bn = nn.BatchNorm1d(4)
    bn.register_forward_hook(lambda m, i, o: o * 2)
    return bn


def _no_bias():
    bn = nn.BatchNorm1d(4)
    bn.register_parameter("bias", None)
    return bn


class _Act(nn.BatchNorm1d):  # timm's BatchNormAct in its shape: an activation inside the norm layer
    def forward(self, x):
        return torch.relu(super().forward(x))


class FrozenBatchNorm2d(nn.Module):  # another library's frozen layer, with buffers of different lengths
    def __init__(self):
        super().__init__()
        self.eps = 1e-5
        for k, n in (("weight", 3), ("bias", 3), ("running_mean", 3), ("running_var", 4)):
            self.register_buffer(k, torch.ones(n))


class _Unbuildable(nn.BatchNorm1d):  # a source class whose constructor takes other arguments
    def __init__(self, c, flavour):
        super().__init__(c)


def _unbuildable_frozen():
    return FrozenBatchNorm.from_batchnorm(_Unbuildable(4, "x").eval())


def _frozen_model():
    return nn.Sequential(nn.Linear(4, 4), _unbuildable_frozen())


def _state(model):
    return ([(id(m), type(m)) for m in model.modules()],
            {k: "lazy" if nn.parameter.is_lazy(v) else v.clone() for k, v in model.state_dict().items()},
            {n: p.requires_grad for n, p in model.named_parameters()}, [m.training for m in model.modules()])


def _same(a, b):
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(
        a[1][k] == b[1][k] if isinstance(a[1][k], str) or isinstance(b[1][k], str) else torch.equal(a[1][k], b[1][k])
        for k in a[1]) and a[2:] == b[2:]


#: (function the user calls, a call it refuses because of the model or the data: model -> None, the model).
REFUSALS = [
    ("freeze_modules", lambda m: freeze.freeze_modules(m, ["1"]), lambda: _model(_hooked())),
    ("freeze_modules", lambda m: freeze.freeze_modules(m, ["1"]), lambda: _model(_no_bias())),
    ("freeze_modules", lambda m: freeze.freeze_modules(m, ["1"]), lambda: _model(nn.BatchNorm1d(4, track_running_stats=False))),
    ("freeze_modules", lambda m: freeze.freeze_modules(m, whole_model=True), lambda: _model(nn.LazyBatchNorm1d())),
    ("freeze_modules", lambda m: freeze.freeze_modules(m, ["1"]), lambda: _model(_Act(4))),
    ("freeze_batchnorm", freeze.freeze_batchnorm, lambda: _model(_hooked())),
    ("freeze_batchnorm", freeze.freeze_batchnorm, lambda: _model(_no_bias())),
    ("convert_sync_batchnorm", freeze.convert_sync_batchnorm, lambda: _model(_hooked())),
    ("convert_sync_batchnorm", freeze.convert_sync_batchnorm, lambda: _model(_Act(4))),
    ("unfreeze_modules", lambda m: freeze.unfreeze_modules(m, ["1"]), _frozen_model),
    ("unfreeze_modules", lambda m: freeze.unfreeze_modules(m, ["1"]),
     lambda: nn.Sequential(nn.Linear(4, 3), FrozenBatchNorm2d())),
    ("unfreeze_batchnorm", freeze.unfreeze_batchnorm, _frozen_model),
    ("FrozenBatchNorm.from_batchnorm", lambda m: FrozenBatchNorm.from_batchnorm(m[1], "1"), lambda: _model(_hooked())),
    ("FrozenBatchNorm.from_batchnorm", lambda m: FrozenBatchNorm.from_batchnorm(m[1], "1"),
     lambda: _model(nn.InstanceNorm1d(4, track_running_stats=True))),
    ("FrozenBatchNorm.from_batchnorm", lambda m: FrozenBatchNorm.from_batchnorm(m[1], "1"),
     lambda: _model(nn.LazyBatchNorm1d())),
    ("FrozenBatchNorm.to_batchnorm", lambda m: m[1].to_batchnorm(), _frozen_model),
    ("UnfrozenBatchNorm2d.from_frozen", lambda m: UnfrozenBatchNorm2d.from_frozen(m[1], "1"),
     lambda: nn.Sequential(nn.Linear(4, 3), FrozenBatchNorm2d())),
    ("replace_norm", lambda m: bnstudy.replace_norm(m, "group", 2), lambda: _model(_hooked())),
    ("replace_norm", lambda m: bnstudy.replace_norm(m, "group", 2), lambda: _model(_no_bias())),
    ("replace_norm", lambda m: bnstudy.replace_norm(m, "group", 3), _model),
    ("replace_norm", lambda m: bnstudy.replace_norm(m, "group"), _model),  # GroupNorm(4, 4) on (N, C): degenerate
    ("replace_norm", lambda m: bnstudy.replace_norm(m, "group", 2), lambda: _model(nn.LazyBatchNorm1d())),
    ("statistics_mismatch", lambda m: bnstudy.statistics_mismatch(m, []), _model),
    ("statistics_mismatch", lambda m: bnstudy.statistics_mismatch(m, [X]), lambda: _model(nn.Identity())),
    ("statistics_mismatch", lambda m: bnstudy.statistics_mismatch(m, [X], network_mode="test"), _model),
    ("statistics_mismatch", lambda m: bnstudy.statistics_mismatch(m, [X], measure="l2"), _model),
    ("statistics_mismatch", lambda m: bnstudy.statistics_mismatch(m, [X[:1]], network_mode="train"), _model),
    ("statistics_mismatch", lambda m: bnstudy.statistics_mismatch(m, [X], input_fn=lambda b: b, forward=lambda m, b: m(b)),
     _model),
    ("mismatch_from_statistics", lambda m: stats.mismatch_from_statistics(m, {"0": (torch.zeros(4), torch.ones(4))}),
     _model),
    ("mismatch_from_statistics", lambda m: stats.mismatch_from_statistics(m, {"1": (torch.zeros(3), torch.ones(3))}),
     _model),
    ("precise_bn_statistics", lambda m: bnstudy.precise_bn_statistics(m, []), _model),
    ("precise_bn_statistics", lambda m: bnstudy.precise_bn_statistics(m, [X], num_iters=3), _model),
    ("precise_bn_statistics", lambda m: bnstudy.precise_bn_statistics(m, [X[:1]]), _model),
    ("precise_bn_statistics", lambda m: bnstudy.precise_bn_statistics(m, [X * float("inf")]), _model),
    ("update_bn_stats", lambda m: bnstudy.update_bn_stats(m, []), _model),
    ("compare_statistics", lambda m: bnstudy.compare_statistics(m, []), _model),
    ("lint_loader", lambda m: bnstudy.lint_loader(100, 8, scan_labels=True), _model),
    ("lint_loader", lambda m: bnstudy.lint_loader(torch.utils.data.DataLoader(torch.randn(10, 4), batch_size=4),
                                                  scan_labels=True), _model),
    ("lint_loader", lambda m: bnstudy.lint_loader(100, 8, labels_per_batch=[[]]), _model),
    ("lint_loader", lambda m: bnstudy.lint_loader(100, 8, labels_per_batch=[[0, -1]]), _model),
    ("batch_label_dependence", lambda m: audit.batch_label_dependence([[0, 1], [-1, 0]]), _model),
    ("batch_label_dependence", lambda m: audit.batch_label_dependence([[0.5, 1.0]]), _model),
    ("diff", lambda m: audit.diff(audit.snapshot(m), m.state_dict()), _model),
]


@pytest.mark.parametrize("fn,call,make", REFUSALS, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSALS)])
def test_a_refusal_that_depends_on_the_model_or_data_names_the_function_called_and_changes_nothing(fn, call, make):
    model = make()
    before = _state(model)
    with pytest.raises((TypeError, ValueError)) as err:
        call(model)
    assert str(err.value).startswith(f"{fn}: "), f"{fn}: {type(err.value).__name__}: {err.value}"
    assert str(err.value).count(": ") < 40  # not prefixed twice over
    assert not str(err.value).startswith(f"{fn}: {fn}: ")
    assert _same(before, _state(model)), "a refusal changed the model"


def test_the_reported_refusals_now_name_their_function():
    """The reported messages: replace_norm and freeze_modules on a hooked layer said "cannot turn ...",
    statistics_mismatch on an empty list said "bn_input_statistics: batches is empty"."""
    with pytest.raises(ValueError, match=r"^replace_norm: cannot turn BatchNorm1d '1' into a GroupNorm: it has 1 "
                                         r"forward hook registered"):
        bnstudy.replace_norm(_model(_hooked()), "group", 2)
    with pytest.raises(ValueError, match=r"^freeze_modules: cannot turn BatchNorm1d '1' into a FrozenBatchNorm"):
        bnstudy.freeze_modules(_model(_hooked()), ["1"])
    with pytest.raises(ValueError, match=r"^freeze_modules: BatchNorm '1' has no running_mean/running_var"):
        bnstudy.freeze_modules(_model(nn.BatchNorm1d(4, track_running_stats=False)), ["1"])
    with pytest.raises(ValueError, match=r"^statistics_mismatch: batches is empty$"):
        bnstudy.statistics_mismatch(_model(), [])
    with pytest.raises(ValueError, match=r"^statistics_mismatch: measure='l2' is not allowed; choose one of "):
        bnstudy.statistics_mismatch(_model(), [X], measure="l2")


# --- property: each conversion, on a drawn defect, refuses exactly what torch would compute otherwise ----------------

DEFECTS = ("none", "hook", "hook_identity", "no_bias", "no_stats", "lazy", "act")
CALLS = {
    "freeze_batchnorm": freeze.freeze_batchnorm,
    "freeze_modules": lambda m: freeze.freeze_modules(m, ["1"]),
    "replace_norm": lambda m: bnstudy.replace_norm(m, "group", 2),
}


def _layer(defect, gen):
    bn = _Act(4) if defect == "act" else nn.LazyBatchNorm1d() if defect == "lazy" else nn.BatchNorm1d(
        4, track_running_stats=defect != "no_stats")
    if defect != "lazy":
        with torch.no_grad():
            bn.weight.copy_(torch.randn(4, generator=gen))
            bn.bias.copy_(torch.randn(4, generator=gen))
            if bn.running_mean is not None:
                bn.running_mean.copy_(torch.randn(4, generator=gen))
                bn.running_var.copy_(torch.rand(4, generator=gen) + 0.5)
    if defect == "hook":
        bn.register_forward_hook(lambda m, i, o: o * 2)
    if defect == "hook_identity":  # a hook that records and changes nothing: still not run by the new layer
        bn.register_forward_pre_hook(lambda m, i: None)
    if defect == "no_bias":
        bn.register_parameter("bias", None)
    return bn


@settings(max_examples=80, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(defect=st.sampled_from(DEFECTS), conversion=st.sampled_from(sorted(CALLS)), seed=st.integers(0, 2 ** 16))
def test_each_conversion_refuses_a_defective_layer_naming_itself_or_computes_what_torch_computes(defect, conversion,
                                                                                                 seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 4), _layer(defect, gen), nn.Linear(4, 2)).eval()
    x = torch.randn(6, 4, generator=gen) * 3
    layer = model[1]
    with torch.no_grad():  # torch's own verdict: what the layer computes in the model, against the plain kernel
        h = model[0](x)
        stored = layer.running_mean is not None and not nn.parameter.is_lazy(layer.running_mean)
        def kernel(v):
            return F.batch_norm(v, layer.running_mean, layer.running_var, layer.weight, layer.bias, False, 0.0,
                                layer.eps)
        plain = kernel(h) if stored else None
        # on what reaches it and on the same values mirrored (an activation inside the layer drops one side)
        computes_plain = stored and all(torch.equal(layer(v), kernel(v)) for v in (h, -h)) \
            and not layer._forward_hooks and not layer._forward_pre_hooks
    before = _state(model)
    freezes = conversion != "replace_norm"
    # the library's policy, in torch's terms: a freeze needs stored statistics that the layer computes with and
    # nothing else (hooks run, an activation, no bias: FrozenBatchNorm always has one); replace_norm needs the
    # layer to be torch's BatchNorm (no hooks, no forward of its own), initialised, with a bias
    bias = layer.affine and getattr(layer, "bias", None) is not None
    convertible = bias and (computes_plain if freezes else (defect in ("none", "no_stats")))
    try:
        out = CALLS[conversion](model)
    except ValueError as e:
        assert not convertible, f"refused a layer it can convert: {e}"
        name = conversion
        assert str(e).startswith(f"{name}: ") and not str(e).startswith(f"{name}: {name}"), str(e)
        assert _same(before, _state(model)), "a refusal changed the model"
        return
    assert convertible, f"{conversion} converted a {defect} layer"
    out.eval()
    with torch.no_grad():
        if freezes:
            assert torch.equal(out[1](h), plain)  # the frozen layer computes torch's eval kernel, bit for bit
        else:
            assert torch.equal(out[1](h), F.group_norm(h, 2, layer.weight, layer.bias, layer.eps))
