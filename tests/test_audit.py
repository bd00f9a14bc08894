"""The freeze audit (bnstudy.audit) on the cases of issue 4, plus its own invariants."""

import copy
import warnings
from collections import namedtuple

import pytest
import torch
from torch import nn

from bnstudy import audit
from bnstudy.audit import BNLintWarning, FreezeAudit
from bnstudy.freeze import pin_eval


def _codes(lints):
    return {(x.code, x.layer) for x in lints}


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _batch(n=16, mean=3.0, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g) + mean


# --- Case 1: the naive freeze moves BN buffers; the pinned one moves nothing ------------------------------


def test_naive_freeze_moves_running_mean_and_num_batches_tracked_and_names_the_bn():
    model = _mlp()
    model[0].requires_grad_(False)
    model[1].requires_grad_(False)
    model.train()
    x = _batch()
    with pytest.warns(BNLintWarning, match=r"frozen_bn_in_train_mode\] 1:"):
        with FreezeAudit(model, probe=_batch(5, seed=2)) as a:
            model(x).sum().backward()
    rep = a.report().set_index("tensor")
    # momentum 0.1 from running_mean = 0: the new running_mean is exactly 0.1 * the batch mean.
    batch_mean = model[0](x).mean(0)
    assert torch.allclose(model[1].running_mean, 0.1 * batch_mean, atol=1e-6)
    assert 0.05 < rep.loc["1.running_mean", "max_abs_change"] < 1.0
    assert (rep.loc["1.num_batches_tracked", "before"], rep.loc["1.num_batches_tracked", "after"]) == (0, 1)
    assert rep.loc[["0.weight", "0.bias", "1.weight", "1.bias"], "max_abs_change"].eq(0).all()
    assert set(a.moved(["0", "1"])["tensor"]) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    with pytest.raises(AssertionError, match=r"(?s)'1\.running_mean'.*'1\.num_batches_tracked'"):
        a.assert_frozen(["0", "1"])
    assert a.outputs()["max_abs_change"].max() > 0
    assert a.modes().set_index("module").loc["1", "mode"] == "train"


def test_pinned_freeze_changes_every_buffer_and_probe_output_by_exactly_zero():
    model = _mlp()
    model[0].requires_grad_(False)
    model[1].requires_grad_(False)
    pin_eval(model[1])
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", BNLintWarning)
        with FreezeAudit(model, probe=_batch(5, seed=2)) as a:
            model(_batch()).sum().backward()
    rep = a.report().set_index("tensor")
    assert rep.loc["1.running_mean", "max_abs_change"] == 0
    assert rep.loc["1.num_batches_tracked", "max_abs_change"] == 0
    assert a.outputs()["max_abs_change"].max() == 0
    a.assert_frozen(["0", "1"])  # does not raise
    assert a.modes().set_index("module").loc["1", "stats"] == "running"
    assert not any(x.severity == "warning" for x in a.lints)


# --- Case 3: no_grad does not stop a train-mode BN; eval makes a sample independent of its batch mates ---


def test_no_grad_teacher_in_train_mode_drifts_and_eval_teacher_is_batch_independent():
    student = _mlp()
    student.eval()
    teacher = copy.deepcopy(student).train()
    batches = [_batch(16, mean=m, seed=s) for s, m in enumerate((1.0, 2.0, 3.0))]
    with pytest.warns(BNLintWarning, match="train_mode_under_no_grad"):
        with FreezeAudit(teacher, warn=True) as a, torch.no_grad():
            for x in batches:
                teacher(x)
    assert a.moved("1")["tensor"].tolist() == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert a.report().set_index("tensor").loc["1.num_batches_tracked", "after"] == 3

    frozen = copy.deepcopy(student).eval()
    with FreezeAudit(frozen) as b, torch.no_grad():
        outs = [frozen(torch.cat([batches[0][:1], mates[1:]])) for mates in batches]
    assert b.moved().empty
    assert all(torch.equal(outs[0][0], o[0]) for o in outs[1:])
    teacher2 = copy.deepcopy(student).train()
    with torch.no_grad():
        outs_train = [teacher2(torch.cat([batches[0][:1], mates[1:]])) for mates in batches]
    assert (outs_train[0][0] - outs_train[2][0]).abs().max() > 1e-3


# --- Case 4: 17 samples at batch 16 without drop_last -------------------------------------------------------


