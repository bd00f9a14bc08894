"""The book's Sphinx extension (``extra_extensions: [bnstudy.study.sphinxext]`` in ``book/_config.yml``).

What the stock Jupyter Book build does not do: MathJax served from the build (``sphinx-mathjax-offline``), not a
CDN; a ``{glue:figure}`` whose output is not an image numbered as a table (:class:`table_figure`, caption on top);
download links (PNG, SVG, the CSV it was drawn from and its sidecar) under every figure labelled ``fig-chNN-name``,
a missing file a build warning; a provenance card (:mod:`bnstudy.study.provenance`) under every chapter figure and
table; ``{glue:md}`../chapters/NN-name.ipynb::key``` pasting a Markdown value glued in another notebook; no minus
on a pasted ``{glue:text}`` value that rounds to zero; no repeated ``<script>`` entries; and ``figures/`` and
``results/`` copied into ``_build/html/`` so the links resolve.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

from docutils import nodes
from docutils.transforms import Transform
from sphinx.errors import ExtensionError
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

FIGURE_LABEL = re.compile(r"^fig-ch(\d+)-(.+)$")
MATHJAX_PACKAGE = "sphinx-mathjax-offline"  # its folder name has hyphens; find_spec still finds it
MATHJAX_ENTRY = "mathjax/tex-chtml.js"     # relative to _static, as Sphinx reads mathjax_path


def mathjax_source() -> Path:
    """The folder holding MathJax 3 (``tex-chtml.js``, its extensions and fonts) in the installed package."""
    spec = importlib.util.find_spec(MATHJAX_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ExtensionError(f"bnstudy.study.sphinxext: the {MATHJAX_PACKAGE!r} package is not installed "
                             f"(pip install -e '.[book]'); the book serves MathJax from it, not from a CDN")
    src = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax"
    if not (src / "tex-chtml.js").exists():
        raise ExtensionError(f"bnstudy.study.sphinxext: no tex-chtml.js in {src}")
    return src


class table_figure(nodes.figure):
    """A captioned glued table: a figure node that Sphinx numbers in the *table* series."""


def _has_image(node: nodes.Node) -> bool:
    return any(True for _ in node.findall(nodes.image))


def _relative_root(docname: str) -> str:
    return "../" * docname.count("/")


def _link(text: str, uri: str) -> nodes.reference:
    return nodes.reference("", text, refuri=uri, classes=["bn-download"])


def _legend(fig: nodes.figure) -> nodes.legend:
    """The figure's legend, added if it has none."""
    legend = next((c for c in fig.children if isinstance(c, nodes.legend)), None)
    if legend is None:
        legend = nodes.legend()
        fig += legend
    return legend


class BookFigures(Transform):
    """Glued tables to :class:`table_figure`; download links and provenance cards under labelled figures.
    Runs before Sphinx numbers figures and tables (``AutoNumbering``, priority 210)."""

    default_priority = 205

    def apply(self) -> None:
        env = getattr(self.document.settings, "env", None)
        if env is None:
            return
        for fig in list(self.document.findall(nodes.figure)):
            if type(fig) is not nodes.figure:
                continue
            if not _has_image(fig):
                fig = self._to_table(fig)
            else:
                self._add_downloads(fig, env)
            _add_card(fig, env)
        m = re.match(r"^chapters/(\d+)-", env.docname)
        if m:  # a table typed in a chapter's prose (unnumbered; its cells glued): the chapter's rows
            for table in list(self.document.findall(nodes.table)):
                if not any(isinstance(a, nodes.figure) for a in _ancestors(table)):
                    _add_card(table, env, label=f"tbl-ch{m.group(1)}-prose")

    def _to_table(self, fig: nodes.figure) -> None:
        table = table_figure(fig.rawsource, **fig.attributes)
        caption = [c for c in fig.children if isinstance(c, nodes.caption)]
        rest = [c for c in fig.children if not isinstance(c, nodes.caption)]
        table.extend(caption + rest)  # a table's caption goes above it
        table["classes"] = list(fig["classes"]) + ["bn-table"]
        table.source, table.line = fig.source, fig.line
        fig.replace_self(table)
        for i in table["ids"]:  # numref looks the label's node up here: it must be the new node
            self.document.ids[i] = table
        return table

    @staticmethod
    def _add_downloads(fig: nodes.figure, env) -> None:
        label = next((i for i in list(fig["ids"]) + list(fig["names"]) if FIGURE_LABEL.match(i)), None)
        if label is None:
            return
        number, name = FIGURE_LABEL.match(label).groups()
        stem = f"{int(number):02d}-{name}"
        srcdir = Path(env.srcdir)
        figdir = srcdir / env.config.bnstudy_figures_dir
        if not (figdir / f"{stem}.png").exists():
            logger.warning(f"bnstudy: figure {label!r} has no file {env.config.bnstudy_figures_dir}/{stem}.png "
                           f"to download (save it with bnstudy.study.plots.save_figure(fig, {stem!r}, figures_dir))",
                           location=fig)
            return
        root = _relative_root(env.docname)
        figs, res = f"{root}{env.config.bnstudy_figures_dir}", f"{root}{env.config.bnstudy_results_dir}"
        links = [_link("PNG, 300 dpi", f"{figs}/{stem}.png"), _link("SVG", f"{figs}/{stem}.svg")]
        meta_path = figdir / f"{stem}.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if meta.get("data"):
            links.append(_link(f"data ({meta['data']})", f"{res}/{meta['data']}"))
            if meta.get("data_sidecar"):
                links.append(_link("run parameters (JSON)", f"{res}/{meta['data_sidecar']}"))
        for d in meta.get("data_more", []):
            links.append(_link(f"data ({d})", f"{res}/{d}"))
        para = nodes.paragraph("", "", classes=["bn-downloads"])
        para += nodes.Text("Download: ")
        for i, ref in enumerate(links):
            if i:
                para += nodes.Text(" · ")
            para += ref
        _legend(fig).append(para)


