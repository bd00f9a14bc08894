"""Every public function of bnstudy, given a wrong value for any one argument, raises TypeError or ValueError
whose message names that argument (never a bare "'NoneType' object is not iterable").

Public means: ``bnstudy.__all__``, ``bnstudy.audit.__all__``, and the callables ``bnstudy.running_stats`` and
``bnstudy.freeze`` define. Each is listed in CASES with a valid call and, per argument, which values are
allowed; every value of GARBAGE that is not allowed is tried, one argument at a time. A fixed, exhaustive
table rather than hypothesis: the wrong values that matter (None, a number, a string, an empty list, a bool
where an int goes, a lone tensor) are few, and trying each on every argument is deterministic and fast.
``test_every_public_callable_is_covered`` keeps the table complete as the API grows.
"""

from __future__ import annotations

import math
import numbers
import re

import pytest
import torch
from torch import nn

import bnstudy
from bnstudy import audit, freeze
from bnstudy import running_stats as stats
from bnstudy.audit import FreezeAudit, Lint, LayerRecord, Snapshot
from bnstudy.study.modes import MODE_NAMES, TRAIN_MODE, FreezeMode, TransferModel, get_mode

GARBAGE = [None, 0, -1, 3, 1.5, math.nan, True, "x", "", b"x", object(), [], [object()], {"k": 1},
           torch.zeros(2)]

X = torch.randn(8, 3)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.1), nn.Linear(4, 2))


def _done_audit():
    m = _model().eval()
    with FreezeAudit(m, probe=X, warn=False) as a:
        m(X)
    return a


# --- what each kind of argument allows -----------------------------------------------------------------------

def anything(v):
    return True


def module(v):
    return isinstance(v, nn.Module)


def flag(v):
    return isinstance(v, bool)


def string(v):
    return isinstance(v, str)


def pos_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1


def tensor(v):
    return isinstance(v, torch.Tensor)


def number_at_least(lo, hi=math.inf, strict=False):
    def ok(v):
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and (
            v > lo if strict else v >= lo) and v <= hi
    return ok


def or_none(pred):
    return lambda v: v is None or pred(v)


def one_of(*choices):
    return lambda v: isinstance(v, str) and v in choices


def model_input(v):
    return bnstudy._checks.has_tensor(v)


def is_callable(v):
    return callable(v)


NAMES_OF_MODEL = ("", "0", "1", "2", "3")


def names_of_model(v):  # a qualified name of _model() ("" is the root) or a module of it
    return isinstance(v, str) and v in NAMES_OF_MODEL


def only_false(v):
    return v is False


# --- the table: name, function, valid keyword arguments (built fresh per call), allowed values per argument ----

def _adapted(**kw):
    """Enter and leave :func:`bnstudy.adapt_bn_statistics`'s block with one batch (its checks run on entry)."""
    with bnstudy.adapt_bn_statistics(**kw):
        kw["model"](X)


