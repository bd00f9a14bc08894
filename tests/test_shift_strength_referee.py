"""Chapter 3 after the full-profile referee: verdicts in the book's vocabulary, margins, unconditional crossing intervals, the
benefit above its no-shift value, twin lines held out together, budget net rows and the paired grid comparison.
Every rule on small hand-made tables, with the verdict flipping when the data do."""

import copy
import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnstudy.study.experiments.shift_strength import findings, run
from bnstudy.study.inference import Family, holm
from bnstudy.study.inference import _slug, number
from test_shift_strength import _cfg10, _table10, analyse, claim, shared_findings


def _blur(df, net):
    """``df`` with the blur level's train_mode task A set so that its per-seed net effect is ``net(seed)``."""
    df = df.copy()
    rows = (df["corruption"] == "blur") & (df["corruption_level"] > 0) & (df["mode"] == "train_mode")
    df.loc[rows, "task_a_after"] = 0.6 + df.loc[rows, "seed"].map(net)
    return df


def test_a_direction_shown_takes_precedence_over_equivalence():
    # blur 1: net -0.003 with a tiny spread (the old "resolved, within margin"): a direction is shown, and it is
    # also inside the margin by the TOST; the verdict is the direction, the estimate says how small it is
    df = _blur(_table10(_cfg10(), seed_noise=0.001), lambda s: -0.003 + 0.0001 * (s - 1))
    lv = findings.level_table(df, margin=0.02)
    r = lv[(lv["metric"] == "net") & (lv["view"] == "raw") & (lv["line"] == "blur")].iloc[0]
    assert r["mean"] == pytest.approx(-0.003)
    assert r["verdict"] == "train mode lower" and r["kind"] == "lower"
    assert r["tost_p"] < Family(int(r["m_tests"])).level
    # the same level with a spread around 0: no direction; equivalent within a wide margin, not decided in a narrow one
    df0 = _blur(df, lambda s: 0.004 * (s - 1))
    r0 = lambda mg: findings.level_table(df0, margin=mg).query("metric == 'net' and view == 'raw' and line == 'blur'").iloc[0]
    assert r0(0.2)["verdict"] == "equivalent within \u00b10.2"
    assert r0(0.001)["verdict"] == "not decided"
    assert findings.KINDS == ("lower", "higher", "equivalent", "not decided", "too few seeds")


def test_crossover_counts_no_crossing_as_an_outcome_of_its_interval():
    x = np.array([1.0, 2.0, 3.0])
    rng = np.random.default_rng(0)
    # Half the seeds have a benefit that beats the cost at level 1, half do not: the crossing is a coin flip.
    cost = np.tile([0.0, 0.05, 0.2], (12, 1))
    benefit = np.tile([0.0, 0.0, 0.0], (12, 1)) + rng.normal(0, 1e-4, (12, 3))
    benefit[:, 0] = np.where(np.arange(12) % 2 == 0, 0.04, -0.02)
    r = findings.crossover(x, cost, benefit, n_boot=400, seed=0, min_effect=0.01)
    assert 0.2 < r["p_cross"] < 0.95
    assert np.isfinite(r["q_low"]) and r["q_high"] == math.inf          # "none" lies inside the interval
    assert np.isfinite(r["ci_high"])                                     # the conditional one hides it
    # A crossing every resample reproduces: both ends finite.
    benefit[:, 0] = 0.04
    r = findings.crossover(x, cost, benefit, n_boot=200, seed=0, min_effect=0.01)
    assert r["p_cross"] == 1.0 and np.isfinite(r["q_high"]) and 1.0 < r["q_low"] <= r["q_high"] < 2.0


