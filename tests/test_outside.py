"""The book usable from outside the repository (issue 37): one setting, ``pyproject.toml``'s ``[project.urls]``,
names the repository and the published book, and every place that needs them agrees with it (the install lines,
the cite page's BibTeX, ``CITATION.cff``, ``.zenodo.json``, the README); the wheel the published book carries
(``make book``: ``_build/html/dist/``) requires only torch and numpy and imports with nothing else importable."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from test_front_door import SCRIPT as FRONT_DOOR
from test_front_door import _requirement_closure, _top_level_paths

REPO = Path(__file__).resolve().parent.parent
URL = re.compile(r"https?://[^\s)>`'\"\]}]+")


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _urls() -> tuple[str, str]:
    """(repository URL, published book URL) from the one setting."""
    urls = _project()["urls"]
    return urls["Repository"], urls["Documentation"]


def wheel_name() -> str:
    return f"bnstudy-{_project()['version']}-py3-none-any.whl"


def wheel_url() -> str:
    return _urls()[1] + "dist/" + wheel_name()


def _ours(url: str) -> bool:
    return "bnstudy" in url and ("github" in url or "zenodo" in url)


def test_the_one_setting_names_the_repository_and_the_book():
    repo, book = _urls()
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repo), repo
    assert book.startswith("https://") and book.endswith("/"), book


@pytest.mark.parametrize("page", ["book/index.md", "book/guide.md", "book/cite.md", "book/reproduce.md", "README.md", "CITATION.cff",
                                  ".zenodo.json", "_config.yml"])
def test_every_address_of_the_project_on_a_page_comes_from_the_one_setting(page):
    """No page names another repository, another book address or another wheel than the setting's."""
    repo, book = _urls()
    allowed = {repo, repo + ".git", book, wheel_url()}
    ours = [u.rstrip(".,;:") for u in URL.findall((REPO / page).read_text()) if _ours(u)]
    assert set(ours) <= allowed, f"{page}: {sorted(set(ours) - allowed)} is not {sorted(allowed)} (pyproject.toml)"


def test_the_install_lines_link_the_books_wheel_and_the_repository():
    repo, book = _urls()
    index = (REPO / "book" / "index.md").read_text()
    box = index.index("{admonition} Start here")
    start = index[box:index.index("\n```", box)]  # the Start here box, answers and install line
    assert f"pip install {wheel_url()}" in start and repo in start and "in a clone of this repository" not in start
    guide = (REPO / "book" / "guide.md").read_text()
    install = guide[guide.index("(guide-install)="):guide.index("(guide-short)=")]
    assert f"pip install {wheel_url()}" in install and f"git clone {repo}" in install
    readme = (REPO / "README.md").read_text()
    assert repo in readme and book in readme and f"pip install {wheel_url()}" in readme
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    assert config["repository"]["url"] == repo and config["html"]["use_repository_button"], "no repository button"
    makefile = (REPO / "Makefile").read_text()
    assert "wheel WHEEL_DIR=_build/html/dist" in makefile, "make book no longer puts the wheel where the pages link it"


def test_citation_files_name_the_repository_and_agree_with_each_other_and_the_bibtex():
    repo, book = _urls()
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["repository-code"] == repo and cff["url"] == book
    zenodo = json.loads((REPO / ".zenodo.json").read_text())
    assert zenodo["title"] == cff["title"] and zenodo["upload_type"] == "software"
    assert [c["name"] for c in zenodo["creators"]] == [a["name"] for a in cff["authors"]]
    assert zenodo["version"] == str(cff["version"]) and zenodo["publication_date"] == str(cff["date-released"])
    assert zenodo["license"] == cff["license"] == "MIT"
    assert {(r["identifier"], r["relation"]) for r in zenodo["related_identifiers"]} >= {(repo, "isSupplementTo")}
    assert f"bnstudy {_project()['version']}" in zenodo["notes"]
    cite = (REPO / "book" / "cite.md").read_text()
    bib = re.search(r"```bibtex\n(.*?)```", cite, flags=re.S).group(1)
    fields = dict(re.findall(r"^\s*(\w+)\s*=\s*\{(.*?)\},?\s*$", bib, flags=re.M))
    assert fields["version"] == str(cff["version"]) and fields["url"] == book, fields
    assert fields["year"] == str(cff["date-released"])[:4]
    assert f"package bnstudy {_project()['version']}" in bib and f"data release {cff['version']}" in bib
    assert repo in bib and "<" not in bib, "the BibTeX still holds a placeholder"
    assert f"`bnstudy` package, version {_project()['version']}" in cite


