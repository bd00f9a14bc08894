"""Conversions never change what a layer computes silently (issue 36, cases 1 and 2, and their kinds).

Every conversion (freeze_batchnorm, freeze_modules, convert_sync_batchnorm, unfreeze_batchnorm, replace_norm)
either keeps each converted layer's eval output bit for bit or refuses with a ValueError before changing anything.
The property test draws norm layers (torch's, subclasses with a forward of their own, with extra buffers, another
library's ``_NormBase`` layer with ``eps=0`` or without ``eps``) and compares the library's verdict with what torch
computes: the layer's eval output against torch's BatchNorm kernel on its own fields.
"""

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import bnstudy
from bnstudy import freeze as fz

ACTS = {"none": nn.Identity, "relu": nn.ReLU, "leaky": lambda: nn.LeakyReLU(0.1), "silu": nn.SiLU,
        "hardtanh": nn.Hardtanh, "dropout": lambda: nn.Dropout(0.3)}
#: What a subclass's forward adds after normalising: an activation (timm's BatchNormAct2d), an extra buffer used
#: (a shift) or held unused, a scale, or nothing (a forward that only calls torch's).
EXTRAS = ("super", "relu", "leaky", "silu", "hardtanh", "dropout", "shift", "unused_buffer", "scale")


class _Extra:
    """A BatchNorm subclass whose forward does ``extra`` after torch's BatchNorm."""

    def __init__(self, c, extra="super", eps=1e-5, affine=True):
        super().__init__(c, eps=eps, affine=affine)
        self.extra = extra
        self.act = ACTS.get(extra, nn.Identity)()
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, c))

    def forward(self, x):
        y = super().forward(x)
        view = (1, -1) + (1,) * (x.dim() - 2)
        if self.extra == "shift":
            y = y + self.shift.view(view)
        elif self.extra == "scale":
            y = y * 2.0
        return self.act(y)


class Extra1d(_Extra, nn.BatchNorm1d):
    pass


class Extra2d(_Extra, nn.BatchNorm2d):
    pass


class BatchNormAct2d(nn.BatchNorm2d):
    """timm's ``BatchNormAct2d`` in its shape: the activation applied inside the norm layer's forward."""

    def __init__(self, c, act_layer=nn.ReLU, **kw):
        super().__init__(c, **kw)
        self.drop = nn.Identity()
        self.act = act_layer()

    def forward(self, x):
        return self.act(self.drop(super().forward(x)))


class ForeignNorm(nn.modules.batchnorm._NormBase):
    """Another library's norm layer: a ``_NormBase`` but not a ``_BatchNorm``, with a forward of its own; it may keep
    its epsilon under another name (no ``eps`` attribute)."""

    def __init__(self, c, eps=1e-5, affine=True, has_eps=True, extra="super"):
        super().__init__(c, eps=eps, affine=affine)
        self.epsilon, self.extra = float(eps), extra
        self.act = ACTS.get(extra, nn.Identity)()
        if not has_eps:
            del self.eps

    def _check_input_dim(self, x):
        if x.dim() != 4:
            raise ValueError(f"expected 4D input (got {x.dim()}D input)")

    def forward(self, x):
        self._check_input_dim(x)
        y = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training, 0.1,
                         self.epsilon)
        return self.act(y * 2.0 if self.extra == "scale" else y)


def _fill(layer, gen):
    c = layer.num_features
    with torch.no_grad():
        layer.running_mean.copy_(torch.randn(c, generator=gen) * 2)
        layer.running_var.copy_(torch.rand(c, generator=gen) * 3 + 0.1)
        if layer.affine:
            layer.weight.copy_(torch.randn(c, generator=gen))
            layer.bias.copy_(torch.randn(c, generator=gen))
    return layer.eval()


def _plain_eval(layer, x):
    """Torch's BatchNorm eval kernel on the layer's own fields: what every replacement computes."""
    return F.batch_norm(x, layer.running_mean, layer.running_var, layer.weight, layer.bias, False, 0.0,
                        layer.epsilon if isinstance(layer, ForeignNorm) else layer.eps)


