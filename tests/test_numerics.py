"""Issue 32: the numeric environment of the runs (pinned kernels), in the run cache key, the units and the verification."""

import io
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from bnstudy.study import engine, numerics, release, sweep
from bnstudy.study.config import Execution, RunConfig
from bnstudy.study.modes import MODE_NAMES

REPO = Path(__file__).resolve().parent.parent
TINY = dict(widths=(4, 8), stage1_steps=20, steps=15, n_eval=40, batch_size=16, stage1_batch_size=16)


def _tiny(cache, **ex):
    cfgs = [RunConfig(**TINY, seed=s, mode=m) for s in (0,) for m in MODE_NAMES[:2]]
    return engine.transfer_sweep(cfgs, "numerics_test", Execution(cache_dir=str(cache), progress=False, **ex))


def test_this_process_computes_under_the_pin():
    """The test process imported bnstudy.study.sweep before any torch operation (conftest), so the pin holds here."""
    assert numerics.mode() == "pinned"
    assert numerics.settings() == numerics.PIN
    want = numerics.expected()
    assert numerics.differences(want, numerics.record()) == []
    if numerics.cpu_info()["flags"]["avx2"]:
        assert numerics.capability() == "AVX2"
    assert numerics.key().startswith("pinned-")


def test_bad_mode_names_the_variable_and_the_allowed_values(monkeypatch):
    monkeypatch.setenv(numerics.MODE_ENV, "fast")
    with pytest.raises(ValueError, match=r"BNSTUDY_NUMERICS='fast' is not allowed; choose one of \['pinned', 'native'\]"):
        numerics.mode()


def test_differences_name_each_part_and_ignore_the_cpu_model():
    here = numerics.record()
    other = dict(here, cpu="Some Other CPU 9000", cpu_flags={f: False for f in numerics.FLAGS})
    assert numerics.differences(other, here) == []  # the pin makes the model and its flags irrelevant
    assert numerics.key(other) == numerics.key(here)
    # another capability and another vendor than this machine's, whichever this machine is
    cap = "AVX512" if here["capability"] != "AVX512" else "AVX2"
    vendor = "GenuineIntel" if here["vendor"] != "GenuineIntel" else "AuthenticAMD"
    changed = dict(here, capability=cap, vendor=vendor)
    d = numerics.differences(changed, here)
    assert d == [f"capability: release {cap}, here {here['capability']} (torch's CPU kernels differ (ATen dispatch))",
                 f"vendor: release {vendor}, here {here['vendor']} (another CPU vendor (approximate instructions "
                 "such as rsqrtps differ between vendors))"]
    assert numerics.key(changed) != numerics.key(here)
    assert "before the kernel pin" in numerics.differences(None, here)[0]


def test_cache_key_includes_the_numeric_environment():
    c = RunConfig(seed=0, steps=10)
    assert sweep.config_key(c, "ns", "v1", "pinned-avx2-aaaa") != sweep.config_key(c, "ns", "v1", "native-avx512-bbbb")
    assert sweep.config_key(c, "ns", "v1") == sweep.config_key(c, "ns", "v1", numerics.key())


def test_a_unit_cached_under_another_environment_is_recomputed_not_reused(tmp_path, monkeypatch):
    first = _tiny(tmp_path, n_jobs=1)
    sweep.reset_sweep_counts()
    again = _tiny(tmp_path, n_jobs=1)
    assert sweep.sweep_counts()["numerics_test"] == (0, 2)  # same environment: read back
    real_key = numerics.key
    monkeypatch.setattr(numerics, "key", lambda rec=None: "native-avx512-00000000" if rec is None or
                        rec.get("mode") else real_key(rec))
    sweep.reset_sweep_counts()
    other = _tiny(tmp_path, n_jobs=1)
    assert sweep.sweep_counts()["numerics_test"] == (2, 2)  # another environment's key: computed again
    pd.testing.assert_frame_equal(first.drop(columns="wall_s"), other.drop(columns="wall_s"))
    pd.testing.assert_frame_equal(first.drop(columns="wall_s"), again.drop(columns="wall_s"))


def test_a_worker_under_other_kernels_refuses_before_computing(tmp_path):
    want = dict(numerics.expected(), capability="AVX512")
    with pytest.raises(RuntimeError, match=r"capability: release AVX512, here .*ATEN_CPU_CAPABILITY=avx2"):
        sweep._run_group_and_cache(lambda cfgs: 1 / 0, [{"a": 1}], str(tmp_path), "ns", "v", 1, {}, want)
    assert not (tmp_path / "ns").exists()


def test_recorded_units_name_their_environment(tmp_path):
    log = tmp_path / "units.jsonl"
    sweep.record_units(log, "ns", [{"seed": 0}], [{"x": 1.0}])
    assert json.loads(log.read_text())["numerics"] == numerics.key()


