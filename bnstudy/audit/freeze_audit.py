"""FreezeAudit: snapshots, a probe and per-layer modes around a block of code that should leave a model frozen."""

from __future__ import annotations

import html
import math
import textwrap
from collections import Counter
from typing import Any, Callable, Iterable

import pandas as pd
import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from .._checks import (check_bool, check_device, check_int, check_model_input, check_module, check_number, check_str,
                       module_names)
from ..freeze import is_pinned
from ..norms import counts_batches, statistics_source, updates_running_stats
from .inspect import LayerRecord, layer_kind
from .lints import (MIN_BATCH, WARN_MAX_LAYERS, BNLintWarning, Lint, _batch_lints, _check_positive_int, _emit,
                    _label, _lint, format_lints, lint_model, lints_frame, resolve_forward)
from .snapshot import Snapshot, _set_all_eval, _restore, compare_outputs, diff, output_signature, probe_outputs, snapshot

_WIDTH = 100


def _n(count: int, word: str, plural: str | None = None) -> str:
    """``"1 call"``, ``"3 calls"``: a count with its noun in the right number."""
    return f"{count} {word if count == 1 else (plural or word + 's')}"


def _place(module: nn.Module) -> tuple[torch.device, torch.dtype] | None:
    """The device and floating dtype of ``module``'s first floating parameter (else buffer); None if it has none."""
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point() and not nn.parameter.is_lazy(t):
            return t.device, t.dtype
    return None


