"""Shared layers under freeze.convert_sync_batchnorm and freeze.freeze_modules (new user 6, items 1 and 2).

A layer reachable under several names (shared by two blocks, in a ModuleList or ModuleDict, nested) must keep
its pin under every name after the SyncBatchNorm conversion, and freeze_modules must not silently split a layer
that is also used outside the named submodules. Property tests build random shared structures and compare the
library's result with what torch actually did (flags after ``model.train()``, statistics after a forward)."""

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from bnstudy import freeze
from bnstudy.freeze import FrozenBatchNorm, convert_sync_batchnorm, freeze_modules, is_pinned, unfreeze_modules

C = 4
KINDS = ("seq", "list", "dict", "nested", "twice")


class Slots(nn.Module):
    """Blocks run in order; each holds one layer of a shared pool, wrapped as ``kind`` says."""

    def __init__(self, pool, plan):
        super().__init__()
        self.blocks = nn.ModuleList()
        for i, (k, kind) in enumerate(plan):
            bn = pool[k]
            if kind == "seq":
                block = nn.Sequential(nn.Linear(C, C), bn)
            elif kind == "list":
                block = nn.ModuleList([nn.Linear(C, C), bn])
            elif kind == "dict":
                block = nn.ModuleDict({"fc": nn.Linear(C, C), "norm": bn})
            elif kind == "nested":
                block = nn.Sequential(nn.Linear(C, C), nn.Sequential(nn.Sequential(bn)))
            else:  # the same layer twice in one parent
                block = nn.ModuleList([nn.Linear(C, C), bn, bn])
            self.blocks.append(block)
        self.plan = plan

    def forward(self, x):
        for block, (_, kind) in zip(self.blocks, self.plan):
            if kind == "dict":
                x = block["norm"](block["fc"](x))
            elif kind in ("list", "twice"):
                for layer in block:
                    x = layer(x)
            else:
                x = block(x)
        return x