def test_threshold_display_writes_none_for_an_open_end():
    th = pd.DataFrame(dict(line=["a", "b"], view=["raw", "raw"], threshold=[0.01, 0.01], estimate=[0.5, np.nan],
                           ci_low=[0.4, np.nan], ci_high=[0.6, np.nan], q_low=[0.45, np.inf], q_high=[np.inf, np.inf],
                           p_cross=[0.55, 0.0]))
    out = findings.threshold_display(th)
    assert out.loc[("a", "raw"), "tie < 0.01"] == "0.5 [0.45, none] (55%)"
    assert out.loc[("b", "raw"), "tie < 0.01"] == "none [none, none] (0%)"


def _with_noshift_gain(df, gain=0.03):
    """Pinned task B lower by ``gain`` everywhere: drifting gains ``gain`` even without a shift."""
    df = df.copy()
    df.loc[df["mode"] != "train_mode", "task_b"] -= gain
    return df


@functools.lru_cache(maxsize=None)
def _noshift_gain_findings_once():
    return analyse(_with_noshift_gain(_table10(_cfg10(), seed_noise=0.001)), n_boot=20, n_boot_select=20)


def noshift_gain_findings():
    """``(claims, numbers)``: ``analyse(_with_noshift_gain(_table10(_cfg10(), seed_noise=0.001)), n_boot=20, n_boot_select=20)``,
    computed once per test process and handed out as a deep copy (test_shift_strength.shared_findings's rule)."""
    return copy.deepcopy(_noshift_gain_findings_once())


def test_vs_no_shift_view_removes_the_benefit_a_task_gains_without_a_shift():
    cfg = _cfg10()
    df = _with_noshift_gain(_table10(cfg, seed_noise=0.001))
    eff = findings.normalized_effects(findings.paired_effects(findings._main(df)), 0.1)
    both1 = eff[eff["s_both"] == 1.0]
    assert both1["benefit"].to_numpy() == pytest.approx(0.23)
    assert both1["benefit_0"].to_numpy() == pytest.approx(0.2)            # 0.23 - 0.03 at no shift
    assert both1["net_0"].to_numpy() == pytest.approx(0.2 - both1["cost"].to_numpy())
    lv = findings.level_table(df, margin=0.02)
    net = lv[lv["metric"] == "net"].set_index(["line", "strength", "view"])
    # brightness 1: cost 0.01*?, benefit from _effects plus the offset; the vs-no-shift view subtracts the offset
    assert net.loc[("brightness", 1.0, "vs no shift"), "mean"] == pytest.approx(
        net.loc[("brightness", 1.0, "raw"), "mean"] - 0.03)


def test_break_even_rate_only_where_the_cost_is_resolved():
    cfg = _cfg10()
    df = _table10(cfg, seed_noise=0.001)
    lv = findings.level_table(df, margin=0.02)
    net = lv[(lv["metric"] == "net") & (lv["view"] == "raw")].set_index(["line", "strength"])
    assert net.loc[("both", 1.0), "breakeven_rate"] == pytest.approx(0.2 / 0.3)
    # A cost whose interval spans 0: big seed-to-seed spread around a tiny mean -> no rate.
    df2 = _table10(cfg, seed_noise=0.2)
    lv2 = findings.level_table(df2, margin=0.02)
    net2 = lv2[(lv2["metric"] == "net") & (lv2["view"] == "raw")].set_index(["line", "strength"])
    assert np.isnan(net2.loc[("blur", 1.0), "breakeven_rate"])


def test_margin_counts_move_with_the_margin_and_sum_to_the_levels():
    # blur 1's net is 0 on average with a spread: equivalent within 0.2, not decided within 0.001; every other
    # level shows a direction at both margins (a direction does not depend on the margin)
    df = _blur(_table10(_cfg10(), seed_noise=0.001), lambda s: 0.004 * (s - 1))
    mc = findings.margin_counts(df, (0.001, 0.2))
    tot = mc.groupby(["view", "margin"])["n"].sum()
    assert (tot == 9).all()
    raw = mc[mc["view"] == "raw"].set_index(["margin", "kind"])["n"]
    assert raw.loc[(0.001, "equivalent")] == 0 and raw.loc[(0.001, "not decided")] == 1
    assert raw.loc[(0.2, "equivalent")] == 1 and raw.loc[(0.2, "not decided")] == 0
    assert raw.loc[(0.2, "lower")] + raw.loc[(0.2, "higher")] == raw.loc[(0.001, "lower")] + raw.loc[(0.001, "higher")] == 8
    assert list(findings.margin_display(mc).columns)[0] == "train mode lower"
    with pytest.raises(ValueError, match="margins"):
        findings.margin_counts(df, (0.0,))


