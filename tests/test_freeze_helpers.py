"""FrozenBatchNorm conversion, norm-only pinning and the batch-statistics report (bnstudy.freeze)."""

import pytest
import torch
from torch import nn

from bnstudy import freeze as fz
from bnstudy.audit import FreezeAudit


def _trained_bn(cls, shape, affine=True, seed=0):
    torch.manual_seed(seed)
    bn = cls(shape[1], affine=affine)
    for _ in range(3):
        bn(torch.randn(*shape) * 3 + 2)
    if affine:
        with torch.no_grad():
            bn.weight.uniform_(0.5, 2.0)
            bn.bias.uniform_(-1.0, 1.0)
    return bn.eval()


SHAPES = [(nn.BatchNorm1d, (6, 4)), (nn.BatchNorm1d, (6, 4, 5)), (nn.BatchNorm2d, (6, 4, 3, 3)),
          (nn.BatchNorm3d, (6, 4, 2, 3, 3)), (nn.SyncBatchNorm, (6, 4, 3, 3))]


@pytest.mark.parametrize("cls,shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_frozen_batchnorm_is_bit_identical_to_batchnorm_eval(cls, shape, affine):
    bn = _trained_bn(cls, shape, affine)
    frozen = fz.FrozenBatchNorm.from_batchnorm(bn)
    x = torch.randn(*shape) * 4
    assert torch.equal(frozen(x), bn(x))
    assert torch.equal(frozen.train()(x), bn(x))  # its own train flag changes nothing


def test_frozen_batchnorm_has_no_parameters_and_no_forward_moves_its_buffers():
    frozen = fz.FrozenBatchNorm.from_batchnorm(_trained_bn(nn.BatchNorm2d, (6, 4, 3, 3))).train()
    assert list(frozen.parameters()) == []
    before = {k: v.clone() for k, v in frozen.state_dict().items()}
    with torch.no_grad():
        frozen(torch.randn(8, 4, 3, 3) + 10)
    assert all(torch.equal(before[k], v) for k, v in frozen.state_dict().items())
    assert "source=BatchNorm2d" in repr(frozen)
    with pytest.raises(ValueError, match=r"expects input \(N, 4, \.\.\.\)"):
        frozen(torch.randn(2, 3, 3, 3))


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Sequential(nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4, affine=False)),
                         nn.Flatten(), nn.LazyLinear(2))


def test_freeze_batchnorm_converts_recursively_keeps_outputs_and_round_trips_exactly():
    model = _net()
    model.train()
    model(torch.randn(8, 3, 8, 8) + 1)
    model.eval()
    x = torch.randn(5, 3, 8, 8)
    y = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    frozen = fz.freeze_batchnorm(model)
    assert frozen is model
    assert isinstance(model[1], fz.FrozenBatchNorm) and isinstance(model[3][1], fz.FrozenBatchNorm)
    assert not fz.batchnorm_layers(model)
    model.train()  # a frozen model stays frozen through .train()
    assert torch.equal(model(x), y)
    back = fz.unfreeze_batchnorm(model)
    assert type(back[1]) is nn.BatchNorm2d and type(back[3][1]) is nn.BatchNorm2d
    assert back[1].weight.requires_grad and back[3][1].weight is None
    assert set(back.state_dict()) == set(state)
    assert all(torch.equal(state[k], v) for k, v in back.state_dict().items())
    assert torch.equal(back.eval()(x), y)


def test_freeze_batchnorm_returns_the_replacement_for_a_bare_bn_and_shares_a_shared_bn():
    bn = _trained_bn(nn.BatchNorm1d, (6, 4))
    assert isinstance(fz.freeze_batchnorm(bn), fz.FrozenBatchNorm)
    shared = nn.BatchNorm1d(4)
    model = fz.freeze_batchnorm(nn.Sequential(shared, nn.ReLU(), shared))
    assert model[0] is model[2]


def test_freeze_batchnorm_refuses_a_layer_without_running_statistics_and_names_it():
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.BatchNorm1d(3, track_running_stats=False)))
    with pytest.raises(ValueError, match=r"^freeze_batchnorm: BatchNorm '1\.0' has no running_mean/running_var buffers "
                                         r"\(its track_running_stats flag is False\)"):
        fz.freeze_batchnorm(model)
    assert isinstance(model[1][0], nn.BatchNorm1d)  # refused before anything changed
    with pytest.raises(ValueError, match="num_features must be a positive integer"):
        fz.FrozenBatchNorm(0)


def test_pinned_backbone_bn_stays_in_eval_and_unchanged_through_parent_train():
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    model = nn.Sequential(backbone, nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    fz.pin_eval(backbone)
    model.train()
    with FreezeAudit(model, warn=False) as a:
        model(torch.randn(8, 3, 8, 8))
    assert backbone[1].training is False and model[2].training is True
    assert a.moved("0").empty
    assert a.modes().set_index("module").loc["0.1", "mode"] == "eval"


def test_pin_norm_eval_pins_only_norm_layers_so_dropout_still_follows_train():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.InstanceNorm1d(4, affine=True))
    assert fz.pin_norm_eval(model) == ["1", "3"]
    model.train()
    assert [m.training for m in model] == [True, False, True, False]


def test_batch_stats_report_measures_modes_after_train_and_eval_and_restores_flags():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.BatchNorm1d(4, track_running_stats=False),
                          nn.LayerNorm(4), nn.BatchNorm1d(4))
    fz.pin_eval(model[4])
    model.eval()
    model[0].train()
    flags = [m.training for m in model.modules()]
    rep = fz.batch_stats_report(model).set_index("layer")
    assert [m.training for m in model.modules()] == flags
    assert rep["batch_stats_after_train"].to_dict() == {"1": True, "2": True, "3": False, "4": False}
    assert rep["batch_stats_after_eval"].to_dict() == {"1": False, "2": True, "3": False, "4": False}
    assert rep.loc["3", "stats_after_train"] == "per-sample"
    assert rep["updates_running_stats_after_train"].to_dict() == {"1": True, "2": False, "3": False, "4": False}
    assert rep.loc["4", "pinned"]


@pytest.mark.parametrize("heading", ["**The library on your own model, in ten lines.**",
                                     "## Use the library on your own model"])
def test_readme_library_snippet_passes_on_a_correctly_frozen_backbone(heading):
    """The README's library snippets (the ten-line one at the top and 'Use the library on your own model'), read
    from README.md and run on a small model."""
    import pathlib
    import re

    import torch
    from torch import nn

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index(heading):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                          nn.Flatten())
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.backbone(x))

    torch.manual_seed(0)
    model = Net()
    model.train()
    with torch.no_grad():  # estimated statistics: neither the reset values nor a few updates old (stats_near_init)
        for _ in range(30):
            model(torch.randn(16, 3, 8, 8))
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)

    def train_one_epoch(m):
        m.train()
        for _ in range(3):
            loss = m(torch.randn(16, 3, 8, 8) + 2).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()

    ns = dict(model=model, x_old=torch.randn(8, 3, 8, 8), train_one_epoch=train_one_epoch)
    exec(snippet, ns)  # ends with audit.assert_frozen(model.backbone): raises if the backbone moved
    report = ns["audit"].report()
    assert report[report["module"].str.startswith("head")]["changed"].any()  # the head did train
    assert not report[report["module"].str.startswith("backbone")]["changed"].any()
