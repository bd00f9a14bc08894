"""The data release (issue 23): recording units, computing a chapter into a release, verifying it with ==."""

import gzip
import json
import shutil

import pandas as pd
import pytest

from bnstudy.study import release
from bnstudy.study.sweep import read_units as read_log, record_units


def test_parse_chapters_names_the_parameter_and_allowed_values():
    assert [c.number for c in release.parse_chapters("03,4")] == ["03", "04"]
    assert [c.number for c in release.parse_chapters(None)] == list(release.CHAPTERS)
    assert [c.number for c in release.parse_chapters("all")] == list(release.CHAPTERS)
    with pytest.raises(ValueError, match=r"CHAPTERS: unknown chapter '99'; allowed: 01, 02"):
        release.parse_chapters("99")


def test_record_units_writes_each_unit_once_in_column_order_and_skips_a_cut_line(tmp_path):
    log = tmp_path / "u.jsonl"
    assert record_units(log, "ns", [{"a": 1}, {"a": 2}], [{"z": 1.5, "b": 0.1}, {"z": 2.0, "b": 0.2}]) == 2
    assert record_units(log, "ns", [{"a": 1}], [{"z": 1.5, "b": 0.1}]) == 0  # already recorded by this process
    with open(log, "a") as f:
        f.write('{"namespace": "ns", "conf')  # a writer killed mid-line
    units = read_log(log)
    assert [u["config"] for u in units] == [{"a": 1}, {"a": 2}]
    assert list(units[0]["row"]) == ["z", "b"]  # the row's key order is its table's column order


def test_sample_units_is_seeded_and_bounded():
    assert release.sample_units(list(range(50)), 5, 3) == release.sample_units(list(range(50)), 5, 3)
    assert release.sample_units(list(range(50)), 5, 3) != release.sample_units(list(range(50)), 5, 4)
    assert release.sample_units([7, 9], 5, 0) == [7, 9]


def test_compare_tables_names_row_column_and_size():
    a = pd.DataFrame(dict(seed=[0, 1], acc=[0.5, 0.25], wall_s=[1.0, 2.0], v=[float("nan"), 1.0]))
    b = a.copy()
    assert release.compare_tables("t", a, b) == []
    b.loc[1, "acc"] = 0.2500001
    b.loc[0, "wall_s"] = 99.0  # wall times are not compared
    d = release.compare_tables("t", a, b)
    assert d == ["t row 1, column acc: release 0.25, recomputed 0.2500001 (|difference| 1e-07)"]
    assert "columns differ" in release.compare_tables("t", a, b.drop(columns="v"))[0]
    assert "2 rows in the release, 1 recomputed" in release.compare_tables("t", a, b.head(1))[0]


def test_run_state_columns_are_skipped_only_where_declared():
    ch4 = release.CHAPTERS["04"]
    assert release.run_state_columns(ch4, "04_heads_units") == ("computed",)
    assert release.run_state_columns(ch4, "04_heads") == ()
    assert release.run_state_columns(release.CHAPTERS["03"], "03_shift_strength") == ()
    cold = pd.DataFrame(dict(namespace=["ch04_heads"], computed=[1800], total=[1800]))
    warm = cold.assign(computed=[0])  # a verification rebuilds the table from cached units
    assert release.compare_tables("u", cold, warm, skip=("computed",)) == []
    assert release.compare_tables("u", cold, warm.assign(total=[1799]), skip=("computed",)) == [
        "u row 0, column total: release 1800, recomputed 1799 (|difference| 1)"]
    assert release.compare_tables("u", cold, warm) != []


def test_compare_rows_ignores_wall_times_and_equal_nans():
    assert release.compare_rows("u", {"x": 1.0, "wall_s": 3.0, "n": float("nan")},
                                {"x": 1.0, "wall_s": 4.0, "n": float("nan")}) == []
    assert release.compare_rows("u", {"x": 1.0}, {"x": 2.0}) == ["u, field x: release 1.0, recomputed 2.0 "
                                                                 "(|difference| 1)"]


@pytest.fixture(scope="module")
def quick_release(tmp_path_factory):
    """Chapter 7 computed at the quick profile, on its small CNN and one corruption only (what these tests read needs
    no more: 2 seeds, the reference condition and one corruption), into a release folder."""
    root = tmp_path_factory.mktemp("release")
    import os
    old = os.environ.get("BNSTUDY_CACHE_DIR")
    os.environ["BNSTUDY_CACHE_DIR"] = str(root / "cache")
    try:
        release.compute("07", root / "release", allow_dirty=True, profile="quick", log=lambda *a: None,
                        parameters=dict(networks=["small_cnn"], corruptions=["inversion"]))
    finally:
        if old is None:
            os.environ.pop("BNSTUDY_CACHE_DIR")
        else:
            os.environ["BNSTUDY_CACHE_DIR"] = old
    return root / "release"