_CARD_LABEL = re.compile(r"^(fig|tbl|tab)-ch\d+-.+$")


def _ancestors(node: nodes.Node):
    while node.parent is not None:
        node = node.parent
        yield node


def _add_card(fig: nodes.Element, env, label: str | None = None) -> None:
    """Append the provenance card to a chapter's labelled figure or table (given ``label``: after a prose table); no
    per-seed rows, or a filter on a column the rows lack, is a build warning."""
    from . import provenance

    label = label or next((i for i in list(fig["ids"]) + list(fig["names"]) if _CARD_LABEL.match(i)), None)
    if label is None:
        return
    try:
        c = provenance.card(label, env.srcdir, env.config.bnstudy_figures_dir, env.config.bnstudy_results_dir)
    except ValueError as exc:  # a filter naming a column the rows lack: say which, and build on (-W fails it)
        logger.warning(f"bnstudy: {exc}", location=fig)
        return
    if c is None:
        logger.warning(f"bnstudy: {label!r} has no per-seed rows in {env.config.bnstudy_results_dir}/ for its "
                       f"provenance card (a CSV NN_*.csv with a seed column)", location=fig)
        return
    html = provenance.card_html(c, _relative_root(env.docname))
    if isinstance(fig, nodes.table):
        fig.parent.insert(fig.parent.index(fig) + 1, nodes.raw("", html, format="html"))
        return
    (fig if isinstance(fig, table_figure) else _legend(fig)).append(nodes.raw("", html, format="html"))


# --- Markdown glued in another notebook: {glue:md}`path::key` ------------------------------------------------

_INLINE_MD = re.compile(r"\*\*([^*]+)\*\*|\*([^*]+)\*")


def inline_markdown(text: str) -> list[nodes.Node] | None:
    """Docutils nodes for the inline Markdown that :func:`bnstudy.study.pages.glue_value` writes: plain text,
    ``**strong**`` and ``*emphasis*``. ``None`` for anything else (links, code, HTML, several lines)."""
    # the special characters are looked for in the whole text, inside ``**...**`` too: a bold value holding
    # code or a link (``**`f(x)`**``) is not inline Markdown this can render, and must not print its backticks
    if "\n" in text.strip() or re.search(r"[`\[\]]", text) or re.search(r"[<>_#]", _INLINE_MD.sub("", text)):
        return None
    out, pos = [], 0
    for m in _INLINE_MD.finditer(text):
        if m.start() > pos:
            out.append(nodes.Text(text[pos:m.start()]))
        out.append(nodes.strong(m.group(1), m.group(1)) if m.group(1) else nodes.emphasis(m.group(2), m.group(2)))
        pos = m.end()
    if pos < len(text):
        out.append(nodes.Text(text[pos:]))
    if any("*" in n.astext() for n in out if isinstance(n, nodes.Text)):
        return None
    return out


def _paste_markdown_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{glue:md}``: myst-nb's role, plus ``path::key`` (a pending reference this extension resolves)."""
    from myst_nb.ext.glue.roles import PasteMarkdownRole
    from myst_nb.ext.glue.utils import PendingGlueReferenceError, create_pending_glue_ref
    if "::" not in text:
        return PasteMarkdownRole()(name, rawtext, text, lineno, inliner, options or {}, content or [])
    doc, key = text.split("::", 1)
    key = key.split(":", 1)[0]  # a trailing ":commonmark" format is the only one there is
    document = inliner.document
    try:
        ref = create_pending_glue_ref(document, document.current_source, lineno, doc, key, inline=True, gtype="md")
    except PendingGlueReferenceError as exc:
        msg = inliner.reporter.warning(f"bnstudy: {exc}", line=lineno)
        return [], [msg]
    return [ref], []


