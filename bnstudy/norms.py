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

import copy
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


# --- Does a replacement compute what a layer computes in eval mode? (conversions ask before changing anything) ---

#: ``forward`` functions whose eval-mode output is exactly ``F.batch_norm(x, running_mean, running_var, weight, bias,
#: training=False, momentum, eps)`` of the layer's own fields (batch statistics when it has no buffers). A layer of
#: a class with one of these, without an instance ``forward`` or a class ``__call__`` of its own, is converted
#: without a probe. :class:`bnstudy.freeze.FrozenBatchNorm` adds its own forward.
STANDARD_EVAL_FORWARDS: set = {_BatchNorm.forward, nn.SyncBatchNorm.forward}

_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")

#: Normalised values ``z`` each probe channel holds (``x = running_mean + sqrt(running_var + eps) * z``): both signs,
#: zero, tiny and large values, so an activation, a clamp or a rescale inside ``forward`` shows.
PROBE_Z = (-1000.0, -40.0, -6.0, -3.0, -1.5, -1.0, -0.5, -0.1, -1e-3, 0.0, 1e-3, 0.1, 0.5, 1.0, 1.5, 3.0, 6.0, 40.0,
           1000.0, -0.73, 0.27, 2.2, -2.6, 0.9)

#: Probe shapes ``(N, *spatial)`` for each input rank (24 values per channel, as :data:`PROBE_Z`).
_PROBE_SHAPES = {2: (24,), 3: (4, 6), 4: (2, 3, 4), 5: (2, 2, 2, 3)}


def computes_standard_eval(module: nn.Module) -> bool:
    """Whether ``module``'s eval output is, by its code, torch's BatchNorm eval kernel on its own fields: its class's
    ``forward`` is in :data:`STANDARD_EVAL_FORWARDS` (``_BatchNorm.forward``, ``SyncBatchNorm.forward``,
    FrozenBatchNorm's), with no ``forward`` set on the instance and no ``__call__`` of its own class. A subclass that
    overrides ``forward`` (timm's ``BatchNormAct2d`` applies its activation there) does not count, whatever it
    computes: :func:`eval_output_difference` measures that."""
    cls = type(module)
    return (not is_script_module(module) and getattr(cls, "forward", None) in STANDARD_EVAL_FORWARDS
            and "forward" not in module.__dict__ and cls.__call__ is nn.Module.__call__)


def registered_hooks(module: nn.Module) -> list[str]:
    """The hooks registered on ``module`` itself (``register_forward_pre_hook``, ``register_forward_hook``,
    ``register_full_backward_pre_hook``, ``register_full_backward_hook``), as words such as ``"1 forward hook"``;
    empty when there are none. A module built to replace ``module`` would not run them, so a conversion that drops
    them changes what the model computes (a hook may rescale the output) or records (a feature-capture hook).
    Global hooks (``torch.nn.modules.module.register_module_forward_hook``, which the freeze audit uses) are not
    per-module and are not counted."""
    words = (("_forward_pre_hooks", "forward pre-hook"), ("_forward_hooks", "forward hook"),
             ("_backward_pre_hooks", "backward pre-hook"), ("_backward_hooks", "backward hook"))
    out = []
    for attr, word in words:
        n = len(module.__dict__.get(attr) or ())
        if n:
            out.append(f"{n} {word}{'s' if n > 1 else ''}")
    return out


