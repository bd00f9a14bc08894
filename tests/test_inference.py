"""bnstudy.study.inference: the one inference layer, against statsmodels and scipy on random inputs, and on the cases
where the chapters' old copies disagreed, with their right answers."""

import gc
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import DescrStatsW

from bnstudy.study import inference as I

finite = st.floats(-1.0, 1.0, allow_nan=False, allow_infinity=False)
samples = st.lists(finite, min_size=2, max_size=30).filter(lambda v: np.ptp(v) > 1e-6)


def _exact(mean, sd, n=10, seed=0):
    z = np.random.default_rng(seed).standard_normal(n)
    return mean + sd * (z - z.mean()) / z.std(ddof=1)


@settings(max_examples=60, deadline=None)
@given(samples, st.sampled_from([0.9, 0.95, 0.99]))
def test_t_interval_is_scipys(v, conf):
    iv = I.t_interval(v, conf)
    ci = sps.ttest_1samp(v, 0).confidence_interval(conf)
    assert iv.n == len(v) and iv.mean == pytest.approx(np.mean(v))
    assert iv.low == pytest.approx(ci.low) and iv.high == pytest.approx(ci.high)


@settings(max_examples=60, deadline=None)
@given(samples, st.floats(0.001, 0.5))
def test_tost_is_statsmodels_and_matches_the_interval(v, margin):
    p = I.tost_p(v, margin)
    assert p == pytest.approx(DescrStatsW(np.asarray(v)).ttost_mean(-margin, margin)[0])
    iv = I.t_interval(v, 0.90)  # equivalent at 0.05 exactly when the 90% interval is inside the margins
    inside = -margin < iv.low and iv.high < margin
    if abs(p - 0.05) > 1e-9:
        assert (p < 0.05) == inside


@settings(max_examples=60, deadline=None)
@given(samples, st.sampled_from(["greater", "less"]))
def test_one_sided_is_scipys_one_sided_test(v, alt):
    assert I.one_sided_p(v, alt) == pytest.approx(sps.ttest_1samp(v, 0, alternative=alt).pvalue)
    assert I.two_sided_p(v) == pytest.approx(sps.ttest_1samp(v, 0).pvalue)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 1), st.just(float("nan"))), min_size=1, max_size=12))
def test_holm_is_statsmodels_on_the_finite_members(p):
    """Bit for bit (``I.holm`` inlines statsmodels' holm branch). The reference ``multipletests(method="holm")``
    ends with ``gc.collect()``, a quarter of a second in this process: the heap is frozen around it
    (``gc.freeze``), which leaves only this example's objects for that collection and changes no value."""
    out = I.holm(p)
    p = np.asarray(p)
    ok = ~np.isnan(p)
    assert np.isnan(out[~ok]).all()
    if ok.any():
        gc.freeze()
        try:
            ref = multipletests(p[ok], method="holm")[1]
        finally:
            gc.unfreeze()
        np.testing.assert_allclose(out[ok], ref)
        assert out[ok].tobytes() == ref.tobytes()


def test_holm_nan_does_not_set_every_adjusted_p_to_one():
    # one old copy sorted NaN first and reported 1.0 for every member
    out = I.holm([float("nan"), 0.001, 0.01])
    assert math.isnan(out[0]) and out[1] == pytest.approx(0.002) and out[2] == pytest.approx(0.01)


def test_the_issues_ten_differences_get_one_verdict():
    # mean 0.006, SD 0.02, 10 seeds, margin 0.02: chapters 1/3/6 said tie, chapter 2 no tie, chapter 4
    # inconclusive. The one convention (TOST at 0.05, the 90% interval inside ±0.02) says equivalent.
    x = _exact(0.006, 0.02)
    c = I.decide(x, margin=0.02)
    assert c.kind == "equivalent" and c.verdict == "equivalent within \u00b10.02"
    assert c.p_equivalence == pytest.approx(DescrStatsW(x).ttost_mean(-0.02, 0.02)[0])
    assert c.p_equivalence < 0.05
    # in a family of 3 the test runs at 0.05/3 and no longer decides
    assert I.decide(x, margin=0.02, family=I.Family(3)).kind == "not decided"