def _snapshot(model):
    return ([(id(m), type(m)) for m in model.modules()], {k: v.clone() for k, v in model.state_dict().items()},
            {n: p.requires_grad for n, p in model.named_parameters()})


def _unchanged(model, snap):
    mods, state, grads = _snapshot(model)
    return (mods == snap[0] and state.keys() == snap[1].keys() and all(torch.equal(state[k], snap[1][k])
                                                                          for k in state) and grads == snap[2])


CONVERSIONS = {
    "freeze_batchnorm": fz.freeze_batchnorm,
    "freeze_modules": lambda m: fz.freeze_modules(m, whole_model=True),
    "freeze_modules_by_name": lambda m: fz.freeze_modules(m, [n for n, _ in m.named_children()]),
    "convert_sync_batchnorm": fz.convert_sync_batchnorm,
}


@st.composite
def layers(draw):
    kind = draw(st.sampled_from(["torch", "extra", "foreign"]))
    rank = draw(st.sampled_from([2, 4])) if kind != "foreign" else 4
    c = draw(st.sampled_from([1, 3, 4]))
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.0]))
    affine = draw(st.booleans())
    extra = draw(st.sampled_from(EXTRAS))
    if kind == "torch":
        layer = (nn.BatchNorm1d if rank == 2 else nn.BatchNorm2d)(c, eps=eps, affine=affine)
    elif kind == "extra":
        layer = (Extra1d if rank == 2 else Extra2d)(c, extra=extra, eps=eps, affine=affine)
    else:
        layer = ForeignNorm(c, eps=eps, affine=affine, has_eps=draw(st.booleans()), extra=extra)
    return layer, rank


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers(), st.sampled_from(sorted(CONVERSIONS)), st.integers(0, 2**16), st.floats(0.1, 30.0))
def test_every_conversion_keeps_the_eval_output_bit_for_bit_or_refuses_before_changing_anything(
        drawn, conversion, seed, scale):
    layer, rank = drawn
    gen = torch.Generator().manual_seed(seed)
    _fill(layer, gen)
    c = layer.num_features
    first = _fill((nn.BatchNorm1d if rank == 2 else nn.BatchNorm2d)(c), gen)  # a plain layer converted before it
    model = nn.Sequential(first, layer).eval()
    shape = (7, c) if rank == 2 else (3, c, 2, 3)
    xs = [torch.randn(shape, generator=gen) * scale + torch.randn(1, generator=gen) * 3 for _ in range(3)]
    # torch's verdict: does the layer compute torch's BatchNorm kernel on its fields? On random inputs, not the
    # library's probes: what reaches it in the model, and values up to 1000 of its standard deviations either side
    z = (torch.rand(shape, generator=gen) * 2 - 1) * 1000
    view = (1, -1) + (1,) * (rank - 2)
    wide = layer.running_mean.view(view) + (layer.running_var.view(view) + 1e-3).sqrt() * z
    with torch.no_grad():
        differs = any(not torch.equal(layer(v), _plain_eval(layer, v)) for v in [first(x) for x in xs] + [wide])
        before = [model(x) for x in xs]
    torch_converts = conversion != "convert_sync_batchnorm" or isinstance(layer, nn.modules.batchnorm._BatchNorm)
    no_fields = isinstance(layer, ForeignNorm) and not hasattr(layer, "eps")
    snap = _snapshot(model)
    try:
        out = CONVERSIONS[conversion](model)
    except ValueError as e:
        assert torch_converts and (differs or no_fields), f"refused a layer it could convert exactly: {e}"
        assert _unchanged(model, snap), "a refusal changed the model"
        assert type(layer).__name__ in str(e) and "Nothing was changed" in str(e)
        called = "freeze_modules" if conversion.startswith("freeze_modules") else conversion
        assert str(e).startswith(f"{called}: "), f"the refusal does not name {called}: {e}"
        return
    assert not (torch_converts and (differs or no_fields)), "converted a layer whose eval output the replacement loses"
    out.eval()
    with torch.no_grad():
        for x, y in zip(xs, before):
            assert torch.equal(out(x), y)
    if torch_converts and conversion != "convert_sync_batchnorm":
        assert not any(isinstance(m, nn.modules.batchnorm._NormBase) for m in out.modules())


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["extra1d", "extra2d", "torch1d", "torch2d"]), st.sampled_from(EXTRAS),
       st.sampled_from([2, 3, 4, 6, 8]), st.sampled_from(["group", "layer"]), st.integers(0, 2**16))
