"""Lints: known BatchNorm traps, flagged by layer name before (or while) they cost a run.

Static lints read a model (:func:`lint_model`), a data loader
(:func:`lint_loader`) or a forward pass in both modes (:func:`lint_forward_modes`);
:class:`bnstudy.audit.FreezeAudit` adds live lints from its hooks. Every finding
is a :class:`Lint` with a code from :data:`LINT_CODES`, and ``warning`` ones are
also raised as :class:`BNLintWarning`. What a layer does is decided by
:mod:`bnstudy.norms`, the way torch's own ``forward`` decides it (train/eval
flag, presence of ``running_mean``/``running_var``, ``momentum`` and
``track_running_stats`` together), so every message is true in every state the
buffers and flags can be in.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_bool, check_int, check_materialized, check_module
from ..freeze import batch_stats_rows, is_pinned, pin_dropped, _refuse_fixed_mode
from ..norms import (compiled_original, has_running_stats, is_batch_norm, is_frozen_batchnorm, is_norm_base,
                     statistics_source)

# The vocabulary, the per-layer findings and the loader and forward lints live in their own modules; every name
# importable from here before the split still is (re-exports).
from .codes import (LINT_CODES, MAX_INIT_WEIGHT, MAX_MOMENTUM, MIN_BATCH, SEVERITIES, WARN_MAX_LAYERS, _INFO_CODES,
                    BNLintWarning, Lint, _check_lints, _check_positive_int, _emit, _label, _lint, format_lints,
                    group_lints, grouped_message, lints_frame)
from .layer_lints import (_at_reset_values, _batch_lints, _finite_stats, _frozen_block, _frozen_context, _low_precision,
                          _low_precision_lint, _momentum_lints, _near_init_lint, _nonfinite_lint, _type_name,
                          exported_train_words)
from .loader_lints import _loader_labels, batch_label_dependence, lint_loader
from .forward_lints import _is_dropout, _required_positional, call_forward, lint_forward_modes, resolve_forward


def lint_model(model: nn.Module, batch_size: int | None = None, min_batch: int = MIN_BATCH,
               warn: bool = True) -> list[Lint]:
    """Static lints for every norm layer of ``model`` that keeps (or should keep) running statistics.

    Covers every torch ``_NormBase`` layer: BatchNorm1d/2d/3d, SyncBatchNorm,
    the lazy variants, InstanceNorm (with or without tracking) and third-party
    subclasses, plus frozen BatchNorm layers (this package's FrozenBatchNorm,
    torchvision's, detectron2's and timm's FrozenBatchNorm2d:
    :func:`bnstudy.norms.is_frozen_batchnorm`) for ``reset_stats_pinned``,
    ``nonfinite_stats`` and ``stats_near_init``. Judging each
    layer the way torch's forward does (:mod:`bnstudy.norms`) and in the mode it
    will be in after the ``model.train()`` every training loop calls (measured by
    :func:`bnstudy.freeze.batch_stats_report`, flags restored), it checks:
    no running-statistics buffers (``batch_dependent_in_eval``), buffers that
    train mode never updates (``stats_never_updated``), momentum
    (``momentum_invalid``, ``momentum_high``, ``momentum_zero``,
    ``momentum_cumulative``, ``cumulative_overwrites_loaded``), a frozen affine
    whose statistics still move (``frozen_bn_in_train_mode``; a layer without
    affine parameters counts as frozen when every parameter of its nearest
    ancestor that has parameters, the model included, is frozen, or every
    parameter registered before it in that ancestor is: a non-affine BatchNorm
    in a frozen backbone, or after the frozen first stages of a flat model),
    a BatchNorm whose affine parameters train (any of them ``requires_grad=True``)
    in an otherwise frozen part of the model and whose statistics move after
    ``model.train()`` (``train_bn_drift``: fastai's and PyTorch Lightning's
    ``train_bn=True``; the frozen part is found as for a layer without affine
    parameters, BatchNorm affine parameters left out: every parameter of the
    nearest ancestor that holds other parameters, or every one registered
    before the layer in it, frozen; a layer pinned in eval mode, the fix when
    only the affine should train, is not linted),
    a layer in eval mode under a parent in train mode that nothing keeps in eval
    (``eval_undone_by_train``: the next ``model.train()`` undoes it; what is left
    of a pin that torch's ``nn.SyncBatchNorm.convert_sync_batchnorm`` dropped),
    reset statistics in a layer that will use them
    (``reset_stats_pinned``), NaN/inf statistics (``nonfinite_stats``),
    statistics kept in float16/bfloat16 by a layer that updates them
    (``low_precision_stats``), statistics so few updates old that the values
    at their last reset still weigh more than :data:`MAX_INIT_WEIGHT`
    (``stats_near_init``, for layers in eval mode now or after ``model.train()``,
    and for layers training now, which will normalise with them after
    ``model.eval()``),
    and a pin that a transformation dropped (``pin_lost``: a module with
    :func:`bnstudy.freeze.pin_eval`'s mark and no pin, as ``torch.jit.script``
    leaves it). With ``batch_size`` (the per-device batch), layers using batch
    statistics get ``single_sample_batch`` at 1 and ``small_batch`` below
    ``min_batch``.

    TorchScript models (``torch.jit.script``/``trace``/``load``) are read the
    same way (each scripted layer is judged by the class it was compiled from);
    a ``torch.compile`` wrapper is linted through the module it wraps, with that
    module's layer names (no ``_orig_mod.`` prefix).

    Returns the lints (grouped display: :func:`format_lints`) and warns the
    ``warning`` ones. Raises ``ValueError`` naming ``batch_size`` or
    ``min_batch`` when it is not a positive integer or naming ``model`` when it has
    tensors on the ``'meta'`` device (no values to lint), and ``TypeError`` when
    ``model`` is not an ``nn.Module`` or refuses ``train()`` (the module of a
    ``torch.export`` program: lint the model before exporting it).
    """
    check_module("lint_model", "model", model)
    check_int("lint_model", "batch_size", batch_size, allow_none=True)
    _check_positive_int("min_batch", min_batch, "lint_model")
    check_bool("lint_model", "warn", warn)
    model = compiled_original(model)
    check_materialized("lint_model", "model", model)
    try:
        _refuse_fixed_mode("lint_model", model)
    except TypeError as e:  # a torch.export module: say whether it was exported in train mode
        raise TypeError(f"{e}{exported_train_words(model)}") from None
    report = {r["layer"]: r for r in batch_stats_rows(model)}
    modules = dict(model.named_modules())
    lints = []
    for name, m in model.named_modules():
        kind = _type_name(m)
        if pin_dropped(m):
            lints.append(_lint("pin_lost", name, "carries pin_eval's mark but not its pin: it comes from a "
                               "transformation that keeps attributes and drops Python methods (torch.jit.script, torch.jit.save/load), so model.train() puts it in train mode "
                               "again; pin it again on this model (bnstudy.pin_eval works on a scripted "
                               "module, in Python only), or convert the BatchNorm layers before scripting "
                               "(bnstudy.freeze_batchnorm, whose FrozenBatchNorm scripts)"))
        if is_frozen_batchnorm(m):
            if has_running_stats(m) and not _finite_stats(m):
                lints.append(_nonfinite_lint(name, m))
            elif has_running_stats(m) and _at_reset_values(m):
                lints.append(_lint("reset_stats_pinned", name, f"{kind} holds the reset statistics mean 0 / "
                                   "variance 1: it normalises with them forever (it cannot re-estimate)"))
            elif isinstance(getattr(m, "num_batches_tracked", None), torch.Tensor) and hasattr(m, "momentum"):
                near = _near_init_lint(name, m, int(m.num_batches_tracked))
                if near is not None:
                    lints.append(near)
            continue
        if not is_norm_base(m):
            continue
        row = report[name]
        writes = bool(row["updates_running_stats_after_train"])
        if is_batch_norm(m) and statistics_source(m, False) == "batch":
            lints.append(_lint("batch_dependent_in_eval", name,
                               f"{kind} has no running_mean/running_var buffers (its track_running_stats flag is "
                               f"{m.track_running_stats}): it normalises with batch statistics in eval mode too, so a "
                               "sample's output depends on its batch mates at inference and a batch of one value per "
                               "channel raises"))
        elif has_running_stats(m) and not m.track_running_stats:
            if is_batch_norm(m):
                lints.append(_lint("stats_never_updated", name,
                                   f"{kind} has running statistics but track_running_stats=False: train mode never "
                                   "updates them, while eval mode normalises with them (stale statistics at "
                                   "inference)"))
            else:
                lints.append(_lint("stats_never_updated", name,
                                   f"{kind} has running statistics but track_running_stats=False: it normalises each "
                                   "sample with its own statistics in every mode, never uses the running ones, and "
                                   "still overwrites them on every forward pass"))
        if has_running_stats(m):
            lints.extend(_momentum_lints(name, m))
        own = list(m.parameters(recurse=False))
        frozen_affine = m.affine and bool(own) and not any(p.requires_grad for p in own)
        frozen_block = None if own else _frozen_context(modules, name)
        if frozen_affine and writes:
            lints.append(_lint("frozen_bn_in_train_mode", name,
                               f"{kind}'s weight and bias have requires_grad=False, but after model.train() it "
                               + ("normalises with batch statistics and " if is_batch_norm(m) else "")
                               + "overwrites running_mean/running_var on every forward pass (pin it: "
                               "bnstudy.freeze.pin_eval or pin_norm_eval, or convert it: freeze_batchnorm / "
                               "freeze_modules)"))
        elif frozen_block is not None and writes:
            lints.append(_lint("frozen_bn_in_train_mode", name,
                               f"{kind} has no affine parameters (affine=False) and sits in a frozen part of the "
                               f"model ({frozen_block}), but after "
                               "model.train() it " + ("normalises with batch statistics and " if is_batch_norm(m)
                                                      else "")
                               + "overwrites running_mean/running_var on every forward pass: requires_grad has "
                               "nothing to act on in this layer (pin it: bnstudy.pin_eval or bnstudy.pin_norm_eval, "
                               "or convert it: bnstudy.freeze_batchnorm / bnstudy.freeze_modules)"))
        elif (writes and is_batch_norm(m) and m.affine and any(p.requires_grad for p in own)
              and m.momentum != 0 and _frozen_block(modules, name) is not None):
            # momentum 0: train mode normalises with the batch but never moves the running statistics (momentum_zero
            # says so); the affine then trains on batch statistics that eval mode will not use, not on drifting ones
            # The message names no block, so that the layers of a whole backbone group into one warning.
            trained = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
            lints.append(_lint("train_bn_drift", name,
                               f"{kind}'s {' and '.join(trained)} {'have' if len(trained) > 1 else 'has'} "
                               "requires_grad=True in a frozen part of the model (every parameter other than "
                               "BatchNorm affine ones has requires_grad=False in the nearest module around it that "
                               "has any, or in the layers registered before it there), and after model.train() it "
                               "normalises with batch statistics and overwrites running_mean/running_var on every "
                               "forward pass: the affine trains on statistics that drift with every batch "
                               "(train_bn=True, the default of fastai's freeze and of PyTorch Lightning's "
                               "BaseFinetuning.freeze). If only the affine should train, pin the statistics: "
                               "bnstudy.pin_norm_eval on the frozen part (eval mode that survives model.train(); the "
                               "affine stays trainable); if nothing there should train, freeze the affine too: "
                               "requires_grad_(False) and pin it (bnstudy.pin_eval), or convert it "
                               "(bnstudy.freeze_batchnorm / bnstudy.freeze_modules)"))
        parent = modules.get(name.rpartition(".")[0]) if name else None
        if has_running_stats(m) and not m.training and writes and parent is not None and parent.training:
            lints.append(_lint("eval_undone_by_train", name,
                               f"{kind} is in eval mode while its parent {_label(name.rpartition('.')[0])!r} is in "
                               "train mode, and nothing keeps it there (no pin_eval pin, no train() override): the "
                               "next model.train() puts it in train mode and its running statistics move. A layer "
                               "set to eval by hand (redo it after every model.train(), or pin it: "
                               "bnstudy.pin_eval), or a pin a conversion dropped: torch's "
                               "nn.SyncBatchNorm.convert_sync_batchnorm copies the eval flag but not pin_eval's "
                               "pin (bnstudy.freeze.convert_sync_batchnorm keeps it)"))
        uses_running = row["stats_after_train"] == "running" or row["stats_now"] == "running"
        if has_running_stats(m) and not _finite_stats(m):
            lints.append(_nonfinite_lint(name, m))
        elif has_running_stats(m) and row["stats_after_train"] == "running" and _at_reset_values(m):
            why = "pinned in eval mode" if is_pinned(m) else "in eval mode after model.train()"
            trained = m.affine and not (bool((m.weight == 1).all()) and bool((m.bias == 0).all()))
            msg = (f"{kind} is {why} and holds the reset statistics mean 0 / variance 1, so it normalises with "
                   "them and never re-estimates them (torch.optim.swa_utils.update_bn resets pinned layers this "
                   "way; re-estimate with bnstudy.update_bn_stats, which reaches pinned layers)")
            # Trained affine parameters next to reset statistics: the statistics were reset, not never estimated.
            # A freshly built layer (affine at 1/0 or absent) gets the same finding as information.
            lints.append(Lint("reset_stats_pinned", name, msg if trained else msg + " (information: the layer "
                              "looks freshly built)", "warning" if trained else "info"))
        elif has_running_stats(m) and is_batch_norm(m) and (uses_running or writes) and isinstance(
                getattr(m, "num_batches_tracked", None), torch.Tensor):
            # A layer training now normalises with these statistics at the next model.eval() (case: five
            # train-mode updates after a reset read 2.05 for a data mean of 5.0), so it is linted too.
            near = _near_init_lint(name, m, int(m.num_batches_tracked), training=not uses_running)
            if near is not None:
                lints.append(near)
        if has_running_stats(m) and writes and _low_precision(m.running_mean):
            lints.append(_low_precision_lint(name, m))
        if batch_size is not None and row["batch_stats_after_train"]:
            lints.extend(_batch_lints(name, m, batch_size, None, min_batch))
    _emit(lints, warn)
    return lints