def test_a_resolved_small_effect_is_a_direction_with_its_estimate():
    x = _exact(0.006, 0.004)  # interval [0.003, 0.009]: inside the margin, and above zero
    c = I.decide(x, margin=0.02, higher="train mode higher", lower="train mode lower")
    assert c.verdict == "train mode higher" and c.low > 0 and c.high < 0.02


def test_degenerate_samples():
    assert I.decide([0.3], margin=0.02).verdict == "too few seeds"  # one seed is never "equivalent"
    assert I.decide([], margin=0.02).verdict == "too few seeds"
    assert math.isnan(I.tost_p([0.0], 0.02)) and math.isnan(I.two_sided_p([1.0]))
    c = I.decide([-0.05] * 4, margin=0.02, lower="pinned lower")  # zero spread, a constant shortfall
    assert c.verdict == "pinned lower" and c.low == c.high == -0.05 and c.p == 0.0
    assert I.decide([0.0] * 4, margin=0.02).kind == "equivalent"
    assert I.decide([0.0] * 4).kind == "not decided"  # no margin: nothing to be equivalent within
    assert I.one_sided_p([0.2] * 3, "greater") == 0.0 and I.one_sided_p([0.2] * 3, "less") == 1.0
    assert I.tost_p([0.03] * 3, 0.02) == 1.0


def test_nan_is_dropped_before_the_test():
    c = I.decide([0.01, float("nan"), 0.02, 0.015], margin=0.05)
    assert c.n == 3


def test_paired_differences_keeps_complete_pairs_only():
    df = pd.DataFrame(dict(seed=[0, 0, 1, 1, 2], mode=["a", "b", "a", "b", "a"], acc=[0.5, 0.4, 0.7, np.nan, 0.9]))
    d = I.paired_differences(df, "acc", "mode", "a", "b")
    assert d.index.tolist() == [0] and d.iloc[0] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="reference 'c' does not occur"):
        I.paired_differences(df, "acc", "mode", "a", "c")
    with pytest.raises(KeyError, match="no column 'x'"):
        I.paired_differences(df, "x", "mode", "a", "b")
    with pytest.raises(ValueError, match="more than one row"):
        I.paired_differences(pd.concat([df, df]), "acc", "mode", "a", "b")


def test_family_and_bad_input():
    assert I.Family(4).confidence == pytest.approx(0.9875) and I.Family(4).level == pytest.approx(0.0125)
    with pytest.raises(ValueError, match="m must be a positive integer"):
        I.Family(0)
    with pytest.raises(ValueError, match="alpha must be in"):
        I.Family(2, alpha=0.7)
    with pytest.raises(ValueError, match="margin must be positive"):
        I.tost_p([1, 2], 0)
    with pytest.raises(ValueError, match="confidence must be in"):
        I.t_interval([1, 2], 1.5)
    with pytest.raises(ValueError, match="alternative must be"):
        I.one_sided_p([1, 2], "two-sided")


def test_bootstrap_is_scipys_seeded_paired_bootstrap():
    x, y = _exact(0.1, 0.05, seed=1), _exact(0.0, 0.05, seed=2)
    iv = I.bootstrap_interval((x, y), lambda a, b: np.mean(a - b), n_resamples=999, seed=3)
    ref = sps.bootstrap((x, y), lambda a, b: np.mean(a - b), paired=True, vectorized=False, n_resamples=999,
                        method="percentile", rng=np.random.default_rng(3)).confidence_interval
    assert (iv.low, iv.high) == (ref.low, ref.high)
    assert iv == I.bootstrap_interval((x, y), lambda a, b: np.mean(a - b), n_resamples=999, seed=3)
    assert math.isnan(I.bootstrap_interval(([1.0],), np.mean).low)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=5, max_size=25))
def test_rank_correlation_is_spearman_and_its_interval_stays_in_range(pairs):
    x, y = np.array(pairs).T
    rho, iv, p = I.rank_correlation(x, y)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        assert math.isnan(rho)
        return
    ref = sps.spearmanr(x, y)
    assert rho == pytest.approx(ref.statistic) and (p == pytest.approx(ref.pvalue) or math.isnan(ref.pvalue))
    assert -1 <= iv.low <= rho <= iv.high <= 1


