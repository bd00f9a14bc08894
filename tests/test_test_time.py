"""Chapter 8's design (issue 38, in progress): the parameters' checks, the test streams, and one small unit's
identities (checks of the code, not findings)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from bnstudy.study.experiments.test_time import run as R
from bnstudy.study.models import ConvBackbone, make_head


@pytest.mark.parametrize("override, param", [(dict(tuning_seeds=(0,)), "tuning_seeds"),
                                             (dict(test_batches=(1, 3)), "test_batches"),
                                             (dict(families=("fog",)), "families"),
                                             (dict(bank_samples=100), "bank_samples"),
                                             (dict(priors=(-1.0,)), "priors"),
                                             (dict(strengths=(0.0,)), "strengths")])
def test_bad_parameters_are_refused_by_name(override, param):
    with pytest.raises(ValueError, match=param):
        R.make_config("quick", **override)


def test_profiles_are_valid_and_tuning_seeds_are_never_reported():
    for profile in R.PROFILES:
        cfg = R.make_config(profile)
        assert not set(cfg.seeds) & set(cfg.tuning_seeds)
        assert {u.seed for u in cfg.units(cfg.tuning_seeds)} == set(cfg.tuning_seeds)
    full = R.make_config("full")
    assert len(full.seeds) >= 10 and max(full.test_batches) >= 64 and min(full.test_batches) == 1


def _unit(**kw):
    base = dict(seed=0, family="affine", strength=1.0, test_batches=(1, 4), n_eval=16, bank_samples=256,
                priors=(0.0, 16.0, math.inf), tent_lrs=(1e-2,))
    return R.UnitConfig(**{**base, **kw})


def test_the_streams_hold_the_same_samples_in_their_orders():
    u = _unit(family="noise")
    s = R.streams(u)
    assert set(s) == {("single", d) for d in R.DOMAINS} | {("class_sorted", d) for d in R.DOMAINS} | {("mixed", "all")}
    for d in R.DOMAINS:
        (xs, ys, _), (xc, yc, _) = s["single", d], s["class_sorted", d]
        assert torch.equal(torch.sort(yc).values, yc) and not torch.equal(ys, yc)
        assert sorted(map(tuple, xs.flatten(1)[:, :3].tolist())) == sorted(map(tuple, xc.flatten(1)[:, :3].tolist()))
    x, y, dom = s["mixed", "all"]
    assert len(y) == 3 * u.n_eval and set(dom.tolist()) == {1, 2, 3}
    assert not torch.equal(dom, torch.sort(dom).values)  # interleaved, not domain after domain


def _source(seed=0):
    torch.manual_seed(seed)
    bb = ConvBackbone(3)
    with torch.no_grad():
        for x in (torch.randn(64, 3, 32, 32) for _ in range(3)):
            bb.train()(x)
    head = make_head("linear", bb.out_features, 10)
    return dict(backbone=bb.state_dict(), head_a=head.state_dict(), task_a_accuracy=math.nan)


def test_one_unit_keeps_the_designs_identities():
    out = R.run_unit(_unit(), _source())
    df = pd.DataFrame(out["records"])
    runs = df[df.method != "mismatch"]
    # the refused or undefined combinations are absent: test-batch statistics and TENT at a test batch of one
    assert runs.query("method == 'prior' and setting == 0 and test_batch == 1").empty
    assert runs.query("method == 'tent' and test_batch == 1").empty
    # every other (stream, domain, test batch, method, setting) exactly once
    assert not runs.duplicated(["stream", "domain", "test_batch", "method", "setting"]).any()
    # 7 stream-domains; per batch size 3 per-sample methods, 3 priors and DUA, less prior 0 at b = 1, plus TENT at b = 4
    assert len(runs) == 7 * ((7 - 1) + (7 + 1))
    # prior = inf is the source network's eval output; per-sample methods do not depend on the test batch
    src = runs[runs.method == "source"].set_index(["stream", "domain", "test_batch"]).accuracy
    inf = runs[(runs.method == "prior") & (runs.setting == math.inf)].set_index(["stream", "domain", "test_batch"])
    assert (inf.accuracy - src.loc[inf.index]).abs().max() <= 1 / 48
    for m in ("source", "routed", "oracle"):
        assert runs[runs.method == m].groupby(["stream", "domain"]).accuracy.nunique().max() == 1
    # the oracle routes every sample home; the router's accuracy is a fraction
    assert runs[runs.method == "routed"].routing_accuracy.between(0, 1).all()
    assert len(df[df.method == "mismatch"]) == len(R.DOMAINS)
