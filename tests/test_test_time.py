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


# --- the page: its notes (each flipped), its prose, its answer box ---------------------------------------------------

def _page_tables():
    from bnstudy.study.experiments.test_time import claims as C
    tuning, reported = _rows((100, 101, 102)), _rows(tuple(range(10)))
    rows = pd.concat([reported.assign(stream=s) for s in ("single", "mixed", "class_sorted")], ignore_index=True)
    tune = pd.concat([tuning.assign(stream=s) for s in ("single", "mixed", "class_sorted")], ignore_index=True)
    rows = pd.concat([rows, rows[(rows.stream == "single") & (rows.method == "source") & (rows.test_batch == 8)]
                      .assign(method="mismatch", test_batch=0, accuracy=0.1)], ignore_index=True)
    rows["unit_wall_s"] = tune["unit_wall_s"] = 1.0
    cfg = R.make_config("quick", families=("noise",), test_batches=(1, 8))
    cl = C.claims(rows, tune)
    return C, cl, C.page_numbers(rows, tune, cl, cfg)


def test_every_note_key_has_exactly_one_sentence_and_each_rule_flips():
    from bnstudy.study.inference import with_numbers
    C, cl, N = _page_tables()
    words = C.page_words(cl, N)
    assert {"lead", "collapse", "anchor_schneider", "anchor_dobler", "anchor_niu"} <= set(words)
    route = {f"route_routed_{s}_{k}": 0 for s in ("mixed", "class_sorted") for k in ("higher", "lower")}
    cells = {f"route_routed_{s}_cells": 4 for s in ("mixed", "class_sorted")}
    lead = lambda **kw: C.notes(C.NOTES, cl, with_numbers(N, {**route, **cells, **kw}))["lead"]  # noqa: E731
    assert lead(route_routed_mixed_higher=4).startswith("**Route the sample")
    assert lead(route_routed_mixed_higher=4, route_routed_mixed_lower=1).startswith("**Neither everywhere.**")
    assert lead(route_routed_mixed_higher=1).startswith("**Not shown either way.**")
    gain = lambda **kw: C.notes(C.NOTES, cl, with_numbers(N, {  # noqa: E731
        "gain_test_batch_class_sorted_cells": 4, "gain_test_batch_class_sorted_higher": 0, **kw}))
    assert "do not adapt" in gain(gain_test_batch_class_sorted_lower=2)["collapse"]
    assert "do not adapt" not in gain(gain_test_batch_class_sorted_lower=1)["collapse"]
    assert gain(gain_test_batch_class_sorted_lower=2)["anchor_niu"].startswith("**Same direction.**")
    assert gain(gain_test_batch_class_sorted_lower=1)["anchor_niu"].startswith("**Not shown in most cells.**")
    from bnstudy.study.inference import number
    top = number(N, "cfg_bmax")
    mixed = lambda k, b: C.notes(C.NOTES, cl, with_numbers(N, {"gain_test_batch_mixed_lower": k,  # noqa: E731
                                                                "dobler_lower_bmax": b}))["anchor_dobler"]
    assert mixed(1, 2).startswith("**In part: below only at small test batches.**")
    assert mixed(1, top).startswith("**In part: below up to the largest test batch.**")
    assert mixed(0, 0).startswith("**Not the same direction.**")
    b1 = lambda h, lo, pos: C.notes(C.NOTES, cl, with_numbers(N, {  # noqa: E731
        "b1_prior_tuned_single_higher": h, "b1_prior_tuned_single_lower": lo, "b1_prior_tuned_single_cells": 2,
        "schneider_positive": pos}))["anchor_schneider"]
    assert b1(1, 0, 2).startswith("**Same direction.**")
    assert b1(0, 0, 2).startswith("**Same direction in the estimates, shown in 0 of 2.**")
    assert b1(0, 0, 1).startswith("**Not shown.**") and b1(0, 1, 2).startswith("**Not shown.**")


def test_the_mix_stops_sentence_covers_every_outcome():
    from bnstudy.study.inference import with_numbers
    C, cl, N = _page_tables()
    say = lambda **kw: C.page_words(cl, with_numbers(N, kw))["stops_single"]  # noqa: E731
    assert say(stops_single_min=8, stops_single_max=8, stops_single_never=0).startswith(
        "the mix was no longer shown above test-batch statistics from a test batch of 8 (at that batch")
    assert "of 8 to 32, depending" in say(stops_single_min=8, stops_single_max=32, stops_single_never=1)
    assert say(stops_single_min=math.nan, stops_single_max=math.nan, stops_single_never=1,
               stops_single_cells=1) == "the mix was still shown above test-batch statistics at the largest batch in all 1"