def test_replace_norm_refuses_exactly_the_layers_it_would_change_silently_or_degenerate(kind, extra, c, norm, seed):
    gen = torch.Generator().manual_seed(seed)
    cls = {"extra1d": Extra1d, "extra2d": Extra2d, "torch1d": nn.BatchNorm1d, "torch2d": nn.BatchNorm2d}[kind]
    layer = _fill(cls(c, extra=extra) if kind.startswith("extra") else cls(c), gen)
    model = nn.Sequential(nn.Identity(), layer)
    flat = kind.endswith("1d")
    x = torch.randn((16, c) if flat else (4, c, 3, 3), generator=gen) * 5
    with torch.no_grad():
        differs = not torch.equal(layer(x), _plain_eval(layer, x))
    groups = 1 if norm == "layer" else torch.gcd(torch.tensor(8), torch.tensor(c)).item()
    degenerate = flat and c // groups == 1
    snap = _snapshot(model)
    try:
        out = bnstudy.replace_norm(model, norm)
    except ValueError as e:
        assert differs or degenerate, f"refused a layer it could replace: {e}"
        assert _unchanged(model, snap)
        assert str(e).startswith("replace_norm: "), f"the refusal does not name replace_norm: {e}"
        return
    assert not (differs or degenerate)
    gn = out[1]
    assert type(gn) is nn.GroupNorm and gn.num_groups == groups
    with torch.no_grad():
        y = out.train()(x)
    assert float(y.std()) > 0.1  # not the degenerate all-bias output


# --- case 1: a BatchNorm subclass that does more in forward (timm's BatchNormAct2d) ------------------------------

def _act_model(act_layer=nn.ReLU):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), BatchNormAct2d(4, act_layer=act_layer)).eval()
    with torch.no_grad():  # the act layer's statistics 0 / 1, affine 1 / 0: its input reaches the ReLU as it is
        model[2].running_mean.zero_()
        model[2].running_var.fill_(1.0)
    return model


def _act_input(model):
    """An input for which the norm layer before the ReLU outputs -5.8 in one place (the issue's 5.8)."""
    x = torch.zeros(2, 3, 2, 2)
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.zero_()
        model[0].bias[1] = -5.8  # channel 1 of the conv output: -5.8 everywhere
        model[1].running_mean.zero_()
        model[1].running_var.fill_(1.0 - model[1].eps)
        model[1].weight.fill_(1.0)
        model[1].bias.zero_()
    return x


def test_torch_conversions_drop_batchnormact_relu_changing_the_eval_output_by_5_8():
    model = _act_model()
    x = _act_input(model)
    with torch.no_grad():
        y = model(x)
        naive = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model)).eval()(x)
    assert float((naive - y).abs().max()) == pytest.approx(5.8, abs=1e-4)  # the 5.8, silently
    assert float(y.min()) == 0.0 and float(naive.min()) == pytest.approx(-5.8, abs=1e-4)


@pytest.mark.parametrize("conversion", sorted(CONVERSIONS))
def test_batchnormact_is_refused_by_every_conversion_naming_the_layer_and_leaving_the_model_untouched(conversion):
    model = _act_model()
    x = _act_input(model)
    with torch.no_grad():
        y = model(x)
    snap = _snapshot(model)
    with pytest.raises(ValueError, match=r"BatchNormAct2d '2'.*differs from the replacement's by up to 1000"):
        CONVERSIONS[conversion](model)
    assert _unchanged(model, snap)
    assert type(model[1]) is nn.BatchNorm2d and type(model[2]) is BatchNormAct2d  # the plain layer was not swapped
    with torch.no_grad():
        assert torch.equal(model(x), y)


