"""FreezeAudit: snapshots, a probe and per-layer modes around a block of code that should leave a model frozen."""

from __future__ import annotations

import html
import math
import sys
import textwrap
import threading
import weakref
from collections import Counter
from types import SimpleNamespace
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from .._checks import (check_bool, check_device, check_int, check_model_input, check_module, check_number, check_str,
                       module_names)
from .._checks import LazyPandas
from ..freeze import eval_after_train, is_pinned, _refuse_fixed_mode
from ..norms import (compiled_original, counts_batches, has_running_stats, is_script_module, statistics_source,
                     updates_running_stats)
from .inspect import LayerRecord, layer_kind
from .lints import (MIN_BATCH, WARN_MAX_LAYERS, BNLintWarning, Lint, _at_reset_values, _batch_lints,
                    _check_positive_int, _emit, _finite_stats, _label, _lint, _low_precision, _near_init_lint,
                    _nonfinite_lint, _type_name, format_lints, lint_model, lints_frame, resolve_forward)
from .snapshot import (OUTPUT_COLUMNS, Snapshot, _set_all_eval, _restore, compare_outputs, compare_outputs_rows, diff,
                       diff_frame, diff_rows, nonfinite_words, output_signature, probe_outputs, snapshot)

pd = LazyPandas()  # pandas is imported only when a table is asked for
_Row = SimpleNamespace  # a table row inside the audit (attribute access, as DataFrame.itertuples gives)
_MODES_COLUMNS = ["module", "type", "kind", "calls", "train_calls", "eval_calls", "grad_calls", "mode", "stats",
                  "updated_running_stats", "writes", "calls_per_model_call", "max_writes_per_model_call",
                  "backward_writes", "min_batch", "min_values_per_channel", "pinned", "also", "writes_elsewhere",
                  "elsewhere", "hidden_calls", "hidden_writes", "replaced"]


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)

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


_STATS = ("running_mean", "running_var", "num_batches_tracked")
#: Where a write that no audited buffer shows went (values of ``LayerRecord.elsewhere``).
FUNCTIONAL = "torch.func.functional_call copies"
REPLICA = "DataParallel replica copies"


