"""``bnstudy``: rerun a chapter of the book with your own parameters and read the result as a web page.

    bnstudy list                                   # chapters and their parameters, with defaults
    bnstudy chapter 01 -p seeds 20 --out rerun/    # run chapter 1 with 20 seeds into rerun/
    bnstudy chapter 03 -y "brightness_levels: [0, 2, 4]" --profile quick --out rerun3/

``bnstudy chapter`` executes the chapter notebook with papermill and writes every output under ``--out``: the
executed notebook ``NN-name.ipynb``, its tables ``results/`` (CSV with JSON sidecars), its figures ``figures/``, and
its page as the published book renders it (``book/_build/html/chapters/NN-name.html``, offline; ``NN-name.html``
beside the notebook opens it). Before any training it says how many runs it will compute, the expected time and
where the run cache is.

Parameters are checked before the kernel starts, with the message the notebook would give. Ctrl-C or SIGTERM stops
the kernel and its workers and leaves no page of the unfinished run. Finished runs are cached (``--cache-dir``, else
``$BNSTUDY_CACHE_DIR``, else the checkout's ``.cache/bnstudy`` when it exists, else ``~/.cache/bnstudy``), so
rerunning with more seeds computes only the new ones.

Exit status: 0 done; 2 a usage error (one line on stderr before anything runs); 1 a run that failed; 128 + the
signal number when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import shutil
import sys
import time
from pathlib import Path

from . import book

RESERVED = ("results_dir", "figures_dir")  # set from --out
#: Notebook parameters that are not the experiment's config: the profile, where outputs go, how runs execute,
#: and ``rows`` (an earlier run's results CSV to analyse again instead of running; bnstudy.study.report.load_rows).
EXECUTION_PARAMETERS = ("profile", "results_dir", "figures_dir", "cache_dir", "n_jobs", "rows")
#: Exit status of a usage error, as argparse's own (``parser.error``); a run that failed exits 1.
USAGE = 2


class UsageError(Exception):
    """A one-line usage error (``"bnstudy: ..."``): :func:`main` prints it and returns :data:`USAGE`."""


#: The run cache `make` uses in this checkout (Makefile: BNSTUDY_CACHE_DIR ?= $(CURDIR)/.cache/bnstudy).
REPO_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "bnstudy"


def chapters() -> dict[str, Path]:
    """``{"01": chapters/01_freeze_modes.ipynb, ...}``."""
    return {p.stem[:2]: p for p in book.chapter_paths()}


def resolve_chapter(name: str) -> Path:
    """A chapter notebook from ``01``, ``1``, ``01_freeze_modes``, ``01-freeze-modes`` or ``freeze_modes``."""
    table = chapters()
    key = name.strip().replace("-", "_").removesuffix(".ipynb")
    for num, path in table.items():
        stem = path.stem
        if key in (num, stem, stem[3:]) or (key.isdigit() and int(key) == int(num)):
            return path
    allowed = ", ".join(f"{n} ({p.stem})" for n, p in table.items())
    raise UsageError(f"bnstudy: unknown chapter {name!r}; choose one of: {allowed}")


def parse_value(text: str):
    """Papermill's ``-p`` typing: ``True``/``False``/``None``, int, float, else the string itself."""
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    for cast in (int, float):
        with contextlib.suppress(ValueError):
            return cast(text)
    return text


def collect_parameters(args, defaults: dict) -> dict:
    import yaml

    params: dict = {}
    for path in args.parameters_file or []:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as e:
            raise UsageError(f"bnstudy: -f {path}: cannot read the file ({e.strerror or e})")
        except yaml.YAMLError as e:
            raise UsageError(f"bnstudy: -f {path}: not valid YAML: {' '.join(str(e).split())}")
        if not isinstance(loaded, dict):
            raise UsageError(f"bnstudy: -f {path}: expected a YAML mapping of parameter names to values")
        params.update(loaded)
    for text in args.yaml or []:
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise UsageError(f"bnstudy: -y {text!r} is not valid YAML: {' '.join(str(e).split())}")
        if not isinstance(loaded, dict):
            raise UsageError(f"bnstudy: -y {text!r}: expected 'name: value', e.g. -y \"brightness_levels: [0, 2, 4]\"")
        params.update(loaded)
    for name, value in args.param or []:
        params[name] = parse_value(value)
    try:
        book.check_parameter_names([k for k in params if k != "profile" and k not in RESERVED],
                                   [k for k in defaults if k not in RESERVED and k != "profile"], "this chapter",
                                   " (the profile: --profile quick|full)")
    except ValueError as e:
        raise UsageError(f"bnstudy: {e}")
    reserved = sorted(set(params) & set(RESERVED))
    if reserved:
        raise UsageError(f"bnstudy: {reserved} are set by --out (DIR/results, DIR/figures); do not pass them")
    if "profile" in params:
        raise UsageError("bnstudy: give the profile as --profile quick|full, not as a parameter")
    return params


