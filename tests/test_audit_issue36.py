"""Issue 36, the audit's half: handed cases 4-7, each a test holding its right value, with property tests that
compare the lints' verdicts with what torch actually did; and what a user types naturally (a Sequential slice, the
summary's pointers without pandas, the probe line that says whose output it is)."""

from __future__ import annotations

import copy
import sys
import warnings

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

from bnstudy import freeze
from bnstudy.audit import MAX_INIT_WEIGHT, FreezeAudit, lint_model
from bnstudy.freeze import pin_eval, pin_norm_eval

_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _codes(lints) -> set:
    return {(x.code, x.layer) for x in lints}


def _warnings(lints, code: str) -> list:
    return [x for x in lints if x.code == code and x.severity == "warning"]


def _backbone_net(affine: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=affine), nn.ReLU())
    model.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    model.train()
    for i in range(40):  # estimated statistics: far from mean 0 / variance 1
        model(torch.randn(16, 3, 8, 8) + 3)
    return model


# --- case 4: torch's convert_sync_batchnorm drops a pin_norm_eval pin; the affine trains ----------------------------

def test_case4_torchs_convert_sync_batchnorm_drops_a_norm_eval_pin_with_trainable_affine_and_the_lint_says_so():
    model = _backbone_net()
    pin_norm_eval(model.backbone)  # mmcv's norm_eval: statistics pinned, affine still trained
    assert not _warnings(lint_model(model, warn=False), "eval_undone_by_train")
    kept = freeze.convert_sync_batchnorm(copy.deepcopy(model))  # the library's conversion keeps the pin
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(model.backbone[1], nn.SyncBatchNorm) and model.backbone[1].weight.requires_grad
    (lint,) = _warnings(lint_model(model, warn=False), "eval_undone_by_train")
    assert lint.layer == "backbone.1" and "convert_sync_batchnorm copies the eval flag" in lint.message
    assert not _warnings(lint_model(kept, warn=False), "eval_undone_by_train")
    before = model.backbone[1].running_mean.clone()
    with FreezeAudit(model, warn=False) as audit:  # the training loop that follows
        model.train()
        model(torch.randn(16, 3, 8, 8))
    assert ("eval_undone_by_train", "backbone.1") in _codes(audit.lints)  # fired on entry, before it moved
    assert not torch.equal(model.backbone[1].running_mean, before)      # and torch did move the statistics
    kept_before = kept.backbone[1].running_mean.clone()
    with FreezeAudit(kept, warn=False) as audit_kept:
        kept.train()
        kept(torch.randn(16, 3, 8, 8))
    assert torch.equal(kept.backbone[1].running_mean, kept_before) and not audit_kept.lints


@st.composite
def _mode_trees(draw):
    """A two-level tree of BatchNorm layers in blocks, each module's train flag and pin drawn independently."""
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        layers = [nn.BatchNorm1d(2) for _ in range(draw(st.integers(1, 3)))]
        blocks.append(nn.Sequential(nn.Linear(2, 2), *[m for bn in layers for m in (bn, nn.Identity())]))
    model = nn.Sequential(*blocks)
    for m in model.modules():
        m.training = draw(st.booleans())
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d) and draw(st.integers(0, 3)) == 0:
            pin_eval(m)
    return model


@_SETTINGS
@given(_mode_trees())
def test_eval_undone_by_train_fires_exactly_where_torchs_train_call_puts_an_eval_layer_under_a_training_parent(model):
    flagged = {x.layer for x in lint_model(model, warn=False) if x.code == "eval_undone_by_train"}
    parents = {id(c): p for p in model.modules() for c in p.children()}
    after = copy.deepcopy(model).train()  # what torch does at the next model.train()
    for (name, m), (_, m_after) in zip(model.named_modules(), after.named_modules()):
        if not isinstance(m, nn.BatchNorm1d):
            continue
        undone = not m.training and parents[id(m)].training and m_after.training
        assert (name in flagged) == undone, name
        if undone:  # and its statistics do move in the forward that follows
            before = m_after.running_mean.clone()
            m_after(torch.randn(8, 2) + 3)
            assert not torch.equal(m_after.running_mean, before)


