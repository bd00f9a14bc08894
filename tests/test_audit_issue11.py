"""Issue 11: each kind of fault, its given instance as a test with its expected value."""

import copy
import pickle
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

from bnstudy import audit, freeze, norms
from bnstudy.study import modes
from bnstudy.audit import FreezeAudit
from bnstudy.freeze import FrozenBatchNorm, is_pinned, pin_eval, pin_norm_eval
from bnstudy.running_stats import compare_statistics, precise_bn_statistics, update_bn_stats


def _codes(lints, severity=None):
    return {(x.code, x.layer) for x in lints if severity is None or x.severity == severity}


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _x(n=16, seed=1, mean=2.0):
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(seed)) + mean


def _hooks(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


# --- Kind 1: copies of an audited or pinned model ------------------------------------------------------------

def test_deepcopy_averagedmodel_and_replica_inside_the_audit_run_and_carry_no_hook():
    model = _net().train()
    with FreezeAudit(model, probe=_x(4), warn=False) as a:
        teacher = copy.deepcopy(model)                          # raised KeyError before
        ema = torch.optim.swa_utils.AveragedModel(model)        # deep-copies too
        replica = model._replicate_for_data_parallel()          # DataParallel's shallow replica
        teacher(_x()); ema(_x()); replica(_x()); model(_x())
        ema.update_parameters(model)
        blob = pickle.dumps(model)
    assert _hooks(model) == _hooks(teacher) == _hooks(ema) == _hooks(pickle.loads(blob)) == 0
    assert a.modes().set_index("module").loc["1", "calls"] == 2  # the model's own layer: replica shares it
    assert a.model_calls == 1


def test_pins_survive_deepcopy_and_pickle_and_sync_bn_conversion_keeps_them_or_the_audit_reports_the_loss():
    model = _net()
    pin_eval(model[1])
    for copy_ in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        copy_.train()
        assert is_pinned(copy_[1]) and not copy_[1].training and copy_[0].training
    kept = freeze.convert_sync_batchnorm(copy.deepcopy(model))
    kept.train()
    assert isinstance(kept[1], nn.SyncBatchNorm) and is_pinned(kept[1]) and not kept[1].training
    with FreezeAudit(model, warn=False) as a:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # torch's own conversion drops the pin
    assert ("pin_lost", "1") in _codes(a.lints)


# --- Kind 2: flags against buffers; the whole matrix against what torch computes --------------------------

def test_flag_set_after_construction_is_judged_by_the_buffers():
    bn = nn.BatchNorm1d(2, track_running_stats=False)
    bn.track_running_stats = True
    model = nn.Sequential(nn.Linear(2, 2), bn)
    assert ("batch_dependent_in_eval", "1") in _codes(audit.lint_model(model, warn=False))
    with FreezeAudit(model, warn=False) as a:
        model(_x(8)[:, :2])
    assert not a.modes().set_index("module").loc["1", "updated_running_stats"]
    with pytest.raises(ValueError, match="no running_mean/running_var buffers \\(its track_running_stats flag is True"):
        FrozenBatchNorm.from_batchnorm(bn)
    with pytest.raises(ValueError, match="no BatchNorm layer with running_mean/running_var"):
        precise_bn_statistics(model, [_x(8)[:, :2]])   # AttributeError before


MATRIX = [(cls, training, track, buffers, momentum)
          for cls in (nn.BatchNorm1d, nn.InstanceNorm1d)
          for training in (True, False) for track in (True, False) for buffers in (True, False)
          for momentum in (0.1, 0.0, None)]


@pytest.mark.parametrize("cls,training,track,buffers,momentum", MATRIX)
def test_norms_rules_match_what_torch_computes(cls, training, track, buffers, momentum):
    torch.manual_seed(0)
    m = cls(3, affine=True, track_running_stats=buffers, momentum=momentum)
    if buffers:
        with torch.no_grad():
            m.running_mean.fill_(0.5)
            m.running_var.fill_(2.0)
    m.track_running_stats = track
    m.train(training)
    x = torch.randn(6, 3, 5) * 3 + 1
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m2 = copy.deepcopy(m)
    try:
        y = m(x)
    except (RuntimeError, ValueError, AssertionError):
        assert cls is nn.InstanceNorm1d and not training and track and not buffers
        return
    after = m.state_dict()
    changed = any(not torch.equal(before[k], after[k]) for k in before)
    stats_changed = any(not torch.equal(before[k], after[k]) for k in ("running_mean", "running_var") if k in before)
    assert norms.changes_buffers(m) == changed
    assert norms.changes_running_stats(m) == stats_changed
    # batch-mate dependence: the first sample's output with other batch mates
    other = torch.cat([x[:1], torch.randn(5, 3, 5) * 7 - 4])
    depends = not torch.allclose(m2(other)[0], y[0], atol=1e-5)
    assert norms.batch_dependent(m) == depends
    src = norms.statistics_source(m)
    if src == "running":
        ref = (x - m.running_mean[None, :, None]) / torch.sqrt(m.running_var[None, :, None] + m.eps)
        ref = ref * m.weight[None, :, None] + m.bias[None, :, None]
        assert torch.allclose(y, ref, atol=1e-5)


# --- Kind 3: norm layers other than BatchNorm that keep running statistics -----------------------------------

def test_tracked_instancenorm_in_a_frozen_train_mode_backbone_is_linted_and_its_move_audited():
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4, affine=True, track_running_stats=True))
    backbone.requires_grad_(False)
    backbone.train()
    with FreezeAudit(backbone, warn=False) as a:
        backbone(torch.randn(2, 3, 8, 8))
    assert ("frozen_bn_in_train_mode", "1") in _codes(a.lints)
    assert set(a.moved("1")["name"]) == {"running_mean", "running_var"}
    assert a.modes().set_index("module").loc["1", "updated_running_stats"]
    with pytest.raises(ValueError, match="InstanceNorm is not converted: pin it"):
        FrozenBatchNorm.from_batchnorm(backbone[1])
    freeze.freeze_modules(backbone, whole_model=True)
    assert is_pinned(backbone[1]) and not backbone.train()[1].training


