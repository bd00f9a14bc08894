"""Checks of a built book page (HTML), the conventions of ``docs/pages.md`` (issue 25): the answer box comes
first, the visible text is short, and no code, warning, path, NaN or broken reference reaches a reader.

``python -m bnstudy.study.pagecheck _build/html/chapters/04-heads.html`` prints a page's visible words and problems.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["visible_words", "answer_first", "page_problems", "figure_alts", "card_problems"]

#: Text that must not reach a reader: Python warnings and tracebacks, local paths, NaN.
_LEAKS = {
    "a Python warning": re.compile(r"\b\w*Warning:|Traceback \(most recent call last\)"),
    "a file path": re.compile(r"/work/|\.venv/|site-packages|/tmp/|/root/|/home/"),
    "NaN": re.compile(r"(?<![\w-])(nan|NaN|NAN)(?![\w-])"),
    "a hand-typed reference": re.compile(r"\((?:see )?(?:Table|Fig\.|Figure) \d+\)|\(chapter \d+, (?:Figure|Table) \d+\)"),
}


def _soup(page):
    from bs4 import BeautifulSoup

    return BeautifulSoup(Path(page).read_text(encoding="utf-8"), "html.parser")


def _article(soup):
    art = soup.find("article") or soup.find("main") or soup
    for sel in ("div.toggle-hidden", "nav", "script", "style", ".headerlink", "footer", ".prev-next-area"):
        for t in art.select(sel):
            t.decompose()
    return art


def visible_words(page) -> int:
    """Words a reader sees without opening anything on the HTML ``page``: no folded admonitions, toggles, code
    cells, outputs, tables or math."""
    art = _article(_soup(page))
    for sel in (".dropdown", ".toggle", "details", "div.cell", "div.cell_output", "pre", ".math", "table",
                "mjx-container", "span.math", "div.math"):
        for t in art.select(sel):
            t.decompose()
    return len(re.findall(r"[A-Za-z][A-Za-z'’-]*", art.get_text(" ")))


def answer_first(page) -> bool:
    """Whether the first thing under the page's title is the answer box (an admonition of class ``answer``)."""
    art = _article(_soup(page))
    h1 = art.find("h1")
    if h1 is None:
        return False
    for sib in h1.find_next_siblings():
        if sib.name in ("span", "a") or (sib.name == "div" and not sib.get_text(strip=True)):
            continue
        return "answer" in (sib.get("class") or []) and "admonition" in (sib.get("class") or [])
    return False


def figure_alts(page) -> list[tuple[str, str]]:
    """``(src, alt)`` of every image in the article."""
    art = _article(_soup(page))
    return [(img.get("src", ""), img.get("alt", "")) for img in art.find_all("img")]