def test_loo_errors_hold_twin_lines_out_together():
    # Twins t and t2 share their shifts; with t2 in the fit, t's cost is predicted exactly; without it, not.
    x = [0.0, 1.0, 2.0, 1.0, 2.0, 3.0, 4.0]
    y = [0.0, 0.5, 0.6, 0.5, 0.6, 0.7, 0.8]
    kinds = ["no shift", "t", "t", "t2", "t2", "o", "o"]
    leak = findings.loo_errors(x, y, kinds, ["t"])
    held = findings.loo_errors(x, y, kinds, ["t"], {"t": ("t", "t2")})
    assert leak["t"] == pytest.approx(0.0) and held["t"] == pytest.approx((0.5 - 0.7 / 3 + 0.6 - 1.4 / 3) / 2)


def test_budget_net_rows_and_their_verdicts():
    cfg = _cfg10(budget_levels=(0.25, 1.0), budget_steps=(200, 300))
    df = _table10(cfg, seed_noise=0.001)
    bn = findings.budget_net_table(df, margin=0.02).set_index(["t", "steps"])
    assert set(bn.index.get_level_values("steps")) == {100, 200, 300}
    assert bn.loc[(1.0, 300), "verdict"] == "train mode lower" and bn.loc[(1.0, 300), "mean"] < -0.05
    assert len(bn) == 6 and (bn["m"] == 6).all()              # the points printed together: one family
    C, F = analyse(df, n_boot=10, n_boot_select=10)
    want = sum(g.sort_index()["kind"].iloc[0] != g.sort_index()["kind"].iloc[-1]
               for _, g in bn.groupby(level="t"))
    assert number(F, "budget_net_n_flips") == want == 1            # t = 0.25's benefit shrinks with steps in _effects
    summary = number(F, "budget_net_summary")
    assert "t = 1: -" in summary and "; **train mode lower**)" in summary
    assert claim(C, "budget_net_1_s300")["verdict"] == "train mode lower"
    assert number(F, "budget_t_min") == 0.25 and claim(C, "convergence_weakest_train_mode")["verdict"] == "not decided"
    # At t = 1 and 300 steps cost and benefit both vanish: the net there is exactly 0, equivalent.
    late = (df["steps"] == 300) & (df["both_strength"] == 1.0)
    df.loc[late, "task_a_after"] = 0.6
    df.loc[late, "task_b"] = 0.35
    C2, F2 = analyse(df, n_boot=10, n_boot_select=10)
    assert number(F2, "budget_net_n_flips") == 2 and claim(C2, "budget_net_1_s300")["verdict"] == "equivalent within \u00b10.02"
    assert number(findings.findings(_table10(_cfg10(budget_levels=(1.0,), budget_steps=(200, 300)), seed_noise=0.001),
                                    n_boot=10, n_boot_select=10), "budget_net_n_flips") == 0


