"""Engine benchmark: the same workload three ways, side by side, in one run.

Workload: 4 stage-1 trainings (seeds 0-3) and 16 stage-2 runs (4 freeze modes x the same 4 seeds), chapter 1's
default config. Compared:

* naive  - the loop most PyTorch code would write: one model at a time in this process, torch's default
           intra-op threads, samples produced one by one by a Dataset and batched by a DataLoader, NCHW;
* plain  - bnstudy's own single-run path, one model at a time (whole-tensor batches, channels-last),
           torch's default intra-op threads, no packing;
* engine - bnstudy.experiments.common.run_transfer_sweep: joblib processes (one torch thread each), seeds
           packed into grouped networks, whole-tensor batches, channels-last, a fresh cache;
* ceiling - this machine's measured fp32 matrix-multiply rate (torch.mm, all cores), the most either could do.

Achieved GFLOP/s counts the convolutions' and linear layers' multiply-adds (2 FLOPs each): forward only
for stage 2 (the backbone is frozen and needs no backward; the head's backward is counted), forward +
2x backward for stage 1. Prints a table and the engine/naive ratio, then the chapters' recorded wall
times (written by `python -m bnstudy.book`, i.e. `make book`).

Usage: python benchmarks/bench_engine.py [--steps 800] [--seeds 4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from bnstudy import train
from bnstudy.experiments.common import run_transfer_sweep
from bnstudy.freeze import MODE_NAMES

REPO = Path(__file__).resolve().parent.parent


def matmul_gflops(n: int = 1024, seconds: float = 2.0) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9


def flops_per_sample(cfg: dict) -> tuple[float, float]:
    """(backbone forward FLOPs, head forward FLOPs) for one 3x32x32 sample."""
    macs, c_in, hw = 0, 3, 32
    for w in cfg["widths"]:
        hw = (hw + 1) // 2
        macs += c_in * w * 9 * hw * hw
        c_in = w
    head = c_in * cfg["n_classes"]
    return 2.0 * macs, 2.0 * head


def workload_flops(cfg: dict, n_sources: int, n_transfers: int) -> float:
    bb, hd = flops_per_sample(cfg)
    stage1 = 3 * (bb + hd) * cfg["stage1_batch_size"] * cfg["stage1_steps"] * n_sources
    stage2 = (bb + 3 * hd) * cfg["batch_size"] * cfg["steps"] * n_transfers
    return stage1 + stage2


class NoisyTemplates(torch.utils.data.IterableDataset):
    """Per-sample stream of a template task: what a DataLoader-based loop would use."""

    def __init__(self, task, gen):
        self.task, self.gen = task, gen

    def __iter__(self):
        k = self.task.n_classes
        while True:
            y = torch.randint(k, (1,), generator=self.gen)
            yield self.task.sample(y, self.gen)[0], int(y)


def naive_workload(seeds, steps):
    """Stage 1 then the four stage-2 modes per seed, one model at a time, DataLoader batches, NCHW."""
    import copy
    from torch.utils.data import DataLoader
    from bnstudy import freeze
    from bnstudy.models import Classifier, ConvBackbone, make_head
    from bnstudy.tasks import eval_set, generator, make_task

    cfg = train.complete_config({})
    rows = []
    for s in seeds:
        task_a = make_task(s, "A", cfg["n_classes"], cfg["noise"])
        task_b = make_task(s, "B", cfg["n_classes"], cfg["noise"], cfg["brightness"], cfg["contrast"])
        torch.manual_seed(s)
        model = Classifier(ConvBackbone(3, cfg["widths"]), make_head("linear", 64, cfg["n_classes"]))
        opt = torch.optim.Adam(model.parameters(), lr=cfg["stage1_lr"])
        loader = iter(DataLoader(NoisyTemplates(task_a, generator(s, "naive", "A")), batch_size=cfg["stage1_batch_size"]))
        model.train()
        for _ in range(cfg["stage1_steps"]):
            x, y = next(loader)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
        xb, yb = eval_set(task_b, cfg["n_eval"], s, "B")
        for mode in MODE_NAMES:
            tm = freeze.TransferModel(copy.deepcopy(model.backbone), copy.deepcopy(model.head),
                                      make_head("linear", 64, cfg["n_classes"]))
            freeze.get_mode(mode).apply(tm)
            opt = torch.optim.SGD(tm.head_b.parameters(), lr=cfg["lr"], momentum=0.9)
            loader = iter(DataLoader(NoisyTemplates(task_b, generator(s, "naive", "B")), batch_size=cfg["batch_size"]))
            for step in range(steps):
                if step % cfg["epoch_steps"] == 0:
                    tm.train()
                x, y = next(loader)
                loss = torch.nn.functional.cross_entropy(tm.forward_b(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
            tm.eval()
            with torch.no_grad():
                rows.append(dict(seed=s, mode=mode, task_b=float((tm.forward_b(xb).argmax(1) == yb).float().mean())))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=800, help="stage-2 steps per run")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--pack-size", type=int, default=None, help="runs per packed network (default: 1 on CPU, 16 on CUDA)")
    args = ap.parse_args(argv)
    seeds = list(range(args.seeds))
    cfgs = [train.complete_config(dict(seed=s, mode=m, steps=args.steps)) for s in seeds for m in MODE_NAMES]
    base = cfgs[0]
    n_src, n_tr = len(seeds), len(cfgs)
    model_steps = n_src * base["stage1_steps"] + n_tr * base["steps"]
    flops = workload_flops(base, n_src, n_tr)

    print(f"machine: {os.cpu_count()} CPU cores, torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    print("Takes about 2 minutes on an idle 2-core machine (much longer if other jobs share the cores).", flush=True)
    print("[1/4] fp32 matmul ceiling ...", flush=True)
    ceiling = matmul_gflops()
    print("[2/4] naive loop ...", flush=True)

    t0 = time.perf_counter()
    naive_workload(seeds, args.steps)
    naive_s = time.perf_counter() - t0

    print("[3/4] plain loop ...", flush=True)
    t0 = time.perf_counter()
    plain_rows = []
    for s in seeds:
        [src] = train.train_source([dict(seed=s)])
        for m in MODE_NAMES:
            plain_rows += train.transfer([dict(seed=s, mode=m, steps=args.steps)], [src])
    plain_s = time.perf_counter() - t0

    print("[4/4] engine ...", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        engine = run_transfer_sweep(cfgs, namespace="bench", cache_dir=cache, pack_size=args.pack_size,
                                    progress=False)
        engine_s = time.perf_counter() - t0

    recs = []
    for name, wall in (("naive loop", naive_s), ("plain loop", plain_s), ("engine", engine_s)):
        gf = flops / wall / 1e9
        recs.append(dict(method=name, wall_s=wall, runs_per_s=(n_src + n_tr) / wall,
                         model_steps_per_s=model_steps / wall, gflop_per_s=gf, fraction_of_ceiling=gf / ceiling))
    recs.append(dict(method="fp32 matmul ceiling", wall_s=float("nan"), runs_per_s=float("nan"),
                     model_steps_per_s=float("nan"), gflop_per_s=ceiling, fraction_of_ceiling=1.0))
    table = pd.DataFrame(recs).set_index("method")
    print(f"\nworkload: {n_src} stage-1 trainings x {base['stage1_steps']} steps + {n_tr} stage-2 runs x "
          f"{base['steps']} steps ({model_steps} model-steps, {flops / 1e12:.2f} TFLOP)")
    with pd.option_context("display.float_format", "{:.3g}".format, "display.width", 200, "display.max_columns", None):
        print(table)
    print(f"\nengine / naive throughput: {naive_s / engine_s:.2f}x   engine / plain: {plain_s / engine_s:.2f}x   "
          f"plain / naive: {naive_s / plain_s:.2f}x")
    # plain and engine run the same configs; packing changes float rounding only (stage 1 amplifies it)
    plain = pd.DataFrame(plain_rows).set_index(["seed", "mode"])
    eng = engine.set_index(["seed", "mode"])
    for col in ("task_a_after", "task_b"):
        d = (plain[col] - eng[col]).abs()
        print(f"plain vs engine, {col}: mean |difference| {d.mean():.4f}, max {d.max():.4f}")

    times = REPO / "book" / "results" / "chapter_times.csv"
    print("\nchapter wall times (last recorded run per chapter and profile, from `python -m bnstudy.book`;\n"
          "a rerun that reads the run cache is much faster: `make clean-cache` first for cold times):")
    if times.exists():
        t = pd.read_csv(times)
        print(t.pivot_table(index="chapter", columns="profile", values="wall_s", aggfunc="last").to_string(
            float_format="{:.0f} s".format))
    else:
        print("  none recorded yet: run `make book PROFILE=quick` and `make book` first")


if __name__ == "__main__":
    main()