@pytest.mark.parametrize("conversion", sorted(CONVERSIONS))
def test_batchnormact_with_an_identity_activation_is_converted_bit_for_bit(conversion):
    model = _act_model(nn.Identity)
    x = torch.randn(5, 3, 4, 4) * 3
    with torch.no_grad():
        y = model(x)
        out = CONVERSIONS[conversion](model).eval()
        assert torch.equal(out(x), y)


def test_unfreeze_refuses_a_frozen_layer_whose_source_class_computes_something_else():
    frozen = fz.FrozenBatchNorm(4, source_class=BatchNormAct2d)
    with torch.no_grad():
        frozen.bias.fill_(-1.0)
    model = nn.Sequential(frozen)
    snap = _snapshot(model)
    with pytest.raises(ValueError, match="a BatchNormAct2d without changing what it computes"):
        fz.unfreeze_batchnorm(model)
    assert _unchanged(model, snap)


def test_a_foreign_layer_without_eps_is_refused_and_eps_zero_is_carried_exactly():
    model = nn.Sequential(_fill(nn.BatchNorm2d(3), torch.Generator().manual_seed(1)), ForeignNorm(3, has_eps=False))
    snap = _snapshot(model)
    with pytest.raises(ValueError, match=r"ForeignNorm '1'.*eps is None.*no eps attribute"):
        fz.freeze_batchnorm(model)
    assert _unchanged(model, snap)
    bn = _fill(nn.BatchNorm2d(3, eps=0.0), torch.Generator().manual_seed(2))
    x = torch.randn(2, 3, 4, 4)
    frozen = fz.freeze_batchnorm(bn)
    assert frozen.eps == 0.0 and torch.equal(frozen(x), bn(x))
    assert torch.equal(frozen.to_batchnorm().eval()(x), bn(x))


def test_the_probe_neither_runs_hooks_nor_moves_the_global_rng():
    model = nn.Sequential(BatchNormAct2d(4, act_layer=nn.Identity)).eval()
    calls = []
    model[0].register_forward_hook(lambda *a: calls.append(1))
    state = torch.random.get_rng_state()
    frozen = fz.FrozenBatchNorm(4, source_class=BatchNormAct2d)  # the probe itself (a hooked layer is now refused first)
    assert bnstudy.norms.eval_output_difference(model[0], frozen) is None
    assert calls == [] and torch.equal(torch.random.get_rng_state(), state)


# --- case 2: replace_norm's degenerate groups (opacus#567) -------------------------------------------------------

def test_groupnorm_for_batchnorm1d_of_four_features_outputs_zero_and_replace_norm_refuses_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))  # opacus#567's shape
    x = torch.randn(32, 10)
    with torch.no_grad():  # what the replacement torch would build computes: 0 for every sample
        assert float(nn.GroupNorm(4, 4)(model[0](x)).abs().max()) < 1e-3
    snap = _snapshot(model)
    with pytest.raises(ValueError, match=r"BatchNorm1d '1'.*GroupNorm\(4, 4\) one channel per group.*opacus#567"):
        bnstudy.replace_norm(model, "group")
    assert _unchanged(model, snap)
    out = bnstudy.replace_norm(model, "group", num_groups=2)
    with torch.no_grad():
        assert float(out[1](out[0](x)).std()) > 0.5
    with pytest.raises(ValueError, match=r"kind='layer' gives GroupNorm\(1, 1\)"):
        bnstudy.replace_norm(nn.Sequential(nn.Linear(3, 1), nn.BatchNorm1d(1)), "layer")


def test_replace_norm_checks_every_layer_before_replacing_any():
    model = nn.Sequential(nn.BatchNorm2d(8), nn.BatchNorm1d(8))  # the second degenerates at num_groups=8
    model2 = nn.Sequential(nn.BatchNorm2d(8), BatchNormAct2d(8))
    for m, kw in ((model, dict(num_groups=8)), (model2, {})):
        snap = _snapshot(m)
        with pytest.raises(ValueError):
            bnstudy.replace_norm(m, "group", **kw)
        assert _unchanged(m, snap)


