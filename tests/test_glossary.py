"""The glossary (issue 37): the book's own terms, every verdict word ``bnstudy.study.words`` can print, every threshold
and outcome word the chapters print, and each chapter's direction words, all defined on book/glossary.md. Cheap: it
reads the page and calls the word functions, nothing is executed or built."""

import math
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GLOSSARY = (REPO / "book" / "glossary.md").read_text()


def _section(label: str) -> str:
    start = GLOSSARY.index(f"({label})=")
    end = GLOSSARY.find("\n## ", GLOSSARY.index("\n## ", start) + 1)
    return GLOSSARY[start:end if end > 0 else None]


def defined_terms(text: str) -> list[str]:
    """The terms of the definition lists in ``text``: a line followed by a line that starts with ``: ``."""
    lines = text.splitlines()
    return [a for a, b in zip(lines, lines[1:]) if a.strip() and b.startswith(": ")]


def _generic(word: str) -> str:
    """A printed threshold word as the glossary defines it: numbers become ``m``/``n``/``...``."""
    return re.sub(r"\d+(\.\d+)?", "m", word)


def test_defined_terms_reads_a_definition_list():
    assert defined_terms("Pinned\n: held in eval mode\n\nnot a term\nplain text\n**a**, **b**\n: both\n") == \
        ["Pinned", "**a**, **b**"]


@pytest.mark.parametrize("term", ["Task A, task B", "Pinned", "Separate statistics", "Train mode", "drifting statistics",
                                  "Re-estimate", "precise BN", "AdaBN", "Bank", "Oracle", "Mismatch", "Per-sample norm",
                                  "Freeze mode", "data release", "Chance", "probe"])
def test_the_glossary_defines_the_books_own_terms(term):
    terms = defined_terms(_section("glossary-terms"))
    assert any(term in t for t in terms), f"{term!r} is not defined under 'The book's terms' ({terms})"


def test_every_verdict_word_words_py_prints_is_defined():
    """The words of every verdict kind (``bnstudy.study.words.COUNT_PHRASES``, the bold ones, with the margin as
    ``m``) and ``inference``'s own constants are terms of the verdicts section; a direction (``higher``/``lower``,
    worded per page) is the glossary's *a direction shown*."""
    from bnstudy.study import inference, words

    verdicts = " ".join(defined_terms(_section("glossary-verdicts")))
    assert set(words.COUNT_PHRASES) == set(inference.VERDICT_KINDS)
    printed = set()
    for kind, (one, many) in words.COUNT_PHRASES.items():
        bold = re.findall(r"\*\*(.+?)\*\*", one.replace("{margin:g}", "m"))
        printed |= set(bold) if bold else {"a direction shown"}
    printed |= {inference.NOT_DECIDED, inference.TOO_FEW, inference.EXACT, inference.NOT_EXACT}
    assert "equivalent within ±m" in printed and "a direction shown" in printed
    for word in printed:
        assert word in verdicts, f"{word!r}, a verdict words.py prints, has no entry under 'The verdicts'"


def _threshold_words() -> set[str]:
    """Every threshold and outcome word the chapters' findings print, from the functions that print them."""
    from bnstudy.study.experiments.batch_size import findings as ch05
    from bnstudy.study.experiments.unknown_task import findings as ch06

    out = {ch05.break_word(0), ch05.break_word(2), ch05.break_word(64, side="above"), ch05.enough_word(0, 16),
           ch05.enough_word(16, 16)}
    lo, hi = ch05.CLAIM_RANGE
    out |= {ch05.claim_word(n, grid) for n, grid in ((0, hi), (0, lo), (1, hi), (lo, hi), (hi * 10, hi * 10))}
    for t in (0.01, 0.0025, math.nan):
        out.add(re.sub(r", (for|with) .*$| \(t ≥.*$", "", ch06.works_phrase({"k2": t}, 0.0025)))
    return {_generic(w) for w in out}


def test_every_threshold_and_outcome_word_the_chapters_print_is_defined():
    terms = " ".join(defined_terms(_section("glossary-thresholds")))
    words = _threshold_words()
    assert {"never", "<= m", ">= m", "none tried", "from t = m on"} <= words, words
    for word in words:
        wanted = word.replace("from t = m on", "from t = ... on")
        assert wanted in terms, f"{word!r}, printed by a chapter, has no entry under 'Threshold and outcome words'"


def test_the_direction_table_lists_each_chapters_declared_words():
    from bnstudy.study.release import CHAPTERS

    rows = {int(m.group(1)): m.group(2).split("; ")
            for m in re.finditer(r"^\| (\d) \| (.+) \|$", _section("glossary-directions"), flags=re.M)}
    for c in CHAPTERS.values():
        declared = list(getattr(c.findings(), "DIRECTIONS", ()))
        assert rows.get(int(c.notebook[:2])) == declared, f"chapter {c.notebook}: glossary {rows.get(int(c.notebook[:2]))}" \
                                                          f" != findings.DIRECTIONS {declared}"
