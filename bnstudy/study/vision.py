"""Standard torchvision networks as backbones for small images, and the one place torchvision is imported.

:func:`import_torchvision` is the only import of torchvision in this package (see its docstring
for why it needs a shim on a CPU build of torch). :func:`make_backbone` builds chapter 7's three
backbones, each mapping ``(B, 3, H, W)`` images to ``(B, out_features)`` features:

* ``small_cnn``: the book's :class:`bnstudy.study.models.ConvBackbone` (widths 16-32-64, BatchNorm).
* ``resnet18``: torchvision's ResNet-18 (He et al., 2016), ``weights=None``, with a small-image
  stem in the spirit of the CIFAR stems (3x3 ``conv1`` instead of 7x7, no max pool), but keeping
  ``conv1``'s stride 2: a 16x16 input gives 8x8 maps in ``layer1`` and 1x1 in ``layer4``. The CIFAR
  stem's stride 1 (16x16 maps in ``layer1``) was tried and measured 4-6x slower (0.71 s against
  0.12 s for a train-mode forward pass of 32 images on this project's shared 2-core CPU),
  too slow for ten seeds. ``fc`` replaced by the identity (512 features).
* ``mobilenet_v3_small``: torchvision's MobileNetV3-small (Howard et al., 2019), ``weights=None``,
  unchanged stem (its five stride-2 stages bring 16x16 to 1x1; stride 1 in the first convolution
  made a train step of 32 images about 2x slower, 0.94 s against 0.41 s); ``classifier`` replaced by the identity (576 features after global
  pooling), so the new heads sit directly on the pooled features as on the other backbones.

Grayscale digits are repeated to 3 channels (:mod:`bnstudy.study.data`), so every stem keeps its
3-channel convolution. Every BatchNorm layer gets momentum 0.1 (torchvision's MobileNetV3 builds 0.01;
see :func:`make_backbone`), so the networks differ in architecture only.
"""

from __future__ import annotations

import sys
import types

import torch
from torch import nn

#: Chapter 7's backbones.
NETWORKS = ("small_cnn", "resnet18", "mobilenet_v3_small")


def import_torchvision():
    """Import and return ``torchvision``, working around its missing C++ operators on a CPU-only torch.

    Why: PyPI's torchvision 0.28.0 (the release matching ``torch==2.13.0``) ships C++ operators
    (``torchvision::nms`` and friends) built against the CUDA build of torch. With this project's
    local CPU build of torch the operator library does not register, and the module
    ``torchvision._meta_registrations``, imported by ``torchvision/__init__.py``, fails at import
    with ``RuntimeError: operator torchvision::nms does not exist`` (it registers meta kernels
    for those operators). Putting an empty module under that name in ``sys.modules`` before the
    first import skips those registrations; everything else imports. Every classification model
    of ``torchvision.models`` then builds (``weights=None``) and runs forward and backward on CPU;
    detection and segmentation ops (``torchvision.ops.nms``, ``roi_align``) stay unusable, and
    this package does not use them. On an install whose operators load, the shim is harmless:
    the skipped registrations only serve ``torch.compile``'s meta tracing of those detection ops.

    Call this instead of ``import torchvision`` anywhere in the project (tests included).
    Raises ``ModuleNotFoundError`` naming the install line (:data:`INSTALL_LINE`) if torchvision is not installed.
    """
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    try:
        import torchvision  # noqa: PLC0415  (the one import in the package, after the shim)
    except ModuleNotFoundError as e:
        if e.name != "torchvision":
            raise
        sys.modules.pop("torchvision._meta_registrations", None)
        raise ModuleNotFoundError(f"import_torchvision: torchvision is not installed; install the version matching "
                                  f"torch 2.13.0 with {INSTALL_LINE}", name="torchvision") from e
    return torchvision


#: How to install torchvision for :func:`import_torchvision`: the ``vision`` extra pins the release matching torch.
INSTALL_LINE = "pip install \"torchvision==0.28.0\" (in a clone: pip install -e \".[vision]\")"


def classification_model_names() -> list[str]:
    """Names of every classification model in ``torchvision.models`` (``list_models(module=torchvision.models)``)."""
    tv = import_torchvision()
    return list(tv.models.list_models(module=tv.models))


