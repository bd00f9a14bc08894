import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The book's runs compute under pinned CPU kernels (bnstudy.study.numerics, issue 32): set before torch's first operation in
# the test process, whichever test module is collected first.
from bnstudy.study import numerics

numerics.apply_pin()

import torch  # noqa: E402

# One thread per test process: the tests check exact equalities, and small nets gain nothing from more.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent


#: Session fixtures that build a book, and the xdist group of the tests that use them (`make test` runs pytest-xdist with
#: --dist loadgroup): each book is built once, on one worker, and every test that reads it runs on that worker.
BOOK_GROUPS = {"built_book": "quick_book", "release_book": "release_book"}


def _xdist_group(item) -> str | None:
    """The xdist group of a collected test: the book it reads (BOOK_GROUPS; ``built_html`` by its parameter, the
    glossary test by its ``which``), else its module when it uses a module-scoped fixture (computed once per
    worker: a module's tests stay together), else None (scheduled test by test)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    names = set(getattr(item, "fixturenames", ()))
    if "built_html" in names:
        return BOOK_GROUPS["built_book" if params.get("built_html") == "quick" else "release_book"]
    if params.get("which") in BOOK_GROUPS:
        return BOOK_GROUPS[params["which"]]
    for name in sorted(names):
        if name in BOOK_GROUPS:
            return BOOK_GROUPS[name]
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d and d[-1].scope == "module" for d in defs.values()):
        return item.module.__name__
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark each test with its xdist group (before xdist's own hook reads the marks)."""
    for item in items:
        group = _xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


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


@pytest.fixture(scope="session")
def quick_rebuild(quick_page, tmp_path_factory):
    """A function ``stem -> Rebuild``: the session's quick page of chapter ``stem`` (quick_page: executed once per
    session, empty cache, the same page built_book builds the book from) and the same page executed again from that execution's saved tables (``rows``) with an empty cache, in a
    folder of its own. Each chapter is rebuilt at most once per session (shared by the tests that read it).
    ``Rebuild`` fields: ``first``, ``again`` (executed notebooks), ``rows`` (the first execution's table),
    ``results``, ``figures`` (the first execution's folders, shared by every chapter of built_book), ``results2``,
    ``figures2``, ``cache2`` (the rebuild's), ``parameters`` (the notebook parameters the first execution's sidecar
    recorded: None where the profile's value applied), ``recorded(name)`` (a regex of that value as a refused
    rebuild names it) and ``folder`` (a scratch folder of this chapter's rebuild, for further executions)."""
    import json
    import re
    from types import SimpleNamespace

    from bnstudy.study import book, report

    done = {}

    def _get(stem: str):
        if stem not in done:
            root = quick_page(stem)
            nb_path = [p for p in book.chapter_paths() if p.stem == stem][0]
            out = tmp_path_factory.mktemp(f"rebuild_{stem}")
            rows = root / "results" / f"{stem}.csv"
            again = book.execute_chapter(nb_path, out / "again", "quick", parameters=dict(
                rows=str(rows), results_dir=str(out / "results2"), figures_dir=str(out / "figures2"),
                cache_dir=str(out / "cache2")))
            done[stem] = SimpleNamespace(
                first=root / "chapters" / f"{book.page_name(nb_path)}.ipynb", again=again, rows=rows,
                results=root / "results", figures=root / "figures", results2=out / "results2",
                figures2=out / "figures2", cache2=out / "cache2", folder=out, nb_path=nb_path,
                parameters=json.loads(report.sidecar_path(rows).read_text())["parameters"])
            done[stem].recorded = lambda name, p=done[stem].parameters: re.escape(  # as a refusal names it
                "None (the profile's value)" if p[name] is None else str(p[name]))
        return done[stem]

    return _get


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


def _copy_book_sources(root: Path) -> None:
    from bnstudy.study.book import BOOK_DIR, book_sources

    for p in book_sources():
        dst = root / p.relative_to(BOOK_DIR)  # book/index.md stays in book/
        dst.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            shutil.copytree(p, dst)
        else:
            shutil.copy(p, dst)


