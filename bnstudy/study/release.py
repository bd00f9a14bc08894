"""The data release: every chapter's full-profile tables, the units they were made of, and a proof by recomputation.

``release/`` holds each chapter's tables with their sidecars (``rows=release/NN_name.csv`` rebuilds a page), the
cached units its run read (``units/NN_name.jsonl.gz``; no stage-1 weights ship) and ``manifest.json`` (per table,
chapter and release: hashes, seeds, commit, environment, the last verification). It is recomputed only on purpose
(``make release``) and proven by recomputing a seeded sample of its units from scratch, every other unit read from
the record, with ``==`` on every column but wall times (``make verify-release``, :func:`verify`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gzip
import hashlib
import json
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .book import environ as _environ
from .manifest import MANIFEST, RELEASE_DIR, REPO, read_manifest, write_manifest  # noqa: F401 (release's API)

WALL_COLUMNS_SUFFIX = "wall_s"


@dataclasses.dataclass(frozen=True)
class Chapter:
    """A chapter of the release: its number (``"03"``), notebook stem and experiment module name."""

    number: str
    notebook: str
    module: str

    @property
    def main(self) -> str:
        """The main table's file stem (``03_shift_strength``)."""
        return self.notebook

    def experiment(self):
        """``bnstudy.study.experiments.NAME.run`` for a chapter folder, else the single module ``...NAME``."""
        import importlib
        mod = importlib.import_module(f"bnstudy.study.experiments.{self.module}")
        if hasattr(mod, "__path__"):  # a chapter folder: run / findings / figures
            return importlib.import_module(f"bnstudy.study.experiments.{self.module}.run")
        return mod

    def findings(self):
        """Where the chapter's claims live: ``NAME.findings`` of a chapter folder (``NAME.claims`` without one), else
        the single module."""
        import importlib
        import importlib.util
        mod = importlib.import_module(f"bnstudy.study.experiments.{self.module}")
        if hasattr(mod, "__path__"):
            name = "findings" if importlib.util.find_spec(f"{mod.__name__}.findings") else "claims"
            return importlib.import_module(f"{mod.__name__}.{name}")
        return mod

    def siblings(self) -> tuple:
        return tuple(getattr(self.experiment(), "SIBLING_TABLES", ()))

    def table_stems(self) -> list[str]:
        return [self.main] + [f"{self.main}_{s}" for s in self.siblings()]

    def tables(self, config, execution) -> dict:
        """``{file stem: DataFrame}``: the tables the chapter's page saves from its run (what the release holds)."""
        mod = self.experiment()
        if self.number == "03":  # its page saves the run's rows through results_table
            return {self.main: mod.results_table(mod.run(config, execution))}
        if hasattr(mod, "run_tables"):
            main, sib = mod.run_tables(config, execution)
            return {self.main: main, **{f"{self.main}_{k}": v for k, v in sib.items()}}
        return {self.main: mod.run(config, execution)}


CHAPTERS = {c.number: c for c in (Chapter(nb[:2], nb, nb[3:]) for nb in (
    "01_freeze_modes", "02_eval_traps", "03_shift_strength", "04_heads", "05_batch_size", "06_unknown_task",
    "07_real_data", "08_test_time", "09_momentum_affine"))}


def parse_chapters(spec) -> list[Chapter]:
    """``"03,04"``, ``["03", "4"]`` or ``None``/``""``/``"all"`` as :class:`Chapter` objects. Raises ``ValueError``
    naming the parameter and the allowed values for an unknown chapter."""
    if spec is None or spec == "" or spec == "all":
        return list(CHAPTERS.values())
    items = spec.replace(" ", ",").split(",") if isinstance(spec, str) else list(spec)
    out = []
    for s in (str(i).strip() for i in items):
        if not s:
            continue
        key = s.zfill(2)[:2] if s[:2].isdigit() or s.isdigit() else s
        if key not in CHAPTERS:
            raise ValueError(f"CHAPTERS: unknown chapter {s!r}; allowed: {', '.join(CHAPTERS)} (comma-separated) or all")
        out.append(CHAPTERS[key])
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else :func:`platform.processor`, else ``"unknown"``."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def code_fingerprint() -> str:
    """The fingerprint of the row-computing code: :func:`bnstudy.study.sweep.code_version`, the hash in every run cache key."""
    from .sweep import code_version
    return code_version()