def test_referee_findings_on_a_hand_made_table():
    C, F = noshift_gain_findings()
    keys = set(F["key"])
    assert all(f"margin_counts_{_slug(v)}_m0_02_lower" in keys for v in findings.VIEWS)
    assert {m for m in ("m0_005", "m0_01", "m0_02", "m0_03", "m0_04") if f"margin_counts_raw_{m}_lower" in keys} == \
        {"m0_01", "m0_02", "m0_03"}
    assert sum(number(F, f"margin_counts_raw_m0_02_{_slug(k)}") for k in findings.KINDS) == number(F, "m_tests")
    assert number(F, "benefit_n_noshift") == pytest.approx(0.03 / 0.25)
    assert number(F, "cross_page_raw_both").endswith("of resamples cross")
    assert number(F, "t1_taska_train_seed_min") < number(F, "t1_taska_train_seed_max")
    assert number(F, "eval_se") == pytest.approx(math.sqrt(0.35 * 0.65 / number(F, "n_eval")))
    favour = findings.notes(findings.NOTES, C, F)["favour"]
    assert favour.startswith("no shift") == (number(F, "n_higher_raw") + number(F, "n_higher_vs_no_shift") == 0)
    assert number(F, "winner") in number(F, "indistinct")
    assert number(F, "winner_call").startswith("`statistics_mismatch(") and "network_mode=" in number(F, "winner_call")


def test_winner_call_names_the_train_pass_when_that_wins():
    df = _table10(_cfg10())
    eff = findings.paired_effects(findings._main(df))
    cost = eff.set_index(["seed", *run.POINT_COLS])["cost"]
    key = pd.MultiIndex.from_frame(df[["seed", *run.POINT_COLS]])
    df["mismatch_kl_train"] = 0.001 + cost.reindex(key).to_numpy()      # the train-pass KL predicts the cost exactly
    F = findings.findings(df, n_boot=10, n_boot_select=30)
    assert number(F, "winner") == "KL (train pass)" and 'network_mode="train"' in number(F, "winner_call")
    assert 'measure="kl"' in number(F, "winner_call")


def test_grid_compound_is_worded_from_the_paired_interval():
    cfg = _cfg10(grid_brightness=(0.0, 4.0), grid_contrast=(1.0, 5.0))
    df = _table10(cfg, seed_noise=0.001)
    C, F = analyse(df, n_boot=10, n_boot_select=10)
    assert number(F, "grid_n_shifted") == number(F, "grid_n_cells") - 1
    c = claim(C, "grid_compound")     # the corner (4, 5) is the both line's t = 1: cost 0.3 against 0.4, every seed
    assert c["estimate"] == pytest.approx(-0.1) and c["verdict"] == "combined shift costs less"
    assert c["confidence"] == pytest.approx(Family(2).confidence)   # two comparisons printed together
    # Make the corner cost wildly different per seed around the same mean: no direction is shown any more
    corner = (df["brightness"] == 4.0) & (df["contrast"] == 5.0) & (df["mode"] == "train_mode")
    base = df.loc[(df["brightness"] == 4.0) & (df["contrast"] == 1.0) & (df["mode"] == "train_mode")]
    df.loc[corner, "task_a_after"] = base.set_index("seed").loc[df.loc[corner, "seed"], "task_a_after"].to_numpy() \
        + np.where(df.loc[corner, "seed"] % 2 == 0, 0.2, -0.2) - 0.001
    C2, F2 = analyse(df, n_boot=10, n_boot_select=10)
    assert claim(C2, "grid_compound")["verdict"] == "not decided"


def test_mismatch_figure_shows_paired_differences_from_the_winner_and_tells_twins_apart():
    """Fig. 6 (referee ch3 item 11): the last panel holds the non-winners' score differences; twin lines differ."""
    import matplotlib
    matplotlib.use("Agg")
    from bnstudy.study.experiments.shift_strength import figures
    kinds = ["no shift", "noise", "noise", "same_noise", "same_noise", "no shift, same classes"]
    x = np.array([0.01, 0.1, 1.0, 0.1, 1.0, 0.01])
    cond = pd.DataFrame({"kind": kinds, "cost": [0.0, 0.1, 0.5, 0.05, 0.3, 0.0]})
    for c in ("cost", "mismatch_kl", "mismatch_mean_shift"):
        if c != "cost":
            cond[c] = x
        cond[c + "_lo"], cond[c + "_hi"] = cond[c] - 0.005, cond[c] + 0.005
    sel = {"KL": dict(score=0.1, diff=0.0, diff_lo=0.0, diff_hi=0.0),
           "mean shift": dict(score=0.12, diff=0.02, diff_lo=0.01, diff_hi=0.03)}
    fig = figures.ch3_candidates(cond, sel, {"KL": "mismatch_kl", "mean shift": "mismatch_mean_shift"}, winner="KL")
    last = fig.axes[2]
    assert [t.get_text() for t in last.get_yticklabels()] == ["mean shift"]
    assert "score minus KL's" in last.get_xlabel()
    assert figures.CH3_KIND_MARKS["noise"][0] != figures.CH3_KIND_MARKS["same_noise"][0]
    assert min(t.get_fontsize() for t in fig.findobj(matplotlib.text.Text)) >= 9


