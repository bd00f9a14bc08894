"""Test-time adaptation of BatchNorm statistics: normalise each test batch with a prior-weighted mix of the stored
(source) statistics and the batch's own.

Schneider et al. 2020 ("Improving robustness against common corruptions by covariate shift adaptation", NeurIPS;
reference code ``bethgelab/robustness``) treat the source statistics as a prior worth ``N`` samples and the test
batch as ``n`` samples. With ``w = N / (N + n)``, every BatchNorm layer normalises with

    mean = w * running_mean + (1 - w) * batch_mean
    var  = w * running_var  + (1 - w) * batch_var

per channel, and applies its own affine ``weight``/``bias``. ``N = 0`` is test-batch statistics alone (Nado et al.
2020's prediction-time BatchNorm; the statistics part of TENT, Wang et al. 2021); ``N = inf`` is the stored
statistics, plain eval mode. Nothing is stored: each batch is mixed with the source statistics afresh, and
``running_mean``/``running_var`` are never written (for a running update across batches, DUA's decaying momentum,
use train mode with a momentum schedule, or :func:`bnstudy.update_bn_stats` for a pooled re-estimate).

One difference from the reference code, on purpose: ``batch_var`` is the *biased* variance (divisor ``n x
spatial``), the variance a BatchNorm layer normalises with in train mode, so that ``prior=0`` gives, to rounding
(the two compute it in different orders), the output of a train-mode forward without its side effect on the buffers. The reference code mixes the unbiased one
(divisor ``n x spatial - 1``); the two differ by a factor ``M / (M - 1)`` with ``M`` values per channel (below
1% once a layer sees 100 values per channel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import threading
import weakref
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as glb

from ._checks import check_materialized, check_module, describe, module_names
from .freeze import _refuse_script_module
from .norms import ADAPTED, computes_standard_eval, has_running_stats, is_batch_norm, is_frozen_batchnorm

_FN = "adapt_bn_statistics"


@dataclasses.dataclass
class AdaptedStatistics:
    """What :func:`adapt_bn_statistics` adapts: ``layers``, the qualified names of the BatchNorm layers whose
    statistics are mixed (in ``model.named_modules()`` order); ``prior``, ``N`` in samples; ``calls``, per layer
    the number of forward calls adapted so far (a layer the forward passes never reached stays at 0)."""

    layers: tuple[str, ...]
    prior: float
    calls: dict[str, int]

    def weight(self, batch_size: int) -> float:
        """The source statistics' weight ``N / (N + n)`` for a batch of ``batch_size`` samples (1 when ``N`` is
        infinite or the batch is empty)."""
        if math.isinf(self.prior) or batch_size == 0:
            return 1.0
        return self.prior / (self.prior + batch_size)


def _check_prior(prior) -> float:
    if not isinstance(prior, numbers.Real) or isinstance(prior, bool):
        raise TypeError(f"{_FN}: prior must be a number of samples >= 0 (0: the test batch's statistics alone; "
                        f"float('inf'): the stored statistics), got {describe(prior)}")
    try:
        p = float(prior) + 0.0  # -0.0 -> 0.0
    except OverflowError:
        p = float("inf") if prior > 0 else float("nan")
    if p != p or p < 0:
        raise ValueError(f"{_FN}: prior must be a number of samples >= 0 (0: the test batch's statistics alone; "
                         f"float('inf'): the stored statistics), got {prior!r}")
    return p


def _refuse_compiled(model: nn.Module) -> None:
    compiled = type(model).__name__ == "OptimizedModule" or any(
        getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
    if compiled:
        raise TypeError(f"{_FN}: model is compiled (torch.compile / module.compile()); the graph it runs was traced "
                        "before the block and need not call the hooks that mix the statistics. Adapt the uncompiled "
                        "model (model._orig_mod for a torch.compile wrapper) and compile afterwards if you must")


def _layers(model: nn.Module, modules) -> dict[str, nn.Module]:
    """The layers to adapt, by their first name in ``model.named_modules()``; ``modules`` selects by every name a
    layer has (a shared layer is selected through any of its owners)."""
    every = [(n, m) for n, m in model.named_modules(remove_duplicate=False) if is_batch_norm(m) and has_running_stats(m)]
    first = {}
    for n, m in every:
        first.setdefault(id(m), n)
    found = {first[id(m)]: m for _, m in every}
    if not found:
        frozen = [n or "(model)" for n, m in model.named_modules() if is_frozen_batchnorm(m)]
        why = (f"; its FrozenBatchNorm layers {frozen[:4]} are frozen on purpose and are not adapted" if frozen
               else "")
        raise ValueError(f"{_FN}: model has no BatchNorm layer with running_mean/running_var buffers to adapt{why}")
    if modules is not None:
        prefixes = module_names(_FN, "modules", model, modules)
        chosen = {id(m) for n, m in every if any(p == "" or n == p or n.startswith(p + ".") for p in prefixes)}
        found = {n: m for n, m in found.items() if id(m) in chosen}
        if not found:
            raise ValueError(f"{_FN}: modules={prefixes} hold no BatchNorm layer with running statistics")
    nested = [n or "(model)" for n, m in found.items() if _adapted(m) is not None]
    if nested:
        raise ValueError(f"{_FN}: {nested[:4]} are already adapted by an enclosing adapt_bn_statistics block; "
                         "nothing was changed (one block per layer: give the outer block the prior you want)")
    training = [n or "(model)" for n, m in found.items() if m.training]
    if training:
        raise ValueError(f"{_FN}: {len(training)} BatchNorm layer(s) are in train mode ({training[:4]}), where they "
                         "already normalise with the batch's statistics and rewrite running_mean/running_var; call "
                         "model.eval() first (nothing was changed)")
    odd = [f"{n or '(model)'} ({type(m).__name__})" for n, m in found.items() if not computes_standard_eval(m)]
    if odd:
        raise ValueError(f"{_FN}: {odd[:4]} do not run torch's own BatchNorm forward (a subclass that overrides "
                         "forward, or a forward set on the instance); replacing their output with the mixed-"
                         "statistics one would change more than their statistics. Nothing was changed; pass "
                         "modules= to leave them out")
    return found


#: The layers adapted by an open block, by ``id``: ``(weakref to the layer, its name, the block's record)``.
_ACTIVE = ADAPTED
_LOCK = threading.Lock()


def _adapted(module: nn.Module):
    entry = _ACTIVE.get(id(module))
    return entry if entry is not None and entry[0]() is module else None


def _check_call(handle: AdaptedStatistics, module: nn.Module, args) -> None:
    """Global forward pre-hook: refuse, before the layer runs, a call that train mode or ``prior=0`` at one sample
    would make meaningless (train mode would rewrite the running statistics first)."""
    entry = _adapted(module)
    if entry is None or entry[2] is not handle:
        return
    name = entry[1]
    if module.training:
        raise RuntimeError(f"{_FN}: layer {name or '(model)'} was switched to train mode inside the block (by "
                           "model.train(), or by a call such as update_bn_stats that runs layers in train mode); "
                           "train mode would rewrite its running statistics. Call model.eval() again, or leave the "
                           "block first")
    if not args:  # a global hook sees positional arguments only: bn(input=x) would go unadapted
        raise TypeError(f"{_FN}: layer {name or '(model)'} was called with its input as a keyword argument, which "
                        "the block cannot read (torch's global module hooks see positional arguments only); call "
                        "it as layer(x)")
    x = args[0]
    if isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[0] == 1 and handle.prior == 0:
        raise ValueError(f"{_FN}: prior=0 normalises with the test batch's statistics alone, which a batch of one "
                         f"sample does not estimate (layer {name or '(model)'} got shape {tuple(x.shape)}); use a "
                         "prior > 0 (Schneider et al. 2020 mix in the stored statistics so that even one sample "
                         "helps) or batch the test samples")


def _mixed_output(handle: AdaptedStatistics, module: nn.Module, args, output):
    """Global forward hook: the layer's output recomputed with the prior-weighted statistics (``None``, keeping
    torch's eval output, for every module the block does not adapt and when the weight on the stored statistics
    is 1)."""
    entry = _adapted(module)
    if entry is None or entry[2] is not handle:
        return None
    name = entry[1]
    x = args[0]
    handle.calls[name] += 1
    w = handle.weight(x.shape[0])
    if w == 1.0:  # the stored statistics alone: torch's own eval output, bit for bit
        return None
    bn = module
    dims = [0] + list(range(2, x.dim()))
    dtype = torch.promote_types(x.dtype, torch.float32)
    var, mean = torch.var_mean(x.to(dtype), dim=dims, correction=0)
    if w > 0.0:  # with prior=0 the stored statistics play no part (not even a NaN in them)
        mean = w * bn.running_mean.to(dtype) + (1.0 - w) * mean
        var = w * bn.running_var.to(dtype) + (1.0 - w) * var
    shape = (1, -1) + (1,) * (x.dim() - 2)
    y = (x.to(dtype) - mean.view(shape)) * torch.rsqrt(var.view(shape) + bn.eps)
    if bn.weight is not None:
        y = y * bn.weight.to(dtype).view(shape)
    if bn.bias is not None:
        y = y + bn.bias.to(dtype).view(shape)
    return y.to(x.dtype)


@contextlib.contextmanager
def adapt_bn_statistics(model: nn.Module, prior: float = 16.0, *, modules=None) -> Iterator[AdaptedStatistics]:
    """Inside the ``with`` block, every BatchNorm layer of ``model`` normalises each batch with a prior-weighted
    mix of its stored statistics and the batch's own (test-time adaptation of the statistics, Schneider et al.
    2020; the module docstring gives the formula).

    ``model``: an ``nn.Module`` whose BatchNorm layers (BatchNorm1d/2d/3d, SyncBatchNorm, lazy variants once
    initialised) are in eval mode (``model.eval()``); not compiled (adapt the uncompiled model). ``prior``: ``N``, the stored statistics' weight in samples, ``>= 0``; a batch of ``n`` samples
    (``x.shape[0]``, whatever the spatial size) gets weight ``n / (N + n)``. ``0``: the batch's statistics alone;
    ``float('inf')``: the stored statistics (the model's own eval output). The default 16 is a prior worth a small
    test batch; Schneider et al. report that with such a prior even one test sample improves ResNet-50 on
    ImageNet-C, but the best ``N`` depends on the batch size and the shift (the book's chapter 8 question): tune it
    on your own stream. ``modules``: a qualified name, a module of ``model``, or a list of those: adapt only the BatchNorm
    layers inside them (default: all).

    Yields an :class:`AdaptedStatistics` (``layers``, ``prior``, ``calls``). Works under autograd: the batch
    statistics are differentiable functions of the input, as in train mode, so the affine parameters can be
    trained inside the block (TENT's entropy minimisation).

    Nothing about the model is changed: ``running_mean``, ``running_var``, ``num_batches_tracked``, parameters,
    train/eval flags and attributes are never written. The block registers two global module hooks (torch's
    ``register_module_forward_pre_hook`` / ``register_module_forward_hook``) that act only on the adapted layer
    objects, by identity, and removes them on exit, also when the block raises: torch's eval output is replaced by
    the mixed one. A copy of the model made inside the block (``copy.deepcopy``, pickling) is therefore plain
    eval mode, and a saved model carries nothing of the block. While the block is open the adapted layers are
    adapted in every call, from any thread; the block does not restore flags the code inside it changes.
    FrozenBatchNorm and InstanceNorm layers are left alone; a layer called several times per forward (shared) is
    mixed at each call, and ``modules`` selects it through any of its owners.

    Raises ``TypeError`` for a ``model`` that is not an ``nn.Module``, a TorchScript or compiled model (hooks do
    not run inside a traced graph), or a ``prior`` that is not a number; ``ValueError``, before anything is
    changed, for a negative or NaN ``prior``, a model without BatchNorm layers holding running statistics, ``modules`` that select none,
    a BatchNorm layer in train mode, one whose class overrides torch's forward, or one already adapted by an
    enclosing block. Inside the block, a layer switched to train mode raises ``RuntimeError``, and with
    ``prior=0`` a batch of one sample raises ``ValueError``: its statistics alone are not an estimate (Schneider
    et al. 2020 and Niu et al. 2023 find test-batch statistics fail at batch size 1).
    """
    check_module(_FN, "model", model)
    check_materialized(_FN, "model", model)
    _refuse_script_module(_FN, "model", model)
    p = _check_prior(prior)
    _refuse_compiled(model)
    with _LOCK:  # the check for an enclosing block and the registration are one step
        layers = _layers(model, modules)
        handle = AdaptedStatistics(layers=tuple(layers), prior=p, calls={n: 0 for n in layers})
        for name, bn in layers.items():
            _ACTIVE[id(bn)] = (weakref.ref(bn), name, handle)
        pre = glb.register_module_forward_pre_hook(functools.partial(_check_call, handle))
        post = glb.register_module_forward_hook(functools.partial(_mixed_output, handle))
    try:
        yield handle
    finally:
        with _LOCK:
            for bn in layers.values():
                if _ACTIVE.get(id(bn), (None, None, None))[2] is handle:
                    del _ACTIVE[id(bn)]
            pre.remove()
            post.remove()
