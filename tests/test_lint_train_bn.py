"""The ``train_bn_drift`` lint: fastai's and PyTorch Lightning's ``train_bn=True`` inside a frozen backbone.

The pattern: every weight of a block has ``requires_grad=False`` except the BatchNorm affine parameters, and the
BatchNorm layers stay in train mode, so their affine trains while running_mean/running_var drift with every batch.
The layer's *block* is its nearest ancestor (the model included) that holds parameters other than BatchNorm affine
parameters. The layer sits in a *frozen part* when every one of those parameters has ``requires_grad=False``, or,
failing that, when the ones registered before the layer inside the block exist and all have ``requires_grad=False``
(the stem BatchNorm of a torchvision ResNet whose ``fc`` trains; the same rule as ``frozen_bn_in_train_mode`` uses for
a layer without affine parameters, BatchNorm affine parameters left out). A layer is linted when, after
``model.train()``, it writes its running statistics (so a layer pinned in eval mode is not, while a layer set to eval
by hand is: the next ``model.train()`` undoes that), one of its affine parameters trains, and it sits in a frozen
part.
"""

import warnings
from collections import OrderedDict

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st
from torch import nn

import bnstudy
from bnstudy import audit
from bnstudy.freeze import is_pinned, pin_eval

CODE = "train_bn_drift"


def _estimated(bn: nn.BatchNorm2d) -> None:
    """Statistics that look estimated (not the reset values, many updates), so that no other lint fires."""
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.num_batches_tracked.fill_(1000)


def _backbone(affine: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    bb = nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 3), bn=nn.BatchNorm2d(4, affine=affine), relu=nn.ReLU()))
    _estimated(bb.bn)
    return bb


def _train_bn_freeze(module: nn.Module) -> None:
    """fastai's / Lightning's freeze with ``train_bn=True``: every parameter frozen except BatchNorm's."""
    for m in module.modules():
        if not isinstance(m, nn.modules.batchnorm._BatchNorm):
            for p in m.parameters(recurse=False):
                p.requires_grad_(False)


def _model(bb: nn.Module) -> nn.Sequential:
    torch.manual_seed(1)
    return nn.Sequential(OrderedDict(backbone=bb, pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(),
                                     head=nn.Linear(4, 2)))


def _codes(lints, code=CODE):
    return [x.layer for x in lints if x.code == code]


# --- (1) the exact pattern ---------------------------------------------------------------------------------------

def test_frozen_backbone_with_trainable_bn_affine_in_train_mode_is_linted_naming_the_layer():
    bb = _backbone()
    _train_bn_freeze(bb)
    model = _model(bb).train()
    with pytest.warns(audit.BNLintWarning, match=r"\[train_bn_drift\] backbone\.bn: "):
        lints = audit.lint_model(model)
    assert _codes(lints) == ["backbone.bn"]
    (lint,) = [x for x in lints if x.code == CODE]
    assert lint.severity == "warning" and lint.code in audit.LINT_CODES
    msg = lint.message
    assert msg.startswith("BatchNorm2d's weight and bias have requires_grad=True")
    assert "normalises with batch statistics and overwrites running_mean/running_var" in msg   # what happens
    assert "train_bn=True" in msg and "fastai" in msg and "Lightning" in msg
    assert "bnstudy.pin_norm_eval" in msg and "freeze the affine too" in msg                     # the two fixes
    assert [x for x in lints if x.severity == "warning"] == [lint]                                # nothing else
    # the backbone alone as the model: the model itself is the block
    assert _codes(audit.lint_model(bb, warn=False)) == ["bn"]


def test_freeze_audit_surfaces_it_on_entry_and_torch_shows_both_moving():
    bb = _backbone()
    _train_bn_freeze(bb)
    model = _model(bb)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 2, (8,))
    mean0, w0, conv0 = bb.bn.running_mean.clone(), bb.bn.weight.detach().clone(), bb.conv.weight.detach().clone()
    with audit.FreezeAudit(model, warn=False) as a:
        model.train()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert _codes(a.lints) == ["backbone.bn"]
    assert "train_bn_drift" in str(a)
    assert not torch.equal(bb.bn.running_mean, mean0)          # the statistics drifted
    assert not torch.equal(bb.bn.weight.detach(), w0)          # the affine trained
    assert torch.equal(bb.conv.weight.detach(), conv0)         # the rest of the block stayed frozen


