"""Issue 37, the re-runner's path: what a run says before it trains (runs, cache, expected time from the release's
recorded times), one progress display across its phases, and torchvision's missing-install error."""

import builtins
import sys

import pytest

from bnstudy.study import cli, estimate, sweep
from bnstudy.study.config import Execution


def test_the_command_says_runs_expected_time_and_cache_before_the_kernel_starts(tmp_path, monkeypatch, capsys):
    """`bnstudy chapter 01 --profile full -p seeds 20` starts hours of work: it first prints the runs and the time
    the release's record gives for them (86 runs at 10 seeds, scaled to 20), and where the cache is."""
    rec = estimate.release_costs("01_freeze_modes")
    seen = {}

    def kernel(nb_path, out, profile, parameters=None, **k):  # what was said before the kernel would start
        import os
        seen.update(err=capsys.readouterr().err, expected=os.environ.get(estimate.EXPECTED_RUNS_ENV),
                    cache=parameters.get("cache_dir"))
        raise KeyboardInterrupt  # stop here: nothing is trained
    monkeypatch.setattr(cli.book, "execute_chapter", kernel)
    cache = tmp_path / "cache"
    rc = cli.main(["chapter", "01", "--profile", "full", "-p", "seeds", "20", "-p", "n_jobs", "2", "--cache-dir",
                   str(cache), "--out", str(tmp_path / "o"), "--no-html"])
    assert rc == 130
    runs = round(rec["units"] * 20 / rec["seeds"])
    assert f"with 20 seeds: about {runs:,} runs, expected about " \
           f"{estimate.duration(rec['wall_s'] * 2 * rec['workers'] / 2)} on 2 workers" in seen["err"]
    assert f"run cache: {cache.resolve()} (--cache-dir)" in seen["err"] and seen["cache"] == str(cache.resolve())
    assert seen["expected"] == str(runs)  # the kernel's progress display shows the run's total


def test_release_costs_share_the_chapters_recorded_time_among_its_units():
    rec = estimate.release_costs("01_freeze_modes")
    assert sum(rec["units_of"].values()) == rec["units"]
    # the namespaces without their own wall_s share the rest: every recorded CPU second is counted once
    total = sum(rec["per_unit_s"][ns] * n for ns, n in rec["units_of"].items())
    assert total == pytest.approx(rec["wall_s"] * rec["workers"])
    assert estimate.release_costs("99_none") is None
    line, runs = estimate.chapter_estimate("99_none", "quick", 3, 2)
    assert runs is None and "not in the data release" in line
    assert [estimate.duration(s) for s in (42, 420, 7500)] == ["42 s", "7 min", "2 h 05 min"]


def _double(configs):
    return [dict(y=2 * c["x"]) for c in configs]


def test_each_phase_says_its_runs_before_training_and_one_display_counts_across_phases(tmp_path, monkeypatch,
                                                                                       capsys):
    monkeypatch.setattr(sweep, "_PROGRESS", {"phase": 0, "runs": 0})
    monkeypatch.setenv("BNSTUDY_PROGRESS", "1")
    monkeypatch.setenv(estimate.EXPECTED_RUNS_ENV, "5")
    ex = Execution(cache_dir=str(tmp_path), n_jobs=1, backend="sequential")
    sweep.run_sweep([dict(x=0)], _double, namespace="toy_a", execution=ex)  # computed here, then cached
    sweep.run_sweep([dict(x=i) for i in range(4)], _double, namespace="toy_a", execution=ex)
    err = capsys.readouterr().err
    assert f"phase 1 (toy_a): 1 run to compute, 0 in the cache; no recorded time for these runs; cache {tmp_path}" \
           in err
    assert "phase 2 (toy_a): 3 runs to compute, 1 in the cache" in err
    assert err.index("phase 2 (toy_a)") > err.index("phase 1: toy_a")  # said before the phase's bar starts
    bars = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("phase 2: toy_a")]
    assert bars and "5/5" in bars[-1]  # the second phase continues the first's count, out of the run's total
    assert all(ln.endswith(sweep.PROGRESS_TAG) for ln in err.replace("\r", "\n").splitlines() if ln.strip())