@pytest.mark.parametrize("make", [lambda: nn.BatchNorm3d(3), lambda: nn.SyncBatchNorm(3),
                                  lambda: nn.LazyBatchNorm1d(), lambda: _ThirdParty(3)])
def test_every_layer_keeping_statistics_is_linted_audited_and_converted(make):
    layer = make()
    x = torch.randn(4, 3, 2, 2, 2) if isinstance(layer, nn.BatchNorm3d) else torch.randn(4, 3)
    layer.train()(x)  # initialises the lazy layer
    layer.requires_grad_(False)
    model = nn.Sequential(layer)
    assert ("frozen_bn_in_train_mode", "0") in _codes(audit.lint_model(model, warn=False))
    with FreezeAudit(model, warn=False) as a:
        model(x)
    assert a.modes().set_index("module").loc["0", "kind"] == "batchnorm"
    assert {"running_mean", "running_var"} <= set(a.moved("0")["name"])
    frozen = freeze.freeze_batchnorm(copy.deepcopy(model)).eval()
    assert isinstance(frozen[0], FrozenBatchNorm)
    assert torch.equal(frozen(x), model.eval()(x))


class _ThirdParty(torch.nn.modules.batchnorm._NormBase):
    def forward(self, x):
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                        self.training, self.momentum, self.eps)


# --- Kind 4: statistics settings that cannot describe the data ------------------------------------------------

def test_tensorflow_momentum_is_linted_with_the_convention_explained():
    lints = audit.lint_model(nn.Sequential(nn.BatchNorm1d(3, momentum=0.99)), warn=False)
    (lint,) = [x for x in lints if x.code == "momentum_high"]
    assert lint.severity == "warning" and "Keras's 0.99 is PyTorch's 0.01" in lint.message
    assert [x.code for x in audit.lint_model(nn.Sequential(nn.BatchNorm1d(3, momentum=1.5)), warn=False)] == [
        "momentum_invalid"]
    assert audit.lint_model(nn.Sequential(nn.BatchNorm1d(3, momentum=0.1)), warn=False) == []