def test_last_batch_of_one_is_linted_before_the_run_and_raises_in_train_mode():
    with pytest.warns(BNLintWarning, match="last_batch_single"):
        lints = audit.lint_loader(17, 16, drop_last=False)
    assert ("last_batch_single", "loader") in _codes(lints)
    assert audit.lint_loader(17, 16, drop_last=True, warn=False) == []
    assert audit.lint_loader(18, 16, warn=False)[0].code == "small_last_batch"

    bn = nn.BatchNorm1d(4)
    data = torch.randn(17, 4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=16, drop_last=False)
    with FreezeAudit(bn, warn=False) as a:
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            for (x,) in loader:
                bn(x)
    # The live lint fired before PyTorch raised, and names the layer ("" is the model itself here).
    assert ("single_value_per_channel", "") in _codes(a.lints)


# --- Case 5: track_running_stats=False stays batch-dependent in eval mode ---------------------------------


def test_untracked_bn_is_linted_as_batch_dependent_at_inference_and_raises_on_one_sample():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3, track_running_stats=False)).eval()
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        model(torch.randn(1, 3))
    with pytest.warns(BNLintWarning, match=r"batch_dependent_in_eval\] 1:"):
        lints = audit.lint_model(model)
    assert ("batch_dependent_in_eval", "1") in _codes(lints)
    x = torch.randn(4, 3)
    y_alone, y_mates = model(x[:2]), model(torch.cat([x[:1], x[2:3]]))
    assert not torch.equal(y_alone[0], y_mates[0])  # eval mode, yet the output depends on the batch mate


# --- Case 6: momentum=None is the cumulative average; momentum=0.0 never updates -----------------------------


def test_momentum_none_running_mean_is_the_mean_of_batch_means_and_momentum_zero_never_moves():
    batches = [torch.randn(32, 1) + m for m in (0.0, 2.0, 7.0)]
    cumulative, never = nn.BatchNorm1d(1, momentum=None), nn.BatchNorm1d(1, momentum=0.0)
    for bn in (cumulative, never):
        bn.reset_running_stats()
        bn.train()
        for x in batches:
            bn(x)
    means = torch.stack([x.mean() for x in batches])
    assert abs(float(cumulative.running_mean) - float(means.mean())) < 1e-6
    assert int(cumulative.num_batches_tracked) == 3
    assert float(never.running_mean) == 0.0 and float(never.running_var) == 1.0
    assert int(never.num_batches_tracked) == 3
    with pytest.warns(BNLintWarning, match="momentum_zero"):
        lints = audit.lint_model(nn.Sequential(never))
    assert ("momentum_zero", "0") in _codes(lints)
    info = audit.lint_model(nn.Sequential(cumulative), warn=False)
    assert [(x.code, x.severity) for x in info] == [("momentum_cumulative", "info")]


# --- Case 7: class-sorted batches leave running_mean far from the data mean -----------------------------------


def _class_data():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(10).repeat_interleave(100)
    x = (y.float() + 0.5 * torch.randn(1000, generator=g)).unsqueeze(1)
    return x, y


def _one_epoch(order):
    x, y = _class_data()
    bn = nn.BatchNorm1d(1).train()
    labels = []
    for i in range(0, 1000, 10):
        idx = order[i:i + 10]
        bn(x[idx])
        labels.append(y[idx])
    return float(bn.running_mean), labels, float(x.mean())


def test_class_sorted_loader_biases_running_mean_and_is_linted_while_shuffled_is_not():
    sorted_mean, sorted_labels, data_mean = _one_epoch(torch.arange(1000))
    shuffled_mean, shuffled_labels, _ = _one_epoch(torch.randperm(1000, generator=torch.Generator().manual_seed(1)))
    assert abs(data_mean - 4.5) < 0.05
    assert abs(sorted_mean - 8.5) < 0.1  # the EMA remembers mostly the last classes
    assert abs(shuffled_mean - data_mean) < 0.5
    with pytest.warns(BNLintWarning, match="label_sorted_batches"):
        lints = audit.lint_loader(1000, 10, labels_per_batch=sorted_labels)
    assert ("label_sorted_batches", "loader") in _codes(lints)
    assert audit.lint_loader(1000, 10, labels_per_batch=shuffled_labels, warn=False) == []
    dep_sorted = audit.batch_label_dependence(sorted_labels)["dependence"]
    dep_shuffled = audit.batch_label_dependence(shuffled_labels)["dependence"]
    assert abs(dep_sorted - 1.0) < 1e-9 and abs(dep_shuffled) < 0.05


# --- Case 8: a batch of two in train mode -------------------------------------------------------------------


