"""Provenance of a chapter's tables: what it ran with, the tables' JSON sidecars, and reading an earlier run's rows.

:func:`run_line` prints what a chapter ran with; :func:`save_table` writes, next to every CSV, a JSON sidecar with the
same facts plus the chapter's full parameters (``$BNSTUDY_RUN_PARAMETERS``, else the last :func:`run_line`).
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
    """The code's short git commit, ``"+dirty"`` appended when tracked files under ``bnstudy/``, ``chapters/`` or
    ``pyproject.toml`` have uncommitted changes (outputs such as ``release/`` do not count); ``"unknown"`` outside a
    git checkout or without ``git``."""
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


def environment() -> dict:
    """Where the code ran: package version, git commit, numeric environment (:func:`bnstudy.study.numerics.key`),
    device, torch and its thread count, Python."""
    from importlib.metadata import PackageNotFoundError, version

    from . import numerics
    try:
        bnstudy = version("bnstudy")
    except PackageNotFoundError:
        bnstudy = "unknown"
    cuda = torch.cuda.is_available()
    return dict(bnstudy=bnstudy, git_commit=git_commit(), numerics=numerics.key(),
                device=f"cuda ({torch.cuda.get_device_name(0)})" if cuda else "cpu",
                torch=torch.__version__, torch_threads=torch.get_num_threads(),
                python=platform.python_version())


def run_line(profile: str, n_seeds: int, width: int = 78, **params) -> str:
    """What a chapter ran with (profile, seeds, ``params``, then :func:`describe_run`), wrapped to ``width``."""
    extra = ", ".join(f"{k}={v}" for k, v in params.items())
    return describe_run(f"profile={profile}, {n_seeds} seeds, {extra}",
                        dict(profile=profile, n_seeds=int(n_seeds), **params), width)


def describe_run(description: str, parameters: dict, width: int = 78, run_threads: int | None = None) -> str:
    """``"Ran with <description>; bnstudy ... at git commit ...; device ..., torch ..."``, wrapped to ``width``.

    ``parameters`` go into the sidecars of the tables this process saves (earlier ones are rewritten).
    ``run_threads``: torch threads each run used, if fixed by the sweep.
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
    _rewrite_sidecars()
    return textwrap.fill(text, width=width, subsequent_indent="  ", break_on_hyphens=False)


def _rewrite_sidecars() -> None:
    """Tables saved earlier in this process get the run's parameters too."""
    for p in _SAVED:
        if p.exists():
            write_sidecar(p)


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # NumPy scalars
        return v.item()
    return v if isinstance(v, (str, int, float, bool, type(None))) else str(v)


def portable_path(value: str, root) -> str:
    """An absolute path relative to the repository, else to the book's ``root``, else ``~/``, else its name alone;
    anything else (a relative path, a word) unchanged."""
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
    """The CSV at ``path`` (``data``: its bytes); empty for a table saved with no columns."""
    return pd.read_csv(path) if data.strip() else pd.DataFrame()


def write_sidecar(csv_path, parameters: dict | None = None, seeds=None) -> Path:
    """Write the JSON sidecar of ``csv_path``; returns its path.

    Keys: ``table``, ``rows``, ``columns``, ``sha256``, ``seeds`` (the ``seed`` column unless given),
    ``parameters`` (else ``$BNSTUDY_RUN_PARAMETERS``, its ``None`` values resolved from the last :func:`run_line`;
    paths made :func:`portable_paths`), ``environment`` (:func:`environment`) and ``written`` (UTC).
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
    """Write the tidy table ``df`` as CSV atomically, and its sidecar (:func:`write_sidecar`); returns ``path``.

    Raises ``ValueError`` naming the columns that hold lists, tuples or dicts (a CSV cannot hold them faithfully).
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
    """The rows an earlier run of a chapter saved (:func:`save_table`), to analyse again without recomputing them.

    ``path``: the run's main results CSV, its sidecar beside it. ``parameters``: the row-deciding values, each of
    which must equal the sidecar's record, or its ``resolved`` value (``None`` replaced by the profile's).
    ``defaults``: the chapter's ``READ_DEFAULTS``, the value rows computed before a parameter existed were computed
    with (a missing column of that name is filled with it; a ``None`` parameter takes it, :attr:`Rows.defaulted`).
    ``chapter``: the reading chapter's folder; another chapter's table is refused.

    Returns ``(rows, provenance)``: the table as saved, and ``dict(path, sha256, git_commit, written, run_wall_s,
    seeds, workers, defaulted)`` (plus ``release``, :func:`release_of`), naming the run that computed the rows even
    for a table re-saved from earlier rows (``rows_from``).

    Raises ``FileNotFoundError`` if the CSV or its sidecar is missing; ``ValueError`` if ``path`` is a sidecar or
    another chapter's table, if the CSV's sha256 differs from its sidecar's, or if a parameter is not recorded or
    differs from the record (naming it and both values).
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
        differs = _jsonable(value) != recorded[name] and not (resolved and name in resolved
                                                             and _jsonable(resolved[name]) == recorded[name])
        if name in defaulted and differs:
            raise ValueError(f"rows: parameter {name!r} is {_jsonable(value)!r} here, but the rows behind {path} "
                             f"predate it and were computed as {name}={recorded[name]!r} (its READ_DEFAULTS value); "
                             f"compute the new cells (rows=None, or recompute the release: cached cells stay warm) "
                             f"or give {name}={recorded[name]!r}")
        if differs:
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
    """For a table in a data release (``manifest.json`` beside it): its ``version``, ``date`` and last ``verified``
    record (``None`` if never verified); else ``None``."""
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


#: How one chapter of the data release was verified, in the words the pages, provenance cards and history use.
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
    """``"data release 2026.12.03 (<verified_text>; this chapter <verification_words>)"``, or ``""`` for rows that
    are not a release's."""
    if not release:
        return ""
    v = release.get("verified")
    if not v:
        return f"data release {release.get('version')} ({verified_text(None)})"
    return f"data release {release.get('version')} ({verified_text(v)}; this chapter {verification_words(v.get('how'))})"


