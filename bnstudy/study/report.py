"""Helpers the chapters use to put measured numbers into prose and tables, and to record provenance.

Values are glued as plain Python numbers (a NumPy scalar's text form,
``np.float64(0.5)``, would break ``{glue:text}`key:.3f```), and sentences whose
wording depends on the data are glued as Markdown for ``{glue:md}``.

Provenance: :func:`run_line` prints what a chapter ran with (profile, seeds,
parameters, the git commit of the code, device, torch and its thread count), and
:func:`save_table` writes, next to every CSV, a JSON sidecar with the same facts
plus the chapter's full parameters (from ``$BNSTUDY_RUN_PARAMETERS``, set by the
book runner and the ``bnstudy`` command, else from the last :func:`run_line`).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import platform
import subprocess
import textwrap
import time
import types
from functools import lru_cache
from pathlib import Path

import pandas as pd
import torch

from .sweep import atomic_write_bytes

_REPO = Path(__file__).resolve().parents[2]
# What the last run_line() call said, and the tables saved in this process (their sidecars are rewritten
# when run_line comes after save_table, as it does in the chapters).
_RUN: dict = {}
_SAVED: list[Path] = []


@lru_cache(maxsize=None)
def git_commit(repo=None) -> str:
    """The code's git commit: a short hash, ``"+dirty"`` appended when tracked files of the code that computes rows
    or pages (``bnstudy/``, ``chapters/``, ``pyproject.toml``: what :func:`bnstudy.study.release.git_state` checks) have
    uncommitted changes. Files a run itself rewrites (``release/`` while ``make release`` computes several
    chapters, ``CITATION.cff``) do not make it dirty: they are outputs, not the code.

    ``"unknown"`` outside a git checkout (an installed package) or without ``git``.
    """
    repo = str(repo or _REPO)
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short=10", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no", "--", "bnstudy",
                                "chapters", "pyproject.toml"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def package_version() -> str:
    """The installed ``bnstudy`` version."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("bnstudy")
    except PackageNotFoundError:
        return "unknown"


def environment() -> dict:
    """Where the code ran: package version, git commit, device, torch and its thread count, Python, and the numeric
    environment's id (:func:`bnstudy.study.numerics.key`: pinned or native kernels, capability, CPU vendor, versions)."""
    from . import numerics
    cuda = torch.cuda.is_available()
    return dict(bnstudy=package_version(), git_commit=git_commit(), numerics=numerics.key(),
                device=f"cuda ({torch.cuda.get_device_name(0)})" if cuda else "cpu",
                torch=torch.__version__, torch_threads=torch.get_num_threads(),
                python=platform.python_version())


def run_line(profile: str, n_seeds: int, width: int = 78, **params) -> str:
    """A short, human-readable record of what a chapter ran with, wrapped to ``width`` characters.

    Names the profile, seeds, the chapter's parameters, the git commit of the code (``+dirty`` with
    uncommitted changes), the device, and torch with its thread count. Wrapped so that the whole line is
    visible on a page without scrolling. Also remembered for the tables' JSON sidecars.
    """
    extra = ", ".join(f"{k}={v}" for k, v in params.items())
    return describe_run(f"profile={profile}, {n_seeds} seeds, {extra}",
                        dict(profile=profile, n_seeds=int(n_seeds), **params), width)


def describe_run(description: str, parameters: dict, width: int = 78, run_threads: int | None = None) -> str:
    """``"Ran with <description>; bnstudy ... at git commit ...; device ..., torch ..."``, wrapped to ``width``.

    ``parameters`` are remembered for the JSON sidecars of the tables this process saves (those saved
    earlier are rewritten). ``run_threads``: torch threads each run used, if fixed by the sweep.
    """
    env = environment()
    threads = (f"{run_threads} thread{'s' if run_threads != 1 else ''} per run" if run_threads
               else f"{env['torch_threads']} threads")
    text = (f"Ran with {description}; bnstudy {env['bnstudy']} at git commit {env['git_commit']}; device "
            f"{env['device']}, torch {env['torch']} with {threads}, Python {env['python']}.")
    kept = {k: _RUN[k] for k in ("run_wall_s",) if k in _RUN}  # record_run_time may come before run_line
    _RUN.clear()
    _RUN.update(kept)
    _RUN.update(parameters)
    if run_threads:  # the sidecar's environment.torch_threads is this (notebook) process's, not the runs'
        _RUN["torch_threads_per_run"] = run_threads
    for p in _SAVED:  # tables saved before this call get the run's parameters too
        if p.exists():
            write_sidecar(p)
    return textwrap.fill(text, width=width, subsequent_indent="  ", break_on_hyphens=False)


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # NumPy scalars
        return v.item()
    return v if isinstance(v, (str, int, float, bool, type(None))) else str(v)