CASES = {
    # bnstudy.__all__
    "pin_eval": (freeze.pin_eval, lambda: dict(module=_model()), dict(module=module)),
    "pin_norm_eval": (freeze.pin_norm_eval, lambda: dict(module=_model()), dict(module=module)),
    "unpin": (freeze.unpin, lambda: dict(module=_model()), dict(module=module)),
    "freeze_batchnorm": (freeze.freeze_batchnorm, lambda: dict(module=_model()), dict(module=module)),
    "unfreeze_batchnorm": (freeze.unfreeze_batchnorm, lambda: dict(module=_model()), dict(module=module)),
    "FrozenBatchNorm": (freeze.FrozenBatchNorm,
                        lambda: dict(num_features=4, eps=1e-5, affine=True, momentum=0.1, source_class=nn.BatchNorm2d),
                        dict(num_features=pos_int, eps=number_at_least(0), affine=flag,  # eps=0: torch's too
                             momentum=or_none(lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)),
                             source_class=lambda v: isinstance(v, type) and issubclass(v, nn.Module))),
    "FrozenBatchNorm.from_batchnorm": (freeze.FrozenBatchNorm.from_batchnorm,
                                       lambda: dict(bn=nn.BatchNorm1d(4), name="bn"), dict(bn=module, name=string)),
    "FrozenBatchNorm.forward": (lambda x: freeze.FrozenBatchNorm(3)(x), lambda: dict(x=X), dict(x=tensor)),
    "freeze_modules": (freeze.freeze_modules, lambda: dict(model=_model(), names=["1"], whole_model=False),
                       dict(model=module, names=names_of_model, whole_model=only_false)),
    "unfreeze_modules": (freeze.unfreeze_modules, lambda: dict(model=_model(), names=["1"], whole_model=False),
                         dict(model=module, names=names_of_model, whole_model=only_false)),
    "shared_weight_copy": (freeze.shared_weight_copy, lambda: dict(module=_model()), dict(module=module)),
    "get_mode": (get_mode, lambda: dict(name="train_mode"), dict(name=one_of(*MODE_NAMES))),
    "FreezeMode": (FreezeMode, lambda: dict(name="m", summary="s", backbone_batch_stats=True, head_batch_stats=True,
                                            separate_buffers=False),
                   dict(name=lambda v: isinstance(v, str) and v != "", summary=string, backbone_batch_stats=flag,
                        head_batch_stats=flag, separate_buffers=flag)),
    "FreezeMode.apply": (lambda model: TRAIN_MODE.apply(model),
                         lambda: dict(model=TransferModel(nn.Linear(3, 3), nn.Linear(3, 2), nn.Linear(3, 2))),
                         dict(model=module)),
    "TransferModel": (TransferModel, lambda: dict(backbone=nn.Linear(3, 3), head_a=nn.Linear(3, 2),
                                                  head_b=nn.Linear(3, 2)),
                      dict(backbone=module, head_a=module, head_b=module)),
    "FreezeAudit": (FreezeAudit, lambda: dict(model=_model(), probe=X, forward=None, min_batch=16, warn=False,
                                              snapshot_device="cpu"),
                    dict(model=module, probe=or_none(model_input), forward=or_none(is_callable), min_batch=pos_int,
                         warn=flag, snapshot_device=or_none(lambda v: isinstance(v, (str, torch.device)) and v
                                                            in ("cpu", torch.device("cpu"))))),
    "FreezeAudit.moved": (lambda modules, tol: _done_audit().moved(modules, tol), lambda: dict(modules=None, tol=0.0),
                          dict(modules=or_none(names_of_model), tol=number_at_least(0))),
    "FreezeAudit.assert_frozen": (lambda **kw: _done_audit().assert_frozen(**kw),
                                  lambda: dict(modules=None, outputs=True, tol=0.0, max_items=20),
                                  dict(modules=or_none(names_of_model), outputs=flag, tol=number_at_least(0),
                                       max_items=pos_int)),
    "FreezeAudit.module_outputs": (lambda name: _done_audit().module_outputs(name), lambda: dict(name="1"),
                                   dict(name=names_of_model)),
    "FreezeAudit.summary": (lambda **kw: _done_audit().summary(**kw), lambda: dict(details=False, max_rows=12),
                            dict(details=flag, max_rows=pos_int)),
    "lint_model": (audit.lint_model, lambda: dict(model=_model(), batch_size=None, min_batch=16, warn=False),
                   dict(model=module, batch_size=or_none(pos_int), min_batch=pos_int, warn=flag)),
    "lint_loader": (audit.lint_loader, lambda: dict(dataset_len=100, batch_size=16, drop_last=False,
                                                    labels_per_batch=None, min_batch=16, max_dependence=0.05,
                                                    warn=False, scan_labels=False, label_fn=None),
                    dict(dataset_len=or_none(pos_int), batch_size=pos_int, drop_last=flag,
                         labels_per_batch=lambda v: v is None, min_batch=pos_int,
                         max_dependence=number_at_least(0, 1), warn=flag, scan_labels=only_false,
                         label_fn=or_none(is_callable))),
    "lint_forward_modes": (audit.lint_forward_modes, lambda: dict(model=_model(), example=X, forward=None, warn=False),
                           dict(model=module, example=model_input, forward=or_none(is_callable), warn=flag)),
    "update_bn_stats": (stats.update_bn_stats, lambda: dict(model=_model(), batches=[X, X], num_iters=None,
                                                            input_fn=None, modules=None),
                        dict(model=module, batches=lambda v: False, num_iters=or_none(lambda v: pos_int(v) and v <= 2),
                             input_fn=lambda v: v is None, modules=or_none(lambda v: isinstance(v, str) and v in ("", "1")))),
    "precise_bn_statistics": (stats.precise_bn_statistics, lambda: dict(model=_model(), batches=[X, X], num_iters=None,
                                                                        input_fn=None, modules=None),
                              dict(model=module, batches=lambda v: False,
                                   num_iters=or_none(lambda v: pos_int(v) and v <= 2), input_fn=lambda v: v is None,
                                   modules=or_none(lambda v: isinstance(v, str) and v in ("", "1")))),
    "statistics_mismatch": (stats.statistics_mismatch, lambda: dict(model=_model(), batches=[X], measure="kl",
                                                                    network_mode="eval", per_channel=False,
                                                                    input_fn=None),
                            dict(model=module, batches=lambda v: False, measure=one_of(*stats.MISMATCH_MEASURES),
                                 network_mode=one_of(*stats.MISMATCH_PASSES), per_channel=flag,
                                 input_fn=lambda v: v is None)),
    "compare_statistics": (stats.compare_statistics, lambda: dict(model=_model(), other=[X, X], tol=0.1,
                                                                  num_iters=None, input_fn=None),
                           dict(model=module, other=lambda v: False, tol=number_at_least(0),
                                num_iters=or_none(lambda v: pos_int(v) and v <= 2), input_fn=lambda v: v is None)),
    # BatchNorm1d(4) on (N, C): num_groups None (4 groups) or 4 would give one value per group (opacus#567)
    "replace_norm": (stats.replace_norm, lambda: dict(model=_model(), kind="group", num_groups=2),
                     dict(model=module, kind=one_of(*stats.REPLACE_KINDS),
                          num_groups=lambda v: pos_int(v) and 4 % v == 0 and v < 4)),
    # bnstudy.audit.__all__
    "layer_kind": (audit.layer_kind, lambda: dict(m=nn.BatchNorm1d(2), is_root=False), dict(m=module, is_root=flag)),
    "LayerRecord": (LayerRecord, lambda: dict(name="bn", module=nn.BatchNorm1d(2), kind="batchnorm"),
                    dict(name=string, module=module, kind=one_of(*audit.LAYER_KINDS))),
    "Lint": (Lint, lambda: dict(code="small_batch", layer="bn", message="m", severity="warning"),
             dict(code=one_of(*audit.LINT_CODES), layer=string, message=string,
                  severity=one_of(*audit.SEVERITIES))),
    "batch_label_dependence": (audit.batch_label_dependence, lambda: dict(labels_per_batch=[[0, 1], [1, 0]]),
                               dict(labels_per_batch=lambda v: False)),
    "call_forward": (audit.call_forward, lambda: dict(fn=_model(), x=X), dict(fn=is_callable, x=anything)),
    "format_lints": (audit.format_lints, lambda: dict(lints=[Lint("small_batch", "bn", "m")], width=100,
                                                      max_layers=6, indent="  "),
                     dict(lints=lambda v: isinstance(v, list) and all(isinstance(x, Lint) for x in v),
                          width=lambda v: pos_int(v) and v >= 20, max_layers=pos_int, indent=string)),
    "group_lints": (audit.group_lints, lambda: dict(lints=[Lint("small_batch", "bn", "m")]),
                    dict(lints=lambda v: isinstance(v, list) and all(isinstance(x, Lint) for x in v))),
    "lints_frame": (audit.lints_frame, lambda: dict(lints=[Lint("small_batch", "bn", "m")]),
                    dict(lints=lambda v: isinstance(v, list) and all(isinstance(x, Lint) for x in v))),
    "resolve_forward": (audit.resolve_forward, lambda: dict(model=_model(), forward=None, where="here"),
                        dict(model=module, forward=or_none(is_callable), where=string)),
    "Snapshot": (Snapshot, lambda: dict(tensors={}, kinds={}, modules={}),
                 dict(tensors=lambda v: isinstance(v, dict), kinds=lambda v: isinstance(v, dict),
                      modules=lambda v: isinstance(v, dict))),
    "compare_outputs": (audit.compare_outputs, lambda: dict(before={"": X}, after={"": X}),
                        dict(before=lambda v: isinstance(v, dict) and not v, after=lambda v: isinstance(v, dict) and not v)),
    "diff": (audit.diff, lambda: dict(before=audit.snapshot(_model()), after=audit.snapshot(_model())),
             dict(before=lambda v: False, after=lambda v: False)),
    "probe_outputs": (audit.probe_outputs, lambda: dict(model=_model(), probe=X, forward=None),
                      dict(model=module, probe=model_input, forward=or_none(is_callable))),
    "snapshot": (audit.snapshot, lambda: dict(model=_model(), device="cpu"),
                 dict(model=module, device=or_none(lambda v: isinstance(v, str) and v == "cpu"))),
    # bnstudy.running_stats
    "batch_input": (stats.batch_input, lambda: dict(batch=X),
                    dict(batch=lambda v: tensor(v) or (isinstance(v, (tuple, list)) and len(v) > 0))),
    "bn_input_statistics": (stats.bn_input_statistics, lambda: dict(model=_model(), batches=[X], network_mode="eval",
                                                                    input_fn=None),
                            dict(model=module, batches=lambda v: False, network_mode=one_of(*stats.MISMATCH_PASSES),
                                 input_fn=lambda v: v is None)),
    "gaussian_kl": (stats.gaussian_kl, lambda: dict(mean_p=X[0], var_p=X[1].exp(), mean_q=X[2], var_q=X[3].exp()),
                    dict(mean_p=tensor, var_p=tensor, mean_q=tensor, var_q=tensor)),
    "mismatch_from_statistics": (stats.mismatch_from_statistics,
                                 lambda: dict(model=_model(), statistics={"1": (torch.zeros(4), torch.ones(4))},
                                              measure="kl", per_channel=False),
                                 dict(model=module, statistics=lambda v: isinstance(v, dict) and not v,
                                      measure=one_of(*stats.MISMATCH_MEASURES), per_channel=flag)),
    "mismatch_candidate": (stats.mismatch_candidate, lambda: dict(measure="wasserstein", mean_new=X[0],
                                                                  var_new=X[1].exp(), mean_run=X[2], var_run=X[3].exp()),
                           dict(measure=one_of("log_var_ratio", "wasserstein"), mean_new=tensor, var_new=tensor,
                                mean_run=tensor, var_run=tensor)),
    # bnstudy.freeze
    "is_pinned": (freeze.is_pinned, lambda: dict(module=_model()), dict(module=module)),
    "batchnorm_layers": (freeze.batchnorm_layers, lambda: dict(module=_model()), dict(module=module)),
    "batch_stats_report": (freeze.batch_stats_report, lambda: dict(model=_model()), dict(model=module)),
    "batch_stats_rows": (freeze.batch_stats_rows, lambda: dict(model=_model()), dict(model=module)),
    "convert_sync_batchnorm": (freeze.convert_sync_batchnorm, lambda: dict(module=nn.Linear(2, 2), process_group=None),
                               dict(module=module, process_group=lambda v: v is None)),
    # issue 26
    "eval_after_train": (freeze.eval_after_train, lambda: dict(module=_model()), dict(module=module)),
    "pin_dropped": (freeze.pin_dropped, lambda: dict(module=_model()), dict(module=module)),
    **{f"UnfrozenBatchNorm{d}": (getattr(freeze, f"UnfrozenBatchNorm{d}"),
                                 lambda: dict(num_features=4, eps=1e-5, momentum=0.1, affine=True,
                                              track_running_stats=True),
                                 dict(num_features=pos_int, eps=number_at_least(0, strict=True),
                                      momentum=or_none(number_at_least(0, 1)), affine=flag, track_running_stats=flag))
       for d in ("1d", "2d", "3d")},
    # issue 38
    "adapt_bn_statistics": (_adapted, lambda: dict(model=_model().eval(), prior=16.0, modules=None),
                            dict(model=module, prior=lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)
                                 and v >= 0, modules=lambda v: v is None or v == "")),
    "UnfrozenBatchNorm2d.from_frozen": (freeze.UnfrozenBatchNorm2d.from_frozen,
                                        lambda: dict(frozen=freeze.FrozenBatchNorm(4), name="bn"),
                                        dict(frozen=lambda v: False, name=string)),
}

