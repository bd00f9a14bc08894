"""The provenance card under every figure and table of a chapter page (issue 37).

A reader finds, without leaving the page, the rows behind a figure, a checksum proving the file is the one it was
drawn from, whether those rows were re-verified by recomputation, and what remaking the figure or its rows costs.
:func:`card` gathers that from files the build already has (nothing typed by hand): the figure's sidecar (the CSV it
was drawn from), the chapter's per-seed tables in ``results/`` (filtered to the part the figure shows,
:func:`row_filter`), the release record and its last verification, and the recorded times (the per-figure remake,
the chapter's execution, the units' summed ``wall_s``). :func:`card_html` writes it as a folded ``<details>`` block;
:mod:`bnstudy.study.sphinxext` puts one under every labelled figure and table, and
:func:`bnstudy.study.pagecheck.card_problems` checks them.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import html
import json
import re
from pathlib import Path

import pandas as pd

__all__ = ["card", "card_html", "sha256_of", "row_filter", "per_seed_tables", "CARD_CLASS"]

#: The HTML class of a card's ``<details>``; :mod:`bnstudy.study.pagecheck` looks for it.
CARD_CLASS = "bn-provenance"
#: The columns that make a CSV a claims table (:func:`bnstudy.study.inference.claims_table`).
CLAIMS_COLUMNS = frozenset({"key", "estimate", "low", "high", "verdict"})
#: A column with more distinct values than this is a measurement, not a grouping column: never part of a filter.
MAX_LEVELS = 60


def sha256_of(path) -> str:
    """The sha256 (hex) of the file at ``path``'s bytes. Raises ``FileNotFoundError`` if there is none."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@functools.lru_cache(maxsize=256)
def _csv(path: str, mtime: float) -> pd.DataFrame:
    return pd.read_csv(path, low_memory=False)


def _read(path: Path) -> pd.DataFrame:
    return _csv(str(path), path.stat().st_mtime)


def _sidecar(csv: Path) -> dict:
    p = csv.with_suffix(".json")
    try:
        return json.loads(p.read_text()) if p.is_file() else {}
    except json.JSONDecodeError:
        return {}


def per_seed_tables(results_dir, chapter: str) -> list[Path]:
    """The chapter's per-seed tables in ``results_dir``: ``NN_*.csv`` (``chapter`` is ``"04"``) with a ``seed``
    column, the chapter's main table (the shortest name) first. Empty if there are none."""
    out = []
    for p in sorted(Path(results_dir).glob(f"{chapter}_*.csv"), key=lambda q: (len(q.name), q.name)):
        try:
            cols = pd.read_csv(p, nrows=0).columns
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
            continue
        if "seed" in cols:
            out.append(p)
    return out


def _levels(s: pd.Series) -> set[str]:
    return {str(v) for v in s.dropna().unique()}


def row_filter(data: pd.DataFrame, rows: pd.DataFrame) -> dict[str, list[str]]:
    """The filter that selects the part of ``rows`` that ``data`` shows: ``{column: sorted values}`` for each shared
    design column (at most :data:`MAX_LEVELS` values, the same set under every seed) whose values in ``data`` are a
    non-empty strict subset of those in ``rows``. Empty when ``data`` shows every row."""
    out = {}
    for c in data.columns:
        if c == "seed" or c not in rows.columns:
            continue
        have = _levels(rows[c])
        want = _levels(data[c])
        if want and len(have) <= MAX_LEVELS and want < have and _design(rows, c):
            out[c] = sorted(want, key=lambda v: (_num(v) is None, _num(v) or 0.0, v))
    return out


def _design(rows: pd.DataFrame, column: str) -> bool:
    """Whether ``column`` takes the same set of values under every seed of ``rows`` (no ``seed`` column: yes)."""
    if "seed" not in rows.columns:
        return True
    sets = rows.groupby("seed")[column].agg(lambda s: frozenset(_levels(s)))
    return sets.nunique() == 1


def _num(v: str):
    try:
        return float(v)
    except ValueError:
        return None


def _mask(rows: pd.DataFrame, where: dict) -> pd.Series:
    m = pd.Series(True, index=rows.index)
    for c, values in where.items():
        m &= rows[c].map(lambda v: str(v)).isin(set(values))
    return m


def filter_text(where: dict) -> str:
    """``"head in {linear, mlp}, batch_size == 2"``; ``"all rows"`` for an empty filter."""
    if not where:
        return "all rows"
    return ", ".join(f"{c} == {v[0]}" if len(v) == 1 else f"{c} in {{{', '.join(v)}}}" for c, v in where.items())