def portable_path(value: str, root) -> str:
    """An absolute path as a sidecar records it, free of the machine that wrote it: relative to the repository
    (``release/04_heads.csv``), else to the book's ``root`` (``results``), else to the home folder
    (``~/.cache/bnstudy``), else its name alone. Anything else (a relative path, a word) comes back unchanged."""
    if not isinstance(value, str) or not os.path.isabs(value):
        return value
    p = Path(value).resolve()
    for base, prefix in ((_REPO, ""), (Path(root).resolve(), ""), (Path.home().resolve(), "~/")):
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        return prefix + (rel.as_posix() or ".")
    return p.name


def portable_paths(value, root):
    """:func:`portable_path` applied to every string of ``value`` (dicts and lists walked)."""
    if isinstance(value, dict):
        return {k: portable_paths(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v, root) for v in value]
    return portable_path(value, root)


def sidecar_path(csv_path) -> Path:
    """``results/NN_name.csv`` -> ``results/NN_name.json``."""
    return Path(csv_path).with_suffix(".json")


def _read_table(path, data: bytes) -> pd.DataFrame:
    """A saved CSV (``data``: its bytes) as a table; a table saved with no columns (``to_csv`` writes an
    empty line) comes back empty instead of raising ``pandas.errors.EmptyDataError``."""
    return pd.read_csv(path) if data.strip() else pd.DataFrame()


