"""The pipeline end to end: every chapter executes under papermill (quick profile) and the book builds
with warnings as errors (the session fixture ``built_book`` in conftest.py, in a temporary copy of the book's sources)."""

import json
import re
from pathlib import Path

import nbformat
import pytest

from bnstudy.study import book

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_every_chapter_executes_and_the_book_builds_without_warnings(built_book):
    root, res = built_book
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    html = root / "_build" / "html"
    assert (html / "index.html").exists()
    for nb_path in book.chapter_paths():  # clean, stable URLs
        assert (html / "chapters" / f"{book.page_name(nb_path)}.html").exists(), nb_path.name


@pytest.mark.slow
def test_toc_lists_every_chapter_notebook(built_book):
    toc = (REPO / "_toc.yml").read_text()
    for nb_path in book.chapter_paths():
        assert f"chapters/{book.page_name(nb_path)}" in toc, nb_path.name


@pytest.mark.slow
def test_chapter_one_outputs_land_with_stable_names(built_book):
    root, _ = built_book
    assert (root / "results" / "01_freeze_modes.csv").exists()
    for name in ("01-accuracy", "01-drift", "01-logits"):
        assert (root / "figures" / f"{name}.png").exists()
        assert (root / "figures" / f"{name}.svg").exists()
        # ... and in the HTML build, under the same names, linked from the figure
        assert (root / "_build" / "html" / "figures" / f"{name}.png").exists()
    page = (root / "_build" / "html" / "chapters" / "01-freeze-modes.html").read_text()
    assert 'href="../figures/01-accuracy.svg"' in page and 'href="../results/01_freeze_modes.csv"' in page


@pytest.mark.slow
def test_every_table_has_a_sidecar_with_profile_seeds_version_and_commit(built_book):
    root, _ = built_book
    csvs = sorted((root / "results").glob("[0-9][0-9]_*.csv"))
    assert csvs
    for csv in csvs:
        meta = json.loads(csv.with_suffix(".json").read_text())
        assert meta["parameters"]["profile"] == "quick", csv.name
        assert meta["parameters"]["chapter"].startswith(csv.name[:3]), csv.name
        assert meta["environment"]["git_commit"] and meta["environment"]["bnstudy"], csv.name
        assert "torch_threads" in meta["environment"]
    main = json.loads((root / "results" / "01_freeze_modes.json").read_text())
    assert main["seeds"] == [0, 1, 2] and main["parameters"]["steps"] == 800


@pytest.mark.slow
def test_glued_tables_are_numbered_as_tables(built_book):
    root, _ = built_book
    page = (root / "_build" / "html" / "chapters" / "01-freeze-modes.html").read_text()
    assert re.search(r"Table 1\.1", page) and "bn-table" in page
    assert re.search(r"Fig\. 1\.1", page)


@pytest.mark.slow
def test_injected_parameters_are_hidden_and_glued_values_render(built_book):
    root, _ = built_book
    nb = nbformat.read(root / "chapters" / "01-freeze-modes.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and all("remove-cell" in c.metadata["tags"] for c in injected)
    html = (root / "_build" / "html" / "chapters" / "01-freeze-modes.html").read_text()
    assert "profile = " not in html  # no parameter code shown to readers
    assert "Ran with profile=quick" in html
    for page in (root / "_build" / "html" / "chapters").glob("*.html"):
        text = page.read_text()
        assert "np.float64" not in text, page.name
        assert "&#39;*This page" not in text and "'*This page" not in text, page.name  # no stray repr output
        assert "This page was built with the quick profile" in text, page.name
        assert "(bnstudy progress)" not in text, page.name


def test_chapter_sources_carry_no_outputs():
    for nb_path in book.chapter_paths():
        nb = nbformat.read(nb_path, as_version=4)
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), nb_path.name
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1 and "remove-cell" in params[0].metadata["tags"], nb_path.name


