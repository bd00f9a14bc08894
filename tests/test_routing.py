"""Routers (bnstudy.study.routing): each picks bank k for inputs from bank k's own distribution."""

import pytest
import torch

from bnstudy.study.banks import StatisticBank
from bnstudy.study.models import ConvBackbone
from bnstudy.study.routing import (NearestStatistics, OracleRouter, SoftMixture, StatisticsClassifier, pool_moments,
                             routed_forward, sample_moments)

SHIFTS = ((0.0, 1.0), (3.0, 1.0), (-2.0, 3.0))   # (brightness, contrast) of each bank's distribution


def _draw(k, n, g):
    b, c = SHIFTS[k]
    return c * torch.randn(n, 3, 16, 16, generator=g) + b


@pytest.fixture(scope="module")
def bank():
    torch.manual_seed(0)
    model = ConvBackbone(3, (4, 8)).requires_grad_(False)
    bank = StatisticBank(model, 3)
    g = torch.Generator().manual_seed(1)
    for k in range(3):
        with bank.use(k):
            model.train()
            for _ in range(40):
                model(_draw(k, 16, g))
    model.eval()
    return bank


@pytest.mark.parametrize("router_kind", ["first", "all", "mean", "classifier", "mixture"])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_router_picks_the_bank_of_its_own_distribution(bank, router_kind, batch_size):
    g = torch.Generator().manual_seed(2)
    if router_kind == "classifier":
        router = StatisticsClassifier(bank).fit([_draw(k, 64, g) for k in range(3)], batch_size)
    elif router_kind == "mixture":
        router = SoftMixture(bank, temperature=0.5)
    elif router_kind == "mean":
        router = NearestStatistics(bank, "first", "mean")
    else:
        router = NearestStatistics(bank, router_kind)
    for k in range(3):
        idx = router.route(_draw(k, 16, g), batch_size)
        assert idx.shape == (16,)
        assert (idx == k).all(), (router_kind, k, idx)


def test_pooled_moments_equal_direct_batch_statistics(bank):
    x = torch.randn(8, 3, 16, 16)
    mom = sample_moments(bank, x, "first")
    (mean, var), = pool_moments(mom, 4).values()
    with torch.no_grad():
        h = bank.model.blocks[0].conv(x[:4]).double()
    assert torch.allclose(mean[0], h.mean((0, 2, 3)), atol=1e-10)
    assert torch.allclose(var[0], h.var((0, 2, 3), unbiased=False), atol=1e-10)


def test_oracle_routed_output_is_bit_identical_to_the_bank(bank):
    x = _draw(1, 12, torch.Generator().manual_seed(3))
    with bank.use(1):
        ref = bank.model(x)
    out = routed_forward(bank, x, OracleRouter(1), batch_size=4)
    assert (out - ref).abs().max().item() == 0


def test_per_sample_routing_does_not_depend_on_the_other_samples(bank):
    g = torch.Generator().manual_seed(4)
    x = torch.cat([_draw(0, 4, g), _draw(2, 4, g)])
    router = NearestStatistics(bank)
    idx = router.route(x, batch_size=1)
    assert torch.equal(idx, torch.cat([router.route(x[i:i + 1], 1) for i in range(8)]))
    assert torch.equal(idx, torch.tensor([0] * 4 + [2] * 4))
    out = routed_forward(bank, x, router, batch_size=1)
    for i in range(8):
        with bank.use(int(idx[i])):
            assert torch.allclose(out[i], bank.model(x[i:i + 1])[0], atol=1e-6)


def test_sample_moments_restore_train_flags(bank):
    bank.model.train()
    sample_moments(bank, torch.randn(2, 3, 16, 16), "all")
    assert bank.model.training and bank.model.blocks[0].norm.training
    bank.model.eval()


def test_bad_router_settings_raise(bank):
    with pytest.raises(ValueError, match="layers"):
        NearestStatistics(bank, "middle")
    with pytest.raises(ValueError, match="distance"):
        NearestStatistics(bank, "first", "l1")
    with pytest.raises(ValueError, match="temperature"):
        SoftMixture(bank, temperature=0)
    with pytest.raises(ValueError, match="multiple"):
        NearestStatistics(bank).route(torch.randn(5, 3, 16, 16), 2)