def test_import_torchvision_without_torchvision_names_the_install_line(monkeypatch):
    from bnstudy.study import vision
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, name)
    real = builtins.__import__

    def no_torchvision(name, *a, **k):
        if name == "torchvision":
            raise ModuleNotFoundError("No module named 'torchvision'", name="torchvision")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_torchvision)
    with pytest.raises(ModuleNotFoundError, match=r'pip install "torchvision==0\.28\.0"'):
        vision.import_torchvision()
    assert "torchvision._meta_registrations" not in sys.modules  # the shim is not left behind


@pytest.mark.parametrize("nb_path", cli.book.chapter_paths(), ids=lambda p: p.stem)
def test_papermill_run_as_it_is_writes_inside_the_kernels_folder(nb_path):
    """Run from the clone, papermill wrote results/ and figures/ into the clone's parent ("../results")."""
    from pathlib import Path
    defaults = cli.book.notebook_parameters(nb_path)
    for name in ("results_dir", "figures_dir"):
        path = Path(defaults[name])
        assert not path.is_absolute() and ".." not in path.parts, (name, path)


def test_a_value_from_another_chapters_page_is_named_not_dropped():
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
        "reads {glue:text}`01-freeze-modes.ipynb::ch01_mean:.3f` ({glue:md}`chapters/01-freeze-modes.ipynb::v`), "
        "here {glue:text}`ch02_x:.2f` and {glue:text}`02-eval-traps.ipynb::ch02_y`")]
    assert cli.mark_other_pages_values(nb, "02-eval-traps") == 2
    assert nb.cells[0].source == ("reads *[chapter 1]* (*[chapter 1]*), here {glue:text}`ch02_x:.2f` "
                                  "and {glue:text}`02-eval-traps.ipynb::ch02_y`")


def test_the_reproduce_page_lists_every_chapters_sibling_tables():
    """book/reproduce.md names each table a chapter's page reads beside its main one (the fresh-user report: chapters
    4-7 had added tables the list missed)."""
    from pathlib import Path
    from bnstudy.study import release
    text = (Path(__file__).resolve().parent.parent / "book" / "reproduce.md").read_text()
    missing = [f"{ch.main}_{s}.csv" for ch in release.CHAPTERS.values() for s in ch.siblings()
               if f"_{s}.csv`" not in text]
    assert not missing, missing


def test_a_chapter_without_a_recorded_run_time_is_said_to_have_none_not_0_s(tmp_path):
    """New-user report (stop 54): `bnstudy chapter 05` said "862 runs and 0 s on 2 workers" because chapter 5's
    manifest records `run_wall_s: null`. The kind: every estimate drawn from a missing record (the chapter's line,
    a namespace's per-run cost, a phase line) says there is no recorded time instead of printing 0 s."""
    import gzip
    import json
    units = [dict(namespace="ch98_toy", row=dict(seed=0)), dict(namespace="ch98_toy", row=dict(seed=1)),
             dict(namespace="ch98_timed", row=dict(seed=0, wall_s=3.0))]
    with gzip.open(tmp_path / "98_toy_units.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(u) for u in units) + "\n")
    manifest = dict(chapters={"98": dict(notebook="98_toy", seeds=list(range(10)), workers=2, run_wall_s=None)},
                    units={"98_toy": dict(file="98_toy_units.jsonl.gz", units=3)})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    rec = estimate.release_costs("98_toy", str(tmp_path))
    assert rec["wall_s"] is None and rec["per_unit_s"] == {"ch98_toy": None, "ch98_timed": 3.0}
    line, runs = estimate.chapter_estimate("98_toy", "quick", 3, 2, release_dir=tmp_path)
    assert runs == 1 and "no run time for this chapter, so no time is estimated" in line and " 0 s" not in line
    estimate.namespace_cost.cache_clear()
    assert estimate.namespace_cost("ch98_toy", str(tmp_path)) is None
    assert estimate.namespace_cost("ch98_timed", str(tmp_path)) == 3.0
    # the published release: chapter 5 recorded no run time
    line5, _ = estimate.chapter_estimate("05_batch_size", "quick", 3, 2)
    assert estimate.release_costs("05_batch_size")["wall_s"] is None and " 0 s" not in line5