def _best_table(data: pd.DataFrame, tables: list[Path]) -> Path:
    """The per-seed table holding all of ``data``'s values in most columns, then sharing most columns, then first."""
    def score(p):
        t = _read(p)
        shared = [c for c in data.columns if c in t.columns and c != "seed"]
        return (sum(_levels(data[c]) <= _levels(t[c]) for c in shared), len(shared), -tables.index(p))
    return max(tables, key=score)


@functools.lru_cache(maxsize=32)
def _units_cpu_s(units_file: str, mtime: float) -> tuple[float, int]:
    """``(summed *wall_s of a release's units file in seconds, number of units)``."""
    total, n = 0.0, 0
    with gzip.open(units_file, "rt") as f:
        for line in f:
            unit = json.loads(line)
            n += 1
            total += sum(float(v) for k, v in (unit.get("row") or {}).items()
                         if k.endswith("wall_s") and isinstance(v, (int, float)))
    return total, n


def _chapter_seconds(results_dir: Path, notebook: str) -> float | None:
    p = results_dir / "chapter_times.csv"
    if not p.is_file():
        return None
    t = pd.read_csv(p)
    t = t[t["chapter"] == notebook]
    return float(t["wall_s"].iloc[-1]) if len(t) else None


def _notebook_of(chapter: str, results_dir: Path, manifest: dict) -> str | None:
    if chapter in (manifest.get("chapters") or {}):
        return manifest["chapters"][chapter].get("notebook")
    names = sorted((p.stem for p in results_dir.glob(f"{chapter}_*.csv")), key=len)
    return names[0] if names else None


def card(label: str, srcdir, figures_dir: str = "figures", results_dir: str = "results",
         release_dir: str = "release") -> dict | None:
    """The provenance of the figure or table labelled ``label`` (``fig-chNN-name``, ``tbl-``/``tab-chNN-name``) in the
    book rooted at ``srcdir``; ``None`` if the label is no chapter's figure or table, or the chapter has no per-seed
    table in ``results_dir``.

    Returns a dict: ``label``, ``kind``, ``chapter`` (``"04"``), ``notebook``, ``rows`` (per linked per-seed table:
    ``file``, ``sha256``, ``n_rows``, ``where``, ``n_selected``, ``cpu_s``, ``manifest_sha256``), ``data`` (the
    figure's own CSV or ``None``), ``remake_figure``, ``release``, ``verified``, ``n_verified_chapters``,
    ``chapter_cpu_s`` / ``chapter_units`` (from the release's units file), ``run_wall_s``, ``workers``, ``profile``
    and ``remake_s`` (this build's time to execute the chapter). Raises ``ValueError`` if a figure filters on a
    column its rows lack.
    """
    m = re.match(r"^(fig|tbl|tab)-ch(\d+)-(.+)$", label)
    if m is None:
        return None
    kind, chapter, name = m.group(1).replace("tab", "tbl"), f"{int(m.group(2)):02d}", m.group(3)
    src = Path(srcdir)
    res, figs = src / results_dir, src / figures_dir
    tables = per_seed_tables(res, chapter)
    if not tables:
        return None
    side = _sidecar(tables[0])
    params = side.get("parameters") or {}
    rows_from = params.get("rows_from") or {}
    release = rows_from.get("release")
    rdir = src / release_dir
    rows_path = Path(params["rows"]) if params.get("rows") else None
    if rows_path is not None and not rows_path.is_absolute():  # recorded relative to the repository (report.py)
        rows_path = Path(__file__).resolve().parents[2] / rows_path
    if release and rows_path is not None and (rows_path.parent / "manifest.json").is_file():
        rdir = rows_path.parent  # the release the page's rows were read from
    manifest_path = rdir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if release and manifest_path.is_file() else {}
    notebook = _notebook_of(chapter, res, manifest) or tables[0].stem
    released = [t for t in tables if t.stem in (manifest.get("tables") or {})]
    if released:  # rows read from a release: link its tables, not a per-seed table the page derived from them
        tables = released
    data_name = None
    if kind == "fig":
        meta_path = figs / f"{chapter}-{name}.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        data_name = meta.get("data")
        given = {c: [str(v) for v in vs] for c, vs in (meta.get("where") or {}).items()}
    else:  # a glued table: the saved table it is made from (bnstudy.study.figure.table_data), if any
        from .figure import table_data

        data_name = table_data(label)
        given = {}
        for side_path in sorted(figs.glob(f"{chapter}-*.json")):  # a figure drawn from the same CSV says its where
            meta = json.loads(side_path.read_text())
            if data_name and meta.get("data") == data_name:
                given.update({c: [str(v) for v in vs] for c, vs in (meta.get("where") or {}).items()})
    linked = []
    if data_name and (res / data_name).is_file():
        data_path = res / data_name
        if data_path in tables:
            linked.append((data_path, given))
        else:
            data = _read(data_path)
            best = _best_table(data, tables)
            missing = sorted(set(given) - set(_read(best).columns))
            if missing:
                raise ValueError(f"provenance: figure {label!r} filters its rows on {missing}, which "
                                 f"{best.name} lacks; its columns: {list(_read(best).columns)}")
            # a claims table's columns name the compared condition, not the reference it is paired with (each head
            # against the linear head): no filter from them, only the one the figure states (``where``)
            derived = {} if CLAIMS_COLUMNS <= set(data.columns) else row_filter(data, _read(best))
            linked.append((best, {**derived, **given}))
    else:
        linked = [(t, {}) for t in tables]
    rows = []
    for path, where in linked:
        df = _read(path)
        sel = df[_mask(df, where)] if where else df
        cpu = float(sel["wall_s"].sum()) if "wall_s" in sel.columns else None
        rows.append(dict(file=path.name, sha256=sha256_of(path), n_rows=len(df), where=where, n_selected=len(sel),
                         cpu_s=cpu,
                         manifest_sha256=((manifest.get("tables") or {}).get(path.stem) or {}).get("sha256")))
    chapter_cpu_s = chapter_units = None
    units = (manifest.get("units") or {}).get(notebook) or {}
    if release and units.get("file") and (rdir / units["file"]).is_file():
        f = rdir / units["file"]
        chapter_cpu_s, chapter_units = _units_cpu_s(str(f), f.stat().st_mtime)
    verified = (release or {}).get("verified")
    n_chapters = len((((manifest.get("release") or {}).get("verified")) or {}).get("chapters") or ()) or None
    remake_figure = _remake_figure(label) if kind == "fig" else None
    return dict(label=label, kind=kind, chapter=chapter, notebook=notebook, rows=rows, data=data_name,
                remake_figure=remake_figure,
                release=release, verified=verified, n_verified_chapters=n_chapters, chapter_cpu_s=chapter_cpu_s, chapter_units=chapter_units,
                run_wall_s=rows_from.get("run_wall_s"), workers=rows_from.get("workers"), profile=params.get("profile"),
                remake_s=_chapter_seconds(res, notebook))