def experiment_module(nb_path: Path):
    """The chapter's run module (``...experiments.NAME.run`` or the single module ``...experiments.NAME``) its
    notebook imports; ``None`` for a notebook that imports neither."""
    text = Path(nb_path).read_text()
    m = re.search(r"from bnstudy\.study\.experiments\.(\w+) import", text)
    if m:
        return importlib.import_module(f"bnstudy.study.experiments.{m.group(1)}.run")
    m = re.search(r"from bnstudy\.study\.experiments import (\w+)", text)
    return importlib.import_module(f"bnstudy.study.experiments.{m.group(1)}") if m else None


def check_parameters(nb_path: Path, profile: str, defaults: dict, params: dict) -> None:
    """Build the chapter's config, execution settings and ``rows`` check here, as its notebook does first, so that a
    bad value fails before the kernel starts with the same message. Returns the config (``None`` where the module
    cannot be imported here or has no ``make_config``). Raises what they raise: ``ValueError`` naming the parameter
    and what is allowed, ``FileNotFoundError`` for a missing ``rows`` table or sidecar."""
    from .config import Execution

    try:
        module = experiment_module(nb_path)
    except ImportError:  # a missing extra (e.g. torchvision): the notebook's own import reports it
        return None
    if module is None or not hasattr(module, "make_config"):
        return None
    values = {**defaults, **params}
    config = module.make_config(profile, **{k: v for k, v in values.items() if k not in EXECUTION_PARAMETERS})
    Execution(cache_dir=values.get("cache_dir"), n_jobs=values.get("n_jobs"))
    cache = values.get("cache_dir")
    if cache is not None and Path(cache).exists() and not Path(cache).is_dir():
        raise ValueError(f"cache_dir (--cache-dir) {cache}: exists and is not a directory; give a directory "
                         f"(created if missing)")
    from .book import check_output_folders
    check_output_folders({k: values.get(k) for k in ("cache_dir",)})  # --out's folders are the command's own
    if values.get("rows") is not None:  # the file, its sidecar and its checksum
        from .report import chapter_folder, chapter_rows, load_rows
        if hasattr(module, "ANALYSIS_PARAMETERS"):  # the notebook's own check: parameters and sibling tables
            chapter_rows(values["rows"], None, config, {**values, "profile": profile}, module)
        else:
            load_rows(values["rows"], {}, chapter=chapter_folder(module))
    return config


def cache_location(cache_dir=None) -> tuple[Path, str]:
    """``(absolute path, why)`` of the run cache a rerun uses: ``cache_dir``, else ``$BNSTUDY_CACHE_DIR``, else the
    checkout's ``.cache/bnstudy`` when it exists, else :func:`bnstudy.study.sweep.default_cache_dir`."""
    if cache_dir is not None:
        return Path(cache_dir).resolve(), "--cache-dir"
    if os.environ.get("BNSTUDY_CACHE_DIR"):
        return Path(os.environ["BNSTUDY_CACHE_DIR"]).resolve(), "$BNSTUDY_CACHE_DIR"
    if REPO_CACHE.is_dir():
        return REPO_CACHE, "the checkout's .cache/bnstudy, which make fills"
    from .sweep import default_cache_dir
    return default_cache_dir().resolve(), "the default; set $BNSTUDY_CACHE_DIR or --cache-dir to move it"


