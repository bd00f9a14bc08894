"""``bnstudy``: rerun a chapter of the book with your own parameters and read the result as a web page.

    bnstudy list                                   # chapters and their parameters, with defaults
    bnstudy chapter 01 -p seeds 20 --out rerun/    # run chapter 1 with 20 seeds into rerun/
    bnstudy chapter 03 -y "brightness_levels: [0, 2, 4]" --profile quick --out rerun3/

``bnstudy chapter`` executes the chapter notebook with papermill and writes every output under ``--out``:
the executed notebook ``NN-name.ipynb``, its tables ``results/`` (CSV, each with a JSON sidecar of what it
ran with), its figures ``figures/`` (PNG, SVG), and ``NN-name.html``, the executed chapter rendered with
nbconvert, glued numbers filled in, for a person to open offline (MathJax is copied next to it, into
``mathjax/``). Cell outputs and a sweep progress bar stream to the terminal while it runs.

Parameters are checked before the kernel starts: the chapter's ``make_config`` builds its config in this
process, so a bad value fails in seconds with the message the notebook would give. Ctrl-C (SIGINT) or
SIGTERM stops the kernel and its worker processes within seconds and leaves no executed notebook or page
of the unfinished run (a rerun into the same ``--out`` first removes the previous run's page). Finished runs are cached (``--cache-dir``, default ``$BNSTUDY_CACHE_DIR``, else
the checkout's ``.cache/bnstudy`` that ``make`` fills when it exists, else ``~/.cache/bnstudy``), so rerunning with more seeds computes only the new ones.
"""

from __future__ import annotations

import argparse
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
#: Where the HTML page of a rerun finds MathJax, relative to the page.
MATHJAX_DIR = "mathjax"

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
    raise SystemExit(f"bnstudy: unknown chapter {name!r}; choose one of: {allowed}")


def parse_value(text: str):
    """Papermill's ``-p`` typing: ``True``/``False``/``None``, int, float, else the string itself."""
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def collect_parameters(args, defaults: dict) -> dict:
    import yaml

    params: dict = {}
    for path in args.parameters_file or []:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as e:
            raise SystemExit(f"bnstudy: -f {path}: cannot read the file ({e.strerror or e})")
        except yaml.YAMLError as e:
            raise SystemExit(f"bnstudy: -f {path}: not valid YAML: {' '.join(str(e).split())}")
        if not isinstance(loaded, dict):
            raise SystemExit(f"bnstudy: -f {path}: expected a YAML mapping of parameter names to values")
        params.update(loaded)
    for text in args.yaml or []:
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SystemExit(f"bnstudy: -y {text!r} is not valid YAML: {' '.join(str(e).split())}")
        if not isinstance(loaded, dict):
            raise SystemExit(f"bnstudy: -y {text!r}: expected 'name: value', e.g. -y \"brightness_levels: [0, 2, 4]\"")
        params.update(loaded)
    for name, value in args.param or []:
        params[name] = parse_value(value)
    try:
        book.check_parameter_names([k for k in params if k != "profile" and k not in RESERVED],
                                   [k for k in defaults if k not in RESERVED and k != "profile"], "this chapter",
                                   " (the profile: --profile quick|full)")
    except ValueError as e:
        raise SystemExit(f"bnstudy: {e}")
    reserved = sorted(set(params) & set(RESERVED))
    if reserved:
        raise SystemExit(f"bnstudy: {reserved} are set by --out (DIR/results, DIR/figures); do not pass them")
    if "profile" in params:
        raise SystemExit("bnstudy: give the profile as --profile quick|full, not as a parameter")
    return params


def experiment_module(nb_path: Path):
    """The chapter's run module (what ``make_config`` builds), named by its notebook's
    ``from bnstudy.study.experiments.NAME import run, ...`` (a chapter folder: ``bnstudy.study.experiments.NAME.run``) or
    ``from bnstudy.study.experiments import NAME`` line (a single module); ``None`` for a notebook without either."""
    text = Path(nb_path).read_text()
    m = re.search(r"from bnstudy\.study\.experiments\.(\w+) import", text)
    if m:
        return importlib.import_module(f"bnstudy.study.experiments.{m.group(1)}.run")
    m = re.search(r"from bnstudy\.study\.experiments import (\w+)", text)
    return importlib.import_module(f"bnstudy.study.experiments.{m.group(1)}") if m else None


