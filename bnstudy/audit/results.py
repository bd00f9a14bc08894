"""The audit's tables of what moved (snapshot and diff): every tensor's change, the probe's outputs, each layer's
mode, a submodule's own output, and :meth:`~bnstudy.audit.FreezeAudit.assert_frozen`; plain rows inside, a
pandas DataFrame only when a table is asked for."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Iterable

import torch
from torch import nn

from .._checks import check_bool, check_int, check_number, check_str, module_names
from .._checks import LazyPandas
from ..freeze import is_pinned
from ..norms import is_script_module
from .lints import _type_name, lints_frame
from .snapshot import OUTPUT_COLUMNS, _set_all_eval, _restore, compare_outputs_rows, diff_frame, diff_rows

pd = LazyPandas()  # pandas is imported only when a table is asked for


_Row = SimpleNamespace  # a table row inside the audit (attribute access, as DataFrame.itertuples gives)
_MODES_COLUMNS = ["module", "type", "kind", "calls", "train_calls", "eval_calls", "grad_calls", "mode", "stats",
                  "updated_running_stats", "writes", "calls_per_model_call", "max_writes_per_model_call",
                  "backward_writes", "min_batch", "min_values_per_channel", "pinned", "also", "writes_elsewhere",
                  "elsewhere", "hidden_calls", "hidden_writes", "replaced"]


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _change_words(r) -> str:
    """``max |change| 0.1`` for a report row, or what became NaN/inf (``NaN/inf: 8 of its values ...``)."""
    return _fmt_change(r) if getattr(r, "status", None) == "non-finite" else f"max |change| {_fmt_change(r)}"


def _fmt_change(r) -> str:
    if getattr(r, "status", None) == "non-finite":
        return (f"NaN/inf: {r.nonfinite_after} of its values non-finite after the block "
                f"({r.nonfinite_before} before)")
    if r.before is not None and r.after is not None:
        return f"{r.max_abs_change:.4g} ({r.before} -> {r.after})"
    if isinstance(r.max_abs_change, float) and math.isnan(r.max_abs_change):
        return r.status
    return f"{r.max_abs_change:.4g}"


class _Results:
    """The result methods; a mixin of :class:`~bnstudy.audit.FreezeAudit`."""

    # -- results --------------------------------------------------------------
    def _require_done(self) -> None:
        if self.after is None:
            if getattr(self, "before", None) is not None:  # entered, not exited: called inside the block
                raise RuntimeError("FreezeAudit: the audit has no result yet: its results exist once the `with` "
                                   "block has exited (the block is what is audited); call them after it")
            raise RuntimeError("FreezeAudit: the audit has no result yet: use it as "
                               "`with FreezeAudit(model) as audit: ...` and read the results after the block")

    def report(self) -> pd.DataFrame:
        """Every parameter and buffer with its largest absolute change (see :func:`diff`)."""
        return diff_frame([vars(r) for r in self._report_rows()])

    def _report_rows(self) -> list:
        self._require_done()
        return [_Row(**r) for r in diff_rows(self.before, self.after)]

    def outputs(self) -> pd.DataFrame:
        """The probe's outputs before against after (see :func:`compare_outputs`); empty without a probe or
        when the probe could not be re-run after the block (``probe_note`` says why)."""
        return pd.DataFrame([vars(r) for r in self._outputs_rows()], columns=OUTPUT_COLUMNS)

    def _outputs_rows(self) -> list:
        self._require_done()
        if self.outputs_before is None or self.outputs_after is None:
            return []
        return [_Row(**r) for r in compare_outputs_rows(self.outputs_before, self.outputs_after)]

    def modes(self) -> pd.DataFrame:
        """One row per normalisation layer, dropout layer and the model itself, as seen during the block.

        Columns: ``module``, ``type``, ``kind`` (:func:`layer_kind`), ``calls``,
        ``train_calls``, ``eval_calls``, ``grad_calls`` (calls with gradients
        on), ``mode`` (``train``/``eval``/``mixed``/``not called``, over the calls
        seen and the hidden ones), ``stats``
        (statistics sources used, e.g. ``batch``), ``updated_running_stats``,
        ``writes`` (calls that wrote running statistics), ``calls_per_model_call``
        (``calls`` / calls of the model; NaN when the model itself was never
        called, e.g. only through ``model.forward_b``),
        ``max_writes_per_model_call``, ``backward_writes`` (writes during a
        backward pass: activation checkpointing), ``min_batch`` (smallest dim 0
        seen), ``min_values_per_channel``, ``pinned`` and ``also`` (the layer's other names when it is
        shared or reused at several places: one layer, one row, under its first name), then
        ``writes_elsewhere`` (writes into tensors that are not the layer's buffers) with ``elsewhere``
        (where, with how many: ``"torch.func.functional_call copies (100)"``), ``hidden_calls`` and ``hidden_writes``
        (calls of a compiled or TorchScript module holding the layer, and those after which its buffers had
        changed; see the class docstring) and ``replaced`` (``"BatchNorm1d -> SyncBatchNorm"`` when the
        module at this name was replaced during the block).
        """
        return pd.DataFrame([vars(r) for r in self._modes_rows()], columns=_MODES_COLUMNS)

    def _modes_rows(self) -> list:
        rows = []
        names_of: dict = {}
        for n, m in self.model.named_modules(remove_duplicate=False):
            names_of.setdefault(id(m), []).append(n)
        for rec in self._records.values():
            calls, train = rec.calls + rec.hidden_calls, rec.train_calls + rec.hidden_train
            mode = ("not called" if calls == 0 else "train" if train == calls
                    else "eval" if train == 0 else "mixed")
            rows.append(dict(module=rec.name, type=_type_name(rec.module), kind=rec.kind, calls=rec.calls,
                             train_calls=rec.train_calls, eval_calls=rec.calls - rec.train_calls,
                             grad_calls=rec.grad_calls, mode=mode, stats=",".join(sorted(rec.stats)),
                             updated_running_stats=rec.updated_running_stats, writes=rec.writes,
                             calls_per_model_call=rec.calls / self.model_calls if self.model_calls else math.nan,
                             max_writes_per_model_call=rec.max_writes_per_model_call,
                             backward_writes=rec.backward_writes, min_batch=rec.min_batch,
                             min_values_per_channel=rec.min_values_per_channel, pinned=is_pinned(rec.module),
                             also=tuple(n for n in names_of.get(id(rec.module), []) if n != rec.name),
                             writes_elsewhere=rec.writes_elsewhere,
                             elsewhere="; ".join(f"{k} ({v})" for k, v in rec.elsewhere.items()),
                             hidden_calls=rec.hidden_calls, hidden_writes=rec.hidden_writes, replaced=rec.replaced))
        return [_Row(**r) for r in rows]

    def lints_frame(self) -> pd.DataFrame:
        """The audit's lints as a DataFrame (see :func:`lints_frame`)."""
        return lints_frame(self.lints)

    def _names(self, modules, fn: str = "FreezeAudit") -> list[str] | None:
        """Qualified names for ``modules``: a name, a module object of the model, or a non-empty iterable of
        those (None: the whole model; an empty list raises, as it would check nothing)."""
        if modules is None:
            return None
        if not isinstance(modules, (str, nn.Module)) and hasattr(modules, "__iter__"):
            modules = list(modules)  # read once: a generator is checked and expanded below
        if self.wrapper is not None:  # names of the torch.compile wrapper: "_orig_mod.backbone" is "backbone"
            fix = lambda x: (self.model if x is self.wrapper else x.removeprefix("_orig_mod").removeprefix(".")
                             if isinstance(x, str) else x)
            modules = fix(modules) if isinstance(modules, (str, nn.Module)) else [fix(x) for x in modules]
        modules = self._expand_views(modules)
        names = module_names(fn, "modules", self.model, modules)
        items = [modules] if isinstance(modules, (str, nn.Module)) else modules
        out: list[str] = []
        for name, item in zip(names, items):
            # a module object reachable under several names (shared, reused) is all of them
            expanded = self._all_names(item) if isinstance(item, nn.Module) and item is not self.model else [name]
            out += [n for n in expanded if n not in out]
        return out

    def _expand_views(self, modules):
        """A container that is not a module of the model but holds only modules of it (a ``Sequential`` slice
        such as ``model[:3]`` or ``model.backbone[2:]``, a ``ModuleList`` slice: new containers around the same
        layers) stands for those layers; anything else is returned as given (and judged by ``module_names``)."""
        single = isinstance(modules, (str, nn.Module))
        items = [modules] if single else modules
        if not isinstance(items, list) or not any(isinstance(x, nn.Module) for x in items):
            return modules
        ids = {id(m) for m in self.model.modules()}
        out: list = []
        for x in items:
            kids = list(x.children()) if isinstance(x, nn.Module) and id(x) not in ids else []
            if kids and all(id(k) in ids for k in kids):
                out += kids
            else:
                out.append(x)
        return modules if single and len(out) == 1 and out[0] is modules else out

    def _by_name(self) -> dict:
        return {r.name: r for r in self._records.values()}

    def _all_names(self, module: nn.Module) -> list[str]:
        """Every qualified name ``module`` has in the model (``named_modules(remove_duplicate=False)`` order)."""
        return [n for n, m in self.model.named_modules(remove_duplicate=False) if m is module]

    def moved(self, modules: str | nn.Module | Iterable | None = None, tol: float = 0.0) -> pd.DataFrame:
        """The rows of :meth:`report` under ``modules`` whose ``max_abs_change`` exceeds ``tol`` (or that
        appeared, vanished or changed shape). ``modules``: qualified module names or module objects of the
        model, one or several (``""`` or None: the whole model); raises ``ValueError`` naming an unknown
        module or a negative ``tol``."""
        return diff_frame([vars(r) for r in self._moved_rows(modules, tol)])

    def _moved_rows(self, modules=None, tol: float = 0.0) -> list:
        self._require_done()
        check_number("FreezeAudit.moved", "tol", tol, minimum=0)
        prefixes = self._names(modules, "FreezeAudit.moved")
        return [r for r in self._report_rows()
                if (prefixes is None or any(p == "" or r.module == p or r.module.startswith(p + ".") for p in prefixes))
                and r.changed and (_isnan(r.max_abs_change) or r.max_abs_change > tol)]

    @torch.no_grad()
    def module_outputs(self, name: str) -> pd.DataFrame | None:
        """The named submodule's *own* eval-mode output on the probe, before against after (columns as
        :meth:`outputs`): its input is captured by running the probe through the model (eval mode, flags
        restored), and fed to the submodule with its parameters and buffers as they were at entry
        (``torch.func.functional_call`` with the entry snapshot) and as they are now. Upstream changes
        therefore do not count against it. When the block moved or cast the model, the probe and the entry
        tensors follow it (``probe_note``). None when there is no probe, the probe never reaches it, it
        cannot be re-run, or it is (or sits inside) a TorchScript module, whose inputs no hook can capture."""
        rows = self._module_outputs_rows(name)
        return None if rows is None else pd.DataFrame([vars(r) for r in rows], columns=OUTPUT_COLUMNS)

    @torch.no_grad()
    def _module_outputs_rows(self, name: str) -> list | None:
        self._require_done()
        check_str("FreezeAudit.module_outputs", "name", name)
        if self.wrapper is not None:
            name = name.removeprefix("_orig_mod").removeprefix(".")
        mods = dict(self.model.named_modules(remove_duplicate=False))
        if name not in mods:
            module_names("FreezeAudit.module_outputs", "name", self.model, name)  # raises, naming the choices
        if self.probe is None or self.outputs_after is None:
            return None
        sub = mods[name]
        if is_script_module(sub):  # a scripted module's descendants are scripted too
            return None  # TorchScript runs no Python hook inside: the submodule's input cannot be captured
        captured = []
        handle = sub.register_forward_pre_hook(lambda m, args, kwargs: captured.append((args, kwargs)) if not captured
                                               else None, with_kwargs=True)
        saved = _set_all_eval(self.model)
        try:
            with torch.random.fork_rng(devices=[]):
                from .lints import call_forward
                call_forward(self.model, self._probe_now())
            if not captured:
                return None
            args, kwargs = captured[0]
            prefix = f"{name}." if name else ""
            device = next((t.device for t in list(sub.parameters()) + list(sub.buffers())), None)
            now = dict(sub.named_parameters(remove_duplicate=False)) | dict(sub.named_buffers(remove_duplicate=False))
            before = {}  # the entry values, in each tensor's current device and dtype (a block may cast the model)
            for n, t in self.before.tensors.items():
                if n.startswith(prefix):
                    cur = now.get(n[len(prefix):])
                    before[n[len(prefix):]] = (t.to(device=cur.device, dtype=cur.dtype) if cur is not None
                                               else t.to(device) if device is not None else t)
            with torch.random.fork_rng(devices=[]):
                out_before = torch.func.functional_call(sub, before, args, kwargs, strict=False)
            with torch.random.fork_rng(devices=[]):
                out_after = sub(*args, **kwargs)
        finally:
            handle.remove()
            _restore(saved)
        from .snapshot import _flatten
        return [_Row(**r) for r in compare_outputs_rows({k: v.detach().cpu() for k, v in _flatten(out_before).items()},
                                                        {k: v.detach().cpu() for k, v in _flatten(out_after).items()})]

    def _frozen_parts(self) -> list[str]:
        """The outermost submodules whose parameters are all frozen (``requires_grad=False``, at least one),
        in registration order; empty when the whole model is frozen or nothing is."""
        out: list[str] = []
        for n, m in self.model.named_modules():
            if not n or any(n.startswith(p + ".") for p in out):
                continue
            params = list(m.parameters())
            if params and not any(p.requires_grad for p in params):
                out.append(n)
        return out

    def _trained_parts(self) -> list[str]:
        """The model's direct children (or ``""``: the model's own parameters) holding a parameter that trains."""
        out: list[str] = []
        for n, p in self.model.named_parameters():
            top = n.split(".")[0] if "." in n else ""
            if p.requires_grad and top not in out:
                out.append(top)
        return out

    def _part_rows(self, name: str) -> list | None:
        """:meth:`module_outputs` rows for ``name``, computed once per finished audit (the summary asks again)."""
        cache = self.__dict__.setdefault("_part_cache", {})
        if (name, id(self.after)) not in cache:
            cache[(name, id(self.after))] = self._module_outputs_rows(name)
        return cache[(name, id(self.after))]

    def assert_frozen(self, modules: str | nn.Module | Iterable | None = None, outputs: bool = True,
                      tol: float = 0.0, max_items: int = 20) -> None:
        """Raise ``AssertionError`` naming every tensor under ``modules`` that moved by more than ``tol``.

        ``modules``: qualified module names or module objects of the model
        (None: the whole model). With ``outputs=True`` and a probe, an output
        that moved by more than ``tol`` is named too; *which* output judges what
        was named: with ``forward=`` given to the audit, the probe's outputs
        through it (you said what must not change); without it, each named
        module's own output (:meth:`module_outputs`), so a frozen backbone passes
        while the head behind it trains; for the whole model, the model's
        output. ``tol=0.0`` (the default) demands exact equality, which is what
        a freeze guarantees. The message lists at most ``max_items`` tensors
        (``audit.moved(...)`` lists all), one per line; a tensor or output that
        became NaN/inf is named as such. Returns None when nothing moved. On a
        TorchScript model a named submodule's own output cannot be captured
        (no hook runs inside TorchScript), so only its tensors are judged; names
        of a ``torch.compile`` wrapper (``"_orig_mod.backbone"``) are accepted.
        Raises ``ValueError`` naming an unknown module or a negative ``tol``,
        ``TypeError`` for arguments of the wrong type.
        """
        self._require_done()
        names = self._names(modules, "FreezeAudit.assert_frozen")
        check_bool("FreezeAudit.assert_frozen", "outputs", outputs)
        check_number("FreezeAudit.assert_frozen", "tol", tol, minimum=0)
        check_int("FreezeAudit.assert_frozen", "max_items", max_items)
        moved = self._moved_rows(names, tol)
        problems = [f"{r.kind} {r.tensor!r} ({_change_words(r)})" for r in moved]
        if outputs and self.outputs_before is not None:
            frames = []
            if self.forward is not None or names is None or "" in names:
                frames.append(("probe output", self._outputs_rows()))
            else:
                for n in names:
                    out = self._module_outputs_rows(n)
                    if out is not None:
                        frames.append((f"output of {n!r}", out))
            for label, out in frames:
                out = [r for r in out if r.changed and (_isnan(r.max_abs_change) or r.max_abs_change > tol)]
                problems += [f"{label}{' ' + r.output if r.output else ''} ("
                             + (f"non-finite: {r.nonfinite_after} NaN/inf values after the block, finite before"
                                if r.status == "non-finite" else f"max |change| {r.max_abs_change:.4g}") + ")"
                             for r in out]
        if problems:
            where = "the model" if names is None else ", ".join("the model (root)" if n == "" else repr(n)
                                                                for n in names)
            verb = "are" if names is not None and len(names) > 1 else "is"
            shown = problems[:max_items]
            more = [f"... and {len(problems) - max_items} more (audit.summary(details=True) lists every tensor; "
                    "audit.moved() too, as a table, which needs pandas)"] if len(problems) > max_items else []
            raise AssertionError(f"{where} {verb} not frozen; {len(problems)} moved:\n  " + "\n  ".join(shown + more))
