"""Freeze modes say what they do, and do it."""

import pytest
import torch
from torch import nn

from bnstudy import freeze as fz
from bnstudy.study.models import ConvBackbone, make_head
from bnstudy.study.modes import MODES, TransferModel, get_mode


def _small_model(head="linear"):
    return TransferModel(ConvBackbone(3, (4, 8)), make_head("linear", 8, 10), make_head(head, 8, 10, hidden=6))


def _buffers(module):
    return {k: v.clone() for k, v in module.named_buffers()}


@pytest.mark.parametrize("name", list(MODES))
@pytest.mark.parametrize("head", ["linear", "mlp_bn"])
def test_only_the_buffers_a_mode_declares_change(name, head):
    mode = get_mode(name)
    m = _small_model(head)
    mode.apply(m)
    m.train()  # what every training loop does; pins must survive it
    parts = {"backbone": m.backbone, "head_b": m.head_b}
    if m.backbone_b is not None:
        parts["backbone_b"] = m.backbone_b
    before = {k: _buffers(v) for k, v in parts.items()}
    m.forward_b(torch.randn(8, 3, 16, 16) * 2 + 1)
    for part, mod in parts.items():
        after = dict(mod.named_buffers())
        changed = any(not torch.equal(before[part][k], after[k]) for k in after)
        has_buffers = len(after) > 0
        assert changed == (part in mode.buffers_may_change and has_buffers), (name, head, part)


def test_pinned_backbone_survives_parent_train_call():
    m = _small_model()
    get_mode("backbone_eval").apply(m)
    m.train()
    assert not any(mod.training for mod in m.backbone.modules())
    assert m.head_b.training


def test_separate_stats_copy_shares_parameters_but_not_buffers():
    m = _small_model()
    get_mode("separate_stats").apply(m)
    pa, pb = dict(m.backbone.named_parameters()), dict(m.backbone_b.named_parameters())
    assert all(pa[k] is pb[k] for k in pa)
    ba, bb = dict(m.backbone.named_buffers()), dict(m.backbone_b.named_buffers())
    assert all(ba[k].data_ptr() != bb[k].data_ptr() for k in ba)


def test_apply_names_what_is_missing_on_a_foreign_model():
    with pytest.raises(TypeError, match="head_a"):
        get_mode("train_mode").apply(nn.Module())


def test_get_mode_lists_allowed_names():
    with pytest.raises(ValueError, match="choose one of \\['train_mode', 'backbone_eval', 'all_eval', 'separate_stats'\\]"):
        get_mode("nope")


def test_pinned_model_survives_pickling_and_stays_pinned(tmp_path):
    m = _small_model()
    fz.pin_eval(m.backbone)
    torch.save(m, tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=False)
    back.train()
    assert fz.is_pinned(back.backbone)
    assert not any(mod.training for mod in back.backbone.modules())
    assert back.head_b.training
