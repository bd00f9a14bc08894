"""Tensors reachable under several names (newuser3 P1): shared submodules, tied weights, shared buffers, a module
reused at several places. The audit must report a tensor that moved under every name it has, as torch's
``state_dict()`` lists it, for every query (name prefix, module object) and every output."""

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from bnstudy import FreezeAudit, audit
from bnstudy.freeze import pin_eval


def _shared_bn_model():
    bn = nn.BatchNorm2d(4)

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Sequential(bn, nn.Flatten(), nn.Linear(4 * 64, 2))   # registered first
            self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), bn)    # same BN object

        def forward(self, x):
            return self.head(self.backbone(x))

    return Shared()


def test_newuser3_reproducer_shared_bn_registered_first_in_head_is_caught_under_the_backbone_name():
    torch.manual_seed(0)
    m = _shared_bn_model()
    m.backbone.requires_grad_(False)
    x = torch.randn(8, 3, 8, 8)
    sd0 = {k: v.clone() for k, v in m.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FreezeAudit(m, probe=x[:2]) as a:
            m.train()
            m(x)
    torch_moved = {k for k, v in m.state_dict().items() if not torch.equal(v, sd0[k])}
    assert {"backbone.1.running_mean", "backbone.1.running_var", "backbone.1.num_batches_tracked"} <= torch_moved
    assert set(a.moved()["tensor"]) == torch_moved
    assert set(a.moved("backbone")["tensor"]) == {k for k in torch_moved if k.startswith("backbone.")}
    for query in ("backbone", m.backbone, "backbone.1", m.backbone[1]):
        with pytest.raises(AssertionError, match=r"backbone\.1\.running_mean[\s\S]*backbone\.1\.running_var"
                                                 r"[\s\S]*backbone\.1\.num_batches_tracked"):
            a.assert_frozen(query)
    # the module object is both names
    assert set(a.moved(m.backbone[1])["tensor"]) == torch_moved
    # the backbone's own output check uses the entry state of the shared BN too
    assert a.module_outputs("backbone")["changed"].any()
    rep = a.report().set_index("tensor")
    assert rep.loc["backbone.1.running_mean", "shared_with"] == ("head.0.running_mean",)
    assert "backbone.1.running_mean" in a.summary(details=True)
    assert "backbone.1.running_mean" in a._repr_html_()
    # the layer table: one shared layer, one row, its other name said
    assert a.modes().set_index("module").loc["head.0", "also"] == ("backbone.1",)
    assert "head.0 (= backbone.1)" in a.summary(details=True)
    # counts: distinct tensors, the extra names said separately
    head = a._headline()
    assert "more name" in head[0] and "moved: 3 tensors (0 parameters, 3 buffers; 3 more names" in head[1]


def test_tied_linear_weight_trained_through_the_head_is_reported_under_the_pinned_backbone():
    torch.manual_seed(1)
    lin = nn.Linear(8, 8)

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Sequential(lin)
            self.backbone = nn.Sequential(lin, nn.BatchNorm1d(8))

        def forward(self, x):
            return self.head(self.backbone(x))

    m = Tied()
    pin_eval(m.backbone)
    sd0 = {k: v.clone() for k, v in m.state_dict().items()}
    with FreezeAudit(m, probe=torch.randn(4, 8), warn=False) as a:
        m.train()
        opt = torch.optim.SGD(m.head.parameters(), lr=0.1)
        m(torch.randn(8, 8)).pow(2).mean().backward()
        opt.step()
    torch_moved = {k for k, v in m.state_dict().items() if not torch.equal(v, sd0[k])}
    assert torch_moved == {"head.0.weight", "head.0.bias", "backbone.0.weight", "backbone.0.bias"}
    assert set(a.moved("backbone")["tensor"]) == {"backbone.0.weight", "backbone.0.bias"}
    with pytest.raises(AssertionError, match=r"backbone\.0\.weight"):
        a.assert_frozen("backbone")
    with pytest.raises(AssertionError, match=r"backbone\.0\.weight"):
        a.assert_frozen(m.backbone)


def test_snapshot_stores_one_copy_per_shared_tensor_under_every_name():
    lin = nn.Linear(2, 2)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    s = audit.snapshot(model)
    assert list(s.tensors) == list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert s.tensors["0.weight"] is s.tensors["2.weight"]
    assert s.aliases["2.bias"] == ("0.bias", "2.bias") and "1" not in s.aliases
    # a buffer shared by two modules (same tensor object registered twice)
    a, b = nn.BatchNorm1d(2), nn.BatchNorm1d(2)
    b.running_mean = a.running_mean
    s = audit.snapshot(nn.Sequential(a, b))
    assert s.aliases["1.running_mean"] == ("0.running_mean", "1.running_mean")


def test_module_in_a_moduledict_and_as_an_attribute_is_checked_under_both_names():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = nn.ModuleDict({"a": nn.BatchNorm1d(3)})
            self.trunk = nn.Sequential(nn.Linear(3, 3))
            self.trunk.add_module("bn", self.norms["a"])   # same BN, deeper

        def forward(self, x):
            return self.trunk(x)

    m = Net()
    with FreezeAudit(m, warn=False) as a:
        m.train()
        m(torch.randn(4, 3))
    assert {"norms.a.running_mean", "trunk.bn.running_mean"} <= set(a.moved()["tensor"])
    for q in ("norms", "trunk", "trunk.bn", m.norms["a"]):
        with pytest.raises(AssertionError, match="running_mean"):
            a.assert_frozen(q)


# ---------------------------------------------------------------------------------------------------------------
# Property test: random small models with randomly shared modules / tied weights, random freezes, a train-mode
# forward + an optimizer step; the audit's verdict per prefix must equal torch's state_dict() before/after diff.
# ---------------------------------------------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self, blocks, order):
        super().__init__()
        self.order = order
        for i, blk in enumerate(blocks):
            self.add_module(f"b{i}", blk)

    def forward(self, x):
        for i in self.order:
            x = getattr(self, f"b{i}")(x)
        return x


@st.composite
def _models(draw):
    n_units = draw(st.integers(1, 3))
    units = []
    for _ in range(n_units):
        kind = draw(st.sampled_from(["linear", "bn", "lin_bn"]))
        units.append(kind)
    n_blocks = draw(st.integers(2, 4))
    # each block is a list of unit indices (a unit used in several blocks is shared)
    blocks = [draw(st.lists(st.integers(0, n_units - 1), min_size=1, max_size=2)) for _ in range(n_blocks)]
    tie = draw(st.booleans())                 # tie the weight of two distinct Linear units, if there are two
    freeze = draw(st.lists(st.booleans(), min_size=n_blocks, max_size=n_blocks))
    how = draw(st.lists(st.sampled_from(["grad", "pin", "both"]), min_size=n_blocks, max_size=n_blocks))
    order = draw(st.permutations(range(n_blocks)))
    seed = draw(st.integers(0, 2 ** 16))
    return units, blocks, tie, freeze, how, list(order), seed


def _build(units, blocks, tie, seed):
    torch.manual_seed(seed)
    made = []
    for kind in units:
        made.append(nn.Linear(4, 4) if kind == "linear" else nn.BatchNorm1d(4) if kind == "bn"
                    else nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    lins = [u if isinstance(u, nn.Linear) else u[0] for u in made if not isinstance(u, nn.BatchNorm1d)]
    if tie and len(lins) >= 2:
        lins[1].weight = lins[0].weight
    return [nn.Sequential(*[made[i] for i in blk]) for blk in blocks]


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=_models())
def test_audit_verdict_per_prefix_matches_torchs_state_dict_diff(spec):
    units, blocks, tie, freeze, how, order, seed = spec
    model = _Net(_build(units, blocks, tie, seed), order)
    for i, (f, h) in enumerate(zip(freeze, how)):
        blk = getattr(model, f"b{i}")
        if f and h in ("grad", "both"):
            blk.requires_grad_(False)
        if f and h in ("pin", "both"):
            pin_eval(blk)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(seed))
    sd0 = {k: v.clone() for k, v in model.state_dict(keep_vars=False).items()}
    params = [p for p in model.parameters() if p.requires_grad]
    with FreezeAudit(model, warn=False) as a:
        model.train()
        out = model(x)
        if params:
            opt = torch.optim.SGD(params, lr=0.5)
            out.pow(2).mean().backward()
            opt.step()
    sd1 = model.state_dict()
    torch_moved = {k for k in sd0 if not torch.equal(sd0[k], sd1[k])}
    assert set(a.moved()["tensor"]) == torch_moved
    prefixes = [n for n, _ in model.named_modules(remove_duplicate=False)]
    for p in prefixes:
        expected = {k for k in torch_moved if p == "" or k.startswith(p + ".")}
        got = set(a.moved(p)["tensor"]) if p else set(a.moved()["tensor"])
        assert got == expected, p
        try:
            a.assert_frozen(p, outputs=False)
            verdict = True
        except AssertionError:
            verdict = False
        assert verdict == (not expected), p
    # by module object: every name the object has
    for name, mod in model.named_modules():
        if mod is model:
            continue
        names = [n for n, m in model.named_modules(remove_duplicate=False) if m is mod]
        expected = {k for k in torch_moved if any(k.startswith(n + ".") for n in names)}
        assert set(a.moved(mod)["tensor"]) == expected, name
