"""Parallel, cached, resumable sweeps.

:func:`run_sweep` takes a list of run configs (frozen dataclasses such as
:class:`bnstudy.study.config.RunConfig`, or plain dicts), optionally grouped (runs that
execute together, e.g. the freeze modes of one seed in lockstep, see
:mod:`bnstudy.study.engine`), runs the groups in parallel through joblib (processes by
default, one torch thread each) and returns one tidy :class:`pandas.DataFrame`,
one row per config, in the order given.

Every finished run is written to a :class:`RunCache` at once, by the worker
that computed it, atomically (a temporary file renamed into place), under a key
derived from the namespace, the full config and :func:`code_version`. A rerun
skips finished runs; an interrupted sweep (Ctrl-C, a killed worker or a killed
parent) loses nothing that had finished, and the final table reads each config
exactly once from the cache, so nothing is counted twice. A run's numbers depend
on its own config only (never on its group mates: lockstep groups share data
tensors, not arithmetic), so a resumed sweep computes exactly what an
uninterrupted one would.

The joblib backend is :attr:`bnstudy.study.config.Execution.backend`: ``"loky"``
(default, local processes), ``"threading"``, ``"sequential"``, or ``"dask"`` /
``"ray"`` for a cluster (see the README for the client set-up each needs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import socket
import os
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable

import joblib
import pandas as pd
from tqdm import tqdm

from . import numerics

# The book's runs compute under pinned CPU kernels (bnstudy.study.numerics): set before torch's first operation in this
# process, and inherited by every worker process started after this import.
numerics.apply_pin()

#: The package root (``bnstudy/``: the library's modules are hashed too, where a run imports them) and the study
#: machinery's folder (``bnstudy/study/``: its presentation modules and chapter folders).
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_STUDY_DIR = _PACKAGE_DIR / "study"


# Modules that only present results (book runner, CLI, Sphinx extension, report and plot helpers): no run
# computes anything with them, so editing them must not invalidate the run cache.
_PRESENTATION_ONLY = {"book.py", "cli.py", "estimate.py", "sphinxext.py", "report.py", "plots.py", "release.py", "inference.py", "pages.py",
                      "style.py", "pagecheck.py", "words.py", "manifest.py"}
# In a chapter's folder (``experiments/NAME/``): what it claims and what it draws; its ``run.py`` computes rows.
_CHAPTER_PRESENTATION = {"findings.py", "figures.py"}


def code_version(*roots) -> str:
    """A 12-hex-digit hash of the code that runs can execute: part of every run cache key.

    Without ``roots``: every ``.py`` file of the package except the presentation-only modules
    (``_PRESENTATION_ONLY``, and each chapter folder's ``findings.py`` and ``figures.py``). With ``roots`` (the functions and classes a sweep's runs execute: its
    ``run_group`` and its config types, see :func:`namespace_version`): only the code reachable from them, so
    that an edit to a chapter's findings, wording or figures leaves its runs (and every other chapter's) warm:

    * a chapter module (``bnstudy/study/experiments/NAME.py``, or a module of a chapter folder
      ``bnstudy/study/experiments/NAME/``: ``run.py``, and ``findings.py`` / ``figures.py`` if a run reached them)
      contributes the top-level definitions reachable from the roots through the names they use (functions,
      classes, module-level assignments, followed across chapter modules), its import statements and any
      other top-level statement (docstrings aside);
    * every other module of the package that those definitions import (engine, models, tasks, config, ...)
      is hashed whole, and so is everything it imports in turn.

    Changing any code a run can reach therefore invalidates its cached rows instead of silently mixing
    results of two versions; the release's verification (:mod:`bnstudy.study.release`) checks the rows with ``==``.
    """
    h = hashlib.sha256()
    if not roots:
        for p in sorted(_PACKAGE_DIR.rglob("*.py")):
            if _is_presentation(p):
                continue
            h.update(str(p.relative_to(_PACKAGE_DIR)).encode())
            h.update(p.read_bytes())
        return h.hexdigest()[:12]
    for part in _reachable_code(roots):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def namespace_version(run_group: Callable, configs: list) -> str:
    """The code version of a sweep's cache keys: :func:`code_version` of ``run_group`` and the config types of
    ``configs`` (their classes and the classes of dataclass fields inside them, where defined in the package)."""
    roots, seen = [run_group], set()

    def add_types(obj):
        t = type(obj)
        if _is_config(obj) and t not in seen:
            seen.add(t)
            roots.append(t)
            for v in _fields_of(obj).values():
                add_types(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                add_types(v)

    for c in configs[:1]:
        add_types(c)
    return code_version(*roots)


def _module_file(modname: str) -> Path | None:
    """The file of a ``bnstudy`` module name (``bnstudy.study.engine`` -> ``.../engine.py``), or ``None`` if not ours."""
    if modname != "bnstudy" and not modname.startswith("bnstudy."):
        return None
    rel = Path(*modname.split(".")[1:])
    for p in (_PACKAGE_DIR / rel.with_suffix(".py"), _PACKAGE_DIR / rel / "__init__.py"):
        if p.is_file():
            return p
    return None


def _is_chapter_module(path: Path) -> bool:
    """A chapter's module (``experiments/NAME.py``) or a module of a chapter's folder (``experiments/NAME/run.py``,
    ``findings.py``, ``figures.py``): hashed by the definitions a run reaches, not whole."""
    return _STUDY_DIR / "experiments" in path.parents and path.name != "__init__.py"


def _is_presentation(path: Path) -> bool:
    """A module no run executes: the top-level presentation modules and each chapter folder's findings and figures."""
    if path.parent == _STUDY_DIR:
        return path.name in _PRESENTATION_ONLY
    return path.parent.parent == _STUDY_DIR / "experiments" and path.name in _CHAPTER_PRESENTATION


