"""Freezing tools: eval-mode pinning that survives ``.train()``, FrozenBatchNorm, freeze by name, shared-weight copies.

Turning off gradients (``requires_grad_(False)``) stops the optimizer; it does
not stop BatchNorm. In train mode every forward pass normalises with the batch's
own statistics and overwrites the buffers::

    running_mean <- (1 - momentum) * running_mean + momentum * batch_mean
    running_var  <- (1 - momentum) * running_var  + momentum * batch_var (unbiased)

(PyTorch's convention; Ioffe & Szegedy, 2015). The book's four freeze modes are
in :mod:`bnstudy.study.modes` (re-exported here).
"""

from __future__ import annotations

import copy
import numbers
import re
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

# The book's freeze modes live in bnstudy.study.modes, the norm-layer rules in bnstudy.norms (one import path per name).
from ._checks import check_bool, check_int, check_module, check_number, check_str, describe, module_names
from .norms import (PRECISE_MARK, refuse_adapted, STANDARD_EVAL_FORWARDS, _hookless_copy, compiled_original, computes_standard_eval,
                    eval_output_difference,
                    registered_hooks,
                    has_running_stats, is_batch_norm, is_frozen_batchnorm, is_norm_base, is_script_module,
                    keeps_running_stats, statistics_source, updates_running_stats)

#: Attribute :func:`pin_eval` sets (``True``) on every module it pins, besides the ``train`` override. TorchScript
#: keeps plain attributes and drops Python methods, so a scripted copy of a pinned module still carries the mark
#: without the pin: :func:`pin_dropped` and the audit's ``pin_lost`` lint read it.
PIN_MARK = "_bnstudy_pinned"


def _refuse_script_module(fn: str, param: str, module) -> None:
    """Raise ``TypeError`` when ``module`` is a TorchScript module: ``fn`` replaces submodules, changes
    compiled constants or relies on Python hooks, none of which a ScriptModule allows. The message says
    what to do instead (apply ``fn`` to the Python model, then script it)."""
    if is_script_module(module):
        raise TypeError(
            f"{fn}: {param} is a TorchScript module ({type(module).__name__} of {getattr(module, 'original_name', '?')}, "
            "from torch.jit.script/trace/load): its submodules cannot be replaced, momentum and "
            "track_running_stats are compiled constants, and Python hooks do not run inside it. Call "
            f"{fn} on the Python model and script the result (FrozenBatchNorm scripts); to read a scripted "
            "model use bnstudy.lint_model, bnstudy.freeze.batch_stats_report or bnstudy.FreezeAudit, which work on it, "
            "and re-pin it with bnstudy.pin_eval/bnstudy.pin_norm_eval after scripting or loading")


def _named(fn: str, e: ValueError) -> ValueError:
    """A refusal from inside a conversion, its message starting with the public function ``fn`` the user called
    (once: a message that already names it is kept)."""
    msg = str(e)
    return ValueError(msg if msg.startswith(f"{fn}: ") else f"{fn}: {msg}")


class _PinnedTrain:
    """The ``train`` of a pinned module: ignores the requested mode and keeps the module in eval.

    A small callable object rather than a bound method, so a pinned model can be
    deep-copied and pickled (``torch.save(model)``) with its pin intact.
    """

    def __init__(self, module: nn.Module):
        self.module = module

    def __call__(self, mode: bool = True) -> nn.Module:
        nn.Module.train(self.module, False)
        return self.module


def pin_eval(module: nn.Module) -> nn.Module:
    """Put ``module`` and all its descendants in eval mode, and keep them there.

    A parent's ``.train()`` calls each child's ``train(True)``; a pinned module
    overrides its own ``train`` (on the instance) to stay in eval mode, so the
    freeze survives the ``model.train()`` at the start of every epoch. This is
    the habit of mmdetection's backbones (``norm_eval`` re-applied in an
    overridden ``train``), done per instance so it works on any ``nn.Module``.
    Returns ``module``. Undo with :func:`unpin`. Raises ``TypeError`` if
    ``module`` is not an ``nn.Module``. Each pinned module also gets the
    attribute :data:`PIN_MARK` (``True``), which is how a pin dropped by
    TorchScript is found (:func:`pin_dropped`).

    Which transformations keep the pin (each checked by
    ``tests/test_audit_issue26.py``): the pin is an instance attribute, so it
    lives as long as the module *object* does.

    * kept: ``copy.deepcopy`` and pickling (``torch.save(model)`` /
      ``torch.load(..., weights_only=False)``), ``model.to()``/``.half()``/
      ``.cuda()``, ``torch.compile(model)`` and ``model.compile()`` (the same
      objects run), ``torch.fx.symbolic_trace`` (the GraphModule holds the same
      leaf modules; a pinned container has no leaf of its own), DataParallel's
      replicas (made for each forward by ``_replicate_for_data_parallel``, they
      copy the pinned module's eval flag), and :func:`convert_sync_batchnorm` (re-pins every layer that stayed in eval
      mode, whatever kept it there);
    * dropped: ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` (new modules;
      :class:`bnstudy.audit.FreezeAudit` lints ``pin_lost`` when it happens in its
      block), ``torch.jit.script`` (TorchScript compiles methods from the class,
      not an instance's override; the :data:`PIN_MARK` attribute survives, so
      :func:`pin_dropped`, :func:`bnstudy.audit.lint_model` and the audit report
      the dropped pin by layer name; call ``pin_eval`` again on the scripted
      module, which works in Python but is not saved), ``torch.jit.save``/
      ``torch.jit.load`` (mark kept, pin dropped, as for scripting),
      ``torch.jit.trace`` (keeps neither: nothing reports it), ``torch.export``
      (its module refuses ``train()`` altogether: it keeps the mode it was
      exported in), and ``load_state_dict`` into a new model (a pin is not state).

    A model that has to stay frozen through TorchScript should be converted
    instead: :func:`freeze_batchnorm` (or :func:`freeze_modules`) replaces each
    BatchNorm by a :class:`FrozenBatchNorm`, which scripts and computes the
    same outputs in train and eval mode.

    Everything inside ``module`` is pinned, **Dropout included**: a pinned
    backbone trains with its dropout switched off. To keep dropout (and any other
    layer) following ``.train()`` and pin only the norm layers, use
    :func:`pin_norm_eval`. Pins survive ``copy.deepcopy`` and pickling; a
    conversion that builds new modules (``torch.nn.SyncBatchNorm.
    convert_sync_batchnorm``) drops them: use :func:`convert_sync_batchnorm`,
    which re-pins, and :class:`bnstudy.audit.FreezeAudit` reports a pin lost
    during its block (``pin_lost``). ``torch.optim.swa_utils.update_bn`` resets a
    pinned BatchNorm to mean 0 / variance 1 and then, because the pin keeps it in
    eval mode, never re-estimates it (linted as ``reset_stats_pinned``); use
    :func:`bnstudy.update_bn_stats`, which estimates pinned layers too.
    """
    check_module("pin_eval", "module", module)
    for m in module.modules():
        m.train = _PinnedTrain(m)
        setattr(m, PIN_MARK, True)
    nn.Module.train(module, False)
    return module


def pin_dropped(module: nn.Module) -> bool:
    """Whether ``module`` carries :func:`pin_eval`'s mark (:data:`PIN_MARK`) but not its pin: a copy made by
    a transformation that keeps attributes and drops Python methods (``torch.jit.script``,
    ``torch.jit.save``/``load``). Such a module follows ``model.train()`` again. Raises ``TypeError`` if
    ``module`` is not an ``nn.Module``."""
    check_module("pin_dropped", "module", module)
    return getattr(module, PIN_MARK, False) is True and not is_pinned(module)


