"""report.load_rows: analysing an earlier run's rows again, with the checks that keep it honest."""
import json

import numpy as np
import pandas as pd
import pytest

from bnstudy.study import report


@pytest.fixture
def saved(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_RUN", {})
    monkeypatch.setattr(report, "_SAVED", [])
    monkeypatch.delenv("BNSTUDY_RUN_PARAMETERS", raising=False)
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"seed": [0, 0, 1, 1], "mode": ["a", "b", "a", "b"], "acc": rng.random(4) / 3,
                       "flag": [True, False, True, False], "kl": [np.nan, 1e-17, 2.5, 1 / 7]})
    report.describe_run("test", dict(profile="full", seeds=None, networks=("x", "y")))
    report.record_run_time(12.5)
    path = report.save_table(df, tmp_path / "results" / "07_rows.csv")
    return df, path


def test_rows_come_back_exactly_with_their_provenance(saved):
    df, path = saved
    rows, prov = report.load_rows(path, dict(profile="full", seeds=None, networks=["x", "y"]))
    pd.testing.assert_frame_equal(rows, df, check_exact=True)     # floats round-trip bit for bit
    assert prov["run_wall_s"] == 12.5 and prov["seeds"] == [0, 1]
    assert prov["git_commit"] == report.git_commit() and prov["written"]


def test_run_line_after_record_run_time_keeps_the_time(saved, tmp_path):
    df, path = saved
    report.describe_run("again", dict(profile="full"))           # a later run_line must not drop it
    assert json.loads(report.sidecar_path(path).read_text())["parameters"]["run_wall_s"] == 12.5


def test_a_changed_or_partial_file_is_refused(saved):
    _, path = saved
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ValueError, match="does not match its sidecar"):
        report.load_rows(path, {})


def test_a_different_parameter_is_refused_by_name(saved):
    _, path = saved
    with pytest.raises(ValueError, match=r"parameter 'profile' is 'quick' here but was 'full'"):
        report.load_rows(path, dict(profile="quick"))
    with pytest.raises(ValueError, match=r"did not record parameter 'steps'"):
        report.load_rows(path, dict(steps=100))


def test_a_parameter_added_after_the_rows_reads_as_its_documented_default(saved):
    """Issue 33: a design that adds a parameter (here ``shift_kind``) still reads a release computed before it:
    the rows take the chapter's READ_DEFAULTS value, the column is filled, and only another value is refused."""
    df, path = saved
    defaults = dict(shift_kind="brightness", blur_sigma=0.0)
    rows, prov = report.load_rows(path, dict(profile="full", shift_kind=None, blur_sigma=0.0),
                                  resolved=dict(profile="full", shift_kind="brightness", blur_sigma=0.0),
                                  defaults=defaults)
    assert prov["defaulted"] == defaults and list(rows.columns) == [*df.columns, "shift_kind", "blur_sigma"]
    assert (rows["shift_kind"] == "brightness").all() and (rows["blur_sigma"] == 0.0).all()
    pd.testing.assert_frame_equal(rows[df.columns], df, check_exact=True)
    with pytest.raises(ValueError, match=r"'shift_kind' is 'blur' here, but the rows .* predate it and were "
                                         r"computed as shift_kind='brightness'"):
        report.load_rows(path, dict(shift_kind="blur"), defaults=defaults)
    with pytest.raises(ValueError, match=r"did not record parameter 'shift_kind'.*READ_DEFAULTS"):
        report.load_rows(path, dict(shift_kind="brightness"))          # no default documented: refused
    r = report.rows_or_run(path, _never_run, dict(profile="full", shift_kind="brightness"), defaults=defaults)
    assert r.defaulted == dict(shift_kind="brightness") and "shift_kind" in r.table
    # left to the profile (None) while the profile now says "blur": the page takes the rows' value, and says so
    r = report.rows_or_run(path, _never_run, dict(profile="full", shift_kind=None),
                           resolved=dict(profile="full", shift_kind="blur"), defaults=defaults)
    assert r.defaulted == dict(shift_kind="brightness")