def write_sidecar(csv_path, parameters: dict | None = None, seeds=None) -> Path:
    """Write the JSON sidecar of ``csv_path``: what the table is and what it ran with.

    Keys: ``table`` (file name), ``rows``, ``columns``, ``sha256`` of the CSV, ``seeds`` (from the
    table's ``seed`` column unless given), ``parameters`` (``parameters``, else ``$BNSTUDY_RUN_PARAMETERS``
    merged with the last :func:`run_line`, whose resolved values replace the notebook's ``None``: the seeds, steps
    and grids the rows were computed with, not "the profile's"), ``environment`` (:func:`environment`) and
    ``written`` (UTC time). Paths in ``parameters`` are recorded by :func:`portable_paths`: relative to the
    repository or the book's root (``rows: release/04_heads.csv``, ``results_dir: results``), never the writing
    machine's ``/tmp`` or home folder.
    """
    csv_path = Path(csv_path)
    data = csv_path.read_bytes()
    df = _read_table(csv_path, data)
    if parameters is None:  # the notebook's values, a None among them (the profile's) as the run resolved it
        parameters = json.loads(os.environ.get("BNSTUDY_RUN_PARAMETERS") or "{}")
        parameters = {**parameters, **{k: v for k, v in _RUN.items() if parameters.get(k) is None}}
    if seeds is None and "seed" in df.columns:
        seeds = sorted(int(s) for s in df["seed"].dropna().unique())
    root = csv_path.resolve().parent.parent  # the book's root: results/ and figures/ are in it
    meta = dict(table=csv_path.name, rows=len(df), columns=list(df.columns),
                sha256=hashlib.sha256(data).hexdigest(), seeds=seeds,
                parameters=portable_paths(_jsonable(parameters), root),
                environment=environment(),
                written=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    out = sidecar_path(csv_path)
    atomic_write_bytes(out, (json.dumps(meta, indent=2) + "\n").encode())
    return out


# The last table written in this process: figures saved after it are taken to be drawn from it
# (bnstudy.study.plots.save_figure records it unless given data=...).
last_table: Path | None = None


def save_table(df: pd.DataFrame, path) -> Path:
    """Write the tidy table ``df`` as CSV atomically (a complete file or none), and its sidecar.

    Raises ``ValueError`` naming the columns if any holds lists, tuples or dicts: a CSV cannot
    hold them faithfully, so turn them into a long table first instead of losing them. The sidecar
    ``NN_name.json`` (see :func:`write_sidecar`) records the run's parameters, seeds, package
    version and git commit.
    """
    global last_table
    nested = [c for c in df.columns if df[c].map(lambda v: isinstance(v, (list, tuple, dict))).any()]
    if nested:
        raise ValueError(f"save_table: columns {nested} hold lists or dicts; save them as a tidy long table "
                         f"(one value per row) instead")
    path = Path(path)
    atomic_write_bytes(path, df.to_csv(index=False).encode())
    write_sidecar(path)
    if path.resolve() not in [p.resolve() for p in _SAVED]:
        _SAVED.append(path)
    last_table = path
    return path


def load_rows(path, parameters: dict, resolved: dict | None = None, defaults: dict | None = None,
              chapter: str | None = None) -> tuple[pd.DataFrame, dict]:
    """The result rows of an earlier run of a chapter, to analyse again without recomputing them.

    A chapter's notebook can take its rows from a results CSV that an earlier execution saved (with
    :func:`save_table`) instead of running the experiment: a referee's or reader's change to the analysis
    then costs seconds, not the run. The rows are the earlier run's, so the page must say where they came
    from: the returned provenance names the run's git commit, when its table was written and, when the
    run recorded it, its wall time.

    ``path``: the run's main results CSV (for example ``results/07_real_data.csv``); its JSON sidecar
    (:func:`write_sidecar`) must sit beside it. ``parameters``: the values that decide the rows (a
    chapter's experiment parameters, such as ``profile`` and ``seeds``; not output folders or ``n_jobs``).
    Each must equal the sidecar's record of the run. ``resolved``: the same parameters as the chapter's
    config resolved them (``None`` replaced by the profile's value); a record that equals the resolved
    value also matches (a run made without the ``bnstudy`` command records resolved values). ``defaults``: for
    parameters a chapter's design added after some rows were computed (its ``READ_DEFAULTS``), the value those
    older rows were computed with; a parameter the sidecar does not record is read as that value (and a
    missing column of the same name is filled with it), so a new axis never breaks a page built from an older
    release: the new cells alone need computing, and only when asked for. Such a parameter left at ``None`` (the
    profile's value) takes the rows' value; the page reads it back from :attr:`Rows.defaulted` (its config
    rebuilt with ``config.replace(**R.defaulted)``), and a value given explicitly must equal it.

    Returns ``(rows, provenance)``: the table exactly as saved (``pandas.read_csv``; floats round-trip
    exactly; a table saved with no columns comes back empty), and ``dict(path, sha256, git_commit, written, run_wall_s, seeds,
    workers, defaulted)`` (``run_wall_s`` / ``workers``, the worker processes the run line recorded, are ``None`` when the
    run did not record them; ``defaulted``: ``{name: value}`` of the parameters read from ``defaults``). When the sidecar's parameters carry ``rows_from`` (the
    table was re-saved by a page that analysed an earlier run's rows), its ``git_commit``, ``written``
    and ``run_wall_s`` are used, so the provenance still names the run that computed the rows.

    ``chapter``: the reading chapter's folder name (``freeze_modes``); a table whose sidecar records another chapter
    (``02_eval_traps``) is refused before its parameters are compared.

    Raises ``FileNotFoundError`` if the CSV or its sidecar is missing; ``ValueError`` if ``path`` is a sidecar
    (``.json``) or another chapter's table, if the CSV's sha256
    differs from the one its sidecar recorded (the file was changed, or is not the complete table), or
    if a parameter is not recorded or differs from the record (the message names it and both values).
    """
    path = Path(path)
    if path.suffix == ".json":
        raise ValueError(f"rows: {path.name} is a sidecar (what produced a table); give the results table it "
                         f"describes, {path.with_suffix('.csv').name}")
    if not path.is_file():
        raise FileNotFoundError(f"rows: no results table at {path} (give the CSV an earlier run saved, "
                                f"or rows=None to run the experiment)")
    side = sidecar_path(path)
    if not side.is_file():
        raise FileNotFoundError(f"rows: {path} has no sidecar {side.name}; only tables written by save_table "
                                f"can be analysed again (their sidecar records what produced them)")
    meta = json.loads(side.read_text())
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta.get("sha256"):
        raise ValueError(f"rows: {path} does not match its sidecar (sha256 {digest[:12]}... against "
                         f"{str(meta.get('sha256'))[:12]}...): the file was changed after the run or is incomplete")
    recorded = dict(meta.get("parameters") or {})
    owner = recorded.get("chapter")
    if chapter and isinstance(owner, str) and owner.split("_", 1)[-1] != chapter:
        raise ValueError(f"rows: {path.name} holds chapter {owner}'s rows (its sidecar says so), not this "
                         f"chapter's ({chapter}); give the results table this chapter's run saved")
    defaulted = {name: _jsonable(v) for name, v in (defaults or {}).items()
                 if name in parameters and name not in recorded}
    recorded.update(defaulted)
    for name, value in parameters.items():
        if name not in recorded:
            raise ValueError(f"rows: the run behind {path} did not record parameter {name!r}, so its rows "
                             f"cannot be matched to this configuration (recorded: {sorted(recorded)}; a parameter "
                             f"added after the rows were computed needs its value in the chapter's READ_DEFAULTS)")
        if name in defaulted and value is None:
            continue  # left to the profile: the rows' value is the page's (Rows.defaulted says which)
        if name in defaulted and _jsonable(value) != recorded[name] and not (
                resolved and name in resolved and _jsonable(resolved[name]) == recorded[name]):
            raise ValueError(f"rows: parameter {name!r} is {_jsonable(value)!r} here, but the rows behind {path} "
                             f"predate it and were computed as {name}={recorded[name]!r} (its READ_DEFAULTS value); "
                             f"compute the new cells (rows=None, or recompute the release: cached cells stay warm) "
                             f"or give {name}={recorded[name]!r}")
        if _jsonable(value) != recorded[name] and not (resolved and name in resolved
                                                       and _jsonable(resolved[name]) == recorded[name]):
            if recorded[name] is None:  # the run took its profile's value; it recorded None, not the value
                raise ValueError(f"rows: parameter {name!r} is {_jsonable(value)!r} here but was None (the profile's "
                                 f"value) in the run behind {path}; run the experiment (rows=None) or leave {name} "
                                 f"out (None), as that run did, even if {_jsonable(value)!r} is the profile's value")
            raise ValueError(f"rows: parameter {name!r} is {_jsonable(value)!r} here but was "
                             f"{recorded[name]!r} in the run behind {path}; run the experiment (rows=None) "
                             f"or give the same {name}")
    df = _read_table(path, data)
    for name, value in defaulted.items():
        if name not in df.columns and len(df.columns) and not isinstance(value, (list, dict)):
            df[name] = value
    env = meta.get("environment") or {}
    prov = dict(path=str(path), sha256=digest, git_commit=env.get("git_commit", "unknown"),
                written=meta.get("written"), run_wall_s=recorded.get("run_wall_s"), seeds=meta.get("seeds"),
                workers=recorded.get("workers"), defaulted=defaulted)
    origin = recorded.get("rows_from")
    if isinstance(origin, dict):  # the table was itself re-saved from an earlier run's rows: name that run
        for k in ("git_commit", "written", "run_wall_s", "workers", "release"):
            if origin.get(k) is not None:
                prov[k] = origin[k]
    release = release_of(path)
    if release is not None:
        prov["release"] = release
    return df, prov


def release_of(path) -> dict | None:
    """For a table inside a data release (a ``manifest.json`` beside it, :mod:`bnstudy.study.release`): the release's
    ``version``, ``date`` and last ``verified`` record (``None`` if never verified); else ``None``."""
    m = Path(path).parent / "manifest.json"
    if not m.is_file():
        return None
    manifest = json.loads(m.read_text())
    rel = (manifest.get("release") or {})
    v = rel.get("verified") or None
    chapter = ((manifest.get("tables") or {}).get(Path(path).stem) or {}).get("chapter")
    how = None
    lists = [k for k in ("exact", "statistical", "unchecked") if k in (v or {})]
    if v is not None and chapter is not None and lists:
        # a record that says how names every chapter it verified: one in none of its lists was added later
        how = next((k for k in lists if chapter in (v.get(k) or ())), "not verified")
    return dict(version=rel.get("version"), date=rel.get("date"),
                verified=None if v is None else dict(date=v.get("date"), git_commit=str(v.get("git_commit"))[:12],
                                                     units_per_chapter=v.get("units_per_chapter"), how=how))


#: How one chapter of the data release was verified, in the words every place that says it uses: the pages' *Ran
#: with* line (:func:`release_text`), the provenance cards (:mod:`bnstudy.study.provenance`) and the release history
#: (:mod:`bnstudy.study.history`). The release was computed chapter by chapter; a chapter computed under the pinned
#: numerics (:mod:`bnstudy.study.numerics`) recomputes ``==``, one computed before the pin only statistically.
VERIFICATION_WORDS = {
    "exact": "exactly: every column == (computed and recomputed under the pinned numerics)",
    "statistical": "statistically: not == (computed under other numeric kernels), every recomputed unit within its "
                   "seeds' spread",
    "unchecked": "unchecked: not == (computed under other numeric kernels), too few seeds to check their spread",
}


def verification_words(how: str | None) -> str:
    """:data:`VERIFICATION_WORDS` of ``how`` (``"exact"``, ``"statistical"``, ``"unchecked"``); a record made
    before verifications said how (``None``) was exact. ``"not in this verification"`` for another value."""
    return VERIFICATION_WORDS.get("exact" if how is None else how, "not in this verification")


def verified_text(verified: dict | None) -> str:
    """``"last verified 2026-12-03 at git commit 610372f574f6: 5 units per chapter recomputed from an empty cache"``
    (``verified``: a release's ``verified`` record, which names its ``git_commit``); ``"never verified by
    recomputation"`` for ``None``."""
    if not verified:
        return "never verified by recomputation"
    return (f"last verified {verified.get('date')} at git commit {str(verified.get('git_commit'))[:12]}: "
            f"{verified.get('units_per_chapter')} units per chapter recomputed from an empty cache")


def release_text(release: dict | None) -> str:
    """``"data release 2026.12.03 (last verified 2026-12-03 at git commit 610372f574f6: 5 units per chapter
    recomputed from an empty cache; this chapter statistically: not == ...)"`` (:func:`verified_text`,
    :func:`verification_words`), or ``""`` for rows that are not a release's."""
    if not release:
        return ""
    v = release.get("verified")
    if not v:
        return f"data release {release.get('version')} ({verified_text(None)})"
    return f"data release {release.get('version')} ({verified_text(v)}; this chapter {verification_words(v.get('how'))})"


def rows_origin(provenance: dict) -> dict:
    """The record of analysed rows' origin for the run line and the sidecars (``rows_from``), from
    :func:`load_rows`' provenance: ``git_commit, written, sha256`` (first 12 hex digits), ``run_wall_s`` and
    ``workers``."""
    out = dict(git_commit=provenance.get("git_commit"), written=provenance.get("written"),
               sha256=str(provenance.get("sha256"))[:12], run_wall_s=provenance.get("run_wall_s"),
               workers=provenance.get("workers"))
    if provenance.get("release"):
        out["release"] = provenance["release"]
    return out


def config_parameters(config, given: dict, analysis=()) -> tuple[dict, dict]:
    """The row-deciding parameters of a chapter ``config`` for :func:`load_rows`: ``(parameters, resolved)``.

    Every field of ``config.asdict()`` except those in ``analysis`` (the chapter's ``ANALYSIS_PARAMETERS``,
    which only change the analysis); ``parameters`` takes each value as the notebook was given it (``given``,
    e.g. its ``globals()``; ``None`` stands for the profile's value) where it has one, ``resolved`` as the
    config resolved it."""
    resolved = {k: v for k, v in config.asdict().items() if k not in set(analysis)}
    return {k: given.get(k, v) for k, v in resolved.items()}, resolved


@dataclasses.dataclass(frozen=True)
class Rows:
    """The rows a chapter page analyses, and where they came from (:func:`rows_or_run`).

    ``table``: the main results table; ``tables``: its sibling tables by suffix (``{"lr_check": ...}``);
    ``provenance``: :func:`load_rows`' for the main table, or ``None`` when this execution ran the experiment;
    ``run_wall_s``: the experiment's wall time in seconds (this execution's run, else the earlier run's record;
    ``None`` when not recorded); ``extra``: ``{"rows_from": ...}`` for :func:`bnstudy.study.pages.run_line` when the
    rows are an earlier run's (so re-saved tables still name that run), else ``{}``."""

    table: pd.DataFrame
    tables: dict
    provenance: dict | None
    run_wall_s: float | None
    extra: dict

    @property
    def defaulted(self) -> dict:
        """``{parameter: value}`` read from the chapter's ``READ_DEFAULTS`` because the rows predate the parameter
        (:func:`load_rows`); ``{}`` for rows this execution computed or that record every parameter."""
        return dict((self.provenance or {}).get("defaulted") or {})

    def timing(self, wall_s: float, what: str = "the sweep") -> str:
        """:func:`timing_sentence` for this page (``wall_s``: this execution's wall time, seconds)."""
        return timing_sentence(wall_s, self.run_wall_s, self.provenance,
                               None if self.provenance is None else len(self.table), what)


def rows_or_run(rows, run, parameters: dict, resolved: dict | None = None, siblings=(),
                sibling_parameters: dict | None = None, defaults: dict | None = None,
                chapter: str | None = None) -> Rows:
    """A chapter's rows: from ``run()`` (``rows is None``) or from an earlier run's saved tables (``rows``).

    ``rows``: ``None``, or the path of an earlier run's main results CSV (``results/NN_name.csv``).
    ``run``: called with no arguments when ``rows is None``; returns the main table, or ``(table, {suffix:
    table})`` with one entry per name in ``siblings``. Its wall time is recorded (:func:`record_run_time`).
    ``parameters`` / ``resolved``: the row-deciding parameters, checked against each table's sidecar
    (:func:`load_rows`; :func:`config_parameters` makes both from a config). ``siblings``: suffixes of tables
    the same run saved beside the main one (``NN_name_<suffix>.csv``); each is loaded and checked the same way
    and must come from the same git commit as the main table. ``sibling_parameters``: ``{suffix: (parameters,
    resolved)}`` for a sibling whose sidecar records its own configuration (a check the run derived from the
    chapter's config, on other seeds), checked against those instead. ``defaults``: the chapter's
    ``READ_DEFAULTS`` (see :func:`load_rows`), applied to every table. ``chapter``: the reading chapter's folder
    name (:func:`load_rows`: another chapter's table is refused).

    Returns :class:`Rows`. Raises what :func:`load_rows` raises (a missing table or sidecar, a changed file, a
    parameter that differs, naming it), ``ValueError`` if a sibling comes from another commit than the main
    table, or if ``run`` does not return the tables ``siblings`` names.
    """
    if rows is None:
        t0 = time.perf_counter()
        out = run()
        wall = record_run_time(time.perf_counter() - t0)
        table, tables = (out if isinstance(out, tuple) else (out, {}))
        if set(tables) != set(siblings):
            raise ValueError(f"rows_or_run: run returned tables {sorted(tables)}, expected siblings {sorted(siblings)}")
        return Rows(table, dict(tables), None, wall, {})
    path = Path(rows)
    side = [s for s in siblings if path.stem.endswith(f"_{s}")]
    if side:
        main = path.with_name(f"{path.stem[:-len(side[0]) - 1]}{path.suffix}")
        raise ValueError(f"rows: {path.name} is the run's {side[0]!r} table, saved beside its main table; give the "
                         f"main table, {main.name} (its siblings are read from beside it)")
    table, prov = load_rows(path, parameters, resolved, defaults, chapter)
    tables = {}
    for suffix in siblings:
        sib = path.with_name(f"{path.stem}_{suffix}{path.suffix}")
        if not sib.is_file():
            raise FileNotFoundError(f"rows: {path.name} was given, but {sib.name}, which its run saved beside it, "
                                    f"is not in {sib.parent}; the page analyses {path.name} together with "
                                    f"{', '.join(f'{path.stem}_{s}{path.suffix}' for s in siblings)} (keep the "
                                    f"run's results folder together)")
        tables[suffix], sp = load_rows(sib, *(sibling_parameters or {}).get(suffix, (parameters, resolved)), defaults)
        if sp["git_commit"] != prov["git_commit"]:
            raise ValueError(f"rows: {sib.name} was written at git commit {sp['git_commit']} but {path.name} at "
                             f"{prov['git_commit']}; give tables saved by one run")
    return Rows(table, tables, prov, prov["run_wall_s"], dict(rows_from=rows_origin(prov)))


def chapter_rows(rows, run, config, given: dict, module):
    """The one chapter-run preamble: :func:`rows_or_run` with the chapter module's ``ANALYSIS_PARAMETERS``,
    ``SIBLING_TABLES``, ``sibling_parameters(config)`` and ``READ_DEFAULTS`` (each optional), and ``config`` with
    the values older rows were read with (:attr:`Rows.defaulted`). ``given``: the notebook's ``globals()``.
    Returns ``(Rows, config)``; raises what :func:`rows_or_run` raises."""
    own = getattr(module, "sibling_parameters", None)
    r = rows_or_run(rows, run, *config_parameters(config, given, getattr(module, "ANALYSIS_PARAMETERS", ())),
                    siblings=getattr(module, "SIBLING_TABLES", ()), sibling_parameters=own(config) if own else None,
                    defaults=getattr(module, "READ_DEFAULTS", None), chapter=chapter_folder(module))
    return r, (config.replace(**r.defaulted) if r.defaulted else config)


def chapter_folder(obj) -> str | None:
    """The chapter folder (``freeze_modes``) of a chapter's module or config (``bnstudy.study.experiments.<folder>``
    or one of its modules), else ``None``."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
    parts = name.split(".")
    i = parts.index("experiments") if "experiments" in parts else -1
    return parts[i + 1] if 0 <= i < len(parts) - 1 else None


def record_run_time(seconds: float) -> float:
    """Remember the experiment's wall time (seconds) for the sidecars of the tables this process saves
    (``parameters.run_wall_s``), so that :func:`load_rows` can report it later. Returns ``seconds``."""
    seconds = float(seconds)
    _RUN["run_wall_s"] = seconds
    for p in _SAVED:
        if p.exists():
            write_sidecar(p)
    return seconds


def timing_sentence(wall_s: float, run_s: float | None, rows_from: dict | None = None, n_rows: int | None = None,
                    what: str = "the sweep") -> str:
    """The page's sentence on what this execution cost (Markdown).

    ``wall_s``: this execution's wall time in seconds; ``run_s``: the experiment's (``what``) share of it, or,
    when the rows came from an earlier run (``rows_from``: :func:`load_rows`'s provenance), that run's
    recorded wall time (``None``: not recorded). ``n_rows``: the number of rows analysed.
    """
    if rows_from is None:
        return (f"This execution took {wall_s / 60:.1f} minutes of wall time, {run_s / 60:.1f} of them in {what} "
                f"(finished runs are read from the cache, not recomputed).")
    when = str(rows_from.get("written") or "an unrecorded time").replace("T", " ").replace("+00:00", " UTC")
    own = (f"that run took {run_s / 60:.1f} minutes in {what}" if run_s is not None
           else "that run's own wall time is not in its sidecar (the project's closing notes give it)")
    rel = release_text(rows_from.get("release"))
    if rel:
        rel = f" of the {rel}"
    return (f"This execution did not run the experiment: it analysed again the {f'{n_rows:,}' if n_rows is not None else ''}"
            f"{' ' if n_rows is not None else ''}rows{rel} that the run at git commit `{rows_from.get('git_commit')}` "
            f"saved on {when} (their sha256 checked against that run's record), in {wall_s / 60:.1f} minutes of "
            f"wall time; {own}.")


def profile_note(profile: str, n_seeds: int) -> str:
    """A Markdown note telling readers how much to trust a page built in the ``quick`` profile."""
    if profile == "full":
        return (f"*This page was built with the full profile: {n_seeds} seeds per condition, intervals over "
                f"seeds at 95% (at a higher confidence where the page corrects for testing many cells, as it "
                f"says).*")
    return (f"*This page was built with the {profile} profile ({n_seeds} seeds per condition), meant for "
            f"checking the pipeline. With so few seeds the 95% intervals are wide (a Student's t interval "
            f"can even extend past 0 or 1), bootstrap resamples of the seeds take only a few distinct "
            f"values, and small differences may be noise; read the numbers from the full-profile book.*")


def p_text(p) -> str:
    """A p-value as a page prints it: ``"< 0.001"`` below 0.001, else ``"= 0.xxx"``; ``"not computed"`` for
    ``None`` or NaN (a ``.3f`` format would print a p of 0.0004 as ``0.000``)."""
    import math
    if p is None or math.isnan(float(p)):
        return "not computed"
    return "< 0.001" if float(p) < 0.001 else f"= {float(p):.3f}"