def _follow(x: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """``x`` (a tensor, or a tuple, list or dict of them) moved to ``device``, floating tensors cast to ``dtype``."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype) if dtype is not None and x.is_floating_point() else x.to(device)
    if isinstance(x, dict):
        return {k: _follow(v, device, dtype) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_follow(v, device, dtype) for v in x)
    return x


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class FreezeAudit:
    """Audit a block of code that should leave (part of) a model frozen.

    Use as a context manager around a step, an epoch or a whole stage::

        with FreezeAudit(model, probe=x_old, forward=model.forward_a) as audit:
            ...  # the training loop
        audit                             # summary first (a notebook shows it as HTML)
        audit.report()                    # DataFrame: every tensor's max |change|
        audit.modes()                     # DataFrame: each norm/dropout layer's mode during the block
        audit.assert_frozen("backbone")   # AssertionError naming what moved

    On entry it snapshots every parameter and buffer (:func:`snapshot`),
    records ``forward(probe)`` in eval mode (:func:`probe_outputs`; skipped when
    ``probe`` is None), runs :func:`lint_model`, and registers *global* module
    hooks (``torch.nn.modules.module.register_module_forward_pre_hook``) that act
    only on the model's own norm, dropout and root modules: nothing is attached
    to the model, so a ``copy.deepcopy``, an EMA/``AveragedModel`` copy, a
    DataParallel replica or a pickle made inside the block runs normally and
    carries no hook, and every hook is gone after the block. Per call the hooks
    record the layer's train/eval flag, its statistics source
    (``batch``/``running``/``per-sample``), whether it wrote its running
    statistics (decided as torch's forward decides: :mod:`bnstudy.norms`),
    whether gradients were on, the batch size (dim 0), values per channel, and
    how many times it wrote within one call of the model. Live lints
    (``train_mode_under_no_grad``, ``single_value_per_channel``,
    ``single_sample_batch``, ``small_batch``, ``dropout_off_in_training``,
    ``double_update``) fire at most once per layer, *before* the layer runs (so a
    lint names the layer even when PyTorch then raises). On exit (also on an
    exception, which is not suppressed) it removes the hooks, snapshots again,
    re-runs the probe and lints ``pin_lost`` for every module pinned at entry
    whose name no longer holds a pinned module.

    A block that moves or casts the model (``model.double()``, ``.half()``,
    ``.to("cuda")``) gets the probe moved and cast the same way before the
    re-run: it goes to the device and floating dtype of the first floating
    parameter (else buffer) of the probed module (``forward`` when it is a
    module, else the model), integer tensors keep their dtype. The outputs
    then compare across the cast, so the rounding of a lower precision counts
    as change. ``probe_note`` says so; if the re-run still fails (a model left
    in mixed dtypes), the outputs are not compared, ``probe_note`` gives the
    error, a ``RuntimeWarning`` is emitted, and every other result (the tensor
    diff, modes, lints) is kept.

    ``forward``: what the probe runs through: None (the model), a submodule
    (``model.backbone``) or any callable of the probe (``model.forward_a``); a
    tuple probe is unpacked. The same convention as :func:`lint_forward_modes`.
    ``min_batch``: the ``small_batch`` threshold (see :data:`MIN_BATCH`).
    ``warn``: emit the lints as :class:`BNLintWarning` (they are always kept in
    ``.lints``). Identical findings are grouped as ``print(audit)`` groups them:
    the lints found on entry in one warning per finding (``[code] 40 layers
    (a, b, ... and 34 more): message``); a live lint warns at its first layer, and
    the other layers with the same finding are named in one warning on exit.
    Warnings point at the user's line, not at torch's module code.
    ``snapshot_device``: where the snapshots live.
    Raises ``TypeError`` if ``model`` is not an ``nn.Module``, ``forward`` is
    not callable, ``probe`` is not a model input (a tensor, or a tuple, list or
    dict of tensors) or ``warn`` not a bool, ``ValueError`` if ``min_batch`` is
    not a positive integer or ``snapshot_device`` not a device.
    """

    def __init__(self, model: nn.Module, probe: Any = None, forward: Callable | nn.Module | None = None, *,
                 min_batch: int = MIN_BATCH, warn: bool = True,
                 snapshot_device: str | torch.device | None = "cpu"):
        check_module("FreezeAudit", "model", model)
        check_model_input("FreezeAudit", "probe", probe, allow_none=True)
        _check_positive_int("min_batch", min_batch, "FreezeAudit")
        check_bool("FreezeAudit", "warn", warn)
        check_device("FreezeAudit", "snapshot_device", snapshot_device)
        self.model, self.probe, self.forward = model, probe, forward
        self._call = resolve_forward(model, forward, "FreezeAudit")
        self.min_batch, self.warn, self.snapshot_device = min_batch, warn, snapshot_device
        self.lints: list[Lint] = []
        self.before: Snapshot | None = None
        self.after: Snapshot | None = None
        self.outputs_before: dict[str, torch.Tensor] | None = None
        self.outputs_after: dict[str, torch.Tensor] | None = None
        self.output_signatures: Counter = Counter()
        self.model_calls = 0
        self._records: dict[int, LayerRecord] = {}
        self._handles: list = []
        self._seen_lints: set = set()
        self._warned_groups: dict = {}  # (code, severity, message) -> layers held back until __exit__
        self._parents: dict = {}
        self._pinned_at_entry: list[str] = []
        self._root_depth = 0
        self._place_at_entry = None
        self.probe_note: str | None = None  # set on exit when the probe had to follow the model or failed

    # -- context manager ----------------------------------------------------
    def __enter__(self) -> "FreezeAudit":
        self.before = snapshot(self.model, self.snapshot_device)
        if self.probe is not None:
            self._place_at_entry = _place(self._probed())
            self.outputs_before = probe_outputs(self.model, self.probe, self._call)
        entry = [lint for lint in lint_model(self.model, min_batch=self.min_batch, warn=False)
                 if self._add_lint(lint)]
        _emit(entry, self.warn)  # grouped: one warning per finding, however many layers
        for lint in entry:
            self._warned_groups.setdefault((lint.code, lint.severity, lint.message), [])
        for name, m in self.model.named_modules():
            kind = layer_kind(m, m is self.model)
            if kind is None or id(m) in self._records:
                continue
            self._records[id(m)] = LayerRecord(name, m, kind)
        self._parents = {id(c): m for m in self.model.modules() for c in m.children()}
        self._pinned_at_entry = [n for n, m in self.model.named_modules() if is_pinned(m)]
        self._handles.append(register_module_forward_pre_hook(self._pre_hook))
        self._handles.append(register_module_forward_hook(self._post_hook))
        return self

    def __exit__(self, *exc) -> bool:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.after = snapshot(self.model, self.snapshot_device)
        if self.probe is not None:
            self._rerun_probe()
        now = dict(self.model.named_modules())
        for n in self._pinned_at_entry:
            if n in now and not is_pinned(now[n]):
                self._add_lint(_lint("pin_lost", n, f"{type(now[n]).__name__} {_label(n)} was pinned in eval mode "
                                     "when the audit started and is not pinned now (replaced by a conversion such "
                                     "as SyncBatchNorm.convert_sync_batchnorm, or unpinned): the next model.train() "
                                     "puts it in train mode; use bnstudy.freeze.convert_sync_batchnorm, or pin again"),
                               emit=True)
        self._emit_held()
        return False

    def _probed(self) -> nn.Module:
        return self.forward if isinstance(self.forward, nn.Module) else self.model

    def _probe_now(self) -> Any:
        """The probe moved and cast as the block moved and cast the model (unchanged if it did not)."""
        place = _place(self._probed())
        if place is None or self._place_at_entry is None or place == self._place_at_entry:
            return self.probe
        (dev0, dt0), (dev1, dt1) = self._place_at_entry, place
        self.probe_note = (f"the block moved the model from {dev0}/{str(dt0).removeprefix('torch.')} to "
                           f"{dev1}/{str(dt1).removeprefix('torch.')}; the probe was moved and cast the same way, so "
                           "the output change includes the cast's rounding")
        return _follow(self.probe, dev1, dt1 if dt1 != dt0 else None)

    def _rerun_probe(self) -> None:
        import warnings
        try:
            self.outputs_after = probe_outputs(self.model, self._probe_now(), self._call)
        except Exception as e:  # the audit's own re-run must not lose the block's results
            self.outputs_after = None
            self.probe_note = ((self.probe_note + "; but ") if self.probe_note else "") + (
                f"the probe could not be re-run after the block ({type(e).__name__}: {e}); outputs not compared")
            warnings.warn(f"FreezeAudit: {self.probe_note}", RuntimeWarning, stacklevel=3)

    def _emit_held(self) -> None:
        """One warning per live finding that more layers had after its first warning (see ``warn``)."""
        from .._checks import user_stacklevel
        import warnings
        held = [(key, layers) for key, layers in self._warned_groups.items() if layers]
        for (code, _severity, message), layers in held:
            shown = ", ".join(_label(n) for n in layers[:WARN_MAX_LAYERS])
            more = f" and {len(layers) - WARN_MAX_LAYERS} more" if len(layers) > WARN_MAX_LAYERS else ""
            warnings.warn(f"[{code}] {_n(len(layers), 'more layer')} ({shown}{more}) with the same finding: {message}",
                          BNLintWarning, stacklevel=user_stacklevel())
            layers.clear()

    # -- hooks (global: they see every module call in the process and ignore all but the model's) -------------
    def _pre_hook(self, module: nn.Module, args) -> None:
        rec = self._records.get(id(module))
        if rec is None or rec.module is not module:
            return
        if module is self.model:  # the root, whatever its kind (a bare BatchNorm is a model too)
            self._root_depth += 1
            if self._root_depth == 1:
                self.model_calls += 1
                for r in self._records.values():
                    r.writes_this_call = 0
        training, grad = module.training, torch.is_grad_enabled()
        rec.calls += 1
        rec.train_calls += training
        rec.grad_calls += grad
        source = statistics_source(module)
        if source is not None and rec.kind != "model":
            rec.stats[source] += 1
        writes = rec.kind in ("batchnorm", "instancenorm") and (updates_running_stats(module)
                                                                or counts_batches(module))
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is not None and x.dim() >= 1 and rec.kind != "model":
            n = int(x.shape[0])
            rec.min_batch = n if rec.min_batch is None else min(rec.min_batch, n)
            if x.dim() >= 2 and x.shape[1] > 0:
                vpc = x.numel() // int(x.shape[1])
                rec.min_values_per_channel = vpc if rec.min_values_per_channel is None else min(
                    rec.min_values_per_channel, vpc)
        if writes:
            rec.writes += 1
            in_backward = _in_backward()
            rec.backward_writes += in_backward
            if self._root_depth > 0 or in_backward:
                rec.writes_this_call += 1
                rec.max_writes_per_model_call = max(rec.max_writes_per_model_call, rec.writes_this_call)
            if in_backward:
                self._add_lint(_lint("double_update", rec.name,
                                     f"{type(module).__name__} wrote its running statistics during a backward pass: "
                                     "activation checkpointing (torch.utils.checkpoint) recomputes the forward and "
                                     "updates the statistics a second time each step (and, with momentum, towards "
                                     "the same batch twice); keep norm layers outside checkpointed blocks or pin "
                                     "them"), emit=True)
            elif rec.writes_this_call > 1:
                self._add_lint(_lint("double_update", rec.name,
                                     f"{type(module).__name__} wrote its running statistics {rec.writes_this_call} "
                                     "times in one call of the model (a layer reused in one forward): each step "
                                     "moves its statistics several times, and precise-BN estimates pool its "
                                     "calls"), emit=True)
            if not grad:
                self._add_lint(_lint("train_mode_under_no_grad", rec.name,
                                     f"{type(module).__name__} ran in train mode under torch.no_grad(): no gradient, "
                                     "but it overwrote running_mean/running_var (a teacher or validation pass left "
                                     "in train mode?)"), emit=True)
        if rec.kind == "batchnorm" and source == "batch" and x is not None and x.dim() >= 2:
            for lint in _batch_lints(rec.name, module, int(x.shape[0]), x.numel() // int(x.shape[1]),
                                     self.min_batch):
                self._add_lint(lint, emit=True)
        elif rec.kind == "dropout" and grad and not training and self._feeds_trainable(module):
            self._add_lint(_lint("dropout_off_in_training", rec.name,
                                 f"{type(module).__name__} was in eval mode during a forward pass with gradients on: "
                                 "dropout is off while training (model.eval() on the whole model, or pin_eval on a "
                                 "block, which pins its dropout too; pin_norm_eval pins only the norm layers)"),
                           emit=True)

    def _post_hook(self, module: nn.Module, args, output) -> None:
        if module is not self.model:
            return
        self._root_depth = max(0, self._root_depth - 1)
        self.output_signatures[f"{output_signature(output)} ({'train' if module.training else 'eval'} mode)"] += 1

    def _feeds_trainable(self, dropout: nn.Module) -> bool:
        # Dropout switched off inside a frozen block is the point of the freeze; next to trainable
        # parameters (its parent holds some) it means the layers being trained lost their dropout.
        if ("dropout_off_in_training", self._records[id(dropout)].name) in self._seen_lints:
            return False
        parent = self._parents.get(id(dropout), self.model)
        return any(p.requires_grad for p in parent.parameters())

    def _add_lint(self, lint: Lint, emit: bool = False) -> bool:
        """Keep ``lint`` (once per code and layer); with ``emit``, warn it unless the same finding was warned
        for another layer already, in which case its layer waits for one grouped warning on exit."""
        key = (lint.code, lint.layer)
        if key in self._seen_lints:
            return False
        self._seen_lints.add(key)
        self.lints.append(lint)
        if emit and self.warn and lint.severity == "warning":
            group = (lint.code, lint.severity, lint.message)
            if group in self._warned_groups:
                self._warned_groups[group].append(lint.layer)
            else:
                self._warned_groups[group] = []
                _emit([lint], True)
        return True

    # -- results --------------------------------------------------------------
    def _require_done(self) -> None:
        if self.after is None:
            raise RuntimeError("the audit has no result yet: use it as `with FreezeAudit(model) as audit: ...`")

    def report(self) -> pd.DataFrame:
        """Every parameter and buffer with its largest absolute change (see :func:`diff`)."""
        self._require_done()
        return diff(self.before, self.after)

    def outputs(self) -> pd.DataFrame:
        """The probe's outputs before against after (see :func:`compare_outputs`); empty without a probe or
        when the probe could not be re-run after the block (``probe_note`` says why)."""
        self._require_done()
        if self.outputs_before is None or self.outputs_after is None:
            return compare_outputs({}, {})
        return compare_outputs(self.outputs_before, self.outputs_after)

    def modes(self) -> pd.DataFrame:
        """One row per normalisation layer, dropout layer and the model itself, as seen during the block.

        Columns: ``module``, ``type``, ``kind`` (:func:`layer_kind`), ``calls``,
        ``train_calls``, ``eval_calls``, ``grad_calls`` (calls with gradients
        on), ``mode`` (``train``/``eval``/``mixed``/``not called``), ``stats``
        (statistics sources used, e.g. ``batch``), ``updated_running_stats``,
        ``writes`` (calls that wrote running statistics), ``calls_per_model_call``
        (``calls`` / calls of the model; NaN when the model itself was never
        called, e.g. only through ``model.forward_b``),
        ``max_writes_per_model_call``, ``backward_writes`` (writes during a
        backward pass: activation checkpointing), ``min_batch`` (smallest dim 0
        seen), ``min_values_per_channel``, ``pinned`` and ``also`` (the layer's other names when it is
        shared or reused at several places: one layer, one row, under its first name).
        """
        rows = []
        names_of: dict = {}
        for n, m in self.model.named_modules(remove_duplicate=False):
            names_of.setdefault(id(m), []).append(n)
        for rec in self._records.values():
            mode = ("not called" if rec.calls == 0 else "train" if rec.train_calls == rec.calls
                    else "eval" if rec.train_calls == 0 else "mixed")
            rows.append(dict(module=rec.name, type=type(rec.module).__name__, kind=rec.kind, calls=rec.calls,
                             train_calls=rec.train_calls, eval_calls=rec.calls - rec.train_calls,
                             grad_calls=rec.grad_calls, mode=mode, stats=",".join(sorted(rec.stats)),
                             updated_running_stats=rec.updated_running_stats, writes=rec.writes,
                             calls_per_model_call=rec.calls / self.model_calls if self.model_calls else math.nan,
                             max_writes_per_model_call=rec.max_writes_per_model_call,
                             backward_writes=rec.backward_writes, min_batch=rec.min_batch,
                             min_values_per_channel=rec.min_values_per_channel, pinned=is_pinned(rec.module),
                             also=tuple(n for n in names_of.get(id(rec.module), []) if n != rec.name)))
        return pd.DataFrame(rows, columns=["module", "type", "kind", "calls", "train_calls", "eval_calls",
                                           "grad_calls", "mode", "stats", "updated_running_stats", "writes",
                                           "calls_per_model_call", "max_writes_per_model_call", "backward_writes",
                                           "min_batch", "min_values_per_channel", "pinned", "also"])

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
        names = module_names(fn, "modules", self.model, modules)
        items = [modules] if isinstance(modules, (str, nn.Module)) else modules
        out: list[str] = []
        for name, item in zip(names, items):
            # a module object reachable under several names (shared, reused) is all of them
            expanded = self._all_names(item) if isinstance(item, nn.Module) and item is not self.model else [name]
            out += [n for n in expanded if n not in out]
        return out

    def _all_names(self, module: nn.Module) -> list[str]:
        """Every qualified name ``module`` has in the model (``named_modules(remove_duplicate=False)`` order)."""
        return [n for n, m in self.model.named_modules(remove_duplicate=False) if m is module]

    def moved(self, modules: str | nn.Module | Iterable | None = None, tol: float = 0.0) -> pd.DataFrame:
        """The rows of :meth:`report` under ``modules`` whose ``max_abs_change`` exceeds ``tol`` (or that
        appeared, vanished or changed shape). ``modules``: qualified module names or module objects of the
        model, one or several (``""`` or None: the whole model); raises ``ValueError`` naming an unknown
        module or a negative ``tol``."""
        self._require_done()
        check_number("FreezeAudit.moved", "tol", tol, minimum=0)
        rep = self.report()
        prefixes = self._names(modules, "FreezeAudit.moved")
        inside = rep["module"].map(lambda m: prefixes is None or any(
            p == "" or m == p or m.startswith(p + ".") for p in prefixes))
        moved = rep["changed"] & (rep["max_abs_change"].isna() | (rep["max_abs_change"] > tol))
        return rep[inside & moved].reset_index(drop=True)

    @torch.no_grad()
    def module_outputs(self, name: str) -> pd.DataFrame | None:
        """The named submodule's *own* eval-mode output on the probe, before against after (columns as
        :meth:`outputs`): its input is captured by running the probe through the model (eval mode, flags
        restored), and fed to the submodule with its parameters and buffers as they were at entry
        (``torch.func.functional_call`` with the entry snapshot) and as they are now. Upstream changes
        therefore do not count against it. When the block moved or cast the model, the probe and the entry
        tensors follow it (``probe_note``). None when there is no probe, the probe never reaches it, or it
        cannot be re-run."""
        self._require_done()
        check_str("FreezeAudit.module_outputs", "name", name)
        if name not in dict(self.model.named_modules()):
            module_names("FreezeAudit.module_outputs", "name", self.model, name)  # raises, naming the choices
        if self.probe is None or self.outputs_after is None:
            return None
        sub = self.model.get_submodule(name)
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
        return compare_outputs({k: v.detach().cpu() for k, v in _flatten(out_before).items()},
                               {k: v.detach().cpu() for k, v in _flatten(out_after).items()})

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
        (``audit.moved(...)`` lists all), one per line. Returns None when nothing
        moved.
        """
        self._require_done()
        names = self._names(modules, "FreezeAudit.assert_frozen")
        check_bool("FreezeAudit.assert_frozen", "outputs", outputs)
        check_number("FreezeAudit.assert_frozen", "tol", tol, minimum=0)
        check_int("FreezeAudit.assert_frozen", "max_items", max_items)
        moved = self.moved(names, tol)
        problems = [f"{r.kind} {r.tensor!r} (max |change| {_fmt_change(r)})" for r in moved.itertuples()]
        if outputs and self.outputs_before is not None:
            frames = []
            if self.forward is not None or names is None or "" in names:
                frames.append(("probe output", self.outputs()))
            else:
                for n in names:
                    out = self.module_outputs(n)
                    if out is not None:
                        frames.append((f"output of {n!r}", out))
            for label, out in frames:
                out = out[out["changed"] & (out["max_abs_change"].isna() | (out["max_abs_change"] > tol))]
                problems += [f"{label}{' ' + r.output if r.output else ''} (max |change| {r.max_abs_change:.4g})"
                             for r in out.itertuples()]
        if problems:
            where = "the model" if names is None else ", ".join(repr(n) for n in names)
            shown = problems[:max_items]
            more = [f"... and {len(problems) - max_items} more (audit.moved() lists every tensor)"] \
                if len(problems) > max_items else []
            raise AssertionError(f"{where} is not frozen; {len(problems)} moved:\n  " + "\n  ".join(shown + more))

    # -- display ----------------------------------------------------------------
    def _headline(self) -> list[str]:
        rep = self.report()
        moved = rep[rep["changed"]]

        def counts(df) -> str:  # distinct tensors; a shared one counts once, its extra names are added
            seen: set = set()
            keep = []
            for t, others in zip(df["tensor"], df["shared_with"]):
                keep.append(not any(o in seen for o in others))
                seen.add(t)
            distinct = df[keep]
            text = (f"{_n(len(distinct), 'tensor')} ({_n(int((distinct['kind'] == 'param').sum()), 'parameter')}, "
                    f"{_n(int((distinct['kind'] == 'buffer').sum()), 'buffer')}")
            extra = len(df) - len(distinct)
            return text + (f"; {_n(extra, 'more name')} of shared tensors)" if extra else ")")

        lines = [f"FreezeAudit of {type(self.model).__name__}: {counts(rep)}, {_n(self.model_calls, 'model call')}"]
        if moved.empty:
            lines.append("  moved: nothing (every parameter and buffer is bit-identical)")
        else:
            lines.append(f"  moved: {counts(moved)} in {_n(int(moved['module'].nunique()), 'module')}")
        if self.outputs_before is not None and self.outputs_after is None:
            lines += textwrap.wrap(f"  probe outputs: not compared: {self.probe_note}", width=_WIDTH,
                                   subsequent_indent="    ")
        elif self.outputs_before is not None:
            out = self.outputs()
            worst = out["max_abs_change"].max() if len(out) else 0.0
            lines.append(f"  probe outputs: max |change| {worst:.4g}"
                         + (" (bit-identical)" if not out["changed"].any() else ""))
            if self.probe_note:
                lines += textwrap.wrap(f"    ({self.probe_note})", width=_WIDTH, subsequent_indent="    ")
        warn = [x for x in self.lints if x.severity == "warning"]
        groups = len({(x.code, x.message) for x in warn})
        lines.append(f"  lints: {len(warn) or 'none'}" + (f" ({groups} distinct)" if warn else ""))
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
        modes = self.modes()
        shown = modes[modes["kind"] != "model"]
        if len(shown):
            groups: dict = {}
            for r in shown.itertuples():
                detail = f"{r.mode}, {_n(r.calls, 'call')}"
                if r.stats:
                    detail += f", {r.stats} stats"
                if r.updated_running_stats:
                    detail += f", WROTE running stats ({r.writes}x)"
                if r.backward_writes:
                    detail += f", {_n(r.backward_writes, 'write')} in backward"
                if r.grad_calls < r.calls:
                    detail += f", {r.calls - r.grad_calls} without grad"
                if r.min_batch is not None and not pd.isna(r.min_batch):
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
        rep = self.report()
        moved = rep[rep["changed"]]
        if len(moved):
            lines.append("  moved tensors:")
            rows = list(moved.itertuples())
            for r in (rows if details else rows[:max_rows]):
                lines.append(f"    {r.kind:<6} {r.tensor:<40} max |change| {_fmt_change(r)}")
            if not details and len(rows) > max_rows:
                lines.append(f"    ... {len(rows) - max_rows} more (audit.moved() or audit.summary(details=True))")
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
        if warn:
            md += ["", "| lint | layers | message |", "| --- | --- | --- |"]
            from .lints import group_lints
            for lint, layers in group_lints(warn):
                who = ", ".join(_label(n) for n in layers[:6]) + (f" (+{len(layers) - 6})" if len(layers) > 6 else "")
                md.append(f"| `{lint.code}` | {who} | {lint.message.replace('|', '/')} |")
        return "\n".join(md)

    def _repr_html_(self) -> str:
        if self.after is None:
            return f"<code>FreezeAudit({html.escape(type(self.model).__name__)})</code>: not run"
        moved = self.moved()
        table = moved[["tensor", "kind", "max_abs_change"]].head(20).to_html(index=False) if len(moved) else ""
        return (f"<details open><summary><b>{html.escape(self._headline()[0])}</b></summary>"
                f"<pre>{html.escape(self.summary())}</pre>{table}</details>")


def _fmt_change(r) -> str:
    if r.before is not None and r.after is not None:
        return f"{r.max_abs_change:.4g} ({r.before} -> {r.after})"
    if isinstance(r.max_abs_change, float) and math.isnan(r.max_abs_change):
        return r.status
    return f"{r.max_abs_change:.4g}"
