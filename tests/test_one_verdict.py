"""One verdict per claim (issue 35), on the data release: every count a page states ("k of m cells show a
direction") equals the number of claims whose *printed* family interval shows that verdict, in every chapter.

Each chapter's claims and numbers are rebuilt from the release's rows (``release/``, nothing trained) with the same
calls its notebook makes; a count read off Holm's adjusted p-values instead of the printed intervals (the rule before
issue 35: chapter 4's answer counted 13 "higher" cells where 10 intervals exclude zero, chapter 1 said "higher in all
9" beside a table with two "not decided" rows) fails here. The intervals are read directly (``low > 0``: higher,
``high < 0``: lower), not through :func:`bnstudy.study.inference.count_verdicts`, so the test does not assume the
rule it checks.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pandas as pd
import pytest

from bnstudy.study.inference import number

RELEASE = Path(__file__).resolve().parents[1] / "release"
COMPARISON_KINDS = ("higher", "lower", "equivalent", "not decided")


def _read(name: str) -> pd.DataFrame:
    path = RELEASE / f"{name}.csv"
    if not path.exists():
        pytest.skip(f"the release has no {path.name}")
    return pd.read_csv(path)


def _shown(claims: pd.DataFrame, kind: str) -> int:
    """How many claims' printed intervals show ``kind`` ("higher": above zero, "lower": below)."""
    return int((claims["low"] > 0).sum() if kind == "higher" else (claims["high"] < 0).sum())


def _assert_verdicts_are_the_intervals(claims: pd.DataFrame, where: str) -> None:
    """Every comparison's printed verdict is its printed interval's: a direction exactly where it excludes zero."""
    rows = claims[claims["kind"].isin(COMPARISON_KINDS) & claims["low"].notna() & claims["high"].notna()]
    assert len(rows), where
    bad = rows[(rows["kind"].eq("higher") != (rows["low"] > 0)) | (rows["kind"].eq("lower") != (rows["high"] < 0))]
    assert bad.empty, f"{where}: verdicts that are not their printed interval's: {bad['key'].tolist()}"


# --- chapter 1 ------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _ch01():
    from bnstudy.study.experiments.freeze_modes import findings
    df, sweep = _read("01_freeze_modes"), _read("01_freeze_modes_head_sweep")
    steps = int(pd.read_json(RELEASE / "01_freeze_modes.json", typ="series")["parameters"]["steps"])
    oc = findings.optimizer_claims(sweep, steps, main=df)
    tc = findings.tuning_claims(sweep, steps)
    return (findings, steps, df, sweep, oc, findings.optimizer_findings(sweep, steps, main=df, claims=oc), tc,
            findings.tuning_findings(sweep, steps, claims=tc))


def test_chapter_1_counts_of_the_trained_heads_are_the_verdicts_of_its_exploratory_table():
    findings, steps, df, sweep, oc, on, tc, tn = _ch01()
    ex = findings.family(oc, "explore")
    _assert_verdicts_are_the_intervals(ex, "ch01 explore")
    k, n = _shown(ex, "higher"), len(ex)
    assert number(on, "n_explore_resolved") == k + _shown(ex, "lower")
    reading = number(on, "trained_reading")
    assert (f"in all {n} tests" in reading) if k == n else (f"higher in {k} of {n} tests" in reading), reading
    table = findings.exploratory_tests(sweep, steps, df)  # the page's table of the same tests
    assert int((table["verdict"] == findings.TRAIN_HIGHER).sum()) == k


def _assert_family_counts(findings, claims_table, numbers, chapter, specs):
    """For each ``(family, number key, kind)``: the family's verdicts are its printed intervals, and the glued count
    is the number of those verdicts of that kind."""
    for fam, key, kind in specs:
        claims = findings.family(claims_table, fam)
        _assert_verdicts_are_the_intervals(claims, f"{chapter} {fam}")
        assert number(numbers, key) == _shown(claims, kind), key

