"""Issue 25's clean pages, on the release book as `make book` builds it: every chapter opens with its answer box,
shows at most about 3,000 words outside its folded methods, and no page shows code, a warning, a path, NaN, a
hand-typed or unresolved reference or a figure without descriptive alt text (bnstudy.study.pagecheck, the checks
of docs/pages.md); every figure's text is at least 9 pt at the column width."""

import json

import pytest

from bnstudy.study import book, pagecheck, style

#: The visible-words ceiling per chapter (issue 25: "about 3,000 words at most").
MAX_VISIBLE_WORDS = 3200
OTHER_PAGES = ("index", "guide", "glossary", "reproduce", "cite", "history", "bibliography")


def _html(release_book):
    root, res, _ = release_book
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return root, root / "_build" / "html"


@pytest.mark.parametrize("nb", [p.name for p in book.chapter_paths()])
def test_chapter_page_is_clean_and_leads_with_its_answer(release_book, nb):
    _, html = _html(release_book)
    page = html / "chapters" / f"{book.page_name(nb)}.html"
    problems = pagecheck.page_problems(page, chapter=True)
    assert not problems, "\n".join(problems)
    words = pagecheck.visible_words(page)
    print(f"{nb}: {words} visible words")
    assert words <= MAX_VISIBLE_WORDS, f"{nb}: {words} visible words (fold methods and caveats)"


@pytest.mark.parametrize("name", OTHER_PAGES)
def test_other_pages_are_clean(release_book, name):
    _, html = _html(release_book)
    problems = pagecheck.page_problems(html / "book" / f"{name}.html", chapter=False)
    assert not problems, "\n".join(problems)


def test_every_figure_is_legible_at_column_width(release_book):
    root, _ = _html(release_book)
    metas = sorted((root / "figures").glob("*.json"))
    assert metas, "no figure sidecars"
    small = []
    for m in metas:
        meta = json.loads(m.read_text())
        if meta.get("page_font_pt", 0) < style.MIN_FONT_PT:
            small.append(f"{meta['figure']}: {meta.get('min_font_pt')} pt drawn {meta.get('width_in')} in wide "
                         f"-> {meta.get('page_font_pt')} pt on the page")
    assert not small, "figures with text under 9 pt at column width:\n" + "\n".join(small)


def test_pagecheck_finds_what_it_should(tmp_path):
    """The checker itself: a page with a shown code cell, a warning with a path, NaN, a hand-typed reference, a
    file-name alt and no answer box is flagged on each count; a clean one is not."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><article><h1>T</h1><p>intro</p><div class='cell'><div class='cell_input'>x=1"
                   "</div></div><p>RuntimeWarning: x in /work/main/.venv/lib</p><p>adjusted p nan</p>"
                   "<p>as shown (Table 3)</p><img src='a.png' alt='../figures/a.png'>"
                   "<p>the <a href='../glossary.md'>glossary</a></p><table><tr><td>0.1 (`lower`)</td></tr></table>"
                   "</article></body></html>")
    probs = " | ".join(pagecheck.page_problems(bad))
    for what in ("code cell", "warning", "path", "NaN", "hand-typed", "alt text", "answer box", "source file",
                 "asterisks or backticks"):
        assert what in probs, (what, probs)
    good = tmp_path / "good.html"
    good.write_text("<html><body><article><h1>T</h1><div class='admonition answer'><p>The answer.</p></div>"
                    "<div class='admonition dropdown methods'><p>many folded words here</p></div>"
                    "<img src='a.png' alt='Accuracy per mode: train mode falls'></article></body></html>")
    assert pagecheck.page_problems(good) == []
    assert pagecheck.visible_words(good) == 3   # "T", "The", "answer": the folded words do not count


def test_every_card_of_the_release_book_links_the_releases_own_rows(release_book):
    """Issue 37: the rows under every figure and table of the release book are the release's per-seed tables, byte
    for byte (sha256 as in release/manifest.json); Fig. 4.2's card links chapter 4's per-seed rows with the filter
    that selects the two freeze modes it compares."""
    import pandas as pd
    from bs4 import BeautifulSoup

    from bnstudy.study.manifest import RELEASE_DIR, read_manifest

    _, html = _html(release_book)
    tables = read_manifest(RELEASE_DIR)["tables"]
    n_cards = 0
    for nb in book.chapter_paths():
        soup = BeautifulSoup((html / "chapters" / f"{book.page_name(nb)}.html").read_text(), "html.parser")
        for code in soup.select("details.bn-provenance code.bn-sha256"):
            stem = code["data-file"].rsplit("/", 1)[-1].removesuffix(".csv")
            assert code.get_text(strip=True) == tables[stem]["sha256"], (nb.name, stem)
            n_cards += 1
    assert n_cards >= 50
    soup = BeautifulSoup((html / "chapters" / "04-heads.html").read_text(), "html.parser")
    card = soup.select_one("#fig-ch04-gap details.bn-provenance")
    assert card.select_one("a.bn-rows")["href"] == "../results/04_heads.csv"
    rows = pd.read_csv(RELEASE_DIR / "04_heads.csv")
    n = int(rows["mode"].isin(["separate_stats", "backbone_eval"]).sum())
    assert f"mode in {{separate_stats, backbone_eval}}: {n:,} of its {len(rows):,} rows" in card.get_text()
    assert "python -m bnstudy.study.figure 4.2 --out remake/" in card.get_text()   # the figure alone, by its number