def run_estimate(nb_path: Path, profile: str, config, params: dict) -> tuple[str, int | None]:
    """``(line, expected runs)`` printed before the kernel starts (:func:`bnstudy.study.estimate.chapter_estimate`;
    nothing to train when ``rows`` are given)."""
    from .estimate import chapter_estimate

    if params.get("rows") is not None:
        return "nothing to train: the notebook analyses the rows given (-p rows)", 0
    if config is None or not hasattr(config, "seeds"):
        return f"{nb_path.stem}: no estimate (its design could not be read here)", None
    workers = params.get("n_jobs") or os.cpu_count() or 1
    return chapter_estimate(nb_path.stem, profile, len(config.seeds), int(workers))


# --- the rerun's page: a one-chapter Jupyter Book with the book's own settings --------------------------------

#: Where the rerun's one-chapter book goes under ``--out``: its sources, and the HTML in ``BOOK_FOLDER/_build/html``.
BOOK_FOLDER = "book"
#: The book's pages a one-chapter book takes along: the references page (``{cite}`` resolves against its
#: ``{bibliography}``). The glossary is left out: it pastes values glued by every other chapter.
RERUN_PAGES = ("book/bibliography.md",)


def book_config(number: str, root: Path = book.BOOK_DIR) -> dict:
    """The book's ``_config.yml`` (``root``) for a one-chapter book of chapter ``number`` (``"04"``): a title naming
    the rerun, figures and tables numbered as the published chapter's (``Fig. 4.1``), no redirects."""
    import yaml

    config = yaml.safe_load((root / "_config.yml").read_text())
    n = int(number)
    config["title"] = f"bnstudy rerun: chapter {n}"
    sphinx = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx.pop("redirects", None)  # the published book's old addresses: their pages are not in a one-chapter book
    sphinx["numfig_format"] = {"figure": f"Fig. {n}.%s", "table": f"Table {n}.%s"}
    return config


#: A value another chapter's page glues (``{glue:text}`01-freeze-modes.ipynb::key:.3f```): not in a one-chapter book.
_OTHER_PAGE_GLUE = re.compile(r"\{glue(?::\w+)?\}`(?:chapters/)?(\d\d)-[\w-]+\.ipynb::[^`]*`")


def mark_other_pages_values(nb, page: str) -> int:
    """Replace, in the Markdown cells of ``nb``, each value glued from a page other than ``page`` (``NN-name``) by
    *[chapter N]* (the one-chapter book lacks that page). Returns how many it replaced."""
    count = 0

    def mark(m):
        nonlocal count
        if m.group(0).split("`")[1].removeprefix("chapters/").startswith(f"{page}.ipynb::"):
            return m.group(0)
        count += 1
        return f"*[chapter {int(m.group(1))}]*"

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _OTHER_PAGE_GLUE.sub(mark, cell.source)
    return count


def build_page(executed: Path, out: Path, quiet: bool = True) -> Path:
    """Build the rerun's page as a one-chapter Jupyter Book in ``out/book`` with the book's settings
    (:func:`book_config`), and ``out/NN-name.html`` that opens it. Returns the built page's path. Raises
    ``RuntimeError`` with the build log's end if ``jupyter-book`` fails."""
    import subprocess

    import yaml

    out, executed = Path(out), Path(executed)
    number, page = executed.stem[:2], executed.stem
    root = out / BOOK_FOLDER
    shutil.rmtree(root, ignore_errors=True)
    (root / "chapters").mkdir(parents=True)
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    mark_other_pages_values(nb, page)
    nbformat.write(nb, root / "chapters" / executed.name)
    for folder in ("results", "figures"):
        if (out / folder).is_dir():
            shutil.copytree(out / folder, root / folder, ignore=shutil.ignore_patterns(".*"))
    for name in ("references.bib", "_static", *RERUN_PAGES):
        src, dst = book.BOOK_DIR / name, root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    (root / "_config.yml").write_text(yaml.safe_dump(book_config(number), sort_keys=False))
    toc = {"format": "jb-book", "root": f"chapters/{page}",
           "parts": [{"caption": "Reference",
                      "chapters": [{"file": Path(p).with_suffix("").as_posix()} for p in RERUN_PAGES]}]}
    (root / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    jb = Path(sys.executable).parent / "jupyter-book"
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root), "--builder", "html", "-n"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    log = root / "build.log"
    log.write_text(res.stdout + res.stderr)
    html = root / "_build" / "html" / "chapters" / f"{page}.html"
    if res.returncode != 0 or not html.exists():
        raise RuntimeError(f"jupyter-book could not build the page ({log}): ...{(res.stdout + res.stderr)[-2000:]}")
    if not quiet:
        warnings = [ln for ln in (res.stdout + res.stderr).splitlines() if "WARNING" in ln]
        print(f"bnstudy: page built ({len(warnings)} build warnings, in {log})", file=sys.stderr, flush=True)
    link = out / f"{page}.html"
    rel = html.relative_to(out).as_posix()
    link.write_text(f'<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
                    f'<meta http-equiv="refresh" content="0; url={rel}"><title>{page}</title></head>\n'
                    f'<body><a href="{rel}">{rel}</a></body></html>\n', encoding="utf-8")
    return html


