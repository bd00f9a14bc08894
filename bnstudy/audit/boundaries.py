"""Compiled and scripted call boundaries: a ``torch.compile`` wrapper or a TorchScript module runs the layers inside
with no Python hook, so the audit reads each watched layer at the boundary (its flags at the call, its buffers
before and after) and counts a *hidden call* and, when the buffers changed, a *hidden write*."""

from __future__ import annotations

import torch
from torch import nn

from ..norms import compiled_original, has_running_stats, is_script_module, statistics_source
from .inspect import _stat_tensors
from .lints import _finite_stats, _lint, _nonfinite_lint


def _is_compiled_wrapper(m: nn.Module) -> bool:
    return type(m).__name__ == "OptimizedModule" and isinstance(getattr(m, "_orig_mod", None), nn.Module)


class _Boundaries:
    """The boundary reads; a mixin of :class:`~bnstudy.audit.FreezeAudit`."""

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
                                                               f"({self._at_call()})"), emit=True)
