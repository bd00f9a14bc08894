"""The `bnstudy` command: chapter names, parameter checks with clear errors, glue filled into the HTML."""

import nbformat
import pytest

from bnstudy import cli, report


def test_chapter_is_found_by_number_or_name_and_an_unknown_one_lists_the_choices():
    assert cli.resolve_chapter("01").stem == "01_freeze_modes"
    assert cli.resolve_chapter("1") == cli.resolve_chapter("01-freeze-modes") == cli.resolve_chapter("freeze_modes")
    with pytest.raises(SystemExit, match=r"unknown chapter '99'.*01 \(01_freeze_modes\)"):
        cli.resolve_chapter("99")


def test_unknown_or_reserved_parameters_are_errors_naming_the_allowed_ones(tmp_path):
    with pytest.raises(SystemExit, match=r"unknown parameter\(s\) \['sedes'\].*'seeds'"):
        cli.main(["chapter", "01", "-p", "sedes", "20", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="set by --out"):
        cli.main(["chapter", "01", "-p", "results_dir", "x", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="not valid YAML"):
        cli.main(["chapter", "03", "-y", "brightness_levels: [0, 2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):  # argparse: invalid choice names quick and full
        cli.main(["chapter", "01", "--profile", "huge", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # nothing ran


def test_parameters_are_typed_as_papermill_types_them():
    assert [cli.parse_value(v) for v in ("20", "2.5", "True", "None", "abc")] == [20, 2.5, True, None, "abc"]


def test_list_names_every_chapter_and_its_parameters(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "01_freeze_modes" in out and "seeds = None" in out and "results_dir" not in out


def test_rendered_rerun_fills_glued_numbers_figures_and_references(tmp_path):
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("glue")
    code.outputs = [nbformat.v4.new_output("display_data", data={
        "application/papermill.record/text/plain": "0.12345"}, metadata={"scrapbook": {"name": "x"}}),
        nbformat.v4.new_output("display_data", data={"application/papermill.record/image/png": "iVBORw0KGgo=",
                                                     "application/papermill.record/text/plain": "<Figure>"},
                               metadata={"scrapbook": {"name": "fig"}})]
    nb.cells = [code, nbformat.v4.new_markdown_cell(
        "Value {glue:text}`x:.2f`, see {numref}`fig-a`.\n\n```{glue:figure} fig\n:name: fig-a\n\nA caption.\n```\n")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    html = cli.render_html(path, tmp_path / "nb.html").read_text()
    assert "Value 0.12" in html and "Figure 1" in html and "data:image/png;base64" in html
    assert "{glue" not in html and "{numref}" not in html


def test_run_line_names_the_git_commit_device_and_threads_and_is_wrapped():
    line = report.run_line("quick", 3, steps=800)
    commit = report.git_commit()
    assert commit in line and "threads" in line and "device cpu" in line.replace("\n  ", " ")
    assert all(len(ln) <= 78 for ln in line.splitlines())
    assert commit == "unknown" or len(commit.split("+")[0]) == 10