def test_one_grouped_warning_for_a_whole_backbone():
    torch.manual_seed(0)
    bb = nn.Sequential(*[nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)) for _ in range(3)])
    for blk in bb:
        _estimated(blk[1])
    _train_bn_freeze(bb)
    lints = audit.lint_model(_model_3(bb), warn=False)
    assert _codes(lints) == ["backbone.0.1", "backbone.1.1", "backbone.2.1"]
    (line,) = [x for x in audit.format_lints(lints, width=10_000) if CODE in x]
    assert "[train_bn_drift] 3 layers (backbone.0.1, backbone.1.1, backbone.2.1)" in line


def _model_3(bb):
    return nn.Sequential(OrderedDict(backbone=bb, pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(),
                                     head=nn.Linear(3, 2)))


def test_only_the_weight_or_only_the_bias_trainable_is_named():
    bb = _backbone()
    _train_bn_freeze(bb)
    bb.bn.bias.requires_grad_(False)
    (lint,) = [x for x in audit.lint_model(_model(bb), warn=False) if x.code == CODE]
    assert lint.message.startswith("BatchNorm2d's weight has requires_grad=True")


# --- (2) eval mode: the statistics pinned ------------------------------------------------------------------------

@pytest.mark.parametrize("pin", ["pin_norm_eval", "pin_eval"])
def test_pinned_eval_mode_with_trainable_affine_is_not_linted(pin):
    bb = _backbone()
    _train_bn_freeze(bb)
    model = _model(bb).train()
    getattr(bnstudy, pin)(bb if pin == "pin_norm_eval" else bb.bn)   # the first fix: pin the statistics
    with warnings.catch_warnings():
        warnings.simplefilter("error", audit.BNLintWarning)          # no warning at all
        lints = audit.lint_model(model)
    assert _codes(lints) == [] and [x for x in lints if x.severity == "warning"] == []
    assert bb.bn.weight.requires_grad                                   # the affine still trains


def test_eval_set_by_hand_is_still_linted_since_model_train_undoes_it():
    bb = _backbone()
    _train_bn_freeze(bb)
    model = _model(bb).train()
    bb.bn.eval()
    codes = {(x.code, x.layer) for x in audit.lint_model(model, warn=False)}
    assert {(CODE, "backbone.bn"), ("eval_undone_by_train", "backbone.bn")} <= codes


def test_freezing_the_affine_too_gives_the_frozen_bn_lint_instead():
    bb = _backbone()
    bb.requires_grad_(False)                                           # the second fix, before pinning
    lints = audit.lint_model(_model(bb), warn=False)
    assert _codes(lints) == [] and _codes(lints, "frozen_bn_in_train_mode") == ["backbone.bn"]
    bnstudy.pin_eval(bb)
    assert audit.lint_model(_model(bb), warn=False) == []


# --- (3) no affine parameters ------------------------------------------------------------------------------------

def test_bn_without_affine_is_not_this_lint():
    bb = _backbone(affine=False)
    _train_bn_freeze(bb)
    lints = audit.lint_model(_model(bb), warn=False)
    assert _codes(lints) == []
    assert _codes(lints, "frozen_bn_in_train_mode") == ["backbone.bn"]  # the existing no-affine rule, unchanged


# --- (4) plain fine-tuning: nothing frozen -----------------------------------------------------------------------

def test_everything_trainable_is_not_linted():
    model = _model(_backbone()).train()
    assert audit.lint_model(model, warn=False) == []


def test_a_trainable_layer_in_the_block_means_it_is_not_frozen():
    bb = _backbone()
    _train_bn_freeze(bb)
    bb.conv.bias.requires_grad_(True)
    assert _codes(audit.lint_model(_model(bb), warn=False)) == []
    # a flat model whose first conv trains: nothing before either BatchNorm is all frozen
    torch.manual_seed(0)
    flat = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1).requires_grad_(False),
                         nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    _estimated(flat[1])
    _estimated(flat[3])
    assert _codes(audit.lint_model(flat, warn=False)) == []


