"""The book's layout (issue 37): ``book/`` holds the pages that are not chapters (front page, guide, glossary,
reference pages), ``_config.yml`` and ``_toc.yml`` stay at the top level, and every address those pages had before
they moved (``guide.html``, ``index.html``, ...) still leads to the page in the built book (sphinx-reredirects,
``_config.yml``'s ``redirects``)."""

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bnstudy.study import book, cli

REPO = Path(__file__).resolve().parent.parent
#: The pages the top level held before ``book/`` (their HTML addresses are the published book's old URLs).
OLD_PAGES = ("index", "guide", "glossary", "reproduce", "cite", "history", "bibliography")


def test_book_holds_exactly_the_pages_of_the_toc_that_are_not_chapters():
    toc = book.toc_files()
    assert toc[0] == "book/index", "the front page is the book's root"
    assert (REPO / "_config.yml").is_file() and (REPO / "_toc.yml").is_file()
    pages = sorted(f for f in toc if not f.startswith("chapters/"))
    assert all(f.startswith("book/") for f in pages), f"a page that is not a chapter outside book/: {pages}"
    held = sorted(p.relative_to(REPO).with_suffix("").as_posix() for p in (REPO / "book").iterdir())
    assert held == pages, f"book/ holds {held}, the table of contents names {pages}"
    assert [p.name for p in REPO.glob("*.md")] == ["README.md"], "a book page left at the top level"


def test_every_old_address_is_redirected_to_its_page_in_book():
    moved = book.redirects()
    assert moved == {name: f"book/{name}.html" for name in OLD_PAGES}, moved
    for name in OLD_PAGES:
        assert (REPO / "book" / f"{name}.md").is_file(), name
    # the template keeps the #section and works without scripts too
    template = (REPO / "_templates" / "redirect.html").read_text()
    assert "window.location.hash" in template and 'http-equiv="refresh"' in template
    assert '<a href="${to_uri}">' in template and 'rel="canonical" href="${to_uri}"' in template


def test_a_one_chapter_rerun_book_has_no_redirects():
    """A rerun's book (``bnstudy chapter``) lacks the pages the published book's old addresses lead to."""
    assert book.redirects(), "the published book keeps its old addresses"
    assert "redirects" not in cli.book_config("04")["sphinx"]["config"]


class _Redirect(HTMLParser):
    """The targets a redirect page names: its refresh, canonical link, visible link and script."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.targets, self.script = set(), ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "meta" and (a.get("http-equiv") or "").lower() == "refresh":
            self.targets.add(a["content"].split("url=", 1)[1])
        elif tag in ("link", "a") and a.get("href"):
            self.targets.add(a["href"])

    def handle_data(self, data):
        if self.lasttag == "script":
            self.script += data


@pytest.mark.slow
def test_every_old_address_of_the_built_book_leads_to_its_page(built_html):
    """Each old address (``guide.html``) is a redirect page whose refresh, canonical link, visible link and script
    all name the moved page (``book/guide.html``), which the build holds and which is that page (its title is the
    page's); the script carries the ``#section`` over. ``index.html``, what a server opens first, is the front page's."""
    titles = {}
    for name in OLD_PAGES:
        new = built_html / "book" / f"{name}.html"
        assert new.is_file(), f"the build has no {new.relative_to(built_html)}"
        titles[name] = re.search(r"<title>(.*?)</title>", new.read_text(), flags=re.S).group(1).strip()
        old = built_html / f"{name}.html"
        assert old.is_file(), f"the old address {name}.html is missing from the build"
        page = _Redirect()
        page.feed(old.read_text())
        assert page.targets == {f"book/{name}.html"}, f"{name}.html leads to {page.targets}"
        assert f'"book/{name}.html" + window.location.hash' in page.script, f"{name}.html drops the #section"
    assert len(set(titles.values())) == len(OLD_PAGES), titles  # seven different pages, not one
    front = (built_html / "book" / "index.html").read_text()
    assert 'id="what-the-chapters-find"' in front, "index.html does not lead to the front page"
