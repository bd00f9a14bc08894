"""The numeric environment of the book's runs: CPU kernels pinned to one instruction-set level, and its record.

Why. torch's CPU kernels are chosen at run time by instruction set: ATen's vectorized kernels (``DEFAULT``,
``AVX2``, ``AVX512``), oneDNN's JIT convolutions and MKL's BLAS each pick the widest the CPU offers, and the
picks round differently in the last bits. Training amplifies those bits (one release unit's ``task_a_after`` was
0.967 on an AVX-512 machine and 0.807 on an AVX2-only one), so a release computed on one CPU did not recompute
``==`` on another. Pinning every library to one level that any x86-64 CPU of the last decade offers makes the
kernels, and so the rows, the same on all of them.

The pin (:data:`PIN`), set in the environment before torch runs its first operation in a process (torch, oneDNN
and MKL read these settings once, on first use):

* ``ATEN_CPU_CAPABILITY=avx2``: ATen's vectorized kernels at AVX2 (torch's documented dispatch override);
* ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN (convolutions) JITs no code above AVX2 (oneDNN's "CPU dispatcher control");
* ``MKL_CBWR=COMPATIBLE``: MKL's conditional numerical reproducibility, in the one branch that MKL honours on
  every x86-64 CPU. ``MKL_CBWR=AVX2`` would be the natural choice, but MKL honours it on Intel CPUs only; on
  AMD it silently falls back to its automatic branch (``MKL_VERBOSE=1`` prints ``CNR:AUTO`` on this project's
  AMD EPYC machines, ``CNR:COMPATIBLE`` with this setting).

What it cannot pin (measured, see ``book/reproduce.md``): the results of the CPU's approximate instructions
(``rsqrtps``/``rcpps``), whose tables differ between CPU vendors, reach MKL's vector math (torch's ``sqrt``, in
Adam's update). The CPU vendor is therefore part of the environment's identity (:func:`identity`): rows are
expected ``==`` between machines of one vendor under the pin, and are checked statistically across vendors.

``BNSTUDY_NUMERICS=native`` turns the pin off (each library uses the widest kernels the CPU has: faster on an
AVX-512 machine, see ``make bench``); rows computed so are keyed and recorded as native, never mixed with pinned
ones in the run cache (:func:`key` is part of every cache key, :func:`bnstudy.study.sweep.config_key`).

This module imports torch only inside functions, so :func:`apply_pin` can run before torch initializes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path

#: The pinned settings: environment variable -> value (see the module docstring for each one's reason).
PIN = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE"}
#: The environment variable that chooses the mode: ``pinned`` (default) or ``native``.
MODE_ENV = "BNSTUDY_NUMERICS"
MODES = ("pinned", "native")
#: CPU flags (``/proc/cpuinfo``) that decide which kernels the libraries would pick unpinned.
FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
         "avx512_bf16", "amx_tile", "avx_vnni")
#: The parts of :func:`record` that must agree for two machines to compute the same bits (:func:`identity`).
IDENTITY = ("mode", "settings", "capability", "machine", "vendor", "torch", "mkl", "onednn", "device")


def mode() -> str:
    """``pinned`` or ``native``, from ``$BNSTUDY_NUMERICS`` (default ``pinned``).

    Raises ``ValueError`` naming the variable and the allowed values for anything else."""
    m = (os.environ.get(MODE_ENV) or "pinned").strip().lower()
    if m not in MODES:
        raise ValueError(f"{MODE_ENV}={os.environ.get(MODE_ENV)!r} is not allowed; choose one of {list(MODES)}")
    return m


def apply_pin() -> dict:
    """Set :data:`PIN` in ``os.environ`` (pinned mode; nothing in native mode) and return the settings in force.

    Takes effect for torch in this process only if no torch operation has run yet (ATen, oneDNN and MKL read their
    settings once); processes started afterwards (joblib's loky workers, a dask cluster's) inherit it.
    :func:`check` tells whether a process computes under the expected kernels."""
    if mode() == "pinned":
        os.environ.update(PIN)
    return settings()


def settings() -> dict:
    """The values of :data:`PIN`'s variables in this process's environment (``None`` where unset)."""
    return {k: os.environ.get(k) for k in PIN}


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict:
    """``dict(model, vendor, flags)`` of this machine's CPU from ``/proc/cpuinfo`` (``flags``: which of :data:`FLAGS`
    it offers); ``platform.processor()`` and no flags where ``/proc/cpuinfo`` is missing (not Linux)."""
    model, vendor, flags = platform.processor() or "unknown", "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k = k.strip().lower()
            if k == "model name":
                model = v.strip()
            elif k == "vendor_id":
                vendor = v.strip()
            elif k == "flags":
                flags = set(v.split())
                break
    except OSError:
        pass
    return dict(model=model, vendor=vendor, flags={f: f in flags for f in FLAGS})


@functools.lru_cache(maxsize=1)
def library_versions() -> dict:
    """``dict(torch, mkl, onednn)``: torch's version and the MKL and oneDNN versions its build reports
    (``torch.__config__.show()``; ``None`` where the build has no such library)."""
    import re

    import torch
    text = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([^\s]+)", text)
    dnn = re.search(r"MKL-DNN v([^\s]+)", text)
    return dict(torch=torch.__version__, mkl=mkl.group(1) if mkl else None, onednn=dnn.group(1) if dnn else None)


def capability() -> str:
    """The ATen CPU capability torch computes with in this process (``DEFAULT``, ``AVX2``, ``AVX512``, ...).

    Fixed at torch's first CPU operation in the process; asking fixes it if nothing has yet."""
    import torch
    return torch.backends.cpu.get_cpu_capability()