# --- case 5: affine=False in a backbone frozen with requires_grad_(False), left in train mode -----------------------

def test_case5_affine_free_batchnorm_in_a_frozen_part_left_in_train_mode_is_linted_and_its_statistics_move():
    flat = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False), nn.Flatten(), nn.Linear(4 * 36, 2))
    flat[0].requires_grad_(False)  # the backbone is the first two layers of a flat model
    (lint,) = _warnings(lint_model(flat, warn=False), "frozen_bn_in_train_mode")
    assert lint.layer == "1" and "registered before it" in lint.message and "'0'" in lint.message
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False)).requires_grad_(False)
    (lint,) = _warnings(lint_model(backbone, warn=False), "frozen_bn_in_train_mode")  # audited alone: the model
    assert lint.layer == "1" and "every parameter of '(model)'" in lint.message
    before = flat[1].running_mean.clone()
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(5)) + 2
    with torch.no_grad():
        batch_mean = flat[0](x).mean((0, 2, 3))  # what the frozen conv feeds the BN: its statistics must not move
    with FreezeAudit(flat, warn=False) as audit:
        flat.train()(x)
    assert ("frozen_bn_in_train_mode", "1") in _codes(audit.lints)
    # torch moved them anyway, by momentum x the batch mean (the conv's random init sets its size, not the test)
    assert torch.allclose(flat[1].running_mean - before, 0.1 * batch_mean, atol=1e-6) and batch_mean.abs().max() > 0
    trained = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False), nn.Flatten(), nn.Linear(4 * 36, 2))
    assert not _warnings(lint_model(trained, warn=False), "frozen_bn_in_train_mode")  # nothing frozen: silent


@_SETTINGS
@given(st.lists(st.booleans(), min_size=1, max_size=5))
def test_affine_free_verdict_matches_which_layers_get_no_gradient_in_torch(frozen):
    """A chain Linear, BatchNorm1d(affine=False), ... with some Linear layers frozen: a BatchNorm is linted exactly
    when no parameter before it in the chain receives a gradient from torch's backward, i.e. it normalises the
    output of a frozen part (and train mode moves its statistics)."""
    layers = []
    for f in frozen:
        lin = nn.Linear(3, 3).requires_grad_(not f)
        layers += [lin, nn.BatchNorm1d(3, affine=False)]
    model = nn.Sequential(*layers, nn.Linear(3, 1))
    flagged = {x.layer for x in _warnings(lint_model(model, warn=False), "frozen_bn_in_train_mode")}
    model.train()(torch.randn(8, 3)).sum().backward()
    for i in range(len(frozen)):
        upstream = [p for layer in layers[:2 * i + 1] for p in layer.parameters()]
        no_gradient = all(p.grad is None for p in upstream)
        assert (str(2 * i + 1) in flagged) == no_gradient, (frozen, flagged)
        assert int(layers[2 * i + 1].num_batches_tracked) == 1  # the statistics moved, frozen or not


# --- case 6: torch.optim.swa_utils.update_bn on a model whose backbone is pinned ----------------------------------

def _loader():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 3, 8, 8, generator=g) + 3, torch.zeros(16)) for _ in range(3)]


def test_case6_update_bn_on_a_pinned_backbone_leaves_mean_0_variance_1_and_the_audit_names_it():
    model = _backbone_net()
    pin_eval(model.backbone)
    with FreezeAudit(model, warn=False) as audit:
        torch.optim.swa_utils.update_bn(_loader(), model)
    bn = model.backbone[1]
    assert torch.equal(bn.running_mean, torch.zeros(4)) and torch.equal(bn.running_var, torch.ones(4))
    assert ("reset_stats_pinned", "backbone.1") in _codes(_warnings(audit.lints, "reset_stats_pinned"))
    assert "[reset_stats_pinned] backbone.1" in str(audit)