def _stat_tensors(m: nn.Module) -> dict:
    """The running-statistics buffers of ``m`` that exist now (``running_mean``, ``running_var``,
    ``num_batches_tracked``)."""
    return {k: t for k in _STATS if isinstance(t := getattr(m, k, None), torch.Tensor)}


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are the same values in memory (the same tensor, or a view of the same storage)."""
    return a is b or (a.device == b.device and a.numel() == b.numel() and a.data_ptr() == b.data_ptr())


def _in_functional_call() -> bool:
    """Whether the current module call runs inside ``torch.func.functional_call`` (or the deprecated
    ``torch.nn.utils.stateless.functional_call``), found on the Python stack."""
    f = sys._getframe(2)
    for _ in range(400):
        if f is None:
            return False
        code = f.f_code
        if code.co_name in ("_functional_call", "functional_call") and code.co_filename.endswith(
                ("stateless.py", "functional_call.py")):
            return True
        f = f.f_back
    return False


def _is_compiled_wrapper(m: nn.Module) -> bool:
    return type(m).__name__ == "OptimizedModule" and isinstance(getattr(m, "_orig_mod", None), nn.Module)


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
    how many times it wrote within one call of the model. Live lints
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
    are listed by the model they ran in (:meth:`elsewhere`).

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
    dict of tensors) or ``warn`` not a bool, or when ``model.train()`` is not
    supported (the module of a ``torch.export`` program, which keeps the mode it
    was exported in: audit the model before exporting it); ``ValueError`` if
    ``min_batch`` is not a positive integer or ``snapshot_device`` not a device.
    """

    def __init__(self, model: nn.Module, probe: Any = None, forward: Callable | nn.Module | None = None, *,
                 min_batch: int = MIN_BATCH, warn: bool = True,
                 snapshot_device: str | torch.device | None = "cpu"):
        check_module("FreezeAudit", "model", model)
        check_model_input("FreezeAudit", "probe", probe, allow_none=True)
        _check_positive_int("min_batch", min_batch, "FreezeAudit")
        check_bool("FreezeAudit", "warn", warn)
        check_device("FreezeAudit", "snapshot_device", snapshot_device)
        #: The ``torch.compile`` wrapper given as ``model`` (None otherwise); ``model`` is what it wraps.
        self.wrapper = model if compiled_original(model) is not model else None
        model = compiled_original(model)
        _refuse_fixed_mode("FreezeAudit", model)
        if isinstance(forward, nn.Module):
            forward = compiled_original(forward)
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
        self.before = snapshot(self.model, self.snapshot_device)
        if self.probe is not None:
            self._place_at_entry = _place(self._probed())
            self.outputs_before = probe_outputs(self.model, self.probe, self._call)
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
                             "of pin), or pin again (bnstudy.freeze.pin_eval)"), emit=True)

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
    # Both hooks return at once while dynamo traces (torch.compile): the compiled graph is then what it would be
    # without the audit, and nothing of the audit is traced. Neither ever raises into the user's step.
    def _pre_hook(self, module: nn.Module, args) -> None:
        if torch.compiler.is_compiling():
            return
        try:
            self._pre(module, args)
        except Warning:  # a lint turned into an error by the user's warning filter: theirs to see
            raise
        except Exception as e:  # noqa: BLE001
            self._hook_failed(e)

    def _post_hook(self, module: nn.Module, args, output) -> None:
        if torch.compiler.is_compiling():
            return
        try:
            self._post(module, output)
        except Warning:
            raise
        except Exception as e:  # noqa: BLE001
            self._hook_failed(e)

    def _hook_failed(self, e: Exception) -> None:
        import warnings
        self.hook_errors.append(f"{type(e).__name__}: {e}")
        if len(self.hook_errors) == 1:
            warnings.warn(f"FreezeAudit: its hook failed ({type(e).__name__}: {e}); the block runs on, and the "
                          "audit's records of this call are incomplete (audit.hook_errors)", RuntimeWarning,
                          stacklevel=3)

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _opaque_for(self, module: nn.Module) -> list | None:
        """The watched layers inside ``module`` when it is a boundary the hooks cannot see through: a
        ``torch.compile`` wrapper or a TorchScript module called from Python; None otherwise."""
        if not (_is_compiled_wrapper(module) or is_script_module(module)):
            return None
        key = id(module)
        if key not in self._opaque_cache:
            inner = compiled_original(module)
            recs = [self._records[id(m)] for m in inner.modules()
                    if id(m) in self._records and (m is not module or _is_compiled_wrapper(module))]
            self._opaque_cache[key] = [r for r in recs if r.kind != "model"]
        return self._opaque_cache[key] or None

    def _pre(self, module: nn.Module, args) -> None:
        rec = self._records.get(id(module))
        if rec is not None and rec.module is not module:
            rec = None
        replica = False
        if rec is None and getattr(module, "_is_replica", False):  # DataParallel's replica of one of our layers
            rec = self._by_hooks.get(id(module.__dict__.get("_forward_hooks")))
            replica = rec is not None and rec.kind != "model"
            rec = rec if replica else None
        opaque = self._opaque_for(module)
        root = module is self.model or (_is_compiled_wrapper(module) and compiled_original(module) is self.model)
        self._stack().append((module, root, opaque is not None))
        if root:
            self._root_depth += 1
            if self._root_depth == 1:
                self.model_calls += 1
                self._check_tree()
                for r in self._records.values():
                    r.writes_this_call = 0
            root_rec = self._records.get(id(self.model))
            if rec is None and root_rec is not None and root_rec.kind == "model":
                rec = root_rec  # the compiled wrapper's call is the model's (a compiled bare norm layer: hidden)
        if opaque is not None:
            self._opaque_enter(module, opaque)
        if rec is None:
            if not root and opaque is None and isinstance(module, _NormBase):
                self._foreign_write(module)
            return
        training, grad = compiled_original(module).training, torch.is_grad_enabled()
        rec.calls += 1
        rec.train_calls += training
        rec.grad_calls += grad
        if opaque is not None and rec.kind == "model":
            return  # a compiled/scripted call of the model: its layers were handled at the boundary
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
        if source == "running" and rec.kind in ("batchnorm", "instancenorm", "frozen_batchnorm"):
            self._reset_check(rec, module)
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
            self._write_target(rec, module, replica)
            self._cumulative_check(rec, module)
            self._pending(rec, module, x)
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

    def _post(self, module: nn.Module, output) -> None:
        stack = self._stack()
        entry = stack.pop() if stack and stack[-1][0] is module else None
        if entry is None:
            return
        _, root, opaque = entry
        if opaque:
            self._opaque_exit(module)
        pending = getattr(self._local, "pending", None)
        if pending and id(module) in pending:
            self._after_write(*pending.pop(id(module)))
        if root:
            self._root_depth = max(0, self._root_depth - 1)
            if output is not None:
                training = compiled_original(module).training
                self.output_signatures[f"{output_signature(output)} ({'train' if training else 'eval'} mode)"] += 1

    # -- what the hooks check ---------------------------------------------------------------------------------
    def _check_tree(self) -> None:
        """At each call of the model: a module replaced since entry (or since the last call) is watched under its
        name, and a pin lost with it (or by unpin) is linted now, before the replaced layer runs."""
        for n, m in self._pinned_objects:
            if not is_pinned(m) and ("pin_lost", n) not in self._seen_lints:
                now = dict(self.model.named_modules()).get(n)
                if now is m:
                    self._pin_lost(n, m, f"was pinned in eval mode when the audit started and was unpinned during "
                                         f"the block (seen at model call {self.model_calls})")
        ids = [id(m) for m in self.model.modules()]
        if ids == self._module_ids:
            return
        by_name = {r.name: r for r in self._records.values()}
        replaced = []
        for name, m in self.model.named_modules():
            rec = by_name.get(name)
            if rec is None or rec.module is m or layer_kind(m, m is self.model) is None:
                continue
            rec.replaced = f"{_type_name(rec.module)} -> {_type_name(m)}"
            del self._records[id(rec.module)]
            rec.module = m
            self._records[id(m)] = rec
            self._remember(rec)
            replaced.append(name)
        self._index()
        if replaced:
            stays = eval_after_train(self.model)
            for name in replaced:
                if name in self._stays_eval_at_entry and name not in stays:
                    rec = by_name[name]
                    self._pin_lost(name, rec.module, f"was replaced during the block ({rec.replaced}, seen at model "
                                                     f"call {self.model_calls}) and the new module does not stay in "
                                                     "eval mode after model.train() as the old one did")

    def _reset_check(self, rec: LayerRecord, module: nn.Module) -> None:
        """``reset_stats_pinned`` at the call: a layer normalising with running statistics that hold the reset
        values mean 0 / variance 1, which it did not hold at entry (reset during the block)."""
        state = self._entry_state.get(id(rec))
        if state is None or state["reset"] or ("reset_stats_pinned", rec.name) in self._seen_lints:
            return
        if has_running_stats(module) and _at_reset_values(module):
            self._add_lint(_lint("reset_stats_pinned", rec.name,
                                 f"{_type_name(module)} normalises with its running statistics, and they hold the "
                                 "reset values mean 0 / variance 1, which they did not hold when the audit started: "
                                 f"they were reset during the block (seen at model call {self.model_calls}). "
                                 "torch.optim.swa_utils.update_bn resets every BatchNorm and cannot re-estimate "
                                 "one that stays in eval mode (pinned); re-estimate with "
                                 "bnstudy.update_bn_stats, which reaches pinned layers"), emit=True)

    def _cumulative_check(self, rec: LayerRecord, module: nn.Module) -> None:
        """``cumulative_overwrites_loaded`` at the write: momentum=None with num_batches_tracked=0 and statistics
        that are not the reset values: this batch gets weight 1/1 and replaces them."""
        if module.momentum is not None or not counts_batches(module) or not has_running_stats(module):
            return
        if ("cumulative_overwrites_loaded", rec.name) in self._seen_lints or int(module.num_batches_tracked) != 0:
            return
        if not _at_reset_values(module):
            self._add_lint(_lint("cumulative_overwrites_loaded", rec.name,
                                 f"{_type_name(module)} has momentum=None and num_batches_tracked=0, and its "
                                 "running statistics are not the reset values: this train-mode batch (model call "
                                 f"{self.model_calls}) gets weight 1/1 and replaces them entirely (they were set or "
                                 "loaded without num_batches_tracked); load num_batches_tracked too, or set it to "
                                 "the number of batches they average"), emit=True)

    def _write_target(self, rec: LayerRecord, module: nn.Module, replica: bool) -> None:
        """Where this write lands: the layer's own buffers, or tensors no audited buffer shows."""
        home = self._homes.get(id(rec))
        now = _stat_tensors(module)
        if not home or not now:
            self._homes[id(rec)] = now
            return
        key = next((k for k in ("running_mean", "num_batches_tracked") if k in now and k in home), None)
        if key is None or _same_memory(now[key], home[key]):
            return
        where = REPLICA if replica else FUNCTIONAL if _in_functional_call() else None
        if where is None:  # the module's buffers were replaced (model.to(), .double(), a new tensor): follow them
            self._homes[id(rec)] = now
            return
        rec.writes_elsewhere += 1
        rec.elsewhere[where] += 1
        kind = _type_name(module)
        if where == FUNCTIONAL:
            msg = (f"{kind} wrote its running statistics into the tensors passed to torch.func.functional_call, "
                   "which are not its buffers: the module's own running_mean/running_var did not move, so "
                   "model.eval() normalises with the old values (mean 0 / variance 1 if never estimated). Load the "
                   "updated tensors back (model.load_state_dict(buffers, strict=False)) or pass the module's own "
                   "buffers (dict(model.named_buffers())) to keep the writes")
        else:
            msg = (f"a DataParallel replica of {kind} wrote its running statistics into its own copies of the "
                   "buffers (a replica on another device than device_ids[0]): those writes are discarded after the "
                   "forward; only the device_ids[0] replica writes into the model (DistributedDataParallel keeps "
                   "one set per process)")
        self._add_lint(_lint("stats_written_elsewhere", rec.name, msg), emit=True)

    def _foreign_write(self, module: nn.Module) -> None:
        """A norm layer that is not the model's wrote statistics: remember it and the outermost module calling it."""
        if not (updates_running_stats(module) or counts_batches(module)):
            return
        stack = self._stack()
        outer = stack[0][0] if stack else module
        entry = self._foreign.get(id(module))
        if entry is None or entry["layer"]() is not module:
            entry = self._foreign[id(module)] = dict(layer=weakref.ref(module), root=weakref.ref(outer),
                                                     type=_type_name(module), root_type=_type_name(outer),
                                                     writes=0, name=None)
        entry["writes"] += 1

    def _pending(self, rec: LayerRecord, module: nn.Module, x) -> None:
        """What the post hook checks after this write: statistics that turn non-finite, updates rounded away."""
        state = self._entry_state.get(id(rec))
        if not has_running_stats(module) or state is None:
            return
        watch_finite = state["finite"] and ("nonfinite_stats", rec.name) not in self._seen_lints
        low = (_low_precision(module.running_mean) and x is not None and x.dim() >= 2
               and ("stats_update_lost", rec.name) not in self._seen_lints)
        if not (watch_finite or low):
            return
        old = module.running_mean.detach().clone() if low else None
        batch_mean = (x.detach().float().transpose(0, 1).reshape(x.shape[1], -1).mean(1) if low else None)
        pending = getattr(self._local, "pending", None)
        if pending is None:
            pending = self._local.pending = {}
        pending[id(module)] = (rec, module, x, watch_finite, old, batch_mean, self.model_calls)

    def _after_write(self, rec, module, x, watch_finite, old, batch_mean, call) -> None:
        if watch_finite and not _finite_stats(module):
            self._entry_state[id(rec)]["finite"] = False
            src = ("its input held inf/NaN" if x is not None and not bool(torch.isfinite(x).all()) else
                   f"its input was finite: the batch statistics overflowed "
                   f"{str(module.running_var.dtype).removeprefix('torch.')}")
            self._add_lint(_nonfinite_lint(rec.name, module, f", written at model call {call} ({src})"), emit=True)
        if old is not None and batch_mean is not None:
            new = module.running_mean.detach()
            if new.shape == old.shape and batch_mean.shape == old.shape:
                lost = int(((new == old) & (batch_mean != old.float())).sum())
                if lost:
                    self._add_lint(_lint("stats_update_lost", rec.name,
                                         f"{_type_name(module)} wrote its running statistics in "
                                         f"{str(new.dtype).removeprefix('torch.')} at model call {call}, and "
                                         f"running_mean stayed exactly as it was in {lost} of {new.numel()} "
                                         "channels although the batch mean differs: the update rounded away. "
                                         "Keep norm layers and their buffers in float32 (torch.autocast does)"),
                                   emit=True)

    def _opaque_enter(self, module: nn.Module, recs: list) -> None:
        grad = torch.is_grad_enabled()
        frame = [(r, r.calls, r.module.training, grad,
                  {k: t.detach().clone() for k, t in _stat_tensors(r.module).items()}) for r in recs]
        frames = getattr(self._local, "opaque", None)
        if frames is None:
            frames = self._local.opaque = []
        frames.append((module, frame))
        if ("hidden_calls", "") not in self._seen_lints:
            how = "TorchScript" if is_script_module(module) else "compiled by torch.compile"
            self._add_lint(_lint("hidden_calls", "", f"{type(module).__name__} ran {how}: the {len(recs)} layers "
                                 "inside were not seen call by call; each call counts as a hidden call with the "
                                 "layer's train/eval flag at that moment, and as a hidden write when its buffers "
                                 "changed (modes(): hidden_calls, hidden_writes)"))

    def _opaque_exit(self, module: nn.Module) -> None:
        frames = getattr(self._local, "opaque", None)
        if not frames or frames[-1][0] is not module:
            return
        _, frame = frames.pop()
        for rec, calls0, training, grad, state in frame:
            if rec.calls > calls0:
                continue  # seen call by call (dynamo ran this frame eagerly)
            m = rec.module
            rec.hidden_calls += 1
            rec.hidden_train += training
            rec.hidden_grad += grad
            source = statistics_source(m, training)
            if source is not None:
                rec.stats[source] += 1
            now = _stat_tensors(m)
            if state and any(k not in now or now[k].shape != t.shape or not torch.equal(now[k], t)
                             for k, t in state.items()):
                rec.hidden_writes += 1
                es = self._entry_state.get(id(rec))
                if es is not None and es["finite"] and has_running_stats(m) and not _finite_stats(m):
                    es["finite"] = False
                    self._add_lint(_nonfinite_lint(rec.name, m, f", written inside a compiled/scripted call "
                                                               f"(model call {self.model_calls})"), emit=True)

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

    def elsewhere(self) -> pd.DataFrame:
        """Writes of running statistics that no audited buffer shows, one row per layer and place.

        Columns: ``layer`` (the model's layer name; for a layer outside the model, its name in the module
        that called it, or ``"?"``), ``type``, ``where`` (``"torch.func.functional_call copies"``,
        ``"DataParallel replica copies"``, or ``"outside the model: AveragedModel"``: the outermost module
        of the call, e.g. an EMA copy or a teacher, with ``"(a copy of the model's 'backbone.1')"`` when the
        layer has the type and the name, possibly under a ``module.`` prefix, of one of the model's),
        ``writes`` and ``in_model`` (False for all of them: the model's buffers do not hold these writes). Empty when every write landed in the model."""
        self._require_done()
        rows = []
        for rec in self._records.values():
            for where, k in rec.elsewhere.items():
                rows.append(dict(layer=rec.name, type=_type_name(rec.module), where=where, writes=k, in_model=False))
        mine = {r.name: _type_name(r.module) for r in self._records.values()}
        for entry in self._foreign.values():
            layer, root = entry["layer"](), entry["root"]()
            if entry["name"] is None and layer is not None and root is not None:
                entry["name"] = next((n for n, m in root.named_modules() if m is layer), "?")
            name = entry["name"] or "?"
            twin = next((n for n in (name, name.removeprefix("module.")) if mine.get(n) == entry["type"]), None)
            where = f"outside the model: {entry['root_type']}" + (
                f" (a copy of the model's {twin!r}: deepcopy, an EMA or AveragedModel)" if twin is not None else "")
            rows.append(dict(layer=name, type=entry["type"], where=where, writes=entry["writes"], in_model=False))
        return pd.DataFrame(rows, columns=["layer", "type", "where", "writes", "in_model"])

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
        names = module_names(fn, "modules", self.model, modules)
        items = [modules] if isinstance(modules, (str, nn.Module)) else modules
        out: list[str] = []
        for name, item in zip(names, items):
            # a module object reachable under several names (shared, reused) is all of them
            expanded = self._all_names(item) if isinstance(item, nn.Module) and item is not self.model else [name]
            out += [n for n in expanded if n not in out]
        return out

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
            where = "the model" if names is None else ", ".join(repr(n) for n in names)
            shown = problems[:max_items]
            more = [f"... and {len(problems) - max_items} more (audit.moved() lists every tensor)"] \
                if len(problems) > max_items else []
            raise AssertionError(f"{where} is not frozen; {len(problems)} moved:\n  " + "\n  ".join(shown + more))

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
        lines = [f"FreezeAudit of {what}: {counts(rep)}, {_n(self.model_calls, 'model call')}"]
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
                                   "(audit.elsewhere())", width=_WIDTH, subsequent_indent="    ")
        if self._foreign:
            outside = Counter()
            for e in self._foreign.values():
                outside[e["root_type"]] += e["writes"]
            lines += textwrap.wrap("  norm layers outside the model wrote running statistics: " + ", ".join(
                f"{k} ({_n(v, 'write')})" for k, v in outside.items()) + " (their own buffers, not the model's: "
                "audit.elsewhere())", width=_WIDTH, subsequent_indent="    ")
        hidden = sum(r.hidden_calls for r in self._records.values() if r.kind != "model")
        if hidden:
            lines += textwrap.wrap(f"  hidden calls: the model ran compiled or as TorchScript; {_n(hidden, 'layer call')} "
                                   "were read at the boundary (flags at the call, writes from the buffers)",
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
                changes = [r.max_abs_change for r in out if not _isnan(r.max_abs_change)]
                worst = max(changes) if changes else (float("nan") if out else 0.0)  # NaN skipped, as pandas' max
                lines.append(f"  probe outputs: max |change| {worst:.4g}"
                             + (" (bit-identical)" if not any(r.changed for r in out) else ""))
            if self.probe_note:
                lines += textwrap.wrap(f"    ({self.probe_note})", width=_WIDTH, subsequent_indent="    ")
        for note in self.notes:
            lines += textwrap.wrap(f"  note: {note}", width=_WIDTH, subsequent_indent="    ")
        if self.hook_errors:
            lines += textwrap.wrap(f"  audit hook errors (the block ran on): {len(self.hook_errors)}, first: "
                                   f"{self.hook_errors[0]}", width=_WIDTH, subsequent_indent="    ")
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
        moved = self._moved_rows()
        table = ("<table><tr><th>tensor</th><th>kind</th><th>max_abs_change</th></tr>" + "".join(
            f"<tr><td>{html.escape(r.tensor)}</td><td>{r.kind}</td><td>{r.max_abs_change:.4g}</td></tr>"
            for r in moved[:20]) + "</table>") if moved else ""
        return (f"<details open><summary><b>{html.escape(self._headline()[0])}</b></summary>"
                f"<pre>{html.escape(self.summary())}</pre>{table}</details>")


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