def unpin(module: nn.Module) -> nn.Module:
    """Undo :func:`pin_eval` on ``module`` and its descendants (their mode is left as is).

    Returns ``module``. Raises ``TypeError`` if ``module`` is not an ``nn.Module``."""
    check_module("unpin", "module", module)
    for m in module.modules():
        if "train" in m.__dict__:
            del m.__dict__["train"]
        if PIN_MARK in m.__dict__:
            del m.__dict__[PIN_MARK]
        elif getattr(m, PIN_MARK, False) is True:  # a TorchScript attribute cannot be deleted
            setattr(m, PIN_MARK, False)
    return module


def is_pinned(module: nn.Module) -> bool:
    """Whether :func:`pin_eval` pinned ``module``. Raises ``TypeError`` if it is not an ``nn.Module``."""
    check_module("is_pinned", "module", module)
    return "train" in module.__dict__


def shared_weight_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` that shares every parameter but owns its buffers.

    The copy's parameters *are* the original's ``nn.Parameter`` objects (an
    optimizer step or a ``requires_grad`` flag acts on both), while running
    statistics and ``num_batches_tracked`` are independent clones. This is the
    structure of domain-specific batch normalisation (Chang et al., 2019) with
    the affine parameters shared as well. Raises ``TypeError`` if ``module`` is not an ``nn.Module``.
    """
    check_module("shared_weight_copy", "module", module)
    _refuse_script_module("shared_weight_copy", "module", module)
    clone = copy.deepcopy(module)
    for m_clone, m_orig in zip(clone.modules(), module.modules()):
        for name, p in m_orig._parameters.items():
            m_clone._parameters[name] = p
    return clone


def batchnorm_layers(module: nn.Module) -> dict[str, _BatchNorm]:
    """Every BatchNorm layer (``_BatchNorm`` subclasses, SyncBatchNorm included) by qualified name."""
    check_module("batchnorm_layers", "module", module)
    return {n: m for n, m in module.named_modules() if isinstance(m, _BatchNorm)}


# ---------------------------------------------------------------------------
# FrozenBatchNorm, pinning only the norm layers, and where statistics come from
# ---------------------------------------------------------------------------


def _check_fields(bn: nn.Module, label: str, what: str) -> None:
    """Raise ``ValueError`` when ``bn`` lacks a field a torch BatchNorm has and a conversion copies: ``num_features``
    (a positive integer matching ``running_mean``), ``eps`` (a number >= 0), ``affine`` (a bool, with ``weight`` and
    ``bias`` tensors when True). Another library's norm layer may name them otherwise."""
    c, eps, affine = (getattr(bn, k, None) for k in ("num_features", "eps", "affine"))
    problems = []
    if not isinstance(c, numbers.Integral) or isinstance(c, bool) or c < 1:
        problems.append(f"num_features is {describe(c)}, not a positive integer")
    elif isinstance(getattr(bn, "running_mean", None), torch.Tensor) and bn.running_mean.numel() != c:
        problems.append(f"num_features={c} but running_mean holds {bn.running_mean.numel()} values")
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not eps >= 0 or eps == float("inf"):
        problems.append(f"eps is {describe(eps)}, not a finite number >= 0"
                        + (" (the class has no eps attribute)" if not hasattr(bn, "eps") else ""))
    if not isinstance(affine, bool):
        problems.append(f"affine is {describe(affine)}, not True or False")
    elif affine and isinstance(getattr(bn, "weight", None), torch.Tensor) and getattr(bn, "bias", 0) is None:
        raise ValueError(f"cannot {what} {type(bn).__name__} {label}: it was built with bias=False (a weight and no "
                         "bias), which this conversion does not support yet. Nothing was changed. Keep the layer and "
                         "pin it in eval mode (bnstudy.pin_norm_eval), or give it a zero bias first")
    elif affine and not (isinstance(getattr(bn, "weight", None), torch.Tensor)
                         and isinstance(getattr(bn, "bias", None), torch.Tensor)):
        problems.append("affine is True but weight and bias are not both tensors")
    if problems:
        raise ValueError(f"cannot {what} {type(bn).__name__} {label} ({type(bn).__module__}): it does not have "
                         f"torch BatchNorm's fields: {'; '.join(problems)}. Nothing was changed. Convert it with its own "
                         "library's tool, or keep it and pin it in eval mode (bnstudy.pin_norm_eval)")


def _refuse_hooks(old: nn.Module, label: str, into: str) -> None:
    """Raise ``ValueError`` when ``old`` has hooks of its own (:func:`bnstudy.norms.registered_hooks`): the layer
    built in its place would not run them, so the output or what they record would change silently."""
    hooks = registered_hooks(old)
    if hooks:
        raise ValueError(f"cannot turn {type(old).__name__} {label} into {into}: it has {', '.join(hooks)} registered "
                         "on it, which the new layer would not run (its output, or what the hooks record, would change "
                         "silently). Nothing was changed. Remove them (handle.remove()), convert, and register them "
                         "on the converted layer")


def _refuse_changed_output(old: nn.Module, new: nn.Module, label: str, into: str) -> None:
    """Raise ``ValueError`` unless ``new`` computes ``old``'s eval output bit for bit: ``old`` has no hooks of its own
    (:func:`_refuse_hooks`), and both run torch's kernel (:func:`bnstudy.norms.computes_standard_eval`) or the
    outputs are equal on probe inputs (:func:`bnstudy.norms.eval_output_difference`)."""
    _refuse_hooks(old, label, into)
    if computes_standard_eval(old) and computes_standard_eval(new):
        return
    why = eval_output_difference(old, new)
    if why is not None:
        raise ValueError(
            f"cannot turn {type(old).__name__} {label} ({type(old).__module__}) into {into} without changing what "
            f"it computes: {why}. A class with a forward of its own does more than normalise (timm's "
            "BatchNormAct2d applies its activation inside the norm layer), which the replacement would drop. "
            "Nothing was changed. Use its "
            "library's own conversion (timm: timm.layers.freeze_batch_norm_2d / convert_sync_batchnorm), or keep "
            "the layer and pin it in eval mode (bnstudy.pin_norm_eval)")


class FrozenBatchNorm(nn.Module):
    """BatchNorm with fixed statistics: ``running_mean``/``running_var`` and the affine as buffers.

    Computes what ``BatchNorm{1,2,3}d.eval()`` computes, per channel ``c``::

        y = (x - running_mean[c]) / sqrt(running_var[c] + eps) * weight[c] + bias[c]

    through the same kernel (``torch.nn.functional.batch_norm`` with
    ``training=False``), so its outputs are bit-identical to the source layer
    in eval mode, whatever the module's own train/eval flag. Because ``weight``
    and ``bias`` are buffers, no optimizer can move them and ``requires_grad``
    has nothing to act on; because the kernel never runs in training mode, no
    forward pass can move the statistics. This is torchvision's
    ``ops.FrozenBatchNorm2d`` generalised to any input rank (torchvision
    rewrites the formula as ``x * scale + shift``, which differs from
    ``BatchNorm.eval()`` by rounding).

    Input ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)`` or ``(N, C, D, H, W)`` with
    ``C == num_features``; output has the input's shape. The module scripts
    (``torch.jit.script``): a frozen model that must survive TorchScript is
    converted with :func:`freeze_batchnorm` rather than pinned. ``weight``/``bias`` are
    ``None`` when the source had ``affine=False``. ``num_batches_tracked`` is
    kept (never incremented) so that a conversion round trip is exact.
    ``source_class`` and ``momentum`` remember the source layer for
    :meth:`to_batchnorm`. Raises ``ValueError`` for an input of rank below 2 or
    with the wrong number of channels.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True,
                 momentum: float | None = 0.1, source_class: type = nn.BatchNorm2d):
        super().__init__()
        check_int("FrozenBatchNorm", "num_features", num_features)
        check_number("FrozenBatchNorm", "eps", eps, minimum=0)  # eps=0 is torch's too (BatchNorm2d(4, eps=0))
        check_bool("FrozenBatchNorm", "affine", affine)
        if momentum is not None and (not isinstance(momentum, numbers.Real) or isinstance(momentum, bool)):
            raise TypeError(f"FrozenBatchNorm: momentum must be a number or None (kept for to_batchnorm), got "
                            f"{describe(momentum)}")
        if not (isinstance(source_class, type) and issubclass(source_class, nn.Module)):
            raise TypeError(f"FrozenBatchNorm: source_class must be an nn.Module class such as nn.BatchNorm2d, got "
                            f"{describe(source_class)}")
        self.num_features, self.eps, self.affine = num_features, float(eps), bool(affine)
        self.momentum, self.source_class = momentum, source_class
        self.register_buffer("weight", torch.ones(num_features) if affine else None)
        self.register_buffer("bias", torch.zeros(num_features) if affine else None)
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    @classmethod
    def from_batchnorm(cls, bn: _BatchNorm, name: str = "") -> "FrozenBatchNorm":
        """A FrozenBatchNorm holding copies of ``bn``'s statistics and affine (same device and dtype).

        ``bn``: a layer that follows torch's BatchNorm rule (``_BatchNorm``, or a
        third-party ``_NormBase`` subclass that is not an InstanceNorm; see
        :mod:`bnstudy.norms`). What decides convertibility is what the layer
        computes in eval mode, not its ``track_running_stats`` flag: a layer
        with ``running_mean``/``running_var`` buffers normalises with them in
        eval mode, and that is what the frozen layer computes.

        The frozen layer must compute what ``bn`` computes in eval mode, bit for
        bit. That holds by construction when ``bn``'s class runs torch's own
        ``forward`` (:func:`bnstudy.norms.computes_standard_eval`); a class with a
        ``forward`` of its own (timm's ``BatchNormAct2d`` applies its activation
        there, detectron2's ``NaiveSyncBatchNorm`` calls torch's) is checked on
        probe inputs (:func:`bnstudy.norms.eval_output_difference`) and refused
        when the outputs differ.

        Raises ``ValueError`` (naming the layer as ``name``) when ``bn`` is not
        such a layer (InstanceNorm: pin it with :func:`pin_norm_eval` instead),
        has no running-statistics buffers (it normalises with batch statistics
        even in eval mode, whatever its flag says), is a lazy layer that has not
        seen an input yet, lacks a field torch's layers have (``num_features``,
        ``eps`` >= 0, ``affine``; another library's layer may name them
        otherwise), or computes something else in eval mode (an activation in
        its ``forward``): in each case before anything is built or changed.
        """
        check_module("FrozenBatchNorm.from_batchnorm", "bn", bn)
        check_str("FrozenBatchNorm.from_batchnorm", "name", name)
        try:
            return cls._build_from_batchnorm(bn, name)
        except ValueError as e:
            raise _named("FrozenBatchNorm.from_batchnorm", e) from None

    @classmethod
    def _build_from_batchnorm(cls, bn: nn.Module, name: str) -> "FrozenBatchNorm":
        """:meth:`from_batchnorm` without the argument checks, its refusals naming no function (a conversion
        names the one the user called)."""
        label = repr(name) if name else type(bn).__name__
        if not is_batch_norm(bn):
            hint = " (InstanceNorm is not converted: pin it with bnstudy.pin_norm_eval)" if isinstance(
                bn, nn.modules.batchnorm._NormBase) else ""
            raise ValueError(f"bn={label} is a {type(bn).__name__}, not a BatchNorm (_BatchNorm or _NormBase "
                             f"subclass){hint}")
        if not has_running_stats(bn):
            raise ValueError(f"BatchNorm {label} has no running_mean/running_var buffers (its track_running_stats "
                             f"flag is {getattr(bn, 'track_running_stats', None)}): there are no running statistics "
                             "to freeze, and it normalises with batch statistics even in eval mode")
        lazy = [t for t in (getattr(bn, "weight", None), bn.running_mean) if t is not None and nn.parameter.is_lazy(t)]
        if lazy:
            raise ValueError(f"BatchNorm {label} is lazy and uninitialised; run one forward pass before freezing it")
        _check_fields(bn, label, "freeze")
        frozen = cls(bn.num_features, bn.eps, bn.affine, getattr(bn, "momentum", None), type(bn))
        if bn.affine:
            frozen.weight = bn.weight.detach().clone()
            frozen.bias = bn.bias.detach().clone()
        frozen.running_mean = bn.running_mean.detach().clone()
        frozen.running_var = bn.running_var.detach().clone()
        if isinstance(getattr(bn, "num_batches_tracked", None), torch.Tensor):
            frozen.num_batches_tracked = bn.num_batches_tracked.detach().clone()
        if hasattr(bn, PRECISE_MARK):  # statistics from update_bn_stats stay known as an estimate
            setattr(frozen, PRECISE_MARK, getattr(bn, PRECISE_MARK))
        frozen.train(bn.training)
        _refuse_changed_output(bn, frozen, label, "a FrozenBatchNorm")
        return frozen

    def to_batchnorm(self) -> _BatchNorm:
        """The inverse conversion: a ``source_class`` layer with this layer's statistics and affine.

        The affine comes back as ``nn.Parameter`` with ``requires_grad=True``
        (BatchNorm's default; freeze it again if you need to). The new layer's
        train/eval flag copies this module's. Raises ``ValueError`` when
        ``source_class`` cannot be built as ``source_class(num_features, eps=,
        momentum=, affine=)`` (a subclass with another constructor), or when the
        rebuilt layer would compute something else in eval mode than this one (a
        ``source_class`` with a ``forward`` of its own, checked as
        :meth:`from_batchnorm` checks), before anything is changed.
        """
        try:
            return self._build_batchnorm()
        except ValueError as e:
            raise _named("FrozenBatchNorm.to_batchnorm", e) from None

    def _build_batchnorm(self) -> _BatchNorm:
        try:
            bn = self.source_class(self.num_features, eps=self.eps, momentum=self.momentum, affine=self.affine)
        except (TypeError, ValueError) as e:
            raise ValueError(f"cannot rebuild {self.source_class.__name__}(num_features, eps=, momentum=, affine=): "
                             f"{e}") from None
        if self.affine:
            bn.weight = nn.Parameter(self.weight.detach().clone())
            bn.bias = nn.Parameter(self.bias.detach().clone())
        bn.running_mean = self.running_mean.detach().clone()
        bn.running_var = self.running_var.detach().clone()
        bn.num_batches_tracked = self.num_batches_tracked.detach().clone()
        if hasattr(self, PRECISE_MARK):
            setattr(bn, PRECISE_MARK, getattr(self, PRECISE_MARK))
        bn.train(self.training)
        _refuse_changed_output(self, bn, f"({self.source_class.__name__} source)", f"a {self.source_class.__name__}")
        return bn

    @torch.jit.unused
    def _check_input(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"FrozenBatchNorm: x must be a tensor (N, {self.num_features}, ...), got {describe(x)}")
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(f"FrozenBatchNorm({self.num_features}) expects input (N, {self.num_features}, ...), "
                             f"got {tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Scriptable (torch.jit.script): the Python-only check with its detailed message is skipped there.
        if not torch.jit.is_scripting():
            self._check_input(x)
        elif x.dim() < 2 or x.size(1) != self.num_features:
            raise ValueError("FrozenBatchNorm expects input (N, num_features, ...)")
        return torch.nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                              False, 0.0, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, affine={self.affine}, "
                f"source={self.source_class.__name__}")


STANDARD_EVAL_FORWARDS.add(FrozenBatchNorm.forward)  # F.batch_norm(training=False) on its buffers: torch's eval kernel


def freeze_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm in ``module`` by a :class:`FrozenBatchNorm`; returns the converted module.

    Recursive and in place, like timm's ``freeze_batch_norm_2d``: children are
    swapped inside their parents; if ``module`` itself is a BatchNorm the
    returned object is its replacement, so always use the return value. Covers
    BatchNorm1d/2d/3d, SyncBatchNorm, the (initialised) lazy variants, any
    ``_BatchNorm`` subclass and third-party ``_NormBase`` subclasses that are not
    InstanceNorm; a layer reached twice (shared) becomes one shared
    FrozenBatchNorm. InstanceNorm with ``track_running_stats=True`` is *not*
    converted (its train-mode output is per-sample, not a BatchNorm's): pin it
    with :func:`pin_norm_eval`, or use :func:`freeze_modules`, which does both. The converted
    model computes what the original computes in eval mode, bit for bit, and
    stays that way through ``.train()``: for torch's own layers by construction,
    and for a subclass with a ``forward`` of its own (timm's ``BatchNormAct2d``,
    whose activation sits inside the norm layer) by a check on probe inputs
    (:meth:`FrozenBatchNorm.from_batchnorm`); a layer that fails it, or that lacks
    torch's fields (another library's layer without ``eps``), is refused, and
    since every replacement is built before the first swap, the model is then
    untouched (``eps=0`` is carried as it is). An :class:`UnfrozenBatchNorm2d` (a layer
    :func:`unfreeze_batchnorm` made from another library's FrozenBatchNorm2d) goes
    back to that library's class, so the round trip is exact too. Undo with
    :func:`unfreeze_batchnorm`.
    Raises ``ValueError`` naming the first layer with
    ``track_running_stats=False``, an uninitialised lazy layer, or a layer the
    frozen layer would not compute bit for bit (as above), before changing
    anything; ``TypeError`` if ``module`` is not an
    ``nn.Module`` or is a TorchScript module (convert before scripting).
    """
    check_module("freeze_batchnorm", "module", module)
    refuse_adapted("freeze_batchnorm", "module", module)
    _refuse_script_module("freeze_batchnorm", "module", module)
    return _named_convert("freeze_batchnorm", module, _to_frozen)


def unfreeze_batchnorm(module: nn.Module) -> nn.Module:
    """Inverse of :func:`freeze_batchnorm`: every frozen BatchNorm back to a trainable BatchNorm.

    Recursive and in place; returns the converted module (the replacement if
    ``module`` itself is frozen). A :class:`FrozenBatchNorm` goes back to its
    source class (:meth:`FrozenBatchNorm.to_batchnorm`). Another library's
    ``FrozenBatchNorm2d`` (torchvision's ``ops.FrozenBatchNorm2d``, detectron2's,
    timm's; recognized by :func:`bnstudy.norms.is_frozen_batchnorm`) becomes an
    :class:`UnfrozenBatchNorm2d` with its statistics and affine, whose eval-mode
    outputs equal the frozen layer's bit for bit (timm's ``unfreeze_batch_norm_2d``
    converts it to a plain BatchNorm2d, whose eval outputs differ from
    torchvision's formula by rounding). The affine parameters come back with
    ``requires_grad=True``; the train/eval flag is the frozen layer's. Raises
    ``ValueError`` as :meth:`FrozenBatchNorm.to_batchnorm` does, or naming a
    frozen layer of another library whose class this package cannot rebuild
    (``FrozenBatchNormAct2d``: use its library's own conversion), before
    anything is converted; ``TypeError`` if ``module`` is not an ``nn.Module`` or
    is a TorchScript module.
    """
    check_module("unfreeze_batchnorm", "module", module)
    refuse_adapted("unfreeze_batchnorm", "module", module)
    _refuse_script_module("unfreeze_batchnorm", "module", module)
    _check_unfreezable(module, "unfreeze_batchnorm")
    return _named_convert("unfreeze_batchnorm", module, _from_frozen)


#: Class names of other libraries' frozen BatchNorm layers that :func:`unfreeze_batchnorm` rebuilds.
_FOREIGN_FROZEN = re.compile(r"FrozenBatchNorm([123]d)?")


class _UnfrozenMixin:
    """Eval mode through the forward of the frozen class the layer was made from (see UnfrozenBatchNorm2d)."""

    frozen_class: type | None = None

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None):
        fn = type(self).__name__
        check_int(fn, "num_features", num_features)
        check_number(fn, "eps", eps, minimum=0, strict_minimum=True)
        check_number(fn, "momentum", momentum, minimum=0, maximum=1, allow_none=True)
        check_bool(fn, "affine", affine)
        check_bool(fn, "track_running_stats", track_running_stats)
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or self.frozen_class is None:
            return super().forward(x)
        return self.frozen_class.forward(self, x)

    @classmethod
    def from_frozen(cls, frozen: nn.Module, name: str = "") -> nn.Module:
        """A trainable layer holding copies of ``frozen``'s statistics and affine (same device and dtype).

        ``frozen``: another library's FrozenBatchNorm (:func:`bnstudy.norms.is_frozen_batchnorm`) with 1-D
        ``running_mean``/``running_var`` (and ``weight``/``bias``) buffers of one length and an ``eps``.
        ``num_batches_tracked`` is copied when the source has one, else 0 (torchvision's has none).
        Raises ``TypeError`` if ``frozen`` is not an ``nn.Module`` or ``name`` not a string, ``ValueError``
        if ``frozen`` is not a frozen BatchNorm or its buffers differ in length (naming the layer ``name``)."""
        fn = f"{cls.__name__}.from_frozen"
        check_module(fn, "frozen", frozen)
        check_str(fn, "name", name)
        try:
            return cls._build_from_frozen(frozen, name)
        except ValueError as e:
            raise _named(fn, e) from None

    @classmethod
    def _build_from_frozen(cls, frozen: nn.Module, name: str) -> nn.Module:
        label = repr(name) if name else type(frozen).__name__
        if not is_frozen_batchnorm(frozen):
            raise ValueError(f"frozen={label} is a {type(frozen).__name__}, not a frozen BatchNorm (a class "
                             "named FrozenBatchNorm* with running_mean/running_var buffers and an eps)")
        rm, rv = frozen.running_mean, frozen.running_var
        w, b = getattr(frozen, "weight", None), getattr(frozen, "bias", None)
        c = rm.numel()
        if rm.dim() != 1 or rv.shape != rm.shape or (w is not None and w.shape != rm.shape) or (
                b is not None and b.shape != rm.shape):
            raise ValueError(f"cannot unfreeze {type(frozen).__name__} {label}: its running_mean, running_var, "
                             "weight and bias must be 1-D buffers of one length")
        bn = cls(c, eps=float(frozen.eps), affine=w is not None)
        # this package's FrozenBatchNorm computes BatchNorm's own eval kernel (and its forward needs its own methods)
        bn.frozen_class = None if isinstance(frozen, FrozenBatchNorm) else type(frozen)
        bn = bn.to(device=rm.device, dtype=rm.dtype)
        with torch.no_grad():
            if w is not None:
                bn.weight.copy_(w)
                bn.bias.copy_(b if b is not None else torch.zeros_like(w))
            bn.running_mean.copy_(rm)
            bn.running_var.copy_(rv)
            nbt = getattr(frozen, "num_batches_tracked", None)
            if isinstance(nbt, torch.Tensor):
                bn.num_batches_tracked.copy_(nbt)
        bn.train(frozen.training)
        _refuse_changed_output(frozen, bn, label, f"an {cls.__name__}")
        return bn

    def to_frozen(self) -> nn.Module:
        """The layer as an instance of ``frozen_class`` again (its statistics and affine copied); our own
        :class:`FrozenBatchNorm` if that class cannot be built as ``frozen_class(num_features, eps=eps)``.
        Raises ``ValueError`` when the result would not compute this layer's eval output bit for bit."""
        try:
            return self._build_frozen()
        except ValueError as e:
            raise _named(f"{type(self).__name__}.to_frozen", e) from None

    def _build_frozen(self) -> nn.Module:
        try:
            out = self.frozen_class(self.num_features, eps=self.eps)
        except (TypeError, ValueError):
            return FrozenBatchNorm._build_from_batchnorm(self, "")
        out = out.to(device=self.running_mean.device, dtype=self.running_mean.dtype)
        with torch.no_grad():
            for n in ("weight", "bias", "running_mean", "running_var"):
                t = getattr(out, n, None)
                if isinstance(t, torch.Tensor) and getattr(self, n) is not None:
                    t.copy_(getattr(self, n))
            nbt = getattr(out, "num_batches_tracked", None)
            if isinstance(nbt, torch.Tensor):
                nbt.copy_(self.num_batches_tracked)
        out.train(self.training)
        _refuse_changed_output(self, out, type(self).__name__, f"a {self.frozen_class.__name__}")
        return out


class UnfrozenBatchNorm2d(_UnfrozenMixin, nn.BatchNorm2d):
    """A BatchNorm2d made by :func:`unfreeze_batchnorm` / :func:`unfreeze_modules` from another library's
    ``FrozenBatchNorm2d`` (torchvision, detectron2, timm).

    Train mode is ``nn.BatchNorm2d``'s (batch statistics; running statistics
    updated with ``momentum`` 0.1; trainable affine): the layer fine-tunes as a
    BatchNorm does. Eval mode runs the forward of ``frozen_class``, the class it
    was made from, on this layer's own tensors, so right after the conversion
    (and as long as nothing changed) its eval outputs equal the frozen layer's bit
    for bit. That matters because those classes do not compute BatchNorm2d's
    eval-mode kernel: torchvision's and timm's ``FrozenBatchNorm2d`` compute
    ``x * scale + shift`` with ``scale = weight * rsqrt(running_var + eps)`` and
    ``shift = bias - running_mean * scale`` (their source), which differs from
    ``BatchNorm2d.eval()`` by rounding (about 1e-6 of the output), and
    detectron2's uses that formula when the input requires grad and
    ``F.batch_norm`` otherwise. Input ``(N, C, H, W)``; output the same shape.
    :func:`freeze_batchnorm` turns it back into ``frozen_class``
    (:meth:`to_frozen`). Not scriptable (TorchScript cannot call another class's
    forward): freeze it again, or copy its state into an ``nn.BatchNorm2d``,
    before scripting.
    """


class UnfrozenBatchNorm1d(_UnfrozenMixin, nn.BatchNorm1d):
    """:class:`UnfrozenBatchNorm2d` for a frozen class named ``FrozenBatchNorm1d``; input ``(N, C)`` or ``(N, C, L)``."""


class UnfrozenBatchNorm3d(_UnfrozenMixin, nn.BatchNorm3d):
    """:class:`UnfrozenBatchNorm2d` for a frozen class named ``FrozenBatchNorm3d``; input ``(N, C, D, H, W)``."""


_UNFROZEN = {"1d": UnfrozenBatchNorm1d, "2d": UnfrozenBatchNorm2d, "3d": UnfrozenBatchNorm3d, None: UnfrozenBatchNorm2d}


def _foreign_frozen(m: nn.Module) -> bool:
    return is_frozen_batchnorm(m) and not isinstance(m, FrozenBatchNorm)


def _check_unfreezable(module: nn.Module, fn: str, prefix: str = "") -> None:
    for n, m in module.named_modules():
        if _foreign_frozen(m) and not _FOREIGN_FROZEN.fullmatch(type(m).__name__):
            name = f"{prefix}.{n}" if prefix and n else (n or prefix)
            raise ValueError(f"{fn}: {type(m).__name__} {name!r} ({type(m).__module__}) is a frozen BatchNorm "
                             "whose forward this package does not rebuild (it is not a FrozenBatchNorm, "
                             "FrozenBatchNorm1d/2d/3d); convert it with its own library (timm: "
                             "timm.layers.unfreeze_batch_norm_2d), then call this again")


def _to_frozen(m: nn.Module, name: str):
    if isinstance(m, _UnfrozenMixin) and m.frozen_class is not None:
        return m._build_frozen()
    return FrozenBatchNorm._build_from_batchnorm(m, name) if is_batch_norm(m) else None


def _from_frozen(m: nn.Module, name: str):
    if isinstance(m, FrozenBatchNorm):
        return m._build_batchnorm()
    if _foreign_frozen(m):
        return _UNFROZEN[_FOREIGN_FROZEN.fullmatch(type(m).__name__).group(1)]._build_from_frozen(m, name)
    return None


def _named_convert(fn: str, module: nn.Module, make) -> nn.Module:
    """:func:`_convert` from the top of ``module``, a refusal's ``ValueError`` prefixed with the public function
    ``fn`` the user called (the model is untouched when it raises)."""
    try:
        return _convert(module, "", {}, make)
    except ValueError as e:
        raise _named(fn, e) from None


def _convert(module: nn.Module, name: str, memo: dict, make) -> nn.Module:
    """Replace, recursively and in place, every module for which ``make(module, name)`` returns a new one; returns
    ``module`` or its replacement. Every replacement is built first and only then swapped in, so when ``make``
    raises (a layer it refuses) the model is untouched."""
    plan: list = []
    out = _plan(module, name, memo, make, plan)
    _apply(plan)
    return out


def _apply(plan: list) -> None:
    for parent, child_name, new in plan:
        setattr(parent, child_name, new)


def _plan(module: nn.Module, name: str, memo: dict, make, plan: list) -> nn.Module:
    """:func:`_convert` without the swaps: append ``(parent, child_name, replacement)`` to ``plan``."""
    if id(module) in memo:
        return memo[id(module)]
    new = make(module, name)
    if new is not None:
        memo[id(module)] = new
        return new
    memo[id(module)] = module
    for child_name, child in list(module._modules.items()):  # not named_children(): it skips a repeated child
        if child is None:
            continue
        converted = _plan(child, f"{name}.{child_name}" if name else child_name, memo, make, plan)
        if converted is not child:
            plan.append((module, child_name, converted))
    return module


def pin_norm_eval(module: nn.Module) -> list[str]:
    """Pin every BatchNorm and InstanceNorm layer inside ``module`` in eval mode; returns their names.

    Each norm layer gets :func:`pin_eval`, so a parent's ``.train()`` leaves it
    normalising with its running statistics and never updating them, while the
    other layers (dropout included) follow the parent's mode as usual. This is
    mmdetection's ``norm_eval=True`` for any ``nn.Module``. Layers with
    ``track_running_stats=False`` are pinned too, but they normalise with batch
    statistics even in eval mode (see :func:`batch_stats_report`). It works on a
    TorchScript module too (its norm layers are found by their source class),
    in Python only: ``torch.jit.save`` does not keep it.

    It pins the *mode* only: the affine ``weight``/``bias`` keep their
    ``requires_grad`` and stay trainable (turn them off with
    ``requires_grad_(False)`` if they must not move). That is the fix for
    fastai's and PyTorch Lightning's ``train_bn=True`` in a frozen backbone
    when only the affine should train (lint ``train_bn_drift``).

    Porting from Keras: ``layer.trainable = False`` on a Keras BatchNormalization
    both stops its weights and puts it in inference mode. PyTorch splits the two:
    ``requires_grad_(False)`` stops the weights only (the layer still normalises
    with batch statistics and overwrites its buffers after ``model.train()``);
    this function (or :func:`pin_eval`, :func:`freeze_batchnorm`,
    :func:`freeze_modules`) supplies the inference mode.

    Raises ``TypeError`` if ``module`` is not an ``nn.Module``.
    """
    check_module("pin_norm_eval", "module", module)
    names = []
    for name, m in module.named_modules():
        if is_norm_base(m):
            pin_eval(m)
            names.append(name)
    return names


def batch_stats_report(model: nn.Module):
    """Per normalisation layer: does it use batch statistics now, after ``model.train()``, after ``model.eval()``?

    Returns a pandas DataFrame with one row per normalisation layer (see
    :func:`statistics_source`; stateless norms are listed with ``"per-sample"``)
    and columns ``layer`` (qualified name), ``type``, ``pinned``
    (:func:`pin_eval`), ``training`` (current flag), ``stats_now``,
    ``stats_after_train``, ``stats_after_eval`` (``batch``/``running``/
    ``per-sample``), ``batch_stats_after_train``, ``batch_stats_after_eval``
    (bool) and ``updates_running_stats_after_train``.

    "After train/eval" is measured, not guessed: the function calls
    ``model.train()`` and ``model.eval()`` (so overrides such as :func:`pin_eval`
    or mmdetection-style ``train`` methods take effect), reads every flag, and
    restores every module's flag exactly as it found it. Works on TorchScript
    models (layers judged by the class they were compiled from). Raises
    ``TypeError`` if ``model`` is not an ``nn.Module``, or when its ``train()``
    is not supported (the module of a ``torch.export`` program), saying to
    measure the model before exporting it.
    """
    from ._checks import require_pandas

    check_module("batch_stats_report", "model", model)
    return require_pandas().DataFrame(batch_stats_rows(model), columns=BATCH_STATS_COLUMNS)


#: The columns of :func:`batch_stats_report` (and the keys of each :func:`batch_stats_rows` dict).
BATCH_STATS_COLUMNS = ["layer", "type", "pinned", "training", "stats_now", "stats_after_train", "stats_after_eval",
                       "batch_stats_after_train", "batch_stats_after_eval", "updates_running_stats_after_train"]


def batch_stats_rows(model: nn.Module) -> list[dict]:
    """:func:`batch_stats_report`'s rows as plain dicts (no pandas needed), one per normalisation layer.

    Raises as :func:`batch_stats_report` does."""
    check_module("batch_stats_rows", "model", model)
    modules = list(model.modules())
    saved = [m.training for m in modules]
    try:
        _call_train(model, True, "batch_stats_report")
        after_train = {id(m): m.training for m in modules}
        _call_train(model, False, "batch_stats_report")
        after_eval = {id(m): m.training for m in modules}
    finally:
        for m, flag in zip(modules, saved):
            m.training = flag
    rows = []
    for name, m in model.named_modules():
        if statistics_source(m) is None:
            continue
        s_train = statistics_source(m, after_train[id(m)])
        s_eval = statistics_source(m, after_eval[id(m)])
        rows.append(dict(layer=name, type=type(m).__name__, pinned=is_pinned(m), training=m.training,
                         stats_now=statistics_source(m), stats_after_train=s_train, stats_after_eval=s_eval,
                         batch_stats_after_train=s_train == "batch", batch_stats_after_eval=s_eval == "batch",
                         updates_running_stats_after_train=updates_running_stats(m, after_train[id(m)])))
    return rows


# ---------------------------------------------------------------------------
# Freezing named submodules in one call (timm's call shape), and undoing it exactly
# ---------------------------------------------------------------------------

_FREEZE_STATE = "_bnstudy_freeze_state"


def _resolve(model: nn.Module, names, whole_model, fn: str) -> list[str]:
    """The qualified names a freeze/unfreeze call acts on. Names are required: a forgotten argument must not
    mean "everything" (timm's ``freeze(model)`` freezes the whole model, head included, without a word)."""
    check_module(fn, "model", model)
    _refuse_script_module(fn, "model", model)
    check_bool(fn, "whole_model", whole_model)
    if whole_model:
        if names is not None:
            raise ValueError(f"{fn}: give names or whole_model=True, not both (got names={describe(names)})")
        return [""]
    if names is None:
        raise TypeError(f"{fn}: names is required: the qualified names of the submodules (e.g. ['backbone'] or "
                        f"{[k for k, _ in model.named_modules() if k][:3]}); to act on the whole model, head "
                        f"included, say so: {fn}(model, whole_model=True)")
    return module_names(fn, "names", model, names)


def _through_compiled(model: nn.Module, names):
    """``(model, names)`` seen through ``torch.compile``'s wrapper: the module it wraps (:func:`compiled_original`),
    and ``names`` as that module's: a name of the wrapper (``"_orig_mod.backbone"``) loses its prefix, the wrapper
    itself is the root. The uncompiled model's names (``"backbone"``) pass as they are. Anything else is left for
    :func:`_resolve` to judge."""
    inner = compiled_original(model)
    if inner is model:
        return model, names

    def own(n):
        if n is model or (isinstance(n, nn.Module) and compiled_original(n) is inner):
            return ""
        while isinstance(n, str) and (n == "_orig_mod" or n.startswith("_orig_mod.")):
            n = n[len("_orig_mod."):]
        return n
    if isinstance(names, (str, nn.Module)):
        return inner, own(names)
    if isinstance(names, (list, tuple)):
        return inner, [own(n) for n in names]
    return inner, names


def _check_not_shared_outside(model: nn.Module, names: list[str], fn: str, affected) -> None:
    """Raise ``ValueError`` when a layer that ``fn`` would replace or pin inside the named submodules is also
    reachable under a name outside them: replacing it at some of its names would split one layer into two."""
    def inside(n: str) -> bool:
        return any(p == "" or n == p or n.startswith(p + ".") for p in names)

    where: dict = {}
    for n, m in model.named_modules(remove_duplicate=False):
        where.setdefault(id(m), (m, []))[1].append(n)
    for m, found in where.values():
        ins, outs = [n for n in found if inside(n)], [n for n in found if not inside(n)]
        if ins and outs and affected(m):
            raise ValueError(
                f"{fn}: {type(m).__name__} {ins[0]!r} is shared: it is also reachable as "
                f"{', '.join(map(repr, outs))}, outside the named submodules {names}; {fn} would "
                f"replace it at "
                f"{', '.join(map(repr, ins))} only and split one layer in two. Name every place it is used "
                f"({fn}(model, {names + outs})) to act on it as one shared layer, or give the other module its own "
                "copy (copy.deepcopy) first")


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, new)


def freeze_modules(model: nn.Module, names: str | nn.Module | list | None = None, *,
                   whole_model: bool = False) -> nn.Module:
    """Freeze the named submodules of ``model`` in one call, the way timm's ``freeze(model, ['layer1', 'layer2.0'])``
    does; returns ``model`` (changed in place).

    ``names``: qualified names of submodules (or the submodule objects), one or
    a list; **required**, and an empty list raises ``ValueError`` (it would
    freeze nothing). To freeze the whole model pass ``whole_model=True``
    (timm's ``freeze(model)`` does that when the list is forgotten; here a
    forgotten argument raises ``TypeError`` instead of making every parameter,
    head included, untrainable). ``""`` or ``model`` itself also names the root.

    For each named submodule: every parameter gets ``requires_grad=False``; every BatchNorm inside
    becomes a :class:`FrozenBatchNorm` (:func:`freeze_batchnorm`; a BatchNorm
    without running-statistics buffers raises ``ValueError``, as there is
    nothing to freeze); every InstanceNorm that keeps running statistics, which
    cannot be converted, is pinned in eval mode (:func:`pin_eval`). A single norm
    layer can be named from the root (``freeze_modules(model, ['layer1.0.bn1'])``)
    or from its parent (``freeze_modules(model.layer1[0], ['bn1'])``); it is
    replaced inside its parent. The root itself cannot be a norm layer (there is
    no parent to put the replacement in): raises ``ValueError``. The previous
    ``requires_grad`` flags and pins are remembered on ``model`` so that
    :func:`unfreeze_modules` with the same names undoes the call exactly.

    Shared layers: a layer reachable under several names is one layer. When
    all its names are inside the named submodules it becomes one shared
    FrozenBatchNorm (names given in one call share one conversion). When a norm
    layer that would be replaced or pinned is also reachable *outside* them (a
    BatchNorm shared by ``backbone`` and ``head``), the call raises
    ``ValueError`` before changing anything, naming the layer and its names on
    both sides: replacing it under one name would split it into a frozen copy
    and a copy that keeps training (:func:`unfreeze_modules` likewise for a
    shared FrozenBatchNorm). What acts on the object itself reaches every name,
    as sharing means: a shared parameter (tied weights) gets
    ``requires_grad=False`` everywhere, a shared InstanceNorm is pinned everywhere.
    Raises ``ValueError`` naming an unknown name, a shared layer as above, or a
    BatchNorm :func:`freeze_batchnorm` refuses (a ``forward`` of its own that
    the frozen layer would not compute, fields torch's layers have missing),
    before changing anything (flags, pins and layers are changed only once
    every replacement is built); ``TypeError`` for a missing ``names``,
    arguments of the wrong type, or a TorchScript model (freeze before scripting).

    A ``torch.compile`` wrapper (``OptimizedModule``) is frozen through the module it wraps, the names being that
    module's (``"backbone"``, those of the uncompiled model) or the wrapper's (``"_orig_mod.backbone"``); the
    wrapper is returned, and :func:`unfreeze_modules` takes either the wrapper or the module with the same names.
    """
    check_module("freeze_modules", "model", model)
    refuse_adapted("freeze_modules", "model", model)
    wrapper, (model, names) = model, _through_compiled(model, names)
    names = _resolve(model, names, whole_model, "freeze_modules")
    if "" in names and (is_batch_norm(model) or isinstance(model, nn.modules.batchnorm._NormBase)):
        raise ValueError(f"freeze_modules: the root is a {type(model).__name__}; name it from its parent "
                         "(freeze_modules(parent, ['bn'])) or use freeze_batchnorm(layer) and keep the return value")
    _check_not_shared_outside(model, names, "freeze_modules", is_batch_norm)
    again = [n for n in names if n in model.__dict__.get(_FREEZE_STATE, {})]
    if again:  # a second record would replace the first, and unfreeze_modules would undo only the second call
        raise ValueError(f"freeze_modules: {again} already frozen by an earlier freeze_modules call on this model; "
                         f"nothing was changed (call unfreeze_modules(model, {again}) first to freeze again)")
    # every name's flags before any change: a layer shared by two named submodules is frozen by the first
    records = {name: dict(requires_grad={n: p.requires_grad for n, p in model.get_submodule(name).named_parameters()},
                          pinned=[]) for name in names}
    memo: dict = {}  # one conversion for the whole call: a layer shared by two named submodules stays shared
    # every replacement is built (and checked) before anything changes: a refused layer leaves the model untouched
    plans = {}
    for name in names:
        sub, plan = model.get_submodule(name), []
        try:
            plans[name] = (sub, _plan(sub, name, memo, _to_frozen, plan), plan)
        except ValueError as e:  # a layer the conversion refuses: nothing was changed yet
            raise _named("freeze_modules", e) from None
    state = model.__dict__.setdefault(_FREEZE_STATE, {})
    for name in names:
        sub, new, plan = plans[name]
        record = records[name]
        sub.requires_grad_(False)
        _apply(plan)
        if new is not sub:
            _swap(model, name, new)
        else:
            for n, m in sub.named_modules():
                if keeps_running_stats(m) and not is_pinned(m):
                    record["pinned"].append((n, m.training))
                    pin_eval(m)
        state[name] = record
    return wrapper


def unfreeze_modules(model: nn.Module, names: str | nn.Module | list | None = None, *,
                     whole_model: bool = False) -> nn.Module:
    """Undo :func:`freeze_modules` for the named submodules; returns ``model`` (changed in place).

    Each :class:`FrozenBatchNorm` inside goes back to its source class, and
    another library's ``FrozenBatchNorm2d`` (torchvision, detectron2, timm)
    becomes an :class:`UnfrozenBatchNorm2d` whose eval outputs equal it bit for
    bit (:func:`unfreeze_batchnorm`; same statistics, same train/eval flag), the
    InstanceNorm layers ``freeze_modules`` pinned are unpinned with their flag
    restored, and every parameter gets back the ``requires_grad`` it had before
    the freeze; for a name that ``freeze_modules`` did not freeze on this
    ``model`` (timm's ``unfreeze`` on a model frozen otherwise), parameters get
    ``requires_grad=True``. ``names`` and ``whole_model`` as in
    :func:`freeze_modules` (names required, an empty list is an error); names
    given in one call share one conversion, so a FrozenBatchNorm shared by two
    of them comes back as one shared BatchNorm. Raises ``ValueError`` naming an
    unknown name, a frozen layer it cannot rebuild (see :func:`unfreeze_batchnorm`),
    or a frozen BatchNorm inside the named submodules that is also reachable
    outside them (naming both sides, as :func:`freeze_modules` does), before
    changing anything; ``TypeError`` for a TorchScript model. A ``torch.compile`` wrapper is unfrozen through the
    module it wraps, with that module's names or the wrapper's, as in :func:`freeze_modules`; returns the wrapper.
    """
    check_module("unfreeze_modules", "model", model)
    refuse_adapted("unfreeze_modules", "model", model)
    wrapper, (model, names) = model, _through_compiled(model, names)
    names = _resolve(model, names, whole_model, "unfreeze_modules")
    if "" in names and is_frozen_batchnorm(model):
        raise ValueError(f"unfreeze_modules: the root is a {type(model).__name__}; name it from its parent")
    _check_not_shared_outside(model, names, "unfreeze_modules", is_frozen_batchnorm)
    for name in names:
        _check_unfreezable(model.get_submodule(name), "unfreeze_modules", name)
    state = model.__dict__.get(_FREEZE_STATE, {})
    memo: dict = {}
    plans = {}
    for name in names:  # built (and checked) before anything changes
        sub, plan = model.get_submodule(name), []
        try:
            plans[name] = (sub, _plan(sub, name, memo, _from_frozen, plan), plan)
        except ValueError as e:
            raise _named("unfreeze_modules", e) from None
    for name in names:
        old, sub, plan = plans[name]
        record = state.pop(name, None)
        _apply(plan)
        if sub is not old:
            _swap(model, name, sub)
        if record is None:
            sub.requires_grad_(True)
            continue
        for n, flag in record["pinned"]:
            m = sub.get_submodule(n)
            unpin(m)
            m.training = flag
        params = dict(sub.named_parameters())
        for n, flag in record["requires_grad"].items():
            if n in params:
                params[n].requires_grad_(flag)
    return wrapper


def eval_after_train(module: nn.Module) -> set[str]:
    """Qualified names (every name of a shared module: ``named_modules(remove_duplicate=False)``) of the
    modules of ``module`` that are in eval mode right after ``module.train()``: the modules *pinned*, by
    whatever means: :func:`pin_eval`, a class whose ``train`` ignores its argument (a BatchNorm subclass
    that stays in eval), or a parent whose ``train`` puts them back in eval (mmdetection's ``norm_eval``).

    Measured, as :func:`batch_stats_report` measures: calls ``module.train()``, reads every flag and
    restores every module's flag exactly. Raises ``TypeError`` if ``module`` is not an ``nn.Module`` or
    refuses ``train()`` (a ``torch.export`` program's module)."""
    check_module("eval_after_train", "module", module)
    modules = list(module.modules())
    saved = [m.training for m in modules]
    try:
        _call_train(module, True, "eval_after_train")
        return {n for n, m in module.named_modules(remove_duplicate=False) if not m.training}
    finally:
        for m, flag in zip(modules, saved):
            m.training = flag


def _refuse_fixed_mode(fn: str, module: nn.Module) -> None:
    """Raise ``TypeError`` at once when ``module.train()`` is not supported (the module of a ``torch.export``
    program), saying what to do; every flag is left as it was."""
    modules = list(module.modules())
    saved = [m.training for m in modules]
    try:
        _call_train(module, True, fn)
    finally:
        for m, flag in zip(modules, saved):
            m.training = flag


def _call_train(module: nn.Module, mode: bool, fn: str) -> None:
    """``module.train(mode)``, with a ``TypeError`` saying what to do when the module refuses it (the module of a
    ``torch.export`` program keeps the mode it was exported in)."""
    try:
        module.train(mode)
    except NotImplementedError as e:
        raise TypeError(f"{fn}: {type(module).__name__}.train() is not supported ({e}): a module made by "
                        "torch.export (ExportedProgram.module()) keeps the train/eval mode it was exported in and "
                        "holds no norm layer objects to read; lint and audit the model before exporting it") from None


def _check_sync_convertible(module: nn.Module, process_group) -> None:
    """:func:`convert_sync_batchnorm`'s refusals, before anything changes: every ``_BatchNorm`` (what torch converts)
    with hooks, or with a ``forward`` of its own that the SyncBatchNorm would not compute."""
    for n, m in module.named_modules():
        if isinstance(m, _BatchNorm):
            _refuse_hooks(m, repr(n) if n else type(m).__name__, "a SyncBatchNorm")
        if isinstance(m, _BatchNorm) and not computes_standard_eval(m):
            label = repr(n) if n else type(m).__name__
            _check_fields(m, label, "convert to SyncBatchNorm")
            try:
                sync = nn.SyncBatchNorm.convert_sync_batchnorm(_hookless_copy(m), process_group)
            except Exception as e:  # noqa: BLE001 - torch's conversion failed on a copy: say so, change nothing
                raise ValueError(f"convert_sync_batchnorm: torch's conversion fails on {type(m).__name__} {label} "
                                 f"({type(e).__name__}: {e}); nothing was changed") from e
            _refuse_changed_output(m, sync, label, "a SyncBatchNorm")


def convert_sync_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` that keeps every pin, whatever its kind.

    torch's conversion builds a new plain ``SyncBatchNorm`` for every
    ``_BatchNorm`` and copies the train/eval flag, but not what kept the layer in
    eval mode: an instance-level ``train`` override (:func:`pin_eval`,
    :func:`pin_norm_eval`) or a class-level one (a BatchNorm subclass whose
    ``train`` ignores its argument), so the layer silently comes back unpinned
    and the next ``model.train()`` puts it in train mode. This wrapper measures
    which modules stay in eval mode after ``module.train()``
    (:func:`eval_after_train`) before and after the conversion, and pins
    (:func:`pin_eval`) every converted layer, under *every* name it had
    (``named_modules(remove_duplicate=False)``), that was pinned by
    :func:`pin_eval`, or stayed in eval before and would not now. Pins torch keeps need nothing: a parent's own ``train``
    override (mmdetection's ``norm_eval``) still acts on the new children, and
    layers torch does not convert (InstanceNorm, :class:`FrozenBatchNorm`,
    torchvision's ``FrozenBatchNorm2d``, Dropout) are the same objects.

    Sharing is not preserved, as in torch's conversion: a BatchNorm reachable
    under several names (shared by two blocks, held in a ``ModuleList`` or
    ``ModuleDict``, nested) becomes one SyncBatchNorm per parent that holds it.
    The copies still share the parameter and buffer tensors (one set of
    statistics), and each copy at a name that was pinned is pinned; a layer
    held twice by the *same* parent (``nn.ModuleList([bn, bn])``) is converted
    at its first slot only and torch leaves the original layer (with its pin)
    at the others. Returns the converted module (use the return value: a bare
    BatchNorm is replaced).

    A ``_BatchNorm`` subclass with a ``forward`` of its own (timm's
    ``BatchNormAct2d`` applies its activation inside the norm layer) becomes a
    plain SyncBatchNorm under torch's conversion, which drops what that
    ``forward`` did. Each such layer is checked first: converted (on a copy)
    and compared in eval mode on probe inputs
    (:func:`bnstudy.norms.eval_output_difference`); where the outputs differ,
    or the layer lacks torch's fields (``eps``...), the call raises
    ``ValueError`` naming the layer before anything is changed (timm's own
    ``timm.layers.convert_sync_batchnorm`` keeps the activation). Raises
    ``TypeError`` if ``module`` is not an ``nn.Module``, is a TorchScript module,
    or ``process_group`` is not a ``ProcessGroup``.
    """
    check_module("convert_sync_batchnorm", "module", module)
    refuse_adapted("convert_sync_batchnorm", "module", module)
    _refuse_script_module("convert_sync_batchnorm", "module", module)
    pg_type = getattr(torch.distributed, "ProcessGroup", None) if torch.distributed.is_available() else None
    if process_group is not None and (pg_type is None or not isinstance(process_group, pg_type)):
        raise TypeError(f"convert_sync_batchnorm: process_group must be None (the default group) or a "
                        f"torch.distributed.ProcessGroup, got {describe(process_group)}")
    try:
        _check_sync_convertible(module, process_group)
    except ValueError as e:  # every refusal names this function
        raise _named("convert_sync_batchnorm", e) from e.__cause__
    # every name, not named_modules()'s first one: torch splits a shared layer into one copy per parent
    pinned = {n for n, m in module.named_modules(remove_duplicate=False) if is_pinned(m)}
    stays = eval_after_train(module)
    out = nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)
    now = eval_after_train(out)
    for n, m in out.named_modules(remove_duplicate=False):
        if not is_pinned(m) and (n in pinned or (n in stays and n not in now)):
            m.train = _PinnedTrain(m)
            setattr(m, PIN_MARK, True)
            nn.Module.train(m, False)
    return out