def test_every_code_fence_in_chapter_prose_stands_on_its_own_line():
    """A closing fence with text after it ("``` With fewer ...") opens a code block with lexer "With" instead of
    closing the directive: the book build warns (-W fails) and the paragraph vanishes into the block. Every fence
    line in a chapter's Markdown is a bare ```, opens a directive (```{name}) or names a language (```python)."""
    bad = []
    for nb_path in book.chapter_paths():
        for c in nbformat.read(nb_path, as_version=4).cells:
            if c.cell_type == "markdown":
                bad += [f"{nb_path.name}: {ln.strip()[:50]}" for ln in c.source.splitlines()
                        if ln.lstrip().startswith("```") and not re.fullmatch(r"```(\{[\w:-]+\}.*|[a-z]+)?", ln.strip())]
    assert not bad, bad


def test_unknown_profile_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="profile='huge'"):
        book.execute_chapter(book.chapter_paths()[0], tmp_path, "huge")


def _glued(nb) -> dict:
    """Glue key -> its text/markdown (or text/plain) payload, from an executed notebook's outputs."""
    out = {}
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            key = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if key:  # glue stores its mime types under a prefix (application/papermill.record/...)
                data = {k.rsplit("/", 2)[-2] + "/" + k.rsplit("/", 2)[-1]: v for k, v in o["data"].items()}
                out[key] = data.get("text/markdown", data.get("text/plain"))
    return out


@pytest.mark.slow
def test_chapter_one_verdicts_on_the_page_are_the_findings_of_its_own_csv(built_book):
    """Recompute chapter 1's main-run claims and numbers from the CSV the page published: every verdict of its
    claims table (bnstudy.study.inference) is the one glued under ``ch01_<key>_verdict`` and appears bold on the page;
    every short verdict-like text of its numbers table is glued as it is."""
    import pandas as pd

    from bnstudy.study.experiments.freeze_modes import findings as ch
    from bnstudy.study.pages import BOLD_MAX_WORDS
    root, _ = built_book
    df = pd.read_csv(root / "results" / "01_freeze_modes.csv")
    claims, numbers = ch.claims(df), ch.findings(df)
    glued = _glued(nbformat.read(root / "chapters" / "01-freeze-modes.ipynb", as_version=4))
    html = (root / "_build" / "html" / "chapters" / "01-freeze-modes.html").read_text()
    assert len(claims), "chapter 1's main run has claims"
    for r in claims.itertuples(index=False):
        assert glued[f"ch01_{r.key}_verdict"].strip() == f"**{r.verdict}**", r.key
    shown = [r.verdict for r in claims.itertuples(index=False)
             if f"{{glue:md}}`ch01_{r.key}_verdict`" in "".join(
                 c.source for c in nbformat.read(root / "chapters" / "01-freeze-modes.ipynb", as_version=4).cells
                 if c.cell_type == "markdown")]
    assert shown, "the page cites at least one claim verdict"
    for word in shown:
        assert f"<strong>{word}</strong>" in html, word
    for r in numbers.itertuples(index=False):
        if isinstance(r.value, str) and f"ch01_{r.key}" in glued:
            want = f"**{r.value}**" if len(r.value.split()) <= BOLD_MAX_WORDS else r.value
            assert glued[f"ch01_{r.key}"].strip() == want, r.key