def test_chapter_rows_is_one_preamble_for_every_chapter(saved):
    """The chapter module's ANALYSIS_PARAMETERS, siblings and READ_DEFAULTS, and the config rebuilt from the rows."""
    import types
    from dataclasses import dataclass
    from bnstudy.study.config import _Frozen

    @dataclass(frozen=True)
    class C(_Frozen):
        profile: str = "full"
        shift_kind: str = "blur"            # the design's new default
        n_boot: int = 9                     # analysis only

    _, path = saved
    module = types.SimpleNamespace(ANALYSIS_PARAMETERS=("n_boot",), READ_DEFAULTS=dict(shift_kind="brightness"))
    r, cfg = report.chapter_rows(str(path), _never_run, C(), dict(shift_kind=None), module)
    assert cfg == C(shift_kind="brightness") and r.defaulted == dict(shift_kind="brightness")
    ran, cfg2 = report.chapter_rows(None, lambda: pd.DataFrame({"x": [1]}), C(), {}, types.SimpleNamespace())
    assert cfg2 == C() and ran.defaulted == {} and list(ran.table.x) == [1]


def test_missing_table_or_sidecar(saved, tmp_path):
    _, path = saved
    with pytest.raises(FileNotFoundError, match="no results table"):
        report.load_rows(tmp_path / "nope.csv", {})
    report.sidecar_path(path).unlink()
    with pytest.raises(FileNotFoundError, match="has no sidecar"):
        report.load_rows(path, {})


def test_a_record_of_the_resolved_value_matches_too(saved):
    _, path = saved
    report.load_rows(path, dict(networks=None), resolved=dict(networks=("x", "y")))
    with pytest.raises(ValueError, match="networks"):
        report.load_rows(path, dict(networks=None), resolved=dict(networks=("x",)))


def test_timing_sentence_says_where_the_rows_came_from(saved):
    _, path = saved
    assert "0.5 of them in the sweep" in report.timing_sentence(120, 30)
    _, prov = report.load_rows(path, {})
    s = report.timing_sentence(6, prov["run_wall_s"], prov, n_rows=4)
    assert "did not run the experiment" in s and "4 rows" in s and prov["git_commit"] in s and "0.2 minutes" in s
    assert "not in its sidecar" in report.timing_sentence(6, None, prov, n_rows=4)