def git_state(repo: Path = REPO) -> tuple[str, bool]:
    """``(commit, dirty)``: HEAD's hash and whether tracked files that compute rows or pages differ from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "bnstudy",
                                 "chapters", "pyproject.toml"], cwd=repo, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True
    return commit, bool(status)


def sha256_file(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def units_path(chapter: Chapter, release_dir=RELEASE_DIR) -> Path:
    return Path(release_dir) / "units" / f"{chapter.main}.jsonl.gz"


def write_units(units: list[dict], path) -> None:
    """Write units as gzipped JSON lines, byte-reproducibly (no time stamp in the gzip header), atomically."""
    from .sweep import atomic_write_bytes
    text = "".join(json.dumps(u) + "\n" for u in units)  # key order kept (column order)
    atomic_write_bytes(Path(path), gzip.compress(text.encode(), compresslevel=9, mtime=0))


def read_units(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def compute(chapters, release_dir=RELEASE_DIR, n_jobs: int | None = None, allow_dirty: bool = False,
            work_dir=None, profile: str = "full", log=print, parameters: dict | None = None,
            reuse_units: bool = False) -> dict:
    """Recompute ``chapters`` (:func:`parse_chapters`) at ``profile`` (``quick``: a small release for tests) into
    ``release_dir``; ``parameters``: notebook parameters on top of the profile's. Returns the manifest.

    Each notebook runs in a work folder with its units recorded; only a notebook that ran to the end has its tables
    and units copied and the manifest rewritten, so an interrupted chapter leaves the release as it was.
    ``reuse_units=True``: the units the release already records count as computed (only when their code is
    unchanged; :func:`verify` then checks a sample of old and new). Raises ``RuntimeError`` if the code that computes
    rows has uncommitted changes (``allow_dirty=True`` for tests), or what the chapter's execution raised.
    """
    from . import book, numerics
    from .report import sidecar_path
    from .sweep import UNITS_LOG_ENV, VERIFY_ENV, read_units as read_log

    numerics.apply_pin()  # before this process's first torch operation; the chapters' kernels inherit it
    commit, dirty = git_state()
    if dirty and not allow_dirty:
        raise RuntimeError("release: bnstudy/, chapters/ or pyproject.toml have uncommitted changes; commit them "
                           "first, so the release names the code that computed it")
    release_dir = Path(release_dir)
    manifest = read_manifest(release_dir)
    for ch in parse_chapters(chapters):
        work = Path(work_dir or release_dir / ".work") / ch.main
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log_path = work / "units.jsonl"
        params = dict(results_dir=str(work / "results"), figures_dir=str(work / "figures"))
        if n_jobs is not None:
            params["n_jobs"] = n_jobs
        params.update(parameters or {})
        log(f"[bnstudy.study.release] chapter {ch.number} ({ch.notebook}, {profile} profile) ...")
        t0 = time.perf_counter()
        recorded = units_path(ch, release_dir)
        reused = read_units(recorded) if reuse_units and recorded.exists() else []
        with _environ(**{UNITS_LOG_ENV: str(log_path), VERIFY_ENV: str(recorded) if reused else None}):
            book.execute_chapter(REPO / "chapters" / f"{ch.notebook}.ipynb", work / "chapters", profile,
                                 parameters=params, log_output=True)
        wall = time.perf_counter() - t0
        units = read_log(log_path)
        if reused:
            from .sweep import _canonical, unit_threads
            before = {(u["namespace"], _canonical(u["config"]), unit_threads(u)) for u in reused}
            n_reused = sum((u["namespace"], _canonical(u["config"]), unit_threads(u)) in before for u in units)
            log(f"[bnstudy.study.release] chapter {ch.number}: {n_reused:,} of {len(units):,} units taken from the "
                f"release's record (reuse_units), {len(units) - n_reused:,} computed")
        stems = ch.table_stems()
        missing = [s for s in stems if not (work / "results" / f"{s}.csv").exists()]
        if missing:
            raise RuntimeError(f"release: chapter {ch.number}'s page saved no {missing} (expected {stems})")
        # tables (sidecar last, so a table without its sidecar is never taken as complete), then units
        for old_stem in [k for k, v in manifest["tables"].items() if v.get("chapter") == ch.number]:
            manifest["tables"].pop(old_stem)
        for s in stems:
            src = work / "results" / f"{s}.csv"
            shutil.copyfile(src, release_dir / f"{s}.csv")
            shutil.copyfile(sidecar_path(src), release_dir / f"{s}.json")
            meta = json.loads(sidecar_path(src).read_text())
            p = meta.get("parameters") or {}
            manifest["tables"][s] = dict(chapter=ch.number, file=f"{s}.csv", sha256=meta["sha256"], rows=meta["rows"],
                                         profile=p.get("profile"), seeds=meta.get("seeds"),
                                         run_wall_s=p.get("run_wall_s"), workers=p.get("workers"))
        write_units(units, units_path(ch, release_dir))
        env = json.loads(sidecar_path(work / "results" / f"{ch.main}.csv").read_text())
        p = env.get("parameters") or {}
        manifest["units"][ch.main] = dict(chapter=ch.number, file=f"units/{ch.main}.jsonl.gz",
                                          sha256=sha256_file(units_path(ch, release_dir)), units=len(units),
                                          namespaces=sorted({u["namespace"] for u in units}))
        e = env.get("environment") or {}
        manifest["chapters"][ch.number] = dict(
            notebook=ch.notebook, git_commit=commit, code_fingerprint=code_fingerprint(), profile=profile,
            seeds=env.get("seeds"), torch=e.get("torch"), python=e.get("python"),
            threads_per_run=p.get("torch_threads_per_run", 1), workers=p.get("workers"), device=e.get("device"),
            cpu=cpu_model(), run_wall_s=p.get("run_wall_s"), page_wall_s=round(wall, 1),
            computed=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            numerics=_chapter_numerics(units, allow_other=bool(reused)),
            **({"reused_units": n_reused, "reused_run_wall_s": sum(
                float((manifest["chapters"].get(ch.number) or {}).get(k) or 0.0)
                for k in ("run_wall_s", "reused_run_wall_s"))} if reused else {}))
        today = datetime.date.today()
        manifest["release"] = dict(manifest.get("release") or {}, version=today.strftime("%Y.%m.%d"),
                                   date=today.isoformat(), git_commit=commit, code_fingerprint=code_fingerprint(),
                                   torch=e.get("torch"), python=e.get("python"), cpu=cpu_model(),
                                   device=e.get("device"), threads_per_run=p.get("torch_threads_per_run", 1),
                                   numerics=numerics.key())
        write_manifest(manifest, release_dir)
        if release_dir.resolve() == RELEASE_DIR.resolve():
            sync_citation(manifest)
        from . import history  # the release's claims table: this chapter's claims, the others' carried over
        history.record(release_dir, work / "chapters", chapters=[ch.number])
        if release_dir.resolve() == RELEASE_DIR.resolve():
            history.PAGE.write_text(history.page(release_dir))
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            work.parent.rmdir()
        log(f"[bnstudy.study.release] chapter {ch.number}: {len(stems)} tables, {len(units):,} units, {wall / 60:.1f} min")
    return manifest


def _chapter_numerics(units: list[dict], allow_other: bool = False) -> dict:
    """This process's numeric environment (:func:`bnstudy.study.numerics.record`, with ``key``), which the chapter's
    units were computed under. Raises ``RuntimeError`` if a unit records another (two environments never mix in one
    table), unless ``allow_other`` (reused units): then ``mixed`` counts the units per environment."""
    from . import numerics
    rec = numerics.record()
    rec["key"] = numerics.key(rec)
    envs = [u.get("numerics") or "unrecorded" for u in units]
    other = sorted(set(envs) - {rec["key"]})
    if other and not allow_other:
        raise RuntimeError(f"release: units computed under numeric environments {other}, not this process's "
                           f"{rec['key']}; recompute them here (they are keyed apart in the run cache)")
    if other:
        rec["mixed"] = {k: envs.count(k) for k in sorted(set(envs))}
    return rec


def sync_citation(manifest: dict, path=REPO / "CITATION.cff", zenodo=REPO / ".zenodo.json",
                  cite_page=REPO / "book" / "cite.md") -> None:
    """Set the release's version and date in ``CITATION.cff``, ``.zenodo.json`` and the BibTeX on ``book/cite.md``
    (a missing ``.zenodo.json`` or ``cite.md`` is skipped)."""
    import re

    from .sweep import atomic_write_bytes
    rel = manifest["release"]
    text = Path(path).read_text()
    text = re.sub(r"(?m)^version: .*$", f'version: "{rel["version"]}"', text)
    text = re.sub(r"(?m)^date-released: .*$", f'date-released: "{rel["date"]}"', text)
    atomic_write_bytes(Path(path), text.encode())
    if Path(zenodo).exists():
        meta = json.loads(Path(zenodo).read_text())
        meta.update(version=rel["version"], publication_date=rel["date"])
        atomic_write_bytes(Path(zenodo), (json.dumps(meta, indent=2, ensure_ascii=False) + "\n").encode())
    if Path(cite_page).exists():
        text = Path(cite_page).read_text()
        text = re.sub(r"(?m)^(\s*version\s*=\s*\{)[^}]*\}", rf"\g<1>{rel['version']}}}", text)
        text = re.sub(r"data release \d{4}\.\d{2}\.\d{2}([;,])", rf"data release {rel['version']}\g<1>", text)
        text = re.sub(r"(?m)^(\s*year\s*=\s*\{)\d{4}\}", rf"\g<1>{rel['date'][:4]}}}", text)
        atomic_write_bytes(Path(cite_page), text.encode())


def _is_wall(name: str) -> bool:
    return str(name).endswith(WALL_COLUMNS_SUFFIX)


def run_state_columns(ch: Chapter, stem: str) -> tuple:
    """Columns of table ``stem`` that record how its run went rather than what it computed (how many units
    were computed rather than read from the cache): a module's ``RUN_STATE_COLUMNS`` (``{sibling: (column,
    ...)}``, e.g. chapter 4's ``{"units": ("computed",)}``). Verification skips them, as it does wall times:
    a verified table is rebuilt from cached units, so they differ by design."""
    sib = stem[len(ch.main) + 1:] if stem.startswith(ch.main + "_") else ""
    return tuple(getattr(ch.experiment(), "RUN_STATE_COLUMNS", {}).get(sib, ()))


def sample_units(candidates: list[int], n: int, seed: int) -> list[int]:
    """``n`` of ``candidates`` (unit indices) drawn at random with ``seed``, sorted."""
    return sorted(random.Random(seed).sample(sorted(candidates), min(n, len(candidates))))


def _size(a, b) -> str:
    try:
        return f" (|difference| {abs(float(a) - float(b)):.3g})"
    except (TypeError, ValueError):
        return ""


def compare_tables(name: str, release, recomputed, limit: int = 20, skip: tuple = ()) -> list[str]:
    """Every cell that differs between two tables (wall-time columns and the run-state columns ``skip`` aside;
    see :func:`run_state_columns`), as ``table row r, column c: a != b``.

    Both tables are compared as CSV gives them back (the recomputed one is written and read once), so the
    comparison is of what a page reads. NaN equals NaN."""
    import io

    import pandas as pd

    if not isinstance(recomputed, pd.DataFrame):
        recomputed = pd.DataFrame(recomputed)
    recomputed = pd.read_csv(io.StringIO(recomputed.to_csv(index=False))) if len(recomputed.columns) else recomputed
    out = []
    if list(release.columns) != list(recomputed.columns):
        return [f"{name}: columns differ: release {list(release.columns)}, recomputed {list(recomputed.columns)}"]
    if len(release) != len(recomputed):
        return [f"{name}: {len(release)} rows in the release, {len(recomputed)} recomputed"]
    for c in release.columns:
        if _is_wall(c) or c in skip:
            continue
        a, b = release[c], recomputed[c]
        same = (a == b) | (a.isna() & b.isna())
        for r in same.index[~same.to_numpy()]:
            va, vb = (v.item() if hasattr(v, "item") else v for v in (a[r], b[r]))
            out.append(f"{name} row {r}, column {c}: release {va!r}, recomputed {vb!r}{_size(a[r], b[r])}")
            if len(out) >= limit:
                return out + [f"{name}: more differences not listed"]
    return out


def compare_rows(name: str, release: dict, recomputed: dict) -> list[str]:
    out = []
    for k in sorted(set(release) | set(recomputed)):
        if _is_wall(k):
            continue
        a, b = release.get(k, "<missing>"), recomputed.get(k, "<missing>")
        if a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b):
            out.append(f"{name}, field {k}: release {a!r}, recomputed {b!r}{_size(a, b)}")
    return out


def chapter_config(ch: Chapter, release_dir=RELEASE_DIR):
    """The chapter's config as its release run made it (the main table's sidecar parameters, profile full)."""
    meta = json.loads((Path(release_dir) / f"{ch.main}.json").read_text())
    rec = meta.get("parameters") or {}
    mod = ch.experiment()
    fields = set(mod.Config.PARAMETERS)
    given = {k: rec[k] for k in fields if k in rec and k != "profile"}
    return mod.make_config(rec.get("profile", "full"), **given), rec


#: The statistical check's error rate per unit: a unit recomputed under other kernels is a new draw of its condition
#: (same seed, other rounding); it fails the check with probability at most this if it is one (Bonferroni over the
#: unit's fields). Fixed before any verification was run: small, because a verification runs about 35 units and a
#: false alarm would block CI; the check is there to catch gross errors (a broken run), the exact check for the rest.
STAT_ALPHA = 0.001
#: Fewest seeds of a condition (other units of its namespace whose config differs only in seed fields) for the
#: statistical check: with fewer, its spread is not estimated and the unit is reported as not checkable.
STAT_MIN_SEEDS = 3


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def condition_of(config: dict) -> str:
    """A unit's condition: its config without the fields that name a seed (``seed``, ``source_seed``, ...), canonical."""
    return json.dumps({k: v for k, v in config.items() if "seed" not in k}, sort_keys=True)