def test_holm_resolves_at_least_what_bonferroni_resolves_and_counts_the_extra_levels():
    # four p-values; m = 4, alpha = 0.05: Bonferroni needs p < 0.0125 -> only 0.001; Holm: 0.004, 0.012*3=0.036 < 0.05,
    # then 0.03*2 = 0.06 stops -> two resolved, one of them extra
    adj = findings.holm([0.001, 0.012, 0.03, 0.5])
    assert adj == pytest.approx([0.004, 0.036, 0.06, 0.5])
    assert np.isnan(findings.holm([np.nan, 0.01])[0])


def test_threshold_display_blanks_the_vs_no_shift_crossings_at_threshold_zero():
    th = pd.DataFrame(dict(line=["a", "a", "a"], view=["vs no shift", "vs no shift", "raw"], threshold=[0.0, 0.01, 0.0],
                           estimate=[0.007, 0.5, 0.3], ci_low=[0.0, 0.4, 0.2], ci_high=[0.01, 0.6, 0.4],
                           q_low=[0.005, 0.45, 0.25], q_high=[0.01, 0.55, 0.35], p_cross=[1.0, 0.9, 0.8]))
    out = findings.threshold_display(th)
    assert out.loc[("a", "vs no shift"), "tie < 0"] == findings.ARTEFACT_CELL          # an artefact of the view: blanked
    assert out.loc[("a", "vs no shift"), "tie < 0.01"] == "0.5 [0.45, 0.55] (90%)"  # other thresholds kept
    assert out.loc[("a", "raw"), "tie < 0"] == "0.3 [0.25, 0.35] (80%)"            # other views kept


def test_final_referee_findings_no_shift_test_margin_in_images_and_candidate_count():
    C, F = noshift_gain_findings()
    assert number(F, "benefit_noshift").mean == pytest.approx(0.03)
    c = claim(C, "noshift_benefit")                      # 0.03 in every seed: zero spread, a direction
    assert c["p"] < 0.001 and c["verdict"] == "train mode higher" and c["estimate"] == pytest.approx(0.03)
    assert number(F, "tie_margin_images") == 20 and number(F, "n_eval") == 1000
    assert number(F, "n_other_candidates") == sum(k.startswith("selection_") and k.endswith("_score")
                                                  for k in F["key"]) - 1
    for view in findings.VIEWS:      # lists read "a, b and c", never "a and b and c"
        stem = f"threshold_lines_{_slug(view)}_thr"
        assert all(number(F, k).count(" and ") <= 1 for k in F["key"] if k.startswith(stem))
    # Without the gain the no-shift benefit is exactly 0 in every seed: no direction, and no margin to be within.
    CG, G = shared_findings("ten")
    assert claim(CG, "noshift_benefit")["verdict"] == "not decided"