def test_a_re_saved_table_still_names_the_run_that_computed_it(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_RUN", {})
    monkeypatch.setattr(report, "_SAVED", [])
    monkeypatch.delenv("BNSTUDY_RUN_PARAMETERS", raising=False)
    df = pd.DataFrame({"seed": [0, 1], "acc": [0.25, 0.5]})
    origin = dict(git_commit="f40bda3604", written="2026-12-01T00:45:58+00:00", sha256="386abfe974fa")
    report.describe_run("again", dict(profile="full", rows_from=origin))
    path = report.save_table(df, tmp_path / "results" / "07_rows.csv")
    assert json.loads(report.sidecar_path(path).read_text())["environment"]["git_commit"] != "f40bda3604"
    _, prov = report.load_rows(path, dict(profile="full"))
    assert prov["git_commit"] == "f40bda3604" and prov["written"] == "2026-12-01T00:45:58+00:00"


# --- rows_or_run: the rows-or-run branch every chapter with a ``rows`` parameter shares ----------------------------

def _never_run():
    raise AssertionError("rows were given, so the experiment must not run")


def test_rows_or_run_uses_the_given_rows_and_never_runs(saved):
    """Fails if ``rows`` is ignored: the run would raise, and its table differs from the saved one."""
    df, path = saved
    r = report.rows_or_run(path, _never_run, dict(profile="full"))
    pd.testing.assert_frame_equal(r.table, df, check_exact=True)
    assert r.provenance["sha256"] == report.load_rows(path, {})[1]["sha256"] and r.run_wall_s == 12.5
    assert r.extra["rows_from"]["git_commit"] == report.git_commit() and r.extra["rows_from"]["run_wall_s"] == 12.5
    assert "did not run the experiment" in r.timing(6) and "4 rows" in r.timing(6)


def test_rows_or_run_runs_and_times_the_experiment_without_rows(saved):
    df, _ = saved
    r = report.rows_or_run(None, lambda: df.iloc[:2], dict(profile="quick"))  # parameters unused: nothing to check
    assert len(r.table) == 2 and r.provenance is None and r.extra == {} and r.run_wall_s >= 0
    assert report._RUN["run_wall_s"] == r.run_wall_s and "of them in the sweep" in r.timing(60)


def test_rows_or_run_refuses_a_mismatching_parameter_by_name(saved):
    _, path = saved
    with pytest.raises(ValueError, match=r"parameter 'profile' is 'quick' here but was 'full'"):
        report.rows_or_run(path, _never_run, dict(profile="quick"))
    with pytest.raises(ValueError, match=r"parameter 'networks'"):
        report.rows_or_run(path, _never_run, dict(networks=None), resolved=dict(networks=("x",)))
    # the run left it at None (its profile's value): the message says so and how to match it, instead of
    # leaving a reader to wonder why 150 differs from "None" when 150 is the profile's value
    with pytest.raises(ValueError, match=r"parameter 'seeds' is 3 here but was None \(the profile's value\) in the "
                                         r"run .*; .*leave seeds out"):
        report.rows_or_run(path, _never_run, dict(seeds=3), resolved=dict(seeds=(0, 1, 2)))


def test_rows_or_run_loads_and_checks_sibling_tables(saved, tmp_path):
    df, path = saved
    sib = report.save_table(df.head(2), path.with_name("07_rows_check.csv"))
    r = report.rows_or_run(path, _never_run, dict(profile="full"), siblings=("check",))
    pd.testing.assert_frame_equal(r.tables["check"], df.head(2), check_exact=True)
    side = json.loads(report.sidecar_path(sib).read_text())
    side["parameters"]["profile"] = "quick"                      # a sibling from another configuration
    report.sidecar_path(sib).write_text(json.dumps(side))
    with pytest.raises(ValueError, match=r"07_rows_check.csv"):
        report.rows_or_run(path, _never_run, dict(profile="full"), siblings=("check",))
    sib.unlink()
    with pytest.raises(FileNotFoundError, match=r"07_rows.csv was given, but 07_rows_check.csv, which its run "
                                                r"saved beside it, is not in"):
        report.rows_or_run(path, _never_run, dict(profile="full"), siblings=("check",))
    with pytest.raises(ValueError, match="expected siblings"):
        report.rows_or_run(None, lambda: df, {}, siblings=("check",))


def test_a_sibling_that_records_its_own_configuration_is_checked_against_it(saved):
    """Chapter 6's temperature check runs other seeds than the page: its sidecar records its own configuration, and
    rows_or_run checks it against the parameters given for it (sibling_parameters), not the page's."""
    df, path = saved
    sib = report.save_table(df.head(2), path.with_name("07_rows_check.csv"))
    report.write_sidecar(sib, parameters=dict(profile="full", seeds=[10, 11]))
    own = {"check": (dict(profile="full", seeds=(10, 11)), None)}
    with pytest.raises(ValueError, match=r"parameter 'seeds' is None here but was \[10, 11\]"):
        report.rows_or_run(path, _never_run, dict(profile="full", seeds=None), siblings=("check",))
    r = report.rows_or_run(path, _never_run, dict(profile="full", seeds=None), siblings=("check",),
                           sibling_parameters=own)
    pd.testing.assert_frame_equal(r.tables["check"], df.head(2), check_exact=True)
    with pytest.raises(ValueError, match=r"parameter 'seeds' is \[10, 12\] here but was \[10, 11\]"):
        report.rows_or_run(path, _never_run, dict(profile="full"), siblings=("check",),
                           sibling_parameters={"check": (dict(seeds=(10, 12)), None)})


def test_config_parameters_leave_out_the_analysis_parameters():
    class C:
        def asdict(self):
            return dict(profile="full", seeds=(0, 1), n_boot=100)
    params, resolved = report.config_parameters(C(), dict(seeds=None, other=1), analysis=("n_boot",))
    assert params == dict(profile="full", seeds=None) and resolved == dict(profile="full", seeds=(0, 1))


def test_glue_values_glues_each_value_under_the_prefix_by_the_pages_rules(monkeypatch):
    import myst_nb
    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda k, v, display=True: glued.__setitem__(k, v))
    from bnstudy.study.pages import glue_values
    glue_values("ch09", dict(n=np.int64(3), lr=0.05, split=dict(fit=40, val=10)))
    assert glued == {"ch09_n": 3, "ch09_lr": 0.05, "ch09_split_fit": 40, "ch09_split_val": 10}
    assert type(glued["ch09_n"]) is int                           # a NumPy scalar would print as np.int64(3)