def seed_spread_check(recomputed: dict, peers: list[dict], alpha: float = STAT_ALPHA) -> dict:
    """Whether a recomputed row is a plausible new seed of its condition, given the release's rows of that condition.

    For each numeric field (wall times aside) that varies across the ``peers`` (the condition's rows in the release,
    one per seed, the unit's own included), the row must lie in the two-sided prediction interval for one new draw,
    ``mean +- t(1 - alpha / (2 m), n - 1) * sd * sqrt(1 + 1/n)`` (``n`` peers, ``m`` varying fields: Bonferroni over
    the fields); a field equal in every peer (a design constant, an exact check) must equal it. NaN peers are left out;
    a NaN row value passes only where every peer is NaN.

    Returns ``dict(checked, n, fields, outside)``: ``checked`` False with fewer than :data:`STAT_MIN_SEEDS` peers;
    ``outside`` lists ``"field: value outside [low, high]"``."""
    import math

    from scipy import stats
    n = len(peers)
    if n < STAT_MIN_SEEDS:
        return dict(checked=False, n=n, fields=0, outside=[])
    cols = {}
    for k, v in recomputed.items():
        if _is_wall(k) or not _is_number(v):
            continue
        vals = [p.get(k) for p in peers]
        if not all(_is_number(x) for x in vals):
            continue
        cols[k] = [float(x) for x in vals if not math.isnan(float(x))]
    varying = {k: xs for k, xs in cols.items() if len(set(xs)) > 1}
    m = max(len(varying), 1)
    outside = []
    for k, xs in cols.items():
        v = float(recomputed[k])
        if not xs:
            if not math.isnan(v):
                outside.append(f"{k}: {v!r} where every seed is NaN")
            continue
        if math.isnan(v):
            outside.append(f"{k}: NaN where the seeds are finite")
            continue
        if k not in varying:
            if v != xs[0]:
                outside.append(f"{k}: {v!r} where every seed has {xs[0]!r}")
            continue
        mean, sd, nk = sum(xs) / len(xs), stats.tstd(xs), len(xs)
        half = stats.t.ppf(1 - alpha / (2 * m), nk - 1) * sd * math.sqrt(1 + 1 / nk)
        if not mean - half <= v <= mean + half:
            outside.append(f"{k}: {v:.6g} outside [{mean - half:.6g}, {mean + half:.6g}] (mean {mean:.6g}, sd {sd:.3g},"
                           f" {nk} seeds)")
    return dict(checked=True, n=n, fields=len(cols), outside=outside)


