"""Faults the new-user trial found in the audit, freeze-by-name and precise BN (notes/newuser.md, findings 7-10),
each kept as a test with its right value."""

import warnings

import pytest
import torch
from torch import nn

from bnstudy import freeze
from bnstudy.audit import BNLintWarning, FreezeAudit, lint_model
from bnstudy.freeze import FrozenBatchNorm, freeze_modules, unfreeze_modules
from bnstudy.running_stats import update_bn_stats


def _deep(n_bn=40):
    layers = []
    for _ in range(n_bn):
        layers += [nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()]
    model = nn.Sequential()
    model.backbone = nn.Sequential(*layers)
    model.head = nn.Linear(8, 2)
    return model


def _bnlint(record):
    return [w for w in record if issubclass(w.category, BNLintWarning)]


def test_forty_identical_findings_are_one_warning_each_from_lint_model_and_the_audit_at_the_users_line():
    model = _deep()
    model.backbone.requires_grad_(False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lint_model(model)
        with FreezeAudit(model, probe=torch.randn(16, 8)):
            model.train()(torch.randn(16, 8))
    got = _bnlint(record)
    assert len(got) == 2  # was 80: 40 from lint_model and 40 from the audit's entry lints
    for w in got:
        assert str(w.message).startswith("[frozen_bn_in_train_mode] 40 layers (backbone.1, backbone.4, ")
        assert "and 34 more)" in str(w.message)
        assert w.filename == __file__  # not torch/nn/modules/module.py or sys
    text = "\n".join(str(w.message) for w in got)
    assert "backbone.118" not in text  # the rest are counted, as print(audit) counts them


def test_a_live_finding_on_many_layers_warns_at_its_first_layer_and_names_the_rest_once_on_exit():
    model = _deep(5)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with FreezeAudit(model):
            model.train()(torch.randn(4, 8))  # a batch of 4 < 16: small_batch at every BatchNorm
    got = [str(w.message) for w in _bnlint(record)]
    assert len(got) == 2, got
    assert got[0].startswith("[small_batch] backbone.1: ")
    assert got[1].startswith("[small_batch] 4 more layers (backbone.4, backbone.7, backbone.10, backbone.13) with "
                             "the same finding: ")
    assert all(w.filename == __file__ for w in _bnlint(record))


def test_the_summary_counts_in_the_right_number_and_a_bare_batchnorm_is_one_model_call():
    bn = nn.BatchNorm1d(4)
    with FreezeAudit(bn, warn=False) as a:
        bn(torch.randn(32, 4))
    lines = str(a).splitlines()
    assert lines[0] == "FreezeAudit of BatchNorm1d: 5 tensors (2 parameters, 3 buffers), 1 model call"  # was 0
    assert lines[1] == "  moved: 3 tensors (0 parameters, 3 buffers) in 1 module"  # was "1 modules"
    assert lines[3] == "  layers during the block (1 in 1 group):"  # was "1 groups"
    # was "BatchNorm1d : train, 1 calls": the root's empty name and a plural for one call
    assert lines[4] == "    BatchNorm1d (model): train, 1 call, batch stats, WROTE running stats (1x), min batch 32"
    assert a.modes().loc[0, "calls_per_model_call"] == 1.0


def test_assert_frozen_names_a_moved_tensor_output_without_odd_quotes():
    model = nn.Sequential()
    model.backbone = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    model.head = nn.Linear(3, 2)
    x = torch.randn(8, 3)
    with FreezeAudit(model, probe=x, warn=False) as a:
        model.train()(x)
    with pytest.raises(AssertionError) as err:
        a.assert_frozen("backbone")
    assert "output of 'backbone' (max |change|" in str(err.value)  # was "output of 'backbone' '(tensor)'"
    with pytest.raises(ValueError, match="modules is empty"):
        a.assert_frozen([])  # would check nothing and pass


def test_freeze_modules_without_names_refuses_instead_of_freezing_the_head():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    with pytest.raises(TypeError, match=r"freeze_modules: names is required.*whole_model=True"):
        freeze_modules(model)
    with pytest.raises(ValueError, match="freeze_modules: names is empty"):
        freeze_modules(model, [])
    with pytest.raises(TypeError, match="unfreeze_modules: names is required"):
        unfreeze_modules(model)
    with pytest.raises(ValueError, match="unfreeze_modules: names is empty"):
        unfreeze_modules(model, [])
    with pytest.raises(ValueError, match="not both"):
        freeze_modules(model, ["0"], whole_model=True)
    assert all(p.requires_grad for p in model.parameters()) and type(model[1]) is nn.BatchNorm1d
    freeze_modules(model, [model[0], "1"])  # module objects work as names
    assert not model[0].weight.requires_grad and isinstance(model[1], FrozenBatchNorm) and model[2].weight.requires_grad
    freeze_modules(model, whole_model=True)
    assert not model[2].weight.requires_grad


def test_update_bn_stats_on_an_instance_norm_model_says_why_it_estimates_nothing():
    model = nn.Sequential(nn.Conv1d(2, 3, 1), nn.InstanceNorm1d(3, track_running_stats=True))
    with pytest.raises(ValueError, match=r"no BatchNorm layer.*\['1'\] keep running statistics but are InstanceNorm"):
        update_bn_stats(model, [torch.randn(4, 2, 5)])


def test_update_bn_stats_warns_when_it_rewrites_a_pinned_backbone_at_the_users_line():
    model = nn.Sequential()
    model.backbone = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model.head = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2))
    freeze.pin_eval(model.backbone)
    before = model.backbone[1].running_mean.clone()
    batches = [torch.randn(16, 4) + 3 for _ in range(2)]
    with pytest.warns(UserWarning, match=r"pinned in eval mode by pin_eval \(backbone\.1\)") as record:
        update_bn_stats(model, batches)
    assert record[0].filename == __file__
    assert not torch.equal(before, model.backbone[1].running_mean)
    model.backbone[1].running_mean.copy_(before)
    update_bn_stats(model, batches, modules=["head"])  # the head only: the pinned backbone keeps its statistics
    assert torch.equal(before, model.backbone[1].running_mean)