def test_display_tables_name_their_columns_in_words_and_format_their_cells():
    bn = pd.DataFrame(dict(t=[0.0625, 1.0], steps=[300, 1600], mean=[-0.00004, -0.6], ci_low=[-0.01, -0.7],
                           ci_high=[0.01, -0.5], n_seeds=[16, 16], m=[2, 2], tost_p=[0.00001, 1.0],
                           verdict=["equivalent within \u00b10.02", "train mode lower"]))
    out = findings.budget_net_display(bn)
    assert list(out.index.names) == ["t", "stage-2 steps"] and ("0.0625", "300") in out.index
    assert ("1", "1,600") in out.index
    assert out.loc[("0.0625", "300"), "TOST p"] == "<0.0001" and out.loc[("1", "1,600"), "TOST p"] == "1.0000"
    assert out.loc[("0.0625", "300"), "net (mean)"] == "0.0000"                    # no negative zero
    assert "interval (97.50%, m = 2)" in out.columns                                 # the family's confidence
    cv = pd.DataFrame(dict(t=[0.0625], mode=["benefit"], steps_from=[800], steps_to=[1600], mean=[-0.0002],
                           ci_low=[-0.01], ci_high=[0.01], m=[1], verdict=["not decided"]))
    c = findings.convergence_display(cv)
    assert c.loc[("0.0625", "benefit"), "budgets (steps)"] == "800 to 1,600"
    assert c.loc[("0.0625", "benefit"), "change (mean)"] == "0.000"
    sel = pd.DataFrame(dict(candidate=["mean shift", "KL", "mean shift", "KL", "mean shift", "KL"],
                            held_out=["blur", "blur", "noise", "noise", "mean", "mean"],
                            error=[0.3, 0.1, 0.2, 0.1, 0.25, 0.1]))
    s = findings.selection_display(sel)
    assert list(s.columns) == ["blur", "noise", "score (mean)"] and list(s.index) == ["KL", "mean shift"]


def test_budget_dependent_levels_and_benefit_change_p_on_a_hand_made_table():
    df = _with_noshift_gain(_table10(_cfg10(), seed_noise=0.001))
    C, F = noshift_gain_findings()
    lv = findings.level_table(df, margin=0.02)
    be = lv[(lv["metric"] == "net") & (lv["view"] == "raw")]["breakeven_rate"]
    lo, hi = sorted([number(F, "exchange_rate"), number(F, "exchange_rate_long")])
    assert number(F, "n_budget_dependent") == int(be.between(lo, hi).sum())
    assert (number(F, "budget_dependent_levels") == "none") == (number(F, "n_budget_dependent") == 0)
    bc = C[C["key"].str.match(r"budget_change_\d")]
    assert len(bc) == number(F, "budget_change_m") >= 1 and bc["p_adjusted"].to_numpy() == pytest.approx(holm(bc["p"]))


# --- issue 35 referee: the seed's protocol labelled, chapter 1's controlled comparison named as chapter 1's, every
# verdict kind counted ------------------------------------------------------------------------------------------------

def _answer_box() -> str:
    from test_shift_strength import _markdown_cells
    first = _markdown_cells()[0]
    return first[first.index("```{admonition} The answer"):].split("\n```\n", 1)[0]


def test_every_lead_and_the_answers_counts_say_they_rest_on_the_seeds_protocol():
    """The lead (first in the box, and the front page's line) and the answer's count and gentlest-shift verdicts rest
    on one head rate for both paths, not tuned per path: each says so, and the box's label comes before the glued answer."""
    leads = [n.text for n in findings.NOTES if n.key == "lead"]
    assert len(leads) == 4
    for text in leads:
        assert "On the seed's protocol (one head rate for both paths, not tuned per path)" in text, text
    box = _answer_box()
    label = box.index("is measured on the seed's protocol")
    said = box.index("their sum reads")
    assert box.index("{glue:md}`ch03_lead`") < label < box.index("At chapter 1's shift ($t = 1$), on the seed's")
    assert said < box.index("On the seed's protocol, counting the sum") < box.index("{glue:md}`ch03_counts_sentence`")
    assert box.index("{glue:md}`ch03_counts_sentence`") < box.index("At the gentlest shift of each line, on the seed's")


