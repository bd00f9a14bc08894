"""Layer inspection: which layers the audit watches, and what one call of each did.

:func:`layer_kind` classifies a module; :class:`LayerRecord` accumulates what the
audit's hooks saw per layer (mode, statistics source, writes, calls per model
call, batch sizes). Decisions come from :mod:`bnstudy.norms`, the rules of
torch's own ``forward``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from torch import nn

from ..norms import is_batch_norm, is_frozen_batchnorm, is_instance_norm, statistics_source

#: Values of :func:`layer_kind`.
LAYER_KINDS = ("batchnorm", "frozen_batchnorm", "instancenorm", "stateless_norm", "dropout", "model")


def layer_kind(m: nn.Module, is_root: bool = False) -> str | None:
    """``batchnorm`` (torch's BatchNorm rule: ``_BatchNorm``, SyncBatchNorm, lazy variants, other ``_NormBase``
    subclasses), ``frozen_batchnorm``, ``instancenorm``, ``stateless_norm`` (LayerNorm, GroupNorm, RMSNorm,
    LocalResponseNorm), ``dropout``, ``model`` for the root, or ``None`` for a module the audit does not watch.
    Raises ``TypeError`` if ``m`` is not an ``nn.Module`` or ``is_root`` not a bool."""
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
    if isinstance(m, nn.modules.dropout._DropoutNd):
        return "dropout"
    return "model" if is_root else None


@dataclass
class LayerRecord:
    """What the audit saw of one layer during its block. ``writes``: calls that wrote running statistics
    (or counted a batch); ``max_writes_per_model_call``: the most writes inside one call of the model;
    ``backward_writes``: writes while autograd ran a backward pass (activation checkpointing recomputing
    the forward)."""

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

    def __post_init__(self):
        from .._checks import check_module, check_str
        check_str("LayerRecord", "name", self.name)
        check_module("LayerRecord", "module", self.module)
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"LayerRecord: kind={self.kind!r} is not allowed; choose one of {list(LAYER_KINDS)}")

    @property
    def updated_running_stats(self) -> bool:
        return self.writes > 0
