"""FreezeAudit: snapshots, a probe and per-layer modes around a block of code that should leave a model frozen.

One idea per module, tied together here: :mod:`~bnstudy.audit.results` (snapshot and diff tables),
:mod:`~bnstudy.audit.live` (live hooks and lints), :mod:`~bnstudy.audit.elsewhere` (writes outside the model),
:mod:`~bnstudy.audit.boundaries` (compiled and scripted calls), :mod:`~bnstudy.audit.display` (summary, views)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from .._checks import check_bool, check_device, check_materialized, check_model_input, check_module
from ..freeze import eval_after_train, is_pinned, _refuse_fixed_mode
from ..norms import compiled_original, has_running_stats, statistics_source
from .boundaries import _Boundaries
from .display import _Display
from .elsewhere import _WritesElsewhere
from .inspect import LayerRecord, _stat_tensors, layer_kind
from .layer_lints import exported_train_words
from .lints import (MIN_BATCH, WARN_MAX_LAYERS, BNLintWarning, Lint, _at_reset_values, _check_positive_int, _emit,
                    _finite_stats, _label, _lint, _near_init_lint, _nonfinite_lint, _type_name, lint_model,
                    resolve_forward)
from .live import _LiveHooks
from .results import _Results
from .forward_lints import refuse_keyword_only
from .snapshot import Snapshot, _probe_outputs, snapshot

# Names importable from this module before it was split by idea (issue 36) stay importable from here.
from .boundaries import _is_compiled_wrapper  # noqa: E402,F401
from .display import _WIDTH, _n  # noqa: F401
from .elsewhere import FUNCTIONAL, REPLICA, _in_functional_call, _same_memory  # noqa: F401
from .inspect import _STATS  # noqa: F401
from .live import _in_backward  # noqa: F401
from .results import _MODES_COLUMNS, _Row, _change_words, _fmt_change, _isnan  # noqa: F401
from .snapshot import compare_outputs, diff, output_signature  # noqa: F401


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


class FreezeAudit(_LiveHooks, _WritesElsewhere, _Boundaries, _Results, _Display):
    """Audit a block of code that should leave (part of) a model frozen.

    Use as a context manager around a step, an epoch or a whole stage::

        with FreezeAudit(model, probe=x_old, forward=model.forward_a) as audit:
            ...  # the training loop
        audit                             # summary first (a notebook shows it as HTML)
        audit.report()                    # DataFrame: every tensor's max |change|
        audit.modes()                     # DataFrame: each norm/dropout layer's mode during the block
        audit.assert_frozen(model.backbone)  # AssertionError naming what moved

    On entry it snapshots every parameter and buffer (:func:`snapshot`),
    records ``forward(probe)`` in eval mode (:func:`probe_outputs`; skipped when
    ``probe`` is None), runs :func:`lint_model`, measures which modules stay in
    eval mode after ``model.train()`` (:func:`bnstudy.freeze.eval_after_train`:
    pins of every kind), and registers *global* module hooks
    (``torch.nn.modules.module.register_module_forward_pre_hook`` and
    ``register_module_forward_hook(..., always_call=True)``) that act only on the
    model's own norm, dropout and root modules: nothing is attached to the
    model, so a ``copy.deepcopy``, an EMA/``AveragedModel`` copy, a DataParallel
    replica or a pickle made inside the block runs normally and carries no hook,
    and every hook is gone after the block. No hook ever raises into the block:
    an error inside the audit's own bookkeeping is kept in ``hook_errors`` (and
    warned once as a ``RuntimeWarning``) and the training step goes on. Per call
    the hooks record the layer's train/eval flag, its statistics source
    (``batch``/``running``/``per-sample``), whether it wrote its running
    statistics (decided as torch's forward decides: :mod:`bnstudy.norms`),
    whether gradients were on, the batch size (dim 0), values per channel, and
    how many times it wrote within one call into the model. A call into the
    model is the outermost call of any of its modules: of the model itself
    (``model_calls``) or of a part while none of the model runs, as a loop that
    calls ``model.backbone(x)`` and ``model.head(f)`` makes
    (``submodule_calls``, ``{"backbone": 3, "head": 3}``, which the summary's
    first line names: "0 model calls; 6 calls into its submodules (backbone 3,
    head 3)"); ``calls_into_model`` counts both, and the messages that say
    where a finding was seen count it ("call 4 into the model"). Live lints
    (``train_mode_under_no_grad``, ``single_value_per_channel``,
    ``single_sample_batch``, ``small_batch``, ``dropout_off_in_training``,
    ``double_update``, ``cumulative_overwrites_loaded``, ``reset_stats_pinned``
    for statistics reset during the block, ``pin_lost`` for a layer replaced or
    unpinned during the block) fire at most once per layer, *before* the layer
    runs (so a lint names the layer even when PyTorch then raises); after a
    layer wrote, ``nonfinite_stats`` (its statistics just became NaN/inf, with
    the model call and whether the input held inf/NaN) and
    ``stats_update_lost`` (a low-precision update rounded away) fire at the
    call that did it. A module replaced during the block (``model.bn =
    ...``, ``SyncBatchNorm.convert_sync_batchnorm``) is found at the next call
    of the model and watched under its name (``modes()["replaced"]``). On exit
    (also on an exception, which is not suppressed) it removes the hooks,
    snapshots again, re-runs the probe and lints ``pin_lost`` for every module
    pinned (or staying in eval after ``model.train()``) at entry whose name no
    longer is, ``nonfinite_stats`` for statistics that became NaN/inf unseen,
    and ``stats_near_init`` for a layer that entered with reset statistics,
    was updated only a few times and now normalises with them.

    Writes that land elsewhere: a layer of the model that writes into tensors
    that are not its buffers is counted per layer (``modes()["writes_elsewhere"]``,
    lint ``stats_written_elsewhere``, a summary line beside "moved"): the copies
    passed to ``torch.func.functional_call`` (found on the call stack; the
    module keeps its own statistics, so load the updated buffers back or pass
    ``dict(model.named_buffers())``), and a DataParallel replica's copies on
    other devices (lost after the forward). Norm layers *outside* the model that
    wrote statistics during the block (an EMA copy or a teacher in train mode)
    are listed by the model they ran in (:meth:`elsewhere`); one that normalises
    with the reset values mean 0 / variance 1 while it copies an estimated layer of
    the model (or has trained affine parameters) gets ``reset_stats_pinned`` under
    ``"<outer type>:<its name>"`` and a summary line: ``update_bn(loader,
    swa_model)`` on an ``AveragedModel`` whose backbone is pinned.

    Models that are not plain module trees: a ``torch.compile`` wrapper
    (``OptimizedModule``) is audited through the module it wraps
    (``audit.model``; layer names without ``_orig_mod.``, which are also
    accepted); the probe runs eagerly through that module. The hooks do nothing
    while dynamo traces (``torch.compiler.is_compiling()``), so the compiled
    graph is the one the block would compile without the audit, and a compiled
    or TorchScript call is seen at its boundary: each watched layer inside gets a
    *hidden call* with its train/eval flag and gradient mode at that moment, and
    a *hidden write* when its buffers (read before and after) changed
    (``hidden_calls``, ``hidden_writes``; lint ``hidden_calls`` says so once).
    A module compiled in place (``module.compile()``) has no such boundary: the
    audit says so (``notes``) and reports what moved from the snapshots. A
    TorchScript model (``torch.jit.script``/``trace``/``load``) is audited the
    same way: its layers are recognized by the class they were compiled from.

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
    dict of tensors) or ``warn`` not a bool, when ``model.train()`` is not
    supported (the module of a ``torch.export`` program, which keeps the mode it
    was exported in: audit the model before exporting it), or when a ``probe``
    is given and the forward it runs through requires keyword-only arguments
    (a probe is positional: pass ``forward=lambda x: model(x, mask=...)``);
    ``ValueError`` if ``min_batch`` is not a positive integer, ``snapshot_device``
    not a device, a device this machine does not have (``'cuda'`` on a CPU-only
    torch) or ``'meta'``, or when ``model`` has tensors on the ``'meta'`` device
    (no values to snapshot). On entry, a probe the forward refuses raises
    ``TypeError`` (floating tensors in another dtype than the model's) or
    ``ValueError`` (a shape or device it cannot take), naming ``probe`` and
    chaining torch's error, before any hook is registered; the model is left
    as it was.
    """

    def __init__(self, model: nn.Module, probe: Any = None, forward: Callable | nn.Module | None = None, *,
                 min_batch: int = MIN_BATCH, warn: bool = True,
                 snapshot_device: str | torch.device | None = "cpu"):
        check_module("FreezeAudit", "model", model)
        check_model_input("FreezeAudit", "probe", probe, allow_none=True)
        _check_positive_int("min_batch", min_batch, "FreezeAudit")
        check_bool("FreezeAudit", "warn", warn)
        check_device("FreezeAudit", "snapshot_device", snapshot_device, holds_values=True)
        #: The ``torch.compile`` wrapper given as ``model`` (None otherwise); ``model`` is what it wraps.
        self.wrapper = model if compiled_original(model) is not model else None
        model = compiled_original(model)
        check_materialized("FreezeAudit", "model", model)
        try:
            _refuse_fixed_mode("FreezeAudit", model)
        except TypeError as e:  # a torch.export module: say whether it was exported in train mode
            raise TypeError(f"{e}{exported_train_words(model)}") from None
        if isinstance(forward, nn.Module):
            forward = compiled_original(forward)
        self.model, self.probe, self.forward = model, probe, forward
        self._call = resolve_forward(model, forward, "FreezeAudit")
        if probe is not None:
            refuse_keyword_only("FreezeAudit", "probe", self._call)
        self.min_batch, self.warn, self.snapshot_device = min_batch, warn, snapshot_device
        self.lints: list[Lint] = []
        self.before: Snapshot | None = None
        self.after: Snapshot | None = None
        self.outputs_before: dict[str, torch.Tensor] | None = None
        self.outputs_after: dict[str, torch.Tensor] | None = None
        self.output_signatures: Counter = Counter()
        #: Calls of the model itself (``model(x)``).
        self.model_calls = 0
        #: Calls into the model through one of its submodules while no module of the model was running
        #: (``model.backbone(x)`` then ``model.head(f)`` in a loop that never calls ``model``): ``{name: calls}``.
        self.submodule_calls: Counter = Counter()
        #: Calls into the model, of the model or of a submodule (the outermost call of any of its modules): the
        #: count a "call" means in the audit's messages and per-call checks.
        self.calls_into_model = 0
        #: Plain-text notes on what the audit could not see (a module compiled in place), shown in the summary.
        self.notes: list[str] = []
        #: Errors raised inside the audit's own hooks (``"TypeError: ..."``); the block ran on regardless.
        self.hook_errors: list[str] = []
        self._records: dict[int, LayerRecord] = {}
        self._handles: list = []
        self._seen_lints: set = set()
        self._warned_groups: dict = {}  # (code, severity, message) -> layers held back until __exit__
        self._parents: dict = {}
        self._pinned_at_entry: list[str] = []
        self._stays_eval_at_entry: set[str] = set()
        self._pinned_objects: list = []
        self._root_depth = 0
        self._tree_depth = 0  # calls of the model's modules in progress (the model's or a submodule's)
        self._tree_ids: set[int] = set()
        self._tree_names: dict[int, str] = {}
        self._place_at_entry = None
        self._local = threading.local()  # per thread: the stack of module calls in progress
        self._homes: dict[int, dict] = {}  # id(record) -> its buffers (the tensors a write must land in)
        self._entry_state: dict[int, dict] = {}  # id(record) -> reset values / finite / nbt at entry
        self._opaque_cache: dict[int, list] = {}
        self._by_hooks: dict[int, LayerRecord] = {}  # id(module._forward_hooks) -> record: finds replicas
        self._foreign: dict[int, dict] = {}  # norm layers outside the model that wrote statistics
        self._module_ids: list[int] = []
        self.probe_note: str | None = None  # set on exit when the probe had to follow the model or failed

    # -- context manager ----------------------------------------------------
    def __enter__(self) -> "FreezeAudit":
        if self.before is not None:  # a second block would mix its calls into the first block's records
            raise RuntimeError("FreezeAudit: this audit already watched one `with` block and its results describe "
                               "that block; create a new FreezeAudit(...) for each block")
        before = snapshot(self.model, self.snapshot_device)
        if self.probe is not None:  # a probe the model refuses raises here, before any hook is registered
            self._place_at_entry = _place(self._probed())
            self.outputs_before = _probe_outputs(self.model, self.probe, self._call, "FreezeAudit")
        self.before = before
        entry = [lint for lint in lint_model(self.model, min_batch=self.min_batch, warn=False)
                 if self._add_lint(lint)]
        _emit(entry, self.warn)  # grouped: one warning per finding, however many layers
        for lint in entry:
            self._warned_groups.setdefault((lint.code, lint.severity, lint.message), [])
        self._index()
        self._parents = {id(c): m for m in self.model.modules() for c in m.children()}
        self._pinned_at_entry = [n for n, m in self.model.named_modules() if is_pinned(m)]
        self._pinned_objects = [(n, m) for n, m in self.model.named_modules() if is_pinned(m)]
        self._stays_eval_at_entry = eval_after_train(self.model)
        for n, m in self.model.named_modules():
            if getattr(m, "_compiled_call_impl", None) is not None:
                self.notes.append(f"{type(m).__name__} {_label(n)} is compiled in place (module.compile()): its calls "
                                  "run compiled with no eager boundary, so the audit sees none of the layers inside "
                                  "(modes show 'not called'); what moved is from the snapshots. torch.compile(module), "
                                  "a wrapper, is seen at each call")
        self._handles.append(register_module_forward_pre_hook(self._pre_hook))
        self._handles.append(register_module_forward_hook(self._post_hook, always_call=True))
        return self

    def _index(self) -> None:
        """(Re)build the records of the model's watched layers, their parents' slots and their buffers."""
        for name, m in self.model.named_modules():
            kind = layer_kind(m, m is self.model)
            if kind is None or id(m) in self._records:
                continue
            rec = LayerRecord(name, m, kind)
            self._records[id(m)] = rec
            self._remember(rec)
        self._module_ids = [id(m) for m in self.model.modules()]
        self._tree_ids = set(self._module_ids)
        self._tree_names = {id(m): n for n, m in self.model.named_modules()}
        self._opaque_cache.clear()

    def _remember(self, rec: LayerRecord) -> None:
        m = rec.module
        hooks = m.__dict__.get("_forward_hooks")
        if hooks is not None:
            self._by_hooks[id(hooks)] = rec
        if rec.kind in ("batchnorm", "instancenorm", "frozen_batchnorm"):
            self._homes[id(rec)] = _stat_tensors(m)
            if has_running_stats(m):
                nbt = getattr(m, "num_batches_tracked", None)
                self._entry_state[id(rec)] = dict(reset=_at_reset_values(m), finite=_finite_stats(m),
                                                  nbt=int(nbt) if isinstance(nbt, torch.Tensor) else None)

    def __exit__(self, *exc) -> bool:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.after = snapshot(self.model, self.snapshot_device)
        if self.probe is not None:
            self._rerun_probe()
        self._exit_lints()
        self._emit_held()
        return False

    def _exit_lints(self) -> None:
        now = dict(self.model.named_modules())
        stays = eval_after_train(self.model)
        for n in self._pinned_at_entry:
            if n in now and not is_pinned(now[n]) and n not in stays:
                self._pin_lost(n, now[n], "was pinned in eval mode when the audit started and is not pinned now "
                                          "(replaced by a conversion such as SyncBatchNorm.convert_sync_batchnorm, "
                                          "or unpinned)")
        for n in sorted(self._stays_eval_at_entry - stays):
            if n in now and layer_kind(now[n]) is not None:
                self._pin_lost(n, now[n], "stayed in eval mode after model.train() when the audit started (a "
                                          "class or parent train() override kept it there) and no longer does")
        unseen = []
        for rec in self._records.values():
            if rec.kind in ("batchnorm", "instancenorm") and not (rec.writes or rec.hidden_writes) and any(
                    (t0 := self.before.tensors.get(f"{rec.name}.{k}" if rec.name else k)) is not None
                    and (t0.shape != t.shape or not torch.equal(t0, t.detach().to(t0.device)))
                    for k, t in _stat_tensors(rec.module).items()):
                unseen.append(rec.name)
        if unseen:
            self.notes.append(f"running statistics of {', '.join(map(repr, unseen[:6]))}"
                              + (f" and {len(unseen) - 6} more" if len(unseen) > 6 else "")
                              + " changed with no call of theirs seen: they ran where the audit has no boundary (a "
                              "torch.compile'd function rather than module, a module compiled in place), or the "
                              "buffers were written directly (load_state_dict, copy_, reset_running_stats)")
        for rec in self._records.values():
            m, state = rec.module, self._entry_state.get(id(rec))
            if state is None or not has_running_stats(m) or rec.kind == "model":
                continue
            if not _finite_stats(m):
                self._add_lint(_nonfinite_lint(rec.name, m, " after the block (they were finite at entry)"
                                               if state["finite"] else ""), emit=True)
            elif state["reset"] and not _at_reset_values(m) and state["nbt"] is not None and rec.kind == "batchnorm":
                nbt = getattr(m, "num_batches_tracked", None)
                k = int(nbt) - state["nbt"] if isinstance(nbt, torch.Tensor) else rec.writes + rec.hidden_writes
                if k > 0 and (statistics_source(m) == "running" or rec.name in stays):
                    near = _near_init_lint(rec.name, m, k, " during the block", known_reset=True)
                    if near is not None:
                        self._add_lint(near, emit=True)

    def _pin_lost(self, name: str, module: nn.Module, what: str) -> None:
        self._add_lint(_lint("pin_lost", name, f"{_type_name(module)} {_label(name)} {what}: the next model.train() "
                             "puts it in train mode; use bnstudy.freeze.convert_sync_batchnorm (it keeps every kind "
                             "of pin), or pin again (bnstudy.pin_eval)"), emit=True)

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
            self.outputs_after = _probe_outputs(self.model, self._probe_now(), self._call, "FreezeAudit")
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
