"""bnstudy.study.pages: the naming rule and its guard against two fields gluing one name."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest

from bnstudy.study.inference import Interval
from bnstudy.study.pages import glue_findings, glue_items


@dataclass(frozen=True)
class _Clash:
    gap_diff: pd.Series
    gap_diff_max: float  # the Series above already glues <key>_max by rule


@dataclass(frozen=True)
class _Fine:
    gap_diff: pd.Series
    gap_diff_largest: float
    gap: Interval
    word: str


def test_naming_rule_for_series_intervals_and_words():
    f = _Fine(pd.Series({"seed 0": 0.02, "seed1": -0.096}), 0.096, Interval(0.1, 0.0, 0.2, 3), "holds")
    names = [n for field in ("gap_diff", "gap_diff_largest", "gap", "word")
             for n, _ in glue_items(f"ch01_{field}", getattr(f, field))]
    assert names == ["ch01_gap_diff_seed_0", "ch01_gap_diff_seed1", "ch01_gap_diff_min", "ch01_gap_diff_max",
                     "ch01_gap_diff_largest", "ch01_gap_mean", "ch01_gap_ci_low", "ch01_gap_ci_high", "ch01_word"]
    assert dict(glue_items("k", pd.Series({"a": 0.02, "b": -0.096})))["k_max"] == 0.02


def test_two_fields_gluing_one_name_is_an_error_naming_both():
    # The chapter-1 instance (issue 10): ThreadFindings had gap_diff (a Series) and gap_diff_max; the page cited
    # ch01_threads_gap_diff_max and got whichever value was glued last.
    with pytest.raises(ValueError, match=r"ch01_threads_gap_diff_max \(fields 'gap_diff' and 'gap_diff_max'\)"):
        glue_findings("ch01_threads", _Clash(pd.Series({"seed0": 0.022, "seed1": -0.096}), 0.096))


def test_chapter_one_thread_findings_glue_no_name_twice():
    """Its numbers table glues each name once (numbers_items refuses a clash): ``gap_diff_max`` is the per-seed
    series' maximum, ``gap_diff_largest`` its largest size."""
    from bnstudy.study.experiments.freeze_modes.findings import thread_findings
    from bnstudy.study.modes import MODE_NAMES
    from bnstudy.study.pages import numbers_items
    tc = pd.DataFrame([dict(seed=s, mode=m, threads=t, task_a_after=0.9, task_b=0.5 + 0.01 * s * t)
                       for t in (1, 2) for s in (0, 1) for m in MODE_NAMES])
    names = [n for n, _ in numbers_items("ch01_threads", thread_findings(tc))]
    assert len(names) == len(set(names)) and {"ch01_threads_gap_diff_max", "ch01_threads_gap_diff_largest"} <= set(names)


def test_glue_findings_glues_plain_fields_without_bold(monkeypatch):
    import dataclasses
    import myst_nb
    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, v, display=False: glued.__setitem__(name, v))

    @dataclasses.dataclass
    class _F:
        verdict: dict
        sentence: str
    glue_findings("x", _F({"n": "holds"}, "a whole sentence"), plain=("sentence",))
    assert glued["x_verdict_n"].data == "**holds**" and glued["x_sentence"].data == "a whole sentence"


def test_long_glued_text_is_plain_and_short_verdicts_bold():
    """Referees found whole sentences and lists of levels set in bold on chapters 1, 3 and 6: only short verdicts are."""
    from bnstudy.study.pages import BOLD_MAX_WORDS, glue_items
    short = " ".join(["holds"] * BOLD_MAX_WORDS)
    long = " ".join(["word"] * (BOLD_MAX_WORDS + 1))
    assert glue_items("k", short)[0][1].data == f"**{short}**"
    assert glue_items("k", long)[0][1].data == long
    assert glue_items("k", {"a": long, "b": "not shown"}) [1][1].data == "**not shown**"