def expected_capability() -> str:
    """The capability a process of this machine computes with in the current mode: ``AVX2`` pinned (``DEFAULT`` on
    a CPU without AVX2, where the pin cannot hold), this process's own capability native."""
    if mode() == "native":
        return capability()
    return "AVX2" if cpu_info()["flags"].get("avx2", True) else "DEFAULT"


def device() -> str:
    """``cpu``, or ``cuda:<name>`` where torch sees a GPU (the book's runs use CUDA when present)."""
    import torch
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return "cpu"


def expected() -> dict:
    """The numeric environment this machine's runs compute under in the current mode (:func:`record`'s fields),
    from the pin and the CPU: what every worker must match (:func:`check`) and what :func:`key` hashes."""
    cpu = cpu_info()
    return dict(mode=mode(), settings=dict(PIN) if mode() == "pinned" else settings(),
                capability=expected_capability(), machine=platform.machine(), vendor=cpu["vendor"],
                **library_versions(), device=device(), cpu=cpu["model"], cpu_flags=cpu["flags"])


def record() -> dict:
    """The numeric environment of this process, measured: the mode, the pinned variables' values, the capability
    torch reports, the architecture, CPU vendor, model and flags, torch / MKL / oneDNN versions and the device.
    What the release's manifest stores per chapter."""
    cpu = cpu_info()
    return dict(mode=mode(), settings=settings(), capability=capability(), machine=platform.machine(),
                vendor=cpu["vendor"], **library_versions(), device=device(), cpu=cpu["model"], cpu_flags=cpu["flags"])


def identity(rec: dict) -> dict:
    """The parts of a record that decide the bits (:data:`IDENTITY`): not the CPU model or its flags, which the pin
    makes irrelevant."""
    return {k: rec.get(k) for k in IDENTITY}


def key(rec: dict | None = None) -> str:
    """A short id of a numeric environment's :func:`identity` (default: :func:`expected`): ``pinned-avx2-1a2b3c4d``
    or ``native-avx512-...``; part of every run cache key and of every recorded unit."""
    rec = expected() if rec is None else rec
    digest = hashlib.sha256(json.dumps(identity(rec), sort_keys=True).encode()).hexdigest()[:8]
    return f"{rec.get('mode')}-{str(rec.get('capability')).lower()}-{digest}"


#: What a difference in each identity field means, for :func:`differences`.
_WHY = {
    "mode": "one was computed with the kernel pin, the other without",
    "settings": "the kernel settings differ",
    "capability": "torch's CPU kernels differ (ATen dispatch)",
    "machine": "another processor architecture",
    "vendor": "another CPU vendor (approximate instructions such as rsqrtps differ between vendors)",
    "torch": "another torch version",
    "mkl": "another MKL version",
    "onednn": "another oneDNN version",
    "device": "another device",
}


def differences(release: dict | None, here: dict) -> list[str]:
    """Each identity field in which ``release`` (a recorded environment, or ``None`` for one computed before
    environments were recorded) and ``here`` differ, as ``"capability: release AVX512, here AVX2 (torch's CPU kernels
    differ (ATen dispatch))"``; empty when the two compute the same bits."""
    if not release:
        return ["numeric environment: the release's rows were computed before the kernel pin and record no numeric "
                f"environment (CPU only), here {key(here)}"]
    out = []
    for k in IDENTITY:
        a, b = release.get(k), here.get(k)
        if a != b:
            out.append(f"{k}: release {a}, here {b} ({_WHY[k]})")
    return out


def check(want: dict) -> None:
    """Raise ``RuntimeError`` unless this process computes under ``want``'s identity (a worker's check before it
    runs anything: a row computed under other kernels must never be cached under ``want``'s key).

    The message names each differing part and how to start the process pinned."""
    got = record()
    diff = [d for d in differences(want, got)]
    if diff:
        raise RuntimeError(
            "bnstudy: this process's numeric kernels are not the run's (" + "; ".join(diff) + "). torch fixes its "
            "kernels at its first operation in a process: import bnstudy.study.sweep (which sets the pin) before running "
            "any torch operation, and start dask/ray workers after that import, or export "
            + " ".join(f"{k}={v}" for k, v in PIN.items()) + f" before Python starts ({MODE_ENV}=native: no pin)")


def describe(rec: dict | None) -> str:
    """One line for a page or a report: ``pinned kernels (ATen AVX2, oneDNN AVX2, MKL COMPATIBLE) on AuthenticAMD
    AMD EPYC (AVX-512), torch 2.13.0+cpu``; for ``None``: not recorded."""
    if not rec:
        return "numeric environment not recorded (computed before the kernel pin)"
    s = rec.get("settings") or {}
    flags = rec.get("cpu_flags") or {}
    isa = "AVX-512" if flags.get("avx512f") else "AVX2" if flags.get("avx2") else "no AVX2"
    kernels = (f"pinned kernels (ATen {rec.get('capability')}, oneDNN {s.get('ONEDNN_MAX_CPU_ISA')}, MKL "
               f"{s.get('MKL_CBWR')})" if rec.get("mode") == "pinned" else f"native kernels (ATen {rec.get('capability')})")
    return f"{kernels} on {rec.get('vendor')} {rec.get('cpu')} ({isa}), torch {rec.get('torch')}, {rec.get('device')}"