def test_every_parameters_line_parses_for_papermill(caplog):
    """papermill's inspector reads every line of each chapter's ``parameters`` cell (a line it cannot parse,
    e.g. an ``=`` inside a trailing comment, is logged "Unable to parse line" and hidden from
    ``papermill --help-notebook`` and ``bnstudy list``)."""
    import logging

    from papermill.translators import PythonTranslator

    for path in sorted(Path(book.CHAPTERS_DIR).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        assignments = [ln for ln in cell.source.splitlines() if re.match(r"^\w+\s*(:[^=]*)?=", ln)]
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            params = PythonTranslator.inspect(cell)
        assert not [r.getMessage() for r in caplog.records if "Unable to parse" in r.getMessage()], path.name
        assert [p.name for p in params] == [re.match(r"^(\w+)", ln).group(1) for ln in assignments], path.name


#: Tags that hide a code cell's source from readers; ``show-code`` marks a cell shown on purpose (a short call
#: of the library a reader should see), so that a cell left untagged by mistake fails this test.
HIDING_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell", "show-code"}


def test_every_chapter_code_cell_is_hidden_or_shown_on_purpose():
    for nb_path in book.chapter_paths():
        nb = nbformat.read(nb_path, as_version=4)
        for i, c in enumerate(nb.cells):
            if c.cell_type == "code":
                tags = set(c.metadata.get("tags", []))
                assert tags & HIDING_TAGS, f"{nb_path.name}, cell {i}: tags {sorted(tags)}; add remove-cell " \
                                           f"(or remove-input), or show-code for a cell shown on purpose"


#: The longest code cell a chapter notebook may hold, in non-blank lines (DESIGN: notebooks stay thin; logic that
#: needs more lives in the package, where it is tested).
MAX_CELL_LINES = 25


def test_every_chapter_code_cell_is_at_most_25_lines():
    long = []
    for nb_path in book.chapter_paths():
        nb = nbformat.read(nb_path, as_version=4)
        for i, c in enumerate(nb.cells):
            n = sum(1 for ln in c.source.splitlines() if ln.strip())
            if c.cell_type == "code" and n > MAX_CELL_LINES:
                long.append(f"{nb_path.name} cell {i} ({n} lines)")
    assert not long, f"code cells over {MAX_CELL_LINES} non-blank lines: {long}; move their logic into bnstudy"


def test_chapter_one_never_joins_two_bare_glued_verdicts():
    """"block 1 {glue:md}`a` and {glue:md}`b`" renders as "block 1 holds and holds": each verdict needs its label."""
    nb = nbformat.read(next(p for p in book.chapter_paths() if p.name.startswith("01_")), as_version=4)
    for i, c in enumerate(nb.cells):
        if c.cell_type == "markdown":
            hit = re.search(r"\{glue:md\}`[^`]+`\s+and\s+\{glue:md\}`", c.source)
            assert not hit, f"cell {i}: {hit.group(0)!r}"


@pytest.mark.slow
def test_the_release_book_builds_and_every_released_page_names_its_release(release_book):
    """`make book`'s book (issue 23): every chapter in release/ analyses the release's rows, its run line names
    the release and its last verification, no run is computed for it (its cache folder stays empty), and the
    whole book builds with -W. The seconds the pages took are printed (the note's build time is measured by
    `make book` from a fresh clone)."""
    from bnstudy.study.release import RELEASE_DIR, read_manifest

    root, res, pages_s = release_book
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    print(f"release book pages executed in {pages_s:.0f} s")
    manifest = read_manifest(RELEASE_DIR)
    assert manifest["chapters"], "release/ holds no chapter"
    html = root / "_build" / "html"
    for number, c in manifest["chapters"].items():
        page = (html / "chapters" / f"{book.page_name(c['notebook'] + '.ipynb')}.html").read_text()
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
        assert f"data release {manifest['release']['version']}" in text, number
        assert "did not run the experiment" in text or "analysing the rows of the data release" in text, number
        cache = root / "cache" / c["notebook"]
        trained = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()) if cache.exists() else []
        assert not trained, f"chapter {number}'s page, built from the release, computed runs: {trained[:5]}"


@pytest.mark.slow
def test_readme_findings_are_the_release_books_front_page(release_book):
    """The README tells the book's answers (issue 23): its findings block is the release book's front page list,
    made by `make readme`; after a release changes, `make book && make readme` brings it up to date."""
    root, res, _ = release_book
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    released = book.released_chapters()
    made = book.front_page_findings(root / "_build" / "html", released)
    assert "{glue" not in made and "nan" not in made.lower().split()
    for n in range(1, 10):  # every released chapter has its bullet; the others are named as not released
        assert (f"chapters/0{n}_" in made) == (f"0{n}" in released), n
    from bnstudy.study.release import CHAPTERS
    assert len(released) == len(CHAPTERS) or "not in the data release yet" in made
    readme = (REPO / "README.md").read_text()
    block = readme.split(book.FINDINGS_START, 1)[1].split(book.FINDINGS_END, 1)[0].strip()
    assert block == made, "README's findings differ from the release book's front page: run `make book && make readme`"


