"""Writes that land outside the model: a layer of the model writing into tensors that are not its buffers
(``torch.func.functional_call`` copies, DataParallel replica copies), and norm layers outside the model (an EMA
or ``AveragedModel`` copy, a teacher) that wrote running statistics or normalised with reset ones during the block."""

from __future__ import annotations

import sys
import weakref

import torch
from torch import nn

from .._checks import LazyPandas
from ..norms import counts_batches, has_running_stats, statistics_source, updates_running_stats
from .inspect import LayerRecord, _stat_tensors
from .lints import _at_reset_values, _label, _lint, _type_name

pd = LazyPandas()  # pandas is imported only when a table is asked for


#: Where a write that no audited buffer shows went (values of ``LayerRecord.elsewhere``).
FUNCTIONAL = "torch.func.functional_call copies"
REPLICA = "DataParallel replica copies"


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


class _WritesElsewhere:
    """Where each write lands, and :meth:`elsewhere`; a mixin of :class:`~bnstudy.audit.FreezeAudit`."""

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

    def _foreign_entry(self, module: nn.Module) -> dict:
        """The record of a norm layer outside the model, with the outermost module calling it now."""
        stack = self._stack()
        outer = stack[0][0] if stack else module
        entry = self._foreign.get(id(module))
        if entry is None or entry["layer"]() is not module:
            entry = self._foreign[id(module)] = dict(layer=weakref.ref(module), root=weakref.ref(outer),
                                                     type=_type_name(module), root_type=_type_name(outer),
                                                     writes=0, reset_reads=0, name=None)
        return entry

    def _foreign_call(self, module: nn.Module) -> None:
        """A norm layer that is not the model's ran: count its writes, and lint it once when it normalises with
        the reset values mean 0 / variance 1 while it looks trained (see :meth:`_foreign_reset_read`)."""
        if updates_running_stats(module) or counts_batches(module):
            self._foreign_entry(module)["writes"] += 1
        elif statistics_source(module) == "running" and has_running_stats(module) and _at_reset_values(module):
            self._foreign_reset_read(module)

    def _foreign_reset_read(self, module: nn.Module) -> None:
        """``reset_stats_pinned`` for a layer outside the model that normalises with reset statistics (case:
        ``torch.optim.swa_utils.update_bn(loader, swa_model)`` resets every BatchNorm of an ``AveragedModel`` copy
        and re-estimates only those that run in train mode, so the copy's pinned backbone keeps mean 0 / variance
        1). Linted when the layer cannot be freshly built: it is a copy of one of the model's layers (same type and
        name, possibly under ``module.``) whose statistics are estimated, or its affine parameters are trained."""
        entry = self._foreign_entry(module)
        entry["reset_reads"] += 1
        if entry["reset_reads"] > 1:
            return
        root = entry["root"]()
        name = entry["name"] = next((n for n, m in root.named_modules() if m is module), "?") if root else "?"
        twin = self._twin(name, entry["type"])
        estimated = twin is not None and has_running_stats(twin.module) and not _at_reset_values(twin.module)
        w, b = getattr(module, "weight", None), getattr(module, "bias", None)
        trained = isinstance(w, torch.Tensor) and isinstance(b, torch.Tensor) and not (
            bool((w == 1).all()) and bool((b == 0).all()))
        if not (estimated or trained):
            return
        copy = (f" (a copy of the model's {_label(twin.name)!r}, whose statistics are estimated)" if estimated
                else "")
        self._add_lint(_lint(
            "reset_stats_pinned", f"{entry['root_type']}:{name}",
            f"{entry['type']} {_label(name)!r} of {entry['root_type']}, outside the audited model{copy}, normalises "
            "with running statistics that hold the reset values mean 0 / variance 1 (seen at "
            f"{self._at_call()}): torch.optim.swa_utils.update_bn resets every BatchNorm of the model it is given "
            "and re-estimates only those that run in train mode, so a pinned (eval-mode) layer of an AveragedModel "
            "or EMA copy keeps mean 0 / variance 1; re-estimate the copy with bnstudy.update_bn_stats (it reaches "
            "pinned layers) or load the model's statistics into it"), emit=True)

    def _twin(self, name: str, type_name: str):
        """The model's layer record a layer outside the model copies: the same type and name (``module.`` prefix
        dropped, as ``AveragedModel`` and DataParallel add it); None if there is none."""
        mine = {r.name: r for r in self._records.values()}
        return next((mine[n] for n in (name, name.removeprefix("module.")) if n in mine
                     and _type_name(mine[n].module) == type_name), None)

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
            if not entry["writes"]:
                continue  # it only read (reset) statistics: a lint, not a write
            layer, root = entry["layer"](), entry["root"]()
            if entry["name"] is None and layer is not None and root is not None:
                entry["name"] = next((n for n, m in root.named_modules() if m is layer), "?")
            name = entry["name"] or "?"
            twin = next((n for n in (name, name.removeprefix("module.")) if mine.get(n) == entry["type"]), None)
            where = f"outside the model: {entry['root_type']}" + (
                f" (a copy of the model's {twin!r}: deepcopy, an EMA or AveragedModel)" if twin is not None else "")
            rows.append(dict(layer=name, type=entry["type"], where=where, writes=entry["writes"], in_model=False))
        return pd.DataFrame(rows, columns=["layer", "type", "where", "writes", "in_model"])
