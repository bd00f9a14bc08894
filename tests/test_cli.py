"""The `bnstudy` command: chapter names, parameter checks with clear errors, the rerun's page built as the book renders it."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from bnstudy.study import book, cli, report


def usage_error(capsys, argv) -> str:
    """Run ``bnstudy argv`` in process, which must be a usage error: exit status 2 (argparse's convention; its own
    errors raise SystemExit(2), ours return 2) and one line on stderr, returned."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's own usage errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)
    return err.strip().splitlines()[-1]


def test_chapter_is_found_by_number_or_name_and_an_unknown_one_lists_the_choices(capsys, tmp_path):
    assert cli.resolve_chapter("01").stem == "01_freeze_modes"
    assert cli.resolve_chapter("1") == cli.resolve_chapter("01-freeze-modes") == cli.resolve_chapter("freeze_modes")
    with pytest.raises(cli.UsageError, match=r"unknown chapter '99'.*01 \(01_freeze_modes\)"):
        cli.resolve_chapter("99")
    assert re.search(r"^bnstudy: unknown chapter '99'.*01 \(01_freeze_modes\)",
                     usage_error(capsys, ["chapter", "99", "--out", str(tmp_path)]))


def test_unknown_or_reserved_parameters_are_errors_naming_the_allowed_ones(tmp_path, capsys):
    assert re.search(r"unknown parameter\(s\) \['sedes'\].*'seeds'",
                     usage_error(capsys, ["chapter", "01", "-p", "sedes", "20", "--out", str(tmp_path)]))
    assert "set by --out" in usage_error(capsys, ["chapter", "01", "-p", "results_dir", "x", "--out", str(tmp_path)])
    assert "not valid YAML" in usage_error(capsys, ["chapter", "03", "-y", "brightness_levels: [0, 2", "--out",
                                                    str(tmp_path)])
    # argparse: invalid choice names quick and full
    assert "'quick'" in usage_error(capsys, ["chapter", "01", "--profile", "huge", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # nothing ran


def test_every_usage_error_exits_2_and_a_failed_run_exits_1(tmp_path, capsys, monkeypatch):
    """argparse's convention, for every usage error of `bnstudy chapter` (some exited 1 through SystemExit(message):
    an unknown chapter or parameter, a bad -f/-y, a reserved parameter, the profile as a parameter), and 1 only for
    a run that failed."""
    def no_kernel(*a, **k):
        raise AssertionError("the kernel must not start for a usage error")
    monkeypatch.setattr(cli.book, "execute_chapter", no_kernel)
    out = str(tmp_path / "o")
    afile = tmp_path / "afile"
    afile.write_text("")
    notmap = tmp_path / "list.yaml"
    notmap.write_text("[1, 2]\n")
    usage = [
        ["chapter", "99", "--out", out],  # unknown chapter
        ["chapter", "01", "-p", "seedz", "4", "--out", out],  # unknown parameter
        ["chapter", "01", "-p", "results_dir", "x", "--out", out],  # set by --out
        ["chapter", "01", "-p", "profile", "full", "--out", out],  # the profile has its option
        ["chapter", "01", "-f", str(tmp_path / "nope.yaml"), "--out", out],  # unreadable file
        ["chapter", "01", "-f", str(notmap), "--out", out],  # not a mapping
        ["chapter", "01", "-y", "seeds: [0", "--out", out],  # bad YAML
        ["chapter", "01", "-y", "[0, 1]", "--out", out],  # not name: value
        ["chapter", "01", "-p", "momentum", "2", "--out", out],  # a value the chapter refuses
        ["chapter", "01", "--out", str(afile)],  # --out is a file
        ["chapter", "01", "--profile", "huge", "--out", out],  # argparse: invalid choice
        ["chapter", "01"],  # argparse: --out missing
        ["chapter", "01", "--out", out, "--bogus"],  # argparse: unknown option
    ]
    for argv in usage:
        line = usage_error(capsys, argv)
        assert line.startswith(("bnstudy: ", "bnstudy chapter: error: ")), (argv, line)
    assert not (tmp_path / "o").exists()

    def failing(*a, **k):
        raise RuntimeError("a cell raised")
    monkeypatch.setattr(cli.book, "execute_chapter", failing)
    monkeypatch.setattr(cli, "run_estimate", lambda *a, **k: ("estimate", None))
    assert cli.main(["chapter", "01", "--out", out, "--quiet"]) == 1
    assert "failed: RuntimeError: a cell raised" in capsys.readouterr().err


def test_the_command_exits_2_for_a_usage_error_as_a_process(tmp_path):
    """Through ``python -m bnstudy.study.cli`` (the ``bnstudy`` script's code path): the status the shell sees."""
    for argv, words in ((["chapter", "99", "--out", str(tmp_path)], "bnstudy: unknown chapter '99'"),
                        (["chapter", "01", "--profile", "huge", "--out", str(tmp_path)], "invalid choice")):
        repo = str(Path(cli.__file__).resolve().parents[2])
        proc = subprocess.run([sys.executable, "-m", "bnstudy.study.cli", *argv], capture_output=True, text=True,
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": repo}, timeout=300)
        assert proc.returncode == 2 and words in proc.stderr, (proc.returncode, proc.stderr)


def test_parameters_are_typed_as_papermill_types_them():
    assert [cli.parse_value(v) for v in ("20", "2.5", "True", "None", "abc")] == [20, 2.5, True, None, "abc"]


def test_list_names_every_chapter_and_its_parameters(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "01_freeze_modes" in out and "seeds = None" in out and "results_dir" not in out


def test_run_line_names_the_git_commit_device_and_threads_and_is_wrapped():
    line = report.run_line("quick", 3, steps=800)
    commit = report.git_commit()
    assert commit in line and "threads" in line and "device cpu" in line.replace("\n  ", " ")
    assert all(len(ln) <= 78 for ln in line.splitlines())
    assert commit == "unknown" or len(commit.split("+")[0]) == 10


# --- parameters checked before the kernel starts ----------------------------------------------------------------

@pytest.mark.parametrize("nb_path", book.chapter_paths(), ids=lambda p: p.stem)
@pytest.mark.parametrize("profile", book.PROFILES)
def test_every_chapter_notebook_parameter_is_one_its_make_config_accepts(nb_path, profile):
    # the in-process check passes exactly the notebook's parameters to make_config, as the notebook does
    assert cli.experiment_module(nb_path) is not None
    cli.check_parameters(nb_path, profile, book.notebook_parameters(nb_path), {})


@pytest.mark.parametrize("nb_path", book.chapter_paths(), ids=lambda p: p.stem)
def test_a_parameter_comment_that_lists_choices_lists_exactly_what_the_chapter_accepts(nb_path):
    """New-user report (stop 53): chapter 1's ``head`` comment said ``linear | mlp | mlp_bn`` while eight heads were
    accepted. For every string parameter whose comment lists choices (``a | b | c``, each choice its first word),
    the set equals the one a bad value's refusal names (``choose one of [...]``), or a single choice the refusal
    quotes."""
    nb = nbformat.read(nb_path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))
    module = cli.experiment_module(nb_path)
    checked = 0
    for line in cell.source.splitlines():
        m = re.match(r'^(\w+) = "[^"]*"\s*#.*?([\w.]+(?: \([^)]*\))?(?: \| [\w.]+(?: \([^)]*\))?)+)', line)
        if not m:
            continue
        listed = {part.split()[0] for part in m.group(2).split(" | ")}
        with pytest.raises(ValueError) as e:
            module.make_config("quick", **{m.group(1): "__not_a_choice__"})
        allowed = re.search(r"one of \[([^\]]*)\]", str(e.value))
        allowed = {a.strip(" '") for a in allowed.group(1).split(",")} if allowed else None
        assert allowed == listed, (m.group(1), listed, str(e.value))
        checked += 1
    if nb_path.stem == "01_freeze_modes":
        assert checked == 1  # optimizer (head is 'linear' only: its comment says so in words)


def test_a_bad_parameter_fails_in_process_with_the_notebooks_message_and_runs_nothing(tmp_path, capsys,
                                                                                      monkeypatch):
    def no_kernel(*args, **kwargs):  # a bad value must fail before any kernel starts
        raise AssertionError("execute_chapter was called for a bad parameter")

    monkeypatch.setattr(cli.book, "execute_chapter", no_kernel)
    assert cli.main(["chapter", "01", "-p", "momentum", "2", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bnstudy: momentum") and "2" in err
    with pytest.raises(ValueError) as e:  # the same message the notebook's make_config call raises
        cli.experiment_module(book.chapter_paths()[0]).make_config("quick", momentum=2)
    assert str(e.value) in err
    assert cli.main(["chapter", "05", "-y", "batch_sizes: [3, 8]", "--out", str(tmp_path / "out")]) == 2
    assert "batch_sizes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- Ctrl-C and SIGTERM stop the kernel and its workers ---------------------------------------------------------

TOY_PARAMETERS = 'seconds = 60\npid_file = "pids.txt"\nresults_dir = "r"\nfigures_dir = "f"\nprofile = "quick"'
TOY_CELL = '''import os, time
from joblib import Parallel, delayed
def work(s):
    with open(pid_file, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(s)
with open(pid_file, "a") as f:
    f.write(f"{os.getpid()}\\n")
Parallel(n_jobs=2, backend="loky")(delayed(work)(seconds) for _ in range(2))'''
# `bnstudy chapter 01` on the toy notebook: the console script's call, with the chapter table pointed at the toy
TOY_MAIN = "import sys; from pathlib import Path; from bnstudy.study import cli; " \
           "toy = Path(sys.argv.pop(1)); cli.chapters = lambda: {'01': toy}; sys.exit(cli.main())"


@pytest.mark.parametrize("signame", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_a_signal_stops_the_kernel_and_its_workers_and_leaves_no_page(tmp_path, signame):
    """A kernel whose cell waits on two loky workers; the signal goes to the command's process group, as a
    terminal's Ctrl-C does. Nothing the command started may survive it."""
    psutil = pytest.importorskip("psutil")
    toy = tmp_path / "01_toy.ipynb"
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    params = nbformat.v4.new_code_cell(TOY_PARAMETERS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(TOY_CELL)]
    nbformat.write(nb, toy)
    pids, out = tmp_path / "pids.txt", tmp_path / "out"
    (out / ".partial").mkdir(parents=True)
    (out / ".partial" / "01_toy.stale.ipynb").write_text("{}")  # what a SIGKILLed run leaves
    (out / "01-toy.html").write_text("the previous run's page")
    proc = subprocess.Popen([sys.executable, "-c", TOY_MAIN, str(toy), "chapter", "01", "--out", str(out),
                             "-p", "pid_file", str(pids), "--no-html", "--quiet"],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (pids.exists() and len(pids.read_text().split()) >= 3):
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        assert pids.exists() and len(pids.read_text().split()) >= 3, "the toy's workers never started"
        started = psutil.Process(proc.pid).children(recursive=True)  # kernel, workers, resource trackers
        assert len(started) >= 3
        t0 = time.time()
        os.killpg(proc.pid, getattr(signal, signame))
        output = proc.communicate(timeout=30)[0]
        stopped_s = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + getattr(signal, signame), output
    assert stopped_s < 15, stopped_s
    assert "interrupted" in output and "rerun" in output
    time.sleep(0.5)
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in left:
        p.kill()
    assert not left, [" ".join(p.cmdline()) for p in left]
    assert not (out / ".partial").exists() and not (out / "01-toy.ipynb").exists()
    assert not (out / "01-toy.html").exists()  # no page that could pass for this run's


# --- newuser3 P4/P6/P7: one-line errors naming the option and what to pass ------------------------------------


def test_bad_parameters_file_or_out_file_is_a_one_line_error_naming_the_option(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    line = usage_error(capsys, ["chapter", "01", "-f", str(missing), "--out", str(tmp_path / "o")])
    assert re.match(r"^bnstudy: -f .*nope\.yaml: cannot read the file", line)
    bad = tmp_path / "bad.yaml"
    bad.write_text("seeds: [0, 1\n")
    line = usage_error(capsys, ["chapter", "01", "-f", str(bad), "--out", str(tmp_path / "o")])
    assert re.match(r"^bnstudy: -f .*bad\.yaml: not valid YAML", line)
    afile = tmp_path / "afile"
    afile.write_text("")
    assert cli.main(["chapter", "01", "--out", str(afile)]) == 2
    assert "--out" in capsys.readouterr().err and afile.read_text() == ""
    assert not (tmp_path / "o").exists()


def test_unknown_parameter_list_leaves_out_profile_which_has_its_own_option(tmp_path, capsys):
    allowed = usage_error(capsys, ["chapter", "01", "-p", "seed", "2", "--out", str(tmp_path)]).split("allowed:")[1]
    assert "'profile'" not in allowed and "--profile" in allowed and "'seeds'" in allowed


def test_steps_without_checkpoints_says_which_checkpoints_to_pass_and_that_value_works(tmp_path, capsys):
    assert cli.main(["chapter", "01", "-p", "steps", "200", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert 'checkpoints must be a list that includes steps=200' in err and '-y "checkpoints: [100, 200]"' in err
    module = cli.experiment_module(book.chapter_paths()[0])
    module.make_config("quick", steps=200, checkpoints=[100, 200])  # the suggested fix is accepted
    with pytest.raises(ValueError, match=r"-y \"checkpoints: \[400, 800, 1000\]\""):
        module.make_config("quick", steps=1000)


# --- newuser6: bad -y YAML, a --cache-dir that is a file, a rows table that is missing: all before the kernel ----


def test_bad_yaml_cache_dir_file_and_missing_rows_fail_before_the_kernel_naming_the_option(tmp_path, capsys,
                                                                                            monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("the kernel must not start for a bad value")
    monkeypatch.setattr(cli.book, "execute_chapter", no_kernel)
    assert re.match(r"^bnstudy: -y 'seeds: \[0' is not valid YAML",
                    usage_error(capsys, ["chapter", "02", "-y", "seeds: [0", "--out", str(tmp_path / "o")]))
    afile = tmp_path / "afile"
    afile.write_text("")
    assert cli.main(["chapter", "02", "--cache-dir", str(afile), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "cache_dir (--cache-dir)" in err and "not a directory" in err and afile.read_text() == ""
    for ch, name in (("02", "02_eval_traps.csv"), ("03", "03_shift_strength.csv"), ("05", "05_batch_size.csv"),
                     ("06", "06_unknown_task.csv"), ("07", "07_real_data.csv")):
        assert cli.main(["chapter", ch, "-p", "rows", str(tmp_path / name), "--out", str(tmp_path / "o")]) == 2
        assert "rows: no results table at" in capsys.readouterr().err
    unrecorded = tmp_path / "03_shift_strength.csv"
    unrecorded.write_text("seed\n0\n")  # a CSV no run saved: it has no sidecar
    assert cli.main(["chapter", "03", "-p", "rows", str(unrecorded), "--out", str(tmp_path / "o")]) == 2
    assert "has no sidecar" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# --- newuser-s7: rows whose run differs, or whose sibling table is missing, fail before the kernel --------------


def _fake_ch04_rows(folder, **given):
    """A chapter-4 main table and its sibling tables with sidecars recording ``given`` (the bnstudy command's
    record: the parameters as given, ``None`` for the profile's)."""
    from bnstudy.study.experiments.heads import run as heads
    folder.mkdir()
    params = {"chapter": "04_heads", "profile": "quick", **{k: None for k in ("seeds", "steps", "heads",
              "tuning_seeds", "steps_check", "steps_check_seeds")}, "optimizers": ["sgd", "sgd_plain", "adam"],
              "mid_strength": 0.25, "margin": 0.02, **given}
    cfg = heads.make_config("quick", **{k: v for k, v in params.items() if k not in ("chapter", "profile")})
    params = {**{k: report._jsonable(v) for k, v in cfg.asdict().items()}, **params}  # resolved fields too
    main = folder / "04_heads.csv"
    for p in [main] + [folder / f"04_heads_{s}.csv" for s in heads.SIBLING_TABLES]:
        p.write_text("seed,task_b\n0,0.5\n")
        report.write_sidecar(p, parameters=params)
    return main


def test_rows_of_another_run_or_without_a_sibling_fail_before_the_kernel(tmp_path, capsys, monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("the kernel must not start for rows that cannot be analysed")
    monkeypatch.setattr(cli.book, "execute_chapter", no_kernel)
    main = _fake_ch04_rows(tmp_path / "run", steps=40, steps_check=60)
    tiny = ["-p", "steps", "40", "-p", "steps_check", "60"]
    # a run parameter that differs: refused here, naming it and both values
    assert cli.main(["chapter", "04", "-p", "rows", str(main), "-p", "steps", "50", "-p", "steps_check", "60",
                     "--out", str(tmp_path / "o")]) == 2
    assert "parameter 'steps' is 50 here but was 40" in capsys.readouterr().err
    # an analysis parameter may differ: the check passes (the notebook would run)
    nb = book.chapter_paths()[3]
    cli.check_parameters(nb, "quick", book.notebook_parameters(nb),
                         {"rows": str(main), "steps": 40, "steps_check": 60, "margin": 0.05})
    # a sibling table missing: refused here, naming it and the table given
    (tmp_path / "run" / "04_heads_steps.csv").unlink()
    assert cli.main(["chapter", "04", "-p", "rows", str(main), *tiny, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "04_heads_steps.csv" in err and "04_heads.csv" in err and "beside it" in err
    assert not (tmp_path / "o").exists()


def _fake_ch01_rows(folder, **given):
    """A chapter-1 main table and its sibling tables with sidecars recording ``given`` as the bnstudy command
    records a run (the parameters as given, ``None`` for the profile's; the resolved fields beside them)."""
    from bnstudy.study.experiments.freeze_modes import run as freeze_modes
    folder.mkdir()
    nb = book.chapter_paths()[0]
    params = {"chapter": "01_freeze_modes", **book.notebook_parameters(nb), "profile": "quick", **given}
    cfg = freeze_modes.make_config("quick", **{k: v for k, v in params.items() if k not in cli.EXECUTION_PARAMETERS
                                               and k != "chapter"})
    params = {**{k: report._jsonable(v) for k, v in cfg.asdict().items()}, **params}
    main = folder / "01_freeze_modes.csv"
    for p in [main] + [folder / f"01_freeze_modes_{s}.csv" for s in freeze_modes.SIBLING_TABLES]:
        p.write_text("seed,task_b\n0,0.5\n")
        report.write_sidecar(p, parameters=params)
    return main


def test_chapter_one_takes_rows_and_checks_its_run_and_siblings_before_the_kernel(tmp_path, capsys, monkeypatch):
    """``bnstudy chapter 01 -p rows results/01_freeze_modes.csv``: the notebook gets the file when the run's
    parameters and sibling tables check out; a parameter that differs or a missing sibling stops it here."""
    main = _fake_ch01_rows(tmp_path / "results")  # a run with the page's defaults
    seen = {}

    def fake_execute(nb_path, out, profile, parameters=None, **k):
        seen.update(parameters)
        return out / "01-freeze-modes.ipynb"
    monkeypatch.setattr(cli.book, "execute_chapter", fake_execute)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["chapter", "01", "-p", "rows", "results/01_freeze_modes.csv", "--no-html", "--out", "o"]) == 0
    assert seen["rows"] == str(main.resolve())

    def no_kernel(*a, **k):
        raise AssertionError("the kernel must not start for rows that cannot be analysed")
    monkeypatch.setattr(cli.book, "execute_chapter", no_kernel)
    assert cli.main(["chapter", "01", "-p", "rows", str(main), "-p", "steps", "400", "--out", "o2"]) == 2
    assert "parameter 'steps' is 400 here but was 800" in capsys.readouterr().err
    (tmp_path / "results" / "01_freeze_modes_head_sweep.csv").unlink()
    assert cli.main(["chapter", "01", "-p", "rows", str(main), "--out", "o2"]) == 2
    err = capsys.readouterr().err
    assert "01_freeze_modes_head_sweep.csv" in err and "beside it" in err
    assert not (tmp_path / "o2").exists()


def _fake_rows(folder, number, **given):
    """Chapter ``number``'s main table and its sibling tables with sidecars recording its notebook's defaults and
    ``given`` as the book runner does (the parameters as given, ``None`` for the profile's, the config's resolved
    fields beside them)."""
    from bnstudy.study.cli import EXECUTION_PARAMETERS
    nb = cli.resolve_chapter(number)
    module = cli.experiment_module(nb)
    defaults = {k: v for k, v in book.notebook_parameters(nb).items() if k not in EXECUTION_PARAMETERS}
    params = {"chapter": nb.stem, "profile": "quick", **defaults, **given}
    cfg = module.make_config("quick", **{k: v for k, v in params.items() if k not in ("chapter", "profile")})
    params = {**{k: report._jsonable(v) for k, v in cfg.asdict().items()}, **params}
    folder.mkdir()
    main = folder / f"{nb.stem}.csv"
    own = module.sibling_parameters(cfg) if hasattr(module, "sibling_parameters") else {}
    for s in ("",) + tuple(f"_{s}" for s in module.SIBLING_TABLES):
        p = folder / f"{nb.stem}{s}.csv"
        p.write_text("seed,task_b\n0,0.5\n")
        # a sibling with its own configuration records it as the page writes it (chapter 6's temperature check)
        report.write_sidecar(p, parameters={**params, **{k: report._jsonable(v) for k, v in own[s[1:]][1].items()}}
                             if s[1:] in own else params)
    return main


def test_chapter_two_rows_are_checked_with_their_siblings_before_the_kernel(tmp_path, capsys, monkeypatch):
    def no_kernel(*a, **k):
        raise AssertionError("the kernel must not start for rows that cannot be analysed")
    monkeypatch.setattr(cli.book, "execute_chapter", no_kernel)
    main = _fake_rows(tmp_path / "run", "02", steps=6)
    nb = cli.resolve_chapter("02")
    cli.check_parameters(nb, "quick", book.notebook_parameters(nb), {"rows": str(main), "steps": 6})  # passes
    assert cli.main(["chapter", "02", "-p", "rows", str(main), "--out", str(tmp_path / "o")]) == 2  # steps 60 here
    assert "parameter 'steps' is 60 here but was 6" in capsys.readouterr().err
    (tmp_path / "run" / "02_eval_traps_audits.csv").unlink()
    assert cli.main(["chapter", "02", "-p", "rows", str(main), "-p", "steps", "6", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "02_eval_traps_audits.csv" in err and "beside it" in err
    assert not (tmp_path / "o").exists()


def test_chapter_six_checks_its_temperature_table_against_the_checks_own_configuration(tmp_path, capsys,
                                                                                       monkeypatch):
    """The temperature check runs held-out seeds: its sidecar records them, not the page's, and the command checks
    it against the check's configuration (unknown_task.run.sibling_parameters) before the kernel starts."""
    import json

    def no_kernel(*a, **k):
        raise AssertionError("the kernel must not start for rows that cannot be analysed")
    monkeypatch.setattr(cli.book, "execute_chapter", no_kernel)
    main = _fake_rows(tmp_path / "run", "06", steps=5)
    temp = tmp_path / "run" / "06_unknown_task_temperature.csv"
    assert json.loads(report.sidecar_path(temp).read_text())["parameters"]["seeds"] == [10, 11]
    nb = cli.resolve_chapter("06")
    cli.check_parameters(nb, "quick", book.notebook_parameters(nb), {"rows": str(main), "steps": 5})  # passes
    side = json.loads(report.sidecar_path(temp).read_text())
    side["parameters"]["steps"] = 50  # a temperature check from another run
    report.sidecar_path(temp).write_text(json.dumps(side))
    assert cli.main(["chapter", "06", "-p", "rows", str(main), "-p", "steps", "5", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "parameter 'steps' is 5 here but was 50" in err and "06_unknown_task_temperature.csv" in err
    temp.unlink()
    assert cli.main(["chapter", "06", "-p", "rows", str(main), "-p", "steps", "5", "--out", str(tmp_path / "o")]) == 2
    assert "06_unknown_task_temperature.csv" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_a_relative_rows_path_reaches_the_notebook_as_the_file_the_check_found(tmp_path, monkeypatch):
    main = _fake_ch04_rows(tmp_path / "run", steps=40, steps_check=60)
    seen = {}

    def fake_execute(nb_path, out, profile, parameters=None, **k):  # the kernel runs in chapters/, not here
        seen.update(parameters)
        return out / "04-heads.ipynb"
    monkeypatch.setattr(cli.book, "execute_chapter", fake_execute)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["chapter", "04", "-p", "rows", "run/04_heads.csv", "-p", "steps", "40", "-p", "steps_check",
                     "60", "--no-html", "--out", "o"]) == 0
    assert seen["rows"] == str(main.resolve())


# --- issue 37: a misspelt parameter is refused, whichever way the chapter runs ----------------------------------


def test_a_misspelt_parameter_is_refused_by_the_command_with_the_close_match_and_the_allowed_names(tmp_path,
                                                                                                  capsys):
    line = usage_error(capsys, ["chapter", "01", "-p", "seedz", "4", "--out", str(tmp_path / "o")])
    assert "['seedz']" in line and "did you mean 'seeds'?" in line
    assert "'tuning_seeds'" in line.split("allowed:")[1]
    assert not (tmp_path / "o").exists()


def _injected_history(nb_path, parameters):
    """The cell sources a kernel has run when it reaches the first code cell after papermill's injected
    parameters (IPython's ``In``: an empty first entry, the running cell last), for ``parameters``."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook
    nb = parameterize_notebook(load_notebook_node(str(nb_path)), parameters, kernel_name="python3",
                               language="python")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "injected-parameters" in code[1].metadata.tags
    return [""] + [c.source for c in code[:3]]


@pytest.mark.parametrize("nb_path", book.chapter_paths(), ids=lambda p: p.stem)
def test_every_chapters_first_cell_refuses_a_parameter_papermill_injects_but_the_notebook_lacks(nb_path):
    """papermill -p seedz 4 only warns; the notebook's first code cell after the injected one refuses it."""
    history = _injected_history(nb_path, {"seedz": 4})
    assert "check_injected_parameters()" in history[-1]  # the first code cell after the injected one calls it
    with pytest.raises(ValueError, match=r"\['seedz'\].*did you mean 'seeds'\?.*allowed: \[.*'seeds'"):
        book.check_injected_parameters(history)
    book.check_injected_parameters(_injected_history(nb_path, {"seeds": 4}))  # a known name passes
    book.check_injected_parameters(history[:2] + history[3:])  # no injected cell (run as it is): nothing to check


def test_papermill_run_of_a_notebook_with_the_check_stops_at_a_misspelt_parameter(tmp_path):
    """The check reads the kernel's own history (IPython's ``In``): a real papermill run fails in that cell."""
    import papermill as pm
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    params = nbformat.v4.new_code_cell("seeds = None\nsteps = 800")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("from bnstudy.study.book import check_injected_parameters\n"
                                                  "check_injected_parameters()")]
    nbformat.write(nb, tmp_path / "toy.ipynb")
    with pytest.raises(pm.PapermillExecutionError, match=r"did you mean 'steps'\?"):
        pm.execute_notebook(str(tmp_path / "toy.ipynb"), str(tmp_path / "bad.ipynb"), parameters={"stpes": 5},
                            cwd=str(tmp_path), progress_bar=False)
    # (a known name passes: test_every_chapters_first_cell_refuses_..., on the same history without a kernel)


# --- issue 37: a rerun makes a page rendered like the published one ---------------------------------------------


def test_a_rerun_page_is_the_published_rendering_with_its_run_line(quick_page, tmp_path, monkeypatch, capsys):
    """`bnstudy chapter 01 --out DIR` builds a one-chapter book with the book's settings: the answer box is an
    admonition (not its MyST source), glued values, figures and citations are rendered, and the methods carry the
    *Ran with* line with its commit. The session's quick execution of chapter 1 stands in for the kernel's run."""
    import shutil
    from pathlib import Path

    from bs4 import BeautifulSoup
    root = quick_page("01_freeze_modes")

    def session_run(nb_path, out, profile, parameters=None, **k):
        for folder in ("results", "figures"):
            (out / folder).mkdir(parents=True, exist_ok=True)
            for f in (root / folder).glob("01[-_]*"):
                shutil.copy(f, out / folder)
        return Path(shutil.copy(root / "chapters" / "01-freeze-modes.ipynb", out))
    monkeypatch.setattr(cli.book, "execute_chapter", session_run)
    out = tmp_path / "r01"
    assert cli.main(["chapter", "01", "--out", str(out), "--quiet"]) == 0
    page = out / "book" / "_build" / "html" / "chapters" / "01-freeze-modes.html"
    assert str(page) in capsys.readouterr().out
    soup = BeautifulSoup(page.read_text(), "html.parser")
    text = soup.get_text(" ")
    for raw in ("{admonition}", ":class:", "{glue", "{numref}", "{cite}", "[ioffe2015batch]"):
        assert raw not in text, raw
    assert soup.select(".admonition.answer") and "Fig. 1.1" in text and "Ioffe" in text
    line = " ".join(text[text.index("Ran with"):].split()[:400])
    assert "profile=quick" in line and "git commit" in line
    for img in soup.find_all("img"):  # every figure is in the build, none inlined from elsewhere
        assert (page.parent / img["src"]).resolve().is_file(), img["src"]
    assert "book/_build/html/chapters/01-freeze-modes.html" in (out / "01-freeze-modes.html").read_text()


@pytest.mark.parametrize("argv", [["-m", "bnstudy.study.cli", "list"],
                                  ["-m", "bnstudy.study.cli", "chapter", "01", "--out", "OUT"],
                                  ["-m", "bnstudy.study.cli", "figure", "--list"],
                                  ["-m", "bnstudy.study.cli", "figure", "4.2"],
                                  ["-m", "bnstudy.study.figure", "4.2"]])
def test_a_command_run_from_an_installed_wheel_says_so_in_one_line_without_a_traceback(tmp_path, argv):
    """The package without the checkout around it (what an unzipped wheel holds: no chapters/, book/, release/):
    every command that needs the book's files exits 2 with one line naming the checkout (it printed a traceback)."""
    import shutil
    shutil.copytree(Path(cli.__file__).resolve().parents[1], tmp_path / "pkg" / "bnstudy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "pkg"))
    r = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no chapter notebooks" in r.stderr and "checkout of the repository" in r.stderr
    assert not (tmp_path / "out").exists()