def test_the_frozen_layers_before_it_count_as_its_block_as_for_a_bn_without_affine():
    # a torchvision ResNet's shape: the stem BatchNorm sits in the model beside the trainable fc
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(conv1=nn.Conv2d(3, 4, 1), bn1=nn.BatchNorm2d(4),
                                      layer1=nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)),
                                      pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), fc=nn.Linear(4, 2)))
    for bn in (model.bn1, model.layer1[1]):
        _estimated(bn)
    _train_bn_freeze(model)
    model.fc.requires_grad_(True)
    assert _codes(audit.lint_model(model, warn=False)) == ["bn1", "layer1.1"]
    # the frozen first stages of a flat model, the rest trained: the BatchNorm after them is in the frozen part
    torch.manual_seed(0)
    flat = nn.Sequential(nn.Conv2d(3, 4, 1).requires_grad_(False), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1),
                         nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    _estimated(flat[1])
    _estimated(flat[3])
    assert _codes(audit.lint_model(flat, warn=False)) == ["1"]


def test_a_module_holding_only_norm_layers_is_passed_over():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 1), norms=nn.Sequential(nn.BatchNorm2d(4))))
    _estimated(model.norms[0])
    model.conv.requires_grad_(False)
    assert _codes(audit.lint_model(model, warn=False)) == ["norms.0"]
    only_norms = nn.Sequential(nn.BatchNorm2d(4))                     # no block at all
    _estimated(only_norms[0])
    assert _codes(audit.lint_model(only_norms, warn=False)) == []


# --- (5) property: random small models, the lint against its definition and against torch ------------------------

MODES = ("train", "pinned", "eval")
conv_spec = st.fixed_dictionaries(dict(kind=st.just("conv"), rg=st.booleans()))
bn_spec = st.fixed_dictionaries(dict(kind=st.just("bn"), affine=st.booleans(), rg_w=st.booleans(),
                                     rg_b=st.booleans(), mode=st.sampled_from(MODES)))
block_spec = st.lists(st.one_of(conv_spec, bn_spec), min_size=1, max_size=3)


def _build(blocks, head, seed):
    """``(model, {name: (block index, layer)})``: ``Sequential(block_0, ..., [head])``, each block a ``Sequential`` of
    bias-free 1x1 convs and BatchNorm1d layers, each BatchNorm followed by a tanh (without it, a shift that a later
    train-mode BatchNorm subtracts again gives a bias exactly zero gradient); the BatchNorm layers in train mode,
    pinned in eval mode, or set to eval by hand."""
    torch.manual_seed(seed)
    mods, where = [], []
    for i, spec in enumerate(blocks):
        layers = []
        for s in spec:
            if s["kind"] == "conv":
                layers.append(nn.Conv1d(3, 3, 1, bias=False).requires_grad_(s["rg"]))
                continue
            bn = nn.BatchNorm1d(3, affine=s["affine"])
            if s["affine"]:
                with torch.no_grad():  # away from 1/0, so that every gradient is generic
                    bn.weight.uniform_(0.5, 1.5)
                    bn.bias.uniform_(-0.5, 0.5)
                bn.weight.requires_grad_(s["rg_w"])
                bn.bias.requires_grad_(s["rg_b"])
            where.append((f"{i}.{len(layers)}", i, bn, s["mode"]))
            layers += [bn, nn.Tanh()]
        mods.append(nn.Sequential(*layers))
    if head is not None:
        mods.append(nn.Conv1d(3, 3, 1, bias=False).requires_grad_(head))
    model = nn.Sequential(*mods).train()
    for _, _, bn, mode in where:
        if mode == "pinned":
            pin_eval(bn)
        elif mode == "eval":
            bn.eval()
    return model, {name: (i, bn) for name, i, bn, _ in where}