def check_parameters(nb_path: Path, profile: str, defaults: dict, params: dict) -> None:
    """Build the chapter's config here, as its notebook does first, so that a bad value fails before the
    kernel starts (tens of seconds) with the same message: ``make_config(profile, **experiment parameters)``
    and the execution settings (``cache_dir``, ``n_jobs``). Raises what they raise: ``ValueError`` naming
    the parameter and what is allowed. Also checked here: ``cache_dir`` is not an existing file, and a ``rows``
    table exists with its sidecar and checksum and, for a chapter with ``ANALYSIS_PARAMETERS``, as its notebook
    checks it: every other parameter as the run recorded it, each ``SIBLING_TABLES`` table beside it from the
    same commit, checked against the module's ``sibling_parameters(config)`` where it has its own configuration
    (``FileNotFoundError`` / ``ValueError`` from :func:`bnstudy.study.report.rows_or_run`)."""
    from .config import Execution

    try:
        module = experiment_module(nb_path)
    except ImportError:  # a missing extra (e.g. torchvision): the notebook's own import reports it
        return
    if module is None or not hasattr(module, "make_config"):
        return
    values = {**defaults, **params}
    config = module.make_config(profile, **{k: v for k, v in values.items() if k not in EXECUTION_PARAMETERS})
    Execution(cache_dir=values.get("cache_dir"), n_jobs=values.get("n_jobs"))
    cache = values.get("cache_dir")
    if cache is not None and Path(cache).exists() and not Path(cache).is_dir():
        raise ValueError(f"cache_dir (--cache-dir) {cache}: exists and is not a directory; give a directory "
                         f"(created if missing)")
    if values.get("rows") is not None:  # the file, its sidecar and its checksum
        from .report import config_parameters, load_rows, rows_or_run
        if hasattr(module, "ANALYSIS_PARAMETERS"):  # the notebook's own check: parameters and sibling tables
            own = getattr(module, "sibling_parameters", None)  # siblings whose sidecars record their own config
            rows_or_run(values["rows"], None, *config_parameters(config, {**values, "profile": profile},
                                                                 module.ANALYSIS_PARAMETERS),
                        siblings=getattr(module, "SIBLING_TABLES", ()), sibling_parameters=own(config) if own else None,
                        defaults=getattr(module, "READ_DEFAULTS", None))
        else:
            load_rows(values["rows"], {})


# --- rendering the executed notebook for a person: glued values filled into the Markdown ---------------

GLUE_PREFIX = "application/papermill.record/"
_FIGURE = re.compile(r"```\{glue:figure\}\s*(\S+)\s*\n(.*?)```", re.S)
_ROLE = re.compile(r"\{(glue(?::\w*)?|numref|cite(?::\w+)?|ref)\}`([^`]*)`")


def glue_data(nb) -> dict[str, dict]:
    """``{key: mime bundle}`` of every value the notebook glued."""
    out = {}
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                out[name] = {k.removeprefix(GLUE_PREFIX): v for k, v in o.get("data", {}).items()}
    return out


def _figure_markdown(bundle: dict, label: str, caption: str, kind: str, number: int) -> str:
    if "image/png" in bundle:
        body = f'<img alt="{label}" src="data:image/png;base64,{bundle["image/png"]}" style="max-width:100%">'
    elif "text/html" in bundle:
        body = bundle["text/html"]
    else:
        body = f"<pre>{bundle.get('text/plain', '')}</pre>"
    return f'<div id="{label}">\n\n{body}\n\n**{kind} {number}.** {caption.strip()}\n\n</div>\n'