def _resnet18_small() -> tuple[nn.Module, int]:
    tv = import_torchvision()
    net = tv.models.resnet18(weights=None)
    net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=2, padding=1, bias=False)
    nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # torchvision's init for convs
    net.maxpool = nn.Identity()
    out = net.fc.in_features
    net.fc = nn.Identity()
    return net, out


def _mobilenet_v3_small() -> tuple[nn.Module, int]:
    tv = import_torchvision()
    net = tv.models.mobilenet_v3_small(weights=None)
    out = net.classifier[0].in_features
    net.classifier = nn.Identity()
    return net, out


def make_backbone(name: str, momentum: float | None = 0.1) -> tuple[nn.Module, int]:
    """``(backbone, out_features)``: chapter 7's backbone ``name`` (:data:`NETWORKS`), randomly initialised.

    Input ``(B, 3, H, W)`` with ``H, W >= 8`` (16x16 in chapter 7); output ``(B, out_features)``.
    Initialisation draws from torch's global RNG: call under :func:`bnstudy.study.engine.seeded`.
    ``momentum`` is set on every BatchNorm layer (torchvision's MobileNetV3 builds its BatchNorm
    with 0.01; chapter 7 uses 0.1 everywhere so that the networks differ in architecture only).
    Raises ``ValueError`` for an unknown name; ``ImportError`` without torchvision for the two
    torchvision networks.
    """
    if name not in NETWORKS:
        raise ValueError(f"network={name!r} is not allowed; choose one of {list(NETWORKS)}")
    if name == "small_cnn":
        from .models import ConvBackbone
        net = ConvBackbone(3, (16, 32, 64), "batch", momentum)
        out = net.out_features
    elif name == "resnet18":
        net, out = _resnet18_small()
    else:
        net, out = _mobilenet_v3_small()
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = momentum
    return net, out


def has_norm_layer(model: nn.Module) -> bool:
    """Whether ``model`` has a normalisation layer (BatchNorm/InstanceNorm, GroupNorm, LayerNorm, LocalResponseNorm)."""
    kinds = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)
    if hasattr(nn, "RMSNorm"):
        kinds += (nn.RMSNorm,)
    return any(isinstance(m, kinds) for m in model.modules())


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` has a norm layer with running statistics (what a naive freeze lets drift)."""
    return any(isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats for m in model.modules())


#: Smallest square input (pixels) the audit test feeds each torchvision classification model; 32 otherwise.
#: Inception v3 with its auxiliary head needs 299 (the aux head pools 5x5, stride 3, from a 17x17 map); GoogLeNet's aux heads pool
#: to 4x4 from 1/16 resolution; ViTs are built for 2x2 patches (``image_size`` passed to the builder); MaxViT needs
#: 224 (7x7 partitions at 1/32).
AUDIT_INPUT_SIZE = {"inception_v3": 299, "googlenet": 64, "vit_b_16": 32, "vit_b_32": 64, "vit_l_16": 32,
                    "vit_l_32": 64, "vit_h_14": 28, "swin_t": 64, "swin_s": 64, "swin_b": 64,
                    "swin_v2_t": 64, "swin_v2_s": 64, "swin_v2_b": 64, "maxvit_t": 224}


def audit_model(name: str, num_classes: int = 10) -> tuple[nn.Module, int]:
    """``(model, input_size)``: torchvision classification model ``name``, ``weights=None``, for the audit test.

    Models with auxiliary heads are built with them (``aux_logits=True``; GoogLeNet and Inception
    v3 return a named tuple in train mode, logits alone in eval mode); ``init_weights=True`` where
    the builder asks for it. ``input_size`` is from :data:`AUDIT_INPUT_SIZE`.
    """
    tv = import_torchvision()
    kwargs = dict(weights=None, num_classes=num_classes)
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=True, init_weights=True)
    if name.startswith("vit_"):
        kwargs["image_size"] = AUDIT_INPUT_SIZE.get(name, 224)
    model = tv.models.get_model(name, **kwargs)
    return model, AUDIT_INPUT_SIZE.get(name, 32)


def logits_only(output) -> torch.Tensor:
    """The main logits of a classification model's output (GoogLeNet/Inception v3 return a tuple in train mode)."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    return output[0]
