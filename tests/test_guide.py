"""The decision guide (guide.md): every number and verdict on it is glued from an executed chapter, every
recommendation cites a figure or table that a chapter defines, and the cross-page Markdown glue renders."""

import re
from pathlib import Path

import pytest
from docutils import nodes

from bnstudy import book
from bnstudy.sphinxext import inline_markdown

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "guide.md"
ROLE = re.compile(r"\{(glue(?::\w+)?|numref|cite(?::\w+)?|ref)\}`([^`]*)`")


def _refs(kind: str) -> list[str]:
    return [text for k, text in ROLE.findall(GUIDE.read_text()) if k.startswith(kind)]


def _chapter_sources() -> dict[str, str]:
    """``{"chapters/01-freeze-modes.ipynb": source text of chapters/01_freeze_modes.ipynb, ...}``."""
    return {f"chapters/{book.page_name(p)}.ipynb": p.read_text() for p in book.chapter_paths()}


def test_guide_is_the_last_chapter_of_the_toc():
    toc = (REPO / "_toc.yml").read_text()
    chapters = re.findall(r"- file: (\S+)", toc.split("caption: Reference")[0])
    assert chapters[-1] == "guide"


def test_guide_types_no_number_of_its_own():
    text = GUIDE.read_text()
    text = ROLE.sub(" ", text)
    text = re.sub(r"`[^`]*`", " ", text)  # code
    text = re.sub(r"\$[^$]*\$", " ", text)  # math
    # what may stay: chapter, trap and question numbers, list numbers, network names, the 95% of "95% interval"
    text = re.sub(r"\b([Cc]hapters?|trap|[Qq]uestion) \d+( to \d+)?", " ", text)
    text = re.sub(r"^\d\. ", " ", text, flags=re.M)
    for name in ("ResNet-18", "MobileNetV3", "95%"):
        text = text.replace(name, " ")
    assert not re.search(r"\d", text), re.findall(r".{30}\d.{30}", text)


def test_guide_glues_only_from_chapter_pages_with_their_own_keys():
    pages = _chapter_sources()
    glued = _refs("glue")
    assert len(glued) > 50
    for text in glued:
        assert "::" in text, f"{text!r}: the guide has no glue of its own; give the chapter page"
        page, key = text.split("::", 1)
        assert page in pages, f"{page!r} is not a chapter page ({sorted(pages)})"
        number = page.split("/")[1][:2]
        assert key.startswith(f"ch{number}_"), f"{key!r} is not chapter {number}'s key"


def test_guide_cites_figures_and_tables_that_the_chapters_define():
    labels = set()
    for src in _chapter_sources().values():
        labels |= set(re.findall(r":name:\s*([\w-]+)", src))
    cited = _refs("numref")
    assert {"tbl-ch02-checklist", "fig-ch03-mismatch", "fig-ch06-routing", "tab-ch05-winners"} <= set(cited)
    assert set(cited) <= labels, sorted(set(cited) - labels)
    # every chapter backs at least one recommendation
    assert {c[6:8] for c in cited} == {f"{i:02d}" for i in range(1, 8)}


def test_inline_markdown_renders_verdict_words_and_refuses_other_markdown():
    out = inline_markdown("**does not hold**")
    assert len(out) == 1 and isinstance(out[0], nodes.strong) and out[0].astext() == "does not hold"
    assert [type(n) for n in inline_markdown("yes")] == [nodes.Text]
    mixed = inline_markdown("*quick* profile, **3** seeds")
    assert [type(n) for n in mixed] == [nodes.emphasis, nodes.Text, nodes.strong, nodes.Text]
    assert "".join(n.astext() for n in mixed) == "quick profile, 3 seeds"
    for other in ("[a link](x.html)", "`code`", "<b>html</b>", "# heading", "two\nlines", "**open"):
        assert inline_markdown(other) is None, other


@pytest.mark.slow
def test_guide_page_pastes_every_value_and_verdict(built_html):
    page = (built_html / "guide.html").read_text()
    assert "IPython.core.display" not in page and "glue:" not in page and "::ch0" not in page
    pasted = re.findall(r'class="pasted-(?:text|inline)"', page)
    assert len(pasted) == len(_refs("glue"))
    for label in set(_refs("numref")):  # resolved to a numbered link, not left as the label
        assert f"#{label}" in page, label