def test_front_page_findings_turn_the_built_list_into_readme_markdown(tmp_path):
    (tmp_path / "book").mkdir()
    html = tmp_path / "book" / "index.html"  # the front page, book/index.md, links ../chapters/ and its siblings
    html.write_text('''<html><body><section id="what-the-chapters-find">
<h2>What the chapters find<a class="headerlink" href="#what-the-chapters-find" title="Link to this heading">#</a></h2>
<p>Numbers come from the executed chapters.</p>
<ul class="simple">
<li><p><strong><a class="reference internal" href="../chapters/01-freeze-modes.html">Chapter 1, freeze modes</a>.</strong>
In <code class="docutils literal notranslate"><span class="pre">train_mode</span></code> task A falls to 0.125
(<a class="reference internal" href="../chapters/01-freeze-modes.html#fig-ch01-accuracy"><span class="std std-numref">Fig. 1.1</span></a>).</p></li>
<li><p>See <a class="reference internal" href="guide.html">the guide</a> and the
<a class="reference external" href="../book/glossary.html">glossary</a>.</p></li>
</ul></section><section id="next"><h2>Next</h2></section></body></html>''')
    md = book.front_page_findings(tmp_path)
    assert md.splitlines()[0] == "Numbers come from the executed chapters."
    assert "- **[Chapter 1, freeze modes](chapters/01_freeze_modes.ipynb).**" in md
    assert "`train_mode`" in md and "0.125" in md and "(Fig. 1.1)" in md
    assert "[the guide](book/guide.md)" in md and "[glossary](book/glossary.md)" in md
    assert "Next" not in md and "#" not in md
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{book.FINDINGS_START}\nold\n{book.FINDINGS_END}\nbottom\n")
    assert book.update_readme(tmp_path, readme, None) and not book.update_readme(tmp_path, readme, None)
    assert readme.read_text() == f"top\n{book.FINDINGS_START}\n{md}\n{book.FINDINGS_END}\nbottom\n"
    kept = book.front_page_findings(tmp_path, ["02"])
    assert "freeze modes" not in kept and kept.endswith("Chapter 1 is not in the data release yet (`release/manifest.json`); "
                                                     "the book shows its quick-profile run.")


def _glued_verdicts(nb_path) -> dict[str, str]:
    """``{glue key: text}`` of every value an executed chapter glued under a key ending in ``_verdict``."""
    import nbformat

    from bnstudy.study.book import _glued_payload

    out = {}
    for cell in nbformat.read(nb_path, as_version=4).cells:
        for o in cell.get("outputs", []):
            key = (o.get("metadata") or {}).get("scrapbook", {}).get("name")
            if key is not None and key.endswith("_verdict"):
                out[key] = _glued_payload(o.get("data") or {}).strip().strip("'\"").strip("*").strip()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("which", ["built_book", "release_book"])
def test_every_glued_verdict_is_a_word_of_the_glossary(which, request):
    """Issue 24: every verdict a page glues (keys ending in ``_verdict``) is in the one vocabulary
    (bnstudy.study.inference.is_verdict, with the chapter's declared DIRECTIONS), and every chapter page links the
    glossary that defines the words."""
    from bnstudy.study import book, inference
    from bnstudy.study.release import CHAPTERS

    root = request.getfixturevalue(which)[0]
    chapters = {c.notebook: c for c in CHAPTERS.values()}
    seen = 0
    for nb_path in book.chapter_paths():
        mod = chapters[nb_path.stem].findings()
        directions = getattr(mod, "DIRECTIONS", ())
        executed = root / "chapters" / f"{book.page_name(nb_path)}.ipynb"
        for key, text in _glued_verdicts(executed).items():
            seen += 1
            assert inference.is_verdict(text, directions), (
                f"{executed.name}: {key} = {text!r} is not a verdict of the glossary "
                f"(directions declared: {directions})")
        html = (root / "_build" / "html" / "chapters" / f"{book.page_name(nb_path)}.html").read_text()
        if getattr(mod, "DIRECTIONS", None) is not None:
            assert "glossary.html" in html, f"{nb_path.stem}'s page does not link the glossary"
    assert seen > 0