def test_case6_update_bn_on_an_averaged_copy_with_a_pinned_backbone_is_shown_by_the_audit_of_the_model():
    model = _backbone_net()
    pin_eval(model.backbone)
    swa = torch.optim.swa_utils.AveragedModel(model)  # the usual SWA call: update_bn on the copy
    estimate = model.backbone[1].running_var.clone()
    with FreezeAudit(model, warn=False) as audit:
        torch.optim.swa_utils.update_bn(_loader(), swa)
    bn = swa.module.backbone[1]
    assert torch.equal(bn.running_mean, torch.zeros(4)) and torch.equal(bn.running_var, torch.ones(4))
    assert torch.equal(model.backbone[1].running_var, estimate) and not torch.equal(estimate, torch.ones(4))
    (lint,) = _warnings(audit.lints, "reset_stats_pinned")
    assert lint.layer == "AveragedModel:module.backbone.1"
    assert "a copy of the model's 'backbone.1', whose statistics are estimated" in lint.message
    text = str(audit)
    assert "outside the model, 1 norm layer normalised with reset statistics mean 0 / variance 1" in text
    assert "module.backbone.1 (AveragedModel)" in text
    assert audit.elsewhere().empty  # nothing was written outside the model: a read, not a write


def test_a_freshly_built_teacher_in_eval_mode_is_not_taken_for_a_reset_copy():
    model = _backbone_net()
    teacher = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()  # fresh: affine 1 / 0
    with FreezeAudit(model, warn=False) as audit:
        teacher(torch.randn(4, 3, 8, 8))
    assert not audit.lints


# --- case 7: five train-mode updates at momentum 0.1 after a reset --------------------------------------------------

def test_case7_five_updates_after_a_reset_read_2_07_for_a_data_mean_of_5_and_lint_model_says_59_percent():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Identity(), nn.BatchNorm1d(1))
    model[1].reset_running_stats()
    model.train()
    for _ in range(5):
        model(torch.randn(64, 1) + 5.0)
    estimate = float(model[1].running_mean)
    assert round(estimate, 2) == 2.07  # the data's mean is 5.0; 5 x (1 - 0.9^5) = 2.05 without sampling noise
    for mode in ("train", "eval"):  # training on, and about to evaluate
        getattr(model, mode)()
        (lint,) = _warnings(lint_model(model, warn=False), "stats_near_init")
        assert lint.layer == "1" and "(1 - 0.1)^5 = 59%" in lint.message and "29 updates" in lint.message
    assert MAX_INIT_WEIGHT == 0.05


@_SETTINGS
@given(momentum=st.floats(0.01, 0.9), n=st.integers(1, 80), mean=st.floats(1.0, 50.0))
def test_stats_near_init_fires_exactly_when_torchs_own_statistics_still_hold_more_than_5_percent_reset(
        momentum, n, mean):
    bn = nn.BatchNorm1d(1, momentum=momentum).double().train()
    for _ in range(n):
        bn(torch.tensor([[mean - 1.0], [mean + 1.0]], dtype=torch.float64))  # batch mean exactly `mean`
    share = 1 - float(bn.running_mean) / mean  # the reset value's weight, as torch's buffer shows it
    assume(abs(share - MAX_INIT_WEIGHT) > 1e-9)
    fired = bool(_warnings(lint_model(nn.Sequential(bn), warn=False), "stats_near_init"))
    assert fired == (share > MAX_INIT_WEIGHT), (share, n, momentum)


# --- what a user types naturally ---------------------------------------------------------------------------------

def _slice_audit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model[:3].requires_grad_(False)
    with FreezeAudit(model, probe=torch.randn(16, 4), warn=False) as audit:
        model.train()(torch.randn(16, 4))
    return model, audit