def rows_origin(provenance: dict) -> dict:
    """The ``rows_from`` record of :func:`load_rows`' provenance: ``git_commit, written, sha256`` (12 hex digits),
    ``run_wall_s``, ``workers`` (and ``release``)."""
    out = dict(git_commit=provenance.get("git_commit"), written=provenance.get("written"),
               sha256=str(provenance.get("sha256"))[:12], run_wall_s=provenance.get("run_wall_s"),
               workers=provenance.get("workers"))
    if provenance.get("release"):
        out["release"] = provenance["release"]
    return out


def config_parameters(config, given: dict, analysis=()) -> tuple[dict, dict]:
    """``(parameters, resolved)`` for :func:`load_rows`: every field of ``config`` not in ``analysis``, as the notebook
    gave it (``given``, its ``globals()``) and as the config resolved it."""
    resolved = {k: v for k, v in config.asdict().items() if k not in set(analysis)}
    return {k: given.get(k, v) for k, v in resolved.items()}, resolved


@dataclasses.dataclass(frozen=True)
class Rows:
    """The rows a chapter page analyses (:func:`rows_or_run`): the main ``table``, sibling ``tables`` by suffix,
    ``provenance`` (:func:`load_rows`'; ``None`` when this execution ran the experiment), ``run_wall_s`` (seconds;
    ``None`` if not recorded), ``extra`` (``{"rows_from": ...}`` for earlier rows, else ``{}``)."""

    table: pd.DataFrame
    tables: dict
    provenance: dict | None
    run_wall_s: float | None
    extra: dict

    @property
    def defaulted(self) -> dict:
        """``{parameter: value}`` read from ``READ_DEFAULTS`` because the rows predate the parameter; else ``{}``."""
        return dict((self.provenance or {}).get("defaulted") or {})

    def timing(self, wall_s: float, what: str = "the sweep") -> str:
        """:func:`timing_sentence` for this page (``wall_s``: this execution's wall time, seconds)."""
        return timing_sentence(wall_s, self.run_wall_s, self.provenance,
                               None if self.provenance is None else len(self.table), what)


def rows_or_run(rows, run, parameters: dict, resolved: dict | None = None, siblings=(),
                sibling_parameters: dict | None = None, defaults: dict | None = None,
                chapter: str | None = None) -> Rows:
    """A chapter's rows: from ``run()`` when ``rows is None`` (its wall time recorded), else from the earlier run's
    main results CSV ``rows`` and its ``siblings`` (``NN_name_<suffix>.csv``), each checked by :func:`load_rows`
    against ``parameters`` / ``resolved`` (a sibling's own in ``sibling_parameters``, ``{suffix: (parameters,
    resolved)}``), ``defaults`` and ``chapter``. ``run`` returns the main table, or ``(table, {suffix: table})``.

    Returns :class:`Rows`. Raises what :func:`load_rows` raises, and ``ValueError`` if a sibling comes from another
    commit than the main table or ``run`` does not return the tables ``siblings`` names.
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
    """:func:`rows_or_run` with the chapter ``module``'s optional ``ANALYSIS_PARAMETERS``, ``SIBLING_TABLES``,
    ``sibling_parameters(config)`` and ``READ_DEFAULTS``. Returns ``(Rows, config)``, the config with
    :attr:`Rows.defaulted` applied; raises what :func:`rows_or_run` raises."""
    own = getattr(module, "sibling_parameters", None)
    r = rows_or_run(rows, run, *config_parameters(config, given, getattr(module, "ANALYSIS_PARAMETERS", ())),
                    siblings=getattr(module, "SIBLING_TABLES", ()), sibling_parameters=own(config) if own else None,
                    defaults=getattr(module, "READ_DEFAULTS", None), chapter=chapter_folder(module))
    return r, (config.replace(**r.defaulted) if r.defaulted else config)


def chapter_folder(obj) -> str | None:
    """The chapter folder (``freeze_modes``) of a chapter's module or config, else ``None``."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
    parts = name.split(".")
    i = parts.index("experiments") if "experiments" in parts else -1
    return parts[i + 1] if 0 <= i < len(parts) - 1 else None


def record_run_time(seconds: float) -> float:
    """Record the experiment's wall time (seconds) in this process's sidecars (``parameters.run_wall_s``).
    Returns ``seconds``."""
    seconds = float(seconds)
    _RUN["run_wall_s"] = seconds
    _rewrite_sidecars()
    return seconds


def timing_sentence(wall_s: float, run_s: float | None, rows_from: dict | None = None, n_rows: int | None = None,
                    what: str = "the sweep") -> str:
    """The page's sentence (Markdown) on what this execution cost: ``wall_s`` seconds, ``run_s`` of them in ``what``,
    or, for rows from an earlier run (``rows_from``: :func:`load_rows`' provenance), that run's wall time (``None``:
    not recorded) and the ``n_rows`` analysed."""
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
    """``"< 0.001"`` below 0.001, else ``"= 0.xxx"``; ``"not computed"`` for ``None`` or NaN."""
    import math
    if p is None or math.isnan(float(p)):
        return "not computed"
    return "< 0.001" if float(p) < 0.001 else f"= {float(p):.3f}"