def _jupyter_book_build(root: Path):
    jb = Path(sys.executable).parent / "jupyter-book"
    return subprocess.run([str(jb), "build", str(root), "-W", "-n", "--keep-going"], capture_output=True, text=True)


def _session_folder(tmp_path_factory, worker_id: str, name: str) -> Path:
    """A folder shared by every xdist worker of this session (the parent of the workers' base temp folders, which is
    new for each session), or this process's own one without xdist."""
    base = tmp_path_factory.getbasetemp()
    folder = (base if worker_id == "master" else base.parent) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def quick_page(tmp_path_factory, worker_id):
    """A function ``stem -> book root``: chapter ``stem`` executed at the quick profile (empty cache) into the session's
    one quick book (a copy of the book's sources, bnstudy.study.book.book_sources, so the repository's outputs are
    untouched). Each chapter executes once per session whichever xdist worker asks first (a file lock per chapter;
    a marker file written after the page is complete), so the two workers share the chapters' executions."""
    from filelock import FileLock

    from bnstudy.study import book

    root = _session_folder(tmp_path_factory, worker_id, "quick_book")
    with FileLock(root.parent / "quick_book.lock"):
        if not (root / ".sources").exists():
            _copy_book_sources(root)
            (root / ".sources").touch()

    def _page(stem: str, wait: bool = True) -> Path | None:
        done = root / f".{stem}.done"
        lock = FileLock(root / f".{stem}.lock", timeout=-1 if wait else 0)
        try:
            with lock:
                if not done.exists():
                    nb_path = [p for p in book.chapter_paths() if p.stem == stem][0]
                    book.execute_chapter(nb_path, root / "chapters", "quick", parameters=dict(
                        results_dir=str(root / "results"), figures_dir=str(root / "figures"),
                        cache_dir=str(root / "cache")))
                    done.touch()
        except TimeoutError:  # another worker is executing it (wait=False): ask again later
            return None
        return root

    return _page


@pytest.fixture(scope="session")
def built_book(quick_page):
    """Every chapter executed (quick_page: quick profile, empty cache) and the book built with -W, once per session
    (the build's result is saved for the other worker). Returns (book root, CompletedProcess of the build); the HTML
    is in root/_build/html. Shared by test_book.py and test_browser.py."""
    import json

    from filelock import FileLock

    from bnstudy.study import book

    stems = [p.stem for p in book.chapter_paths()]
    for s in stems:  # first the chapters no other worker is executing, then wait for the others
        quick_page(s, wait=False)
    root = [quick_page(s) for s in stems][0]
    saved = root / ".build.json"
    with FileLock(root / ".build.lock"):
        if not saved.exists():
            res = _jupyter_book_build(root)
            saved.write_text(json.dumps(dict(args=res.args, returncode=res.returncode, stdout=res.stdout,
                                             stderr=res.stderr)))
    return root, subprocess.CompletedProcess(**json.loads(saved.read_text()))


@pytest.fixture(scope="session")
def release_book(tmp_path_factory, request):
    """The published book as `make book` builds it: every chapter in the data release (release/) analyses the
    release's rows (nothing trained; an empty cache proves it), a chapter not released yet is its quick page
    (taken from built_book, which executed it already; requested only then, so that a worker building this book does
    not build the quick one too), and the book is built with -W. Returns (book root,
    CompletedProcess of the build, seconds the released pages took)."""
    import time

    from bnstudy.study import book
    from bnstudy.study.release import RELEASE_DIR, read_manifest

    root = tmp_path_factory.mktemp("release_book_root")
    _copy_book_sources(root)
    released = {c["notebook"]: c for c in read_manifest(RELEASE_DIR)["chapters"].values()}
    t0 = time.perf_counter()
    for nb_path in book.chapter_paths():
        params = dict(results_dir=str(root / "results"), figures_dir=str(root / "figures"),
                      cache_dir=str(root / "cache" / nb_path.stem))  # per chapter: a released one's stays empty
        if nb_path.stem not in released:  # the quick page, as `make book` runs it
            quick = request.getfixturevalue("built_book")[0]
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
