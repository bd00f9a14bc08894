"""The generic parameter check of a chapter's config (bnstudy.study.design, issue 33)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bnstudy.study.config import check_seeds
from bnstudy.study.design import REQUIRED, ChapterConfig, Parameters, Rule, check_like


class Toy(ChapterConfig):
    PROFILES = {"quick": {}, "full": {}}
    NORMALIZE = {"seeds": check_seeds}
    RULES = (Rule("steps", "an integer >= 1", lambda c: c.steps >= 1),
             Rule("n_eval", "a multiple of every batch", lambda c: all(c.n_eval % b == 0 for b in c.batches)))
    PARAMETERS = dict(profile="quick", seeds=(0, 1), steps=10, lr=0.1, batches=(1, 4), levels=(), shuffle=True,
                      kind="a", n_eval=4)


class Unit(Parameters):
    PARAMETERS = dict(seed=REQUIRED, case=REQUIRED, lr=0.05, widths=(8, 16), p=None)

    def __post_init__(self):
        if self.case not in ("a", "b"):
            raise ValueError(f"case={self.case!r} is not allowed; choose one of ['a', 'b']")


@dataclass(frozen=True)
class UnitAsDataclass:  # what Unit replaced: the same fields in the same order
    seed: int
    case: str
    lr: float = 0.05
    widths: tuple = (8, 16)
    p: float | None = None


def test_parameters_behave_as_the_frozen_dataclass_they_replace():
    """Equality, hash, order, copies, pickling and the run cache's key are those of the dataclass with the same
    fields (issue 33: the release's recorded units must still read back and key alike)."""
    import copy
    import pickle
    from dataclasses import FrozenInstanceError, asdict

    from bnstudy.study import sweep
    u = Unit(seed=1, case="a", p=0.3)
    d = UnitAsDataclass(seed=1, case="a", p=0.3)
    assert u.asdict() == asdict(d) and list(u.asdict()) == list(asdict(d)) == list(Unit.parameter_names())
    assert sweep.config_key(u, "ns", "v1") == sweep.config_key(d, "ns", "v1") == sweep.config_key(u.asdict(), "ns", "v1")
    assert u == Unit(seed=1, case="a", p=0.3) != Unit(seed=2, case="a", p=0.3) and u != d
    assert hash(u) == hash(Unit(seed=1, case="a", p=0.3)) and len({u, Unit(seed=1, case="a", p=0.3)}) == 1
    assert pickle.loads(pickle.dumps(u)) == u and copy.deepcopy(u) == u and copy.copy(u) == u
    assert repr(u) == "Unit(seed=1, case='a', lr=0.05, widths=(8, 16), p=0.3)"
    assert u.replace(lr=0.1) == Unit(seed=1, case="a", lr=0.1, p=0.3) and u.lr == 0.05
    with pytest.raises(FrozenInstanceError):
        u.lr = 0.2
    with pytest.raises(ValueError, match=r"unknown Unit parameters \['rate'\]; allowed: \['case', 'lr', 'p', 'seed', "
                                         r"'widths'\]"):
        Unit(seed=1, case="a", rate=0.1)
    with pytest.raises(ValueError, match="unknown Unit parameters"):
        u.replace(rate=0.1)
    with pytest.raises(TypeError, match=r"missing required parameters \['case'\]"):
        Unit(seed=1)
    with pytest.raises(ValueError, match="case='c' is not allowed"):  # __post_init__ runs on every build
        u.replace(case="c")


def test_a_config_declaring_fields_is_refused():
    """A ``@dataclass`` subclass would build its own __init__ and skip every check: refused where it is defined."""
    with pytest.raises(TypeError, match=r"declares fields \['steps'\]; declare parameters as data in PARAMETERS"):
        class Bad(ChapterConfig):
            steps: int = 3


def test_no_chapter_class_has_more_than_fifteen_fields():
    """Issue 33's ceiling: chapter configs and units are parameters as data, not records."""
    import ast
    from pathlib import Path

    import bnstudy.study.experiments as experiments
    too_many = []
    for path in sorted(Path(experiments.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                k = sum(isinstance(b, ast.AnnAssign) and not ast.unparse(b.annotation).startswith("ClassVar")
                        for b in node.body)
                if k > 15:
                    too_many.append(f"{path.name}:{node.name} ({k})")
    assert not too_many


@pytest.mark.parametrize("override, message", [
    (dict(profile="fast"), "profile='fast' is not allowed; choose one of ['quick', 'full']"),
    (dict(steps=2.5), "steps must be an integer, got 2.5"),
    (dict(steps=0), "steps must be an integer >= 1, got 0"),
    (dict(lr="0.1"), "lr must be a finite number, got '0.1'"),
    (dict(lr=float("nan")), "lr must be a finite number, got nan"),
    (dict(batches=[1, 2.5]), "batches[1] must be an integer, got 2.5"),
    (dict(batches=(3,), n_eval=10), "n_eval must be a multiple of every batch, got 10"),
    (dict(levels=("x",)), "levels[0] must be a finite number, got 'x'"),
    (dict(shuffle=1), "shuffle must be True or False, got 1"),
    (dict(kind=3), "kind must be a string, got 3"),
    (dict(seeds=1), "seeds must name at least 2 seeds"),
    (dict(batches=(1, 1)), "batches must not repeat a value, got [1, 1]"),
])
def test_each_value_is_checked_against_its_defaults_type_and_the_rules(override, message):
    with pytest.raises(ValueError) as e:
        Toy(**{"n_eval": 4, **override})
    assert str(e.value).startswith(message)


def test_values_come_back_in_the_defaults_type_and_describe_prints_them_resolved():
    t = Toy(seeds=3, steps=4.0, lr=1, batches=[1, 2], levels=[0.5, 2], n_eval=4)
    assert t.seeds == (0, 1, 2) and t.steps == 4 and type(t.steps) is int and t.batches == (1, 2)
    assert type(t.lr) is float and t.levels == (0.5, 2.0)
    assert t.describe() == ("profile=quick, 3 seeds (0-2), steps=4, lr=1, batches=[1, 2], levels=[0.5, 2.0], "
                            "shuffle=True, kind=a, n_eval=4")
    assert check_like("x", [1, 2], (0.5,)) == (1.0, 2.0) and check_like("x", object, None) is object



def test_a_refusal_shows_a_long_list_by_its_ends():
    """New-user report (stop 53): ``seeds=1001`` refused with all 1,001 seeds in the message."""
    from bnstudy.study.experiments.unknown_task import run as ch06
    with pytest.raises(ValueError, match=r"got \[0, 1, 2, 3, 4, \.\.\., 999, 1000\] \(1001 values\)$"):
        ch06.make_config("quick", seeds=1001)
    with pytest.raises(ValueError, match=r"got \[0, 10\]$"):  # a short one whole
        ch06.make_config("quick", seeds=(0, 10))
