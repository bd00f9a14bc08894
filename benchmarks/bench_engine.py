"""Engine benchmark: one workload done four ways, side by side, in one run; then the chapters' cold-cache times.

Workload: chapter 1's runs (:class:`bnstudy.study.config.RunConfig` defaults) on ``--seeds`` seeds: one stage-1 training
per seed and one stage-2 run per (seed, freeze mode). Compared, each from scratch:

* naive  - the loop most PyTorch code would write first: one run at a time, fresh samples produced one by one by
           an ``IterableDataset`` and batched by a ``DataLoader``, NCHW, torch's default intra-op threads;
* plain  - the loop a careful practitioner writes: each task's finite training set drawn once into a
           ``TensorDataset``, ``DataLoader(shuffle=True, drop_last=True)``, one model per run, the full forward
           every step, torch's default intra-op threads;
* engine before issue 9 - the same with every mode's full forward (``engine.SHARE_FEATURES = False``) on the
           stream: what the engine did before issue 9 (measured in-process, so only with ``--cores 1``);
* engine (stream) - ``bnstudy.study.engine.transfer_sweep`` with ``train_size=None`` (an endless stream of fresh
           samples, the engine before issue 9): joblib processes, one torch thread each, the modes of a seed in
           lockstep, channels-last where it pays, shared per-step backbone forwards for eval-mode backbones;
* engine (stream) is the engine as the book runs it today (``RunConfig``'s default ``train_size=None``);
* engine (train_size=N) - ``transfer_sweep`` on finite sets of ``--train-size`` samples (default 6400):
           the set drawn once, eval-mode backbones' features computed once per set;
* ceiling - this machine's measured fp32 matrix-multiply rate (``torch.mm`` on ``--cores`` threads).

Every method uses ``--cores`` cores (default: all): that many intra-op threads for the loops and the ceiling,
that many worker processes of one thread for the engine. On a machine shared with other jobs, ``--cores 1``
gives the steadiest ratios (each method then competes for one core the same way).

GFLOP/s counts the *workload's* nominal multiply-adds (2 FLOPs each) of convolutions and linear layers: stage 1
forward + 2x backward, stage 2 forward (the frozen backbone needs no backward) + the head's backward, every step,
as the naive loop executes them. Work a method skips (a feature computed once instead of every step) is counted
as done, so the engine's fraction of the ceiling is an *effective* rate; the stream row is the engine doing all
of the work.

Then each chapter's experiment (``run(make_config(profile))``, without the notebook's plotting) in a fresh run
cache, timed: ``--profile full`` (``make bench``) or ``quick``.

Usage: python benchmarks/bench_engine.py [--steps 800] [--seeds 4] [--cores N] [--profile full|quick|none]
       [--skip naive,plain,before,stream]
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import tempfile
import time

import pandas as pd
import torch
import torch.nn.functional as F

from bnstudy.study import engine
from bnstudy.study.config import Execution, RunConfig
from bnstudy.study.models import Classifier, ConvBackbone, make_head
from bnstudy.study.modes import MODE_NAMES, TransferModel, get_mode
from bnstudy.study.tasks import eval_set, generator, make_task, train_set

CHAPTERS = ("freeze_modes", "eval_traps", "shift_strength")


def matmul_gflops(n: int = 1024, seconds: float = 2.0) -> tuple[float, float]:
    """fp32 ``torch.mm`` rate with torch's current threads: (GFLOP per wall second, GFLOP per CPU second)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    reps, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    gflop = 2 * n ** 3 * reps / 1e9
    return gflop / (time.perf_counter() - t0), gflop / (time.process_time() - c0)


def flops_per_sample(c: RunConfig) -> tuple[float, float]:
    """(backbone forward FLOPs, head forward FLOPs) for one 3x32x32 sample."""
    macs, c_in, hw = 0, 3, 32
    for w in c.widths:
        hw = (hw + 1) // 2
        macs += c_in * w * 9 * hw * hw
        c_in = w
    return 2.0 * macs, 2.0 * c_in * c.n_classes


def workload_flops(c: RunConfig, n_sources: int, n_transfers: int) -> float:
    bb, hd = flops_per_sample(c)
    stage1 = 3 * (bb + hd) * c.stage1_batch_size * c.stage1_steps * n_sources
    stage2 = (bb + 3 * hd) * c.batch_size * c.steps * n_transfers
    return stage1 + stage2


