"""Issue 37's provenance cards on hand-made book folders (no build): the card names the per-seed rows behind a figure
with the filter that selects them and their sha256, and the page check fails a page where a figure or table lacks
its card, where a card's rows link does not resolve, or where its sha256 does not match the file."""

import hashlib
import json

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from bnstudy.study import pagecheck, plots, provenance  # noqa: E402


def _book(tmp_path, where=None):
    """A book root with one chapter's per-seed table (04_toy.csv: 2 modes x 3 heads x 2 seeds), a summary drawn from
    part of it (two heads) and a figure sidecar naming the summary."""
    res, figs = tmp_path / "results", tmp_path / "figures"
    res.mkdir()
    figs.mkdir()
    rows = pd.DataFrame([dict(seed=s, mode=m, head=h, task_b=0.5, wall_s=1.5)
                         for s in (0, 1) for m in ("train_mode", "backbone_eval") for h in ("linear", "mlp", "mlp_bn")])
    rows.to_csv(res / "04_toy.csv", index=False)
    (res / "04_toy.json").write_text(json.dumps({"parameters": {}}))
    pd.DataFrame(dict(head=["linear", "mlp"], mean=[0.5, 0.5])).to_csv(res / "04_toy_summary.csv", index=False)
    meta = dict(figure="04-toy", data="04_toy_summary.csv")
    if where:
        meta["where"] = where
    (figs / "04-toy.json").write_text(json.dumps(meta))
    return tmp_path


def test_card_names_the_per_seed_rows_their_filter_and_sha256(tmp_path):
    root = _book(tmp_path, where={"mode": ["backbone_eval"]})
    c = provenance.card("fig-ch04-toy", root)
    (r,) = c["rows"]
    assert r["file"] == "04_toy.csv" and r["n_rows"] == 12
    assert r["where"] == {"head": ["linear", "mlp"], "mode": ["backbone_eval"]}  # derived from the data, and given
    assert r["n_selected"] == 4 and r["cpu_s"] == pytest.approx(6.0)            # 2 heads x 1 mode x 2 seeds
    assert r["sha256"] == hashlib.sha256((root / "results" / "04_toy.csv").read_bytes()).hexdigest()
    assert c["release"] is None  # rows a build computed itself: no release to cite
    html = provenance.card_html(c, "../")
    assert 'href="../results/04_toy.csv"' in html and r["sha256"] in html
    assert "head in {linear, mlp}, mode == backbone_eval" in html and "<details" in html
    assert "--profile quick --only 04_toy" in html and "never verified" not in html


def test_a_tables_card_lists_the_chapters_per_seed_tables_and_other_labels_get_none(tmp_path):
    root = _book(tmp_path)
    c = provenance.card("tbl-ch04-anything", root)
    assert [r["file"] for r in c["rows"]] == ["04_toy.csv"] and c["rows"][0]["where"] == {}
    assert provenance.card("tab-ch04-anything", root)["rows"] == c["rows"]   # chapter 5's spelling of a table label
    assert provenance.card("fig-intro-diagram", root) is None   # not a chapter's figure
    assert provenance.card("fig-ch05-toy", root) is None        # no per-seed rows for chapter 5


def test_a_filter_on_a_column_the_rows_lack_is_refused_naming_it(tmp_path):
    root = _book(tmp_path, where={"optimiser": ["sgd"]})
    with pytest.raises(ValueError, match="optimiser"):
        provenance.card("fig-ch04-toy", root)


def test_save_figure_records_the_filter_and_refuses_a_malformed_one(tmp_path):
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots(figsize=(2, 1))
    plots.save_figure(fig, "04-toy", tmp_path, data=tmp_path / "x.csv", where={"mode": ("backbone_eval",)})
    assert json.loads((tmp_path / "04-toy.json").read_text())["where"] == {"mode": ["backbone_eval"]}
    with pytest.raises(ValueError, match="where"):
        plots.save_figure(fig, "04-toy", tmp_path, data=tmp_path / "x.csv", where={"mode": []})
    plt.close(fig)


def _page(root, body):
    page = root / "chapters" / "04-toy.html"
    page.parent.mkdir(exist_ok=True)
    page.write_text(f"<html><body><article><h1>T</h1>{body}</article></body></html>")
    return page


def test_pagecheck_fails_a_missing_card_a_dead_link_and_a_wrong_sha256_and_passes_a_good_one(tmp_path):
    root = _book(tmp_path)
    card = provenance.card_html(provenance.card("fig-ch04-toy", root), "../")
    good = _page(root, f"<figure id='fig-ch04-toy'><img src='a.png' alt='x'>{card}</figure>")
    assert pagecheck.card_problems(good) == []
    missing = _page(root, "<figure id='fig-ch04-toy'><img src='a.png' alt='x'></figure>")
    assert "without its provenance card: fig-ch04-toy" in " ".join(pagecheck.card_problems(missing))
    digest = provenance.sha256_of(root / "results" / "04_toy.csv")
    wrong = _page(root, "<figure id='tbl-ch04-toy'>" + card.replace(digest, "0" * 64) + "</figure>")
    assert "sha256 does not match" in " ".join(pagecheck.card_problems(wrong))
    dead = _page(root, "<figure id='fig-ch04-toy'>" + card.replace("04_toy.csv", "04_gone.csv") + "</figure>")
    assert "does not resolve" in " ".join(pagecheck.card_problems(dead))
    assert any("provenance card" in p for p in pagecheck.page_problems(dead, chapter=True))  # the page check runs it
    table = "<table><tr><td>separate_stats higher</td></tr></table>"
    prose = _page(root, f"<div class='section'>{table}{card}</div>")   # a table typed in the prose: its card follows
    assert pagecheck.card_problems(prose) == []
    bare = _page(root, f"<div class='section'>{table}<p>next</p>{table}{card}</div>")
    assert pagecheck.card_problems(bare) == ["a figure or table without its provenance card: the prose table 1 "
                                             "(separate_stats higher...)"]


