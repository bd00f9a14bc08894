"""The built book in a real browser: every page opened in headless Chromium (Debian's /usr/bin/chromium,
driven by playwright), served from localhost with no other network. Checks on every page: no console errors,
no failed requests, no request leaving localhost, no broken images, math rendered by MathJax (no raw ``\\(``,
``\\[`` or ``$$`` left in the visible text), every figure with a caption and an id; at a phone's 390 px, no page wider than the screen, wide tables scrolling in
their own box with the first column in view, and every figure opening full-size. A full-page screenshot of
every page (and the first screen at 390 px, in ``phone/``) goes to ``$BNSTUDY_SCREENSHOTS`` (default:
``screenshots/`` next to the HTML folder, i.e. ``_build/screenshots``) for a person to look at."""

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("BNSTUDY_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(built_html):
    handler = functools.partial(_QuietHandler, directory=str(built_html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium chromium-driver (.ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=FLAGS, viewport={"width": 1280, "height": 900}, service_workers="block")
        try:
            yield ctx
        finally:
            ctx.close()


def _pages(html_root: Path) -> list[str]:
    """Every page of the build, not the theme's fragments under ``_static/`` nor the redirect pages at the old
    addresses (``guide.html``: they open the page they lead to, which is visited itself; test_book.py checks them)."""
    from bnstudy.study.book import redirects

    moved = {f"{old}.html" for old in redirects()}
    pages = (p.relative_to(html_root) for p in html_root.rglob("*.html"))
    return sorted(str(p) for p in pages if not p.parts[0].startswith("_") and str(p) not in moved)


MATH_DONE = """async () => {
  if (!window.MathJax) return 'none';
  if (MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  return 'done';
}"""

PAGE_FACTS = """() => {
  const main = document.querySelector('main') || document.body;
  const figures = [...document.querySelectorAll('figure')].map(f => ({
      id: f.id || (f.querySelector('[id]') || {}).id || '',
      caption: (f.querySelector('figcaption') || {textContent: ''}).textContent.trim()}));  // textContent: a figure folded in a dropdown has its caption, not rendered
  return {
    text: main.innerText,
    brokenImages: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
    figures,
    mathSource: document.querySelectorAll('.math, span.math, div.math').length,
    mathRendered: document.querySelectorAll('mjx-container').length,
  };
}"""


#: A phone's viewport (issue 37: a 390 px wide phone).
PHONE = {"width": 390, "height": 844}

PHONE_FACTS = """() => {
  const main = document.querySelector('main') || document.body;
  // the nearest box that scrolls sideways, from the element itself up to the article
  const box = el => { for (let a = el; a && a !== main; a = a.parentElement) {
      if (/(auto|scroll)/.test(getComputedStyle(a).overflowX)) return a; } return null; };
  const tables = [...main.querySelectorAll('table')].map(t => {
      const b = box(t), first = t.querySelector('tbody tr > :first-child') || t.querySelector('tr > :first-child');
      return {where: (t.closest('[id]') || {}).id || '', box: !!b, fits: !b || b.getBoundingClientRect().right <= innerWidth + 1,
              sticky: first ? getComputedStyle(first).position : 'sticky', wide: t.scrollWidth > innerWidth};
  });
  const images = [...main.querySelectorAll('figure img')].map(i => ({src: i.src,
      link: i.closest('a') ? i.closest('a').href : null}));
  const pres = [...main.querySelectorAll('pre')].filter(p => !box(p) && p.getBoundingClientRect().right > innerWidth + 1)
      .map(p => p.textContent.slice(0, 60));
  return {width: innerWidth, scrollWidth: document.documentElement.scrollWidth, tables, images, pres};
}"""


@pytest.fixture(scope="module")
def visits(built_html, server, browser):
    """Every page of the book opened once, served from localhost: ``{page: (what went wrong loading it, its facts at
    1280 px, its facts at 390 px)}``. A full-page screenshot at 1280 px and a first-screen one at 390 px of each page
    go to ``$BNSTUDY_SCREENSHOTS`` (``phone/`` for the narrow ones)."""
    shots = Path(os.environ.get("BNSTUDY_SCREENSHOTS") or built_html.parent / "screenshots")
    shutil.rmtree(shots, ignore_errors=True)
    (shots / "phone").mkdir(parents=True)
    out = {}
    for rel in _pages(built_html):
        page = browser.new_page()
        seen = {"console": [], "failed": [], "external": [], "status": []}
        page.on("console", lambda m: m.type == "error" and seen["console"].append(m.text))
        page.on("pageerror", lambda e: seen["console"].append(str(e)))
        page.on("requestfailed", lambda r: seen["failed"].append(f"{r.url} ({r.failure})"))
        page.on("response", lambda r: r.status >= 400 and seen["status"].append(f"{r.status} {r.url}"))

        def route(r):
            if r.request.url.startswith(server) or r.request.url.startswith("data:"):
                r.continue_()
            else:
                seen["external"].append(r.request.url)
                r.abort()
        page.route("**/*", route)
        page.goto(f"{server}/{rel}", wait_until="load")
        page.evaluate(MATH_DONE)
        page.wait_for_load_state("networkidle")
        facts = page.evaluate(PAGE_FACTS)
        name = rel.replace("/", "__").removesuffix(".html") + ".png"
        page.screenshot(path=str(shots / name), full_page=True)
        page.set_viewport_size(PHONE)
        page.screenshot(path=str(shots / "phone" / name), animations="disabled")  # the sidebar's slide finished
        phone = page.evaluate(PHONE_FACTS)
        page.close()
        out[rel] = (seen, facts, phone)
    print(f"screenshots of {len(out)} pages in {shots}")
    return out


def test_every_page_renders_offline_without_errors(visits):
    pages = list(visits)
    assert "book/index.html" in pages and any(p.startswith("chapters/") for p in pages)
    problems = []
    for rel, (seen, facts, _) in visits.items():
        for kind, items in seen.items():
            problems += [f"{rel}: {kind}: {x}" for x in items]
        problems += [f"{rel}: broken image {src}" for src in facts["brokenImages"]]
        for raw in ("\\(", "\\[", "$$"):
            if raw in facts["text"]:
                i = facts["text"].index(raw)
                problems.append(f"{rel}: raw math {raw!r} left in the text: ...{facts['text'][max(0, i - 60):i + 60]!r}")
        if facts["mathSource"] and not facts["mathRendered"]:
            problems.append(f"{rel}: {facts['mathSource']} math elements, none rendered by MathJax")
        for f in facts["figures"]:
            if not f["id"] or not f["caption"]:
                problems.append(f"{rel}: figure without {'an id' if not f['id'] else 'a caption'}: {f}")
    assert not problems, "\n".join(problems[:60])


def test_no_page_is_wider_than_a_phone_and_every_figure_opens_full_size(visits):
    """At 390 px (issue 37): no page scrolls sideways as a whole (``scrollWidth`` of the document at most the
    viewport); a table wider than the screen scrolls inside a box that fits, with its first column sticky; no code
    block sticks out of the screen; every figure's image links to the image itself."""
    problems, n_images, n_wide = [], 0, 0
    for rel, (_, _, phone) in visits.items():
        assert phone["width"] == PHONE["width"], phone["width"]
        if phone["scrollWidth"] > phone["width"]:
            problems.append(f"{rel}: the page is {phone['scrollWidth']} px wide at {phone['width']} px")
        for t in phone["tables"]:
            n_wide += t["wide"]
            if t["wide"] and not (t["box"] and t["fits"]):
                problems.append(f"{rel}: a table near #{t['where']} is wider than the screen and scrolls in no box that fits")
            if t["sticky"] != "sticky":
                problems.append(f"{rel}: a table near #{t['where']} does not keep its first column in view")
        problems += [f"{rel}: a code block sticks out of the screen: {p!r}" for p in phone["pres"]]
        for img in phone["images"]:
            n_images += 1
            if img["link"] != img["src"]:
                problems.append(f"{rel}: figure image {img['src']} links to {img['link']}, not to itself")
    assert n_images > 10 and n_wide > 0, (n_images, n_wide)  # the check saw the book's figures and wide tables
    assert not problems, "\n".join(problems[:60])


def test_an_old_address_with_a_section_lands_on_that_section_of_the_moved_page(server, browser):
    """The published book's old addresses (issue 37: the pages that are not chapters moved into book/): a link to
    ``guide.html#guide-install`` lands on ``book/guide.html#guide-install``, and the bare address opens the front page."""
    page = browser.new_page()
    try:
        page.goto(f"{server}/guide.html#guide-install", wait_until="load")
        page.wait_for_url("**/book/guide.html#guide-install")
        assert page.evaluate("() => !!document.getElementById('guide-install')"), page.url
        page.goto(f"{server}/", wait_until="load")
        page.wait_for_url("**/book/index.html")
        assert page.evaluate("() => !!document.getElementById('what-the-chapters-find')"), page.url
    finally:
        page.close()


def test_a_rerun_page_opened_from_disk_renders_its_math_offline(tmp_path, browser):
    """`bnstudy chapter` builds a one-chapter book whose MathJax is in the build; opened as a file, with every request
    that leaves the folder refused, its math must render and nothing may fail to load."""
    import nbformat

    from bnstudy.study import cli

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("Inline $3\\times32\\times32$ and display\n\n$$\nx^2 = \\frac{1}{2}\n$$\n")]
    nbformat.write(nb, tmp_path / "01-toy.ipynb")
    html = cli.build_page(tmp_path / "01-toy.ipynb", tmp_path)  # the one-chapter book, as `bnstudy chapter` builds it
    page = browser.new_page()
    seen = []
    page.on("console", lambda m: m.type == "error" and seen.append(m.text))
    page.on("requestfailed", lambda r: seen.append(f"{r.url} ({r.failure})"))
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(tmp_path.as_uri()) or
               r.request.url.startswith("data:") else (seen.append(r.request.url), r.abort()))
    page.goto(html.as_uri(), wait_until="load")
    assert page.evaluate(MATH_DONE) == "done"
    page.wait_for_load_state("networkidle")
    rendered = page.evaluate("() => document.querySelectorAll('mjx-container').length")
    text = page.evaluate("() => document.body.innerText")
    page.close()
    assert rendered == 2 and "$" not in text and not seen, (rendered, seen)
