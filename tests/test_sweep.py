"""The study engine: parallel sweeps, the run cache, resuming after a kill, other joblib backends."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from bnstudy.study import engine, sweep
from bnstudy.study.config import Execution, RunConfig
from bnstudy.study.modes import MODE_NAMES

TINY = dict(widths=(4, 8), stage1_steps=20, steps=30, n_eval=40, batch_size=16, stage1_batch_size=16)
REPO = Path(__file__).resolve().parent.parent
NS = "test_sweep"


def _tiny_configs(seeds=(0, 1), **kw):
    return [RunConfig(**{**TINY, **kw}, seed=s, mode=m) for s in seeds for m in MODE_NAMES]


def _tiny_run(cache_dir, **execution):
    return engine.transfer_sweep(_tiny_configs(), NS, Execution(cache_dir=str(cache_dir), progress=False, **execution))


def _comparable(df):
    return df.drop(columns=["wall_s"]).reset_index(drop=True)


def test_parallel_sweep_equals_sequential_sweep(tmp_path):
    par = _tiny_run(tmp_path / "a", n_jobs=2)
    seq = _tiny_run(tmp_path / "b", n_jobs=1)
    pd.testing.assert_frame_equal(_comparable(par), _comparable(seq))
    assert len(par) == 8 and list(par["mode"][:4]) == list(MODE_NAMES)


def test_rerun_reads_the_cache_and_writes_nothing(tmp_path):
    first = _tiny_run(tmp_path, n_jobs=1)
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    second = _tiny_run(tmp_path, n_jobs=1)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files
    pd.testing.assert_frame_equal(first, second)


def test_cache_key_depends_on_config_namespace_and_code_version():
    c = RunConfig(seed=0, steps=10)
    k = sweep.config_key(c, "ns", "v1")
    assert k != sweep.config_key(c.replace(steps=11), "ns", "v1")
    assert k != sweep.config_key(c, "other", "v1")
    assert k != sweep.config_key(c, "ns", "v2")
    assert k == sweep.config_key(RunConfig(steps=10, seed=0), "ns", "v1")
    assert k == sweep.config_key(c.asdict(), "ns", "v1")  # a dataclass keys like the dict of its fields


def test_execution_settings_are_not_part_of_any_row_or_key(tmp_path):
    df = _tiny_run(tmp_path, n_jobs=1, threads=1)
    assert not {"cache_dir", "n_jobs", "backend", "progress", "threads", "pack_size"} & set(df.columns)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "x.json"
    with pytest.raises(TypeError):
        sweep.atomic_write_bytes(target, object())  # not bytes: the write fails midway
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    sweep.atomic_write_bytes(target, b"ok")
    assert target.read_bytes() == b"ok"


def test_lockstep_groups_are_the_modes_of_one_seed_and_shift():
    cfgs = _tiny_configs(seeds=(0, 1)) + [RunConfig(**TINY, seed=0, mode="train_mode", brightness=1.0)]
    assert engine.lockstep_groups(cfgs) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


def test_bad_sweep_arguments_raise(tmp_path):
    from bnstudy.study.experiments.freeze_modes import run as freeze_modes
    with pytest.raises(ValueError, match="configs is empty"):
        sweep.run_sweep([], len, namespace="x", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="groups must list every config index exactly once"):
        sweep.run_sweep([{}, {}], len, namespace="x", cache_dir=tmp_path, groups=[[0]])
    with pytest.raises(TypeError, match="RunConfig"):
        engine.transfer_sweep([dict(seed=0)], "x")
    with pytest.raises(ValueError, match="unknown freeze_modes parameters \\['colour'\\]"):
        freeze_modes.make_config("quick", colour="red")
    with pytest.raises(ValueError, match="profile='huge' is not allowed"):
        freeze_modes.make_config("huge")


_SCRIPT = textwrap.dedent("""
    import sys
    from bnstudy.study import engine
    from bnstudy.study.config import Execution, RunConfig
    from bnstudy.study.modes import MODE_NAMES
    cfgs = [RunConfig(**dict({tiny}, steps=150), seed=s, mode=m) for s in range(3) for m in MODE_NAMES]
    ex = Execution(cache_dir=sys.argv[1], n_jobs=2, progress=False)
    engine.transfer_sweep(cfgs, "{ns}", ex).drop(columns=["wall_s"]).to_json(sys.argv[2])