def test_figure_sidecar_names_every_table_the_figure_draws_from(saved, tmp_path):
    import matplotlib.pyplot as plt
    from bnstudy.study import plots
    df, path = saved
    other = report.save_table(df, tmp_path / "results" / "07_points.csv")
    fig = plt.figure()
    plots.save_figure(fig, "07-two", tmp_path, [path, other])
    meta = json.loads((tmp_path / "07-two.json").read_text())
    assert meta["data"] == "07_rows.csv" and meta["data_more"] == ["07_points.csv"]
    assert meta["data_more_sidecars"] == [report.sidecar_path(other).name]
    plots.save_figure(fig, "07-one", tmp_path, path)               # one table: no data_more
    assert "data_more" not in json.loads((tmp_path / "07-one.json").read_text())
    with pytest.raises(ValueError, match="at least one CSV"):
        plots.save_figure(fig, "07-none", tmp_path, [])
    plt.close(fig)


def test_a_table_with_no_columns_saves_and_comes_back_empty(saved, tmp_path):
    """A run whose optional part did not apply (chapter 4 without a linear head: no step check) saves an
    empty table; saving it and reading it back must work (pandas alone raises EmptyDataError on the file)."""
    path = report.save_table(pd.DataFrame(), tmp_path / "results" / "07_rows_empty.csv")
    side = json.loads(report.sidecar_path(path).read_text())
    assert side["rows"] == 0 and side["columns"] == []
    rows, prov = report.load_rows(path, dict(profile="full"))
    assert rows.empty and list(rows.columns) == [] and prov["sha256"] == side["sha256"]


def test_a_sidecar_records_the_resolved_parameters_and_no_machine_paths(tmp_path, monkeypatch):
    """Issue 37: a table's sidecar, written under the book runner (`$BNSTUDY_RUN_PARAMETERS` holds the notebook's
    values: `seeds: null` for the profile's, absolute folders), records the seeds the run resolved and its paths
    relative to the repository or the book's root: no /tmp, /work or home folder of the machine that wrote it."""
    import os

    monkeypatch.setattr(report, "_RUN", {})
    monkeypatch.setattr(report, "_SAVED", [])
    root = tmp_path / "book"
    monkeypatch.setenv("BNSTUDY_RUN_PARAMETERS", json.dumps(dict(
        profile="full", seeds=None, steps=None, rows=str(report._REPO / "release" / "04_heads.csv"),
        results_dir=str(root / "results"), figures_dir=str(root / "figures"),
        cache_dir=os.path.expanduser("~/.cache/bnstudy"), elsewhere="/somewhere/else/x.csv", margin=0.02)))
    report.describe_run("test", dict(profile="full", seeds=(0, 1, 2), steps=800, margin=0.02,
                                     rows_from=dict(path=str(report._REPO / "release" / "04_heads.csv"))))
    path = report.save_table(pd.DataFrame(dict(seed=[0, 1, 2], x=[1, 2, 3])), root / "results" / "04_t.csv")
    text = report.sidecar_path(path).read_text()
    p = json.loads(text)["parameters"]
    assert p["seeds"] == [0, 1, 2] and p["steps"] == 800 and p["margin"] == 0.02   # resolved, not null
    assert p["rows"] == "release/04_heads.csv" and p["rows_from"]["path"] == "release/04_heads.csv"
    assert (p["results_dir"], p["figures_dir"], p["cache_dir"], p["elsewhere"]) == (
        "results", "figures", "~/.cache/bnstudy", "x.csv")
    for machine in (str(tmp_path), str(report._REPO), os.path.expanduser("~") + "/"):
        assert machine not in text