def fill_glue(nb) -> None:
    """Replace ``{glue:*}``, ``{glue:figure}``, ``{numref}`` and ``{cite}`` in Markdown cells with their values."""
    data = glue_data(nb)
    numbers: dict[str, str] = {}
    counts = {"Figure": 0, "Table": 0}

    def figure(m):
        key, rest = m.group(1), m.group(2)
        name = re.search(r"^:name:\s*(\S+)", rest, re.M)
        label = name.group(1) if name else key
        caption = "\n".join(ln for ln in rest.splitlines() if not ln.startswith(":"))
        bundle = data.get(key, {})
        kind = "Figure" if "image/png" in bundle else "Table"
        counts[kind] += 1
        numbers[label] = f"{kind} {counts[kind]}"
        return _figure_markdown(bundle, label, caption, kind, counts[kind])

    def role(m):
        kind, text = m.group(1), m.group(2)
        if kind in ("numref", "ref"):
            return f"[{numbers.get(text, text)}](#{text})"
        if kind.startswith("cite"):
            return f"[{text}]"
        if kind == "glue:text":
            key, _, fmt = text.rpartition(":") if ":" in text else (text, "", "")
            raw = data.get(key, {}).get("text/plain", key)
            if not fmt:  # as myst-nb pastes it: an integer stays an integer ("15", not "15.0")
                return str(raw)
            try:
                return format(float(raw), fmt)
            except ValueError:
                return str(raw)
        if kind == "glue:md":
            return data.get(text, {}).get("text/markdown", text)
        return str(data.get(text, {}).get("text/plain", text))

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            src = _FIGURE.sub(figure, cell.source)
            cell.source = src
    for cell in nb.cells:  # second pass: numrefs may point forward
        if cell.cell_type == "markdown":
            cell.source = _ROLE.sub(role, cell.source)
        elif cell.cell_type == "code":  # the glued values are now in the text; nbconvert cannot show them
            cell.outputs = [o for o in cell.get("outputs", []) if not o.get("metadata", {}).get("scrapbook")]