def _resolve(modname: str, level: int, current: str, is_package: bool) -> str:
    if not level:
        return modname
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([modname] if modname else []))


class _ModuleCode:
    """A module's top-level definitions (name -> source, names used) and imports (name -> (module, attr))."""

    def __init__(self, path: Path):
        import ast
        self.path = path
        text = path.read_text()
        tree = ast.parse(text)
        rel = path.relative_to(_PACKAGE_DIR)
        self.name = "bnstudy." + ".".join(rel.with_suffix("").parts)
        is_pkg = path.name == "__init__.py"
        if is_pkg:
            self.name = self.name.rsplit(".", 1)[0]
        self.defs: dict[str, tuple[str, set]] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}
        self.import_text: list[str] = []
        self.other: list[str] = []
        lines = text.splitlines(keepends=True)
        for i, node in enumerate(tree.body):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            seg = "".join(lines[first - 1:node.end_lineno])  # whole lines, decorators included
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = (seg, used)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            old = self.defs.get(n.id, ("", set()))
                            self.defs[n.id] = (old[0] + seg, old[1] | used)
            elif isinstance(node, ast.ImportFrom):
                self.import_text.append(seg)
                mod = _resolve(node.module or "", node.level, self.name, is_pkg)
                for a in node.names:
                    self.imports[a.asname or a.name] = (mod, a.name)
            elif isinstance(node, ast.Import):
                self.import_text.append(seg)
                for a in node.names:
                    self.imports[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
            elif isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) \
                    and isinstance(node.value.value, str):
                continue  # a docstring
            else:
                self.other.append(seg)
                for n in used:  # names a top-level statement uses are reached too
                    self.defs.setdefault(f"<stmt {i}>", ("", set()))[1].add(n)