def test_run_line_says_where_analysed_rows_came_from_in_words():
    """A page rebuilt from an earlier run's rows names that run in its run line, without a raw dict or a
    float wall time (newuser-s7: 'rows_from={..., 'run_wall_s': 22.843358344995067}')."""
    from bnstudy.study.experiments.heads import run as ch
    from bnstudy.study.pages import run_line
    origin = dict(git_commit="abc1234567", written="2026-12-01T06:47:16+00:00", sha256="0123456789ab",
                  run_wall_s=22.843358344995067)
    line = run_line(ch.make_config("quick"), extra=dict(rows_from=origin)).replace("\n  ", " ")
    assert ("analysing the rows computed by the run at git commit abc1234567 (worker count not recorded; tables "
            "written 2026-12-01 06:47:16 UTC") in line
    assert "{" not in line and "22.84" not in line
    assert "worker count not recorded" in line and "worker process," not in line  # not this execution's count
    line = run_line(ch.make_config("quick"), extra=dict(rows_from={**origin, "workers": 2})).replace("\n  ", " ")
    assert "abc1234567 (2 worker processes; tables written" in line
    release = dict(version="2026.12.01", date="2026-12-01",
                   verified=dict(date="2026-12-02", git_commit="fedcba987654", units_per_chapter=5))
    line = run_line(ch.make_config("quick"), extra=dict(rows_from={**origin, "release": release})).replace("\n  ", " ")
    assert ("analysing the rows of the data release 2026.12.01 (last verified 2026-12-02 at git commit fedcba987654: "
            "5 units per chapter recomputed from an empty cache; this chapter exactly: every column == (computed and "
            "recomputed under the pinned numerics)) computed by the run at git commit abc1234567") in line
    # issue 32: a chapter verified under other numeric kernels says so, not "=="
    stat = dict(release, verified=dict(release["verified"], how="statistical"))
    line = run_line(ch.make_config("quick"), extra=dict(rows_from={**origin, "release": stat})).replace("\n  ", " ")
    assert ("5 units per chapter recomputed from an empty cache; this chapter statistically: not == (computed under "
            "other numeric kernels), every recomputed unit within its seeds' spread)") in line
    assert "every column ==" not in line
    from bnstudy.study.config import Execution
    assert ", 1 worker process;" in run_line(ch.make_config("quick"), Execution(n_jobs=1)).replace("\n  ", " ")
    assert ", 3 worker processes" in run_line(ch.make_config("quick"), Execution(n_jobs=3)).replace("\n  ", " ")


def test_a_pasted_number_that_rounds_to_zero_prints_without_a_minus_and_the_glued_value_is_kept():
    """A reader saw "-0.000" on the guide: myst-nb formats a ``{glue:text}`` value at build time with the page's format
    spec (``-1e-07:.3f`` is "-0.000"). The book's Sphinx extension drops that minus from every pasted text, on the
    page and across pages (after myst-nb's cross-page pass), and leaves any other text, and the glued value, alone."""
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document
    from myst_nb.core.variables import format_plain_text
    from myst_nb.ext.glue.crossref import ReplacePendingGlueReferences

    from bnstudy.study import sphinxext

    glued = {"tiny": repr(-1e-07), "zero": repr(-0.0), "small": repr(-0.0004), "neg": repr(-0.0123), "pos": "0.25",
             "pct": repr(-1e-09), "int": repr(-3)}
    specs = {"tiny": ".3f", "zero": "+.3f", "small": ".2f", "neg": ".3f", "pos": ".3f", "pct": ".1%", "int": ".0f"}
    shown = {k: format_plain_text(glued[k], specs[k]) for k in glued}
    assert shown["tiny"] == "-0.000" and shown["zero"] == "-0.000" and shown["pct"] == "-0.0%"  # what myst-nb prints
    doc = new_document("page", get_default_settings(Parser))
    para = nodes.paragraph()
    for k, text in shown.items():
        para += nodes.inline(text, text, classes=["pasted-text"])
    para += nodes.inline("-0.000", "-0.000")  # not a pasted value: left as it is
    doc += para
    assert sphinxext.unsign_pasted_zeros(doc) == 4
    got = [n.astext() for n in doc.findall(nodes.inline)]
    assert got == ["0.000", "0.000", "0.00", "-0.012", "0.250", "0.0%", "-3", "-0.000"]
    assert glued["tiny"] == "-1e-07"  # the glued value is untouched
    for text in ("-0.001", "-10", "-0.0x", "0.000", "-", "-1e-05", "text -0.000"):
        assert sphinxext.unsigned_zero(text) == text, text
    assert sphinxext.unsigned_zero("-0e+00") == "0e+00" and sphinxext.unsigned_zero("-0") == "0"
    assert sphinxext.UnsignedZeroPastes.default_priority > ReplacePendingGlueReferences.default_priority
    calls = []

    class _App:  # records what setup registers
        def __getattr__(self, name):
            return lambda *a, **k: calls.append((name, a))

    sphinxext.setup(_App())
    assert ("add_post_transform", (sphinxext.UnsignedZeroPastes,)) in calls
