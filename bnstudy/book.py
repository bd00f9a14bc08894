"""Execute the book's chapter notebooks with papermill.

``python -m bnstudy.book --profile quick`` runs every chapter in
``chapters/`` (``NN_name.ipynb``, in order) into ``book/executed/``; ``make book``
calls it before ``jupyter-book build``. Each chapter runs with the working
directory ``chapters/`` and kernel ``python3``; the executed copy is first
written to a temporary file and renamed into place only if the whole notebook
ran, so a failed or interrupted chapter never leaves a complete-looking
notebook behind, and the command exits non-zero naming the chapter.

Papermill tags the cell it injects ``injected-parameters``; we add
``remove-cell`` to it so readers see the chapter's own short parameter summary
instead of raw code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
CHAPTERS_DIR = REPO / "chapters"
EXECUTED_DIR = REPO / "book" / "executed"
PROFILES = ("quick", "full")
PARTIAL_DIR = ".partial"


def chapter_paths(chapters_dir: Path = CHAPTERS_DIR) -> list[Path]:
    """The chapter notebooks ``NN_*.ipynb`` in ``chapters_dir``, sorted by number."""
    return sorted(p for p in Path(chapters_dir).glob("[0-9][0-9]_*.ipynb"))


def hide_injected_parameters(path: Path) -> None:
    """Add the ``remove-cell`` tag to papermill's ``injected-parameters`` cell in ``path``."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell["metadata"]["tags"] = tags + ["remove-cell"]
    nbformat.write(nb, path)


def execute_chapter(notebook: Path, output_dir: Path = EXECUTED_DIR, profile: str = "quick",
                    parameters: dict | None = None, cwd: Path | None = None) -> Path:
    """Execute one chapter with papermill; returns the executed notebook's path.

    ``parameters`` override the notebook's ``parameters`` cell (``profile`` is
    always passed). Raises ``ValueError`` for an unknown profile and papermill's
    ``PapermillExecutionError`` if a cell fails (the output is then not written).
    """
    import papermill as pm

    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is not allowed; choose one of {list(PROFILES)}")
    notebook = Path(notebook).resolve()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    final = output_dir / notebook.name
    # The partial notebook lives in a hidden folder that the book's exclude_patterns skip, so even a
    # SIGKILLed run leaves nothing the build would read; main() also clears it on start.
    work = output_dir / PARTIAL_DIR
    work.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=work, prefix=f"{notebook.stem}.", suffix=".ipynb")
    os.close(fd)
    try:
        pm.execute_notebook(str(notebook), tmp, parameters={"profile": profile, **(parameters or {})},
                            kernel_name="python3", cwd=str(cwd or notebook.parent), progress_bar=False)
        hide_injected_parameters(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return final


def record_time(chapter: str, profile: str, wall_s: float, path: Path | None = None) -> Path:
    """Record a chapter's wall time in ``book/results/chapter_times.csv`` (one row per chapter and profile)."""
    import pandas as pd
    from .sweep import atomic_write_bytes

    path = Path(path or REPO / "book" / "results" / "chapter_times.csv")
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["chapter", "profile", "wall_s", "finished"])
    old = old[~((old["chapter"] == chapter) & (old["profile"] == profile))]
    new = pd.DataFrame([dict(chapter=chapter, profile=profile, wall_s=round(wall_s, 1),
                             finished=time.strftime("%Y-%m-%dT%H:%M:%S"))])
    out = pd.concat([old, new], ignore_index=True) if len(old) else new
    atomic_write_bytes(path, out.to_csv(index=False).encode())
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bnstudy.book", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=PROFILES, default="quick", help="quick (minutes) or full (published book)")
    ap.add_argument("--only", nargs="*", default=None, help="chapter file stems to run (default: all)")
    ap.add_argument("--output-dir", default=str(EXECUTED_DIR))
    args = ap.parse_args(argv)
    # A kill signal becomes an ordinary exit, so the cleanup in execute_chapter runs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    shutil.rmtree(Path(args.output_dir) / PARTIAL_DIR, ignore_errors=True)  # left by a SIGKILLed run
    paths = chapter_paths()
    if args.only:
        unknown = set(args.only) - {p.stem for p in paths}
        if unknown:
            ap.error(f"--only: unknown chapters {sorted(unknown)}; available: {[p.stem for p in paths]}")
        paths = [p for p in paths if p.stem in args.only]
    for p in paths:
        t0 = time.perf_counter()
        print(f"[bnstudy.book] {p.name} ({args.profile}) ...", flush=True)
        try:
            execute_chapter(p, Path(args.output_dir), args.profile)
        except KeyboardInterrupt:
            print(f"[bnstudy.book] interrupted during {p.name}; finished runs are cached, rerun to resume",
                  file=sys.stderr, flush=True)
            return 130
        except Exception as e:  # papermill's error already names the failing cell
            print(f"[bnstudy.book] FAILED: {p.name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
        wall = time.perf_counter() - t0
        record_time(p.stem, args.profile, wall)
        print(f"[bnstudy.book] {p.name} done in {wall:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