@pytest.mark.slow
def test_compute_writes_tables_units_and_manifest(quick_release):
    m = release.read_manifest(quick_release)
    t = m["tables"]["07_real_data"]
    assert t["sha256"] == release.sha256_file(quick_release / "07_real_data.csv")
    assert t["rows"] == len(pd.read_csv(quick_release / "07_real_data.csv")) and t["profile"] == "quick"
    assert json.loads((quick_release / "07_real_data.json").read_text())["sha256"] == t["sha256"]
    u = m["units"]["07_real_data"]
    assert u["units"] == len(release.read_units(quick_release / u["file"])) == t["rows"]  # one unit per row here
    assert gzip.decompress((quick_release / u["file"]).read_bytes())  # plain gzip, no time stamp
    c = m["chapters"]["07"]
    for k in ("git_commit", "code_fingerprint", "torch", "python", "threads_per_run", "cpu", "device", "workers",
              "run_wall_s"):
        assert c[k] not in (None, ""), k
    assert m["release"]["version"] and m["release"]["date"]
    assert not (quick_release / ".work" / "07_real_data").exists()
    claims = pd.read_csv(quick_release / "claims" / f"{m['release']['version']}.csv", dtype={"chapter": str})
    assert set(claims["chapter"]) == {"07"} and len(claims)  # the release's claims table (issue 37), from its page
    assert json.loads((quick_release / "claims" / f"{m['release']['version']}.json").read_text())["chapters"]["07"]


@pytest.mark.slow
def test_compute_with_reuse_units_runs_only_the_units_a_new_axis_adds(quick_release, tmp_path, monkeypatch):
    """A new axis costs its new cells only (issue 33): with reuse_units the release's recorded units count as
    computed (an empty run cache here), only the added corruption's units run, and the old rows are unchanged."""
    rel = tmp_path / "release"
    shutil.copytree(quick_release, rel)
    monkeypatch.setenv("BNSTUDY_CACHE_DIR", str(tmp_path / "empty-cache"))
    old_units = release.read_units(rel / "units" / "07_real_data.jsonl.gz")
    for u in old_units:  # as if computed before numeric environments were recorded
        u["numerics"] = None
    release.write_units(old_units, rel / "units" / "07_real_data.jsonl.gz")
    lines = []
    release.compute("07", rel, allow_dirty=True, profile="quick", log=lines.append, reuse_units=True,
                    parameters=dict(networks=["small_cnn"], corruptions=["inversion", "gaussian_noise"]))
    m = release.read_manifest(rel)
    units = release.read_units(rel / "units" / "07_real_data.jsonl.gz")
    assert m["chapters"]["07"]["reused_units"] == len(old_units) < len(units)
    assert m["chapters"]["07"]["reused_run_wall_s"] == pytest.approx(
        release.read_manifest(quick_release)["chapters"]["07"]["run_wall_s"])  # the reused units' own cost
    assert any(f"{len(old_units):,} of {len(units):,} units taken from the release's record" in x for x in lines)
    new, old = pd.read_csv(rel / "07_real_data.csv"), pd.read_csv(quick_release / "07_real_data.csv")
    keys = ["network", "seed", "corruption", "severity", "mode"]
    kept = new[new.corruption.isin(set(old.corruption))].drop(columns="wall_s").sort_values(keys, ignore_index=True)
    assert kept.equals(old.drop(columns="wall_s").sort_values(keys, ignore_index=True))
    # the reused units keep the environment they were computed under; the chapter says it mixes two, and its
    # verification is statistical on every machine
    from bnstudy.study import numerics
    envs = [u.get("numerics") for u in units]
    assert envs.count(None) == len(old_units) and envs.count(numerics.key()) == len(units) - len(old_units)
    assert m["chapters"]["07"]["numerics"]["mixed"] == {"unrecorded": len(old_units),
                                                        numerics.key(): len(units) - len(old_units)}
    lines = []
    assert release.verify("07", 1, release_dir=rel, log=lines.append, record=False) == 0
    assert any("checked statistically" in x and "2 numeric environments" in x for x in lines), lines


@pytest.mark.slow
def test_verify_passes_then_names_a_changed_unit_and_a_changed_cell(quick_release, tmp_path):
    lines = []
    assert release.verify("07", 2, release_dir=quick_release, log=lines.append, record=False) == 0
    assert "every table == the release" in lines[-1]
    # a recorded row that the code does not compute: the unit is named, with the field and the size
    bad = tmp_path / "bad"
    shutil.copytree(quick_release, bad)
    ch = release.CHAPTERS["07"]
    units = release.read_units(release.units_path(ch, bad))
    picked = release.sample_units(list(range(len(units))), 2, 0 + 7)
    units[picked[0]]["row"]["task_b"] += 0.001
    release.write_units(units, release.units_path(ch, bad))
    lines = []
    assert release.verify("07", 2, release_dir=bad, log=lines.append) == 1
    text = "\n".join(lines)
    assert f"chapter 07 unit {picked[0]} (ch07_real_data), field task_b" in text and "|difference| 0.001" in text
    # the same changed row read from the units (not recomputed) makes a table cell differ from the release CSV
    assert "chapter 07 (from the release's units) 07_real_data row" in text and "column task_b" in text


