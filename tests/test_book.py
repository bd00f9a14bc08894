"""The pipeline end to end: every chapter executes under papermill (quick profile) and the book builds
with warnings as errors. Runs in a temporary copy of the book so the repo's outputs are untouched."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from bnstudy import book

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built_book(tmp_path_factory):
    root = tmp_path_factory.mktemp("book_root")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(REPO / name, root / name)
    (root / "book").mkdir()
    for p in (REPO / "book").glob("*.md"):
        shutil.copy(p, root / "book" / p.name)
    shutil.copy(REPO / "book" / "references.bib", root / "book" / "references.bib")
    executed = root / "book" / "executed"
    for nb_path in book.chapter_paths():
        book.execute_chapter(nb_path, executed, "quick", parameters=dict(
            results_dir=str(root / "book" / "results"), figures_dir=str(root / "book" / "figures"),
            cache_dir=str(root / "cache")))
    jb = Path(sys.executable).parent / "jupyter-book"
    res = subprocess.run([str(jb), "build", str(root), "--path-output", str(root / "book"), "-W", "-n",
                          "--keep-going"], capture_output=True, text=True)
    return root, res


@pytest.mark.slow
def test_every_chapter_executes_and_the_book_builds_without_warnings(built_book):
    root, res = built_book
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert (root / "book" / "_build" / "html" / "index.html").exists()


@pytest.mark.slow
def test_toc_lists_every_chapter_notebook(built_book):
    toc = (REPO / "_toc.yml").read_text()
    for nb_path in book.chapter_paths():
        assert f"book/executed/{nb_path.stem}" in toc, nb_path.name


@pytest.mark.slow
def test_chapter_one_outputs_land_with_stable_names(built_book):
    root, _ = built_book
    assert (root / "book" / "results" / "01_freeze_modes.csv").exists()
    for name in ("01-accuracy", "01-drift", "01-logits"):
        assert (root / "book" / "figures" / f"{name}.png").exists()
        assert (root / "book" / "figures" / f"{name}.svg").exists()


@pytest.mark.slow
def test_injected_parameters_are_hidden_and_glued_values_render(built_book):
    root, _ = built_book
    nb = nbformat.read(root / "book" / "executed" / "01_freeze_modes.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and all("remove-cell" in c.metadata["tags"] for c in injected)
    html = (root / "book" / "_build" / "html" / "book" / "executed" / "01_freeze_modes.html").read_text()
    assert "profile = " not in html  # no parameter code shown to readers
    assert "Ran with profile=quick" in html
    assert re.search(r"holds|does not hold", html)
    for page in (root / "book" / "_build" / "html" / "book" / "executed").glob("*.html"):
        text = page.read_text()
        assert "np.float64" not in text, page.name
        assert "&#39;*This page" not in text and "'*This page" not in text, page.name  # no stray repr output
        assert "This page was built with the quick profile" in text, page.name


def test_chapter_sources_carry_no_outputs():
    for nb_path in book.chapter_paths():
        nb = nbformat.read(nb_path, as_version=4)
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), nb_path.name
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1 and "remove-cell" in params[0].metadata["tags"], nb_path.name


def test_unknown_profile_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="profile='huge'"):
        book.execute_chapter(book.chapter_paths()[0], tmp_path, "huge")