#: Public callables that take any value by design, with the reason.
EXEMPT = {
    "AdaptedStatistics": "the record adapt_bn_statistics yields (names, prior, counts); users read it, never build it",
    "output_signature": "describes the structure of any return value; every object is a valid argument",
}

ARGUMENTS = [(case, param) for case, (_fn, _kw, allowed) in CASES.items() for param in allowed]


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_table_entry_works_with_its_valid_arguments(case):
    fn, kwargs, _allowed = CASES[case]
    fn(**kwargs())


@pytest.mark.parametrize("case,param", ARGUMENTS, ids=[f"{c}-{p}" for c, p in ARGUMENTS])
def test_a_wrong_argument_raises_type_or_value_error_naming_it(case, param):
    fn, kwargs, allowed = CASES[case]
    wrong = []
    for value in GARBAGE:
        if allowed[param](value):
            continue
        kw = kwargs()
        kw[param] = value
        try:
            fn(**kw)
        except (TypeError, ValueError) as e:
            if not re.search(rf"\b{re.escape(param)}\b", str(e)):
                wrong.append(f"{param}={value!r}: {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - any other kind is the fault this test looks for
            wrong.append(f"{param}={value!r}: {type(e).__name__}: {e}")
        else:
            wrong.append(f"{param}={value!r}: accepted")
    assert not wrong, f"{case}: " + "\n".join(wrong)


#: Cases whose refusals name something else than the case, with the reason.
NAMED_AS = {
    "FrozenBatchNorm.forward": "FrozenBatchNorm",  # the user calls the layer, frozen(x), not its forward
    "resolve_forward": ("here", "resolve_forward"),  # its refusals name ``where`` (its caller), or its own ``where``
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_refusal_of_a_wrong_argument_starts_with_the_name_of_the_function_called(case):
    """The convention of update_bn_stats and pin_eval, for every public callable and every argument: the message
    starts with the function's name ("replace_norm: kind='x' is not allowed ..."), so a refusal raised from deep
    inside (a helper, an inner public function) still names the call the user made."""
    fn, kwargs, allowed = CASES[case]
    names = NAMED_AS.get(case, case)
    names = (names,) if isinstance(names, str) else names
    wrong = []
    for param in allowed:
        for value in GARBAGE:
            if allowed[param](value):
                continue
            kw = kwargs()
            kw[param] = value
            try:
                fn(**kw)
            except (TypeError, ValueError) as e:
                if not any(re.match(rf"{re.escape(name)}[:( ]", str(e)) for name in names):
                    wrong.append(f"{param}={value!r}: {type(e).__name__}: {e}")
            except Exception:  # noqa: BLE001 - another kind is test_a_wrong_argument_...'s finding
                pass
    assert not wrong, f"{case}: refusals that do not start with {' or '.join(names)}:\n" + "\n".join(wrong)


def _public_callables():
    names = set(bnstudy.__all__) | set(audit.__all__)
    for mod in (stats, freeze):
        names |= {n for n, obj in vars(mod).items() if not n.startswith("_") and callable(obj)
                  and getattr(obj, "__module__", None) == mod.__name__}
    spaces = (bnstudy, audit, stats, freeze)
    return sorted(n for n in names if callable(next(getattr(s, n) for s in spaces if hasattr(s, n)))
                  and not (isinstance(getattr(audit, n, None), type) and issubclass(getattr(audit, n), Warning)))


def test_every_public_callable_is_covered():
    missing = [n for n in _public_callables() if n not in CASES and n not in EXEMPT]
    assert not missing, f"add these public callables to CASES (or EXEMPT, with the reason): {missing}"


def test_the_trial_instances_name_their_parameter():
    with pytest.raises(TypeError, match="update_bn_stats: batches must be an iterable of batches"):
        stats.update_bn_stats(_model(), None)
    with pytest.raises(TypeError, match="modules must be a qualified module name"):
        _done_audit().assert_frozen(3)
    with pytest.raises(TypeError, match="lint_forward_modes: example must be the model's input"):
        audit.lint_forward_modes(nn.BatchNorm1d(4), "x")
    with pytest.raises(TypeError, match="FreezeAudit: probe must be the model's input"):
        FreezeAudit(nn.BatchNorm1d(4), probe="x")
    with pytest.raises(TypeError, match="update_bn_stats: num_iters must be a positive integer"):
        stats.update_bn_stats(_model(), [X], num_iters="a")
    for first in (None, [X, X], _model()):
        with pytest.raises((TypeError, ValueError), match="dataset_len") as err:
            audit.lint_loader(first)
        assert "got None" not in str(err.value) or first is None