@pytest.mark.slow
def test_a_process_that_ran_torch_before_the_pin_still_computes_pinned_rows(tmp_path):
    """torch fixes its kernels at its first operation: a script that ran one before importing bnstudy cannot be
    pinned itself, so its runs go to a worker process that is (rows == a pinned process's)."""
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        torch.ones(3).sum()                      # the first operation, before the pin
        sys.path.insert(0, {str(REPO)!r})
        from bnstudy.study import engine, numerics
        from bnstudy.study.config import Execution, RunConfig
        from bnstudy.study.modes import MODE_NAMES
        cfgs = [RunConfig(**{TINY!r}, seed=0, mode=m) for m in MODE_NAMES[:2]]
        df = engine.transfer_sweep(cfgs, "numerics_test", Execution(cache_dir=sys.argv[1], progress=False,
                                                                     backend="sequential"))
        df.drop(columns=["wall_s"]).to_json(sys.argv[2])
        print(torch.backends.cpu.get_cpu_capability())
    """))
    env = {k: v for k, v in os.environ.items() if k not in numerics.PIN}
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "c"), str(tmp_path / "late.json")], env=env,
                         capture_output=True, text=True, check=True)
    late = pd.read_json(tmp_path / "late.json")
    here = _tiny(tmp_path / "here", n_jobs=1).drop(columns=["wall_s"])
    pd.testing.assert_frame_equal(late.reset_index(drop=True), pd.read_json(io.StringIO(here.to_json())).reset_index(drop=True))
    if numerics.cpu_info()["flags"]["avx512f"]:
        assert out.stdout.strip().endswith("AVX512")  # the script's own process was not pinned


# --- the statistical check ---------------------------------------------------------------------------------------

PEERS = [dict(seed=s, acc=0.80 + 0.01 * s, drift=1.0 + 0.1 * (s % 3), steps=400, check=0.0, wall_s=3.0 + s,
              nan_field=float("nan")) for s in range(10)]


def test_seed_spread_check_accepts_a_plausible_seed_and_names_an_implausible_field():
    ok = release.seed_spread_check(dict(PEERS[0], acc=0.83, wall_s=999.0), PEERS)
    assert ok == dict(checked=True, n=10, fields=6, outside=[])
    bad = release.seed_spread_check(dict(PEERS[0], acc=0.20), PEERS)
    assert len(bad["outside"]) == 1 and bad["outside"][0].startswith("acc: 0.2 outside [")
    # a field equal in every seed (a design constant, an exact check) must stay equal
    const = release.seed_spread_check(dict(PEERS[0], check=1e-7), PEERS)
    assert const["outside"] == ["check: 1e-07 where every seed has 0.0"]
    # NaN: passes where every seed is NaN, fails where the seeds are finite
    assert release.seed_spread_check(dict(PEERS[0], acc=float("nan")), PEERS)["outside"] == [
        "acc: NaN where the seeds are finite"]


def test_seed_spread_check_interval_is_the_bonferroni_prediction_interval():
    from scipy import stats
    xs = [p["acc"] for p in PEERS]
    mean, sd, n = sum(xs) / 10, stats.tstd(xs), 10
    m = 3  # acc, drift and seed vary; steps, check are constant; nan_field is all NaN
    half = stats.t.ppf(1 - release.STAT_ALPHA / (2 * m), n - 1) * sd * math.sqrt(1 + 1 / n)
    assert release.seed_spread_check(dict(PEERS[0], acc=mean + half * 0.999), PEERS)["outside"] == []
    assert release.seed_spread_check(dict(PEERS[0], acc=mean + half * 1.001), PEERS)["outside"] != []


def test_seed_spread_check_needs_three_seeds():
    assert release.seed_spread_check(PEERS[0], PEERS[:2]) == dict(checked=False, n=2, fields=0, outside=[])


def test_condition_of_drops_only_seed_fields():
    assert release.condition_of({"seed": 1, "source_seed": 3, "lr": 0.1}) == release.condition_of(
        {"seed": 2, "source_seed": 4, "lr": 0.1})
    assert release.condition_of({"seed": 1, "lr": 0.1}) != release.condition_of({"seed": 1, "lr": 0.2})


def test_git_commit_is_dirty_for_code_not_for_release_outputs(tmp_path):
    from bnstudy.study.report import git_commit
    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)
    run("init", "-q")
    (tmp_path / "bnstudy").mkdir()
    (tmp_path / "release").mkdir()
    (tmp_path / "bnstudy" / "x.py").write_text("a = 1\n")
    (tmp_path / "release" / "t.csv").write_text("a\n1\n")
    run("add", "-A")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    clean = git_commit.__wrapped__(tmp_path)
    (tmp_path / "release" / "t.csv").write_text("a\n2\n")  # make release rewrote a table
    assert git_commit.__wrapped__(tmp_path) == clean and "+dirty" not in clean
    (tmp_path / "bnstudy" / "x.py").write_text("a = 2\n")  # the code changed
    assert git_commit.__wrapped__(tmp_path) == clean + "+dirty"
