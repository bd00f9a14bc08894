"""Models: a small conv backbone and classification heads, optionally *packed*.

Every module here works on flat, channel-concatenated tensors so that ``R``
independent networks ("replicas", e.g. ``R`` seeds) can run as one network:

* images: ``(B, R*C, H, W)``; replica ``r`` owns channels ``r*C:(r+1)*C``;
* features and logits: ``(B, R*F)``; replica ``r`` owns columns ``r*F:(r+1)*F``.

Convolutions use ``groups=R`` and per-replica weights, BatchNorm's statistics
are per channel, and :class:`PackedLinear` is a batched matrix product, so no
number of one replica ever depends on another. With ``replicas=1`` (the
default) every module is an ordinary single network; that is what practitioners
and the chapters' small examples use. Packing is how :mod:`bnstudy.sweep` runs
many seeds at once on a CPU (the trick follows grouped-convolution ensembles
such as "BatchEnsemble"-style packing; nothing here depends on it).
"""

from __future__ import annotations

import math

import torch
from torch import nn

NORM_KINDS = ("batch", "group", "layer", "none")
HEAD_KINDS = ("linear", "mlp", "mlp_bn")
DEFAULT_WIDTHS = (16, 32, 64)


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class PackedLinear(nn.Module):
    """``R`` independent affine maps ``in_features -> out_features`` in one module.

    Input ``(B, R*in_features)``, output ``(B, R*out_features)``. ``weight`` has
    shape ``(R, out_features, in_features)`` and ``bias`` ``(R, out_features)``;
    each replica is initialised like :class:`torch.nn.Linear` (uniform in
    ``±1/sqrt(in_features)``). With ``R=1`` it is a plain linear layer.
    """

    def __init__(self, in_features: int, out_features: int, replicas: int = 1):
        super().__init__()
        for n, v in (("in_features", in_features), ("out_features", out_features), ("replicas", replicas)):
            _check_positive_int(n, v)
        self.in_features, self.out_features, self.replicas = in_features, out_features, replicas
        bound = 1.0 / math.sqrt(in_features)
        self.weight = nn.Parameter(torch.empty(replicas, out_features, in_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(replicas, out_features).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        xr = x.reshape(b, self.replicas, self.in_features).transpose(0, 1)  # (R, B, in)
        y = torch.baddbmm(self.bias.unsqueeze(1), xr, self.weight.transpose(1, 2))  # (R, B, out)
        return y.transpose(0, 1).reshape(b, self.replicas * self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, replicas={self.replicas}"


def make_norm2d(kind: str, channels: int, replicas: int = 1, momentum: float | None = 0.1) -> nn.Module:
    """A 2-d normalisation layer over ``replicas * channels`` channels.

    ``batch`` is :class:`torch.nn.BatchNorm2d` (Ioffe & Szegedy, 2015) with the
    given ``momentum``; ``group`` is GroupNorm with ``min(8, channels)`` groups per
    replica (Wu & He, 2018); ``layer`` is GroupNorm with one group per replica,
    i.e. LayerNorm over ``(C, H, W)``; ``none`` is the identity.
    Raises ``ValueError`` for an unknown ``kind``.
    """
    _check_choice("norm", kind, NORM_KINDS)
    if kind == "batch":
        return nn.BatchNorm2d(replicas * channels, momentum=momentum)
    if kind == "group":
        groups = math.gcd(8, channels)
        return nn.GroupNorm(replicas * groups, replicas * channels)
    if kind == "layer":
        return nn.GroupNorm(replicas, replicas * channels)
    return nn.Identity()


class ConvBackbone(nn.Module):
    """Conv -> norm -> ReLU blocks, then global average pooling.

    Each block is a 3x3 convolution with stride 2 and no bias (the norm's affine
    shift replaces it), a normalisation layer (:func:`make_norm2d`) and a ReLU.
    With the default ``widths=(16, 32, 64)`` a ``3x32x32`` image becomes
    ``16x16x16``, ``32x8x8``, ``64x4x4`` and finally a 64-feature vector.

    Input ``(B, R*in_channels, H, W)``; output ``(B, R*widths[-1])``.
    Submodules are named ``blocks.<i>.conv`` / ``.norm`` / ``.act`` so reports
    read ``blocks.0.norm.running_mean``.
    """

    def __init__(self, in_channels: int = 3, widths=DEFAULT_WIDTHS, norm: str = "batch",
                 replicas: int = 1, momentum: float | None = 0.1):
        super().__init__()
        _check_positive_int("in_channels", in_channels)
        _check_positive_int("replicas", replicas)
        widths = tuple(widths)
        if not widths:
            raise ValueError("widths must name at least one block width, got an empty sequence")
        for w in widths:
            _check_positive_int("widths[i]", w)
        _check_choice("norm", norm, NORM_KINDS)
        self.in_channels, self.widths, self.norm_kind, self.replicas = in_channels, widths, norm, replicas
        blocks = []
        c_in = in_channels
        for w in widths:
            blocks.append(_block(replicas * c_in, replicas * w, replicas,
                                 make_norm2d(norm, w, replicas, momentum)))
            c_in = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.out_features = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.replicas * self.in_channels:
            raise ValueError(f"ConvBackbone expects input of shape (B, {self.replicas * self.in_channels}, H, W), "
                             f"got {tuple(x.shape)}")
        return self.pool(self.blocks(x)).flatten(1)


def _block(c_in: int, c_out: int, groups: int, norm: nn.Module) -> nn.Sequential:
    seq = nn.Sequential()
    seq.add_module("conv", nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False, groups=groups))
    seq.add_module("norm", norm)
    seq.add_module("act", nn.ReLU())
    return seq


def make_head(kind: str, in_features: int, n_classes: int, replicas: int = 1, hidden: int = 64,
              momentum: float | None = 0.1) -> nn.Module:
    """A classification head: ``(B, R*in_features) -> (B, R*n_classes)`` logits.

    ``linear``: one :class:`PackedLinear`. ``mlp``: linear, ReLU, linear with
    ``hidden`` units. ``mlp_bn``: linear, BatchNorm1d, ReLU, linear: a head with
    its own normalisation (and its own running statistics).
    Raises ``ValueError`` for an unknown ``kind``.
    """
    _check_choice("head", kind, HEAD_KINDS)
    if kind == "linear":
        return PackedLinear(in_features, n_classes, replicas)
    layers = [("fc1", PackedLinear(in_features, hidden, replicas))]
    if kind == "mlp_bn":
        layers.append(("norm", nn.BatchNorm1d(replicas * hidden, momentum=momentum)))
    layers += [("act", nn.ReLU()), ("fc2", PackedLinear(hidden, n_classes, replicas))]
    seq = nn.Sequential()
    for name, m in layers:
        seq.add_module(name, m)
    return seq


class Classifier(nn.Module):
    """``head(backbone(x))``: input ``(B, R*3, H, W)``, logits ``(B, R*n_classes)``."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def pack_states(states: list[dict]) -> dict:
    """Concatenate the state dicts of ``R`` single-replica models into one packed state.

    Every tensor with at least one dimension is concatenated along dim 0 (the
    replica-major layout all modules here use); 0-d tensors (BatchNorm's
    ``num_batches_tracked``) must agree across replicas and are kept once.
    Raises ``ValueError`` if the states have different keys or the scalars differ.
    """
    if not states:
        raise ValueError("pack_states needs at least one state dict")
    keys = list(states[0])
    out = {}
    for s in states[1:]:
        if list(s) != keys:
            raise ValueError("pack_states: state dicts have different keys")
    for k in keys:
        ts = [s[k] for s in states]
        if ts[0].dim() == 0:
            if any(not torch.equal(t, ts[0]) for t in ts):
                raise ValueError(f"pack_states: scalar {k!r} differs between replicas")
            out[k] = ts[0].clone()
        else:
            out[k] = torch.cat(ts, 0)
    return out


def unpack_state(state: dict, replicas: int) -> list[dict]:
    """Inverse of :func:`pack_states`: split a packed state into ``replicas`` states."""
    outs = [{} for _ in range(replicas)]
    for k, t in state.items():
        parts = [t] * replicas if t.dim() == 0 else torch.chunk(t, replicas, 0)
        for o, p in zip(outs, parts):
            o[k] = p.clone()
    return outs