def test_a_chapter_added_after_the_last_verification_is_not_said_to_be_verified(tmp_path):
    """A verification record that says how (exact / statistical / unchecked lists) names every chapter it checked: a
    chapter released after it is 'not in this verification' on the run line and the card, never 'exactly' (the fault:
    chapter 9's page said 'exactly: every column ==' before any unit of it was recomputed)."""
    import json

    from bnstudy.study import provenance
    from bnstudy.study.report import release_of, release_text

    v = dict(date="2026-12-04", git_commit="f" * 40, units_per_chapter=1, exact=["02"], statistical=["01"],
             unchecked=[])
    (tmp_path / "manifest.json").write_text(json.dumps(dict(
        release=dict(version="2026.12.04", date="2026-12-04", verified=v),
        tables={"09_x": dict(chapter="09"), "02_y": dict(chapter="02"), "01_z": dict(chapter="01")})))
    for stem, words in (("09_x", "not in this verification"), ("02_y", "exactly"), ("01_z", "statistically")):
        rel = release_of(tmp_path / f"{stem}.csv")
        assert f"this chapter {words}" in release_text(rel)
        card = provenance._verification(dict(release=rel, verified=rel["verified"], n_verified_chapters=None))
        assert words in card
    old = dict(v)
    for k in ("exact", "statistical", "unchecked"):
        old.pop(k)
    (tmp_path / "manifest.json").write_text(json.dumps(dict(release=dict(version="1", verified=old),
                                                            tables={"09_x": dict(chapter="09")})))
    assert "this chapter exactly" in release_text(release_of(tmp_path / "09_x.csv"))  # a record before lists: exact


# --- new-user report (stop 53): the wrong file as rows, and an output folder that cannot be made ------------------

def test_rows_naming_a_sidecar_a_sibling_or_another_chapters_table_are_refused_as_such():
    """Each used to fail with a message about something else (a checksum, a doubled suffix, a parameter the run
    "did not record"). The kind: any file of a results folder that is not this chapter's main table."""
    from bnstudy.study.release import RELEASE_DIR
    with pytest.raises(ValueError, match=r"01_freeze_modes.json is a sidecar .* 01_freeze_modes.csv"):
        report.load_rows(RELEASE_DIR / "01_freeze_modes.json", {})
    with pytest.raises(ValueError, match=r"01_freeze_modes_drift_targets.csv is the run's 'drift_targets' table.*"
                                         r"give the main table, 01_freeze_modes.csv"):
        report.rows_or_run(RELEASE_DIR / "01_freeze_modes_drift_targets.csv", None, {"modes": None},
                           siblings=("drift", "drift_targets"))
    with pytest.raises(ValueError, match=r"02_eval_traps.csv holds chapter 02_eval_traps's rows .* not this "
                                         r"chapter's \(freeze_modes\)"):
        report.load_rows(RELEASE_DIR / "02_eval_traps.csv", {"modes": None}, chapter="freeze_modes")
    table, _ = report.load_rows(RELEASE_DIR / "02_eval_traps.csv", {}, chapter="eval_traps")  # its own: read
    assert len(table)
    from bnstudy.study.experiments.eval_traps import run as ch02
    assert report.chapter_folder(ch02) == report.chapter_folder(ch02.make_config("quick")) == "eval_traps"
    assert report.chapter_folder(report) is None


def test_output_folders_are_made_and_checked_before_any_work(tmp_path):
    from bnstudy.study.book import check_output_folders
    (tmp_path / "a_file").write_text("x")
    for name, value, why in [("results_dir", "/proc/nope", "No such file or directory"),
                             ("figures_dir", str(tmp_path / "a_file"), "exists and is not a directory"),
                             ("cache_dir", str(tmp_path / "a_file" / "sub"), "Not a directory")]:
        with pytest.raises(ValueError, match=rf"^{name} '{value}': cannot be used as a folder \({why}\)"):
            check_output_folders({name: value})
    check_output_folders({"results_dir": str(tmp_path / "new" / "results"), "cache_dir": None})
    assert (tmp_path / "new" / "results").is_dir() and not list((tmp_path / "new" / "results").iterdir())