def test_too_few_seeds_shows_what_the_user_typed_not_its_expansion():
    from bnstudy.study.config import check_seeds
    with pytest.raises(ValueError, match=r"at least 2 seeds for a 95% interval, got 0 \(seeds \[\]\)"):
        check_seeds(0)  # was "got []" for `-p seeds 0`


class _Parts(nn.Module):
    """A backbone with BatchNorm and a head; the loops below call the parts, never the model."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.backbone(x))


def test_a_loop_that_calls_the_models_parts_is_counted_and_named_not_zero_model_calls():
    """Issue 37 (a fresh reader): the header said "0 model calls" when the training loop called model.backbone and
    model.head. Every call into the model counts: of the model, or through a submodule, named."""
    model = _Parts().train()
    with FreezeAudit(model, warn=False) as a:
        for _ in range(3):
            model.head(model.backbone(torch.randn(16, 4)))
    assert a.model_calls == 0 and a.calls_into_model == 6
    assert dict(a.submodule_calls) == {"backbone": 3, "head": 3}
    assert " ".join(str(a).split()).startswith(
        "FreezeAudit of _Parts: 9 tensors (6 parameters, 3 buffers), 0 model calls; 6 calls into its submodules "
        "(backbone 3, head 3)")
    row = a.modes().set_index("module").loc["backbone.1"]
    assert (row["calls"], row["writes"], row["max_writes_per_model_call"]) == (3, 3, 1)   # once per call into it
    with FreezeAudit(model, warn=False) as b:       # the model itself: as before, nothing about submodules
        model(torch.randn(16, 4))
        model.backbone(torch.randn(16, 4))          # and one call of a part, after
    assert (b.model_calls, b.calls_into_model, dict(b.submodule_calls)) == (1, 2, {"backbone": 1})
    assert "1 model call; 1 call into its submodules (backbone 1)" in " ".join(str(b).split())


def test_lint_and_error_messages_name_the_calls_a_user_can_type_through_the_front_door():
    """A message that tells the user what to call names it as ``import bnstudy`` reaches it: ``bnstudy.pin_eval``,
    ``bnstudy.pin_norm_eval``, ``bnstudy.freeze_batchnorm`` (``bnstudy.__all__``), never ``bnstudy.freeze.pin_eval``
    or a bare ``pin_norm_eval``; a name outside the front door keeps its module path (it must resolve)."""
    import ast
    import importlib
    import re
    from pathlib import Path

    import bnstudy

    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3, affine=False)).requires_grad_(False)
    (lint,) = [x for x in lint_model(model, warn=False) if x.code == "frozen_bn_in_train_mode"]
    assert "bnstudy.pin_eval or bnstudy.pin_norm_eval" in lint.message, lint.message
    assert "bnstudy.freeze_batchnorm / bnstudy.freeze_modules" in lint.message, lint.message
    with pytest.raises(ValueError, match=r"pin it with bnstudy\.pin_norm_eval\)"):
        FrozenBatchNorm.from_batchnorm(nn.InstanceNorm1d(3, track_running_stats=True))
    # every call path in the message strings of the library's modules (docstrings aside), but one: the affine
    # frozen_bn_in_train_mode lint's text is in chapter 2's printed audits (release/02_eval_traps_audits.csv), so it
    # changes with a re-release of chapter 2
    held = {("lints.py", "bnstudy.freeze.pin_eval")}
    root = Path(bnstudy.__file__).parent
    problems = []
    for path in sorted([*root.glob("*.py"), *(root / "audit").glob("*.py")]):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
                continue
            for mod, name in re.findall(r"\bbnstudy\.(\w+)\.(\w+)\b", node.value):
                if name in bnstudy.__all__ and (path.name, f"bnstudy.{mod}.{name}") not in held:
                    problems.append(f"{path.name}:{node.lineno}: bnstudy.{mod}.{name}, the front door is bnstudy.{name}")
                elif mod not in ("study",) and not hasattr(importlib.import_module(f"bnstudy.{mod}"), name):
                    problems.append(f"{path.name}:{node.lineno}: bnstudy.{mod}.{name} does not exist")
    assert not problems, "\n".join(problems)


def test_compare_statistics_without_pandas_says_what_to_install(monkeypatch):
    """A fresh user's report (torch and numpy only): compare_statistics raised a bare ModuleNotFoundError, where
    every other call that returns a table says that it needs pandas and how to install it."""
    import sys

    import bnstudy

    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).eval()
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(ImportError, match="needs pandas: pip install pandas"):
        bnstudy.compare_statistics(model, model)


def test_one_audit_watches_one_block_and_a_second_entry_is_refused():
    """Fresh-user report: re-entering the same FreezeAudit mixed two blocks' summaries."""
    import pytest
    import torch
    from torch import nn
    from bnstudy import FreezeAudit
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    a = FreezeAudit(m)
    with a:
        m(torch.randn(2, 3, 8, 8))
    with pytest.raises(RuntimeError, match="create a new FreezeAudit"):
        with a:
            m(torch.randn(2, 3, 8, 8))
    with FreezeAudit(m) as b:  # a new audit per block works
        m(torch.randn(2, 3, 8, 8))
    assert len(b.moved())


