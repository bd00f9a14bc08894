"""What the kernel pin costs (issue 32): one workload under pinned and under native kernels, alternated, in one run.

Workload: chapter 1's runs (:class:`bnstudy.study.config.RunConfig` defaults, ``--steps`` stage-2 steps) on ``--seeds``
seeds, each computed from an empty run cache in a fresh Python process (the pin must be set before torch's first
operation, :mod:`bnstudy.study.numerics`), one worker process of one torch thread, so the two settings compete for the
machine the same way. Each setting runs ``--repeats`` times, alternating (pinned, native, pinned, ...); the table
gives each run's wall time, the medians and the ratio pinned / native of the medians.

Pinned: ``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``, ``MKL_CBWR=COMPATIBLE`` (the book's default).
Native: ``BNSTUDY_NUMERICS=native`` (each library picks the widest kernels this CPU has).

Usage: python benchmarks/bench_numerics.py [--steps 400] [--seeds 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from bnstudy.study import engine, numerics
    from bnstudy.study.config import Execution, RunConfig
    from bnstudy.study.modes import MODE_NAMES
    steps, seeds, cache = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cfgs = [RunConfig(seed=s, mode=m, steps=steps) for s in range(seeds) for m in MODE_NAMES]
    t = time.perf_counter()
    engine.transfer_sweep(cfgs, "bench_numerics", Execution(cache_dir=cache, n_jobs=1, progress=False))
    print(json.dumps(dict(wall_s=time.perf_counter() - t, key=numerics.key(), capability=numerics.capability())))
""")


def run_once(native: bool, steps: int, seeds: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")}
    env["BNSTUDY_NUMERICS"] = "native" if native else "pinned"
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(REPO), str(steps), str(seeds), cache], env=env,
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400, help="stage-2 steps per run (default 400)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds (default 2; 4 freeze modes each)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting, alternated (default 3)")
    args = ap.parse_args(argv)
    rows = []
    for r in range(args.repeats):
        for native in (False, True):
            res = run_once(native, args.steps, args.seeds)
            rows.append(dict(repeat=r, setting="native" if native else "pinned", **res))
            print(f"  {rows[-1]['setting']:6s} repeat {r}: {res['wall_s']:.1f} s ({res['capability']}, {res['key']})",
                  flush=True)
    med = {s: statistics.median(x["wall_s"] for x in rows if x["setting"] == s) for s in ("pinned", "native")}
    print(f"kernel pin: median wall time pinned {med['pinned']:.1f} s, native {med['native']:.1f} s; "
          f"ratio pinned / native = {med['pinned'] / med['native']:.3f} ({args.repeats} alternated runs each, "
          f"{args.seeds} seeds x 4 modes, {args.steps} stage-2 steps, one worker of one thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
