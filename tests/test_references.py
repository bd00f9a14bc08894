"""Issue 37's complete references: every work the pages and chapters cite, by key (``{cite}`key```) or in words
("He et al., 2016", "Wu & Johnson (2021)"), is an entry of ``references.bib``, which the references page lists."""

import json
import re
from pathlib import Path

import pytest
from pybtex.database import parse_file

REPO = Path(__file__).resolve().parent.parent
#: "Surname et al., 2016", "Surname and Surname 2018", "Surname & Surname (2021)": the first author and the year.
WORDS = re.compile(r"\b([A-Z][a-zA-Z-]+)(?: et al\.?| (?:and|&) [A-Z][a-zA-Z-]+)[,]? \(?((?:19|20)\d\d)\)?")
KEYS = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")


def _texts():
    """``(name, text)`` of every page the book renders: its Markdown pages (``book/``) and the chapters' markdown
    cells."""
    pages = sorted((REPO / "book").glob("*.md"))
    assert len(pages) >= 7, pages  # the front page, guide, glossary and reference pages
    for p in pages:
        yield f"book/{p.name}", p.read_text()
    for p in sorted((REPO / "chapters").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        yield p.name, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _entries():
    return parse_file(str(REPO / "references.bib")).entries


def test_every_cited_key_resolves_in_references_bib():
    entries = _entries()
    cited = {(name, k.strip()) for name, text in _texts() for m in KEYS.finditer(text) for k in m.group(1).split(",")}
    assert cited, "no {cite} role found: the pattern no longer matches the pages"
    missing = sorted(f"{name}: {k}" for name, k in cited if k not in entries)
    assert not missing, "cited keys missing from references.bib:\n" + "\n".join(missing)


def test_every_work_cited_in_words_has_its_reference():
    have = {(str(e.persons["author"][0].last_names[0]), e.fields["year"]) for e in _entries().values()}
    cited = {(name, m.group(1), m.group(2)) for name, text in _texts() for m in WORDS.finditer(text)}
    assert len(cited) >= 6, cited  # the works the chapters name in words (ResNet, MNIST-C, GroupNorm, ...)
    missing = sorted(f"{name}: {who} {year}" for name, who, year in cited if (who, year) not in have)
    assert not missing, "works cited in words with no entry in references.bib:\n" + "\n".join(missing)


@pytest.mark.parametrize("text, hit", [("(He et al., 2016)", ("He", "2016")), ("Wu & Johnson (2021)", ("Wu", "2021")),
                                       ("the GroupNorm paper, Wu and He 2018, on", ("Wu", "2018")),
                                       ("batch size 2 in 2018", None)])
def test_the_citation_pattern_reads_first_author_and_year(text, hit):
    m = WORDS.search(text)
    assert (m.groups() if m else None) == hit
