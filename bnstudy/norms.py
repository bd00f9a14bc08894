"""What a normalisation layer computes, decided the way torch's own ``forward`` decides it.

Every tool in this package (lints, the audit, conversion, estimators) asks this
module, so they agree with each other and with torch. The rules, read from
torch 2.x ``_BatchNorm.forward`` and ``_InstanceNorm._apply_instance_norm``:

BatchNorm (``_BatchNorm`` and, by assumption, any other ``_NormBase`` subclass
that is not an InstanceNorm)::

    batch statistics   = training or (running_mean is None and running_var is None)
    writes mean/var    = training and track_running_stats and the buffers exist
    counts a batch     = training and track_running_stats and num_batches_tracked exists
    weight of a batch  = momentum, or 1 / num_batches_tracked when momentum is None

So ``track_running_stats`` alone decides nothing: a layer built with
``track_running_stats=False`` whose flag is later set to True has no buffers and
still uses batch statistics in eval mode; a layer whose flag is set to False
after construction keeps its buffers and uses them in eval mode.

InstanceNorm (``_InstanceNorm``)::

    per-sample statistics = training or not track_running_stats
    writes mean/var       = per-sample and the buffers exist (even in eval mode when the flag is False)
    weight of a batch     = momentum, or 0.0 when momentum is None (the buffers never move)

InstanceNorm never counts batches. ``FrozenBatchNorm`` (this package's,
torchvision's, detectron2's, timm's: :func:`is_frozen_batchnorm`) always uses its
stored statistics; LayerNorm, GroupNorm, RMSNorm and LocalResponseNorm use each
sample's own.

TorchScript modules (``torch.jit.script``, ``torch.jit.trace``) are judged by the
Python class they were compiled from (:func:`script_source_class`): a scripted
BatchNorm1d follows the BatchNorm rule, reading the same ``training``,
``track_running_stats``, ``momentum`` and buffers, which TorchScript keeps.
"""

from __future__ import annotations

import numbers
import re
import sys

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
from torch.nn.modules.instancenorm import _InstanceNorm

_STATELESS_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.CrossMapLRN2d) + (
    (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())

#: Values of :func:`statistics_source`.
STATISTICS_SOURCES = ("batch", "running", "per-sample")


_MANGLE = re.compile(r"\.___torch_mangle_\d+")
_SCRIPT_CLASSES: dict = {}


def compiled_original(module):
    """The module ``torch.compile(module)`` wrapped (``OptimizedModule._orig_mod``, unwrapped repeatedly), or
    ``module`` itself when it is not such a wrapper. ``model.compile()`` compiles in place and is not a
    wrapper: it returns the model."""
    seen = 0
    while type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None),
                                                                    nn.Module) and seen < 8:
        module, seen = module._orig_mod, seen + 1
    return module


def is_script_module(module) -> bool:
    """Whether ``module`` is a TorchScript module (``torch.jit.script``/``torch.jit.trace``/``torch.jit.load``)."""
    return isinstance(module, torch.jit.ScriptModule)


def script_source_class(module) -> type | None:
    """The Python class a TorchScript module was compiled from, or None (not a ScriptModule, or a class whose
    module is not imported in this process, e.g. a model loaded with ``torch.jit.load`` whose code was never
    imported here, or a class defined inside a function).

    Read from TorchScript's qualified type name (``__torch__.torch.nn.modules.batchnorm.BatchNorm1d``, with
    ``___torch_mangle_N`` segments removed) and looked up among the modules already imported (``sys.modules``;
    nothing is imported, which could run a script); a class of ``__main__`` is looked up there, and as a last
    resort ``torch.nn`` is searched for the module's ``original_name``.
    """
    if not is_script_module(module):
        return None
    try:
        qualified = module._c._type().qualified_name()
    except (AttributeError, RuntimeError):
        qualified = None
    key = (qualified, getattr(module, "original_name", None))
    if key in _SCRIPT_CLASSES:
        return _SCRIPT_CLASSES[key]
    cls = None
    if qualified and qualified.startswith("__torch__."):
        path, _, name = _MANGLE.sub("", qualified[len("__torch__."):]).rpartition(".")
        for mod_name in ([path] if path else []) + ["__main__"]:
            # only modules already imported: importing one by name could run a user's script
            candidate = getattr(sys.modules.get(mod_name), name, None)
            if isinstance(candidate, type) and issubclass(candidate, nn.Module):
                cls = candidate
                break
    if cls is None:
        candidate = getattr(nn, str(key[1]), None)
        cls = candidate if isinstance(candidate, type) and issubclass(candidate, nn.Module) else None
    _SCRIPT_CLASSES[key] = cls
    return cls