""")


def _children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.slow
def test_killed_worker_resumes_without_loss_or_double_counting(tmp_path):
    script = tmp_path / "sweep_script.py"
    script.write_text(_SCRIPT.format(tiny=repr(TINY), ns=NS))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    stage2 = tmp_path / "killed" / NS
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "killed"), str(tmp_path / "k.json")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while time.time() < deadline and len(list(stage2.glob("*.json"))) < 2:
        time.sleep(0.05)
    done_before_kill = len(list(stage2.glob("*.json")))
    assert 2 <= done_before_kill < 12, "the sweep must be interrupted midway"
    for child in _children(proc.pid):  # kill the worker processes, not the parent
        os.kill(child, signal.SIGKILL)
    rc = proc.wait(timeout=120)
    assert rc != 0, "a sweep whose workers died must fail loudly"
    finished = {p.name: p.read_bytes() for p in stage2.glob("*.json")}
    assert len(finished) >= done_before_kill
    for data in finished.values():  # every file that looks finished is complete
        assert "row" in json.loads(data)
    # A worker killed between writing and renaming leaves its temporary file: hidden, never named *.json, and
    # removed by the next sweep (it happened in CI at stop 52, 1 run in many: the kill raced a write).
    left = [p.name for p in stage2.iterdir() if not p.name.endswith(".json")]
    assert all(n.startswith(".") and n.endswith(".tmp") for n in left), left
    # resume, then compare with a run that was never interrupted
    subprocess.run([sys.executable, str(script), str(tmp_path / "killed"), str(tmp_path / "k.json")],
                   env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, str(script), str(tmp_path / "clean"), str(tmp_path / "c.json")],
                   env=env, check=True, capture_output=True)
    for name, data in finished.items():  # finished runs were kept, not recomputed
        assert (stage2 / name).read_bytes() == data
    assert not [p.name for p in stage2.iterdir() if p.name.endswith(".tmp")], "the resumed sweep removed orphans"
    resumed, clean = pd.read_json(tmp_path / "k.json"), pd.read_json(tmp_path / "c.json")
    assert len(resumed) == 12 and not resumed.duplicated(["seed", "mode"]).any()
    pd.testing.assert_frame_equal(resumed, clean)


@pytest.mark.slow
def test_sweep_runs_on_a_local_dask_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            distributed.Client(cl):
        on_dask = _tiny_run(tmp_path / "dask", backend="dask")
    local = _tiny_run(tmp_path / "loky", n_jobs=1)
    pd.testing.assert_frame_equal(_comparable(on_dask), _comparable(local))


def test_loky_restart_warning_filter_matches_the_text_loky_emits():
    """The filter in run_sweep silences loky's worker-replacement warning; it must match loky's own text."""
    import inspect
    import re
    import warnings

    from joblib.externals.loky import process_executor

    from bnstudy.study.sweep import LOKY_RESTART_WARNING

    src = inspect.getsource(process_executor)
    i = src.index("A worker stopped")
    emitted = "".join(re.findall(r'"([^"]*)"', src[i - 1:i + 200])[:2])
    assert emitted.startswith(LOKY_RESTART_WARNING)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=LOKY_RESTART_WARNING, category=UserWarning)
        warnings.warn(emitted, UserWarning)
        warnings.warn("another warning", UserWarning)
    assert [str(w.message) for w in seen] == ["another warning"]


def test_torch_threads_holds_for_a_run_while_another_thread_finishes():
    """CI caught an in-process dask run whose rows differed from a local run: the first run to finish restored
    torch's process-wide thread count under the one still training. The count must hold until the last run ends."""
    import threading

    import torch

    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    entered, leave_b = threading.Event(), threading.Event()
    seen = {}

    def run_a():
        with sweep.torch_threads(other):
            entered.set()
            leave_b.wait(10)
            seen["a_after_b_left"] = torch.get_num_threads()

    def run_b():
        entered.wait(10)
        with sweep.torch_threads(other):
            seen["b_inside"] = torch.get_num_threads()
        leave_b.set()

    ta, tb = threading.Thread(target=run_a), threading.Thread(target=run_b)
    ta.start(), tb.start()
    ta.join(20), tb.join(20)
    assert seen == {"b_inside": other, "a_after_b_left": other}
    assert torch.get_num_threads() == before  # restored once the last run left


def test_torch_threads_refuses_a_different_count_while_runs_execute():
    with sweep.torch_threads(1):
        with pytest.raises(RuntimeError, match="threads=2 requested while runs with threads=1"):
            with sweep.torch_threads(2):
                pass


def _package_copy(tmp_path, monkeypatch):
    import shutil

    from bnstudy.study import sweep
    dst = tmp_path / "bnstudy"
    shutil.copytree(sweep._PACKAGE_DIR, dst, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sweep, "_PACKAGE_DIR", dst)
    monkeypatch.setattr(sweep, "_STUDY_DIR", dst / "study")
    return dst / "study"  # the study machinery's folder, where the edits below land