def test_chapter_1_tuning_counts_are_the_printed_verdicts():
    findings, *_, tc, tn = _ch01()
    _assert_family_counts(findings, tc, tn, "ch01", (("oracle", "oracle_n_above", "higher"),
                                                    ("std_at", "std_n_above", "higher")))
    # the narrow family's count is no longer printed (an uncited number its lean pass dropped); its verdicts still are
    _assert_verdicts_are_the_intervals(findings.family(tc, "narrow"), "ch01 narrow")


# --- chapter 2 ------------------------------------------------------------------------------------------------------

def test_chapter_2_small_batch_counts_are_the_printed_verdicts():
    from bnstudy.study.experiments.eval_traps import findings
    C, F = findings.findings(_read("02_eval_traps"))
    _assert_verdicts_are_the_intervals(C, "ch02")
    reest = C[C["key"].str.fullmatch(r"t5t_reest_b\d+")]
    below = reest[reest["key"].str.removeprefix("t5t_reest_b").astype(int) < number(F, "min_batch")]
    assert len(below) == number(F, "t5t_n_below")
    assert number(F, "t5t_costs_n") == _shown(below, "lower")


# --- chapter 3 ------------------------------------------------------------------------------------------------------

def test_chapter_3_level_counts_are_the_printed_verdicts_of_each_view_and_line():
    from bnstudy.study.experiments.shift_strength import findings, run
    df, cfg = _read("03_shift_strength"), run.make_config("full")
    n_boot = 50  # the counts read t intervals; the bootstraps (crossings, selection) only need to run
    C = findings.claims(df, n_boot, cfg.tie_margin)
    F = findings.findings(df, n_boot, cfg.min_effect, cfg.tie_margin, n_boot_select=20, claims_=C)
    for view in findings.VIEWS:
        vc = findings.view_claims(C, view)
        _assert_verdicts_are_the_intervals(vc, f"ch03 {view}")
        slug = view.replace(" ", "_")
        assert number(F, f"n_lower_{slug}") == _shown(vc, "lower")
        assert number(F, f"n_higher_{slug}") == _shown(vc, "higher")
        assert number(F, f"n_not_decided_{slug}") == int((vc["kind"] == "not decided").sum())
    raw = findings.view_claims(C, "raw")
    for line in findings.SHIFT_TYPES:
        of_line = raw[raw["key"].str.startswith(f"raw_{line}_")]
        assert number(F, f"counts_raw_{line}_lower") == _shown(of_line, "lower"), line
        assert number(F, f"counts_raw_{line}_higher") == _shown(of_line, "higher"), line


# --- chapter 4 ------------------------------------------------------------------------------------------------------

def test_chapter_4_answer_and_figure_counts_are_the_gap_cells_printed_verdicts():
    from bnstudy.study.experiments.heads import findings, run
    df, search, cfg = _read("04_heads"), _read("04_heads_search_runs"), run.make_config("full")
    lrs, grids = run.chosen_lrs_by_shift(search)["ref"], {o: cfg.lr_grid(o) for o in cfg.optimizers}
    C = findings.claims(df, cfg.margin)
    F = findings.findings(df, lrs, grids, cfg.margin, C=C)
    gap = findings.family(C, "gap")
    _assert_verdicts_are_the_intervals(gap, "ch04 gap")
    for shift, g in gap.groupby("shift"):
        assert number(F, f"n_separate_higher_{shift}") == _shown(g, "higher"), shift
        assert number(F, f"n_not_decided_{shift}") == int((g["kind"] == "not decided").sum()), shift
    ref = gap[gap["shift"] == "ref"]
    assert f"{_shown(ref, 'higher')} of the {len(ref)} head and optimizer cells show separate statistics above" in \
        findings.page_counts(C, C, cfg.margin)["gap_counts_ref"]
    _assert_family_counts(findings, C, F, "ch04", (("hc", "hc_n_smaller", "lower"), ("sc", "sc_n_larger", "higher"),
                                                 ("sc", "sc_n_smaller", "lower")))


# --- chapter 5 ------------------------------------------------------------------------------------------------------

