"""Issue 37's release history: each release keeps its claims table (release/claims/<version>.csv, what its pages
print) and history.md lists, release to release, the claims whose verdict changed and why. Hand-made executed
notebooks and manifests (nothing executed); and the committed release's own entry and page."""

import json

import nbformat
import pandas as pd
import pytest

from bnstudy.study import history
from bnstudy.study.manifest import RELEASE_DIR, read_manifest, write_manifest
from bnstudy.study.pages import CLAIM_FIELDS


def _executed(folder, claims: dict):
    """An executed chapter 04 page gluing ``{key: (estimate, verdict)}`` as glue_chapter does, plus a number that
    is not a claim."""
    folder.mkdir(parents=True, exist_ok=True)
    outs = []
    for key, (est, verdict) in claims.items():
        for f in CLAIM_FIELDS:
            value = f"**{verdict}**" if f == "verdict" else str(10 if f == "n" else est)
            mime = "text/markdown" if f == "verdict" else "text/plain"
            outs.append(nbformat.v4.new_output("display_data", data={f"application/papermill.record/{mime}": value},
                                               metadata={"scrapbook": {"name": f"ch04_{key}_{f}"}}))
    outs.append(nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": "3"},
                                       metadata={"scrapbook": {"name": "ch04_n_heads"}}))
    cell = nbformat.v4.new_code_cell("glue(...)")
    cell.outputs = outs
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / "04-heads.ipynb")
    return folder


def _manifest(rdir, version, fingerprint, computed, seeds=(0, 1)):
    write_manifest(dict(release=dict(version=version, date=version.replace(".", "-"), git_commit="abc",
                                     code_fingerprint=fingerprint),
                        chapters={"04": dict(notebook="04_heads", code_fingerprint=fingerprint, git_commit="abc",
                                             seeds=list(seeds), computed=computed)},
                        tables={}, units={}), rdir)


def test_a_release_keeps_its_claims_and_the_page_names_each_changed_verdict_and_why(tmp_path):
    rdir = tmp_path / "release"
    rdir.mkdir()
    _manifest(rdir, "2026.01.01", "f1", "2026-01-01T00:00:00")
    one = _executed(tmp_path / "one", {"gap_linear": (0.05, r"separate\_stats higher"), "gap_mlp": (0.0, "equivalent")})
    csv = history.record(rdir, one)
    first = pd.read_csv(csv, dtype={"chapter": str})
    assert list(first.columns) == list(history.COLUMNS) and len(first) == 2   # the number that is no claim left out
    assert first.set_index("key").loc["gap_linear", "verdict"] == "separate_stats higher"
    page = history.page(rdir)
    assert "## Release 2026.01.01" in page and "The first recorded release" in page and "1 *equivalent*" in page

    _manifest(rdir, "2026.02.01", "f2", "2026-02-01T00:00:00", seeds=(0, 1, 2, 3))
    two = _executed(tmp_path / "two", {"gap_linear": (0.01, "not decided"), "gap_mlp": (0.0, "equivalent")})
    history.record(rdir, two, chapters=["04"])
    assert [m["version"] for m, _ in history.entries(rdir)] == ["2026.01.01", "2026.02.01"]
    ch = history.changes(*(c for _, c in history.entries(rdir)))
    assert ch[["key", "verdict_before", "verdict_after"]].values.tolist() == [
        ["gap_linear", "separate_stats higher", "not decided"]]
    page = history.page(rdir)
    assert page.index("## Release 2026.02.01") < page.index("## Release 2026.01.01")   # newest first
    assert "chapter 4 recomputed (code f1 -> f2; seeds 0, 1 -> 0-3)" in page
    assert "| 4 | `gap_linear` | separate_stats higher | not decided | +0.050 | +0.010 |" in page


def test_recording_without_executed_chapters_needs_a_claims_table_already(tmp_path):
    _manifest(tmp_path, "2026.01.01", "f1", "2026-01-01T00:00:00")
    with pytest.raises(ValueError, match="no claims table"):
        history.record(tmp_path)
    with pytest.raises(ValueError, match="no recorded release"):
        history.page(tmp_path)


def test_the_committed_release_has_its_claims_table_and_the_page_is_current():
    version = read_manifest(RELEASE_DIR)["release"]["version"]
    claims = pd.read_csv(RELEASE_DIR / history.CLAIMS_DIR / f"{version}.csv", dtype={"chapter": str})
    assert set(claims["chapter"]) == set(read_manifest(RELEASE_DIR)["chapters"])  # every released chapter
    meta = json.loads((RELEASE_DIR / history.CLAIMS_DIR / f"{version}.json").read_text())
    assert meta["version"] == version
    assert history.PAGE.read_text() == history.page(RELEASE_DIR), "history.md is stale: run `make history`"


def test_history_run_line_and_card_say_each_chapters_verification_in_the_same_words():
    """Issue 37: the history page, a page's *Ran with* line and a provenance card say how a chapter was verified
    with one set of words (report.VERIFICATION_WORDS) and the same verification commit; the history names each
    chapter's own computing commit (the release was computed chapter by chapter), the one its run line names."""
    from bnstudy.study import provenance
    from bnstudy.study.report import VERIFICATION_WORDS, release_of, release_text, verification_words, verified_text

    manifest = read_manifest(RELEASE_DIR)
    v = manifest["release"]["verified"]
    page = history.page(RELEASE_DIR)
    assert verified_text(v) in page
    for ch, rec in manifest["chapters"].items():
        # a chapter added after the last verification is in none of its lists: "not in this verification"
        how = next((k for k in ("exact", "statistical", "unchecked") if ch in v.get(k, ())), "added later")
        words = verification_words(how)
        row = next(line for line in page.splitlines() if line.startswith(f"| {int(ch)} | "))
        assert words.replace("==", "`==`") in row and rec["git_commit"][:10] in row
        rel = release_of(RELEASE_DIR / f"{rec['notebook']}.csv")
        line = release_text(rel)
        assert f"{verified_text(rel['verified'])}; this chapter {words}" in line
        card = provenance._verification(dict(release=rel, verified=rel["verified"], n_verified_chapters=None))
        assert words.replace("==", "<code>==</code>") in card and verified_text(rel["verified"]) in card
    assert "exactly: every column ==" in VERIFICATION_WORDS["exact"] and "not ==" in VERIFICATION_WORDS["statistical"]