def test_a_measured_column_is_no_filter_even_when_its_values_happen_to_be_a_subset():
    rows = pd.DataFrame(dict(seed=[0, 0, 1, 1], trap=["a", "b", "a", "b"], accuracy=[0.5, 0.75, 0.25, 0.5]))
    data = pd.DataFrame(dict(trap=["a"], accuracy=[0.5]))   # 0.5 is one of the rows' accuracies, by chance
    assert provenance.row_filter(data, rows) == {"trap": ["a"]}


def test_a_tables_card_filters_the_rows_its_saved_table_shows(tmp_path):
    """A glued table drawn from a saved table (chapter 6's routing table from 06_unknown_task_routing.csv) gets the
    filter that selects its rows, as a figure does; a claims table (chapter 4's gap table) takes no filter from its
    columns (they name the compared condition, not its reference) but the `where` of the figure drawn from the same
    CSV; a table made from no saved table lists the per-seed tables unfiltered."""
    from bnstudy.study import figure

    assert figure.table_data("tbl-ch04-gap") == "04_heads_gap.csv"     # glue("ch04_gap_table", gap_display(gaps...))
    assert figure.table_data("tbl-ch06-routing") == "06_unknown_task_routing.csv"
    assert figure.table_data("tbl-ch02-checklist") is None              # made from the claims and numbers only
    res, figs = tmp_path / "results", tmp_path / "figures"
    res.mkdir()
    figs.mkdir()
    pd.DataFrame([dict(seed=s, condition=c, accuracy=0.5) for s in (0, 1) for c in ("oracle", "nearest_first", "pinned")]
                 ).to_csv(res / "06_unknown_task.csv", index=False)
    pd.DataFrame(dict(condition=["nearest_first"], routing_accuracy=0.9)).to_csv(
        res / "06_unknown_task_routing.csv", index=False)
    (r,) = provenance.card("tbl-ch06-routing", tmp_path)["rows"]
    assert r["file"] == "06_unknown_task.csv" and r["where"] == {"condition": ["nearest_first"]} and r["n_selected"] == 2
    pd.DataFrame([dict(seed=s, mode=m, head=h) for s in (0, 1) for m in ("train_mode", "backbone_eval", "separate_stats")
                  for h in ("linear", "mlp")]).to_csv(res / "04_heads.csv", index=False)
    pd.DataFrame(dict(key=["gap_mlp"], estimate=0.1, low=0.0, high=0.2, verdict="x", head="mlp")).to_csv(
        res / "04_heads_gap.csv", index=False)
    (figs / "04-gap.json").write_text(json.dumps(dict(data="04_heads_gap.csv",
                                                      where={"mode": ["separate_stats", "backbone_eval"]})))
    c = provenance.card("tbl-ch04-gap", tmp_path)
    assert c["data"] == "04_heads_gap.csv"
    assert c["rows"][0]["where"] == {"mode": ["separate_stats", "backbone_eval"]}   # no `head == mlp`
    assert "filter <code>mode in {separate_stats, backbone_eval}</code>: 8 of its 12 rows" in provenance.card_html(c)
    assert all(r["where"] == {} for r in provenance.card("tbl-ch04-anything", tmp_path)["rows"])


def test_the_recompute_heading_states_the_recorded_cost_not_a_guess(tmp_path):
    """The card's *Recompute its rows* heading gives the chapter's recorded CPU time (its release units file), else
    the rows' own when no filter narrows them, else says only "recorded cost" (the sentence gives the selected rows'
    figure) or "no recorded cost"; never a hard-coded "hours" (a chapter recorded in seconds read as one of hours)."""
    root = _book(tmp_path)
    c = provenance.card("tbl-ch04-anything", root)          # 12 rows of 1.5 s each, no filter, no release
    html = provenance.card_html(c)
    assert "(hours)" not in html
    assert "<strong>Recompute its rows</strong> (recorded cost: 18 s of CPU time):" in html
    html = provenance.card_html({**c, "chapter_cpu_s": 9000.0, "chapter_units": 40})
    assert "<strong>Recompute its rows</strong> (recorded cost: 2.5 h of CPU time):" in html
    (tmp_path / "f").mkdir()
    filtered = provenance.card("fig-ch04-toy", _book(tmp_path / "f", where={"mode": ["backbone_eval"]}))
    html = provenance.card_html(filtered)
    assert "<strong>Recompute its rows</strong> (recorded cost):" in html and "the selected rows recorded 6 s" in html
    bare = {**c, "rows": [{**c["rows"][0], "cpu_s": None}]}  # rows without wall_s
    html = provenance.card_html(bare)
    assert "<strong>Recompute its rows</strong> (no recorded cost):" in html and "no recorded time" in html