def _reachable_code(roots) -> list[str]:
    """The code parts :func:`code_version` hashes for ``roots``, in a fixed order."""
    modules: dict[Path, _ModuleCode] = {}
    whole: set[Path] = set()
    picked: dict[Path, set] = {}

    def code(path):
        if path not in modules:
            modules[path] = _ModuleCode(path)
        return modules[path]

    def add_whole(path):
        if path in whole:
            return
        whole.add(path)
        m = code(path)
        for mod, attr in m.imports.values():
            for cand in ([f"{mod}.{attr}"] if attr else []) + [mod]:
                f = _module_file(cand)
                if f is not None:
                    visit_module(f)
                    break

    def visit_module(path):
        if _is_chapter_module(path):
            m = code(path)
            todo = [n for n in m.defs if n.startswith("<stmt")]
            for n in todo:
                visit_name(path, n)
        else:
            add_whole(path)

    def visit_name(path, name):
        m = code(path)
        if not _is_chapter_module(path):
            add_whole(path)
            return
        done = picked.setdefault(path, set())
        if name in done:
            return
        done.add(name)
        if name == next(iter(done)):  # first visit of this chapter module: its other statements count too
            for n in [k for k in m.defs if k.startswith("<stmt")]:
                visit_name(path, n)
        if name in m.defs:
            for used in m.defs[name][1]:
                if used in m.defs:
                    visit_name(path, used)
                elif used in m.imports:
                    mod, attr = m.imports[used]
                    sub = _module_file(f"{mod}.{attr}") if attr else None
                    if sub is not None:  # `from . import engine`: a module
                        visit_module(sub)
                        continue
                    f = _module_file(mod)
                    if f is not None:
                        if attr and _is_chapter_module(f):
                            visit_name(f, attr)
                        else:
                            visit_module(f)

    for r in roots:
        f = _module_file(getattr(r, "__module__", "") or "")
        if f is None:
            continue
        visit_name(f, r.__qualname__.split(".")[0])
    parts = []
    for path in sorted(whole):
        parts.append(f"{path.relative_to(_PACKAGE_DIR)}\n{path.read_text()}")
    for path in sorted(picked):
        m = code(path)
        parts.append(f"{path.relative_to(_PACKAGE_DIR)}: imports\n" + "\n".join(m.import_text))
        parts += [f"{path.relative_to(_PACKAGE_DIR)}: {n}\n{m.defs[n][0]}" for n in sorted(picked[path])
                  if n in m.defs and m.defs[n][0]]
        parts += [f"{path.relative_to(_PACKAGE_DIR)}: statement\n{t}" for t in m.other]
    return parts


def _is_config(obj) -> bool:
    """A dataclass instance or a :class:`bnstudy.study.design.Parameters` (``PARAMETERS`` declared as data)."""
    return not isinstance(obj, type) and (dataclasses.is_dataclass(obj) or isinstance(getattr(type(obj), "PARAMETERS",
                                                                                                None), dict))


