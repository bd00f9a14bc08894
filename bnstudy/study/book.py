"""Execute the book's chapter notebooks with papermill.

``python -m bnstudy.study.book --profile quick`` (``make book``) runs every ``chapters/NN_name.ipynb`` into
``chapters/NN-name.ipynb`` (the page), its tables into ``results/`` and figures into ``figures/`` (all under
``--output-dir DIR`` if given). A notebook is renamed into place only if it ran to the end, so a failed or
interrupted chapter never leaves a complete-looking page, and the command exits non-zero naming it.

The kernel runs in a session of its own, so Ctrl-C would reach only this process and leave its workers orphaned:
while a chapter runs, SIGINT and SIGTERM stop the kernel and every process it started (:func:`stop_processes`) and
raise :class:`Interrupted`; finished runs stay cached. The chapter's full parameters reach the kernel in
``$BNSTUDY_RUN_PARAMETERS`` (JSON) for the tables' sidecars; papermill's injected cell is hidden (``remove-cell``)
and progress lines are dropped from the page.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import re
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path


def _nbformat():
    """nbformat (imported late: ``bnstudy --help``, ``list`` and ``figure`` run without the book's dependencies).
    Raises ``ImportError`` saying what to install."""
    try:
        import nbformat
    except ImportError as e:
        raise ImportError("reading a chapter notebook needs nbformat, one of the book's dependencies: "
                          "pip install 'bnstudy[book]' (or run `make venv` in a checkout)") from e
    return nbformat


@contextmanager
def environ(**values):
    """Set (a value) or unset (``None``) environment variables for the ``with`` block, then restore them."""
    def put(items):
        for k, v in items:
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    old = {k: os.environ.get(k) for k in values}
    try:
        put(values.items())
        yield
    finally:
        put(old.items())


REPO = Path(__file__).resolve().parents[2]
CHAPTERS_DIR = REPO / "chapters"
BOOK_DIR = REPO  # the book's root: _config.yml and _toc.yml are at the top level
EXECUTED_DIR = BOOK_DIR / "chapters"


def toc_files(root: Path = BOOK_DIR) -> list[str]:
    """Every file the table of contents (``root/_toc.yml``) names, root first, without suffix, relative to ``root``:
    ``["book/index", "chapters/01-freeze-modes", ..., "book/bibliography"]``."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part.get("chapters", [])]
    return files


def redirects(root: Path = BOOK_DIR) -> dict[str, str]:
    """``_config.yml``'s redirects (sphinx-reredirects): ``{old docname: new address relative to the old page}``,
    e.g. ``{"guide": "book/guide.html"}``; ``{}`` when none are configured."""
    import yaml

    config = yaml.safe_load((root / "_config.yml").read_text())
    return dict(((config.get("sphinx") or {}).get("config") or {}).get("redirects") or {})


def book_sources(root: Path = BOOK_DIR) -> list[Path]:
    """The book's committed sources under ``root`` (config, table of contents, its pages other than the executed
    chapters, ``references.bib``, ``_static/``, ``_templates/``). Raises ``FileNotFoundError`` naming a page the
    table of contents lists but the root lacks."""
    out = [root / "_config.yml", root / "_toc.yml", root / "references.bib", root / "_static", root / "_templates"]
    for f in toc_files(root):
        if f.startswith("chapters/"):
            continue  # executed by papermill, not a source
        hit = [p for p in (root / f"{f}.md", root / f"{f}.ipynb") if p.exists()]
        if not hit:
            raise FileNotFoundError(f"_toc.yml names {f!r}, but {root} has no {f}.md")
        out.append(hit[0])
    return out


PROFILES = ("quick", "full")
PARTIAL_DIR = ".partial"


class NotACheckout(FileNotFoundError):
    """No ``chapters/``: the code runs from an installed wheel (the library only). The commands print its message
    and exit 2."""


def chapter_paths(chapters_dir: Path = CHAPTERS_DIR) -> list[Path]:
    """The chapter notebooks ``NN_*.ipynb`` in ``chapters_dir``, sorted. Raises :class:`NotACheckout` when none."""
    found = sorted(p for p in Path(chapters_dir).glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise NotACheckout(f"no chapter notebooks in {chapters_dir}: the book's chapters, figures and release run "
                                "from a checkout of the repository (git clone https://github.com/bnstudy/bnstudy), "
                                "not from an installed wheel, which holds the practitioner's library only")
    return found


def page_name(notebook) -> str:
    """The executed notebook's stem, and so its page's URL: ``01_freeze_modes.ipynb`` -> ``01-freeze-modes``."""
    return Path(notebook).stem.replace("_", "-")


def notebook_parameters(notebook) -> dict:
    """The chapter's parameters and their defaults, read from its ``parameters`` cell (values as Python objects)."""
    import papermill as pm

    out = {}
    for name, spec in pm.inspect_notebook(str(notebook)).items():
        try:
            out[name] = ast.literal_eval(spec["default"])
        except (ValueError, SyntaxError):
            out[name] = spec["default"]
    return out


def check_parameter_names(given, allowed, where: str = "this chapter", hint: str = "") -> None:
    """Raise ``ValueError("unknown parameter(s) ['seedz'] for <where> (did you mean 'seeds'?); allowed:
    [...]<hint>")`` for names in ``given`` that ``allowed`` lacks."""
    import difflib

    allowed = sorted(set(allowed))
    unknown = [n for n in dict.fromkeys(given) if n not in set(allowed)]
    if not unknown:
        return
    close = {n: difflib.get_close_matches(n, allowed, n=1, cutoff=0.6) for n in unknown}
    hints = [f"{c[0]!r}" + (f" for {n!r}" if len(unknown) > 1 else "") for n, c in close.items() if c]
    mean = f" (did you mean {', '.join(hints)}?)" if hints else ""
    raise ValueError(f"unknown parameter(s) {sorted(unknown)} for {where}{mean}; allowed: {allowed}{hint}")


def assigned_names(source: str) -> list[str]:
    """The names a cell's source assigns at top level, in order (``seeds = None`` -> ``["seeds"]``). Raises
    ``SyntaxError`` for source that does not parse."""
    names = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return list(dict.fromkeys(names))


#: The first line of the cell papermill injects after a notebook's ``parameters`` cell (its ``-p``/``-y`` values).
INJECTED_HEADER = "# Parameters"


def check_injected_parameters(history=None, where: str = "this notebook") -> None:
    """Refuse a parameter papermill injected but the ``parameters`` cell lacks (papermill only warns); called by
    every chapter's first code cell. ``history``: the executed cells' sources, the running one last (default
    IPython's ``In``). Raises ``ValueError`` from :func:`check_parameter_names`."""
    if history is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return
        history = list(shell.user_ns.get("In", []))
        check_output_folders(shell.user_ns)
    cells = list(history)[:-1]  # the running cell is the last
    injected = [i for i, src in enumerate(cells) if src.lstrip().startswith(INJECTED_HEADER)]
    if not injected or injected[-1] == 0:
        return
    i = injected[-1]
    check_parameter_names(assigned_names(cells[i]), assigned_names(cells[i - 1]), where,
                          " (papermill injected them, but this notebook has no such parameters: its parameters "
                          "cell is the list; `bnstudy list` prints every chapter's)")


#: A chapter's folder parameters: where it writes its tables, its figures and its run cache.
OUTPUT_FOLDERS = ("results_dir", "figures_dir", "cache_dir")


def check_output_folders(values: dict) -> None:
    """Create each folder of :data:`OUTPUT_FOLDERS` given (not ``None``) in ``values`` and check it is writable
    before any work starts. Raises ``ValueError`` naming the parameter, the folder and the reason."""
    for name in OUTPUT_FOLDERS:
        value = values.get(name)
        if value is None:
            continue
        folder = Path(value)
        try:
            if folder.exists() and not folder.is_dir():
                raise NotADirectoryError(20, "exists and is not a directory")
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            why = e.strerror or str(e)
            raise ValueError(f"{name} {str(value)!r}: cannot be used as a folder ({why}); give a folder this "
                             "process can write (created if missing)") from None


PROGRESS_TAG = "(bnstudy progress)"


class Interrupted(KeyboardInterrupt):
    """A chapter run stopped by a signal (``signum``: SIGINT or SIGTERM); its kernel and workers are gone."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def stop_processes(procs, grace_s: float = 3.0) -> list[int]:
    """Stop ``procs`` (``psutil.Process``) and their process groups (the kernel's workers are in the kernel's):
    SIGTERM, then SIGKILL after ``grace_s`` seconds. Returns the pids that had to be killed."""
    import psutil

    procs = [p for p in procs if p.is_running()]
    own = os.getpgid(0)
    groups = set()
    for p in procs:
        with suppress(ProcessLookupError, PermissionError):
            groups.add(os.getpgid(p.pid))
    groups.discard(own)  # never signal this process's own group (the terminal's Ctrl-C group)

    def send(sig):
        for g in groups:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(g, sig)
        for p in procs:
            with suppress(psutil.NoSuchProcess):
                p.send_signal(sig)

    send(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    if alive:
        send(signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in alive]


@contextmanager
def stop_kernel_on_signal(grace_s: float = 3.0):
    """While the block runs (main thread only), SIGINT and SIGTERM stop every process started inside it and raise
    :class:`Interrupted`; a second signal during the clean-up is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        started = [p for p in me.children(recursive=True) if p.pid not in before]
        stop_processes(started, grace_s)
        raise Interrupted(signum)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def hide_injected_parameters(path: Path) -> None:
    """Add ``remove-cell`` to papermill's ``injected-parameters`` cell in ``path`` and drop the progress lines
    (:data:`PROGRESS_TAG`), which belong on the terminal."""
    nb = _nbformat().read(path, as_version=4)
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell["metadata"]["tags"] = tags + ["remove-cell"]
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                kept = [ln for ln in re.split(r"[\r\n]", out["text"]) if ln.strip() and PROGRESS_TAG not in ln]
                if not kept:
                    continue  # progress lines only, or what a closed progress bar leaves behind
                if PROGRESS_TAG in out["text"]:
                    out["text"] = "\n".join(kept) + "\n"
            outputs.append(out)
        cell["outputs"] = outputs
    _nbformat().write(nb, path)


#: Seconds nbclient waits for a finished cell's outputs (its default, 4 s, fails cells on a loaded machine).
IOPUB_TIMEOUT_S = 120


def execute_chapter(notebook: Path, output_dir: Path = EXECUTED_DIR, profile: str = "quick",
                    parameters: dict | None = None, cwd: Path | None = None, log_output: bool = False) -> Path:
    """Execute one chapter with papermill; returns the executed notebook's path, ``output_dir/NN-name.ipynb``.

    ``parameters`` override the notebook's (``profile`` always passed); ``log_output`` streams outputs and progress.
    Raises ``ValueError`` for an unknown profile or parameter (naming the allowed ones), and papermill's
    ``PapermillExecutionError`` if a cell fails (the output is then not written).
    """
    import papermill as pm

    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is not allowed; choose one of {list(PROFILES)}")
    notebook = Path(notebook).resolve()
    params = {"profile": profile, **(parameters or {})}
    defaults = notebook_parameters(notebook)
    check_parameter_names(params, defaults, notebook.name)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    final = output_dir / f"{page_name(notebook)}.ipynb"
    # The partial notebook lives in a hidden folder that the book's exclude_patterns skip, so even a
    # SIGKILLed run leaves nothing the build would read; main() also clears it on start.
    work = output_dir / PARTIAL_DIR
    work.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=work, prefix=f"{notebook.stem}.", suffix=".ipynb")
    os.close(fd)
    # The kernel inherits this process's environment: the full parameters go to the tables' sidecars.
    env = {"BNSTUDY_RUN_PARAMETERS": json.dumps({"chapter": notebook.stem, **defaults, **params}, default=str)}
    if log_output:
        env["BNSTUDY_PROGRESS"] = "1"
    try:
        with environ(**env), stop_kernel_on_signal():
            # iopub_timeout: nbclient waits 4 s by default for a finished cell's last outputs and then fails
            # the cell; on a loaded machine (a release computing beside the build) 4 s is not enough.
            pm.execute_notebook(str(notebook), tmp, parameters=params, kernel_name="python3",
                                cwd=str(cwd or notebook.parent), progress_bar=log_output, log_output=log_output,
                                iopub_timeout=IOPUB_TIMEOUT_S)
        hide_injected_parameters(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        with suppress(OSError):
            work.rmdir()  # only if empty: another run may be writing there
    return final


def record_time(chapter: str, profile: str, wall_s: float, path: Path | None = None) -> Path:
    """Record a chapter's wall time in ``path`` (default ``results/chapter_times.csv``), one row per chapter and profile."""
    import pandas as pd
    from .sweep import atomic_write_bytes

    path = Path(path or BOOK_DIR / "results" / "chapter_times.csv")
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["chapter", "profile", "wall_s", "finished"])
    old = old[~((old["chapter"] == chapter) & (old["profile"] == profile))]
    new = pd.DataFrame([dict(chapter=chapter, profile=profile, wall_s=round(wall_s, 1),
                             finished=time.strftime("%Y-%m-%dT%H:%M:%S"))])
    out = pd.concat([old, new], ignore_index=True) if len(old) else new
    atomic_write_bytes(path, out.to_csv(index=False).encode())
    return path


README = REPO / "README.md"
FINDINGS_START = "<!-- findings: made by `make readme` from the release book's front page; do not edit -->"
FINDINGS_END = "<!-- findings end -->"


def glued_values(chapters_dir) -> dict[str, str]:
    """Every value glued by the executed notebooks (``NN-name.ipynb``) in ``chapters_dir``: ``{key: text}``, the
    payload the page renders: Markdown, else HTML (Styler ids and memory addresses masked), else plain text. The
    identity check of a refactoring (:func:`compare_glued`). Raises ``ValueError`` if ``chapters_dir`` is no folder."""
    folder = Path(chapters_dir)
    if not folder.is_dir():
        raise ValueError(f"glued_values: {folder} is not a folder of executed notebooks (NN-name.ipynb)")
    out = {}
    for path in sorted(folder.glob("[0-9][0-9]-*.ipynb")):
        nb = _nbformat().read(path, as_version=4)
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                name = (o.get("metadata") or {}).get("scrapbook", {}).get("name")
                if name is not None:
                    out[name] = _glued_payload(o.get("data") or {})
    return out


def _glued_payload(data: dict) -> str:
    d = {k.split("application/papermill.record/", 1)[-1]: "".join(v) if isinstance(v, list) else v
         for k, v in data.items()}
    for mime in ("text/markdown", "text/html", "text/plain"):
        if mime in d:
            return re.sub(r"0x[0-9a-f]{6,}", "0x", re.sub(r"T_[0-9a-f]{5}(_\w+)?", "T_x", str(d[mime])))
    return "<image>" if any(k.startswith("image/") for k in d) else "?"


def compare_glued(before: dict, after: dict, prefix: str = "") -> list[str]:
    """The differences between two :func:`glued_values` (keys starting with ``prefix``), one line each: a key
    only before, only after, or with another value (both texts shown); ``[]`` when identical."""
    a = {k: v for k, v in before.items() if k.startswith(prefix)}
    b = {k: v for k, v in after.items() if k.startswith(prefix)}
    return ([f"only before: {k}" for k in sorted(set(a) - set(b))] + [f"only after: {k}" for k in sorted(set(b) - set(a))]
            + [f"changed: {k}: {a[k]!r} -> {b[k]!r}" for k in sorted(set(a) & set(b)) if a[k] != b[k]])


def front_page_findings(html_dir, chapters=None) -> str:
    """The built front page's "What the chapters find" list as Markdown for the README, links pointing into the
    repository. ``html_dir``: a built book; ``chapters``: the numbers (``"01"``) whose bullets to keep (``None``:
    all), the others named in one closing line. Raises ``FileNotFoundError`` without a built front page and
    ``ValueError`` if the page has no such section."""
    from bs4 import BeautifulSoup
    from markdownify import markdownify

    page = Path(html_dir) / "book" / "index.html"
    soup = BeautifulSoup(page.read_text(), "html.parser")
    section = soup.find("section", id="what-the-chapters-find")
    if section is None:
        raise ValueError(f"{page} has no section 'What the chapters find'")
    for h in section.find_all(["h1", "h2", "h3"]):
        h.decompose()
    left_out = []
    if chapters is not None:
        for li in section.find_all("li"):
            a = li.find("a", href=re.compile(r"chapters/\d\d-"))
            number = re.search(r"chapters/(\d\d)-", a["href"]).group(1) if a else None
            if number is not None and number not in set(chapters):
                left_out.append(number)
                li.decompose()
    for a in section.find_all("a"):
        href = a.get("href", "")
        if "headerlink" in (a.get("class") or []):
            a.decompose()
            continue
        if "#" in href and not href.startswith("http"):
            a.unwrap()  # a figure or table reference: its number stays as text
            continue
        # the front page is book/index.html: a chapter is ../chapters/NN-name.html, another page NAME.html
        m = re.match(r"(?:\.\./)?chapters/(\d\d-[\w-]+)\.html$", href)
        if m:
            a["href"] = f"chapters/{m.group(1).replace('-', '_')}.ipynb"
        elif m := re.match(r"(?:\./|\.\./book/)?([\w-]+)\.html$", href):
            a["href"] = f"book/{m.group(1)}.md"
    md = markdownify(str(section), heading_style="ATX", bullets="-", strip=["span", "div", "section"])
    md = re.sub(r"\n{3,}", "\n\n", md).strip().replace("\u00a0", " ")
    if left_out:
        md += ("\n\nChapters " if len(left_out) > 1 else "\n\nChapter ") + ", ".join(str(int(n)) for n in left_out) + \
              (" are" if len(left_out) > 1 else " is") + " not in the data release yet (`release/manifest.json`); " \
              "the book shows " + ("their" if len(left_out) > 1 else "its") + " quick-profile run."
    return md


def released_chapters(release_dir=None) -> list[str]:
    """The chapter numbers in the data release (``release/manifest.json``), sorted; ``[]`` without one."""
    from .manifest import RELEASE_DIR, read_manifest
    return sorted(read_manifest(release_dir or RELEASE_DIR).get("chapters", {}))


def update_readme(html_dir, readme: Path = README, chapters="release") -> bool:
    """Replace the README's findings block with :func:`front_page_findings` (the released chapters' by default);
    True if it changed. Raises ``ValueError`` if the README lacks the block's markers."""
    if chapters == "release":
        chapters = released_chapters()
    from .sweep import atomic_write_bytes
    text = Path(readme).read_text()
    if FINDINGS_START not in text or FINDINGS_END not in text:
        raise ValueError(f"{readme} has no findings block ({FINDINGS_START!r} ... {FINDINGS_END!r})")
    head, rest = text.split(FINDINGS_START, 1)
    _, tail = rest.split(FINDINGS_END, 1)
    new = f"{head}{FINDINGS_START}\n{front_page_findings(html_dir, chapters)}\n{FINDINGS_END}{tail}"
    if new != text:
        atomic_write_bytes(Path(readme), new.encode())
    return new != text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bnstudy.study.book", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=PROFILES, default="quick",
                    help="quick (2-3 seeds, smaller sweeps: about 20 min of one core for the book) or full (published "
                         "book)")
    ap.add_argument("--only", nargs="*", default=None, help="chapter file stems to run (default: all)")
    ap.add_argument("--output-dir", default=str(BOOK_DIR),
                    help="root of the outputs: DIR/chapters (executed notebooks), DIR/results, DIR/figures "
                         "(default: the repository's top level, the book's root)")
    ap.add_argument("--quiet", action="store_true", help="do not stream cell outputs and progress to the terminal")
    ap.add_argument("--release", nargs="?", const="release", default=None, metavar="DIR",
                    help="build the published book: every chapter analyses the data release's tables in DIR "
                         "(default release/; nothing is trained); a chapter not in the release yet runs at the "
                         "quick profile, and its page says so")
    ap.add_argument("--glue-dump", nargs=2, metavar=("CHAPTERS_DIR", "JSON"),
                    help="only write every glued value of the executed notebooks in CHAPTERS_DIR to JSON and exit")
    ap.add_argument("--glue-compare", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="only compare two --glue-dump files (or executed-notebook folders); exit 1 if they differ")
    ap.add_argument("--readme", nargs="?", const=str(BOOK_DIR / "_build" / "html"), default=None, metavar="HTML",
                    help="only rewrite the README's findings from a built book's front page (default "
                         "_build/html, as `make book` leaves it) and exit")
    args = ap.parse_args(argv)
    if args.glue_dump or args.glue_compare:
        def load(x):
            if Path(x).is_dir():
                values = glued_values(x)
            elif Path(x).suffix == ".json" and Path(x).is_file():
                values = json.loads(Path(x).read_text())
            else:
                ap.error(f"{x}: give a folder of executed notebooks (NN-name.ipynb) or a --glue-dump JSON file")
            if not values or not isinstance(values, dict):
                ap.error(f"{x}: no glued values (executed notebooks are NN-name.ipynb, as make book leaves them "
                         f"in chapters/; a dump is a JSON object)")
            return values
    if args.glue_dump:
        from .sweep import atomic_write_bytes
        values = load(args.glue_dump[0])
        atomic_write_bytes(Path(args.glue_dump[1]), (json.dumps(values, indent=0, sort_keys=True) + "\n").encode())
        print(f"[bnstudy.study.book] {len(values)} glued values from {args.glue_dump[0]} -> {args.glue_dump[1]}")
        return 0
    if args.glue_compare:
        a, b = (load(x) for x in args.glue_compare)
        diff = compare_glued(a, b)
        print("\n".join(diff) or f"[bnstudy.study.book] identical: {len(a)} glued values")
        return 1 if diff else 0
    if args.readme is not None:
        changed = update_readme(args.readme)
        print(f"[bnstudy.study.book] README findings {'rewritten' if changed else 'unchanged'} from {args.readme}")
        return 0
    # A kill signal between chapters becomes an ordinary exit; during one, execute_chapter stops the kernel.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out = Path(args.output_dir).resolve()
    shutil.rmtree(out / "chapters" / PARTIAL_DIR, ignore_errors=True)  # left by a SIGKILLed run
    paths = chapter_paths()
    if args.only is not None:
        if not args.only:
            ap.error("--only: name at least one chapter; available: " + ", ".join(p.stem for p in paths))
        unknown = set(args.only) - {p.stem for p in paths}
        if unknown:
            ap.error(f"--only: unknown chapters {sorted(unknown)}; available: {[p.stem for p in paths]}")
        paths = [p for p in paths if p.stem in args.only]
    released = {}
    if args.release is not None:
        from .manifest import read_manifest
        rdir = Path(args.release)  # relative: to the current folder if it is there, else to the repository
        rdir = (rdir if rdir.is_absolute() or (Path.cwd() / rdir / "manifest.json").is_file() else REPO / rdir).resolve()
        if not (rdir / "manifest.json").is_file():
            ap.error(f"--release: no manifest.json in {rdir} (the data release; `make release` computes it)")
        released = {c["notebook"]: c for c in read_manifest(rdir)["chapters"].values()}
    for p in paths:
        t0 = time.perf_counter()
        profile, params = args.profile, dict(results_dir=str(out / "results"), figures_dir=str(out / "figures"))
        if args.release is not None:
            if p.stem in released:
                profile, params["rows"] = released[p.stem]["profile"], str(rdir / f"{p.stem}.csv")
            else:
                profile = "quick"
                print(f"[bnstudy.study.book] {p.stem} is not in the release yet: running it at the quick profile",
                      flush=True)
        print(f"[bnstudy.study.book] {p.name} ({profile}{', release rows' if 'rows' in params else ''}) ...", flush=True)
        try:
            execute_chapter(p, out / "chapters", profile, log_output=not args.quiet, parameters=params)
        except KeyboardInterrupt as e:
            print(f"[bnstudy.study.book] interrupted during {p.name}; finished runs are cached, rerun to resume",
                  file=sys.stderr, flush=True)
            return 128 + getattr(e, "signum", signal.SIGINT)
        except Exception as e:  # papermill's error already names the failing cell
            print(f"[bnstudy.study.book] FAILED: {p.name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
        wall = time.perf_counter() - t0
        record_time(p.stem, "release" if "rows" in params else profile, wall, out / "results" / "chapter_times.csv")
        print(f"[bnstudy.study.book] {p.name} done in {wall:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