def _remake_figure(label: str) -> dict | None:
    """``number``, ``command``, ``seconds``, ``cpus``, ``measured`` of the per-figure remake of ``label``; ``None`` for
    a label no chapter notebook numbers."""
    from . import figure

    numbers = {f.label: n for n, f in figure.figure_index().items()}
    if label not in numbers:
        return None
    t = figure.measured_times().get(label) or {}
    return dict(number=numbers[label], command=figure.command(numbers[label]), seconds=t.get("seconds"),
                cpus=t.get("cpus"), measured=t.get("measured"))


def _duration(s: float) -> str:
    s = float(s)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _verification(c: dict) -> str:
    """The card's release line, in the words of the run line and the history page."""
    from .report import verification_words, verified_text

    rel, v = c["release"], c["verified"]
    if not rel:
        return ("none: these rows were computed by this build's own run (not a data release), so nothing has "
                "re-verified them")
    head = f"data release {html.escape(str(rel.get('version')))}"
    if not v:
        return head + ", " + verified_text(None)
    n_ch = c.get("n_verified_chapters")
    per = v.get("units_per_chapter")
    total = f" ({per * n_ch} over {n_ch} chapters)" if isinstance(per, int) and n_ch else ""
    words = html.escape(verification_words(v.get("how")), quote=False).replace("==", "<code>==</code>")
    return f"{head}; {html.escape(verified_text(v), quote=False)}{total}; this chapter {words}"