def test_assert_frozen_names_the_root_and_agrees_in_number():
    import pytest
    import torch
    from torch import nn
    from bnstudy import FreezeAudit
    m = nn.Sequential(nn.BatchNorm2d(3), nn.BatchNorm2d(3)).train()
    with FreezeAudit(m) as a:
        m(torch.randn(2, 3, 4, 4))
    with pytest.raises(AssertionError, match=r"^the model \(root\) is not frozen"):
        a.assert_frozen("")
    with pytest.raises(AssertionError, match=r"^'0', '1' are not frozen"):
        a.assert_frozen(["0", "1"])


@pytest.mark.parametrize("momentum,batch", [(None, 8), (None, 32), (0.1, 8), (0.1, 32)])
def test_the_summary_counts_the_information_lints_it_lists_and_lists_every_lint_it_counts(momentum, batch):
    """The summary counted warnings only ("lints: 1 (1 distinct)") while the audit held information lints too
    (momentum_cumulative here); now its lints line counts both, and the listing below it holds exactly the groups
    counted. A summary without information lints reads as before."""
    import re

    from bnstudy.audit import group_lints

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=momentum), nn.BatchNorm1d(4, momentum=momentum))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FreezeAudit(model, probe=torch.randn(8, 4)) as audit:
            model.train()(torch.randn(batch, 4))
    text = audit.summary(details=True)
    warn = [x for x in audit.lints if x.severity == "warning"]
    info = [x for x in audit.lints if x.severity == "info"]
    assert bool(info) == (momentum is None) and bool(warn) == (batch < 16)  # both kinds, either, or none
    line = next(ln for ln in text.splitlines() if ln.startswith("  lints: "))
    expected = f"  lints: {len(warn) or 'none'}" + (f" ({len(group_lints(warn))} distinct)" if warn else "")
    if info:
        expected += f"; information: {len(info)} ({len(group_lints(info))} distinct)"
    assert line == expected
    assert line in repr(audit).splitlines()  # the headline (repr, notebook) counts the same
    listed = re.findall(r"^    \[(\w+)\] ", text, flags=re.M)
    assert listed == [x.code for x, _ in group_lints(warn)] + [x.code for x, _ in group_lints(info)]
    assert ("  information:" in text.splitlines()) == bool(info)
    md = audit._repr_markdown_()
    assert all(f"`{x.code}`" in md for x in audit.lints)


def test_results_read_inside_the_block_say_they_exist_after_it():
    """New-user report (stop 53): ``audit.assert_frozen(...)`` inside the ``with`` block said "use it as `with
    FreezeAudit(model) as audit`", which the user was doing. Every result method says when results exist."""
    m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).eval()
    audit = FreezeAudit(m)
    with pytest.raises(RuntimeError, match="use it as `with FreezeAudit"):
        audit.report()
    with FreezeAudit(m) as a:
        for read in (a.report, a.summary, lambda: a.assert_frozen(m)):
            with pytest.raises(RuntimeError, match="results exist once the `with` block has exited"):
                read()
    a.assert_frozen(m)  # after the block: the result
