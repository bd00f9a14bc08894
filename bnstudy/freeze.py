"""The four freeze modes, eval-mode pinning that survives ``.train()``, shared-weight copies.

Turning off gradients (``requires_grad_(False)``) stops the optimizer; it does
not stop BatchNorm. In train mode every forward pass normalises with the batch's
own statistics and overwrites the buffers::

    running_mean <- (1 - momentum) * running_mean + momentum * batch_mean
    running_var  <- (1 - momentum) * running_var  + momentum * batch_var (unbiased)

(PyTorch's convention; Ioffe & Szegedy, 2015). The freeze modes below differ
only in which batch-norm layers are in train mode during stage 2, and which
buffers they own. Each is a named object with an ``apply(model)`` method that
sets a :class:`TransferModel` up for stage 2.
"""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class TransferModel(nn.Module):
    """A backbone with an old head (task A) and a new head (task B).

    ``forward_a(x)`` is ``head_a(backbone(x))``; ``forward_b(x)`` is
    ``head_b(backbone_b(x))`` where ``backbone_b`` is the backbone itself unless
    a freeze mode gave task B its own statistics (``separate_stats``).
    Shapes: ``x (B, R*3, H, W)`` -> logits ``(B, R*n_classes)``.
    """

    def __init__(self, backbone: nn.Module, head_a: nn.Module, head_b: nn.Module):
        super().__init__()
        self.backbone, self.head_a, self.head_b = backbone, head_a, head_b
        self.backbone_b: nn.Module | None = None

    def forward_a(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_a(self.backbone(x))

    def forward_b(self, x: torch.Tensor) -> torch.Tensor:
        bb = self.backbone if self.backbone_b is None else self.backbone_b
        return self.head_b(bb(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_b(x)


def _pinned_train(self: nn.Module, mode: bool = True) -> nn.Module:
    # Ignore the requested mode: a pinned module and everything below it stays in eval.
    nn.Module.train(self, False)
    return self


def pin_eval(module: nn.Module) -> nn.Module:
    """Put ``module`` and all its descendants in eval mode, and keep them there.

    A parent's ``.train()`` calls each child's ``train(True)``; a pinned module
    overrides its own ``train`` (on the instance) to stay in eval mode, so the
    freeze survives the ``model.train()`` at the start of every epoch. This is
    the habit of mmdetection's backbones (``norm_eval`` re-applied in an
    overridden ``train``), done per instance so it works on any ``nn.Module``.
    Returns ``module``. Undo with :func:`unpin`.
    """
    for m in module.modules():
        m.train = types.MethodType(_pinned_train, m)
    nn.Module.train(module, False)
    return module


def unpin(module: nn.Module) -> nn.Module:
    """Undo :func:`pin_eval` on ``module`` and its descendants (their mode is left as is)."""
    for m in module.modules():
        if "train" in m.__dict__:
            del m.__dict__["train"]
    return module


def is_pinned(module: nn.Module) -> bool:
    """Whether :func:`pin_eval` pinned ``module``."""
    return "train" in module.__dict__


def shared_weight_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` that shares every parameter but owns its buffers.

    The copy's parameters *are* the original's ``nn.Parameter`` objects (an
    optimizer step or a ``requires_grad`` flag acts on both), while running
    statistics and ``num_batches_tracked`` are independent clones. This is the
    structure of domain-specific batch normalisation (Chang et al., 2019) with
    the affine parameters shared as well.
    """
    clone = copy.deepcopy(module)
    for m_clone, m_orig in zip(clone.modules(), module.modules()):
        for name, p in m_orig._parameters.items():
            m_clone._parameters[name] = p
    return clone


@dataclass(frozen=True)
class FreezeMode:
    """A way of freezing a backbone for stage 2 (training a new head on task B).

    In every mode the backbone's parameters get ``requires_grad=False`` and only
    ``head_b``'s parameters are trained, so no backbone weight can change. The
    modes differ in what happens to the backbone's BatchNorm buffers
    (``running_mean``, ``running_var``, ``num_batches_tracked``).
    """

    name: str
    summary: str

    def apply(self, model: TransferModel) -> TransferModel:
        """Set ``model`` up for stage 2 in this mode; returns ``model``."""
        raise NotImplementedError

    @staticmethod
    def _freeze_weights(model: TransferModel) -> None:
        model.backbone.requires_grad_(False)
        model.head_a.requires_grad_(False)
        model.head_b.requires_grad_(True)


class _TrainMode(FreezeMode):
    def apply(self, model):
        self._freeze_weights(model)
        model.train()
        return model


class _BackboneEval(FreezeMode):
    def apply(self, model):
        self._freeze_weights(model)
        model.train()
        pin_eval(model.backbone)
        return model


class _AllEval(FreezeMode):
    def apply(self, model):
        self._freeze_weights(model)
        pin_eval(model)
        return model


class _SeparateStats(FreezeMode):
    def apply(self, model):
        self._freeze_weights(model)
        model.backbone_b = shared_weight_copy(model.backbone)
        model.train()
        pin_eval(model.backbone)
        return model


TRAIN_MODE = _TrainMode(
    "train_mode",
    "Gradients off for the backbone, which is left in train mode (the one-line freeze). "
    "Weights cannot change. Every stage-2 forward pass normalises task-B batches with their own "
    "statistics and overwrites the backbone's running_mean/running_var (and increments "
    "num_batches_tracked), so task A is later normalised with task B's statistics.")
BACKBONE_EVAL = _BackboneEval(
    "backbone_eval",
    "Gradients off and the backbone pinned in eval mode (surviving model.train()). "
    "Weights and buffers cannot change: BatchNorm normalises task B with task A's running statistics. "
    "The head is in train mode (matters only for heads with their own norm or dropout).")
ALL_EVAL = _AllEval(
    "all_eval",
    "Gradients off and the whole model pinned in eval mode, new head included. Backbone weights and "
    "buffers cannot change; a head with its own BatchNorm also normalises with stored statistics and "
    "never updates them.")
SEPARATE_STATS = _SeparateStats(
    "separate_stats",
    "Gradients off; task B runs through a shared-weight copy of the backbone that owns its own "
    "BatchNorm buffers and is in train mode, so only that copy's running statistics change. Task A "
    "runs through the original backbone, pinned in eval mode: its weights and buffers cannot change, "
    "so its logits are bit-identical (domain-specific BN, Chang et al. 2019).")

MODES = {m.name: m for m in (TRAIN_MODE, BACKBONE_EVAL, ALL_EVAL, SEPARATE_STATS)}
MODE_NAMES = tuple(MODES)


def get_mode(name: str) -> FreezeMode:
    """The :class:`FreezeMode` called ``name``; raises ``ValueError`` listing the allowed names."""
    try:
        return MODES[name]
    except (KeyError, TypeError):
        raise ValueError(f"mode={name!r} is not a freeze mode; choose one of {list(MODE_NAMES)}") from None


def batchnorm_layers(module: nn.Module) -> dict[str, _BatchNorm]:
    """Every BatchNorm layer (``_BatchNorm`` subclasses, SyncBatchNorm included) by qualified name."""
    return {n: m for n, m in module.named_modules() if isinstance(m, _BatchNorm)}