def test_glossary_is_in_the_book_and_names_every_verdict_word():
    from bnstudy.study import inference

    assert "- file: book/glossary" in (REPO / "_toc.yml").read_text()
    text = (REPO / "book" / "glossary.md").read_text()
    for word in (inference.NOT_DECIDED, inference.TOO_FEW, inference.EXACT, inference.NOT_EXACT,
                 "equivalent within \u00b1m", "a direction shown"):
        assert word in text, word


def test_glue_dump_and_compare_find_every_changed_value(tmp_path):
    """Issue 33's identity check: the values a page glues, dumped and compared before and after a refactoring."""
    import nbformat
    from bnstudy.study.book import compare_glued, glued_values, main

    def page(folder, answer):
        folder.mkdir()
        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell("glue(...)")
        cell.outputs = [nbformat.v4.new_output("display_data", data={"text/markdown": answer},
                                               metadata={"scrapbook": {"name": "ch09_answer", "mime_prefix": ""}}),
                        nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": "0.5"},
                                               metadata={"scrapbook": {"name": "ch09_gap_mean",
                                                                       "mime_prefix": "application/papermill.record/"}}),
                        nbformat.v4.new_output("display_data", data={"application/papermill.record/text/html":
                                                                     '<table id="T_1a2b3"><tr id="T_9f8e7_row0">'},
                                               metadata={"scrapbook": {"name": "ch09_tbl", "mime_prefix": ""}}),
                        nbformat.v4.new_output("stream", name="stdout", text="not glued")]
        nb.cells = [cell]
        nbformat.write(nb, folder / "09-new.ipynb")
        return folder

    a, b = page(tmp_path / "a", "**Yes.**"), page(tmp_path / "b", "**No.**")
    assert glued_values(a) == {"ch09_answer": "**Yes.**", "ch09_gap_mean": "0.5",    # as myst_nb stores them
                               "ch09_tbl": '<table id="T_x"><tr id="T_x">'}         # Styler's random ids masked
    assert compare_glued(glued_values(a), glued_values(a)) == []
    assert compare_glued(glued_values(a), glued_values(b)) == ["changed: ch09_answer: '**Yes.**' -> '**No.**'"]
    assert main(["--glue-dump", str(a), str(tmp_path / "a.json")]) == 0
    assert main(["--glue-compare", str(tmp_path / "a.json"), str(a)]) == 0
    assert main(["--glue-compare", str(tmp_path / "a.json"), str(b)]) == 1


def test_glue_tools_refuse_what_holds_no_glued_values(tmp_path, capsys):
    """An empty folder, the source notebooks (not NN-name.ipynb), a notebook file or a missing path must not read as
    "identical: 0 glued values"."""
    from bnstudy.study.book import main
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.ipynb").write_text("{}")
    for args in (["--glue-compare", str(tmp_path / "empty"), str(tmp_path / "empty")],
                 ["--glue-compare", str(tmp_path / "x.ipynb"), str(tmp_path / "x.ipynb")],
                 ["--glue-dump", str(tmp_path / "nope"), str(tmp_path / "out.json")],
                 ["--glue-compare", str(tmp_path / "missing.json"), str(tmp_path / "missing.json")],
                 ["--only"]):
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2, args
    err = capsys.readouterr().err
    assert "no glued values" in err and "give a folder of executed notebooks" in err and "--only: name at least" in err
    assert not (tmp_path / "out.json").exists()
