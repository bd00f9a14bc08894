"""Remake one figure of the book from the data release's rows, without executing its chapter (issue 37).

``python -m bnstudy.study.figure 4.2 --out remake/`` writes ``remake/figures/04-gap.png`` (``.svg``, the sidecar
``.json``) and the tables saved on the way into ``remake/results/``, in seconds. The number (the page's
``Fig. 4.2``, the chapter's figures labelled ``fig-chNN-...`` in page order) names a ``{glue:figure}``; the code is
the notebook's own: :func:`figure_program` takes the cell that saves the figure and, from the cells before it, a
backward slice of the statements it needs, run with the notebook's parameters and the release's rows (``glue``
calls are no-ops).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .book import CHAPTERS_DIR, REPO, NotACheckout, assigned_names, chapter_paths, environ

__all__ = ["Figure", "figure_index", "find_figure", "figure_program", "remake", "main"]

#: Names a notebook imports to glue values into its page: a no-op here (returning the value glued, as they do).
GLUE_NAMES = ("glue", "glue_md", "glue_table", "glue_numbers", "glue_chapter", "glue_values", "glue_number",
              "glue_findings", "glue_claims", "glue_summary", "glue_p_texts", "glue_value")
#: Calls kept although they assign nothing: the figure style (``plots.set_style()``) and display options.
STYLE_CALLS = ("set_style", "set_option", "use")
#: Calls that save a table: kept, with what they need, when they come in the figure's own cell.
SAVE_CALLS = ("save_table", "write_sidecar")
#: Calls kept wherever they are: the run line records the parameters the saved tables' sidecars carry.
RECORD_CALLS = ("run_line",)

_DIRECTIVE = re.compile(r"```\{glue:figure\}\s*(\S+)\s*\n((?::[^\n]*\n)*)")
_NAME = re.compile(r"^:name:\s*(\S+)", re.M)
_LABEL = re.compile(r"^fig-ch(\d+)-(.+)$")


@dataclass(frozen=True)
class Figure:
    """One numbered figure of a chapter page: ``number`` (``"4.2"``), ``label`` (``"fig-ch04-gap"``), ``name`` (the
    stable file name, ``"04-gap"``), ``glue_key`` (``"ch04_fig_gap"``) and ``notebook`` (the chapter's source)."""
    number: str
    label: str
    name: str
    glue_key: str
    notebook: Path


def _cells(notebook: Path) -> list[dict]:
    return json.loads(Path(notebook).read_text())["cells"]


def _source(cell: dict) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def figure_index(chapters_dir=CHAPTERS_DIR) -> dict[str, Figure]:
    """Every chapter's numbered figures in page order, ``{"4.2": Figure(...)}``."""
    paths = chapter_paths(Path(chapters_dir))
    return dict(_index(tuple((p, p.stat().st_mtime) for p in paths)))


@functools.lru_cache(maxsize=8)
def _index(notebooks: tuple) -> tuple:
    out = {}
    for nb, _ in notebooks:
        k = 0
        for cell in _cells(nb):
            if cell["cell_type"] != "markdown":
                continue
            for m in _DIRECTIVE.finditer(_source(cell)):
                name = _NAME.search(m.group(2))
                label = _LABEL.match(name.group(1)) if name else None
                if label is None:
                    continue
                k += 1
                number = f"{int(label.group(1))}.{k}"
                out[number] = Figure(number, name.group(1), f"{label.group(1)}-{label.group(2)}", m.group(1), nb)
    return tuple(out.items())


_SAVED = re.compile(r"\{results_dir\}/([\w.-]+\.csv)")


def table_data(label: str, chapters_dir=CHAPTERS_DIR) -> str | None:
    """The CSV (``"04_heads_gap.csv"``) a glued table labelled ``label`` (``tbl-ch04-gap``) is drawn from: the last
    one saved, before the glue, of a variable the glue reads. ``None`` when there is none or no such table."""
    m = re.match(r"^(?:tbl|tab)-ch(\d+)-", label)
    if m is None:
        return None
    nbs = [p for p in chapter_paths(Path(chapters_dir)) if p.name.startswith(f"{int(m.group(1)):02d}_")]
    if not nbs:
        return None
    cells = _cells(nbs[0])
    key = None
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for d in _DIRECTIVE.finditer(_source(cell)):
                name = _NAME.search(d.group(2))
                if name and name.group(1) == label:
                    key = d.group(1)
    if key is None:
        return None
    saved: dict[str, str] = {}   # variable -> the CSV it was saved to, latest first seen
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:
            continue
        for node in tree.body:
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                fname = _fname(call)
                if fname == "save_table" and len(call.args) >= 2 and isinstance(call.args[0], ast.Name):
                    csv = _SAVED.search(ast.get_source_segment(_source(cell), call.args[1]) or "")
                    if csv:
                        saved[call.args[0].id] = csv.group(1)
                elif (fname in GLUE_NAMES and call.args and isinstance(call.args[0], ast.Constant)
                      and call.args[0].value == key):
                    reads = {n.id for a in call.args[1:] for n in ast.walk(a) if isinstance(n, ast.Name)}
                    hits = [csv for var, csv in saved.items() if var in reads]
                    return hits[-1] if hits else None
    return None


def find_figure(number: str, chapters_dir=CHAPTERS_DIR) -> Figure:
    """The figure numbered ``number`` (``"4.2"``; ``"Fig. 4.2"`` and a label ``"fig-ch04-gap"`` are read too).
    Raises ``ValueError`` naming every known number with its label when there is no such figure."""
    index = figure_index(chapters_dir)
    key = re.sub(r"^(fig\.|fig(?=\s)|figure(?=\s))\s*", "", str(number).strip(), flags=re.I)
    found = index.get(key) or {f.label: f for f in index.values()}.get(key)
    if found:
        return found
    known = ", ".join(f"{n} ({f.label})" for n, f in index.items())
    raise ValueError(f"figure: no figure {number!r} in the book; known figures: {known}")


# --- the backward slice ---------------------------------------------------------------------------------------

def _base(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _target_names(t, strong: set, weak: set) -> None:
    if isinstance(t, ast.Name):
        strong.add(t.id)
    elif isinstance(t, (ast.Tuple, ast.List)):
        for e in t.elts:
            _target_names(e, strong, weak)
    elif isinstance(t, ast.Starred):
        _target_names(t.value, strong, weak)
    else:  # x[...] = / x.a = : x is changed, and read
        b = _base(t)
        if b:
            weak.add(b)


def _fname(call: ast.Call) -> str | None:
    """``save_table`` for ``save_table(...)`` and ``report.save_table(...)``."""
    return getattr(call.func, "attr", None) or getattr(call.func, "id", None)


def _called(node) -> str | None:
    """The function a bare call statement ``node`` calls, else ``None``."""
    return _fname(node.value) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else None


@dataclass
class _Stmt:
    node: ast.stmt
    source: str
    defines: set      # names it binds for certain (kills an earlier definition)
    changes: set      # names it may bind or mutate (an earlier definition stays needed)
    reads: set
    saves: bool       # it saves a table (save_table, write_sidecar), alone or in a loop
    stores: set       # every name it stores, at any depth (a loop's own variables)


def _analyse(node: ast.stmt, source: str, modules: set) -> _Stmt:
    strong, weak = set(), set()
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        for a in node.names:
            strong.add((a.asname or a.name).split(".")[0])
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        strong.add(node.name)
    elif isinstance(node, ast.Assign):
        for t in node.targets:
            _target_names(t, strong, weak)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        _target_names(node.target, weak, weak)
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.If, ast.While, ast.Try)):
        for sub in ast.walk(node):  # what a block binds, it may bind: weak
            if isinstance(sub, (ast.Name,)) and isinstance(sub.ctx, ast.Store):
                weak.add(sub.id)
            elif isinstance(sub, (ast.Assign, ast.AugAssign)) and not isinstance(sub, ast.AnnAssign):
                for t in getattr(sub, "targets", [getattr(sub, "target", None)]):
                    b = _base(t) if t is not None else None
                    if b:
                        weak.add(b)
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
        b = _base(node.value.func.value)  # df.drop(..., inplace=True), lst.append(x): a method may mutate its object
        if b and b not in modules:
            weak.add(b)
    # save_table(df := R.table, ...): a walrus binds at the top level too (inside a block: may bind)
    walrus = {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr)}
    (weak if isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.If, ast.While, ast.Try)) else strong).update(walrus)
    reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} | weak
    saves = _calls(node, SAVE_CALLS)
    own = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return _Stmt(node, source, strong, weak, reads, saves, own)