def test_exact_check_and_the_vocabulary():
    assert I.exact_check([0.0, 0.0]).verdict == "exact, checked =="
    c = I.exact_check([0.0, 1e-9])
    assert c.verdict == "not exact" and c.estimate == 1e-9
    for word in ("not decided", "too few seeds", "exact, checked ==", "equivalent within \u00b10.02"):
        assert I.is_verdict(word)
    assert I.is_verdict("pinned lower", directions=["pinned lower"])
    for word in ("tie", "inconclusive", "unresolved", "not separated", "resolved, within margin", "pinned lower"):
        assert not I.is_verdict(word)


def test_claims_table_adjusts_one_family_and_rejects_duplicate_keys():
    a, b = I.decide(_exact(0.05, 0.02), "a"), I.decide(_exact(0.01, 0.02, seed=4), "b")
    t = I.claims_table([a, b, I.exact_check([0], key="e")])
    assert list(t["key"]) == ["a", "b", "e"]
    np.testing.assert_allclose(t["p_adjusted"][:2], multipletests([a.p, b.p], method="holm")[1])
    assert math.isnan(t["p_adjusted"][2])
    with pytest.raises(ValueError, match="duplicate keys"):
        I.claims_table([a, a])


def test_clipped_interval_for_printing():
    iv = I.Interval(0.5, -1.025, 1.3, 10).clipped(-1, 1)
    assert (iv.low, iv.high) == (-1, 1)


def test_float_noise_around_a_tie_prints_no_warning():
    import warnings

    v = np.array([0.95, 0.95, 0.95]) - np.array([0.95, 0.95 + 1e-16, 0.95 - 1e-16])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        I.decide(v + 1e-17 * np.arange(3), margin=0.02)
        I.one_sided_p(np.array([1.0, 1.0 + 1e-15, 1.0 - 1e-15]), "greater")


# --- issue 24's later additions: verdicts on given intervals, bootstrap distributions, counts ---------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=12))
def test_decide_interval_matches_decide_on_a_t_interval(values):
    c = I.decide(values, "k", higher="up", lower="down")
    d = I.decide_interval(I.t_interval(values), "k", p=I.two_sided_p(values), higher="up", lower="down")
    assert (d.kind, d.verdict) == (c.kind, c.verdict)
    assert (d.low, d.high, d.n) == (c.low, c.high, c.n)


def test_decide_interval_without_ends_is_too_few_seeds():
    iv = I.Interval(0.3, float("nan"), float("nan"), 3)
    assert I.decide_interval(iv, "k").verdict == "too few seeds"
    assert I.decide_interval(I.Interval(0.1, -0.2, 0.4, 9), "k").verdict == "not decided"
    assert I.decide_interval(I.Interval(-0.3, -0.5, -0.1, 9), "k", lower="rho negative").verdict == "rho negative"


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=4, max_size=10), st.integers(0, 2**16))
def test_percentile_of_the_distribution_is_bootstrap_interval(values, seed):
    """The same resamples: the percentile interval of bootstrap_distribution is bootstrap_interval's."""
    x = np.asarray(values)
    dist = I.bootstrap_distribution(len(x), lambda i: x[i].mean(), n_resamples=300, seed=seed)
    assert dist.shape == (300,)
    iv = I.bootstrap_interval((x,), np.mean, 0.9, n_resamples=300, seed=seed)
    lo, hi = I.percentile_interval(dist, 0.9)
    if np.isfinite(iv.low):
        assert lo == pytest.approx(iv.low, abs=1e-12) and hi == pytest.approx(iv.high, abs=1e-12)


def test_bootstrap_needs_min_units_and_percentile_ignores_nan():
    assert math.isnan(I.bootstrap_interval((np.array([0.1, 0.5, 0.9]),), np.mean).low)  # 3 seeds < 4
    assert not math.isnan(I.bootstrap_interval((np.array([0.1, 0.5, 0.9, 0.2]),), np.mean).low)
    assert I.percentile_interval([np.nan, 1.0, 1.0]) == (1.0, 1.0)
    assert all(math.isnan(v) for v in I.percentile_interval([np.nan]))
    with pytest.raises(ValueError, match="n_units"):
        I.bootstrap_distribution(0, np.mean)