def _fields_of(obj) -> dict:
    """A config's ``{name: value}`` in field order (:func:`_is_config`)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return {n: getattr(obj, n) for n in type(obj).PARAMETERS}


def _jsonable(obj):
    if _is_config(obj):
        obj = _fields_of(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def config_key(config, namespace: str, version: str | None = None, environment: str | None = None) -> str:
    """The cache key (40 hex digits) of ``config`` (a dataclass or dict) in ``namespace`` for a code version and a
    numeric environment (``environment``: :func:`bnstudy.study.numerics.key`, default this machine's in the current mode),
    so a row computed under other CPU kernels is never read back as this machine's."""
    payload = json.dumps({"namespace": namespace, "version": version or code_version(),
                          "numerics": environment or numerics.key(), "config": _jsonable(config)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:40]


def default_cache_dir() -> Path:
    """``$BNSTUDY_CACHE_DIR`` if set, else ``~/.cache/bnstudy``."""
    return Path(os.environ.get("BNSTUDY_CACHE_DIR") or Path.home() / ".cache" / "bnstudy")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either absent or complete.

    The bytes go to a temporary file in the same directory, are flushed and
    fsynced, then renamed over ``path`` (``os.replace`` is atomic on POSIX).
    The temporary file is hidden and named ``.<name>.<host>-<pid>.<random>.tmp``:
    it never matches a reader's ``*.json``. A writer killed between the two steps
    (SIGKILL, a lost machine) leaves it behind; :func:`remove_orphan_temporaries`
    deletes it once its writer is gone.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{_writer_tag()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _writer_tag() -> str:
    """``<host>-<pid>`` of this process, with the host's dots and dashes removed so the tag parses back."""
    host = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname()) or "host"
    return f"{host}-{os.getpid()}"


_TEMPORARY = re.compile(r"^\..+\.(?P<host>[A-Za-z0-9]+)-(?P<pid>\d+)\.[^.]+\.tmp$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def remove_orphan_temporaries(directory) -> list[Path]:
    """Delete the temporary files that writers killed mid-write left in ``directory``; return what was deleted.

    A temporary file of :func:`atomic_write_bytes` is an orphan when it was written on this host and its writer's
    process no longer exists. Files of live writers and files written on other hosts (a cache on a shared disk) are
    left alone: their writers may still rename them. A missing ``directory`` deletes nothing.
    """
    directory, here, gone = Path(directory), re.sub(r"[^A-Za-z0-9]", "", socket.gethostname()) or "host", []
    if not directory.is_dir():
        return gone
    for p in directory.glob(".*.tmp"):
        m = _TEMPORARY.match(p.name)
        if m and m["host"] == here and not _alive(int(m["pid"])):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                gone.append(p)
    return gone


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class RunCache:
    """Finished runs on disk: ``<root>/<namespace>/<key>.json``, one file per run."""

    def __init__(self, root, namespace: str, version: str | None = None, environment: str | None = None):
        if not namespace or "/" in namespace:
            raise ValueError(f"namespace must be a non-empty name without '/', got {namespace!r}")
        self.root, self.namespace = Path(root), namespace
        self.version = version or code_version()
        #: The numeric environment the rows are computed under (:func:`bnstudy.study.numerics.key`): part of every key.
        self.environment = environment or numerics.key()
        self.dir = self.root / namespace

    def key(self, config) -> str:
        return config_key(config, self.namespace, self.version, self.environment)

    def path(self, config) -> Path:
        return self.dir / f"{self.key(config)}.json"

    def get(self, config) -> dict | None:
        """The cached row of ``config``, or ``None`` if it has not finished."""
        p = self.path(config)
        if not p.exists():
            return None
        return json.loads(p.read_text())["row"]

    def put(self, config, row: dict) -> None:
        """Store ``row`` for ``config`` atomically."""
        doc = {"namespace": self.namespace, "version": self.version, "numerics": self.environment,
               "config": _jsonable(config), "row": _jsonable(row)}
        atomic_write_bytes(self.path(config), json.dumps(doc).encode())


#: Runs executing now in this process under :func:`torch_threads`, and the torch thread count to restore when the last
#: one ends. torch's intra-op thread count is process-wide, not per Python thread.
_THREADS_LOCK = threading.Lock()
_THREADS_STATE = {"active": 0, "restore": None, "threads": None}


@contextlib.contextmanager
def torch_threads(threads: int):
    """Run the body with ``torch.set_num_threads(threads)``, safely when several runs share one process.

    torch's thread count is process-wide: under a threaded backend (joblib's ``"threading"``, an in-process
    dask cluster) a run that set it and restored it on exit changed it under the runs still executing in
    other threads, and their numbers then depended on timing (intra-op threading changes float summation
    order). Here the first run to enter sets it, the last to leave restores it. Raises ``RuntimeError`` if
    runs executing at the same time ask for different thread counts.
    """
    import torch
    with _THREADS_LOCK:
        st = _THREADS_STATE
        if st["active"] == 0:
            st["restore"], st["threads"] = torch.get_num_threads(), threads
            torch.set_num_threads(threads)
        elif st["threads"] != threads:
            raise RuntimeError(f"threads={threads} requested while runs with threads={st['threads']} execute in "
                               "this process; torch's thread count is process-wide")
        st["active"] += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            st["active"] -= 1
            if st["active"] == 0:
                torch.set_num_threads(st["restore"])


def current_run_threads() -> int | None:
    """The torch thread count that runs executing now in this process set (:func:`torch_threads`), or ``None``."""
    with _THREADS_LOCK:
        return _THREADS_STATE["threads"] if _THREADS_STATE["active"] else None


#: One run at a time per process. torch's state is process-wide (thread count, kernel choice, oneDNN's caches, the
#: default generator): runs in threads of one process (joblib's ``threading`` backend, a dask cluster with
#: ``processes=False``) execute one after another, so their rows are the rows of a sequential run. Parallelism
#: comes from processes.
_RUN_LOCK = threading.Lock()


def _run_group_and_cache(run_group, group_cfgs, cache_root, namespace, version, threads, group_kwargs,
                         environment: dict | None = None):
    # Refuse before computing anything if this worker's kernels are not the ones the keys name (bnstudy.study.numerics).
    if environment is not None:
        numerics.check(environment)
    # The same thread count everywhere: intra-op threading changes float summation order, and
    # long training amplifies rounding, so a run's numbers must not depend on where it ran.
    with _RUN_LOCK, torch_threads(threads):
        rows = run_group(group_cfgs, **group_kwargs)
    if len(rows) != len(group_cfgs):
        raise RuntimeError(f"{getattr(run_group, '__name__', run_group)} returned {len(rows)} rows for "
                           f"{len(group_cfgs)} configs")
    cache = RunCache(cache_root, namespace, version, numerics.key(environment) if environment else None)
    for c, r in zip(group_cfgs, rows):
        cache.put(c, r)
    return len(rows)


#: The distinct units (cache keys) :func:`run_sweep` calls in this process were given, and those of them
#: this process computed: ``{namespace: (computed_keys, all_keys)}``. Read with :func:`sweep_counts`; a page
#: resets it when it starts (:func:`reset_sweep_counts`) and reports at the end whether its wall time is a
#: cold-cache time.
_COUNTS: dict[str, tuple[set, set]] = {}


def sweep_counts() -> dict[str, tuple[int, int]]:
    """``{namespace: (computed, total)}``: the distinct units given to :func:`run_sweep` in this process since
    the last :func:`reset_sweep_counts`, and how many of them this process computed rather than found in the
    run cache. A unit computed by one call and read back by a later one (a stage-1 backbone that several
    sweeps share) counts once, as computed: a cold page is reported cold."""
    return {k: (len(done), len(seen)) for k, (done, seen) in _COUNTS.items()}


def reset_sweep_counts() -> None:
    """Start :func:`sweep_counts` afresh (a chapter calls it when its page starts executing)."""
    _COUNTS.clear()


#: The tag that marks a line as terminal progress (the runner strips tagged lines from the executed notebook).
PROGRESS_TAG = "(bnstudy progress)"
#: See :data:`bnstudy.study.estimate.EXPECTED_RUNS_ENV`.
EXPECTED_RUNS_ENV = "BNSTUDY_EXPECTED_RUNS"
_PROGRESS = {"phase": 0, "runs": 0}


def _progress_phase(n_configs: int) -> tuple[int, int]:
    """This process's next sweep phase: ``(its number from 1, the runs of the phases before it)``."""
    _PROGRESS["phase"] += 1
    before = _PROGRESS["runs"]
    _PROGRESS["runs"] += n_configs
    return _PROGRESS["phase"], before


def run_sweep(configs: list, run_group: Callable[..., list[dict]], *, namespace: str, cache_dir=None,
              execution=None, groups: list[list[int]] | None = None, desc: str | None = None,
              group_kwargs: dict | None = None, version: str | None = None) -> pd.DataFrame:
    """Run every config (skipping cached ones) and return their rows as a DataFrame, in order.

    ``run_group(list_of_configs, **group_kwargs) -> list_of_rows`` must be a module-level
    function (workers import it) that returns one dict per config. ``groups`` (indices into
    ``configs``, each exactly once) says which configs run together in one call (default:
    each alone). ``execution`` (:class:`bnstudy.study.config.Execution`) sets workers
    (``n_jobs``: default the CPU count, 1 on a CUDA machine where one process owns the
    GPU), the joblib backend, progress bars and torch threads per run; ``cache_dir``
    overrides its cache folder. ``version`` fixes the code version used in cache keys
    (default: :func:`namespace_version` of ``run_group`` and the configs' types, computed once at
    the start, so the keys of one sweep cannot change if files are edited while it runs).

    Raises ``ValueError`` for an empty config list or bad ``groups``; errors inside a run
    propagate after the runs finished so far are safely cached.
    """
    from .config import Execution
    ex = execution or Execution()
    if not configs:
        raise ValueError("run_sweep: configs is empty")
    n_jobs = ex.n_jobs
    if n_jobs is None:
        import torch
        n_jobs = 1 if torch.cuda.is_available() else (os.cpu_count() or 1)
    cache_dir = cache_dir if cache_dir is not None else ex.cache_dir
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    want = numerics.expected()
    cache = RunCache(root, namespace, version or namespace_version(run_group, configs), numerics.key(want))
    remove_orphan_temporaries(cache.dir)  # what writers killed mid-write in an earlier sweep left behind
    known = os.environ.get(VERIFY_ENV)
    reused = {}  # config index -> the numeric environment its recorded row was computed under
    if known:  # verifying a release: the recorded rows of every unit not sampled count as cached
        rows_of = _known_rows(known)
        envs = _KNOWN_NUMERICS[str(known)]
        for i, c in enumerate(configs):
            k = (namespace, _canonical(c), ex.threads)
            row = rows_of.get(k)
            if row is not None and cache.get(c) is None:
                cache.put(c, row)
                reused[i] = envs.get(k)
    if groups is None:
        groups = [[i] for i in range(len(configs))]
    elif sorted(i for g in groups for i in g) != list(range(len(configs))):
        raise ValueError("groups must list every config index exactly once")
    missing = [cache.get(c) is None for c in configs]
    pending = [g for g in groups if any(missing[i] for i in g)]
    if known:
        # Verifying a release (bnstudy.study.release.verify): only the sampled units are missing from the cache, and
        # a run's row does not depend on its group mates, so a group computes only its missing configs.
        pending = [[i for i in g if missing[i]] for g in pending]
    done, seen = _COUNTS.setdefault(namespace, (set(), set()))
    keys = [cache.key(c) for c in configs]
    done.update(keys[i] for g in pending for i in g)
    seen.update(keys)
    # $BNSTUDY_PROGRESS (set by `bnstudy chapter` and `python -m bnstudy.study.book`) turns the progress on even
    # where a notebook asked for none: papermill streams it to the terminal, and the runner strips its lines
    # (tagged PROGRESS_TAG) from the executed notebook.
    forced = bool(os.environ.get("BNSTUDY_PROGRESS"))
    n_runs = sum(len(g) for g in pending)
    phase, before = _progress_phase(len(configs))
    if ex.progress or forced:  # before any training: what this phase computes, what is cached, what it costs
        from .estimate import phase_line
        print(phase_line(phase, namespace, n_runs, len(configs) - n_runs, n_jobs, root) + f" {PROGRESS_TAG}",
              file=sys.stderr, flush=True)
    if pending:
        # One display across the run's phases: each phase's bar continues the count of the runs before it, out of
        # the run's expected total ($BNSTUDY_EXPECTED_RUNS, from the release's record) when it is known.
        expected = int(os.environ.get(EXPECTED_RUNS_ENV) or 0)
        bar = tqdm(total=max(expected, before + len(configs)), initial=before + len(configs) - n_runs,
                   desc=f"phase {phase}: {desc or namespace}", unit="run", disable=not (ex.progress or forced),
                   postfix={"cached": len(configs) - n_runs}, mininterval=2.0 if forced else 0.1,
                   bar_format="{l_bar}{bar}{r_bar} " + PROGRESS_TAG if forced else None)
        jobs = (joblib.delayed(_run_group_and_cache)(run_group, [configs[i] for i in g], str(root), namespace,
                                                     cache.version, ex.threads, group_kwargs or {}, want)
                for g in pending)
        # This process computes under the expected kernels unless torch ran an operation before the pin was set
        # (bnstudy.study.numerics); then its runs go to one worker process, which starts pinned.
        here_ok = not numerics.differences(want, numerics.record())
        try:
            if (n_jobs == 1 or len(pending) == 1 or ex.backend == "sequential") and here_ok:
                for fn, args, kwargs in jobs:
                    bar.update(fn(*args, **kwargs))
            else:
                # parallel_config (unlike Parallel(backend=...)) also registers joblib's external
                # backends, "dask" and "ray", on first use.
                if ex.backend == "ray":
                    _register_ray()
                backend, workers = ex.backend, min(n_jobs, len(pending))
                if not here_ok and (backend in ("sequential", "threading", "loky")):
                    # joblib runs n_jobs=1 in this process: use loky's executor itself, whose workers start pinned
                    from joblib.externals.loky import get_reusable_executor
                    pool = get_reusable_executor(max_workers=max(1, workers if backend != "sequential" else 1))
                    for fut in [pool.submit(fn, *args, **kwargs) for fn, args, kwargs in jobs]:
                        bar.update(fut.result())
                    jobs = iter(())
                with joblib.parallel_config(backend=backend, n_jobs=workers), \
                        warnings.catch_warnings():
                    # loky restarts a worker whose memory grew (its leak check) or that idled out, starts a
                    # replacement, and warns that the worker "stopped while some jobs were given": no job is
                    # lost (the queue is kept). Chapter 6's full run printed it into the book page.
                    warnings.filterwarnings("ignore", message=LOKY_RESTART_WARNING, category=UserWarning)
                    for n in _parallel()(jobs):
                        bar.update(n)
        finally:
            bar.close()
    rows = []
    for c in configs:
        row = cache.get(c)
        if row is None:
            raise RuntimeError(f"run_sweep: no cached result for config {c} after the sweep")
        rows.append(row)
    log = os.environ.get(UNITS_LOG_ENV)
    if log:  # a row taken from the known units keeps the environment it was computed under
        record_units(log, namespace, configs, rows, ex.threads,
                     environments=[("unrecorded" if reused[i] is None else reused[i]) if i in reused else None
                                   for i in range(len(configs))] if reused else None)
    return pd.DataFrame(rows)


#: Environment variable naming a JSON-lines file: every unit that :func:`run_sweep` returns in this process is
#: appended to it once (``{"namespace", "config", "row"}``), so a release can ship what its tables were made of
#: (:mod:`bnstudy.study.release`). Unset: nothing is recorded.
UNITS_LOG_ENV = "BNSTUDY_UNITS_LOG"
#: Environment variable set while a release is verified: the path of a units file (JSON lines, as
#: :func:`record_units` writes, or gzipped) whose rows :func:`run_sweep` takes as cached, matched by namespace
#: and config whatever the code version; it computes only the configs missing from it, not the whole lockstep
#: group they belong to.
VERIFY_ENV = "BNSTUDY_VERIFY"
_LOGGED: dict[str, set] = {}
_KNOWN: dict[str, dict] = {}
#: The numeric environment each known unit records (``None``: computed before environments were recorded).
_KNOWN_NUMERICS: dict[str, dict] = {}


def unit_threads(doc: dict) -> int:
    """The torch thread count a recorded unit ran with (1, the default, where the record predates the field)."""
    return int(doc.get("threads", 1))


def _canonical(config) -> str:
    return json.dumps(_jsonable(config), sort_keys=True)


def _known_rows(path) -> dict:
    """``{(namespace, canonical config, threads): row}`` of a units file, read once per process."""
    path = str(path)
    if path not in _KNOWN:
        import gzip
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            docs = [json.loads(line) for line in f if line.strip()]
        _KNOWN[path] = {(d["namespace"], _canonical(d["config"]), unit_threads(d)): d["row"] for d in docs}
        _KNOWN_NUMERICS[path] = {(d["namespace"], _canonical(d["config"]), unit_threads(d)): d.get("numerics")
                                 for d in docs}
    return _KNOWN[path]


def record_units(path, namespace: str, configs: list, rows: list[dict], threads: int = 1,
                 environments: list | None = None) -> int:
    """Append each ``(config, row)`` of ``namespace`` not yet recorded in ``path`` by this process as one JSON line,
    with the torch ``threads`` the runs used (a thread check reruns a config at another count: another unit) and the
    numeric environment it was computed under: this process's, or per config ``environments[i]`` where that is not
    ``None`` (a row reused from an earlier computation keeps its own; ``"unrecorded"`` stands for none recorded).

    Returns how many lines were written. Lines are written whole and flushed; a reader skips a last line cut
    short by a killed process (:func:`read_units`)."""
    path = str(Path(path).resolve())
    seen = _LOGGED.setdefault(path, set())
    lines = []
    here = numerics.key()
    for i, (c, r) in enumerate(zip(configs, rows)):
        env = (environments or [None] * len(configs))[i]
        doc = {"namespace": namespace, "config": _jsonable(c), "row": _jsonable(r), "threads": int(threads),
               "numerics": here if env is None else (None if env == "unrecorded" else env)}
        key = config_key(doc["config"], namespace, f"threads={int(threads)}")
        if key in seen:
            continue
        seen.add(key)
        lines.append(json.dumps(doc))  # key order kept: a row's order is its table's column order
    if lines:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
    return len(lines)


def read_units(path) -> list[dict]:
    """The units recorded in ``path`` (:func:`record_units`), first record of each ``(namespace, config)`` kept;
    a truncated last line (a killed writer) is skipped."""
    out, seen = [], set()
    for line in Path(path).read_text().splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        key = config_key(doc["config"], doc["namespace"], f"threads={unit_threads(doc)}")
        if key not in seen:
            seen.add(key)
            out.append(doc)
    return out


#: The start of loky's warning when it replaces a stopped worker (a regex for ``warnings.filterwarnings``).
LOKY_RESTART_WARNING = "A worker stopped while some jobs were given to the executor"


# --- issue 9: cluster backends -------------------------------------------------------------------------------------

def _register_ray() -> None:
    """Register ray's joblib backend (joblib does not ship it); ``ImportError`` naming the extra if ray is missing."""
    try:
        from ray.util.joblib import register_ray
    except ImportError as e:
        raise ImportError('backend="ray" needs ray: pip install -e ".[ray]" (see the README, "Run on a cluster")') from e
    register_ray()


def _parallel() -> "joblib.Parallel":
    """A ``joblib.Parallel`` yielding results as they finish; for backends that cannot (ray's, ``multiprocessing``:
    "does not support return_as=generator_unordered") one returning them all at the end (every run is still cached
    by its worker as it finishes)."""
    try:
        return joblib.Parallel(return_as="generator_unordered")
    except ValueError as e:
        if "return_as" not in str(e):
            raise
        return joblib.Parallel(return_as="list")