def _frozen_part(model, name):
    """The parameters whose freeze puts BatchNorm ``name`` (``"i.j"``) in a frozen part, by the rule this file's
    docstring states: the non-BatchNorm parameters of its block (``model[i]``, or the model when ``model[i]`` has
    none) when all are frozen, else those registered before the layer in the block when there are some and all are
    frozen; None when there is no frozen part."""
    i, j = map(int, name.split("."))
    def non_bn(mods):
        return [p for m in mods if not isinstance(m, nn.BatchNorm1d) for p in m.parameters(recurse=False)]
    block, before = model[i], list(model[i])[:j]
    if not non_bn(block.modules()):
        block, before = model, list(model)[:i]
    params = non_bn(block.modules())
    if not params:
        return None
    if not any(p.requires_grad for p in params):
        return params
    before = non_bn([m for b in before for m in b.modules()])
    return before if before and not any(p.requires_grad for p in before) else None


_FROZEN, _TRAINED = dict(kind="conv", rg=False), dict(kind="conv", rg=True)
_BN = dict(kind="bn", affine=True, rg_w=True, rg_b=False, mode="eval")


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(blocks=st.lists(block_spec, min_size=1, max_size=3), head=st.one_of(st.none(), st.booleans()),
       seed=st.integers(0, 2 ** 16))
# the layers registered before it frozen, the block not (the drawn examples seldom reach it): in its block, and in
# the model (its block holds norm layers only), each beside a trained and a pinned layer
@example(blocks=[[_FROZEN, _BN, _TRAINED, dict(_BN, mode="train"), dict(_BN, mode="pinned")]], head=None, seed=1)
@example(blocks=[[_FROZEN], [_BN, dict(_BN, rg_w=False, rg_b=True, mode="train")], [_TRAINED, _BN]], head=True,
         seed=2)
def test_lint_fires_exactly_where_the_affine_trains_on_drifting_statistics(blocks, head, seed):
    model, bns = _build(blocks, head, seed)
    expected = set()
    for name, (i, m) in bns.items():
        train_after = not is_pinned(m)                 # model.train() undoes a hand-set eval
        affine_trains = m.affine and (m.weight.requires_grad or m.bias.requires_grad)
        if train_after and affine_trains and _frozen_part(model, name) is not None:
            expected.add(name)
    assert set(_codes(audit.lint_model(model, warn=False))) == expected

    # what torch does: one train-mode forward, one backward, one optimizer step
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    means = {name: m.running_mean.clone() for name, (_, m) in bns.items()}
    g = torch.Generator().manual_seed(seed)
    x, target = torch.randn(8, 3, 5, generator=g) * 2 + 1, torch.randn(8, 3, 5, generator=g)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=0.1) if trainable else None
    with audit.FreezeAudit(model, warn=False) as a:
        model.train()
        loss = (model(x) - target).pow(2).mean()
        if opt is not None:
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert set(_codes(a.lints)) == expected                           # the audit surfaces the same layers
    params = dict(model.named_parameters())
    ids = {id(p): n for n, p in params.items()}
    moved = {n for n, p in params.items() if not torch.equal(p.detach(), before[n])}
    for name, (i, m) in bns.items():
        stats_drifted = not torch.equal(m.running_mean, means[name])
        affine_trained = f"{name}.weight" in moved or f"{name}.bias" in moved
        part = _frozen_part(model, name)
        block_still = part is not None and not any(ids[id(p)] in moved for p in part)
        assert (name in expected) == (stats_drifted and affine_trained and block_still), name


def test_momentum_zero_is_not_drift():
    """A fresh user's fault: at momentum 0 train mode never moves the running statistics (one real step checks it),
    so the layer is ``momentum_zero``'s, not ``train_bn_drift``'s."""
    import torch
    from torch import nn
    import bnstudy
    m = nn.Sequential(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=0.0)), nn.Conv2d(4, 2, 1))
    for q in m[0].modules():
        for p in q.parameters(recurse=False):
            p.requires_grad_(isinstance(q, nn.BatchNorm2d))
    codes = {lint.code for lint in bnstudy.lint_model(m)}
    assert "momentum_zero" in codes and "train_bn_drift" not in codes
    before = m[0][1].running_mean.clone()
    m.train()(torch.randn(3, 4, 5, 5)).sum().backward()
    assert torch.equal(m[0][1].running_mean, before)