def _rule_class(module) -> type | None:
    """The class whose rule ``module`` follows: its own type, or for a TorchScript module its source class."""
    return script_source_class(module) if is_script_module(module) else type(module)


def _is_sub(module, base) -> bool:
    cls = _rule_class(module)
    return cls is not None and issubclass(cls, base)


def is_norm_base(module: nn.Module) -> bool:
    """Whether ``module`` is a torch ``_NormBase`` layer (BatchNorm, SyncBatchNorm, lazy variants,
    InstanceNorm, third-party subclasses), or a TorchScript module compiled from one."""
    return _is_sub(module, _NormBase)


def is_frozen_batchnorm(module: nn.Module) -> bool:
    """Whether ``module`` is a FrozenBatchNorm: this package's :class:`bnstudy.freeze.FrozenBatchNorm`, or
    another library's class whose name starts with ``FrozenBatchNorm`` (torchvision's
    ``ops.FrozenBatchNorm2d``, detectron2's and timm's ``FrozenBatchNorm2d``), recognized by duck typing:
    ``running_mean``/``running_var`` buffers, ``weight``/``bias`` that are buffers (or absent), not
    parameters, and a numeric ``eps``. A TorchScript module compiled from such a class counts too.
    A ``_NormBase`` subclass with that name (a BatchNorm pinned by a ``train`` override) is a BatchNorm,
    not a FrozenBatchNorm."""
    if is_norm_base(module):
        return False
    cls = _rule_class(module)
    name = cls.__name__ if cls is not None else getattr(module, "original_name", "")
    if not name.startswith("FrozenBatchNorm"):
        return False
    buffers = dict(module.named_buffers(recurse=False))
    params = dict(module.named_parameters(recurse=False))
    eps = getattr(module, "eps", None)
    return (isinstance(buffers.get("running_mean"), torch.Tensor) and isinstance(buffers.get("running_var"),
                                                                                  torch.Tensor)
            and "weight" not in params and "bias" not in params
            and isinstance(eps, numbers.Real) and not isinstance(eps, bool))


def is_instance_norm(module: nn.Module) -> bool:
    """Whether ``module`` follows torch's InstanceNorm rule (a ``_InstanceNorm`` subclass, or a TorchScript
    module compiled from one)."""
    return _is_sub(module, _InstanceNorm)


