"""Layer inspection: which layers the audit watches, and what one call of each did.

:func:`layer_kind` classifies a module; :class:`LayerRecord` accumulates what the
audit's hooks saw per layer (mode, statistics source, writes, calls per model
call, batch sizes). Decisions come from :mod:`bnstudy.norms`, the rules of
torch's own ``forward``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn

from ..norms import is_batch_norm, is_frozen_batchnorm, is_instance_norm, script_source_class, statistics_source

#: Values of :func:`layer_kind`.
LAYER_KINDS = ("batchnorm", "frozen_batchnorm", "instancenorm", "stateless_norm", "dropout", "model")


def layer_kind(m: nn.Module, is_root: bool = False) -> str | None:
    """``batchnorm`` (torch's BatchNorm rule: ``_BatchNorm``, SyncBatchNorm, lazy variants, other ``_NormBase``
    subclasses), ``frozen_batchnorm`` (this package's, torchvision's, detectron2's, timm's:
    :func:`bnstudy.norms.is_frozen_batchnorm`), ``instancenorm``, ``stateless_norm`` (LayerNorm, GroupNorm,
    RMSNorm, LocalResponseNorm), ``dropout``, ``model`` for the root, or ``None`` for a module the audit does
    not watch. A TorchScript module is classified by the class it was compiled from
    (:func:`bnstudy.norms.script_source_class`). Raises ``TypeError`` if ``m`` is not an ``nn.Module`` or
    ``is_root`` not a bool."""
    from .._checks import check_bool, check_module
    check_module("layer_kind", "m", m)
    check_bool("layer_kind", "is_root", is_root)
    if is_instance_norm(m):
        return "instancenorm"
    if is_batch_norm(m):
        return "batchnorm"
    if is_frozen_batchnorm(m):
        return "frozen_batchnorm"
    if statistics_source(m) is not None:
        return "stateless_norm"
    cls = script_source_class(m) or type(m)
    if issubclass(cls, nn.modules.dropout._DropoutNd):
        return "dropout"
    return "model" if is_root else None


@dataclass
class LayerRecord:
    """What the audit saw of one layer during its block. ``writes``: calls that wrote running statistics
    (or counted a batch); ``max_writes_per_model_call``: the most writes inside one call of the model;
    ``backward_writes``: writes while autograd ran a backward pass (activation checkpointing recomputing
    the forward); ``writes_elsewhere``: writes that went into tensors that are not the layer's buffers,
    counted by where in ``elsewhere`` (``"torch.func.functional_call copies"``, ``"DataParallel replica
    copies"``); ``hidden_calls``: calls of a compiled (``torch.compile``) or TorchScript module holding the
    layer, whose inside the hooks cannot see, with ``hidden_train``/``hidden_grad`` (of those, with the
    layer's flag in train mode / with gradients on) and ``hidden_writes`` (after which its buffers had
    changed); ``replaced``: ``"BatchNorm1d -> SyncBatchNorm"`` when the module at this name was replaced
    during the block (the record follows the name)."""

    name: str
    module: nn.Module
    kind: str
    calls: int = 0
    train_calls: int = 0
    grad_calls: int = 0
    stats: Counter = field(default_factory=Counter)
    writes: int = 0
    writes_this_call: int = 0
    max_writes_per_model_call: int = 0
    backward_writes: int = 0
    min_batch: int | None = None
    min_values_per_channel: int | None = None
    writes_elsewhere: int = 0
    elsewhere: Counter = field(default_factory=Counter)
    hidden_calls: int = 0
    hidden_train: int = 0
    hidden_grad: int = 0
    hidden_writes: int = 0
    replaced: str = ""

    def __post_init__(self):
        from .._checks import check_module, check_str
        check_str("LayerRecord", "name", self.name)
        check_module("LayerRecord", "module", self.module)
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"LayerRecord: kind={self.kind!r} is not allowed; choose one of {list(LAYER_KINDS)}")

    @property
    def updated_running_stats(self) -> bool:
        return self.writes > 0 or self.hidden_writes > 0


_STATS = ("running_mean", "running_var", "num_batches_tracked")


def _stat_tensors(m: nn.Module) -> dict:
    """The running-statistics buffers of ``m`` that exist now (``running_mean``, ``running_var``,
    ``num_batches_tracked``)."""
    return {k: t for k in _STATS if isinstance(t := getattr(m, k, None), torch.Tensor)}