def verify_chapter(ch: Chapter, n: int, seed: int = 0, release_dir=RELEASE_DIR, n_jobs: int | None = None,
                   log=print) -> dict:
    """Recompute ``n`` sampled units of ``ch`` from an empty cache and the chapter's tables from the rest.

    Pass 1 fills a run cache with every recorded unit: the tables made of them must be the release's. Pass 2 leaves
    out ``n`` of the tables' non-source units (drawn with ``seed`` plus the chapter number), computed again from
    scratch. Under the chapter's recorded numeric environment every field and table must be ``==``
    (``mode="exact"``); under another (named in ``environment``) each unit is checked against its condition's seed
    spread (:func:`seed_spread_check`, ``mode="statistical"``).

    Returns ``dict(chapter, mode, environment, sampled, units, tables, retrained, differences, statistical,
    unjudged, checked, wall_s)``; ``differences`` names the chapter, table, row, column and size of every failure."""
    import pandas as pd

    from . import numerics
    from .config import Execution
    from .sweep import UNITS_LOG_ENV, VERIFY_ENV, _canonical, read_units as read_log, unit_threads

    numerics.apply_pin()
    release_dir = Path(release_dir)
    manifest = read_manifest(release_dir)
    units = read_units(units_path(ch, release_dir))
    t0 = time.perf_counter()
    diffs: list[str] = []
    recorded = (manifest.get("chapters", {}).get(ch.number) or {}).get("numerics")
    environment = numerics.differences(recorded, numerics.record())
    if (recorded or {}).get("mixed"):  # units reused from an earlier computation (compute(reuse_units=True))
        environment = [f"its units were computed under {len(recorded['mixed'])} numeric environments ("
                       + ", ".join(f"{n:,} under {k}" for k, n in recorded["mixed"].items()) + ")"] + environment
    mode = "statistical" if environment else "exact"

    def compare(tables, when):
        out = []
        for stem in ch.table_stems():
            if stem not in tables:
                out.append(f"chapter {ch.number}: the code no longer makes table {stem}")
                continue
            rel = pd.read_csv(release_dir / f"{stem}.csv")
            out += [f"chapter {ch.number} ({when}) " + d for d in compare_tables(stem, rel, tables[stem], skip=run_state_columns(ch, stem))]
        return out

    def tables_with(known: Path, log_path: Path | None = None):
        with _environ(**{VERIFY_ENV: str(known), UNITS_LOG_ENV: str(log_path) if log_path else None}):
            return ch.tables(cfg, ex)

    statistical: list[str] = []
    unjudged: list[str] = []
    checked = 0
    with tempfile.TemporaryDirectory(prefix=f"bnstudy-verify-{ch.number}-") as tmp:
        tmp = Path(tmp)
        cfg, rec = chapter_config(ch, release_dir)
        threads = int((manifest.get("chapters", {}).get(ch.number) or {}).get("threads_per_run") or 1)
        ex = Execution(cache_dir=str(tmp / "cache1"), n_jobs=n_jobs, threads=threads, progress=True)
        # pass 1: every recorded unit counts as cached; the units the tables are made of are logged. Under another
        # numeric environment a table cell that the page's own process computes (chapter 2's audits) is not ==
        # either, and cannot be told from a code change: it is listed, not failed (``unjudged``).
        first = compare(tables_with(units_path(ch, release_dir), tmp / "requested.jsonl"), "from the release's units")
        (diffs if mode == "exact" else unjudged).extend(first)
        requested = {(u["namespace"], _canonical(u["config"]), unit_threads(u))
                     for u in read_log(tmp / "requested.jsonl")} if (tmp / "requested.jsonl").exists() else set()
        canon = [(u["namespace"], _canonical(u["config"]), unit_threads(u)) for u in units]
        # candidates: the tables' units at the release's thread count (a thread check's reruns at another count
        # are compared through its table, from their recorded rows)
        candidates = [i for i, u in enumerate(units) if u["namespace"] != "source" and canon[i] in requested
                      and unit_threads(u) == threads]
        picked = sample_units(candidates, n, seed + int(ch.number))
        # pass 2: an empty cache, the sampled units left out of the known rows: they are computed again
        known = tmp / "known.jsonl"
        known.write_text("".join(json.dumps(u) + "\n" for i, u in enumerate(units) if i not in picked))
        ex = Execution(cache_dir=str(tmp / "cache2"), n_jobs=n_jobs, threads=threads, progress=True)
        tables = tables_with(known)
        index = {ns: {_canonical(d["config"]): d["row"] for d in (json.loads(p.read_text())
                                                                  for p in (tmp / "cache2" / ns).glob("*.json"))}
                 for ns in {units[i]["namespace"] for i in picked}}
        peers_of: dict = {}
        for i, u in enumerate(units):
            peers_of.setdefault((u["namespace"], unit_threads(u), condition_of(u["config"])), []).append(u["row"])
        for i in picked:
            u = units[i]
            got = index[u["namespace"]].get(_canonical(u["config"]))
            name = f"chapter {ch.number} unit {i} ({u['namespace']})"
            if got is None:
                diffs.append(f"chapter {ch.number}: sampled unit {i} ({u['namespace']}) was not recomputed")
                continue
            if mode == "exact":
                diffs += compare_rows(name, u["row"], got)
                continue
            res = seed_spread_check(got, peers_of[(u["namespace"], unit_threads(u), condition_of(u["config"]))])
            exact = not compare_rows(name, u["row"], got)
            checked += res["checked"]
            if not res["checked"]:
                statistical.append(f"{name}: not checkable ({res['n']} seeds in its condition)"
                                   + (", == its recorded row" if exact else ""))
            elif res["outside"]:
                diffs += [f"{name}: not a plausible seed of its condition: {o}" for o in res["outside"]]
                statistical.append(f"{name}: {len(res['outside'])} of {res['fields']} fields outside the seed spread "
                                   f"({res['n']} seeds)")
            else:
                statistical.append(f"{name}: all {res['fields']} fields within the seed spread of its {res['n']} seeds"
                                   + (" (and == its recorded row)" if exact else ""))
        # stage-1 sources trained again (no weights ship): their accuracy against the recorded rows
        import torch
        retrained = sorted((tmp / "cache2" / "source").glob("*.pt"))
        sources = [u for u in units if u["namespace"] == "source"]
        for p in retrained:
            doc = json.loads(p.with_suffix(".json").read_text())
            acc = torch.load(p, map_location="cpu", weights_only=True)["task_a_accuracy"]
            name = f"chapter {ch.number} stage-1 source seed {doc['config'].get('seed')}"
            if mode == "exact":
                diffs += compare_rows(name, {"source_task_a_accuracy": doc["row"]["source_task_a_accuracy"]},
                                      {"source_task_a_accuracy": acc})
                continue
            peers = [u["row"] for u in sources if condition_of(u["config"]) == condition_of(doc["config"])]
            res = seed_spread_check({"source_task_a_accuracy": acc}, peers)
            if res["outside"]:
                diffs += [f"{name}: not a plausible seed: {o}" for o in res["outside"]]
            statistical.append(f"{name}: task A accuracy {acc:.4g} " + (
                "not checkable" if not res["checked"] else "outside" if res["outside"] else "within")
                + f" the spread of its {res['n']} seeds")
        if mode == "exact":
            diffs += compare(tables, "with the sample recomputed")
    wall = time.perf_counter() - t0
    how = "compared ==" if mode == "exact" else "checked against their seeds' spread"
    log(f"[bnstudy.study.release] chapter {ch.number}: {len(picked)} of {len(candidates):,} units recomputed and {how} "
        f"({len(retrained)} stage-1 backbones trained again), {len(units):,} recorded, {len(ch.table_stems())} tables "
        f"compared {'twice' if mode == 'exact' else 'once (from the release units)'}, {len(diffs)} differences, "
        f"{wall:.0f} s")
    return dict(chapter=ch.number, mode=mode, environment=environment, sampled=picked, units=len(units),
                tables=len(ch.table_stems()), retrained=len(retrained), differences=diffs, statistical=statistical,
                unjudged=unjudged, checked=checked, wall_s=round(wall, 1))