def test_chapter_5_winners_count_is_the_winners_printed_verdicts():
    from bnstudy.study.experiments.batch_size import findings, run
    df, tune, tuned = _read("05_batch_size"), _read("05_batch_size_lr_check"), _read("05_batch_size_tuned")
    cfg = run.make_config("full")
    diag = run.diag_from_tables(_read("05_batch_size_noise"), _read("05_batch_size_precise_bn"), df)
    claims, F = findings.findings(df, diag, cfg.lr_batch, cfg.break_margin, cfg.equivalence_margin, tune=tune,
                                  tuned=tuned)
    winners = claims[claims["family"] == "winners"]
    _assert_verdicts_are_the_intervals(winners, "ch05 winners")
    assert number(F, "n_winner_separated") == _shown(winners, "higher")


# --- chapter 6 ------------------------------------------------------------------------------------------------------

def test_chapter_6_router_cell_counts_are_the_cells_printed_verdicts():
    from bnstudy.study.experiments.unknown_task import findings
    df = _read("06_unknown_task")
    cells = findings.cell_tests(df)
    F = findings.findings(df, cells)
    _assert_verdicts_are_the_intervals(cells, "ch06 cells")
    assert number(F, "n_lower") == _shown(cells, "lower") and number(F, "n_higher") == _shown(cells, "higher")
    assert number(F, "n_equivalent") == int((cells["kind"] == "equivalent").sum())
    assert number(F, "n_not_decided") == int((cells["kind"] == "not decided").sum())


# --- chapter 7 ------------------------------------------------------------------------------------------------------

def test_chapter_7_condition_counts_are_the_conditions_printed_verdicts():
    from bnstudy.study.experiments.real_data import findings
    df = _read("07_real_data")
    reference = tuple(pd.read_json(RELEASE / "07_real_data.json", typ="series")["parameters"]["reference"])
    conds = findings.condition_claims(df)
    F = findings.findings(df, reference, conds)
    for (net, q), c in conds.groupby(["network", "question"]):
        _assert_verdicts_are_the_intervals(c, f"ch07 {net} {q}")
    at = lambda net, q: conds[(conds["network"] == net) & (conds["question"] == q)]  # noqa: E731
    loss = f"loss_{findings.MIN_EFFECT:g}"
    for net in findings.networks_of(F):
        assert number(F, f"f3_n_higher_{net}") == _shown(at(net, "f3"), "higher"), net
        assert number(F, f"f3_n_lower_{net}") == _shown(at(net, "f3"), "lower"), net
        assert number(F, f"f2_n_below_{net}") == _shown(at(net, "f2"), "lower"), net
        assert number(F, f"f2_n_above_{net}") == _shown(at(net, "f2"), "higher"), net
        assert number(F, f"f2_n_drop_{net}") == _shown(at(net, "drop"), "lower"), net
        assert number(F, f"n_safe_{net}") == _shown(at(net, loss), "higher"), net
        assert number(F, f"n_harm_{net}") == _shown(at(net, loss), "lower"), net


def test_the_check_fails_on_a_count_that_holm_would_make():
    """The flip: a claims table where Holm's p calls a cell the printed interval does not; the old rule's count
    differs from the intervals' count, so the chapter tests above would fail on it."""
    from bnstudy.study import inference as I
    claims = pd.DataFrame(dict(key=["a", "b"], estimate=[0.3, 0.1], low=[0.2, -0.01], high=[0.4, 0.21],
                               p_adjusted=[0.001, 0.02], kind=["higher", "not decided"]))
    holm_count = int(((claims["p_adjusted"] < 0.05) & (claims["estimate"] > 0)).sum())
    assert holm_count == 2 != _shown(claims, "higher") == I.count_verdicts(claims)["higher"] == 1
    with pytest.raises(AssertionError):
        _assert_verdicts_are_the_intervals(claims.assign(kind=["higher", "higher"]), "flip")
    assert not math.isnan(claims["low"].iloc[1])
