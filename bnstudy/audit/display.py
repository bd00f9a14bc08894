"""Display: the audit's summary (``print(audit)``), its one-line-per-finding headline, and the notebook views
(Markdown, HTML)."""

from __future__ import annotations

import html
import math
import textwrap
from collections import Counter

from .._checks import check_bool, check_int
from ..norms import is_script_module
from .lints import _label, format_lints
from .results import _change_words, _isnan


_WIDTH = 100
_MAX_PARTS = 4  # frozen parts whose own output the summary shows (each costs a probe pass)


def _max_change_words(rows) -> str:
    """``max |change| 0.5`` over output rows (NaN skipped, as pandas' max), ``(bit-identical)`` when none
    changed."""
    changes = [r.max_abs_change for r in rows if not _isnan(r.max_abs_change)]
    worst = max(changes) if changes else (float("nan") if rows else 0.0)
    return f"max |change| {worst:.4g}" + (" (bit-identical)" if not any(r.changed for r in rows) else "")


def _n(count: int, word: str, plural: str | None = None) -> str:
    """``"1 call"``, ``"3 calls"``: a count with its noun in the right number."""
    return f"{count} {word if count == 1 else (plural or word + 's')}"


class _Display:
    """Text and notebook views; a mixin of :class:`~bnstudy.audit.FreezeAudit`."""

    # -- display ----------------------------------------------------------------
    def _headline(self) -> list[str]:
        rep = self._report_rows()
        moved = [r for r in rep if r.changed]

        def counts(rows) -> str:  # distinct tensors; a shared one counts once, its extra names are added
            seen: set = set()
            distinct = []
            for r in rows:
                if not any(o in seen for o in r.shared_with):
                    distinct.append(r)
                seen.add(r.tensor)
            text = (f"{_n(len(distinct), 'tensor')} ({_n(sum(r.kind == 'param' for r in distinct), 'parameter')}, "
                    f"{_n(sum(r.kind == 'buffer' for r in distinct), 'buffer')}")
            extra = len(rows) - len(distinct)
            return text + (f"; {_n(extra, 'more name')} of shared tensors)" if extra else ")")

        what = type(self.model).__name__ if not is_script_module(self.model) else (
            f"{getattr(self.model, 'original_name', '?')} (TorchScript)")
        if self.wrapper is not None:
            what += " (compiled: audited through torch.compile's _orig_mod)"
        head = f"FreezeAudit of {what}: {counts(rep)}, {_n(self.model_calls, 'model call')}"
        if self.submodule_calls:  # the loop called the model's parts, not the model: say what it called
            head += (f"; {_n(sum(self.submodule_calls.values()), 'call')} into its submodules ("
                     + ", ".join(f"{_label(n)} {k}" for n, k in self.submodule_calls.most_common()) + ")")
        lines = textwrap.wrap(head, width=_WIDTH, subsequent_indent="    ") if self.submodule_calls else [head]
        if not moved:
            lines.append("  moved: nothing (every parameter and buffer is bit-identical)")
        else:
            lines.append(f"  moved: {counts(moved)} in {_n(len({r.module for r in moved}), 'module')}")
        bad = [r for r in rep if r.status == "non-finite"]
        if len(bad):
            shown = ", ".join(r.tensor for r in bad[:4]) + (", ..." if len(bad) > 4 else "")
            lines += textwrap.wrap(f"  NON-FINITE: {_n(len(bad), 'tensor')} hold NaN or inf after the block where "
                                   f"they were finite before ({shown}): see [nonfinite_stats]", width=_WIDTH,
                                   subsequent_indent="    ")
        lost = [(r.name, r.writes_elsewhere, r.writes, ", ".join(r.elsewhere)) for r in self._records.values()
                if r.writes_elsewhere]
        if lost:
            text = "; ".join(f"{_label(n)!r}: {'all ' + str(k) if k == w else f'{k} of its {w}'} writes went into "
                             f"{where}" for n, k, w, where in lost[:4]) + (
                f"; and {len(lost) - 4} more layers" if len(lost) > 4 else "")
            lines += textwrap.wrap(f"  writes not in the model: {text}; the model's buffers do not show them "
                                   "(audit.elsewhere(), a table: needs pandas)", width=_WIDTH, subsequent_indent="    ")
        if any(e["writes"] for e in self._foreign.values()):
            outside = Counter()
            for e in self._foreign.values():
                if e["writes"]:
                    outside[e["root_type"]] += e["writes"]
            lines += textwrap.wrap("  norm layers outside the model wrote running statistics: " + ", ".join(
                f"{k} ({_n(v, 'write')})" for k, v in outside.items()) + " (their own buffers, not the model's: "
                "audit.elsewhere(), a table: needs pandas)", width=_WIDTH, subsequent_indent="    ")
        flagged = [f"{layer.partition(':')[2]} ({layer.partition(':')[0]})" for layer in
                   (x.layer for x in self.lints if x.code == "reset_stats_pinned" and ":" in x.layer)]
        if flagged:
            lines += textwrap.wrap(f"  outside the model, {_n(len(flagged), 'norm layer')} normalised with reset "
                                   "statistics mean 0 / variance 1: " + ", ".join(flagged[:4])
                                   + (", ..." if len(flagged) > 4 else "") + " (see [reset_stats_pinned])",
                                   width=_WIDTH, subsequent_indent="    ")
        hidden = sum(r.hidden_calls for r in self._records.values() if r.kind != "model")
        if hidden:
            lines += textwrap.wrap(f"  hidden calls: the model ran compiled or as TorchScript; {_n(hidden, 'layer call')} "
                                   f"{'was' if hidden == 1 else 'were'} read at the boundary (flags at the call, "
                                   "writes from the buffers)",
                                   width=_WIDTH, subsequent_indent="    ")
        if self.outputs_before is not None and self.outputs_after is None:
            lines += textwrap.wrap(f"  probe outputs: not compared: {self.probe_note}", width=_WIDTH,
                                   subsequent_indent="    ")
        elif self.outputs_before is not None:
            out = self._outputs_rows()
            nonfinite = [r for r in out if r.status == "non-finite"]
            if len(nonfinite):
                total = sum(math.prod(r.shape) if len(r.shape) else 1 for r in nonfinite)
                lines.append(f"  probe outputs: NON-FINITE: {sum(int(r.nonfinite_after) for r in nonfinite)} of "
                             f"{total} values NaN/inf after the block (finite before)")
            else:
                frozen = self._frozen_part_lines()
                lines += frozen
                # Whose output: said where it is ambiguous, a model with a frozen part and a part that trains (a
                # trained head moves the whole model's output however well the backbone is frozen). Elsewhere the
                # line reads as it always did: the book's release pins chapter 2's printed audits.
                label = f" ({self._probe_words()})" if frozen else ""
                lines += textwrap.wrap(f"  probe outputs{label}: {_max_change_words(out)}", width=_WIDTH,
                                       subsequent_indent="    ")
            if self.probe_note:
                lines += textwrap.wrap(f"    ({self.probe_note})", width=_WIDTH, subsequent_indent="    ")
        for note in self.notes:
            lines += textwrap.wrap(f"  note: {note}", width=_WIDTH, subsequent_indent="    ")
        if self.hook_errors:
            lines += textwrap.wrap(f"  audit hook errors (the block ran on): {len(self.hook_errors)}, first: "
                                   f"{self.hook_errors[0]}", width=_WIDTH, subsequent_indent="    ")
        warn = [x for x in self.lints if x.severity == "warning"]
        info = [x for x in self.lints if x.severity == "info"]
        groups = len({(x.code, x.message) for x in warn})
        # the information lints are counted as the summary lists them (after the warnings); a summary without any
        # reads as it always did (the book's release pins chapter 2's printed audits)
        lines.append(f"  lints: {len(warn) or 'none'}" + (f" ({groups} distinct)" if warn else "")
                     + (f"; information: {len(info)} ({len({(x.code, x.message) for x in info})} distinct)"
                        if info else ""))
        return lines

    def _probe_words(self) -> str:
        """Whose output the probe line shows when part of the model is frozen: the whole model with the parts
        that train."""
        trained = self._trained_parts()
        shown = ", ".join(repr(_label(n)) for n in trained[:3]) + (", ..." if len(trained) > 3 else "")
        return f"the whole model's output, incl. the parts that train: {shown}"

    def _frozen_part_lines(self) -> list[str]:
        """First of the probe lines: each frozen part's own output (:meth:`module_outputs`), entry against now,
        when the probe ran through the whole model (no ``forward``), part of it is frozen and part of it trains."""
        if self.forward is not None or not self._trained_parts() or not self._frozen_parts():
            return []
        lines = []
        parts = self._frozen_parts()
        for name in parts[:_MAX_PARTS]:
            try:
                rows = self._part_rows(name)
            except Exception as e:  # noqa: BLE001 - a display line must not lose the summary
                lines += textwrap.wrap(f"  frozen part {_label(name)!r}, its own output: not compared "
                                       f"({type(e).__name__}: {e})", width=_WIDTH, subsequent_indent="    ")
                continue
            if rows is not None:
                lines += textwrap.wrap(f"  frozen part {_label(name)!r}, its own output on the probe: "
                                       f"{_max_change_words(rows)}", width=_WIDTH, subsequent_indent="    ")
        if len(parts) > _MAX_PARTS:
            lines.append(f"    ... {_n(len(parts) - _MAX_PARTS, 'more frozen part')} "
                         "(audit.module_outputs(name), a table: needs pandas)")
        return lines

    def summary(self, details: bool = False, max_rows: int = 12) -> str:
        """A plain-text report, summary first: totals, what moved, the probe's change, then lints grouped
        (identical findings on many layers are one line), layers grouped by what they did, and the
        moved tensors. ``details=False`` (the default, and ``print(audit)``) shows at most ``max_rows``
        layer groups and moved tensors; ``details=True`` shows all. Lines are wrapped at 100 characters."""
        self._require_done()
        check_bool("FreezeAudit.summary", "details", details)
        check_int("FreezeAudit.summary", "max_rows", max_rows)
        lines = self._headline()
        warn = [x for x in self.lints if x.severity == "warning"]
        lines += format_lints(warn, width=_WIDTH, indent="    ")
        info = [x for x in self.lints if x.severity == "info"]
        if info:  # counted on the lints line of the headline
            lines.append("  information:")
            lines += format_lints(info, width=_WIDTH, indent="    ")
        shown = [r for r in self._modes_rows() if r.kind != "model"]
        if len(shown):
            groups: dict = {}
            for r in shown:
                detail = f"{r.mode}, {_n(r.calls, 'call')}" if not r.hidden_calls else (
                    f"{r.mode}, {r.calls} calls seen and {r.hidden_calls} inside compiled/scripted calls")
                if r.stats:
                    detail += f", {r.stats} stats"
                if r.writes:
                    places = ", ".join(self._by_name()[r.module].elsewhere) if r.writes_elsewhere else ""
                    detail += f", WROTE running stats ({r.writes}x" + (
                        f"; {'all' if r.writes_elsewhere == r.writes else r.writes_elsewhere} into {places}, "
                        "not its buffers)" if r.writes_elsewhere else ")")
                if r.hidden_writes:
                    detail += f", its buffers changed in {_n(r.hidden_writes, 'hidden call')}"
                if r.replaced:
                    detail += f", replaced during the block ({r.replaced})"
                if r.backward_writes:
                    detail += f", {_n(r.backward_writes, 'write')} in backward"
                if r.grad_calls < r.calls:
                    detail += f", {r.calls - r.grad_calls} without grad"
                if r.min_batch is not None and r.min_batch == r.min_batch:  # not None, not NaN
                    detail += f", min batch {int(r.min_batch)}"
                if r.pinned:
                    detail += ", pinned"
                groups.setdefault((r.type, detail), []).append(
                    r.module + (f" (= {', '.join(map(_label, r.also))})" if r.also else ""))
            lines.append(f"  layers during the block ({len(shown)} in {_n(len(groups), 'group')}):")
            items = list(groups.items())
            for (typ, detail), names in (items if details else items[:max_rows]):
                who = _label(names[0]) if len(names) == 1 else f"{len(names)} x: {', '.join(map(_label, names[:4]))}" + (
                    ", ..." if len(names) > 4 else "")
                lines += textwrap.wrap(f"{typ} {who}: {detail}", width=_WIDTH, initial_indent="    ",
                                       subsequent_indent="        ")
            if not details and len(items) > max_rows:
                lines.append(f"    ... {_n(len(items) - max_rows, 'more group', 'more groups')} "
                             "(audit.summary(details=True))")
        moved = [r for r in self._report_rows() if r.changed]
        if len(moved):
            lines.append("  moved tensors:")
            rows = moved
            for r in (rows if details else rows[:max_rows]):
                lines.append(f"    {r.kind:<6} {r.tensor:<40} {_change_words(r)}")
            if not details and len(rows) > max_rows:
                lines.append(f"    ... {len(rows) - max_rows} more (audit.summary(details=True); audit.moved() "
                             "as a table needs pandas)")
        if self.output_signatures:
            lines += textwrap.wrap("  forward returned: " + "; ".join(
                f"{s} x{c}" for s, c in self.output_signatures.items()), width=_WIDTH, subsequent_indent="    ")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary() if self.after is not None else f"FreezeAudit({type(self.model).__name__}, not run)"

    def __repr__(self) -> str:
        if self.after is None:
            return f"FreezeAudit({type(self.model).__name__}, not run)"
        return "\n".join(self._headline())

    def _repr_markdown_(self) -> str:
        if self.after is None:
            return f"`FreezeAudit({type(self.model).__name__})`: not run"
        head = self._headline()
        md = [f"**{head[0]}**", ""] + [f"- {h.strip()}" for h in head[1:]]
        warn = [x for x in self.lints if x.severity == "warning"]
        info = [x for x in self.lints if x.severity == "info"]
        if warn or info:  # the warnings, then the information the headline counts
            md += ["", "| lint | layers | message |", "| --- | --- | --- |"]
            from .lints import group_lints
            for lint, layers in group_lints(warn + info):
                who = ", ".join(_label(n) for n in layers[:6]) + (f" (+{len(layers) - 6})" if len(layers) > 6 else "")
                label = f"`{lint.code}`" + (" (info)" if lint.severity == "info" else "")
                md.append(f"| {label} | {who} | {lint.message.replace('|', '/')} |")
        return "\n".join(md)

    def _repr_html_(self) -> str:
        if self.after is None:
            return f"<code>FreezeAudit({html.escape(type(self.model).__name__)})</code>: not run"
        moved = self._moved_rows()
        table = ("<table><tr><th>tensor</th><th>kind</th><th>max_abs_change</th></tr>" + "".join(
            f"<tr><td>{html.escape(r.tensor)}</td><td>{r.kind}</td><td>{r.max_abs_change:.4g}</td></tr>"
            for r in moved[:20]) + "</table>") if moved else ""
        return (f"<details open><summary><b>{html.escape(self._headline()[0])}</b></summary>"
                f"<pre>{html.escape(self.summary())}</pre>{table}</details>")