# --- hooks on a converted layer (found by a new user: a conversion dropped them silently) --------------------------

HOOKS = {
    "forward": lambda m: m.register_forward_hook(lambda mod, inp, out: out * 2),
    "forward_pre": lambda m: m.register_forward_pre_hook(lambda mod, inp: (inp[0] + 1,)),
    "forward_kwargs": lambda m: m.register_forward_hook(lambda mod, args, kwargs, out: out - 1, with_kwargs=True),
    "backward": lambda m: m.register_full_backward_hook(lambda mod, gin, gout: None),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversion=st.sampled_from(sorted({**CONVERSIONS, "replace_norm": None})),
       hooks=st.lists(st.sampled_from(sorted(HOOKS)), max_size=2), layer=st.sampled_from([1, 3]),
       seed=st.integers(0, 2**16))
def test_a_conversion_refuses_a_layer_with_hooks_of_its_own_before_changing_anything_and_keeps_the_output_without(
        conversion, hooks, layer, seed):
    """Torch's modules built in a layer's place do not carry its hooks: a forward hook that doubles the output moved
    the eval output by 1.95 under freeze_batchnorm, freeze_modules and convert_sync_batchnorm, silently. Now each
    conversion refuses a layer with hooks of its own (the model untouched), and without hooks keeps the output."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), _fill(nn.BatchNorm2d(8), g), nn.ReLU(), _fill(nn.BatchNorm2d(8), g)).eval()
    for h in hooks:
        HOOKS[h](model[layer])
    x = torch.randn(2, 3, 6, 6, generator=g)
    with torch.no_grad():
        y = model(x)
    snap = _snapshot(model)
    convert = CONVERSIONS.get(conversion) or (lambda m: bnstudy.replace_norm(m, "group", num_groups=2))
    if hooks:
        with pytest.raises(ValueError, match=rf"BatchNorm2d '{layer}' into .*: it has .*hook.* registered on it"):
            convert(model)
        assert _unchanged(model, snap)
        with torch.no_grad():
            assert torch.equal(model(x), y)  # the hooks still run on the untouched layer
    elif conversion != "replace_norm":  # a GroupNorm computes something else by design: nothing to compare
        with torch.no_grad():
            assert torch.equal(convert(model).eval()(x), y)


def test_freezing_the_same_name_twice_is_refused_so_one_unfreeze_restores_the_model():
    model = nn.Sequential(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), nn.Linear(4, 2))
    fz.freeze_modules(model, ["0"])
    snap = _snapshot(model)
    with pytest.raises(ValueError, match=r"\['0'\] already frozen by an earlier freeze_modules call"):
        fz.freeze_modules(model, ["0"])
    assert _unchanged(model, snap)
    fz.unfreeze_modules(model, ["0"])
    assert all(p.requires_grad for p in model.parameters()) and type(model[0][1]) is nn.BatchNorm1d


def test_torch_batchnorm_with_bias_false_is_refused_clearly_by_freeze_and_replace_norm():
    if "bias" not in nn.BatchNorm2d.__init__.__code__.co_varnames:
        pytest.skip("this torch's BatchNorm has no bias argument")
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, bias=False)).eval()
    snap = _snapshot(model)
    for convert in (fz.freeze_batchnorm, lambda m: fz.freeze_modules(m, whole_model=True),
                    lambda m: bnstudy.replace_norm(m, "group", num_groups=2)):
        with pytest.raises(ValueError, match="bias=False"):
            convert(model)
        assert _unchanged(model, snap)
    x = torch.randn(2, 3, 5, 5)
    synced = fz.convert_sync_batchnorm(copy.deepcopy(model)).eval()  # the README: SyncBatchNorm keeps the layout
    assert synced[1].bias is None and torch.equal(synced(x), model(x))
