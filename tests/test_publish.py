"""Publishing (issue 23): the GitHub Pages workflow builds the release book on a version tag and deploys it;
CITATION.cff carries the release's version and date."""

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def test_pages_workflow_builds_the_release_book_on_a_tag_and_deploys_it():
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "pages.yml").read_text())
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert on["push"]["tags"] == ["v*"] and "workflow_dispatch" in on
    assert wf["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    build, deploy = wf["jobs"]["build"], wf["jobs"]["deploy"]
    uses = [s.get("uses", "").split("@")[0] for s in build["steps"]]
    assert uses[:2] == ["actions/checkout", "actions/setup-python"]
    runs = [s["run"] for s in build["steps"] if "run" in s]
    assert len(runs) == 1 and runs[0].startswith("make book ") and "PROFILE" not in runs[0]  # the release book
    upload = [s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact")]
    assert upload and upload[0]["with"]["path"] == "_build/html"
    assert "$(CURDIR)/_build/html/index.html" in (REPO / "Makefile").read_text()  # where `make book` puts it
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]


def test_citation_carries_the_release_version_and_date():
    from bnstudy.study.release import RELEASE_DIR, read_manifest
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    rel = read_manifest(RELEASE_DIR)["release"]
    assert str(cff["version"]) == rel["version"]
    assert str(cff["date-released"]) == rel["date"]
