"""bnstudy: what batch normalization does when you freeze, fine-tune and transfer networks.

The practitioner's library, the front door (it needs only torch and numpy; a table it returns needs pandas).
Beside it, in its own subpackage ``bnstudy.study`` (installed with ``bnstudy[study]``; ``import bnstudy`` never loads
it), the book's study machinery: ``config``, ``engine``, ``sweep``, ``tasks``, ``models``, ``modes`` (the four freeze
modes: ``MODES``, ``TransferModel``), ``banks``, ``routing``, ``inference``, ``words``, ``pages``, the release and book
runner, and ``experiments`` (one folder per chapter: ``run``, ``findings``, ``figures``).


* **freeze** so that it stays frozen: :func:`pin_eval` (eval mode that survives ``model.train()``;
  also switches Dropout off), :func:`pin_norm_eval` (only norm layers; affine parameters stay
  trainable), :func:`unpin`, :func:`freeze_batchnorm` / :func:`unfreeze_batchnorm`
  (BatchNorm <-> :class:`FrozenBatchNorm`), :func:`freeze_modules` / :func:`unfreeze_modules`
  (by name, timm's call shape; names are required, ``whole_model=True`` for all),
  :func:`shared_weight_copy` (domain-specific BN);
* **audit**: :class:`FreezeAudit`, :func:`lint_model`, :func:`lint_loader`, :func:`lint_forward_modes`;
* **re-estimate** statistics: :func:`update_bn_stats` (precise BN / AdaBN, in place, fvcore's
  contract), :func:`precise_bn_statistics` (the same estimate, returned);
* **mismatch**: :func:`statistics_mismatch` (a model's stored statistics against new data),
  :func:`compare_statistics` (two models', or a model's and data's, layer by layer);
* **replace** BatchNorm by GroupNorm or LayerNorm: :func:`replace_norm`;
* **adapt at test time**: :func:`adapt_bn_statistics` (a ``with`` block in which each batch is normalised with a
  prior-weighted mix of the stored statistics and its own, Schneider et al. 2020; the model is left as it was).

Note for users coming from Keras: ``layer.trainable = False`` on a Keras BatchNormalization layer
also switches it to inference mode; PyTorch's ``requires_grad_(False)`` does not. Use
:func:`pin_eval` or :func:`pin_norm_eval` (or :func:`freeze_batchnorm`) as well.
"""

from .adapt import AdaptedStatistics, adapt_bn_statistics
from .audit import FreezeAudit, lint_forward_modes, lint_loader, lint_model
from .freeze import (FrozenBatchNorm, freeze_batchnorm, freeze_modules, pin_eval, pin_norm_eval,
                     shared_weight_copy, unfreeze_batchnorm, unfreeze_modules, unpin)
from .running_stats import compare_statistics, precise_bn_statistics, replace_norm, statistics_mismatch, update_bn_stats

__all__ = [
    # freeze
    "pin_eval", "pin_norm_eval", "unpin", "freeze_batchnorm", "unfreeze_batchnorm", "FrozenBatchNorm",
    "freeze_modules", "unfreeze_modules", "shared_weight_copy",
    # audit and lints
    "FreezeAudit", "lint_model", "lint_loader", "lint_forward_modes",
    # re-estimate and compare statistics
    "update_bn_stats", "precise_bn_statistics", "statistics_mismatch", "compare_statistics",
    # swap BatchNorm for a per-sample norm
    "replace_norm",
    # test-time adaptation of the statistics
    "adapt_bn_statistics", "AdaptedStatistics",
]
