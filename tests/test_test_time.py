"""Chapter 8's design (issue 38, in progress): the parameters' checks, the test streams, and one small unit's
identities (checks of the code, not findings)."""

from __future__ import annotations

import math

import numpy as np
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


# --- the pre-registered claims (claims.py) on hand-made rows ---------------------------------------------------------

from bnstudy.study.experiments.test_time import claims as C  # noqa: E402


def _rows(seeds, prior_best=16.0, gain=0.2, noise=0.005, tent_best=1e-2):
    """Rows shaped like run_unit's: one stream, family and strength; two test batches; every method. The prior's
    accuracy peaks at ``prior_best``; every adapted method sits ``gain`` above the source."""
    rng = np.random.default_rng(sum(seeds))
    out = []
    for seed in seeds:
        base = 0.5 + 0.01 * rng.standard_normal()
        for b in (1, 8):
            def add(method, setting, acc):
                out.append(dict(seed=seed, family="noise", strength=1.0, stream="single", domain="B", test_batch=b,
                                method=method, setting=setting, accuracy=acc + noise * rng.standard_normal(),
                                routing_accuracy=math.nan))
            add("source", math.nan, base)
            for n in (0.0, 4.0, 16.0, 64.0):
                if not (n == 0 and b == 1):
                    add("prior", n, base + gain - 0.02 * abs(np.log2(max(n, 1) / prior_best)))
            add("dua", math.nan, base + gain / 2)
            add("routed", math.nan, base + gain)
            add("oracle", math.nan, base + gain)
            if b > 1:
                for lr in (1e-3, 1e-2, 1e-1):
                    add("tent", lr, base + gain - (0.1 if lr != tent_best else 0))
    return pd.DataFrame(out)


def test_settings_are_chosen_on_the_tuning_seeds_and_edges_are_flagged():
    tuning = _rows((100, 101, 102), prior_best=16.0)
    picks = C.choices(tuning).set_index(["test_batch", "method"])
    assert picks.loc[(8, "prior"), "setting"] == 16.0 and not picks.loc[(8, "prior"), "at_edge"]
    assert picks.loc[(8, "tent"), "setting"] == 1e-2
    # grids are closed by their limits (prior N = inf: the source; N = 0 and TENT's rate 0: test-batch
    # statistics): a choice at the largest N run is inside the grid; one at the smallest N > 0 is flagged only
    # at a test batch of one, where N = 0 is not run
    edge = C.choices(_rows((100, 101), prior_best=64.0)).set_index(["test_batch", "method"])
    assert edge.loc[(8, "prior"), "setting"] == 64.0 and not edge.loc[(8, "prior"), "at_edge"]
    low = C.choices(_rows((100, 101), prior_best=1.0)).set_index(["test_batch", "method"])
    assert low.loc[(1, "prior"), "setting"] == 4.0 and low.loc[(1, "prior"), "at_edge"]
    assert low.loc[(8, "prior"), "setting"] == 0.0 and not low.loc[(8, "prior"), "at_edge"]
    # no adaptation best: the prior chooses N = inf and its condition is the source's accuracy exactly
    worse = _rows((100, 101, 102), gain=-0.2)
    pick = C.choices(worse).set_index(["test_batch", "method"])
    assert pick.loc[(8, "prior"), "setting"] == math.inf and not pick.loc[(8, "prior"), "at_edge"]
    t = C.conditions(_rows((0, 1), gain=-0.2), worse).set_index(["seed", "test_batch", "condition"])["accuracy"]
    assert t.loc[(0, 8, "prior_tuned")] == t.loc[(0, 8, "source")]
    # TENT: its largest rate is an open end
    best_lr = _rows((100, 101), tent_best=1e-1)
    tent = C.choices(best_lr).set_index(["test_batch", "method"])
    assert tent.loc[(8, "tent"), "setting"] == 1e-1 and tent.loc[(8, "tent"), "at_edge"]
    # the reported seeds never inform a choice: a reported table that prefers another prior changes nothing
    reported = _rows(tuple(range(10)), prior_best=4.0)
    table = C.conditions(reported, tuning)
    chosen = table[(table.condition == "prior_tuned") & (table.test_batch == 8)]
    expected = reported[(reported.method == "prior") & (reported.setting == 16.0) & (reported.test_batch == 8)]
    assert np.allclose(sorted(chosen.accuracy), sorted(expected.accuracy))


def test_the_three_families_ask_every_cell_and_a_new_method_needs_no_code():
    tuning, reported = _rows((100, 101, 102)), _rows(tuple(range(10)))
    cl = C.claims(reported, tuning)
    assert set(cl.family) == {"gain", "mix", "route"}
    gain = cl[cl.family == "gain"].set_index("key")
    assert "gain_test_batch_single_noise_t1_b1" not in gain.index  # not run at a batch of one
    assert gain.loc["gain_routed_single_noise_t1_b8", "kind"] == "higher"
    # routing against the best batch method is asked only on mixed and class-sorted streams: none here
    assert (cl[cl.family == "route"].n == 0).all()
    # the design gains a batch size: its cells are asked with no new code
    more = pd.concat([reported, reported[reported.test_batch == 8].assign(test_batch=16)])
    more_t = pd.concat([tuning, tuning[tuning.test_batch == 8].assign(test_batch=16)])
    assert "mix_single_noise_t1_b16" in set(C.claims(more, more_t).key)


def test_mix_stops_reads_the_smallest_batch_from_which_it_is_never_shown_higher():
    rows = [dict(key=f"mix_single_noise_t1_b{b}", kind=k) for b, k in ((2, "higher"), (4, "higher"),
                                                                      (8, "not decided"), (16, "lower"))]
    t = pd.DataFrame(rows)
    assert C.mix_stops(t, "single", "noise", 1.0, (1, 2, 4, 8, 16)) == 8
    t.loc[3, "kind"] = "higher"
    assert math.isnan(C.mix_stops(t, "single", "noise", 1.0, (1, 2, 4, 8, 16)))