def _edit(path, old, new):
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_a_chapters_analysis_edit_leaves_its_runs_keys_and_an_engine_edit_does_not(tmp_path, monkeypatch):
    """Issue 23/24: the run cache key of a namespace covers only the code its runs reach. An edit to a chapter
    folder's findings or figures (what it claims and draws), or a presentation module, keeps every key and the
    code fingerprint; an edit to a function the runs call in the folder's run.py, or to the engine, changes them."""
    from bnstudy.study.engine import _stage2_group, source_version
    from bnstudy.study.experiments.heads import run as heads
    from bnstudy.study.experiments.real_data import run as real_data
    from bnstudy.study.experiments.shift_strength import run as shift_strength
    from bnstudy.study.sweep import code_version
    pkg = _package_copy(tmp_path, monkeypatch)
    roots = {"heads": (heads._feature_group, heads.FeatureConfig), "real_data": (real_data.run_group,),
             "stage2": (_stage2_group,), "mismatch": (shift_strength._mismatch_group,)}
    before = {k: code_version(*r) for k, r in roots.items()}
    src0, fingerprint0 = source_version(), code_version()
    # analysis, wording and figures: findings, a verdict sentence, a figure, the presentation modules
    _edit(pkg / "experiments" / "heads" / "findings.py", "def findings(",
          "def _unused_helper():\n    return 'x'\n\n\ndef findings(")
    _edit(pkg / "experiments" / "real_data" / "findings.py", "def findings(",
          "def findings_wording():\n    return 'a verdict'\n\n\ndef findings(")
    _edit(pkg / "experiments" / "shift_strength" / "figures.py", "import", "# a figure edit\nimport")
    _edit(pkg / "plots.py", "import", "# a figure edit\nimport")
    _edit(pkg / "report.py", "import", "# a wording edit\nimport")
    # the lean shape's page side (issue 33): claims engine, words, glue
    _edit(pkg / "inference.py", "def ask(", "def _another_question():\n    return 1\n\n\ndef ask(")
    _edit(pkg / "words.py", "def claim_text(", "def _another_shape():\n    return 'x'\n\n\ndef claim_text(")
    _edit(pkg / "pages.py", "def glue_chapter(", "def _another_glue():\n    return 1\n\n\ndef glue_chapter(")
    _edit(pkg / "experiments" / "unknown_task" / "findings.py", "QUESTIONS = (", "EXTRA = ()\nQUESTIONS = (")
    assert {k: code_version(*r) for k, r in roots.items()} == before
    assert source_version() == src0 and code_version() == fingerprint0
    # a function chapter 4's feature runs call: only chapter 4's features change
    _edit(pkg / "experiments" / "heads" / "run.py", "def _ridge_probe(", "def _ridge_probe(*_args_changed, ")
    after = {k: code_version(*r) for k, r in roots.items()}
    assert after["heads"] != before["heads"] and code_version() != fingerprint0
    assert {k: v for k, v in after.items() if k != "heads"} == {k: v for k, v in before.items() if k != "heads"}
    # the engine: every namespace that trains through it, stage 1 included
    _edit(pkg / "engine.py", "def train_source(", "def _engine_edit():\n    return 1\n\n\ndef train_source(")
    again = {k: code_version(*r) for k, r in roots.items()}
    assert all(again[k] != after[k] for k in ("heads", "stage2", "mismatch")) and source_version() != src0


def test_chapter_folder_findings_and_figures_are_outside_the_code_fingerprint_and_run_is_inside():
    from bnstudy.study.sweep import _STUDY_DIR, _is_chapter_module, _is_presentation
    _EXPERIMENTS_DIR = _STUDY_DIR / "experiments"
    folder = _EXPERIMENTS_DIR / "some_chapter"
    assert _is_presentation(folder / "findings.py") and _is_presentation(folder / "figures.py")
    assert not _is_presentation(folder / "run.py") and not _is_presentation(_EXPERIMENTS_DIR / "heads.py")
    assert _is_presentation(_STUDY_DIR / "plots.py") and not _is_presentation(_STUDY_DIR / "engine.py")
    # a run module of a folder is hashed by what its runs reach, like a single chapter module
    assert _is_chapter_module(folder / "run.py") and _is_chapter_module(_EXPERIMENTS_DIR / "heads.py")
    assert not _is_chapter_module(folder / "__init__.py") and not _is_chapter_module(_STUDY_DIR / "engine.py")


def test_a_writer_killed_mid_write_leaves_only_a_hidden_temporary_that_the_next_sweep_removes(tmp_path):
    """The kind behind stop 52's red CI: SIGKILL between atomic_write_bytes' write and its rename. The file left
    is hidden and never *.json; remove_orphan_temporaries deletes it once its writer is dead, and leaves a live
    writer's file and another host's file alone."""
    target = tmp_path / "ns" / "abc.json"
    code = ("import os, sys; from bnstudy.study import sweep\n"
            "sweep.os.replace = lambda *a: os.kill(os.getpid(), 9)\n"  # die exactly between write and rename
            f"sweep.atomic_write_bytes({str(target)!r}, b'{{\"row\": 1}}')\n")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == -signal.SIGKILL
    left = list(target.parent.iterdir())
    assert len(left) == 1 and left[0].name.startswith(".abc.json.") and left[0].name.endswith(".tmp")
    assert not list(target.parent.glob("*.json"))  # nothing that looks finished
    live = target.parent / f".x.json.{sweep._writer_tag()}.q1w2.tmp"  # this process: alive
    other = target.parent / f".y.json.otherhost-{left[0].name.split('-')[-1].split('.')[0]}.q1w2.tmp"
    live.write_bytes(b"")
    other.write_bytes(b"")
    assert sweep.remove_orphan_temporaries(target.parent) == [left[0]]
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([live.name, other.name])
    assert sweep.remove_orphan_temporaries(tmp_path / "absent") == []
    sweep.atomic_write_bytes(target, b"{}")  # a normal write leaves nothing else
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([live.name, other.name, "abc.json"])
