import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The book's runs compute under pinned CPU kernels (bnstudy.numerics, issue 32): set before torch's first operation in
# the test process, whichever test module is collected first.
from bnstudy import numerics

numerics.apply_pin()

import torch  # noqa: E402

# One thread per test process: the tests check exact equalities, and small nets gain nothing from more.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def glued_payloads():
    """A function: executed notebook path -> {glue name: payload} (HTML tables with pandas' random Styler ids
    blanked), to compare two executions of a page."""
    def _glued(path) -> dict:
        """Glue key -> payload of an executed notebook (HTML tables with pandas' random Styler ids blanked)."""
        import re

        import nbformat
        out = {}
        for cell in nbformat.read(path, as_version=4).cells:
            for o in cell.get("outputs", []):
                key = o.get("metadata", {}).get("scrapbook", {}).get("name")
                if key:
                    data = {k.rsplit("/", 2)[-2] + "/" + k.rsplit("/", 2)[-1]: v for k, v in o["data"].items()}
                    out[key] = re.sub(r"T_[0-9a-f_]+", "T_", str(data.get("text/html", data.get("text/markdown",
                                                                                                 data.get("text/plain")))))
        return out

    return _glued


@pytest.fixture
def page_and_rebuild(tmp_path):
    """A function ``(stem, params) -> (first, again, rows)``: execute chapter ``stem`` (quick profile, ``params``,
    its own cache and output folders under ``tmp_path``), then again from the first execution's saved tables
    (``rows``) with an empty cache (``cache2``); returns both executed notebooks and the rows path."""
    from bnstudy import book

    def _run(stem: str, params: dict):
        nb_path = [p for p in book.chapter_paths() if p.stem == stem][0]
        first = book.execute_chapter(nb_path, tmp_path / "run", "quick", parameters=dict(
            params, results_dir=str(tmp_path / "results"), figures_dir=str(tmp_path / "figures"),
            cache_dir=str(tmp_path / "cache")))
        rows = str(tmp_path / "results" / f"{stem}.csv")
        again = book.execute_chapter(nb_path, tmp_path / "again", "quick", parameters=dict(
            params, rows=rows, results_dir=str(tmp_path / "results2"), figures_dir=str(tmp_path / "figures2"),
            cache_dir=str(tmp_path / "cache2")))
        return first, again, rows

    return _run


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


def _copy_book_sources(root: Path) -> None:
    from bnstudy.book import book_sources

    for p in book_sources():
        if p.is_dir():
            shutil.copytree(p, root / p.name)
        else:
            shutil.copy(p, root / p.name)


def _jupyter_book_build(root: Path):
    jb = Path(sys.executable).parent / "jupyter-book"
    return subprocess.run([str(jb), "build", str(root), "-W", "-n", "--keep-going"], capture_output=True, text=True)


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """Every chapter executed (quick profile, empty cache) and the book built with -W, in a temporary copy
    of the book's sources (bnstudy.book.book_sources) so the repository's outputs are untouched. Returns (book root, CompletedProcess of the build);
    the HTML is in root/_build/html. Shared by test_book.py and test_browser.py (built once per session)."""
    from bnstudy import book

    root = tmp_path_factory.mktemp("book_root")
    _copy_book_sources(root)
    for nb_path in book.chapter_paths():
        book.execute_chapter(nb_path, root / "chapters", "quick", parameters=dict(
            results_dir=str(root / "results"), figures_dir=str(root / "figures"), cache_dir=str(root / "cache")))
    return root, _jupyter_book_build(root)


@pytest.fixture(scope="session")
def release_book(tmp_path_factory, built_book):
    """The published book as `make book` builds it: every chapter in the data release (release/) analyses the
    release's rows (nothing trained; an empty cache proves it), a chapter not released yet is its quick page
    (taken from built_book, which executed it already), and the book is built with -W. Returns (book root,
    CompletedProcess of the build, seconds the released pages took)."""
    import time

    from bnstudy import book
    from bnstudy.release import RELEASE_DIR, read_manifest

    root = tmp_path_factory.mktemp("release_book_root")
    _copy_book_sources(root)
    released = {c["notebook"]: c for c in read_manifest(RELEASE_DIR)["chapters"].values()}
    t0 = time.perf_counter()
    for nb_path in book.chapter_paths():
        params = dict(results_dir=str(root / "results"), figures_dir=str(root / "figures"),
                      cache_dir=str(root / "cache" / nb_path.stem))  # per chapter: a released one's stays empty
        if nb_path.stem not in released:  # the quick page, as `make book` runs it
            quick = built_book[0]
            (root / "chapters").mkdir(exist_ok=True)
            shutil.copy(quick / "chapters" / f"{book.page_name(nb_path)}.ipynb", root / "chapters")
            for folder in ("results", "figures"):
                for f in (quick / folder).glob(f"{nb_path.stem[:2]}[-_]*"):
                    (root / folder).mkdir(exist_ok=True)
                    shutil.copy(f, root / folder)
            continue
        params["rows"] = str(RELEASE_DIR / f"{nb_path.stem}.csv")
        book.execute_chapter(nb_path, root / "chapters", released[nb_path.stem]["profile"], parameters=params)
    pages_s = time.perf_counter() - t0
    return root, _jupyter_book_build(root), pages_s


@pytest.fixture(scope="session", params=["quick", "release"])
def built_html(request):
    """The built HTML folder: $BNSTUDY_BOOK_HTML when set (an existing build, e.g. _build/html after
    `make book`), else the session's quick book (built_book) and the release book (release_book) in turn."""
    given = os.environ.get("BNSTUDY_BOOK_HTML")
    if given:
        if request.param == "release":
            pytest.skip("$BNSTUDY_BOOK_HTML names one built book; it is checked once, as 'quick'")
        return Path(given).resolve()
    res = request.getfixturevalue("built_book" if request.param == "quick" else "release_book")
    root, res = res[0], res[1]
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return root / "_build" / "html"