def verify(chapters=None, n: int = 5, seed: int = 0, release_dir=RELEASE_DIR, n_jobs: int | None = None,
           record: bool = False, log=print) -> int:
    """Verify every released chapter in ``chapters`` (:func:`verify_chapter`, exact or statistical) and log what was
    proven; a difference of the machine alone is never a failure.

    Returns the exit status: 0 (every chapter exact or statistically consistent), 1 (a difference, listed), 2
    (nothing to verify). ``record``: on success write the verification (date, commit, per chapter exact or
    statistical, this machine's numeric environment) into the manifest."""
    from . import numerics

    numerics.apply_pin()
    release_dir = Path(release_dir)
    manifest = read_manifest(release_dir)
    done = [c for c in parse_chapters(chapters) if c.number in manifest.get("chapters", {})]
    if not done:
        log(f"[bnstudy.study.release] nothing to verify: the release in {release_dir} has no chapter among "
            f"{[c.number for c in parse_chapters(chapters)]}")
        return 2
    here = numerics.record()
    log(f"[bnstudy.study.release] this machine: {numerics.describe(here)} [{numerics.key(here)}]")
    results = []
    for c in done:
        r = verify_chapter(c, n, seed, release_dir, n_jobs, log)
        results.append(r)
        if r["mode"] == "statistical":
            log(f"[bnstudy.study.release] chapter {c.number}: checked statistically, not ==, because the numeric environment "
                f"differs from the release's: " + "; ".join(r["environment"]))
            for line in r["statistical"]:
                log(f"    {line}")
            if r["unjudged"]:
                log(f"[bnstudy.study.release] chapter {c.number}: {len(r['unjudged'])} table cells computed in the page's own "
                    "process differ from the release (expected under other kernels; not judged):")
                for line in r["unjudged"]:
                    log(f"    {line[:300]}")
    bad = [r for r in results if r["differences"]]
    for r in bad:
        what = ("differences under the release's own numeric environment (the code computes other rows)"
                if r["mode"] == "exact" else "units outside their seed spread (not explained by the kernels alone)")
        log(f"[bnstudy.study.release] chapter {r['chapter']}: {len(r['differences'])} {what}:")
        for d in r["differences"]:
            log(f"    {d}")
    missing = [c.number for c in parse_chapters(chapters) if c.number not in manifest.get("chapters", {})]
    if missing:
        log(f"[bnstudy.study.release] not in the release yet (not verified): chapters {', '.join(missing)}")
    units = sum(len(r["sampled"]) for r in results)
    exact = [r["chapter"] for r in results if r["mode"] == "exact"]
    stat = [r["chapter"] for r in results if r["mode"] == "statistical" and r["checked"]]
    unchecked = [r["chapter"] for r in results if r["mode"] == "statistical" and not r["checked"]]
    if bad:
        log(f"[bnstudy.study.release] FAILED: {len(bad)} of {len(results)} chapters differ from the release "
            f"({', '.join(r['chapter'] + ' ' + r['mode'] for r in bad)})")
        return 1
    parts = [f"chapters {', '.join(chs)} {what}" for chs, what in (
        (exact, "exactly (every sampled unit and every table == the release, wall times aside)"),
        (stat, "statistically consistent (numeric environment differs; every checkable sampled unit within its "
               "seeds' spread)"),
        (unchecked, "could not be checked statistically (numeric environment differs, and no sampled unit's "
                    f"condition has {STAT_MIN_SEEDS} seeds)")) if chs]
    log(f"[bnstudy.study.release] verified: {units} sampled units in {len(results)} chapters recomputed; "
        + "; ".join(parts) + f"; {sum(r['wall_s'] for r in results):.0f} s")
    if record:
        commit, dirty = git_state()
        manifest = read_manifest(release_dir)
        manifest["release"]["verified"] = dict(
            date=datetime.date.today().isoformat(), git_commit=commit + ("+dirty" if dirty else ""),
            code_fingerprint=code_fingerprint(), units_per_chapter=n, seed=seed,
            chapters=[r["chapter"] for r in results], exact=exact, statistical=stat, unchecked=unchecked,
            cpu=here["cpu"],
            numerics=numerics.key(here), cpu_flags=here["cpu_flags"],
            wall_s=round(sum(r["wall_s"] for r in results), 1))
        write_manifest(manifest, release_dir)
        from . import history
        if (Path(release_dir) / history.CLAIMS_DIR / f"{manifest['release'].get('version')}.csv").is_file():
            history.record(release_dir)  # the history entry notes the verification too
            if Path(release_dir).resolve() == RELEASE_DIR.resolve():
                history.PAGE.write_text(history.page(release_dir))
    return 0


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m bnstudy.study.release", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compute", help="recompute chapters at the full profile and write them into the release")
    c.add_argument("--chapters", default="all", help="comma-separated chapter numbers (default: all)")
    c.add_argument("--n-jobs", type=int, default=None, help="worker processes (default: one per CPU core)")
    c.add_argument("--release-dir", default=str(RELEASE_DIR))
    c.add_argument("--allow-dirty", action="store_true", help=argparse.SUPPRESS)
    c.add_argument("--profile", choices=("full", "quick"), default="full", help="full (the release) or quick (a test)")
    c.add_argument("--reuse-units", action="store_true",
                   help="take the units the release already records as computed and run only the new ones (only "
                        "when their code is unchanged; verify afterwards)")
    v = sub.add_parser("verify", help="recompute a seeded sample of the release's units and compare with ==")
    v.add_argument("--chapters", default="all")
    v.add_argument("--units", type=int, default=5, help="units recomputed per chapter (default 5)")
    v.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    v.add_argument("--n-jobs", type=int, default=None)
    v.add_argument("--release-dir", default=str(RELEASE_DIR))
    v.add_argument("--record", action="store_true", help="on success, record the verification in the manifest")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "compute":
            compute(args.chapters, args.release_dir, args.n_jobs, args.allow_dirty, profile=args.profile,
                    reuse_units=args.reuse_units)
            return 0
        if args.units < 1:
            ap.error(f"--units must be at least 1, got {args.units}")
        return verify(args.chapters, args.units, args.seed, args.release_dir, args.n_jobs, args.record)
    except (ValueError, RuntimeError) as e:
        print(f"[bnstudy.study.release] error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
