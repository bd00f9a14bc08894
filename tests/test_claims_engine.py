"""The lean chapter shape's engine (issue 33): questions as data (bnstudy.inference.ask), the numbers table, words
from one place (bnstudy.words) and glue keys derived from the tables (bnstudy.pages.glue_chapter)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bnstudy import words
from bnstudy.inference import Family, Interval, Question, ask, claims_table, decide, exact_check, number, \
    numbers_table, paired_differences, with_numbers
from bnstudy.pages import claims_items, numbers_items


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
    assert words.claim_text(few) == "0.100 (**too few seeds**)"
    wide = claims_table([decide(np.array([0.5, 1.5, 0.9]), "x")]).iloc[0]
    assert "to 1.000;" in words.claim_text(wide)          # the printed end cut to what the quantity allows


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
    from bnstudy.pages import glue_chapter
    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda k, v, display=True: glued.__setitem__(k, v))
    cl = claims_table([exact_check(np.zeros(2), 0.0, "chk")])
    glue_chapter("ch09", cl, numbers_table(dict(n=3)), words=dict(answer="Yes."))
    assert glued["ch09_n"] == 3 and glued["ch09_answer"].data == "Yes." and "ch09_chk_verdict" in glued
    assert set(glued) == {n for n, _ in claims_items("ch09", cl)} | {"ch09_n", "ch09_answer"}
    with pytest.raises(ValueError, match="glued twice"):
        glue_chapter("ch09", cl, numbers_table(dict(chk_n=3)))
