"""Configs validate once, with errors that name the parameter and what is allowed."""

import pytest

from bnstudy.study.config import Execution, RunConfig, SourceConfig, check_seeds, seeds_label


@pytest.mark.parametrize("bad, match", [
    (dict(mode="frozen"), "mode='frozen' is not allowed; choose one of \\['train_mode'"),
    (dict(batch_size=1), "batch_size must be >= 2 when mode='train_mode'"),
    (dict(steps=0), "steps must be an integer >= 1, got 0"),
    (dict(stage1_batch_size=1), "stage1_batch_size must be >= 2"),
    (dict(norm="instance"), "norm='instance' is not allowed; choose one of \\['batch', 'group', 'layer', 'none'\\]"),
    (dict(lr=0), "lr must be a finite number > 0.0"),
    (dict(contrast=0), "contrast must be a finite number > 0.0"),
    (dict(noise=-1), "noise must be a finite number >= 0.0, got -1"),
    (dict(brightness="bright"), "brightness must be a finite number, got 'bright'"),
    (dict(noise=float("nan")), "noise must be a finite number"),
    (dict(widths=[16, 0]), "widths\\[1\\] must be an integer >= 1"),
    (dict(seed=1.5), "seed must be an integer >= 0"),
    (dict(momentum=1.5), "momentum must be a finite number >= 0.0 and <= 1.0 or None"),
    (dict(optimizer="rmsprop"), "optimizer='rmsprop' is not allowed; choose one of \\['sgd', 'adam', 'sgd_plain'\\]"),
])
def test_bad_parameters_raise_clear_value_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**bad)


def test_unknown_parameter_is_named_with_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown RunConfig parameters \\['colour'\\]; allowed: .*'brightness'"):
        RunConfig.create(colour=1)
    with pytest.raises(ValueError, match="unknown RunConfig parameters \\['colour'\\]"):
        RunConfig().replace(colour=1)


def test_batch_size_one_is_allowed_when_no_batchnorm_is_in_train_mode():
    assert RunConfig(batch_size=1, mode="backbone_eval").batch_size == 1
    with pytest.raises(ValueError, match="batch_size must be >= 2"):
        RunConfig(batch_size=1, mode="backbone_eval", head="mlp_bn")


def test_values_are_coerced_once_and_configs_are_frozen_and_hashable():
    c = RunConfig(widths=[8, 16], lr=1, seed=3.0)
    assert c.widths == (8, 16) and isinstance(c.lr, float) and c.seed == 3 and isinstance(c.seed, int)
    with pytest.raises(Exception):
        c.lr = 0.1
    assert len({c, RunConfig(widths=(8, 16), lr=1.0, seed=3)}) == 1
    assert c.source == SourceConfig(widths=(8, 16), seed=3)


def test_momentum_none_is_a_cumulative_average_and_allowed():
    assert RunConfig(momentum=None).momentum is None


@pytest.mark.parametrize("seeds, match", [(-3, "at least 2"), (2.5, "seeds must be"), ("3", "seeds must be"),
                                          ([0, 0], "repeat"), ([0, 1.5], "seeds\\[1\\]"), (1, "at least 2"),
                                          ("[0,5]", "-y")])
def test_bad_seeds_give_a_clear_error(seeds, match):
    with pytest.raises(ValueError, match=match):
        check_seeds(seeds)


def test_seeds_label_names_the_seeds_that_ran():
    assert seeds_label((0, 5)) == "2 seeds (0, 5)"
    assert seeds_label(tuple(range(10))) == "10 seeds (0-9)"


def test_execution_checks_its_values():
    with pytest.raises(ValueError, match="backend='spark' is not allowed"):
        Execution(backend="spark")
    with pytest.raises(ValueError, match="n_jobs must be an integer >= 1"):
        Execution(n_jobs=0)


def test_front_door_names_exist_and_every_readme_import_still_works():
    import bnstudy
    assert all(hasattr(bnstudy, n) for n in bnstudy.__all__)
    from bnstudy import freeze  # noqa: F401  (names the README shows, from where they were)
    from bnstudy.audit import FreezeAudit, lint_forward_modes, lint_loader, lint_model  # noqa: F401
    from bnstudy.freeze import pin_eval, shared_weight_copy, batch_stats_report  # noqa: F401
    from bnstudy.study.modes import MODES  # noqa: F401  (the book's freeze modes: study machinery, not the front door)
    from bnstudy.running_stats import precise_bn_statistics  # noqa: F401