def _hookless_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` without its hooks (an audit's hooks must not see a probe, nor be copied)."""
    memo: dict = {}
    for m in module.modules():
        for k in _HOOK_DICTS:
            d = m.__dict__.get(k)
            if d is not None:
                memo[id(d)] = type(d)()
    return copy.deepcopy(module, memo)


def _probe(module: nn.Module, rank: int) -> torch.Tensor:
    """A probe input of rank ``rank`` for ``module``: channel ``c`` holds ``mean_c + sd_c * z`` for z in
    :data:`PROBE_Z`, with the layer's running statistics (0 and 1 when it has none), in its dtype and on its device."""
    c = _channels(module)
    ref = next((t for t in (getattr(module, "running_mean", None), getattr(module, "weight", None))
                if isinstance(t, torch.Tensor)), None)
    dtype = ref.dtype if ref is not None and ref.is_floating_point() else torch.float32
    device = ref.device if ref is not None else torch.device("cpu")
    mean = torch.zeros(c, dtype=torch.float64)
    sd = torch.ones(c, dtype=torch.float64)
    rm, rv = getattr(module, "running_mean", None), getattr(module, "running_var", None)
    if isinstance(rm, torch.Tensor) and isinstance(rv, torch.Tensor) and rm.numel() == c and rv.numel() == c:
        eps = getattr(module, "eps", 0.0)
        eps = float(eps) if isinstance(eps, numbers.Real) else 0.0
        mean = rm.detach().double().cpu().reshape(c)
        sd = (rv.detach().double().cpu().reshape(c) + eps).clamp_min(0).sqrt()
        mean, sd = torch.nan_to_num(mean), torch.nan_to_num(sd, nan=1.0)
    z = torch.tensor(PROBE_Z, dtype=torch.float64)
    x = mean[:, None] + sd[:, None] * z[None, :]  # (C, 24)
    big = torch.finfo(dtype).max / 4
    x = x.clamp(-big, big).T.reshape(_PROBE_SHAPES[rank] + (c,))  # (*, C): values of one sample position by channel
    x = x.movedim(-1, 1) if rank > 2 else x
    return x.contiguous().to(device=device, dtype=dtype)


def _same(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def eval_output_difference(old: nn.Module, new: nn.Module) -> str | None:
    """``None`` when ``new`` computes in eval mode what ``old`` computes, bit for bit (``torch.equal``, NaN where
    both are NaN), on probe inputs of every rank (2 to 5) both accept (a rank only ``new`` refuses raises there
    rather than changing silently); otherwise a sentence saying where they differ (the rank, the largest
    ``|difference|``) or why it could not be checked (no rank both accept, no number of channels, cannot be copied).

    The probes (:data:`PROBE_Z`) put each channel's normalised value at both signs, zero and up to 1000 standard
    deviations, so an activation, clamp, dropout-free rescale or extra term inside ``forward`` shows; a forward that
    differs only on inputs outside them (another batch size, a spatial size) is not seen. Both layers are run as
    hook-free deep copies (``model`` and its hooks, an audit's included, see nothing), in eval mode, under
    ``torch.no_grad()`` with the global RNG forked; neither is changed.
    """
    if _channels(old) is None:
        return ("it has neither num_features nor a 1-D running_mean, so its number of channels, and its output, "
                "could not be checked")
    try:
        a, b = _hookless_copy(old), _hookless_copy(new)
    except Exception as e:  # noqa: BLE001 - any failure to copy means: not checked, refuse
        return f"it could not be copied to check its output ({type(e).__name__}: {e})"
    for m in list(a.modules()) + list(b.modules()):
        m.training = False
    checked = []
    first_error = None
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for rank in sorted(_PROBE_SHAPES, key=lambda r: r != _preferred_rank(old)):
            x = _probe(old, rank)
            try:
                ya = a(x)
            except Exception as e:  # noqa: BLE001 - a rank the layer does not take
                first_error = first_error or e
                continue
            try:
                yb = b(x)
            except Exception as e:  # noqa: BLE001 - the replacement refuses this rank: loud, not a silent change
                first_error = first_error or e
                continue
            if not _same(ya, yb):
                if isinstance(ya, torch.Tensor) and isinstance(yb, torch.Tensor) and ya.shape == yb.shape:
                    diff = (ya.double() - yb.double()).abs()
                    worst = float(torch.nan_to_num(diff, nan=float("inf")).max())
                    return (f"its eval output differs from the replacement's by up to {worst:.4g} on a rank-{rank} "
                            f"probe {tuple(x.shape)}")
                return f"its eval output on a rank-{rank} probe is {_what(ya)}, the replacement's {_what(yb)}"
            checked.append(rank)
    if not checked:
        return (f"it and its replacement ran on no common probe input (ranks 2 to 5): {type(first_error).__name__}: "
                f"{first_error}")
    return None


def _channels(module: nn.Module) -> int | None:
    """The layer's number of channels: ``num_features``, else the length of a 1-D ``running_mean`` (torchvision's
    ``FrozenBatchNorm2d`` keeps no ``num_features``); None when neither is there."""
    c = getattr(module, "num_features", None)
    if isinstance(c, numbers.Integral) and not isinstance(c, bool) and c >= 1:
        return int(c)
    rm = getattr(module, "running_mean", None)
    return int(rm.numel()) if isinstance(rm, torch.Tensor) and rm.dim() == 1 and rm.numel() else None


def _preferred_rank(module: nn.Module) -> int:
    name = type(module).__name__
    return 2 if "1d" in name else 5 if "3d" in name else 4


def _what(y) -> str:
    if isinstance(y, torch.Tensor):
        return f"a {str(y.dtype).removeprefix('torch.')} tensor of shape {tuple(y.shape)}"
    return f"a {type(y).__name__}"


#: The layers an open :func:`bnstudy.adapt_bn_statistics` block adapts, by ``id``: ``(weakref to the layer, its name,
#: the block's record)``. Kept here so that every conversion can refuse an adapted layer without importing the block.
ADAPTED: dict = {}


def adapted_layers(model: nn.Module) -> list[str]:
    """Qualified names of ``model``'s layers adapted by an open :func:`bnstudy.adapt_bn_statistics` block."""
    out = []
    for n, m in model.named_modules():
        entry = ADAPTED.get(id(m))
        if entry is not None and entry[0]() is m:
            out.append(n or "(model)")
    return out


def refuse_adapted(fn: str, param: str, model: nn.Module) -> None:
    """Raise ``ValueError`` when ``model`` holds a layer that an open :func:`bnstudy.adapt_bn_statistics` block adapts:
    inside the block its output is replaced, so a conversion's output check or an estimate would read the adapted
    layer, not the model."""
    names = adapted_layers(model)
    if names:
        raise ValueError(f"{fn}: {param} has BatchNorm layers inside an open bnstudy.adapt_bn_statistics block "
                         f"({names[:4]}), whose outputs are replaced with test-time statistics there; nothing was "
                         f"changed. Call {fn} after the block")