def test_per_sample_methods_are_the_same_on_every_stream_at_a_batch_of_one():
    """A batch of one holds one sample whatever the stream, and routing decides per sample at every batch: the
    streams hold the same samples, so these means are equal (an identity of the design, checked ==)."""
    import pandas as pd
    from pathlib import Path
    rel = Path(__file__).resolve().parent.parent / "release" / "08_test_time.csv"
    if not rel.exists():
        pytest.skip("chapter 8 not in the release yet")
    rows = pd.read_csv(rel)
    one = rows[(rows.test_batch == 1) & rows.method.isin(["prior", "routed", "oracle", "source"])]
    per = one.groupby(["seed", "family", "strength", "stream", "method", "setting"], dropna=False).accuracy.mean()
    wide = per.unstack("stream")
    assert len(wide) and (wide["single"].round(12) == wide["class_sorted"].round(12)).all()
    assert (wide["single"].round(12) == wide["mixed"].round(12)).all()


def test_the_page_types_no_outcome_and_leads_with_its_answer():
    import json
    from pathlib import Path

    from bnstudy.study.experiments.test_time import claims as C
    from test_unknown_task import _markdown_prose, typed_outcomes

    nb = Path(__file__).resolve().parent.parent / "chapters" / "08_test_time.ipynb"
    compound = [d for d in C.DIRECTIONS if " " in d]  # the bare "higher" / "lower" are ordinary words here
    assert typed_outcomes(_markdown_prose(nb), compound) == []
    cells = json.loads(nb.read_text())["cells"]
    first = "".join(cells[0]["source"]).split("\n")
    assert first[0].startswith("# ") and first[2] == "```{admonition} The answer" and first[3] == ":class: answer"
    assert "{glue:md}`ch08_lead`" in "".join(cells[0]["source"])
    md = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert md.count("```{glue:figure} ch08_fig_") == md.count(":alt: ") == 3
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(len("".join(c["source"]).split("\n")) <= 25 for c in code)


def test_the_advice_and_the_anchor_notes_flip_with_their_numbers():
    from bnstudy.study.inference import with_numbers
    C, cl, N = _page_tables()
    at = lambda key, **kw: C.notes(C.NOTES, cl, with_numbers(N, kw))[key]  # noqa: E731
    assert "added nothing beyond the book's margin" in at("anchor_wang", wang_diff_mean=0.001, wang_diff_max=0.01)
    assert at("anchor_wang", wang_diff_max=0.01).startswith("**Not the same direction.**")
    assert "added nothing" not in at("anchor_wang", wang_diff_mean=0.03, wang_diff_max=0.05)
    # referee (stop 53): identities counted apart from findings; the route family's DUA-style references
    assert at("identities", ident_mix=7, ident_mix_equivalent=7, ident_gain_prior=8).startswith(
        "Identities, not findings: in 7 of the mix family's cells")
    assert at("identities", ident_mix=0, ident_gain_prior=0).startswith("No tuned prior reduced")
    assert "and 41 of routing's" in at("dua_ref", route_ref_dua=53, route_higher_ref_dua=41)
    assert at("dua_ref", route_ref_dua=0).startswith("The DUA-style update was the best batch method in none")
    lead = at("lead")  # the lead says what routing was given and counts the wins that need a mixed batch
    assert "unlabelled images of each exact test domain" in lead and "at test batches of two or more" in lead
    assert "by more than the book's margin" in lead and "pooled over the domains" in lead
    for key in ("mismatch_says",):  # every answer says what was measured
        assert "gain at the largest test batch on single-shift streams" in at(key)
    say = lambda **kw: at("mismatch_says", **{"mm_cells_low": 0.5, "mm_cells_high": 0.9, "mm_sign_agreement": 0.6,  # noqa
                                             "mm_base_rate": 0.8, **kw})
    assert say().startswith("Measured before adapting, the mismatch did not tell whether adapting gains")
    assert say(mm_sign_agreement=0.9).startswith("Measured before adapting, the mismatch told whether")
    assert "was not shown to predict the gain" in say(mm_cells_low=-0.1)
    route = {f"route_routed_{s}_{k}": 0 for s in ("mixed", "class_sorted") for k in ("higher", "lower")}
    cells = {f"route_routed_{s}_cells": 4 for s in ("mixed", "class_sorted")}
    assert at("what_to_do", **{**route, **cells, "route_routed_mixed_higher": 4}).startswith("If a deployment knows")
    assert at("what_to_do", **{**route, **cells, "route_routed_mixed_higher": 1}).startswith("Compare routing")


def test_the_main_table_marks_tent_where_it_equals_test_batch_statistics_to_the_digits_shown():
    """Referee (stop 53): TENT's row repeated test-batch statistics' numbers unmarked. The mark says only what the
    table shows (the tuned rate is positive in some such cells, with an effect below the digits shown)."""
    C, cl, N = _page_tables()
    means = pd.DataFrame([dict(stream="single", condition=c, test_batch=8, mean=0.9, ci_low=0.89, ci_high=0.91,
                               n_seeds=10) for c in ("source", "test_batch", "tent_tuned")])
    tab = C.main_table(means, cl.iloc[:0], [8])
    assert tab.loc["TENT"].iloc[0] == "= test-batch statistics (to the digits shown)"
    means.loc[means.condition == "tent_tuned", "mean"] = 0.95
    assert C.main_table(means, cl.iloc[:0], [8]).loc["TENT"].iloc[0].startswith("0.950")
