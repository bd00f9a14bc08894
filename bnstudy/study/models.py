"""Models: a small conv backbone and classification heads.

:class:`ConvBackbone` is the book's network: stride-2 3x3 convolutions, a norm layer and a
ReLU per block, then global average pooling. :func:`make_head` builds the heads chapters
attach to it. Everything is an ordinary single network (one seed per model); runs of
several freeze modes share their data in lockstep in :mod:`bnstudy.study.engine` instead.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from .config import HEAD_KINDS, NORM_KINDS

DEFAULT_WIDTHS = (16, 32, 64)


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class Linear(nn.Linear):
    """:class:`torch.nn.Linear` with weight, then bias, drawn uniform in ``±1/sqrt(in_features)``.

    The same distribution as PyTorch's default initialisation, drawn with one ``uniform_``
    call per tensor, so a head's initial weights are a fixed function of the RNG state.
    Input ``(B, in_features)``, output ``(B, out_features)``.
    """

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.bias.uniform_(-bound, bound)


def make_norm2d(kind: str, channels: int, momentum: float | None = 0.1) -> nn.Module:
    """A 2-d normalisation layer over ``channels`` channels.

    ``batch`` is :class:`torch.nn.BatchNorm2d` (Ioffe & Szegedy, 2015) with the
    given ``momentum``; ``group`` is GroupNorm with ``gcd(8, channels)`` groups
    (Wu & He, 2018); ``layer`` is GroupNorm with one group,
    i.e. LayerNorm over ``(C, H, W)``; ``none`` is the identity.
    Raises ``ValueError`` for an unknown ``kind``.
    """
    _check_choice("norm", kind, NORM_KINDS)
    if kind == "batch":
        return nn.BatchNorm2d(channels, momentum=momentum)
    if kind == "group":
        return nn.GroupNorm(math.gcd(8, channels), channels)
    if kind == "layer":
        return nn.GroupNorm(1, channels)
    return nn.Identity()


class ConvBackbone(nn.Module):
    """Conv -> norm -> ReLU blocks, then global average pooling.

    Each block is a 3x3 convolution with stride 2 and no bias (the norm's affine
    shift replaces it), a normalisation layer (:func:`make_norm2d`) and a ReLU.
    With the default ``widths=(16, 32, 64)`` a ``3x32x32`` image becomes
    ``16x16x16``, ``32x8x8``, ``64x4x4`` and finally a 64-feature vector.

    Input ``(B, in_channels, H, W)``; output ``(B, widths[-1])``.
    Submodules are named ``blocks.<i>.conv`` / ``.norm`` / ``.act`` so reports
    read ``blocks.0.norm.running_mean``.
    """

    def __init__(self, in_channels: int = 3, widths=DEFAULT_WIDTHS, norm: str = "batch",
                 momentum: float | None = 0.1):
        super().__init__()
        _check_positive_int("in_channels", in_channels)
        widths = tuple(widths)
        if not widths:
            raise ValueError("widths must name at least one block width, got an empty sequence")
        for w in widths:
            _check_positive_int("widths[i]", w)
        _check_choice("norm", norm, NORM_KINDS)
        self.in_channels, self.widths, self.norm_kind = in_channels, widths, norm
        blocks = []
        c_in = in_channels
        for w in widths:
            blocks.append(_block(c_in, w, make_norm2d(norm, w, momentum)))
            c_in = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.out_features = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"ConvBackbone expects input of shape (B, {self.in_channels}, H, W), "
                             f"got {tuple(x.shape)}")
        return self.pool(self.blocks(x)).flatten(1)


def _block(c_in: int, c_out: int, norm: nn.Module) -> nn.Sequential:
    seq = nn.Sequential()
    seq.add_module("conv", nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False))
    seq.add_module("norm", norm)
    seq.add_module("act", nn.ReLU())
    return seq


class Standardize(nn.Module):
    """A fixed per-feature standardization ``(f - mean) / sd``: input and output ``(B, features)``.

    ``mean`` and ``sd`` are buffers (no parameters, no train/eval behaviour), the identity until :meth:`fit` sets
    them. It is the fixed input scaling of a linear model (the usual "standardize the features first"), here applied
    to a frozen backbone's features before a linear head.
    """

    def __init__(self, features: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("sd", torch.ones(features))

    @torch.no_grad()
    def fit(self, f: torch.Tensor) -> "Standardize":
        """Set ``mean`` / ``sd`` from features ``f`` ``(N, features)``, N >= 2 (a feature of SD 0 keeps SD 1, so it
        stays finite). Raises ``ValueError`` for another shape."""
        if f.dim() != 2 or f.shape[1] != self.mean.numel() or f.shape[0] < 2:
            raise ValueError(f"Standardize.fit expects features of shape (N >= 2, {self.mean.numel()}), "
                             f"got {tuple(f.shape)}")
        mean, sd = f.double().mean(0), f.double().std(0)
        self.mean.copy_(mean.to(self.mean.dtype))
        self.sd.copy_(torch.where(sd > 0, sd, torch.ones_like(sd)).to(self.sd.dtype))
        return self

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return (f - self.mean) / self.sd


def make_head(kind: str, in_features: int, n_classes: int, hidden: int = 64,
              momentum: float | None = 0.1) -> nn.Module:
    """A classification head: ``(B, in_features) -> (B, n_classes)`` logits.

    ``linear``: one :class:`Linear`. ``mlp``: linear, ReLU, linear with
    ``hidden`` units. ``mlp_bn``: linear, BatchNorm1d, ReLU, linear: a head with
    its own normalisation (and its own running statistics). ``mlp2``: two hidden
    layers of ``hidden`` units (fc1, ReLU, fc2, ReLU, fc3). ``mlp_ln``: linear,
    LayerNorm over the ``hidden`` units (Ba et al., 2016; per sample, no running
    statistics), ReLU, linear.
    Three linear heads normalize their own input (the backbone's features) first: ``std_linear`` a fixed
    per-feature standardization (:class:`Standardize`, fitted by the engine on task-B features before stage 2),
    ``bn_linear`` a BatchNorm1d (batch statistics in train mode, its own running statistics in eval mode) and
    ``ln_linear`` a LayerNorm over the features of each sample; each is named ``norm`` then ``fc``.
    Raises ``ValueError`` for an unknown ``kind``.
    """
    _check_choice("head", kind, HEAD_KINDS)
    if kind == "linear":
        return Linear(in_features, n_classes)
    if kind in ("std_linear", "bn_linear", "ln_linear"):
        norm = {"std_linear": lambda: Standardize(in_features),
                "bn_linear": lambda: nn.BatchNorm1d(in_features, momentum=momentum),
                "ln_linear": lambda: nn.LayerNorm(in_features)}[kind]()
        return nn.Sequential(OrderedDict(norm=norm, fc=Linear(in_features, n_classes)))
    layers = [("fc1", Linear(in_features, hidden))]
    if kind == "mlp_bn":
        layers.append(("norm", nn.BatchNorm1d(hidden, momentum=momentum)))
    if kind == "mlp_ln":
        layers.append(("norm", nn.LayerNorm(hidden)))
    if kind == "mlp2":
        layers += [("act1", nn.ReLU()), ("fc2", Linear(hidden, hidden)), ("act", nn.ReLU()),
                   ("fc3", Linear(hidden, n_classes))]
    else:
        layers += [("act", nn.ReLU()), ("fc2", Linear(hidden, n_classes))]
    seq = nn.Sequential()
    for name, m in layers:
        seq.add_module(name, m)
    return seq


class Classifier(nn.Module):
    """``head(backbone(x))``: input ``(B, 3, H, W)``, logits ``(B, n_classes)``."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))