def card_html(c: dict, root: str = "") -> str:
    """The folded HTML of card ``c`` (:func:`card`); ``root``: the path from the page to the book's root (``"../"``).
    Each rows link (``a.bn-rows``) has a checksum ``code.bn-sha256`` whose ``data-file`` the page check resolves."""
    e = html.escape
    what = "figure" if c["kind"] == "fig" else "table"
    items = []
    for r in c["rows"]:
        href = f"{root}results/{r['file']}"
        sel = (f"filter <code>{e(filter_text(r['where']))}</code>: {r['n_selected']:,} of its {r['n_rows']:,} rows"
               if r["where"] else f"all {r['n_rows']:,} rows")
        same = ""
        if r["manifest_sha256"]:
            same = (" (the release manifest's sha256 of this table: the same)" if r["manifest_sha256"] == r["sha256"]
                    else " (<strong>differs</strong> from the release manifest's sha256 of this table)")
        items.append(f"<li><a class=\"bn-rows\" href=\"{e(href)}\">{e(r['file'])}</a>, one row per run and seed; {sel}. "
                     f"sha256 <code class=\"bn-sha256\" data-file=\"{e(href)}\">{e(r['sha256'])}</code>{same}</li>")
    drawn = (f"This {what} is drawn from <code>{e(c['data'])}</code> (beside them in <code>results/</code>; its checksum is in its JSON sidecar), a summary of:"
             if c["data"] and c["rows"][0]["file"] != c["data"] else
             f"This {what} is drawn from the chapter's per-seed rows:")
    nb = c["notebook"]
    remake = (f"<code>python -m bnstudy.study.book --release --only {e(nb)} --output-dir remake/</code> re-executes "
              f"this chapter from the release's rows, nothing trained, and writes this {what} again"
              if c["release"] else
              f"<code>python -m bnstudy.study.book --profile {e(str(c.get('profile') or 'quick'))} --only {e(nb)} "
              f"--output-dir remake/</code> re-executes this chapter at the profile of its <em>Ran with</em> line "
              f"with the notebook's default parameters, computing only runs not in the run cache (where the "
              f"<em>Ran with</em> line shows other values, give them again: <code>bnstudy chapter {e(nb[:2])} -p "
              f"NAME VALUE</code>)")
    if c["remake_s"] is not None:
        remake += f" ({_duration(c['remake_s'])} in this build)"
    one = c.get("remake_figure")
    if one and c["release"]:  # the release's rows are what the per-figure command reads
        took = (f" (measured {_duration(one['seconds'])} on a {one['cpus']}-core machine on {e(str(one['measured']))},"
                f" start-up included)" if one.get("seconds") is not None else "")
        remake = (f"<code>{e(one['command'])}</code> draws Fig. {e(one['number'])} alone again from the release's rows "
                  f"with the chapter's own figure code, and writes the CSV it is drawn from beside it: nothing "
                  f"trained, no notebook executed{took}. The whole chapter: " + remake)
    cpu = [r["cpu_s"] for r in c["rows"] if r["cpu_s"] is not None]
    cost = []
    if cpu and c["rows"][0]["where"]:
        cost.append(f"the selected rows recorded {_duration(sum(cpu))} of CPU time (the sum of their "
                    f"<code>wall_s</code>, one thread per run)")
    if c["chapter_cpu_s"] is not None:
        cost.append(f"the whole chapter, {c['chapter_units']:,} units, recorded {_duration(c['chapter_cpu_s'])} of CPU "
                    f"time (every unit's <code>wall_s</code> in the release's units file)"
                    + (f", {_duration(c['run_wall_s'])} wall on {c['workers']} worker processes"
                       if c.get("run_wall_s") and c.get("workers") else ""))
    elif cpu:
        cost.append(f"its rows recorded {_duration(sum(cpu))} of CPU time (the sum of their <code>wall_s</code>)")
    # the heading's cost: the whole chapter's recorded CPU time (what the command recomputes), else every row's
    # when no filter narrowed them; a filtered subset is not the chapter's cost, so the sentence below gives it
    if c["chapter_cpu_s"] is not None:
        recorded = f"recorded cost: {_duration(c['chapter_cpu_s'])} of CPU time"
    elif cpu and not c["rows"][0]["where"]:
        recorded = f"recorded cost: {_duration(sum(cpu))} of CPU time"
    else:
        recorded = "recorded cost" if cost else "no recorded cost"
    recompute = (f"<code>make release CHAPTERS={e(c['chapter'])}</code> recomputes the chapter's rows at the full "
                 f"profile into <code>release/</code> (resumable); "
                 + ("; ".join(cost) if cost else "no recorded time") + ".")
    # overflow-wrap: a sha256 is one 64-character word, wider than a phone's column
    return (f"<details class=\"{CARD_CLASS}\" data-label=\"{e(c['label'])}\" style=\"overflow-wrap: anywhere\"><summary>Provenance: the rows behind "
            f"this {what}, their checksum and how to remake it</summary>"
            f"<p>{drawn}</p><ul>{''.join(items)}</ul>"
            f"<p><strong>Release.</strong> {_verification(c)}.</p>"
            f"<p><strong>Remake this {what}</strong> (seconds to minutes): {remake}.</p>"
            f"<p><strong>Recompute its rows</strong> ({recorded}): {recompute}</p></details>")
