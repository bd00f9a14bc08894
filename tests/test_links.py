"""Offline link check of the built book: every internal href/src of every page points at a file of the
build, and every #fragment at an id on the target page; nothing the page loads (scripts, styles, images,
fonts) comes from outside the build."""

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

LOADED = {("script", "src"), ("link", "href"), ("img", "src"), ("source", "src"), ("iframe", "src")}


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("id", "name"):
            if a.get(k):
                self.ids.add(a[k])
        for attr in ("href", "src"):
            if a.get(attr) is not None:
                self.links.append((tag, attr, a[attr]))


def parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    return p


def broken_links(html_root: Path) -> list[str]:
    """Every internal link or loaded resource of every page under ``html_root`` that does not resolve."""
    # the pages, not the theme's template fragments that ship as .html files under _static/
    pages = sorted(p for p in html_root.rglob("*.html") if not p.relative_to(html_root).parts[0].startswith("_"))
    parsed = {p: parse(p) for p in pages}
    problems = []
    for page, info in parsed.items():
        rel = page.relative_to(html_root)
        for tag, attr, url in info.links:
            parts = urlsplit(url)
            if parts.scheme in ("mailto", "javascript", "data") or url.startswith("#") and not url[1:]:
                continue
            if parts.scheme or url.startswith("//"):
                if (tag, attr) in LOADED:
                    problems.append(f"{rel}: <{tag} {attr}> loads an external resource {url}")
                continue  # an ordinary hyperlink to the web is allowed
            target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{rel}: <{tag} {attr}={url!r}>: no file {target}")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else parse(target).ids
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{rel}: {url!r}: no id {parts.fragment!r} in {target.name}")
    return problems


@pytest.mark.slow
def test_every_internal_link_and_cross_reference_resolves_offline(built_html):
    pages = list(built_html.rglob("*.html"))
    assert len(pages) >= 6
    problems = broken_links(built_html)
    assert not problems, "\n".join(problems[:50])


def test_link_checker_finds_a_missing_file_a_missing_anchor_and_an_external_script(tmp_path):
    (tmp_path / "a.html").write_text('<p id="here"><a href="b.html#nowhere">x</a><a href="c.html">y</a>'
                                     '<a href="#here">z</a><a href="https://example.org/">web</a>'
                                     '<script src="https://cdn.example.org/m.js"></script></p>')
    (tmp_path / "b.html").write_text('<p id="there">b</p>')
    problems = broken_links(tmp_path)
    assert len(problems) == 3, problems
    assert any("nowhere" in p for p in problems) and any("c.html" in p for p in problems)
    assert any("external" in p for p in problems)