def test_intersection_union_p_is_the_largest_component():
    assert I.intersection_union_p([0.01, 0.04, 0.002]) == 0.04
    assert math.isnan(I.intersection_union_p([0.01, float("nan")]))
    assert math.isnan(I.intersection_union_p([]))


def test_at_resolution_removes_grid_artefacts():
    d = np.full(5, 0.1 + 0.2) - 90 / 300                       # an accuracy of 0.1 + 0.2 against a line at 90/300
    assert d[0] == pytest.approx(5.55e-17, rel=1e-2)           # the float artefact a zero-spread test calls a direction
    assert I.decide(d, "k").kind == "higher"
    assert I.decide(I.at_resolution(d), "k").kind == "not decided"


def test_claims_table_family_column():
    t = I.claims_table([I.decide([0.1, 0.2, 0.15], "a"), I.decide([0.0, 0.1, -0.1], "b")], family="f1")
    assert list(t.columns[:2]) == ["family", "key"] and set(t["family"]) == {"f1"}


def test_count_verdicts_counts_the_printed_verdicts_even_where_holm_would_show_a_direction():
    """One verdict per claim (issue 35): a cell whose Holm-adjusted p is below 0.05 but whose printed Bonferroni
    interval spans zero counts as its printed verdict, never as a direction; the kinds add up to m."""
    rng = np.random.default_rng(3)
    fam = I.Family(3)
    strong = rng.normal(1.0, 0.3, 10)
    null = rng.normal(0.0, 0.3, 10)
    # a medium effect whose Holm p is below 0.05 while its Bonferroni interval at m = 3 spans zero
    for scale in np.linspace(0.05, 0.5, 200):
        medium = null + scale
        t = I.claims_table([I.decide(strong, "s", family=fam), I.decide(medium, "m", family=fam),
                            I.decide(null, "n", family=fam)])
        row = t.set_index("key").loc["m"]
        if row["p_adjusted"] < 0.05 and row["kind"] != "higher":
            break
    else:
        pytest.fail("no medium effect separates Holm from the printed interval")
    c = I.count_verdicts(t)
    assert c["m"] == 3 and sum(c[k] for k in I.VERDICT_KINDS) == 3
    assert c["higher"] == int((t["kind"] == "higher").sum())
    assert c["higher"] < int(((t["p_adjusted"] < 0.05) & (t["estimate"] > 0)).sum())  # Holm would count one more
    with pytest.raises(KeyError, match="kind"):
        I.count_verdicts(t.drop(columns="kind"))
    with pytest.raises(ValueError, match="not a verdict kind"):
        I.count_verdicts(t.assign(kind="maybe"))


def test_count_kinds_and_one_sided_counts_are_the_printed_kinds():
    """Issue 35: one counts rule. count_kinds is each row's printed kind (count_verdicts sums it), whatever its
    Holm-adjusted p; count_one_sided counts the rows whose printed verdict shows that direction."""
    import pandas as pd

    from bnstudy.study import inference as inf
    t = pd.DataFrame({"estimate": [0.1, -0.2, 0.01, 0.3, 0.0, 0.4], "p_adjusted": [0.01, 0.04, 0.5, 0.001, 0.001, 0.9],
                      "kind": ["not decided", "lower", "equivalent", "too few seeds", "exact", "higher"],
                      "p_less_adjusted": [0.9, 0.02, 0.6, float("nan"), 1.0, 1.0],
                      "p_greater_adjusted": [0.03, 0.9, 0.4, float("nan"), 1.0, 0.001]})
    assert list(inf.count_kinds(t)) == list(t["kind"])
    c = inf.count_verdicts(t)
    assert (c["higher"], c["lower"], c["equivalent"], c["not decided"], c["too few seeds"], c["exact"], c["m"]) == \
        (1, 1, 1, 1, 1, 1, 6)
    assert inf.count_one_sided(t, "less") == 1 and inf.count_one_sided(t, "greater") == 1
    with pytest.raises(ValueError, match="alternative must be 'less' or 'greater'"):
        inf.count_one_sided(t, "two-sided")
    with pytest.raises(KeyError, match="kind"):
        inf.count_one_sided(t.drop(columns="kind"), "less")