def test_cumulative_momentum_wording_is_true_in_every_buffer_state():
    def only(bn):
        (x,) = audit.lint_model(nn.Sequential(bn), warn=False)
        return x
    fresh = only(nn.BatchNorm1d(3, momentum=None))
    assert fresh.code == "momentum_cumulative" and "hold the reset values" in fresh.message
    loaded = nn.BatchNorm1d(3, momentum=None)
    sd = {k: v for k, v in nn.BatchNorm1d(3).state_dict().items() if k != "num_batches_tracked"}
    sd["running_mean"] = torch.full((3,), 4.0)
    loaded.load_state_dict(sd, strict=False)
    lint = only(loaded)
    assert (lint.code, lint.severity) == ("cumulative_overwrites_loaded", "warning")
    assert "0 batches" not in lint.message and "replaces them entirely" in lint.message
    bn = nn.BatchNorm1d(3, momentum=None)
    for _ in range(5):
        bn(torch.randn(8, 3))
    assert "average of the 5 batches" in only(bn).message and "weight 1/6" in only(bn).message


# --- Kind 5: call accounting ------------------------------------------------------------------------------------

@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_double_update_is_flagged_and_counted(reentrant):
    block = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    model = nn.Sequential(block, nn.Linear(8, 1))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model[1](checkpoint(self.model[0], x, use_reentrant=reentrant))
    net = Net().train()
    with FreezeAudit(net, warn=False) as a:
        for i in range(5):
            net(_x(8, seed=i).requires_grad_(reentrant)).sum().backward()
    row = a.modes().set_index("module").loc["model.0.1"]
    assert (a.model_calls, row["calls"], row["calls_per_model_call"], row["backward_writes"]) == (5, 10, 2.0, 5)
    assert int(net.model[0][1].num_batches_tracked) == 10
    assert ("double_update", "model.0.1") in _codes(a.lints, "warning")


# --- Kind 6: estimators with side effects -------------------------------------------------------------------------

def test_precise_bn_runs_with_dropout_off_and_matches_what_eval_mode_sees():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Dropout(0.5), nn.BatchNorm1d(4))
    xs = [torch.randn(256, 4) * 2 for _ in range(8)]
    mean, var = precise_bn_statistics(model, xs)["1"]
    expected = torch.cat(xs).var(0)  # the unbiased variance of every value pooled (torch's convention for running_var)
    assert torch.allclose(var, expected, rtol=1e-5)        # was about 2.56x with dropout on
    assert model[0].training  # flags restored


def test_update_bn_resets_a_pinned_layer_which_is_linted_and_update_bn_stats_re_estimates_it():
    model = _net()
    for i in range(20):
        model.train()(_x(seed=i))
    with torch.no_grad():
        model[1].weight.mul_(1.5)
    pin_eval(model[1])
    torch.optim.swa_utils.update_bn([_x(seed=i) for i in range(3)], model)
    assert torch.equal(model[1].running_mean, torch.zeros(8)) and torch.equal(model[1].running_var, torch.ones(8))
    assert ("reset_stats_pinned", "1") in _codes(audit.lint_model(model, warn=False), "warning")
    with pytest.warns(UserWarning, match="pinned in eval mode by pin_eval"):
        calls = update_bn_stats(model, [_x(seed=i) for i in range(3)])
    assert calls == {"1": 3} and is_pinned(model[1]) and not model[1].training
    assert not (model[1].running_mean == 0).all()
    assert "reset_stats_pinned" not in {x.code for x in audit.lint_model(model, warn=False)}


# --- Kind 7: a copy whose statistics do not follow its weights ------------------------------------------------------

def test_compare_statistics_names_the_stale_layer_of_an_ema_copy_and_against_data():
    model = _net().train()
    ema = copy.deepcopy(model)  # an EMA utility that averages parameters and never copies buffers
    for i in range(30):
        model(_x(seed=i, mean=3.0))
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), model.parameters()):
                pe.mul_(0.9).add_(0.1 * p)
    df = compare_statistics(model, torch.optim.swa_utils.AveragedModel(ema))  # matched through "module."
    assert list(df.loc[~df.agrees, "layer"]) == ["1"]
    assert compare_statistics(model, copy.deepcopy(model)).agrees.all()
    loader = DataLoader(TensorDataset(torch.cat([_x(seed=i, mean=3.0) for i in range(8)]), torch.zeros(128)),
                        batch_size=16)
    assert not compare_statistics(ema, loader).agrees.any()
    update_bn_stats(model, loader)  # AdaBN on that data: now it agrees exactly
    assert compare_statistics(model, loader, tol=1e-6).agrees.all()


# --- Usability ------------------------------------------------------------------------------------------------------

