"""The book's four freeze modes as objects that say what they mean.

Turning off gradients (``requires_grad_(False)``) stops the optimizer; it does not stop
BatchNorm. In train mode every forward pass normalises with the batch's own statistics and
overwrites the buffers (PyTorch's convention; Ioffe & Szegedy, 2015)::

    running_mean <- (1 - momentum) * running_mean + momentum * batch_mean
    running_var  <- (1 - momentum) * running_var  + momentum * batch_var (unbiased)

The modes differ only in which norm layers are in train mode during stage 2 (training a new
head on task B) and which buffers they own. Each :class:`FreezeMode` states that
declaratively (:attr:`FreezeMode.backbone_batch_stats`, :attr:`FreezeMode.head_batch_stats`,
:attr:`FreezeMode.buffers_may_change`), and :meth:`FreezeMode.apply` sets a
:class:`TransferModel` up accordingly. The engine asks these attributes instead of
comparing mode names.

``apply`` works on any :class:`TransferModel`: a ``backbone`` module, an old head ``head_a``
and a new head ``head_b`` (any modules). To use the modes on your own network, wrap it:
``TransferModel(my_backbone, my_old_head, my_new_head)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

#: Heads (:func:`bnstudy.study.models.make_head`) with a BatchNorm of their own, trained in stage 2: batch
#: statistics while the head is in train mode.
HEAD_BATCHNORM = ("mlp_bn", "bn_linear")


class TransferModel(nn.Module):
    """A backbone with an old head (task A) and a new head (task B).

    ``forward_a(x)`` is ``head_a(backbone(x))``; ``forward_b(x)`` is ``head_b(backbone_b(x))``
    where ``backbone_b`` is the backbone itself unless a freeze mode gave task B its own
    statistics (``separate_stats``). Shapes: ``x (B, 3, H, W)`` -> logits ``(B, n_classes)``.
    """

    def __init__(self, backbone: nn.Module, head_a: nn.Module, head_b: nn.Module):
        super().__init__()
        from .._checks import check_module
        for param, value in (("backbone", backbone), ("head_a", head_a), ("head_b", head_b)):
            check_module("TransferModel", param, value)
        self.backbone, self.head_a, self.head_b = backbone, head_a, head_b
        self.backbone_b: nn.Module | None = None

    def forward_a(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_a(self.backbone(x))

    def forward_b(self, x: torch.Tensor) -> torch.Tensor:
        bb = self.backbone if self.backbone_b is None else self.backbone_b
        return self.head_b(bb(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_b(x)


@dataclass(frozen=True)
class FreezeMode:
    """A way of freezing a backbone for stage 2.

    In every mode the backbone's and ``head_a``'s parameters get ``requires_grad=False`` and
    only ``head_b``'s are trained, so no backbone weight can change.

    Attributes:
        name: the mode's name in code, results and figures.
        summary: one paragraph saying what the mode lets change.
        backbone_batch_stats: whether task-B batches pass the backbone's norm layers in train
            mode (normalised with their own batch statistics) during stage 2.
        head_batch_stats: whether a norm layer inside the new head is in train mode.
        separate_buffers: whether task B gets its own copy of the backbone's buffers
            (shared weights; domain-specific BN).
        buffers_may_change: which buffers stage 2 may write: among ``"backbone"``, ``"backbone_b"``
            (the separate copy) and ``"head_b"``.
    """

    name: str
    summary: str
    backbone_batch_stats: bool
    head_batch_stats: bool
    separate_buffers: bool

    def __post_init__(self):
        from .._checks import check_bool, check_str
        check_str("FreezeMode", "name", self.name, nonempty=True)
        check_str("FreezeMode", "summary", self.summary)
        for param in ("backbone_batch_stats", "head_batch_stats", "separate_buffers"):
            check_bool("FreezeMode", param, getattr(self, param))

    @property
    def buffers_may_change(self) -> tuple:
        """The parts of a :class:`TransferModel` whose norm buffers stage 2 may write, in model order."""
        out = []
        if self.backbone_batch_stats:
            out.append("backbone_b" if self.separate_buffers else "backbone")
        if self.head_batch_stats:
            out.append("head_b")
        return tuple(out)

    @property
    def backbone_stats(self) -> str:
        """What the backbone's BatchNorm layers normalise task B with: ``"batch"`` or ``"running"`` statistics."""
        return "batch" if self.backbone_batch_stats else "running"

    def batch_statistics(self, norm: str, head: str) -> bool:
        """Whether stage 2 runs some BatchNorm in train mode, for a backbone ``norm`` and ``head`` kind."""
        return (norm == "batch" and self.backbone_batch_stats) or (head in HEAD_BATCHNORM and self.head_batch_stats)

    def apply(self, model: TransferModel) -> TransferModel:
        """Set ``model`` up for stage 2 in this mode (gradients, pins, buffer copy); returns ``model``.

        Raises ``TypeError`` if ``model`` lacks ``backbone``, ``head_a`` or ``head_b``.
        """
        from ..freeze import pin_eval, shared_weight_copy
        missing = [a for a in ("backbone", "head_a", "head_b") if not isinstance(getattr(model, a, None), nn.Module)]
        if missing:
            raise TypeError(f"FreezeMode.apply needs a model with modules backbone, head_a and head_b (wrap yours: "
                            f"bnstudy.study.modes.TransferModel(backbone, head_a, head_b)); {type(model).__name__} lacks "
                            f"{missing}")
        if not hasattr(model, "backbone_b"):
            model.backbone_b = None
        model.backbone.requires_grad_(False)
        model.head_a.requires_grad_(False)
        model.head_b.requires_grad_(True)
        if self.separate_buffers:
            model.backbone_b = shared_weight_copy(model.backbone)
        model.train()
        if not self.head_batch_stats:
            pin_eval(model)
        elif not self.backbone_batch_stats or self.separate_buffers:
            pin_eval(model.backbone)
        return model


