"""Live hooks and live lints of :class:`~bnstudy.audit.FreezeAudit`: what each call of the model's norm, dropout
and root modules does while the block runs (mode, statistics source, writes, batch), and the lints that fire
at the call, before the layer runs (after it, for what its write did)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from ..freeze import eval_after_train, is_pinned
from ..norms import compiled_original, counts_batches, has_running_stats, statistics_source, updates_running_stats
from .boundaries import _is_compiled_wrapper
from .inspect import LayerRecord, layer_kind
from .lints import _at_reset_values, _batch_lints, _finite_stats, _lint, _low_precision, _nonfinite_lint, _type_name
from .snapshot import output_signature


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class _LiveHooks:
    """The global forward hooks and what they check; a mixin of :class:`~bnstudy.audit.FreezeAudit` (state in
    its ``__init__``)."""

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
        in_tree = root or id(module) in self._tree_ids
        self._stack().append((module, root, opaque is not None, in_tree))
        if in_tree:  # a call into the model: of the model itself, or of a submodule (model.backbone(x))
            self._tree_depth += 1
            if self._tree_depth == 1:
                self.calls_into_model += 1
                if not root:
                    self.submodule_calls[self._tree_names.get(id(module), type(module).__name__)] += 1
                self._check_tree()
                for r in self._records.values():
                    r.writes_this_call = 0
        if root:
            self._root_depth += 1
            if self._root_depth == 1:
                self.model_calls += 1
            root_rec = self._records.get(id(self.model))
            if rec is None and root_rec is not None and root_rec.kind == "model":
                rec = root_rec  # the compiled wrapper's call is the model's (a compiled bare norm layer: hidden)
        if opaque is not None:
            self._opaque_enter(module, opaque)
        if rec is None:
            if not root and opaque is None and isinstance(module, _NormBase):
                self._foreign_call(module)
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
            if self._tree_depth > 0 or in_backward:
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
        _, root, opaque, in_tree = entry
        if in_tree:
            self._tree_depth = max(0, self._tree_depth - 1)
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
    def _at_call(self, call: int | None = None) -> str:
        """``"model call 3"``; ``"call 3 into the model"`` once a call went in through a submodule (a loop that
        calls ``model.backbone`` and ``model.head``, not ``model``): the count of :attr:`calls_into_model`."""
        call = self.calls_into_model if call is None else call
        return f"call {call} into the model" if self.submodule_calls else f"model call {call}"

    def _check_tree(self) -> None:
        """At each call of the model: a module replaced since entry (or since the last call) is watched under its
        name, and a pin lost with it (or by unpin) is linted now, before the replaced layer runs."""
        for n, m in self._pinned_objects:
            if not is_pinned(m) and ("pin_lost", n) not in self._seen_lints:
                now = dict(self.model.named_modules()).get(n)
                if now is m:
                    self._pin_lost(n, m, f"was pinned in eval mode when the audit started and was unpinned during "
                                         f"the block (seen at {self._at_call()})")
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
                    self._pin_lost(name, rec.module, f"was replaced during the block ({rec.replaced}, seen at "
                                                     f"{self._at_call()}) and the new module does not stay in "
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
                                 f"they were reset during the block (seen at {self._at_call()}). "
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
                                 "running statistics are not the reset values: this train-mode batch ("
                                 f"{self._at_call()}) gets weight 1/1 and replaces them entirely (they were set or "
                                 "loaded without num_batches_tracked); load num_batches_tracked too, or set it to "
                                 "the number of batches they average"), emit=True)

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
        pending[id(module)] = (rec, module, x, watch_finite, old, batch_mean, self.calls_into_model)

    def _after_write(self, rec, module, x, watch_finite, old, batch_mean, call) -> None:
        if watch_finite and not _finite_stats(module):
            self._entry_state[id(rec)]["finite"] = False
            src = ("its input held inf/NaN" if x is not None and not bool(torch.isfinite(x).all()) else
                   f"its input was finite: the batch statistics overflowed "
                   f"{str(module.running_var.dtype).removeprefix('torch.')}")
            self._add_lint(_nonfinite_lint(rec.name, module, f", written at {self._at_call(call)} ({src})"), emit=True)
        if old is not None and batch_mean is not None:
            new = module.running_mean.detach()
            if new.shape == old.shape and batch_mean.shape == old.shape:
                lost = int(((new == old) & (batch_mean != old.float())).sum())
                if lost:
                    self._add_lint(_lint("stats_update_lost", rec.name,
                                         f"{_type_name(module)} wrote its running statistics in "
                                         f"{str(new.dtype).removeprefix('torch.')} at {self._at_call(call)}, and "
                                         f"running_mean stayed exactly as it was in {lost} of {new.numel()} "
                                         "channels although the batch mean differs: the update rounded away. "
                                         "Keep norm layers and their buffers in float32 (torch.autocast does)"),
                                   emit=True)

    def _feeds_trainable(self, dropout: nn.Module) -> bool:
        # Dropout switched off inside a frozen block is the point of the freeze; next to trainable
        # parameters (its parent holds some) it means the layers being trained lost their dropout.
        if ("dropout_off_in_training", self._records[id(dropout)].name) in self._seen_lints:
            return False
        parent = self._parents.get(id(dropout), self.model)
        return any(p.requires_grad for p in parent.parameters())