def test_batch_of_two_normalises_every_value_to_plus_or_minus_one_and_is_linted_as_small():
    bn = nn.BatchNorm1d(4, affine=False).train()
    x = torch.tensor([[0.0, 10.0, -3.0, 100.0], [5.0, -2.0, 4.0, 101.0]])
    y = bn(x)
    assert torch.allclose(y.abs(), torch.ones_like(y), atol=1e-4)  # the input's scale is gone
    assert torch.equal(y[0].sign(), -y[1].sign())
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with pytest.warns(BNLintWarning, match=r"small_batch\] 1: .*batch of 2"):
        lints = audit.lint_model(model, batch_size=2)
    assert ("small_batch", "1") in _codes(lints)
    assert audit.lint_model(model, batch_size=audit.MIN_BATCH, warn=False) == []
    assert ("single_sample_batch", "1") in _codes(audit.lint_model(model, batch_size=1, warn=False))
    pin_eval(model[1])  # a pinned BN never sees batch statistics: nothing to lint
    assert [x for x in audit.lint_model(model, batch_size=2, warn=False) if x.severity == "warning"] == []


def test_single_image_in_bn2d_trains_silently_on_its_own_statistics_and_is_linted():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    with pytest.warns(BNLintWarning, match="single_sample_batch"):
        with FreezeAudit(model) as a:
            y = model(torch.randn(1, 3, 8, 8))
    assert torch.allclose(y.mean((0, 2, 3)), torch.zeros(4), atol=1e-5)  # normalised with its own mean
    assert a.modes().set_index("module").loc["1", "min_batch"] == 1


# --- The audit's own invariants -------------------------------------------------------------------------------


def test_diff_of_an_untouched_model_is_exactly_zero_and_a_one_ulp_change_is_caught():
    model = _mlp()
    before = audit.snapshot(model)
    assert audit.diff(before, audit.snapshot(model))["max_abs_change"].eq(0).all()
    with torch.no_grad():
        model[3].bias[0] = torch.nextafter(model[3].bias[0], torch.tensor(10.0))
    rep = audit.diff(before, audit.snapshot(model))
    assert rep.loc[rep["changed"], "tensor"].tolist() == ["3.bias"]
    assert rep.set_index("tensor").loc["3.bias", "max_abs_change"] > 0


def test_snapshot_lists_a_shared_parameter_under_every_name_and_diff_reports_added_and_removed_tensors():
    lin = nn.Linear(2, 2)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    s = audit.snapshot(model)
    assert list(s.tensors) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # as state_dict(): every alias
    other = audit.snapshot(nn.Sequential(nn.Linear(2, 2)))
    bigger = audit.snapshot(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    status = audit.diff(other, bigger).set_index("tensor")["status"]
    assert status["1.running_mean"] == "added"
    assert audit.diff(bigger, other).set_index("tensor").loc["1.running_mean", "status"] == "removed"
    with pytest.raises(TypeError, match="before must be a Snapshot"):
        audit.diff({}, s)


def test_probe_runs_in_eval_mode_writes_no_buffer_and_restores_every_flag():
    model = _mlp().train()
    pin_eval(model[3])
    flags = [m.training for m in model.modules()]
    before = audit.snapshot(model)
    out = audit.probe_outputs(model, _batch(4))
    assert audit.diff(before, audit.snapshot(model))["max_abs_change"].eq(0).all()
    assert [m.training for m in model.modules()] == flags
    assert torch.equal(out[""], model.eval()(_batch(4)).detach())


def test_modes_list_stateless_norms_as_per_sample_and_dropout_off_in_a_grad_step_is_linted():
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.GroupNorm(2, 6), nn.Dropout(0.5), nn.Linear(6, 2))
    model.eval()
    with pytest.warns(BNLintWarning, match=r"dropout_off_in_training\] 3:"):
        with FreezeAudit(model) as a:
            model(torch.randn(3, 4)).sum().backward()
    modes = a.modes().set_index("module")
    assert modes.loc["1", "kind"] == "stateless_norm" and modes.loc["1", "stats"] == "per-sample"
    assert modes.loc["2", "stats"] == "per-sample"
    assert modes.loc["3", "mode"] == "eval"
    # Dropout inside a frozen, pinned block is the point of the freeze, not a trap.
    frozen_block = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5)).requires_grad_(False)
    model = nn.Sequential(pin_eval(frozen_block), nn.Linear(6, 2))
    model.train()
    with FreezeAudit(model, warn=False) as b:
        model(torch.randn(3, 4)).sum().backward()
    assert b.modes().set_index("module").loc["0.1", "mode"] == "eval"
    assert "dropout_off_in_training" not in {x.code for x in b.lints}


AuxOutputs = namedtuple("AuxOutputs", "logits aux_logits")


class _AuxNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.drop = nn.Linear(4, 4), nn.Dropout(0.2)
        self.head, self.aux = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        h = self.drop(self.body(x))
        return AuxOutputs(self.head(h), self.aux(h)) if self.training else self.head(h)


