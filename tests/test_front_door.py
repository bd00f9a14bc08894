"""The practitioner's library (the front door, ``import bnstudy``) needs only torch and numpy, as fvcore's and
timm's freeze tools do: a bare environment with torch (and what torch itself requires) and numpy, and nothing
else, imports it, freezes a model and audits the freeze. pandas, scipy, seaborn, joblib and the book's tools come
with ``bnstudy[study]``.

The bare environment is a fresh ``venv`` (no system site packages, no pip) that sees, through one ``.pth`` file,
links to exactly the installed distributions of torch's requirement closure and numpy, and the repository.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import sys
for banned in ("pandas", "scipy", "matplotlib", "seaborn", "joblib", "tqdm", "statsmodels"):
    try:
        __import__(banned)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the environment is not bare: {banned} imports")
import torch
from torch import nn
import bnstudy
from bnstudy import FreezeAudit, pin_eval, freeze_batchnorm, update_bn_stats, lint_model
torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU())
model = nn.Sequential(backbone, nn.Linear(4, 2))
for p in backbone.parameters():
    p.requires_grad_(False)
pin_eval(backbone)
x = torch.randn(16, 3)
with FreezeAudit(model, warn=False) as audit:
    model.train()
    model(x)
text = str(audit)  # the summary: what moved, probe outputs, lints, layer modes
audit.assert_frozen(backbone)
before = backbone[1].running_mean.clone()
model.train(); model(x)
assert torch.equal(backbone[1].running_mean, before)  # pinned: the train-mode pass left the buffers alone
unpinned = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
for p in unpinned.parameters():
    p.requires_grad_(False)
with FreezeAudit(unpinned, warn=False) as bad:
    unpinned.train()
    unpinned(x)
try:
    bad.assert_frozen()
except AssertionError as e:
    assert "running_mean" in str(e), e  # the audit catches a requires_grad-frozen BatchNorm whose statistics moved
else:
    raise SystemExit("assert_frozen passed on moved statistics")
freeze_batchnorm(nn.Sequential(nn.BatchNorm1d(4)))
lint_model(model, warn=False)
try:
    audit.report()
except ImportError as e:
    assert "pandas" in str(e), e
else:
    raise SystemExit("report() returned a table without pandas")
print("front door ok", [m for m in sorted(sys.modules) if m.split(".")[0] in ("pandas", "scipy")])
"""


def _requirement_closure(root: str) -> set[str]:
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional requirement not installed here
        seen.add(key)
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            spec, _, marker = req.partition(";")
            if marker.strip():
                try:
                    from packaging.markers import Marker
                    if not Marker(marker).evaluate():
                        continue
                except Exception:
                    continue
            todo.append(re.split(r"[<>=!~\[ (]", spec.strip(), maxsplit=1)[0])
    return seen


def _top_level_paths(dist_name: str) -> set[Path]:
    dist = md.distribution(dist_name)
    base = Path(dist.locate_file(""))
    tops = set()
    for f in dist.files or []:
        first = Path(f).parts[0]
        if first.endswith((".dist-info", ".egg-info")) or first in ("..", "__pycache__", "bin"):
            continue
        tops.add(base / first)
    return {p for p in tops if p.exists()}


@pytest.mark.slow
def test_front_door_runs_with_only_torch_and_numpy(tmp_path):
    env_dir, site = tmp_path / "bare", tmp_path / "site"
    venv.EnvBuilder(system_site_packages=False, with_pip=False, symlinks=True).create(env_dir)
    site.mkdir()
    dists = _requirement_closure("torch") | {"numpy"}
    for d in sorted(dists):
        for p in _top_level_paths(d):
            if not (site / p.name).exists():
                (site / p.name).symlink_to(p)
    assert (site / "torch").exists() and (site / "numpy").exists()
    assert not (site / "pandas").exists() and not (site / "scipy").exists()
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "bare.pth").write_text(f"{site}\n{REPO}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    res = subprocess.run([str(py), "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "front door ok []" in res.stdout, res.stdout
