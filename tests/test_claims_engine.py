"""The lean chapter shape's engine (issue 33): questions as data (bnstudy.study.inference.ask), the numbers table, words
from one place (bnstudy.study.words) and glue keys derived from the tables (bnstudy.study.pages.glue_chapter)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bnstudy.study import words
from bnstudy.study.inference import Family, Interval, Question, ask, claims_table, decide, exact_check, number, \
    numbers_table, paired_differences, with_numbers
from bnstudy.study.pages import claims_items, numbers_items


def _rows(conditions=("a", "b"), seeds=10, shifts=(0.0, 0.5, 1.0)):
    """A hand-made tidy table: per seed, shift and condition an accuracy; condition ``c`` is ``ref`` + an effect
    that grows with the shift and its index (so verdicts differ), plus seed noise."""
    rng = np.random.default_rng(0)
    out = []
    for seed in range(seeds):
        base = 0.6 + 0.01 * rng.standard_normal()
        for t in shifts:
            out.append(dict(seed=seed, shift=t, condition="ref", accuracy=base))
            for i, c in enumerate(conditions):
                out.append(dict(seed=seed, shift=t, condition=c,
                                accuracy=base - 0.1 * i * t + 0.005 * rng.standard_normal()))
    return pd.DataFrame(out)


#: A chapter's design and questions, as data: the conditions to compare with the reference at the strongest shift.
DESIGN = dict(conditions=("a", "b"))


def _questions(design):
    return (Question("{condition}_vs_ref", condition=design["conditions"], reference="ref", at=dict(shift="max"),
                     margin=0.02),
            Question("ref_is_ref", "ref", "ref", exact=0.0, at=dict(shift="min")))


def test_a_condition_added_to_the_design_is_asked_without_new_code():
    before = ask(_rows(), _questions(DESIGN))
    assert list(before.key) == ["a_vs_ref", "b_vs_ref", "ref_is_ref"]
    design = dict(DESIGN, conditions=DESIGN["conditions"] + ("c",))  # one entry in the design, nothing else
    after = ask(_rows(("a", "b", "c")), _questions(design))
    assert list(after.key) == ["a_vs_ref", "b_vs_ref", "c_vs_ref", "ref_is_ref"]
    c = after.set_index("key").loc["c_vs_ref"]
    assert c.kind == "lower" and c.estimate == pytest.approx(-0.2, abs=0.01)   # 2 x 0.1 x shift 1.0
    a = after.set_index("key").loc["a_vs_ref"]
    assert a.verdict == "equivalent within ±0.02" and a.confidence == pytest.approx(1 - 0.05 / 3)  # family of 3


def test_ask_gives_what_decide_gives_for_each_question_in_one_family():
    df = _rows()
    q = [Question("gap_{shift}", "b", "ref", each=("shift",), margin=0.02, words="b")]
    table = ask(df, q)
    assert list(table.key) == ["gap_0", "gap_0.5", "gap_1"]
    fam = Family(3)
    for t, key in zip((0.0, 0.5, 1.0), table.key):
        d = paired_differences(df[df["shift"] == t], "accuracy", "condition", "b", "ref")
        expected = claims_table([decide(d, key, margin=0.02, family=fam, higher="b higher", lower="b lower")])
        got = table[table.key == key].reset_index(drop=True)
        pd.testing.assert_frame_equal(got.drop(columns="p_adjusted"), expected.drop(columns="p_adjusted"))
    assert table.set_index("key").loc["gap_1", "verdict"] == "b lower"


def test_selectors_pairs_over_several_columns_and_exact_checks():
    df = _rows()
    t = ask(dict(main=df, other=df.assign(accuracy=1.0)),
            [Question("ones", value="accuracy", table="other", exact=1.0),
             Question("same", "a", "a", pair=("seed", "shift"), exact=0.0),
             Question("gentle", "b", "ref", at=dict(shift="min_positive"))]).set_index("key")
    assert t.loc["ones", "verdict"] == "exact, checked ==" and t.loc["same", "n"] == 30
    assert t.loc["gentle", "estimate"] == pytest.approx(-0.05, abs=0.01)
    assert t.loc["ones", "estimate"] == exact_check(np.ones(30), 1.0).estimate == 0.0
    assert math.isnan(t.loc["ones", "p"])   # a check is not a member of the family


def test_bad_questions_are_refused_by_name():
    with pytest.raises(ValueError, match=r"at\['shift'\]='maximum' is not a selector"):
        Question("x", "a", "ref", at=dict(shift="maximum"))
    with pytest.raises(ValueError, match=r"key fields \['k'\] are not in each"):
        Question("x_{k}", "a", "ref")
    with pytest.raises(ValueError, match="needs condition and reference"):
        Question("x", "a")
    with pytest.raises(ValueError, match=r"needs a \{condition\} field"):
        Question("x", ("a", "b"), "ref")
    with pytest.raises(ValueError, match=r"question 'x': .*condition 'zz' does not occur"):
        ask(_rows(), [Question("x", "zz", "ref")])
    with pytest.raises(KeyError, match="reads table 'nope'"):
        ask(_rows(), [Question("x", "a", "ref", table="nope")])


def test_numbers_table_round_trips_values_and_intervals_and_glues_derived_keys():
    iv = Interval(0.9, 0.8, 1.05, 10)
    t = numbers_table(dict(n_seeds=10, ok=True, name="mixture", acc={"k2": iv}, gap=-0.1),
                      bounds=lambda key: (0.0, 1.0) if key == "acc" else (-1.0, 1.0))
    assert number(t, "n_seeds") == 10 and type(number(t, "n_seeds")) is int and number(t, "ok") is True
    assert number(t, "acc_k2") == iv and number(t, "name") == "mixture"
    items = dict(numbers_items("ch09", t))
    assert items["ch09_acc_k2_ci_high"] == 1.0 and items["ch09_acc_k2_mean"] == 0.9  # cut to what it allows
    assert items["ch09_n_seeds"] == 10 and items["ch09_ok"].data == "yes" and items["ch09_name"].data == "**mixture**"
    t2 = with_numbers(t, {"acc": {"k2": Interval(0.5, 0.4, 0.6, 10)}})
    assert number(t2, "acc_k2").mean == 0.5 and number(t, "acc_k2").mean == 0.9
    with pytest.raises(KeyError, match="no 'nope'"):
        number(t, "nope")
    with pytest.raises(ValueError, match="keys given twice"):
        numbers_table({"a": {"b": 1}, "a_b": 2})
    with pytest.raises(ValueError, match="glued twice"):
        numbers_items("x", numbers_table(dict(acc=iv, acc_mean=1.0)))


def test_claim_text_has_one_shape_for_every_verdict_kind():
    lower = decide(np.array([-0.2, -0.21, -0.19, -0.2]), "x", lower="b lower")
    assert words.claim_text(lower).endswith("; **b lower**)") and words.claim_text(lower).startswith("-0.200 (")
    few = decide(np.array([0.1]), "x")
    assert words.claim_text(few) == "+0.100 (**too few seeds**)"   # a difference: its sign shown
    assert words.signed(-6.9e-18) == "0.000" and words.signed(0.0201) == "+0.020" and words.signed(-0.5, 1) == "-0.5"
    wide = claims_table([decide(np.array([0.5, 1.5, 0.9]), "x")]).iloc[0]
    assert "to +1.000;" in words.claim_text(wide, clip=(-1, 1))  # the printed end cut to what the quantity allows
    assert "to +2.217;" in words.claim_text(wide)                 # not cut unless asked (the quantity's own range)
    with pytest.raises(ValueError, match="clip must be"):
        words.claim_text(wide, clip=(1, -1))


def test_counts_text_counts_by_the_books_rule_and_names_only_kinds_that_occur():
    rng = np.random.default_rng(1)
    fam = Family(4)
    cl = claims_table([decide(rng.normal(0, 0.001, 10), f"e{i}", margin=0.02, family=fam) for i in range(3)]
                      + [decide(rng.normal(0, 0.5, 3), "u", margin=0.02, family=fam)])
    text = words.counts_text(cl, "cells", "a router", "the oracle", 0.02)
    assert text == "3 of the 4 cells are **equivalent within ±0.02** of the oracle and 1 is **not decided**"


def test_notes_need_exactly_one_rule_per_key_to_hold():
    c = claims_table([exact_check(np.zeros(3), 0.0, "chk")])
    rules = (words.Note("k", lambda c, f: words.claim(c, "chk").kind == "exact", "holds"),
             words.Note("k", lambda c, f: words.claim(c, "chk").kind != "exact", "off by {estimate:g}",
                        lambda c, f: dict(words.claim(c, "chk"))))
    assert words.notes(rules, c, None) == {"k": "holds"}
    c2 = claims_table([exact_check(np.array([0.0, 1e-3]), 0.0, "chk")])
    assert words.notes(rules, c2, None) == {"k": "off by 0.001"}   # the flip
    with pytest.raises(ValueError, match="exactly one note"):
        words.notes(rules + (words.Note("k", lambda c, f: True, "also"),), c, None)


def test_glue_chapter_refuses_a_name_glued_twice(monkeypatch):
    import myst_nb
    from bnstudy.study.pages import glue_chapter
    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda k, v, display=True: glued.__setitem__(k, v))
    cl = claims_table([exact_check(np.zeros(2), 0.0, "chk")])
    glue_chapter("ch09", cl, numbers_table(dict(n=3)), words=dict(answer="Yes."))
    assert glued["ch09_n"] == 3 and glued["ch09_answer"].data == "Yes." and "ch09_chk_verdict" in glued
    assert set(glued) == {n for n, _ in claims_items("ch09", cl)} | {"ch09_n", "ch09_answer"}
    with pytest.raises(ValueError, match="glued twice"):
        glue_chapter("ch09", cl, numbers_table(dict(chk_n=3)))


# --- bad input, by kind (a new user's report: each silent or unclear case, fixed as a kind) -----------------------

@pytest.mark.parametrize("question, message", [
    (Question("x", "b", "ref", at=dict(shift=0.7)), r"question 'x': shift=0.7 does not occur in the table; its levels"),
    (Question("x", "b", "ref", at=dict(shift="1.0")), r"shift='1.0' does not occur"),      # a text for a number
    (Question("x", "b", "ref", at=dict(shift=(0.0, 9.0))), r"shift=9.0 does not occur"),
    (Question("x", "zzz", "yyy"), r"question 'x': neither condition='zzz' nor condition='yyy' occurs"),
    (Question("x_{shift}", "b", "ref", each=("shift",), at=dict(condition="a")), r"question 'x_0': neither condition='b' nor condition='ref' occurs"),
    (Question("x", "b", "ref", at=dict(condition="min_positive")), r"'min_positive' needs a numeric column"),
])
def test_a_question_that_looks_where_the_rows_are_not_is_refused_naming_it(question, message):
    with pytest.raises(ValueError, match=message):
        ask(_rows(), [question])


def test_an_optional_question_says_there_was_nothing_to_check_and_an_empty_table_asks_nothing():
    t = ask(_rows(), [Question("two_tasks", "b", "ref", at=dict(shift=0.7), exact=0.0, optional=True),
                      Question("gap", "b", "ref", at=dict(shift=0.7), optional=True)]).set_index("key")
    assert list(t.kind) == ["too few seeds", "too few seeds"] and list(t.n) == [0, 0]  # never "not exact"
    assert exact_check([], 0.0, "k").kind == "too few seeds"
    empty = ask(_rows().iloc[:0], [Question("g_{shift}", "b", "ref", each=("shift",)), Question("h", "b", "ref")])
    assert list(empty.key) == ["h"] and empty.kind.iloc[0] == "too few seeds"


@pytest.mark.parametrize("make, error, message", [
    (lambda: Question("x", "b", "ref", at=dict(shift="Max")), ValueError, r"'Max' is not a selector"),
    (lambda: Question("x", "b", "ref", at=dict(shift=np.array([1.0]))), ValueError, r"at\['shift'\] must be a level"),
    (lambda: Question("x", "b", "ref", at=dict(shift=("max",))), ValueError, r"at\['shift'\] must be a level"),
    (lambda: Question("x_{}", "b", "ref"), ValueError, r"key fields \[''\] are not in each"),
    (lambda: Question("x_{a", "b", "ref"), ValueError, "not a valid format string"),
    (lambda: Question("x", "b", "ref", margin=0), ValueError, r"question|Question 'x': margin must be a positive"),
    (lambda: Question("x", "b", "ref", each=3), ValueError, "each must be a column name"),
    (lambda: ask([_rows()], [Question("x", "b", "ref")]), TypeError, "tables must be a DataFrame"),
    (lambda: ask(_rows(), [Question("x", "b", "ref", value="acc")]), KeyError, r"question 'x' reads columns \['acc'\]"),
    (lambda: ask(_rows(), [Question("x", "b", "ref", by="cond")]), KeyError, r"reads columns \['cond'\]"),
])
def test_bad_questions_get_errors_that_name_the_question_and_the_parameter(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_a_column_given_as_a_string_is_one_column_and_bool_or_missing_levels_are_handled():
    df = _rows().assign(flag=lambda d: d["shift"] > 0.2)
    t = ask(df, [Question("x_{flag}", "b", "ref", each="flag", pair="seed", at=dict(shift=(0.0, 1.0)))])
    assert list(t.key) == ["x_False", "x_True"]
    with pytest.raises(ValueError, match=r"a missing value in \['level'\]"):
        ask(df.assign(level=np.where(df["shift"] > 0.9, np.nan, 1.0)), [Question("x_{level}", "b", "ref",
                                                                                  each=("level",))])


def test_ask_agrees_with_scipys_paired_t_test_on_random_tables():
    from scipy import stats
    rng = np.random.default_rng(7)
    for trial in range(20):
        n = int(rng.integers(2, 15))
        ref, cond = rng.normal(0.6, 0.1, n), None
        cond = ref + rng.normal(rng.normal(0, 0.05), 0.05, n)
        df = pd.DataFrame(dict(seed=np.r_[np.arange(n), np.arange(n)], condition=["c"] * n + ["r"] * n,
                               accuracy=np.r_[cond, ref])).sample(frac=1, random_state=trial)
        row = ask(df, [Question("x", "c", "r")]).iloc[0]
        test = stats.ttest_rel(cond, ref)
        lo, hi = test.confidence_interval(0.95)
        assert row.n == n and row.estimate == pytest.approx(np.mean(cond - ref), abs=1e-12)
        assert row.p == pytest.approx(test.pvalue, rel=1e-9) and (row.low, row.high) == pytest.approx((lo, hi))


def test_numbers_tables_refuse_what_a_page_cannot_glue():
    with pytest.raises(TypeError, match=r"'a' holds a NoneType"):
        numbers_table(dict(a=None))
    with pytest.raises(TypeError, match=r"holds a DataFrame"):
        numbers_table(dict(a=pd.DataFrame()))
    with pytest.raises(ValueError, match=r"key 'a b' must be letters"):
        numbers_table({"a b": 1})
    with pytest.raises(ValueError, match=r"bounds\('a'\) must be \(lowest, highest\)"):
        numbers_table(dict(a=1.0), bounds=lambda key: (1.0, 0.0))
    with pytest.raises(ValueError, match="needs a numbers table"):
        numbers_items("x", {"a": 1})
    with pytest.raises(ValueError, match="clip must be"):
        claims_items("x", claims_table([exact_check([0.0], 0.0, "c")]), clip=(1, -1))


def test_counts_text_names_the_reference_when_nothing_before_did_and_counts_checks():
    fam = Family(3)
    up = claims_table([decide(np.array([0.3, 0.31, 0.29, 0.3]) + i, f"u{i}", family=fam) for i in range(3)])
    assert words.counts_text(up, "cells", "a router", "the oracle", 0.02) == \
        "3 of the 3 cells show a router above the oracle"
    checks = claims_table([exact_check([0.0], 0.0, "a"), exact_check([1.0], 0.0, "b")])
    assert words.counts_text(checks, "checks", "", "", 0.02) == \
        "1 of the 2 checks is **exact, checked ==** and 1 is **not exact**"