def test_assert_frozen_on_a_sequential_slice_judges_the_layers_it_holds():
    model, audit = _slice_audit()
    with pytest.raises(AssertionError, match=r"'0', '1', '2' are not frozen; 4 moved") as err:
        audit.assert_frozen(model[:3])
    assert "'1.running_mean'" in str(err.value)
    audit.assert_frozen(model[3:])  # the head's layer did not move (no optimizer step)
    with pytest.raises(ValueError, match="not a module of the model"):
        audit.assert_frozen(nn.Sequential(nn.Linear(4, 8)))  # a container of other layers is still refused


def test_the_summary_points_to_a_pandas_free_listing_and_it_works_without_pandas(monkeypatch):
    model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(4, 4), nn.BatchNorm1d(4))])
    with FreezeAudit(model, warn=False) as audit:
        model.train()(torch.randn(16, 4))
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now raises ImportError
    text = audit.summary()
    (pointer,) = [line for line in text.splitlines() if line.strip().startswith("... ") and "more (" in line]
    assert "audit.summary(details=True)" in pointer and "needs pandas" in pointer
    assert len(audit.summary(details=True).splitlines()) > len(text.splitlines())
    with pytest.raises(ImportError, match="pip install pandas"):
        audit.moved()


def test_the_probe_line_shows_the_frozen_parts_own_output_first_and_says_it_is_the_whole_model_with_its_head():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
    model.head = nn.Linear(8, 2)
    model.backbone.requires_grad_(False)
    pin_eval(model.backbone)  # correctly frozen
    opt = torch.optim.SGD(model.head.parameters(), lr=0.5)
    with FreezeAudit(model, probe=torch.randn(16, 4), warn=False) as audit:
        model.train()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
    lines = str(audit).splitlines()
    frozen = next(i for i, s in enumerate(lines) if s.startswith("  frozen part 'backbone'"))
    whole = next(i for i, s in enumerate(lines) if s.startswith("  probe outputs ("))
    assert frozen < whole
    assert lines[frozen].endswith("its own output on the probe: max |change| 0 (bit-identical)")
    assert "the whole model's output, incl. the parts that train: 'head'" in lines[whole]
    assert float(audit.outputs()["max_abs_change"].max()) > 0  # the head trained: the whole output moved


# --- kinds with further instances: a model exported with torch.export while in train mode -------------------------

def test_a_model_exported_in_train_mode_is_refused_with_what_its_graph_does_and_torch_does_write_at_inference():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    exported = torch.export.export(model, (torch.randn(8, 4),)).module()
    for call in (lambda: lint_model(exported, warn=False), lambda: FreezeAudit(exported)):
        with pytest.raises(TypeError, match=r"exported in train mode \(1 batch_norm call with training=True\)"
                                            r": .*overwrites '1.running_mean'"):
            call()
    before = dict(exported.named_buffers())["1.running_mean"].clone()
    exported(torch.randn(8, 4) + 3)  # what the message says: an inference call writes the statistics
    assert not torch.equal(dict(exported.named_buffers())["1.running_mean"], before)
    in_eval = torch.export.export(model.eval(), (torch.randn(8, 4),)).module()
    with pytest.raises(TypeError) as err:
        lint_model(in_eval, warn=False)
    assert "before exporting it" in str(err.value) and "exported in train mode" not in str(err.value)


def test_the_probe_line_reads_as_before_where_no_part_is_frozen_or_forward_names_the_output():
    """Chapter 2's printed audits are part of the release: the label is added only where the line is ambiguous."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))  # nothing frozen
    with FreezeAudit(model, probe=torch.randn(16, 4), warn=False) as audit:
        model.train()(torch.randn(16, 4))
    assert "\n  probe outputs: max |change| " in str(audit) and "frozen part" not in str(audit)
    model[:2].requires_grad_(False)
    with FreezeAudit(model, probe=torch.randn(16, 4), forward=model[:2], warn=False) as audit:
        model.train()(torch.randn(16, 4))
    assert "\n  probe outputs: max |change| " in str(audit) and "frozen part" not in str(audit)
