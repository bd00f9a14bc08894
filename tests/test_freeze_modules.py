"""freeze_modules / unfreeze_modules (timm's tests for freeze/unfreeze, ported) and FrozenBatchNorm
(torchvision's checks for FrozenBatchNorm2d)."""

import copy

import pytest
import torch
from torch import nn

from bnstudy.freeze import FrozenBatchNorm, freeze_modules, unfreeze_modules


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn1(self.conv1(x)))


def _resnetish():
    torch.manual_seed(0)
    m = nn.Module()
    m.layer1 = nn.Sequential(Block(4))
    m.layer2 = nn.Sequential(Block(4), Block(4))
    m.layer3 = nn.Sequential(Block(4))
    m.fc = nn.Linear(4, 2)
    return m


def test_freeze_all_and_unfreeze_all():
    model = _resnetish()
    freeze_modules(model, whole_model=True)
    assert not model.fc.weight.requires_grad and not model.layer1[0].conv1.weight.requires_grad
    assert isinstance(model.layer1[0].bn1, FrozenBatchNorm)
    unfreeze_modules(model, whole_model=True)
    assert model.fc.weight.requires_grad and model.layer1[0].conv1.weight.requires_grad
    assert type(model.layer1[0].bn1) is nn.BatchNorm2d


def test_freeze_some_by_name_leaves_the_rest_and_unfreeze_undoes_it_exactly():
    model = _resnetish()
    model.layer2[0].conv1.bias.requires_grad_(False)   # a flag unfreeze must give back as it was
    ref = copy.deepcopy(model)
    freeze_modules(model, ["layer1", "layer2.0"])
    assert not model.layer1[0].conv1.weight.requires_grad and isinstance(model.layer1[0].bn1, FrozenBatchNorm)
    assert not model.layer2[0].conv1.weight.requires_grad
    assert model.layer3[0].conv1.weight.requires_grad and type(model.layer3[0].bn1) is nn.BatchNorm2d
    assert model.layer2[1].conv1.weight.requires_grad
    unfreeze_modules(model, ["layer1", "layer2.0"])
    assert [(n, p.requires_grad) for n, p in model.named_parameters()] == [
        (n, p.requires_grad) for n, p in ref.named_parameters()]
    assert [type(m) for m in model.modules()] == [type(m) for m in ref.modules()]
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in model.state_dict().items())


def test_a_single_norm_layer_named_from_the_root_or_from_its_parent():
    model = _resnetish()
    freeze_modules(model, ["layer1.0.bn1"])
    assert isinstance(model.layer1[0].bn1, FrozenBatchNorm)
    unfreeze_modules(model, ["layer1.0.bn1"])
    assert type(model.layer1[0].bn1) is nn.BatchNorm2d and model.layer1[0].bn1.weight.requires_grad
    freeze_modules(model.layer1[0], ["bn1"])
    assert isinstance(model.layer1[0].bn1, FrozenBatchNorm)
    unfreeze_modules(model.layer1[0], ["bn1"])
    assert type(model.layer1[0].bn1) is nn.BatchNorm2d
    freeze_modules(model, "layer1")  # a string is one name
    assert not model.layer1[0].conv1.weight.requires_grad


def test_the_root_cannot_be_a_norm_layer_and_unknown_names_are_named():
    with pytest.raises(ValueError, match="the root is a BatchNorm2d"):
        freeze_modules(nn.BatchNorm2d(3), whole_model=True)
    with pytest.raises(ValueError, match="names=.layer9. is not a module of the model"):
        freeze_modules(_resnetish(), ["layer9"])


def test_frozen_bn_equals_bn_eval_with_its_eps_and_loads_a_batchnorm_state_dict():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(5, eps=1e-3)
    bn.train()(torch.randn(8, 5, 4, 4) * 2 + 1)
    frozen = FrozenBatchNorm(5, eps=1e-3)
    frozen.load_state_dict(bn.state_dict())  # num_batches_tracked included, as torchvision's test checks
    x = torch.randn(3, 5, 4, 4)
    assert torch.equal(frozen(x), bn.eval()(x))
    assert "5, eps=0.001" in repr(frozen)


def test_a_compiled_model_is_frozen_by_the_names_of_the_uncompiled_model_or_of_the_wrapper():
    """freeze_modules(torch.compile(model), names) took only the wrapper's names ('_orig_mod.layer1'); a user
    passes the model's own. Both now name the same submodules, and the result is what freezing the uncompiled
    model gives (wrapping is enough: the compiled model is not run)."""
    reference = freeze_modules(_resnetish(), ["layer1", "layer2.0.bn1"])
    for names in (["layer1", "layer2.0.bn1"], ["_orig_mod.layer1", "_orig_mod.layer2.0.bn1"],
                  ["layer1", "_orig_mod.layer2.0.bn1"], "layer1"):
        model = _resnetish()
        compiled = torch.compile(model)
        assert freeze_modules(compiled, names) is compiled
        assert compiled._orig_mod is model
        expected = reference if not isinstance(names, str) else freeze_modules(_resnetish(), "layer1")
        assert [(n, type(m)) for n, m in model.named_modules()] == [(n, type(m)) for n, m in expected.named_modules()]
        assert {n: p.requires_grad for n, p in model.named_parameters()} == {
            n: p.requires_grad for n, p in expected.named_parameters()}
        assert isinstance(model.layer1[0].bn1, FrozenBatchNorm)
        # unfreeze through either the wrapper or the model, with either names
        assert unfreeze_modules(compiled, names) is compiled
        assert all(p.requires_grad for p in model.parameters())
        assert not any(isinstance(m, FrozenBatchNorm) for m in model.modules())
    # module objects, the wrapper itself as the root, and whole_model
    model = _resnetish()
    compiled = torch.compile(model)
    freeze_modules(compiled, [model.layer3])
    assert isinstance(model.layer3[0].bn1, FrozenBatchNorm) and model.fc.weight.requires_grad
    unfreeze_modules(model, ["layer3"])  # the record is the model's: the uncompiled model undoes it too
    assert not isinstance(model.layer3[0].bn1, FrozenBatchNorm)
    freeze_modules(compiled, whole_model=True)
    assert not any(p.requires_grad for p in model.parameters())
    unfreeze_modules(compiled, [compiled])
    assert all(p.requires_grad for p in model.parameters())
    # an unknown name is refused naming the function and the model's own names
    with pytest.raises(ValueError, match=r"^freeze_modules: names='layer9' is not a module of the model "
                                         r"\(Module\); choose qualified names such as \['layer1'"):
        freeze_modules(torch.compile(_resnetish()), ["layer9"])
