"""Statistic banks (bnstudy.study.banks): selection moves buffers only, round trips keep every bank."""

import io

import pytest
import torch

from bnstudy.audit import FreezeAudit
from bnstudy.study.banks import StatisticBank
from bnstudy.study.models import ConvBackbone


def _trained_bank(seed: int = 0) -> StatisticBank:
    torch.manual_seed(seed)
    model = ConvBackbone(3, (4, 8))
    model.requires_grad_(False)
    bank = StatisticBank(model, n_banks=3)
    for k, shift in ((1, 2.0), (2, -1.5)):
        with bank.use(k):
            model.train()
            for _ in range(3):
                model(torch.randn(8, 3, 16, 16) * (1 + k) + shift)
    model.eval()
    return bank


def test_bank_selection_changes_only_buffers():
    bank = _trained_bank()
    with FreezeAudit(bank, warn=False) as audit:
        bank.select(1)
    moved = audit.moved()
    assert len(moved) > 0
    assert set(moved["kind"]) == {"buffer"}
    # the live slot and the selected index moved; the stored banks did not
    assert all(t.startswith("model.") or t == "selected" for t in moved["tensor"])
    assert any(t.endswith("running_mean") for t in moved["tensor"])
    assert audit.moved("model", tol=0)["kind"].eq("buffer").all()
    assert not (audit.report().query("kind == 'param'")["changed"]).any()


def test_use_restores_previous_bank_and_keeps_updates_in_bank():
    bank = _trained_bank()
    layer = bank.layer_names[0]
    before = {k: bank.statistics(k)[layer][0].clone() for k in range(3)}
    live0 = bank.model.blocks[0].norm.running_mean.clone()
    with bank.use(2):
        assert torch.equal(bank.model.blocks[0].norm.running_mean, before[2])
        bank.model.train()
        bank.model(torch.randn(8, 3, 16, 16) + 5.0)
        bank.model.eval()
    assert int(bank.selected) == 0
    assert torch.equal(bank.model.blocks[0].norm.running_mean, live0)
    assert not torch.equal(bank.statistics(2)[layer][0], before[2])   # the update landed in bank 2
    assert torch.equal(bank.statistics(1)[layer][0], before[1])


def test_bank_zero_is_the_original_model_bit_for_bit():
    torch.manual_seed(1)
    model = ConvBackbone(3, (4, 8)).eval()
    x = torch.randn(5, 3, 16, 16)
    ref = model(x)
    bank = StatisticBank(model, 2)
    with bank.use(1):
        model.train(); model(x + 3.0); model.eval()
    with bank.use(0):
        out = model(x)
    assert (out - ref).abs().max().item() == 0


def test_state_dict_round_trip_restores_every_bank():
    bank = _trained_bank()
    bank.select(2)
    buf = io.BytesIO()
    torch.save(bank.state_dict(), buf)
    torch.manual_seed(99)
    fresh = StatisticBank(ConvBackbone(3, (4, 8)), n_banks=3)
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    assert int(fresh.selected) == 2
    for k in range(3):
        a, b = bank.statistics(k), fresh.statistics(k)
        for n in a:
            assert torch.equal(a[n][0], b[n][0]) and torch.equal(a[n][1], b[n][1])
    for (n, p), (_, q) in zip(bank.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(p, q), n


def test_blend_of_one_hot_weights_matches_the_bank():
    bank = _trained_bank()
    x = torch.randn(4, 3, 16, 16)
    with bank.use(1):
        ref = bank.model(x)
    w = torch.tensor([[0.0, 1.0, 0.0]] * 4)
    with bank.use_blend(w):
        out = bank.model(x)
    assert torch.allclose(out, ref, atol=1e-5)


def test_blended_statistics_are_mixture_moments():
    bank = _trained_bank()
    w = torch.tensor([[0.25, 0.75, 0.0]])
    n = bank.layer_names[0]
    (m0, v0), (m1, v1) = bank.statistics(0)[n], bank.statistics(1)[n]
    mean, var = bank.blended_statistics(w)[n]
    assert torch.allclose(mean[0], 0.25 * m0 + 0.75 * m1, atol=1e-6)
    assert torch.allclose(var[0], 0.25 * (v0 + m0 ** 2) + 0.75 * (v1 + m1 ** 2) - mean[0] ** 2, atol=1e-5)


@pytest.mark.parametrize("bad", [1, 0, True, 2.0])
def test_bank_count_is_checked(bad):
    with pytest.raises(ValueError, match="n_banks"):
        StatisticBank(ConvBackbone(3, (4,)), bad)


def test_bank_index_is_checked():
    bank = StatisticBank(ConvBackbone(3, (4,)), 2)
    with pytest.raises(ValueError, match="0..1"):
        bank.select(2)


def test_model_without_batchnorm_is_refused():
    with pytest.raises(ValueError, match="no BatchNorm"):
        StatisticBank(ConvBackbone(3, (4,), norm="group"), 2)