def test_forward_that_changes_structure_with_mode_is_linted_and_recorded():
    model = _AuxNet()
    before = audit.snapshot(model)
    with pytest.warns(BNLintWarning, match="forward_changes_with_mode"):
        lints = audit.lint_forward_modes(model, torch.randn(3, 4))
    assert {x.code for x in lints} == {"forward_changes_with_mode", "dropout_present"}
    assert audit.diff(before, audit.snapshot(model))["max_abs_change"].eq(0).all()
    assert audit.output_signature(model.train()(torch.randn(2, 4))) == "AuxOutputs(logits, aux_logits)"
    with FreezeAudit(model.eval(), warn=False) as a:
        model(torch.randn(3, 4)).sum().backward()
    assert list(a.output_signatures) == ["Tensor (eval mode)"]
    assert a.moved()["tensor"].tolist() == []  # no optimizer here: nothing moved, the aux head saw no gradient
    assert model.aux.weight.grad is None


def test_assert_frozen_passes_on_exact_equality_and_rejects_unknown_modules_and_bad_arguments():
    # A real optimizer step on the head, with the frozen part pinned: the frozen part passes exactly,
    # the whole model does not (the head moved), so the check can fail.
    model = _mlp()
    model[0].requires_grad_(False)
    model[1].requires_grad_(False)
    pin_eval(model[1])
    model.train()
    opt = torch.optim.SGD(model[3].parameters(), lr=0.1)
    with FreezeAudit(model, probe=_batch(4), warn=False) as a:
        model(_batch()).pow(2).sum().backward()
        opt.step()
    a.assert_frozen(["0", "1"])
    a.assert_frozen([model[0], model[1]])
    with pytest.raises(AssertionError, match=r"param '3\.weight'"):
        a.assert_frozen()
    assert "moved: 2 tensors (2 parameters, 0 buffers)" in str(a)
    with pytest.raises(ValueError, match="modules='backbone' is not a module"):
        a.assert_frozen("backbone")
    with pytest.raises(ValueError, match="tol must be a finite number >= 0"):
        a.moved(tol=-1.0)
    with pytest.raises(ValueError, match="min_batch must be a positive integer"):
        FreezeAudit(model, min_batch=0)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        audit.lint_loader(10, 0)
    with pytest.raises(ValueError, match="max_dependence must be a finite number >= 0.0 and <= 1.0"):
        audit.lint_loader(10, 2, max_dependence=2.0)
    with pytest.raises(RuntimeError, match="no result yet"):
        FreezeAudit(model).report()


class _MyBN(nn.BatchNorm1d):
    """A user's BatchNorm subclass: the audit must treat it as a BatchNorm."""


def test_modes_cover_syncbatchnorm_bn_subclasses_and_frozen_batchnorm():
    from bnstudy.freeze import FrozenBatchNorm
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.SyncBatchNorm(4), nn.Flatten(1), nn.Linear(4 * 2 * 2, 3),
                          _MyBN(3), FrozenBatchNorm(3, source_class=nn.BatchNorm1d)).eval()
    with FreezeAudit(model, warn=False) as a:
        model(torch.randn(5, 3, 2, 2))
    modes = a.modes().set_index("module")
    assert modes.loc[["1", "4", "5"], "kind"].tolist() == ["batchnorm", "batchnorm", "frozen_batchnorm"]
    assert (modes.loc[["1", "4", "5"], "stats"] == "running").all()
    model.train()
    with FreezeAudit(model, warn=False) as b:
        model(torch.randn(5, 3, 2, 2))
    modes = b.modes().set_index("module")
    assert modes.loc[["1", "4", "5"], "stats"].tolist() == ["batch", "batch", "running"]
    assert set(b.moved()["tensor"]) >= {"1.running_mean", "4.running_mean"}
    assert not b.moved("5").shape[0]


def test_lint_loader_rejects_labels_not_given_per_batch():
    import torch
    from bnstudy.audit import lint_loader
    flat = torch.arange(4).repeat_interleave(16)
    with pytest.raises(ValueError, match="one sequence of labels per batch"):
        lint_loader(64, 16, labels_per_batch=flat, warn=False)
    with pytest.raises(ValueError, match="1-D integer class labels"):
        lint_loader(64, 16, labels_per_batch=[torch.eye(4)] * 4, warn=False)
    codes = [l.code for l in lint_loader(64, 16, labels_per_batch=flat.reshape(4, 16), warn=False)]
    assert codes == ["label_sorted_batches"]


def test_lint_loader_flags_a_dataset_of_one_sample():
    from bnstudy.audit import lint_loader
    assert [l.code for l in lint_loader(1, 16, warn=False)] == ["last_batch_single"]