TRAIN_MODE = FreezeMode(
    "train_mode",
    "Gradients off for the backbone, which is left in train mode (the one-line freeze). "
    "Weights cannot change. Every stage-2 forward pass normalises task-B batches with their own "
    "statistics and overwrites the backbone's running_mean/running_var (and increments "
    "num_batches_tracked), so task A is later normalised with task B's statistics.",
    backbone_batch_stats=True, head_batch_stats=True, separate_buffers=False)
BACKBONE_EVAL = FreezeMode(
    "backbone_eval",
    "Gradients off and the backbone pinned in eval mode (surviving model.train()). "
    "Weights and buffers cannot change: BatchNorm normalises task B with task A's running statistics. "
    "The head is in train mode (matters only for heads with their own norm or dropout).",
    backbone_batch_stats=False, head_batch_stats=True, separate_buffers=False)
ALL_EVAL = FreezeMode(
    "all_eval",
    "Gradients off and the whole model pinned in eval mode, new head included. Backbone weights and "
    "buffers cannot change; a head with its own BatchNorm also normalises with stored statistics and "
    "never updates them.",
    backbone_batch_stats=False, head_batch_stats=False, separate_buffers=False)
SEPARATE_STATS = FreezeMode(
    "separate_stats",
    "Gradients off; task B runs through a shared-weight copy of the backbone that owns its own "
    "BatchNorm buffers and is in train mode, so only that copy's running statistics change. Task A "
    "runs through the original backbone, pinned in eval mode: its weights and buffers cannot change, "
    "so its logits are bit-identical (domain-specific BN, Chang et al. 2019).",
    backbone_batch_stats=True, head_batch_stats=True, separate_buffers=True)

MODES = {m.name: m for m in (TRAIN_MODE, BACKBONE_EVAL, ALL_EVAL, SEPARATE_STATS)}
MODE_NAMES = tuple(MODES)


def get_mode(name: str) -> FreezeMode:
    """The :class:`FreezeMode` called ``name``; raises ``ValueError`` listing the allowed names."""
    try:
        return MODES[name]
    except (KeyError, TypeError):
        raise ValueError(f"get_mode: name={name!r} is not a freeze mode; choose one of {list(MODE_NAMES)}") from None