#: nbconvert's "lab" page with nothing loaded from the network: MathJax 3 from the page's folder (configured
#: for the ``$...$`` the chapters write; the stock page configures MathJax 2 from a CDN), and no require.js or
#: mermaid, which the chapters do not use.
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js_mathjax -%}
<script>
window.MathJax = {
  tex: {inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], displayMath: [['$$', '$$'], ['\\\\[', '\\\\]']],
        processEscapes: true, processEnvironments: true, tags: 'ams'},
  options: {ignoreHtmlClass: 'tex2jax_ignore', processHtmlClass: 'tex2jax_process'}
};
</script>
<script defer src="{{ resources.mathjax_url }}"></script>
{%- endblock html_head_js_mathjax -%}
"""

#: The parts of the MathJax 3 distribution the page can load (the combined TeX-to-CHTML file, TeX extensions,
#: CHTML fonts, the menu and its accessibility code), about 5 MB of its 24 MB.
MATHJAX_PARTS = ("tex-chtml.js", "input", "output/chtml", "output/chtml.js", "ui", "a11y", "adaptors")


def copy_mathjax(dest: Path) -> Path:
    """Copy MathJax 3 from the book's offline package (``sphinx-mathjax-offline``) into ``dest``; returns
    ``dest/tex-chtml.js``. Raises ``sphinx.errors.ExtensionError`` naming the package if it is missing."""
    from .sphinxext import mathjax_source

    src = mathjax_source()
    for part in MATHJAX_PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dest / part, dirs_exist_ok=True)
        elif (src / part).exists():
            (dest / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / part, dest / part)
    return dest / "tex-chtml.js"


def render_html(executed: Path, out: Path) -> Path:
    """Render ``executed`` to the HTML file ``out``, hidden cells removed and glue filled in, readable offline:
    figures are embedded, and MathJax is copied next to it (``out``'s folder / :data:`MATHJAX_DIR`)."""
    import tempfile

    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import TagRemovePreprocessor

    nb = nbformat.read(executed, as_version=4)
    fill_glue(nb)
    copy_mathjax(out.parent / MATHJAX_DIR)
    with tempfile.TemporaryDirectory() as tdir:
        (Path(tdir) / "bnstudy_offline.html.j2").write_text(OFFLINE_TEMPLATE)
        exporter = HTMLExporter(template_name="lab", extra_template_paths=[tdir],
                                template_file="bnstudy_offline.html.j2",
                                mathjax_url=f"{MATHJAX_DIR}/tex-chtml.js")
        exporter.register_preprocessor(TagRemovePreprocessor(
            remove_cell_tags=("remove-cell",), remove_input_tags=("remove-input", "hide-input"),
            remove_all_outputs_tags=("remove-output",), enabled=True), enabled=True)
        html, _ = exporter.from_notebook_node(nb)
    out.write_text(html, encoding="utf-8")
    return out


# --- the commands -----------------------------------------------------------------------------------------

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
        check_parameters(nb_path, args.profile, {**defaults, **({"cache_dir": str(args.cache_dir)}
                                                                 if args.cache_dir is not None else {})}, params)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"bnstudy: {e}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    if out.exists() and not out.is_dir():
        print(f"bnstudy: --out {args.out}: exists and is not a directory; give a directory (created if missing)",
              file=sys.stderr)
        return 2
    params.update(results_dir=str(out / "results"), figures_dir=str(out / "figures"))
    if params.get("rows") is not None:  # checked from here; the kernel runs in chapters/, so it gets the full path
        params["rows"] = str(Path(params["rows"]).resolve())
    cache = args.cache_dir
    if cache is None and not os.environ.get("BNSTUDY_CACHE_DIR") and REPO_CACHE.is_dir():
        cache = REPO_CACHE  # the cache `make book` filled in this checkout, so a rerun reuses its runs
    if cache is not None and "cache_dir" in defaults:
        params["cache_dir"] = str(Path(cache).resolve())
    # Nothing in --out may look like the result of this run before it has finished: a partial notebook
    # left by a killed run, or the previous run's page.
    shutil.rmtree(out / book.PARTIAL_DIR, ignore_errors=True)
    page = out / f"{book.page_name(nb_path)}.ipynb"
    for old in (page, page.with_suffix(".html")):
        old.unlink(missing_ok=True)
    print(f"bnstudy: running {nb_path.name} (profile {args.profile}) into {out}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        executed = book.execute_chapter(nb_path, out, args.profile, parameters=params, log_output=not args.quiet)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)
        print(f"\nbnstudy: interrupted ({e or 'SIGINT'}); the kernel and its workers are stopped and no page was "
              f"written. Finished runs are cached: rerun the same command to resume.", file=sys.stderr, flush=True)
        return 128 + signum
    except ValueError as e:
        print(f"bnstudy: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # papermill names the failing cell
        print(f"bnstudy: {nb_path.name} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    lines = [f"executed notebook: {executed}", f"tables:            {out / 'results'}",
             f"figures:           {out / 'figures'}"]
    if not args.no_html:
        html = render_html(executed, executed.with_suffix(".html"))
        lines.append(f"open in a browser: {html}")
    print(f"bnstudy: {nb_path.name} done in {wall:.0f} s\n  " + "\n  ".join(lines), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bnstudy", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    sub = ap.add_subparsers(dest="command", required=True, metavar="{list,chapter}")
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
    ch.add_argument("--no-html", action="store_true", help="skip rendering the executed notebook to HTML")
    ch.add_argument("--quiet", action="store_true", help="do not stream cell outputs and progress")
    ch.set_defaults(func=cmd_chapter)
    return ap


#: Exit statuses of a run stopped by SIGINT or SIGTERM.
INTERRUPTED = (128 + 2, 128 + 15)


def main(argv=None) -> int:
    """The ``bnstudy`` command (``argv``: its arguments; ``None``: ``sys.argv``, as the console script runs it)."""
    args = build_parser().parse_args(argv)
    rc = args.func(args)
    if argv is None and rc in INTERRUPTED:
        # The kernel and its workers are stopped and nothing partial is left. Exit now: the interpreter's own
        # finalization, with torch loaded, took about 10 s more on a loaded 2-core machine.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