def card_problems(page) -> list[str]:
    """What is wrong with the provenance cards of the built HTML ``page``: a figure or prose table without a card,
    a card without a rows link, a rows link or checksum whose file is not in the built book (resolved relative to
    ``page``), a checksum that is not the file's sha256, a rows link without its checksum. Empty if all are sound."""
    from urllib.parse import unquote

    from .provenance import CARD_CLASS, sha256_of

    page = Path(page)
    art = _article(_soup(page))
    out = []
    shown = [(fig, fig.get("id") or next((s.get("id") for s in fig.find_all("span", id=True)), None) or "unlabelled",
              fig.select(f"details.{CARD_CLASS}")) for fig in art.find_all("figure")]
    for i, t in enumerate(art.find_all("table")):  # a table of the prose: its card follows it
        if t.find_parent(["figure", "details"]) is None and t.find_parent("div", class_="cell_output") is None:
            nxt = t.find_next(lambda tag: tag.name in ("details", "table", "figure"))
            shown.append((t, f"the prose table {i + 1} ({t.get_text(' ', strip=True)[:40]}...)",
                          [nxt] if nxt is not None and CARD_CLASS in (nxt.get("class") or []) else []))
    for fig, name, cards in shown:
        if not cards:
            out.append(f"a figure or table without its provenance card: {name}")
            continue
        for card in cards:
            links = card.select("a.bn-rows")
            sums = {c.get("data-file"): c.get_text(strip=True) for c in card.select("code.bn-sha256")}
            if not links:
                out.append(f"a provenance card without a link to its rows: {name}")
            for a in links:
                href = a.get("href", "")
                target = (page.parent / unquote(href.split("#")[0])).resolve()
                if re.match(r"[a-z]+:", href) or not target.is_file():
                    out.append(f"a provenance card's rows link does not resolve in the built book: {name} -> {href}")
                    continue
                if href not in sums:
                    out.append(f"a provenance card's rows link has no sha256: {name} -> {href}")
            for href, digest in sums.items():
                target = (page.parent / unquote(str(href))).resolve()
                if not target.is_file():
                    out.append(f"a provenance card's sha256 names a file not in the built book: {name} -> {href}")
                elif sha256_of(target) != digest:
                    out.append(f"a provenance card's sha256 does not match its file: {name} -> {href} "
                               f"(card {digest[:12]}..., file {sha256_of(target)[:12]}...)")
    return out


def page_problems(page, chapter: bool = True) -> list[str]:
    """What a reader should not see on ``page``: code cells, a warning, a path, NaN, a hand-typed reference, Markdown
    in a table cell, an unresolved reference, a link to a source file, a figure without descriptive alt text; for a
    ``chapter`` also an answer box that is not first, and :func:`card_problems`. Empty if clean."""
    soup = _soup(page)
    art = _article(soup)
    out = []
    if art.select("div.cell_input, div.cell div.highlight-ipython3"):
        out.append(f"{len(art.select('div.cell_input'))} code cell(s) shown")
    for t in art.select("code, div.highlight"):  # code the prose shows on purpose (a command, a snippet) is no leak;
        if t.find_parent("div", class_="cell_output") is None:  # code cells' outputs are checked
            t.decompose()
    text = art.get_text(" ")
    for what, rx in _LEAKS.items():
        m = rx.search(text)
        if m:
            a = max(0, m.start() - 60)
            out.append(f"{what}: ...{text[a:m.end() + 60].strip()}...")
    for td in art.select("td, th"):  # a table is HTML: Markdown pasted into a cell shows its asterisks / backticks
        if "**" in td.get_text() or "`" in td.get_text():
            out.append(f"Markdown asterisks or backticks in a table cell: {td.get_text(strip=True)[:80]!r}")
            break
    for x in art.select("span.xref, a.reference.internal.missing, .problematic"):
        out.append(f"an unresolved reference: {x.get_text(strip=True)}")
    for a in art.find_all("a", href=True):  # a Markdown link pasted by glue keeps its source name: dead in HTML
        href = a["href"].split("#")[0]
        if not re.match(r"[a-z]+:", href) and re.search(r"\.(md|ipynb)$", href):
            out.append(f"a link to a source file, dead in the HTML: {a['href']} ({a.get_text(strip=True)!r})")
    for src, alt in figure_alts(page):
        if not alt.strip() or re.search(r"\.(png|svg|jpg)$|/|_build|figures", alt.strip()):
            out.append(f"a figure without descriptive alt text: {src} (alt {alt!r})")
    if chapter:
        if not answer_first(page):
            out.append("the answer box (admonition class 'answer') is not the first thing under the title")
        out += card_problems(page)
    return out


def main(argv=None) -> int:
    pages = argv if argv is not None else sys.argv[1:]
    bad = 0
    for p in pages:
        probs = page_problems(p, chapter="/chapters/" in str(p))
        print(f"{p}: {visible_words(p)} visible words; {len(probs)} problem(s)")
        for x in probs:
            print(f"  - {x}")
        bad += bool(probs)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