def cmd_list(args) -> int:
    for num, path in chapters().items():
        print(f"{num}  {path.stem}  (page chapters/{book.page_name(path)}.html)")
        import papermill as pm
        for name, spec in pm.inspect_notebook(str(path)).items():
            if name in RESERVED:
                continue
            help_ = f"  # {spec['help']}" if spec.get("help") else ""
            print(f"      {name} = {spec['default']}{help_}")
    print("\nRun one: bnstudy chapter NN [-p NAME VALUE ...] [-y 'name: [list]'] [--profile quick|full] --out DIR")
    return 0


def cmd_chapter(args) -> int:
    nb_path = resolve_chapter(args.chapter)
    defaults = book.notebook_parameters(nb_path)
    params = collect_parameters(args, defaults)
    try:
        given = {"cache_dir": str(args.cache_dir)} if args.cache_dir is not None else {}
        config = check_parameters(nb_path, args.profile, {**defaults, **given}, params)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"bnstudy: {e}", file=sys.stderr)
        return USAGE
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        print(f"bnstudy: --out {args.out}: exists and is not a directory; give a directory (created if missing)",
              file=sys.stderr)
        return USAGE
    params.update(results_dir=str(out / "results"), figures_dir=str(out / "figures"))
    if params.get("rows") is not None:  # checked from here; the kernel runs in chapters/, so it gets the full path
        params["rows"] = str(Path(params["rows"]).resolve())
    cache, why = cache_location(args.cache_dir)  # the checkout's make cache when it exists: a rerun reuses its runs
    if "cache_dir" in defaults:
        params["cache_dir"] = str(cache)
    # Nothing in --out may look like the result of this run before it has finished: a partial notebook
    # left by a killed run, or the previous run's page.
    shutil.rmtree(out / book.PARTIAL_DIR, ignore_errors=True)
    page = out / f"{book.page_name(nb_path)}.ipynb"
    for old in (page, page.with_suffix(".html")):
        old.unlink(missing_ok=True)
    shutil.rmtree(out / BOOK_FOLDER, ignore_errors=True)
    estimate, expected = run_estimate(nb_path, args.profile, config, params)
    print(f"bnstudy: running {nb_path.name} (profile {args.profile}) into {out}\n"
          f"bnstudy: {estimate}\nbnstudy: run cache: {cache} ({why})", file=sys.stderr, flush=True)
    from .estimate import EXPECTED_RUNS_ENV
    t0 = time.perf_counter()
    try:  # the kernel's one progress display shows the expected total
        with book.environ(**{EXPECTED_RUNS_ENV: str(expected or "")}):
            executed = book.execute_chapter(nb_path, out, args.profile, parameters=params, log_output=not args.quiet)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)
        print(f"\nbnstudy: interrupted ({e or 'SIGINT'}); the kernel and its workers are stopped and no page was "
              f"written. Finished runs are cached: rerun the same command to resume.", file=sys.stderr, flush=True)
        return 128 + signum
    except ValueError as e:  # execute_chapter's refusal of a profile or parameter, before the kernel starts
        print(f"bnstudy: {e}", file=sys.stderr)
        return USAGE
    except Exception as e:  # papermill names the failing cell
        print(f"bnstudy: {nb_path.name} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    lines = [f"executed notebook: {executed}", f"tables:            {out / 'results'}",
             f"figures:           {out / 'figures'}"]
    if not args.no_html:
        try:
            html = build_page(executed, out, quiet=args.quiet)
        except RuntimeError as e:
            print(f"bnstudy: {e}", file=sys.stderr)
            return 1
        lines.append(f"open in a browser: {html}  (or {executed.with_suffix('.html')}, which opens it)")
    print(f"bnstudy: {nb_path.name} done in {wall:.0f} s\n  " + "\n  ".join(lines), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bnstudy", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    sub = ap.add_subparsers(dest="command", required=True, metavar="{list,chapter,figure}")
    sub.add_parser("list", help="list the chapters and their parameters").set_defaults(func=cmd_list)
    ch = sub.add_parser("chapter", help="rerun one chapter with other parameters",
                        description="Rerun one chapter; every output goes under --out.")
    ch.add_argument("chapter", help="chapter number (01) or name (01_freeze_modes); see `bnstudy list`")
    ch.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                    help="a parameter (numbers, True/False/None are typed as papermill does)")
    ch.add_argument("-y", "--yaml", action="append", metavar="YAML",
                    help="parameters as YAML, for lists: -y \"brightness_levels: [0.0, 2.0]\"")
    ch.add_argument("-f", "--parameters-file", action="append", metavar="FILE", help="parameters from a YAML file")
    ch.add_argument("--profile", choices=book.PROFILES, default="quick",
                    help="quick (minutes, 2-3 seeds) or full (the published book); default quick")
    ch.add_argument("--out", required=True, metavar="DIR", help="folder for every output of the rerun")
    ch.add_argument("--cache-dir", metavar="DIR", default=None,
                    help="run cache (default $BNSTUDY_CACHE_DIR, else the checkout's .cache/bnstudy that make fills, "
                         "else ~/.cache/bnstudy); e.g. DIR/cache to keep it apart")
    ch.add_argument("--no-html", action="store_true", help="skip building the page (a one-chapter Jupyter Book)")
    ch.add_argument("--quiet", action="store_true", help="do not stream cell outputs and progress")
    ch.set_defaults(func=cmd_chapter)
    fg = sub.add_parser("figure", help="remake one figure from the data release (seconds; nothing trained)",
                        description="Remake one figure of the book from the data release's rows, without executing "
                                    "its chapter: python -m bnstudy.study.figure (bnstudy.study.figure).")
    fg.add_argument("number", nargs="?", help="the figure's number on its page, e.g. 4.2; --list lists them")
    fg.add_argument("--out", default="remake", metavar="DIR", help="folder for figures/ and results/ (default remake)")
    fg.add_argument("--release", default=None, metavar="DIR", help="the data release (default the checkout's release/)")
    fg.add_argument("--list", action="store_true", help="list every figure's number, label and file")
    fg.set_defaults(func=cmd_figure)
    return ap


def cmd_figure(args) -> int:
    from . import figure

    return figure.main(([args.number] if args.number else []) + ["--out", args.out] + (["--list"] if args.list else [])
                       + (["--release", args.release] if args.release else []))


#: Exit statuses of a run stopped by SIGINT or SIGTERM.
INTERRUPTED = (128 + 2, 128 + 15)


def main(argv=None) -> int:
    """The ``bnstudy`` command (``argv``: its arguments; ``None``: ``sys.argv``, as the console script runs it)."""
    args = build_parser().parse_args(argv)  # argparse's own usage errors: SystemExit(2)
    try:
        rc = args.func(args)
    except UsageError as e:  # ours: the same status, the message on one line
        print(e, file=sys.stderr)
        return USAGE
    except book.NotACheckout as e:  # run from an installed wheel: say where the book runs from, no traceback
        print(f"bnstudy: {e}", file=sys.stderr)
        return USAGE
    if argv is None and rc in INTERRUPTED:
        # The kernel and its workers are stopped and nothing partial is left. Exit now: the interpreter's own
        # finalization, with torch loaded, took about 10 s more on a loaded 2-core machine.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
