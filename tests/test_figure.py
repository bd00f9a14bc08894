"""Issue 37: one figure remade from the data release by its number (``python -m bnstudy.study.figure 4.2``), with the
chapter's own figure code and only the analysis it needs, without executing the notebook."""

import json

import pytest

from bnstudy.study import cli, figure


def test_figure_numbers_follow_the_page_and_an_unknown_one_is_refused_with_the_known_ones(capsys):
    index = figure.figure_index()
    assert index["4.2"].label == "fig-ch04-gap" and index["4.2"].name == "04-gap"
    assert index["4.1"].label == "fig-ch04-lr-search" and index["1.1"].label == "fig-ch01-accuracy"
    assert figure.find_figure("Fig. 4.2") == figure.find_figure("fig-ch04-gap") == index["4.2"]
    with pytest.raises(ValueError, match=r"no figure '4\.9' in the book; known figures: 1\.1 \(fig-ch01-accuracy\)"):
        figure.find_figure("4.9")
    assert figure.main(["4.9"]) == 2
    err = capsys.readouterr().err
    assert "known figures" in err and "4.2 (fig-ch04-gap)" in err
    assert cli.main(["figure", "4.9"]) == 2   # the same through `bnstudy figure`


def test_the_program_of_a_figure_is_its_cell_and_only_the_analysis_it_needs():
    params, program = figure.figure_program(figure.find_figure("4.2"))
    assert "rows = None" in params
    assert "figures.gap_figure(gaps, labels, cfg.margin)" in program       # the notebook's own call
    assert "C = findings.claims(df, cfg.margin)" in program                # what it needs
    for other in ("lr_search_figure", "head_accuracy_figure", "findings.findings(", "gap_display"):
        assert other not in program, other                                 # the rest of the chapter is left out
    # Fig. 5.3 passes no data=: save_figure records the table saved last, so the notebook's last save is kept
    _, program = figure.figure_program(figure.find_figure("5.3"))
    assert program.rstrip().endswith('plots.save_figure(fig, "05-train-eval-gap", figures_dir)')
    assert 'save_table(acc, f"{results_dir}/05_batch_size_accuracy.csv")' in program


def test_a_remade_figure_draws_the_release_books_data(release_book, tmp_path):
    """Fig. 7.1 (seconds) remade into an empty folder: the CSV it is drawn from is byte-identical to the release
    book's, and its sidecar names the same data (pixels may differ)."""
    root, _, _ = release_book
    r = figure.remake("7.1", tmp_path)
    assert r["png"] == tmp_path / "figures" / "07-accuracy.png" and r["png"].stat().st_size > 0
    assert r["data"].read_bytes() == (root / "results" / r["data"].name).read_bytes()
    mine, theirs = (json.loads((d / "figures" / "07-accuracy.json").read_text()) for d in (tmp_path, root))
    assert {k: mine.get(k) for k in ("data", "data_sidecar", "where")} == \
        {k: theirs.get(k) for k in ("data", "data_sidecar", "where")}