def figure_program(fig: Figure) -> tuple[str, str]:
    """``(parameters, program)`` that remake ``fig``: the notebook's ``parameters`` cell, and the figure's cell up to
    the statement that saves it preceded by the earlier statements it needs, in notebook order. Raises
    ``ValueError`` if no code cell saves the figure or the notebook has no ``parameters`` cell."""
    cells = [c for c in _cells(fig.notebook) if c["cell_type"] == "code"]
    params = [c for c in cells if "parameters" in (c.get("metadata", {}).get("tags") or [])]
    if not params:
        raise ValueError(f"figure: {fig.notebook.name} has no cell tagged 'parameters'")
    literal = re.compile(r"""["']""" + re.escape(fig.name) + r"""["']""")
    where = [i for i, c in enumerate(cells) if literal.search(_source(c))]
    if not where:
        raise ValueError(f"figure: no code cell of {fig.notebook.name} saves {fig.name!r} ({fig.label})")
    target = where[0]
    stmts, modules = [], set()
    for i, c in enumerate(cells[:target + 1]):
        if c is params[0]:
            continue
        src = _source(c)
        tree = ast.parse(src)
        for node in tree.body:
            seg = ast.get_source_segment(src, node)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules |= {(a.asname or a.name).split(".")[0] for a in node.names}
            s = _analyse(node, seg, modules)
            s.cell = i
            stmts.append(s)
    own = [s for s in stmts if s.cell == target]
    last = max(k for k, s in enumerate(own) if literal.search(s.source))
    seeds = set(id(s) for s in own[:last + 1])
    if not _names_data(own[last].node, fig.name) and not any(s.saves for s in own[:last]):
        # save_figure without data= records the table saved last (report.last_table): the notebook's last save
        earlier = [s for s in stmts if s.cell != target and s.saves]
        if earlier:
            seeds.add(id(earlier[-1]))
    keep, needed = set(), set()
    for s in reversed(stmts):
        if s.cell == target and id(s) not in seeds:
            continue
        wanted = (id(s) in seeds or (s.defines | s.changes) & needed
                  or isinstance(s.node, (ast.Import, ast.ImportFrom)) or _called(s.node) in STYLE_CALLS
                  or (s.cell != target and _calls(s.node, RECORD_CALLS)))
        if not wanted:
            continue
        keep.add(id(s))
        needed = (needed - s.defines) | s.reads
    # then the earlier cells' table saves that the kept code can feed (cheap: the CSV a figure names as its data,
    # such as the chapter's rows 04_heads.csv, is saved by the chapter's first cell)
    bound = set(dir(builtins)) | set(assigned_names(_source(params[0])))
    for s in stmts:
        if s.cell != target and id(s) not in keep and s.saves and s.reads - s.stores <= bound:
            keep.add(id(s))
        if id(s) in keep:
            bound |= s.defines | s.changes
    body = "\n".join(s.source for s in stmts if id(s) in keep)
    return _source(params[0]), body