def _deep(n_layers=40):
    torch.manual_seed(0)
    layers = []
    for _ in range(n_layers):
        layers += [nn.Linear(8, 8), nn.BatchNorm1d(8)]
    m = nn.Sequential(nn.Sequential(*layers), nn.Linear(8, 2))
    m[0].requires_grad_(False)
    return m.train()


def test_forty_identical_findings_print_as_one_short_wrapped_report():
    model = _deep()
    with FreezeAudit(model, warn=False) as a:
        model(torch.randn(16, 8))
    text = str(a)
    assert len(text.splitlines()) < 40 and max(map(len, text.splitlines())) <= 100
    assert "[frozen_bn_in_train_mode] 40 layers" in text
    with pytest.raises(AssertionError) as e:
        a.assert_frozen("0")
    assert max(map(len, str(e.value).splitlines())) < 200 and "and 100 more" in str(e.value)
    assert "FreezeAudit of Sequential" in a._repr_html_() and "`frozen_bn_in_train_mode`" in a._repr_markdown_()


def test_assert_frozen_takes_module_objects_and_judges_the_named_module_by_default():
    model = _net()
    model[0].requires_grad_(False)
    model[1].requires_grad_(False)
    pin_eval(model[1])
    opt = torch.optim.SGD(model[3].parameters(), lr=0.5)
    with FreezeAudit(model, probe=_x(4, seed=9), warn=False) as a:
        for i in range(3):
            model(_x(seed=i)).pow(2).sum().backward()
            opt.step()
    a.assert_frozen(model[1])                      # "is not a module of the model" before
    a.assert_frozen(["0", "1"])                    # their own outputs, not the whole model's
    with pytest.raises(AssertionError, match="probe output"):
        a.assert_frozen()


def test_one_forward_convention_and_the_old_one_is_deprecated():
    model = _net()
    assert audit.lint_forward_modes(model, _x(4), forward=model[0], warn=False) == []
    with pytest.warns(DeprecationWarning, match=r"forward\(model, example\) is deprecated"):
        audit.lint_forward_modes(model, _x(4), forward=lambda m, x: m(x), warn=False)
    before = copy.deepcopy(model.state_dict())
    audit.lint_forward_modes(model, _x(4), warn=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_loaders_of_tuples_and_dicts_work_everywhere():
    model = _net()
    xs = torch.cat([_x(seed=i) for i in range(4)])
    pairs = DataLoader(TensorDataset(xs, torch.arange(64) % 2), batch_size=16)
    dicts = [{"x": xs[i:i + 16], "label": torch.zeros(16)} for i in range(0, 64, 16)]
    a = precise_bn_statistics(model, pairs)["1"][0]
    b = precise_bn_statistics(model, dicts)["1"][0]
    c = precise_bn_statistics(model, [xs[i:i + 16] for i in range(0, 64, 16)])["1"][0]
    assert torch.equal(a, b) and torch.equal(a, c)
    from bnstudy.running_stats import statistics_mismatch
    assert statistics_mismatch(model, pairs)["1"] >= 0
    with pytest.raises(TypeError, match="keys \\['inp'\\]"):
        precise_bn_statistics(model, [{"inp": xs}])
    loader = DataLoader(TensorDataset(xs[:49], torch.arange(49) // 7), batch_size=16)
    assert _codes(audit.lint_loader(loader, warn=False, scan_labels=True)) == {
        ("last_batch_single", "loader"), ("label_sorted_batches", "loader")}


def test_freeze_mode_apply_needs_a_backbone_head_pair_and_says_so():
    with pytest.raises(TypeError, match="TransferModel\\(backbone, head_a, head_b\\)"):
        modes.MODES["backbone_eval"].apply(_net())
    m = modes.TransferModel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), nn.Linear(4, 2), nn.Linear(4, 3))
    modes.MODES["separate_stats"].apply(m)
    assert modes.MODES["separate_stats"].buffers_may_change == ("backbone_b", "head_b")
    assert modes.MODES["train_mode"].backbone_stats == "batch"


def test_pin_eval_switches_dropout_off_and_pin_norm_eval_leaves_it_and_the_affine_trainable():
    a = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    b = copy.deepcopy(a)
    pin_eval(a).train()
    pin_norm_eval(b)
    b.train()
    assert not a[2].training and b[2].training and not b[1].training
    assert b[1].weight.requires_grad
    assert "Dropout included" in pin_eval.__doc__ and "Keras" in pin_norm_eval.__doc__