class CrossPageMarkdownGlue(SphinxPostTransform):
    """Resolve ``{glue:md}`path::key``` references (before myst-nb's own pass, priority 5, which knows
    no Markdown). A missing key or Markdown this renderer does not know is a build warning."""

    default_priority = 4

    def run(self, **kwargs) -> None:
        from myst_nb.ext.glue.crossref import read_glue_cache
        from myst_nb.ext.glue.utils import PendingGlueReference
        folder = self.env.mystnb_config.output_folder
        for node in list(self.document.findall(PendingGlueReference)):
            if node.gtype != "md":
                continue
            output = read_glue_cache(str(folder), node.refdoc).get(node.key)
            text = (output or {}).get("data", {}).get("text/markdown")
            rendered = inline_markdown(text) if text is not None else None
            if rendered is None:
                why = ("not found" if output is None else "has no text/markdown" if text is None
                       else f"is Markdown this page cannot paste inline: {text!r}")
                logger.warning(f"bnstudy: glue key {node.key!r} of {node.refdoc!r} {why}", location=node)
                node.parent.remove(node)
                continue
            span = nodes.inline("", "", *rendered, classes=["pasted-inline"])
            node.replace_self(span)


#: A formatted negative zero: a minus, then only zeros (a decimal point, an exponent, a percent sign allowed).
_NEGATIVE_ZERO = re.compile(r"-(0+(?:\.0*)?(?:[eE][+-]?\d+)?%?)")


def unsigned_zero(text: str) -> str:
    """``text`` without the minus of a formatted negative zero (``"-0.000"``, ``"-0.0%"``, ``"-0e+00"``); any other
    text (``"-0.001"``) unchanged."""
    m = _NEGATIVE_ZERO.fullmatch(text)
    return m.group(1) if m else text


def unsign_pasted_zeros(document: nodes.Node) -> int:
    """Drop the minus of every negative zero ``{glue:text}`` pasted into ``document`` (``inline.pasted-text``);
    returns how many it changed. Display only: the glued value is untouched."""
    changed = 0
    for node in list(document.findall(nodes.inline)):
        if "pasted-text" not in node.get("classes", ()) or len(node.children) != 1 \
                or not isinstance(node.children[0], nodes.Text):
            continue
        text = node.astext()
        fixed = unsigned_zero(text)
        if fixed != text:
            node.replace(node.children[0], nodes.Text(fixed))
            changed += 1
    return changed


class UnsignedZeroPastes(SphinxPostTransform):
    """:func:`unsign_pasted_zeros` on every page, after myst-nb has pasted the cross-page values (its priority 5)."""

    default_priority = 6

    def run(self, **kwargs) -> None:
        unsign_pasted_zeros(self.document)


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated <script> entries: sphinx-thebe adds its inline ``const THEBE_JS_URL`` once per read
    pass, and the second declaration is a console error in every page."""
    seen, kept = set(), []
    for js in context.get("script_files", []):
        key = (getattr(js, "filename", None) or "", tuple(sorted((k, str(v)) for k, v in getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    context["script_files"] = kept


def _set_mathjax_path(app, config) -> None:
    mathjax_source()  # fail early, naming the missing package
    config.mathjax_path = MATHJAX_ENTRY


def _copy_outputs(app, exc) -> None:
    if exc is not None or app.builder.format != "html":
        return
    out = Path(app.outdir)
    shutil.copytree(mathjax_source(), out / "_static" / "mathjax", dirs_exist_ok=True)
    src = Path(app.srcdir)
    for folder in (app.config.bnstudy_figures_dir, app.config.bnstudy_results_dir):
        if (src / folder).is_dir():
            shutil.copytree(src / folder, out / folder, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".*"))


def setup(app):
    app.add_config_value("bnstudy_figures_dir", "figures", "env")
    app.add_config_value("bnstudy_results_dir", "results", "env")
    as_figure = (lambda self, node: self.visit_figure(node), lambda self, node: self.depart_figure(node))
    app.add_enumerable_node(table_figure, "table", None, html=as_figure, latex=as_figure, text=as_figure)
    app.add_transform(BookFigures)
    app.add_role_to_domain("glue", "md", _paste_markdown_role, override=True)
    app.add_post_transform(CrossPageMarkdownGlue)
    app.add_post_transform(UnsignedZeroPastes)
    app.connect("config-inited", _set_mathjax_path)
    app.connect("build-finished", _copy_outputs)
    app.connect("html-page-context", _dedupe_scripts)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