def is_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` follows torch's BatchNorm rule: ``_BatchNorm`` (BatchNorm1d/2d/3d, SyncBatchNorm,
    the lazy variants) or another ``_NormBase`` subclass that is not an InstanceNorm (a third-party layer
    is assumed to keep torch's BatchNorm semantics); a TorchScript module compiled from one counts too
    (:func:`script_source_class`). Conversions refuse TorchScript modules (their submodules cannot be
    replaced); the audit and the lints read them."""
    return _is_sub(module, _BatchNorm) or (_is_sub(module, _NormBase) and not _is_sub(module, _InstanceNorm))


#: The attribute :func:`bnstudy.update_bn_stats` sets on each layer it estimated: the layer's
#: ``num_batches_tracked`` right after the estimate (the number of batches the equal-weight average covers).
PRECISE_MARK = "_bnstudy_precise_bn_batches"


def mark_precise_estimate(module: nn.Module) -> None:
    """Record on ``module`` that its running statistics are now a precise-BN estimate (:data:`PRECISE_MARK`).

    The mark survives ``copy.deepcopy`` and is carried by FrozenBatchNorm conversions; a state_dict does not
    carry it."""
    nbt = getattr(module, "num_batches_tracked", None)
    if isinstance(nbt, torch.Tensor):
        setattr(module, PRECISE_MARK, int(nbt))


def holds_precise_estimate(module: nn.Module) -> bool:
    """Whether ``module``'s running statistics are a precise-BN estimate not reset since
    (:func:`mark_precise_estimate`; a reset, ``num_batches_tracked`` below the count at the estimate, drops the
    mark). Train-mode updates after the estimate keep it: they average the estimate with data, never with the
    reset values mean 0 / variance 1."""
    k = getattr(module, PRECISE_MARK, None)
    nbt = getattr(module, "num_batches_tracked", None)
    if k is None or not isinstance(nbt, torch.Tensor):
        return False
    if int(nbt) < k:
        try:
            delattr(module, PRECISE_MARK)
        except AttributeError:
            pass
        return False
    return True


def has_running_stats(module: nn.Module) -> bool:
    """Whether ``module`` holds ``running_mean`` and ``running_var`` buffers (not ``None``), whatever its
    ``track_running_stats`` flag says."""
    return (getattr(module, "running_mean", None) is not None
            and getattr(module, "running_var", None) is not None)


def keeps_running_stats(module: nn.Module) -> bool:
    """Whether ``module`` is a torch norm layer (``_NormBase``) that holds running statistics: the layers
    a freeze has to protect (BatchNorm 1d/2d/3d, SyncBatchNorm, lazy variants, tracked InstanceNorm,
    third-party ``_NormBase`` subclasses)."""
    return is_norm_base(module) and has_running_stats(module)


def statistics_source(module: nn.Module, training: bool | None = None) -> str | None:
    """Which statistics ``module`` normalises with when its train/eval flag is ``training``.

    ``training=None`` uses the module's current flag. Returns ``"batch"``
    (BatchNorm rule above), ``"running"`` (stored statistics: BatchNorm or
    tracked InstanceNorm in eval mode, any FrozenBatchNorm), ``"per-sample"``
    (each sample alone: InstanceNorm in train mode or untracked, LayerNorm,
    GroupNorm, RMSNorm, LocalResponseNorm), or ``None`` for a module that is not
    a normalisation layer. An eval-mode InstanceNorm whose flag says tracked
    but which has no buffers makes torch raise; it is reported as ``"running"``.
    """
    training = module.training if training is None else bool(training)
    if is_instance_norm(module):
        return "per-sample" if training or not module.track_running_stats else "running"
    if is_batch_norm(module):
        no_buffers = getattr(module, "running_mean", None) is None and getattr(module, "running_var", None) is None
        return "batch" if training or no_buffers else "running"
    if is_frozen_batchnorm(module):
        return "running"
    if _is_sub(module, _STATELESS_NORMS):
        return "per-sample"
    return None


def updates_running_stats(module: nn.Module, training: bool | None = None) -> bool:
    """Whether a forward pass of ``module`` with flag ``training`` writes ``running_mean``/``running_var``.

    By the rules in this module's docstring; true at ``momentum=0.0`` too (the
    kernel writes the same values back; see :func:`changes_running_stats`), and
    whatever ``torch.no_grad()`` says.
    """
    training = module.training if training is None else bool(training)
    if not has_running_stats(module):
        return False
    if is_instance_norm(module):
        return training or not module.track_running_stats
    if is_batch_norm(module):
        return training and bool(module.track_running_stats)
    return False


def counts_batches(module: nn.Module, training: bool | None = None) -> bool:
    """Whether a forward pass increments ``num_batches_tracked`` (BatchNorm rule only)."""
    training = module.training if training is None else bool(training)
    return (is_batch_norm(module) and training and bool(module.track_running_stats)
            and getattr(module, "num_batches_tracked", None) is not None)


def changes_running_stats(module: nn.Module, training: bool | None = None) -> bool:
    """Whether a forward pass can change the *values* of ``running_mean``/``running_var``: a write
    (:func:`updates_running_stats`) with a nonzero weight for the new batch (``momentum`` 0, or
    ``None`` on an InstanceNorm, keep the old values)."""
    if not updates_running_stats(module, training):
        return False
    m = module.momentum
    if m is None:
        return not is_instance_norm(module)
    return m != 0


def changes_buffers(module: nn.Module, training: bool | None = None) -> bool:
    """Whether a forward pass changes any buffer of ``module`` (statistics or ``num_batches_tracked``)."""
    return changes_running_stats(module, training) or counts_batches(module, training)


def batch_dependent(module: nn.Module, training: bool | None = None) -> bool:
    """Whether a sample's output depends on the other samples of its batch (BatchNorm with batch statistics)."""
    return is_batch_norm(module) and statistics_source(module, training) == "batch"


def norm_layers(model: nn.Module, with_running_stats: bool = False) -> dict[str, nn.Module]:
    """Every normalisation layer of ``model`` by qualified name (those :func:`statistics_source` knows);
    with ``with_running_stats=True`` only those that hold running statistics (:func:`keeps_running_stats`)."""
    out = {}
    for name, m in model.named_modules():
        if with_running_stats:
            if keeps_running_stats(m):
                out[name] = m
        elif statistics_source(m) is not None:
            out[name] = m
    return out