class NoisyTemplates(torch.utils.data.IterableDataset):
    """Per-sample stream of a template task: what a first DataLoader-based loop would use."""

    def __init__(self, task, gen):
        self.task, self.gen = task, gen

    def __iter__(self):
        while True:
            y = torch.randint(self.task.n_classes, (1,), generator=self.gen)
            yield self.task.sample(y, self.gen)[0], int(y)


def _loader(task, c: RunConfig, seed: int, tag: str, batch_size: int, finite: bool):
    from torch.utils.data import DataLoader, TensorDataset
    if not finite:
        return iter(DataLoader(NoisyTemplates(task, generator(seed, "bench", tag)), batch_size=batch_size))

    def endless():
        ds = TensorDataset(*train_set(task, c.train_size or 6400, seed, tag))  # the plain loop's finite set
        dl = DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True,
                        generator=generator(seed, "bench", tag))
        while True:
            yield from dl
    return endless()


def loop_workload(c0: RunConfig, seeds, finite: bool) -> list[dict]:
    """Stage 1 then the four stage-2 modes per seed, one model at a time, DataLoader batches, NCHW."""
    rows = []
    for s in seeds:
        c = c0.replace(seed=s)
        task_a = make_task(s, "A", c.n_classes, c.noise)
        task_b = make_task(s, "B", c.n_classes, c.noise, c.brightness, c.contrast)
        torch.manual_seed(s)
        model = Classifier(ConvBackbone(3, c.widths), make_head("linear", c.widths[-1], c.n_classes))
        opt = torch.optim.Adam(model.parameters(), lr=c.stage1_lr)
        loader = _loader(task_a, c, s, "A", c.stage1_batch_size, finite)
        model.train()
        for _ in range(c.stage1_steps):
            x, y = next(loader)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        xb, yb = eval_set(task_b, c.n_eval, s, "B")
        for mode in MODE_NAMES:
            tm = TransferModel(copy.deepcopy(model.backbone), copy.deepcopy(model.head),
                               make_head("linear", c.widths[-1], c.n_classes))
            get_mode(mode).apply(tm)
            opt = torch.optim.SGD(tm.head_b.parameters(), lr=c.lr, momentum=0.9)
            loader = _loader(task_b, c, s, "B", c.batch_size, finite)
            for step in range(c.steps):
                if step % c.epoch_steps == 0:
                    tm.train()
                x, y = next(loader)
                loss = F.cross_entropy(tm.forward_b(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            tm.eval()
            with torch.no_grad():
                rows.append(dict(seed=s, mode=mode, task_b=float((tm.forward_b(xb).argmax(1) == yb).float().mean())))
    return rows


def engine_workload(cfgs: list[RunConfig], n_jobs: int, share: bool = True) -> pd.DataFrame:
    old, engine.SHARE_FEATURES = engine.SHARE_FEATURES, share
    try:
        with tempfile.TemporaryDirectory() as cache:
            return engine.transfer_sweep(cfgs, "bench", Execution(cache_dir=cache, n_jobs=n_jobs, progress=False))
    finally:
        engine.SHARE_FEATURES = old


def chapter_times(profile: str, n_jobs: int | None) -> pd.DataFrame:
    """Each chapter's ``run(make_config(profile))`` in a fresh run cache: wall seconds and runs."""
    recs = []
    for name in CHAPTERS:
        mod = importlib.import_module(f"bnstudy.study.experiments.{name}")
        if hasattr(mod, "__path__"):  # a chapter folder: what is trained is its run module
            mod = importlib.import_module(f"bnstudy.study.experiments.{name}.run")
        with tempfile.TemporaryDirectory() as cache:
            t0 = time.perf_counter()
            df = mod.run(mod.make_config(profile), Execution(cache_dir=cache, n_jobs=n_jobs, progress=False))
            recs.append(dict(chapter=name, profile=profile, rows=len(df), wall_s=time.perf_counter() - t0))
        print(f"  {name}: {recs[-1]['wall_s']:.1f} s ({len(df)} rows)", flush=True)
    return pd.DataFrame(recs).set_index("chapter")


def sharing_ratios(steps: int = 100) -> pd.DataFrame:
    """Issue 9's sharing levers, each against its own unshared path in this process (1 thread, CPU seconds).

    * chapter 4's grid: 5 heads x 3 optimizers x 4 modes of one seed as one lockstep group (shared stream and
      backbone forwards) against 15 mode-only groups;
    * chapter 7's stage 2 (ResNet-18 and MobileNetV3-small, 4 modes, batch 32): pinned modes on a feature table
      of the set and one shared train-mode forward, against every mode running its own model each step;
    * chapter 5's fine-tuning group of one seed and target (:func:`ch5_group_ratio`): stream, AdaBN images and
      held-out sets drawn once, against every run drawing its own.
    Rows are ``==`` in every case (tests/test_engine.py, tests/test_real_data.py, tests/test_batch_size.py); only
    time differs.
    """
    from bnstudy.study.data import corrupted_task_b, digits_tasks, normalise, pixel_statistics
    from bnstudy.study.experiments.real_data import run as rd
    torch.set_num_threads(1)
    recs = []
    heads = ("linear", "mlp", "mlp2", "mlp_bn", "mlp_ln")
    opts = (("sgd", 0.05), ("sgd_plain", 0.1), ("adam", 0.003))
    cfgs = [RunConfig(seed=0, mode=m, head=h, optimizer=o, lr=lr, steps=steps)
            for h in heads for o, lr in opts for m in MODE_NAMES]
    src = engine.train_source(cfgs[0].source)
    c0 = time.process_time()
    engine.transfer(cfgs, src)
    shared = time.process_time() - c0
    c0 = time.process_time()
    for i in range(0, len(cfgs), len(MODE_NAMES)):
        engine.transfer(cfgs[i:i + len(MODE_NAMES)], src)
    recs.append(dict(lever="ch4 grid in one lockstep group", shared_cpu_s=shared,
                     unshared_cpu_s=time.process_time() - c0))
    for network in ("resnet18", "mobilenet_v3_small"):
        cfg = rd.make_config("quick", seeds=2, networks=(network,), corruptions=("inversion",), severities=(5,),
                             stage1_steps=2, steps=steps)
        specs = [s for s in cfg.run_configs() if s.corruption == "inversion" and s.seed == 0]
        tasks = digits_tasks(cfg.size)
        mean, std = pixel_statistics(tasks["A"])
        source = rd.train_stage1(specs[0], normalise(tasks["A"].x_train, mean, std), tasks["A"].y_train)
        a_test = (normalise(tasks["A"].x_test, mean, std), tasks["A"].y_test)
        tb = corrupted_task_b(tasks, "inversion", 5, 0)
        cpu = {}
        for share in (True, False):
            engine.SHARE_FEATURES = share
            c0 = time.process_time()
            rd.run_condition(specs, source, a_test, tb)
            cpu[share] = time.process_time() - c0
        engine.SHARE_FEATURES = True
        recs.append(dict(lever=f"ch7 {network} shared forwards", shared_cpu_s=cpu[True], unshared_cpu_s=cpu[False]))
    recs.append(ch5_group_ratio())
    out = pd.DataFrame(recs).set_index("lever")
    out["speedup"] = out["unshared_cpu_s"] / out["shared_cpu_s"]
    return out


def ch5_group_ratio(samples: int = 1024, batch_sizes=(2, 4, 8, 16, 32, 64, 128, 256),
                    strategies=("stats_frozen", "adabn", "bn_train", "group_pretrained")) -> dict:
    """Chapter 5's fine-tuning group of one seed and target (``strategies`` x ``batch_sizes``, ``samples`` per run,
    the full profile's other settings) with the draws shared (:class:`bnstudy.study.engine.FinetuneData`) against every
    run drawing its own; 1 thread, CPU seconds. Rows are ``==`` (tests/test_batch_size.py)."""
    from bnstudy.study.config import FinetuneConfig, SourceConfig, STRATEGY_NORM
    torch.set_num_threads(1)
    srcs = {n: engine.train_source(SourceConfig(seed=0, norm=n, stage1_steps=20)) for n in ("batch", "group")}
    cfgs = [FinetuneConfig(seed=0, stage1_steps=20, norm=STRATEGY_NORM[st], strategy=st, batch_size=b,
                           samples=samples, lr=0.01 * b / 32) for b in batch_sizes for st in strategies]
    cpu = {}
    for share in (True, False):
        data = engine.FinetuneData() if share else None
        c0 = time.process_time()
        for c in cfgs:
            engine.finetune(c, srcs[c.norm], data=data)
        cpu[share] = time.process_time() - c0
    return dict(lever=f"ch5 one seed x target, {len(strategies)} strategies x {len(batch_sizes)} batch sizes, "
                      f"{samples} samples: shared draws", shared_cpu_s=cpu[True], unshared_cpu_s=cpu[False])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=800, help="stage-2 steps per run")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--stage1-steps", type=int, default=RunConfig.stage1_steps)
    ap.add_argument("--train-size", type=int, default=6400, help="finite set size of the last engine row")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="cores every method uses (default: all)")
    ap.add_argument("--profile", default=os.environ.get("BENCH_PROFILE", "full"), choices=("full", "quick", "none"),
                    help="chapter profile to time cold (none: skip)")
    ap.add_argument("--skip", default="", help="comma-separated methods to skip: naive, plain, before, stream, sharing")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    seeds = list(range(args.seeds))
    cfgs = [RunConfig(seed=s, mode=m, steps=args.steps, stage1_steps=args.stage1_steps)
            for s in seeds for m in MODE_NAMES]
    base = cfgs[0]
    n_src, n_tr = len(seeds), len(cfgs)
    flops = workload_flops(base, n_src, n_tr)
    torch.set_num_threads(args.cores)
    if args.cores != 1:
        skip.add("before")  # SHARE_FEATURES is set in this process; worker processes would not see it

    print(f"machine: {os.cpu_count()} CPU cores (using {args.cores}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op "
          f"threads, device {engine.pick_device()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    ceiling, ceiling_cpu = matmul_gflops()
    print(f"fp32 matmul ceiling: {ceiling:.1f} GFLOP per wall second, {ceiling_cpu:.1f} per CPU second", flush=True)
    walls, cpus = {}, {}
    methods = [("naive loop", "naive", lambda: loop_workload(base, seeds, finite=False)),
               ("plain loop", "plain", lambda: loop_workload(base, seeds, finite=True)),
               ("engine before issue 9", "before",
                lambda: engine_workload([c.replace(train_size=None) for c in cfgs], args.cores, share=False)),
               ("engine (stream)", "stream",
                lambda: engine_workload([c.replace(train_size=None) for c in cfgs], args.cores)),
               (f"engine (train_size={args.train_size})", "engine",
                lambda: engine_workload([c.replace(train_size=args.train_size) for c in cfgs], args.cores))]
    for label, key, fn in methods:
        if key in skip or (key == "stream" and args.train_size is None):
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls[label], cpus[label] = time.perf_counter() - t0, time.process_time() - c0
        print(f"{label}: {walls[label]:.1f} s wall, {cpus[label]:.1f} s CPU", flush=True)
    eng = walls[methods[-1][0]]
    # With --cores 1 everything runs in this process, so its CPU time is the work done: on a machine shared with
    # other jobs, rates per CPU second are steadier than rates per wall second.
    per_cpu = args.cores == 1
    recs = [dict(method=k, wall_s=w, cpu_s=cpus[k] if per_cpu else float("nan"), runs_per_s=(n_src + n_tr) / w,
                 gflop_per_s=flops / w / 1e9, fraction_of_ceiling=flops / w / 1e9 / ceiling,
                 fraction_of_ceiling_cpu=flops / cpus[k] / 1e9 / ceiling_cpu if per_cpu else float("nan"),
                 engine_speedup=w / eng, engine_speedup_cpu=cpus[k] / cpus[methods[-1][0]] if per_cpu else float("nan"))
            for k, w in walls.items()]
    recs.append(dict(method="fp32 matmul ceiling", gflop_per_s=ceiling, fraction_of_ceiling=1.0,
                     fraction_of_ceiling_cpu=1.0))
    table = pd.DataFrame(recs).set_index("method")
    print(f"\nworkload: {n_src} stage-1 trainings x {base.stage1_steps} steps + {n_tr} stage-2 runs x {base.steps} "
          f"steps ({flops / 1e12:.2f} TFLOP nominal); engine_speedup = method's wall / engine's wall")
    with pd.option_context("display.float_format", "{:.3g}".format, "display.width", 200, "display.max_columns", None):
        print(table)
    if "sharing" not in skip:
        print("\nsharing levers (1 thread, CPU seconds, each against its unshared path in this run):", flush=True)
        print(sharing_ratios().to_string(float_format="{:.2f}".format))
    if args.profile != "none":
        print(f"\nchapters, {args.profile} profile, cold run cache (experiment only, no plotting):", flush=True)
        t = chapter_times(args.profile, args.cores)
        print(t.to_string(float_format="{:.1f}".format))
        print(f"total: {t['wall_s'].sum():.0f} s")


if __name__ == "__main__":
    main()