def _names_data(node: ast.stmt, name: str) -> bool:
    """Whether the ``save_figure(fig, name, figures_dir, data)`` call in ``node`` passes its ``data``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and _fname(n) == "save_figure":
            return len(n.args) >= 4 or any(k.arg == "data" for k in n.keywords)
    return True  # a loop or helper that saves it: not ours to second-guess


def _calls(node: ast.stmt, names) -> bool:
    """Whether ``node`` calls a function or method named in ``names`` anywhere inside it."""
    return any(isinstance(n, ast.Call) and _fname(n) in names for n in ast.walk(node))


def _no_glue(key=None, value=None, *args, **kwargs):
    return value


def remake(number: str, out, release=None, chapters_dir=CHAPTERS_DIR, quiet: bool = True) -> dict:
    """Remake figure ``number`` (``"4.2"``) from the data release in ``release`` (default ``release/``) into
    ``out/figures/`` and ``out/results/``. Returns ``{"figure", "label", "png", "data", "seconds"}`` (``data``: the
    CSV the figure was drawn from, or ``None``). Raises ``ValueError`` for an unknown number (listing the known ones)
    or a chapter the release lacks, and whatever the figure's code raises."""
    import contextlib
    import io

    import matplotlib

    matplotlib.use("Agg")
    from .manifest import read_manifest

    fig = find_figure(number, chapters_dir)
    rdir = Path(release) if release is not None else REPO / "release"
    if not (rdir / "manifest.json").is_file():
        raise ValueError(f"figure: no manifest.json in {rdir} (the data release, `release/` of the repository)")
    chapters = {c["notebook"]: c for c in read_manifest(rdir)["chapters"].values()}
    stem = fig.notebook.stem
    if stem not in chapters:
        raise ValueError(f"figure: chapter {stem} is not in the data release in {rdir} (released: "
                         f"{sorted(chapters)}); remake it with `python -m bnstudy.study.book --only {stem}`")
    out = Path(out).resolve()
    for sub in ("figures", "results"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    import matplotlib.pyplot as plt

    from . import report

    params_src, program = figure_program(fig)
    ns: dict = {"__name__": "__bnstudy_figure__"}
    t0 = time.perf_counter()
    exec(compile(params_src, f"{fig.notebook.name}:parameters", "exec"), ns)
    ns.update(profile=chapters[stem]["profile"], rows=str((rdir / f"{stem}.csv").resolve()),
              results_dir=str(out / "results"), figures_dir=str(out / "figures"))
    # the tables' sidecars record what `python -m bnstudy.study.book` records (its $BNSTUDY_RUN_PARAMETERS); the
    # process's own state (the run line's record, the last table, rcParams) is put back afterwards
    run_parameters = {"chapter": stem, **{k: ns[k] for k in assigned_names(params_src)}}
    state = (dict(report._RUN), list(report._SAVED), report.last_table)
    code = ast.parse(program)
    try:
        with (environ(BNSTUDY_RUN_PARAMETERS=json.dumps(run_parameters, default=str)), matplotlib.rc_context(),
              contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext()):
            for node in code.body:  # one statement at a time, so the glue names are stubbed as soon as imported
                exec(compile(ast.Module([node], []), f"{fig.notebook.name}:{fig.label}", "exec"), ns)
                for g in GLUE_NAMES:
                    if callable(ns.get(g)) and ns[g] is not _no_glue:
                        ns[g] = _no_glue
            plt.close("all")
    finally:
        report._RUN.clear()
        report._RUN.update(state[0])
        report._SAVED[:] = state[1]
        report.last_table = state[2]
    seconds = time.perf_counter() - t0
    meta = json.loads((out / "figures" / f"{fig.name}.json").read_text())
    data = out / "results" / meta["data"] if meta.get("data") else None
    return dict(figure=fig.number, label=fig.label, png=out / "figures" / f"{fig.name}.png",
                data=data if data is not None and data.is_file() else None, seconds=seconds)


def command(number: str) -> str:
    """The shell command that remakes figure ``number`` (as the provenance card prints it)."""
    return f"python -m bnstudy.study.figure {number} --out remake/"


#: Each figure's measured remake time (``--all --record``): read by the provenance cards.
TIMES_FILE = Path(__file__).with_name("figure_times.csv")
TIMES_COLUMNS = ("figure", "label", "seconds", "cpus", "measured", "git_commit")


def record_times(out, path=TIMES_FILE, release=None) -> Path:
    """Remake every figure, each by its own command in a fresh process (start and imports count, as for a reader),
    and write ``path``, one row per figure (:data:`TIMES_COLUMNS`; ``seconds``: wall time). Raises ``RuntimeError``
    naming a figure whose command failed, with its error output."""
    import datetime
    import os
    import subprocess

    import pandas as pd

    from .report import git_commit

    rows = []
    for number, f in figure_index().items():
        cmd = [sys.executable, "-m", "bnstudy.study.figure", number, "--out", str(out)]
        if release is not None:
            cmd += ["--release", str(release)]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        seconds = time.perf_counter() - t0
        if res.returncode != 0:
            raise RuntimeError(f"figure {number} ({f.label}): {' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
        rows.append(dict(figure=number, label=f.label, seconds=round(seconds, 1), cpus=os.cpu_count(),
                         measured=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
                         git_commit=git_commit()))
        print(f"Fig. {number}: {seconds:.1f} s", flush=True)
    pd.DataFrame(rows, columns=list(TIMES_COLUMNS)).to_csv(path, index=False)
    return Path(path)


def measured_times(path=TIMES_FILE) -> dict[str, dict]:
    """``{label: row}`` of :data:`TIMES_FILE` (``{}`` without one): each figure's recorded remake time."""
    import pandas as pd

    if not Path(path).is_file():
        return {}
    return {r["label"]: r for r in pd.read_csv(path, dtype={"figure": str}).to_dict("records")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bnstudy.study.figure",
                                 description="Remake one figure of the book from the data release's rows (seconds; "
                                             "nothing trained, no notebook executed).")
    ap.add_argument("number", nargs="?", help="the figure's number on its page, e.g. 4.2 (or its label, "
                                              "fig-ch04-gap); --list lists them")
    ap.add_argument("--out", default="remake", help="folder for figures/ and results/ (default: remake)")
    ap.add_argument("--release", default=None, metavar="DIR", help="the data release (default: the repository's "
                                                                     "release/)")
    ap.add_argument("--list", action="store_true", help="list every figure's number, label and file, and exit")
    ap.add_argument("--verbose", action="store_true", help="show what the chapter's code prints")
    ap.add_argument("--all", metavar="TIMES_CSV", nargs="?", const=str(TIMES_FILE), default=None,
                    help="remake every figure, each by its own command, and record their times in TIMES_CSV "
                         f"(default {TIMES_FILE.relative_to(REPO)}, which the provenance cards read)")
    args = ap.parse_args(argv)
    if args.all is not None and args.number:
        ap.error("--all remakes every figure: give no figure number with it")
    try:
        if args.all is not None:
            print(f"recorded in {record_times(args.out, args.all, args.release)}")
            return 0
        if args.list or not args.number:
            for f in figure_index().values():
                print(f"{f.number:>5}  {f.label:<32} figures/{f.name}.png")
            return 0 if args.list else 2
        r = remake(args.number, args.out, args.release, quiet=not args.verbose)
    except NotACheckout as e:  # run from an installed wheel: one line, no traceback
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"Fig. {r['figure']} ({r['label']}) -> {r['png']}"
          + (f", drawn from {r['data']}" if r["data"] else "") + f" in {r['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