@st.composite
def shared_models(draw):
    n_pool = draw(st.integers(1, 3))
    plan = draw(st.lists(st.tuples(st.integers(0, n_pool - 1), st.sampled_from(KINDS)), min_size=2, max_size=5))
    pin_layers = draw(st.lists(st.booleans(), min_size=n_pool, max_size=n_pool))
    pin_blocks = draw(st.lists(st.booleans(), min_size=len(plan), max_size=len(plan)))
    seed = draw(st.integers(0, 2**16))
    torch.manual_seed(seed)
    pool = [nn.BatchNorm1d(C) for _ in range(n_pool)]
    model = Slots(pool, plan)
    for bn, pin in zip(pool, pin_layers):
        if pin:
            freeze.pin_eval(bn)
    for block, pin in zip(model.blocks, pin_blocks):
        if pin:
            freeze.pin_eval(block)
    return model


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_models())
def test_convert_sync_batchnorm_keeps_every_name_pinned_and_behaves_as_the_pinned_original(model):
    pinned = {n for n, m in model.named_modules(remove_duplicate=False) if is_pinned(m)}
    original = copy.deepcopy(model)  # deepcopy keeps the sharing; torch's conversion changes its input in place
    out = convert_sync_batchnorm(model)
    names = {n for n, _ in out.named_modules(remove_duplicate=False)}
    assert pinned <= names
    # what torch did: after model.train() every name that was pinned is in eval mode and pinned
    original.train()
    out.train()
    after = dict(out.named_modules(remove_duplicate=False))
    for n in pinned:
        assert is_pinned(after[n]) and not after[n].training, n
    flags = {n: m.training for n, m in original.named_modules(remove_duplicate=False)}
    assert {n: m.training for n, m in out.named_modules(remove_duplicate=False)} == flags
    # and a training forward moves exactly what the unconverted model moves (SyncBatchNorm is plain BN here)
    x = torch.randn(8, C, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y0, y1 = original(x), out(x)
    assert torch.equal(y0, y1)
    s0, s1 = _state(original), _state(out)
    assert s0.keys() == s1.keys()
    assert all(torch.equal(s0[k], s1[k]) for k in s0)


def test_convert_sync_batchnorm_shared_layer_given_case():
    """The reported case: one pinned BN shared by blocks a and b; both copies stay pinned, statistics do not move."""
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            bn = nn.BatchNorm1d(5)
            self.a = nn.Sequential(nn.Linear(5, 5), bn)
            self.b = nn.Sequential(nn.Linear(5, 5), bn)

        def forward(self, x):
            return self.b(self.a(x))

    m = Shared()
    freeze.pin_eval(m.a[1])
    m = convert_sync_batchnorm(m)
    m.train()
    assert (m.a[1].training, m.b[1].training) == (False, False)
    assert m.a[1] is not m.b[1]  # documented: torch's conversion does not preserve the sharing...
    assert m.a[1].running_mean is m.b[1].running_mean  # ...but the copies share their tensors
    rm = m.a[1].running_mean.clone()
    m(torch.randn(8, 5))
    assert torch.equal(rm, m.a[1].running_mean)


def _groups(model):
    """The sharing structure: which names hold the same module object (a partition of the names)."""
    by_id: dict = {}
    for n, m in model.named_modules(remove_duplicate=False):
        by_id.setdefault(id(m), []).append(n)
    return sorted(sorted(v) for v in by_id.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_models(), st.data())
def test_freeze_modules_never_splits_a_shared_layer(model, data):
    for m in model.modules():  # this test is about sharing, not pins
        freeze.unpin(m)
    chosen = data.draw(st.lists(st.integers(0, len(model.blocks) - 1), min_size=1, unique=True))
    names = [f"blocks.{i}" for i in chosen]
    inside = lambda n: any(n == p or n.startswith(p + ".") for p in names)  # noqa: E731
    # the truth, from torch's own module tree: is some BatchNorm inside also reachable outside?
    crosses = any(any(map(inside, g)) and not all(map(inside, g))
                  and isinstance(model.get_submodule(g[0]), nn.BatchNorm1d) for g in _groups(model))
    groups, before = _groups(model), _state(model)
    if crosses:
        with pytest.raises(ValueError, match="is shared: it is also reachable as"):
            freeze_modules(model, names)
        assert _groups(model) == groups and all(torch.equal(v, _state(model)[k]) for k, v in before.items())
        assert all(p.requires_grad for p in model.parameters())  # nothing changed
        return
    freeze_modules(model, names)
    assert _groups(model) == groups  # one layer stays one layer
    for g in groups:
        if all(map(inside, g)) and isinstance(model.get_submodule(g[0]), (nn.BatchNorm1d, FrozenBatchNorm)):
            assert isinstance(model.get_submodule(g[0]), FrozenBatchNorm), g
    model.train()
    with torch.no_grad():
        model(torch.randn(8, C))
    after = _state(model)
    for k in before:
        if inside(k.rsplit(".", 1)[0]):
            assert torch.equal(before[k], after[k]), k  # what torch's forward did to a frozen name: nothing
    unfreeze_modules(model, names)
    assert _groups(model) == groups
    assert not any(isinstance(m, FrozenBatchNorm) for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())


def test_freeze_modules_refuses_to_split_a_bn_shared_with_the_head_given_case():
    bn = nn.BatchNorm1d(5)
    m = nn.Module()
    m.backbone = nn.Sequential(nn.Linear(5, 5), bn)
    m.head = nn.Sequential(bn, nn.Linear(5, 2))
    with pytest.raises(ValueError, match=r"BatchNorm1d 'backbone.1' is shared: it is also reachable as 'head.0'"):
        freeze_modules(m, ["backbone"])
    assert type(m.backbone[1]) is nn.BatchNorm1d and m.backbone[1] is m.head[0]
    freeze_modules(m, ["backbone", "head.0"])  # naming both: one shared FrozenBatchNorm
    assert isinstance(m.backbone[1], FrozenBatchNorm) and m.backbone[1] is m.head[0]
    with pytest.raises(ValueError, match="unfreeze_modules: FrozenBatchNorm 'backbone.1' is shared"):
        unfreeze_modules(m, ["backbone"])
    unfreeze_modules(m, ["backbone", "head.0"])
    assert type(m.backbone[1]) is nn.BatchNorm1d and m.backbone[1] is m.head[0]
    assert m.backbone[1].weight.requires_grad and m.backbone[0].weight.requires_grad