def test_chapter_1s_controlled_comparison_is_named_as_chapter_1s_with_adam_and_the_rest_as_an_expectation():
    """Chapter 1's seed-protocol benefit (its own steps and seeds) is not this chapter's: the box names chapter 1's
    step count and seeds beside this chapter's, quotes the controlled comparison with SGD and with Adam, and says
    that a level not paying with tuned rates is an expectation, not a finding; the front page does the same."""
    box = " ".join(_answer_box().split())
    ch1 = "01-freeze-modes.ipynb::ch01_"
    assert "ch01_say_controlled_vs_seed" not in box and "does not pay with it either" not in box
    for key in ("opt_main_step", "opt_explore_main_n", "opt_explore_main_estimate", "opt_explore_at_main_sgd_estimate",
                "opt_explore_at_main_sgd_verdict", "opt_explore_at_main_adam_estimate",
                "opt_explore_at_main_adam_verdict"):
        assert f"{ch1}{key}" in box, key
    assert "{glue:text}`ch03_steps:,.0f` steps on {glue:text}`ch03_n_seeds:,.0f` seeds" in box
    assert "was run only at chapter 1's shift" in box and "an expectation, not a finding" in box
    index = (Path(__file__).resolve().parents[1] / "book" / "index.md").read_text()
    item = index[index.index("[Chapter 3, shift strength]"):index.index("[Chapter 4, heads]")]
    assert "ch01_say_controlled_vs_seed" not in item
    assert f"{ch1}opt_explore_at_main_adam_estimate" in item and f"{ch1}opt_main_step" in item
    assert "ch03_steps:,.0f` steps" in item


@pytest.mark.parametrize("counts, want", [
    (dict(higher=0, lower=13, equivalent=3, **{"not decided": 26}),
     "3 of the {m} shifted levels are **equivalent within \u00b10.02** of zero, 13 show the sum below zero (a "
     "direction shown) and 26 are **not decided**"),
    (dict(higher=2, lower=0, equivalent=0, **{"not decided": 0}),
     "2 of the {m} shifted levels show the sum above zero"),
    (dict(higher=0, lower=1, equivalent=0, **{"not decided": 2, "too few seeds": 1}),
     "1 of the {m} shifted levels shows the sum below zero (a direction shown), 2 are **not decided** and 1 has "
     "**too few seeds**"),
])
def test_a_views_count_names_every_verdict_kind_that_occurs(monkeypatch, counts, want):
    """The normalized view's count named lower, higher and not decided but not its equivalent levels (39 of 42): the
    count names every kind that occurs, so it adds up to the levels."""
    import bnstudy.study.words as words
    full = {"too few seeds": 0, **counts}
    full["m"] = sum(full.values())
    C, F = shared_findings("ten")
    monkeypatch.setattr(words, "count_verdicts", lambda claims, alpha=0.05: full)
    m = len(findings.view_claims(C, "normalized"))
    assert findings.page_texts(C, F)["normalized_counts"] == want.format(m=m)


def test_every_views_count_adds_up_to_its_levels_on_the_data():
    import re
    from bnstudy.study.inference import count_verdicts
    C, F = shared_findings("ten")
    from bnstudy.study.words import counts_text
    page = findings.page_texts(C, F)
    for view in findings.VIEWS:
        vc = findings.view_claims(C, view)
        text, n = counts_text(vc, "shifted levels", "the sum", "zero", number(F, "tie_margin")), count_verdicts(vc)
        assert text == page.get({"raw": "counts_sentence", "normalized": "normalized_counts"}.get(view), text)
        verb = r"(?:^|, | and )(\d+) (?:of the \d+ shifted levels )?(?:are|is|show|has|have)"
        said = [int(x) for x in re.findall(verb, text)]
        assert sum(said) == n["m"] and f"of the {n['m']} shifted levels" in text, (view, text)
    from test_shift_strength import _markdown_cells
    assert any("counting the normalized view's sums by their printed verdicts,\n{glue:md}`ch03_normalized_counts`" in md
               for md in _markdown_cells())