@pytest.mark.slow
def test_verify_on_another_cpu_model_under_the_pin_is_still_exact(quick_release, tmp_path):
    """Issue 32: the CPU model and its flags are recorded but, under the kernel pin, not part of the environment's
    identity: a changed cell is a difference of the code, reported as such."""
    bad = tmp_path / "cpu"
    shutil.copytree(quick_release, bad)
    m = release.read_manifest(bad)
    m["chapters"]["07"]["cpu"] = "Some Other CPU 9000"
    m["chapters"]["07"]["numerics"].update(cpu="Some Other CPU 9000", cpu_flags={"avx2": True, "avx512f": False})
    release.write_manifest(m, bad)
    df = pd.read_csv(bad / "07_real_data.csv")
    df.loc[0, "task_a_after"] += 1e-9
    df.to_csv(bad / "07_real_data.csv", index=False)
    lines = []
    assert release.verify("07", 1, release_dir=bad, log=lines.append) == 1
    text = "\n".join(lines)
    assert "differences under the release's own numeric environment (the code computes other rows)" in text
    assert "07_real_data row 0, column task_a_after" in text


@pytest.mark.slow
def test_verify_under_another_environment_names_it_and_checks_statistically(quick_release, tmp_path):
    """Issue 32: under another numeric environment the verification names the part that differs and checks each
    recomputed unit against its seeds' spread; the machine alone is never a failure."""
    other = tmp_path / "env"
    shutil.copytree(quick_release, other)
    m = release.read_manifest(other)
    here = m["chapters"]["07"]["numerics"]["capability"]
    m["chapters"]["07"]["numerics"]["capability"] = "AVX512"
    release.write_manifest(m, other)
    lines = []
    assert release.verify("07", 2, release_dir=other, log=lines.append) == 0
    text = "\n".join(lines)
    assert "FAILED" not in text
    assert ("chapter 07: checked statistically, not ==, because the numeric environment differs from the release's: "
            f"capability: release AVX512, here {here} (torch's CPU kernels differ (ATen dispatch))") in text
    # the quick profile has 2 seeds per condition, fewer than the check needs: said so, not called consistent
    assert "not checkable (2 seeds in its condition), == its recorded row" in text
    assert "chapters 07 could not be checked statistically" in lines[-1]
    # a unit far outside its seeds' spread fails, with the field named (three seeds made from the recorded two)
    units = release.read_units(release.units_path(release.CHAPTERS["07"], other))
    assert m["chapters"]["07"]["numerics"]["key"] == units[0]["numerics"]


def test_verify_with_nothing_released_says_so(tmp_path):
    lines = []
    assert release.verify("03", 1, release_dir=tmp_path, log=lines.append) == 2
    assert "nothing to verify" in lines[0]


def test_load_rows_names_the_release_of_a_release_table(tmp_path):
    from bnstudy.study.report import load_rows, release_text, save_table
    save_table(pd.DataFrame(dict(seed=[0], x=[1.0])), tmp_path / "t.csv")
    _, prov = load_rows(tmp_path / "t.csv", {})
    assert "release" not in prov
    release.write_manifest({"release": dict(version="2026.12.01", date="2026-12-01"), "chapters": {}}, tmp_path)
    _, prov = load_rows(tmp_path / "t.csv", {})
    assert prov["release"] == dict(version="2026.12.01", date="2026-12-01", verified=None)
    assert release_text(prov["release"]) == "data release 2026.12.01 (never verified by recomputation)"


@pytest.mark.slow
def test_the_committed_release_is_what_the_code_computes():
    """CI's proof (issue 23): a seeded sample of every released chapter's units ($BNSTUDY_VERIFY_UNITS per chapter,
    default 1) recomputed from an empty cache, stage 1 included, and every table rebuilt, all `==` the release."""
    import os
    manifest = release.read_manifest()
    assert manifest["chapters"], "release/ holds no chapter"
    for name, t in manifest["tables"].items():  # the files are the ones the manifest lists
        assert release.sha256_file(release.RELEASE_DIR / t["file"]) == t["sha256"], name
    for name, u in manifest["units"].items():
        assert release.sha256_file(release.RELEASE_DIR / u["file"]) == u["sha256"], name
    lines = []
    n = int(os.environ.get("BNSTUDY_VERIFY_UNITS", "1"))
    status = release.verify(None, n, log=lines.append)
    print("\n".join(lines))
    assert status == 0, "\n".join(lines)