def test_sync_citation_moves_every_cited_version_to_the_releases(tmp_path):
    """A recomputed release (``make release``) rewrites the version and date in CITATION.cff, .zenodo.json and
    the cite page's BibTeX together, so the test above keeps holding."""
    from bnstudy.study.release import sync_citation

    for name in ("CITATION.cff", ".zenodo.json", "book/cite.md"):
        (tmp_path / Path(name).name).write_text((REPO / name).read_text())
    sync_citation({"release": {"version": "2031.01.02", "date": "2031-01-02"}}, path=tmp_path / "CITATION.cff",
                  zenodo=tmp_path / ".zenodo.json", cite_page=tmp_path / "cite.md")
    cff = yaml.safe_load((tmp_path / "CITATION.cff").read_text())
    zenodo = json.loads((tmp_path / ".zenodo.json").read_text())
    bib = (tmp_path / "cite.md").read_text()
    assert str(cff["version"]) == zenodo["version"] == "2031.01.02" and zenodo["publication_date"] == "2031-01-02"
    assert "version = {2031.01.02}" in bib and "data release 2031.01.02;" in bib and "year    = {2031}" in bib


# --- the wheel ---------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_books_wheel_requires_torch_and_numpy_only_and_runs_with_nothing_else(tmp_path):
    """``make wheel`` (the step ``make book`` runs into the built book's ``dist/``) builds a wheel whose metadata
    requires torch and numpy and nothing else outside extras; installed with ``pip --no-deps`` into a folder, it runs
    tests/test_front_door.py's script (import, pin, audit, lint; no pandas) in an isolated interpreter (``-I -S``: no
    site-packages) whose path holds only that folder and torch's requirement closure and numpy."""
    import zipfile

    out = tmp_path / "dist"
    res = subprocess.run(["make", "--no-print-directory", "-s", "wheel", f"WHEEL_DIR={out}", f"PY={sys.executable}"],
                         cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    wheel = out / wheel_name()
    assert wheel.exists(), sorted(p.name for p in out.iterdir())
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"bnstudy-{_project()['version']}.dist-info/METADATA").decode()
        names = z.namelist()
    required = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
                if "extra ==" not in r}
    assert required == {"torch", "numpy"}, meta
    assert f"Project-URL: Repository, {_urls()[0]}" in meta
    assert "bnstudy/freeze.py" in names and not any(n.startswith(("tests/", "release/", "chapters/")) for n in names)

    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                          "--target", str(target), str(wheel)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    # what tests/test_front_door.py runs on the repository, here on the installed wheel, with the same bare set of
    # distributions: torch's requirement closure and numpy, linked into one folder
    deps = tmp_path / "deps"
    deps.mkdir()
    for d in sorted(_requirement_closure("torch") | {"numpy"}):
        for p in _top_level_paths(d):
            if not (deps / p.name).exists():
                (deps / p.name).symlink_to(p)
    assert not (deps / "pandas").exists() and not (deps / "scipy").exists()
    script = "\n".join([
        f"import sys; sys.path[:0] = [{str(target)!r}, {str(deps)!r}]",
        "import bnstudy",
        f"assert bnstudy.__file__.startswith({str(target)!r}), bnstudy.__file__",
        FRONT_DOOR,
    ])
    res = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and "front door ok []" in res.stdout, (res.stdout + res.stderr)[-3000:]
