"""Which register tile and cache blocks the packed GEMM uses, and why.

BLIS and OpenBLAS pick their GEMM micro-kernel per instruction set: a register tile that fills the
vector registers the target has, without spilling. The packed rung of :mod:`.cpu` does the same
from this table:

============  ==============================  =========================  ====================
config        vectors                         float32 tile (MR × NR)     accumulators
============  ==============================  =========================  ====================
``avx512``    512-bit zmm, 32 registers       12 × 32 (2 vectors a row)  24 of 32
``avx2``      256-bit ymm, 16 registers       6 × 16 (2 vectors a row)   12 of 16
``portable``  128-bit (NEON, SSE)             6 × 8 (2 vectors a row)    12 (fits 16 or 32)
============  ==============================  =========================  ====================

A float64 tile has the same rows and vectors, half the lanes (avx2: 6 × 8). Per step of ``k`` the
micro-kernel loads ``NR/lanes`` vectors of B and broadcasts ``MR`` elements of A, so
accumulators + B vectors + one broadcast must fit the register file.

The instruction set is the one **Numba compiles for**: ``numba.config.CPU_NAME`` /
``CPU_FEATURES`` (environment ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``) where set, else the
host's name and features as llvmlite reports them. ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=``
on an AVX-512 machine makes LLVM emit AVX2+FMA code only, and the avx2 configuration is chosen;
``NUMBA_CPU_NAME=haswell`` alone keeps the host's feature flags, AVX-512 included, and LLVM still
emits zmm code (so avx512 is chosen).

Cache blocks follow the BLIS model (Low et al., 2016), from the cache sizes the OS reports
(``/sys/devices/system/cpu/cpu0/cache``, ``os.sysconf``, ``sysctl``; defaults otherwise). The
"why" below is measured on a Zen 5 (48 KiB L1d, 1 MiB L2, 32 MiB L3), float32, n = 2048, one
thread, thread CPU time as a fraction of OpenBLAS's on one thread, AVX-512 code unless noted:

* ``MC × KC``: the block of packed A that one thread multiplies fills half of its L2, so the
  MR-row panels of A come from L2 each time a KC×NR micro-panel of B sweeps past them;
* ``KC = 8·MC`` (:data:`DEPTH`): deep rather than wide. KC×MC = 1088×120 ran at 0.93×,
  768×168 0.92×, 512×240 0.90×, 384×336 0.85×, 256×504 0.83× (AVX2: 1040×126 0.93×,
  512×252 0.91×, 384×336 0.90×). Each call of the micro-kernel loads and stores its MR×NR tile
  of C and starts its accumulators from zero: KC steps of k pay for that, and C is read and
  written once per KC step. That a 1088×32 panel of B (136 KiB) overflows L1 costs less: it
  streams from L2 at 128 bytes per 24 FMAs;
* ``NC``: a KC×NC panel of packed B takes half of L3 (capped at 4096). The loop nest runs NC,
  then KC outermost, so each MC block sweeps one such panel, in L3 for all threads; A is packed
  again for every column block, so fewer, wider ones pack less (NC = 1024 instead of 4032:
  0.90× instead of 0.93× with AVX2, about the same with AVX-512).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from ..errors import ArgumentError, UnknownNameError

# ------------------------------------------------------------------------------------------------
# Configurations
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PackedConfig:
    """A register tile for one class of vector unit.

    Attributes:
        name: Key in :data:`CONFIGS`.
        isa: The instruction sets it is meant for, in words.
        vector_bits: Width of one vector register.
        registers: Vector registers the instruction set has.
        mr: Rows of the register tile (elements of A broadcast per step of k).
        vectors: Vector registers per tile row (vectors of B loaded per step of k).
    """

    name: str
    isa: str
    vector_bits: int
    registers: int
    mr: int
    vectors: int

    def lanes(self, dtype) -> int:
        """Elements of ``dtype`` in one vector register."""
        return self.vector_bits // (8 * np.dtype(dtype).itemsize)

    def tile(self, dtype) -> tuple[int, int]:
        """The register tile ``(MR, NR)`` for ``dtype``: ``NR = vectors · lanes``."""
        return self.mr, self.vectors * self.lanes(dtype)

    @property
    def accumulators(self) -> int:
        """Vector registers holding the C tile: ``MR · vectors``."""
        return self.mr * self.vectors

    @property
    def registers_needed(self) -> int:
        """Accumulators, the B vectors of one step and one broadcast element of A."""
        return self.accumulators + self.vectors + 1

    def blocking(self, dtype, caches: CacheSizes | None = None) -> Blocking:
        """The cache blocks for ``dtype`` from ``caches`` (this machine's by default)."""
        return blocking_for(self, dtype, caches if caches is not None else cache_sizes())


CONFIGS = {
    "avx512": PackedConfig("avx512", "AVX-512F: 512-bit zmm vectors, 32 registers", 512, 32,
                           mr=12, vectors=2),
    "avx2": PackedConfig("avx2", "AVX2 + FMA: 256-bit ymm vectors, 16 registers", 256, 16,
                         mr=6, vectors=2),
    "portable": PackedConfig("portable", "128-bit vectors (NEON: 32 registers, SSE: 16)", 128, 16,
                             mr=6, vectors=2),
}
"""Every configuration, each correct on any machine (LLVM splits or joins vectors that do not
match the hardware); each is *fast* where its instruction set is the one compiled for."""


def get_config(config) -> PackedConfig:
    """A :class:`PackedConfig` from itself or its name in :data:`CONFIGS`."""
    if isinstance(config, PackedConfig):
        return config
    try:
        return CONFIGS[config]
    except (KeyError, TypeError):
        raise UnknownNameError(
            f"matmul_packed: unknown configuration {config!r}; choose one of {list(CONFIGS)}"
        ) from None


# ------------------------------------------------------------------------------------------------
# Cache blocks
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheSizes:
    """Data-cache sizes in bytes (L1d and L2 per core, L3 shared) and where they came from."""

    l1d: int
    l2: int
    l3: int
    source: str


DEFAULT_CACHES = CacheSizes(l1d=32 << 10, l2=512 << 10, l3=8 << 20, source="defaults")


@dataclasses.dataclass(frozen=True)
class Blocking:
    """Register tile ``mr × nr`` and cache blocks ``kc``, ``mc``, ``nc`` of one packed GEMM."""

    mr: int
    nr: int
    kc: int
    mc: int
    nc: int

    def check(self, config: PackedConfig, dtype) -> None:
        """Raise ArgumentError unless the blocks suit ``config``'s tile for ``dtype``."""
        tile = config.tile(dtype)
        where = f"matmul_packed (config {config.name!r}, {np.dtype(dtype)}): blocking {self}"
        if (self.mr, self.nr) != tile:
            raise ArgumentError(f"{where} has tile {self.mr}×{self.nr}; the config's is "
                                f"{tile[0]}×{tile[1]}")
        if min(self.kc, self.mc, self.nc) < 1 or self.mc % self.mr or self.nc % self.nr:
            raise ArgumentError(f"{where}: need kc, mc, nc ≥ 1, mc a multiple of mr and nc of nr")


DEPTH = 8
"""KC / MC: how much deeper than wide the block of packed A is (module docstring)."""


def _round_down(value: float, unit: int, low: int, high: int) -> int:
    """``value`` rounded down to a multiple of ``unit``, clamped to multiples in [low, high]."""
    return int(min(max(value // unit, -(-low // unit)), max(high // unit, 1)) * unit)


def blocking_for(config: PackedConfig, dtype, caches: CacheSizes) -> Blocking:
    """KC, MC, NC for ``config`` and ``dtype`` from cache sizes (module docstring)."""
    size = np.dtype(dtype).itemsize
    mr, nr = config.tile(dtype)
    mc = _round_down(math.sqrt(caches.l2 / (2 * DEPTH * size)), mr, mr, 4096)
    kc = _round_down(caches.l2 / (2 * size * mc), 16, 16, 4096)
    nc = _round_down(caches.l3 / 2 / (kc * size), nr, nr, 4096)
    return Blocking(mr, nr, kc, mc, nc)


def _parse_size(text: str) -> int:
    """``"48K"`` → 49152 (sysfs cache sizes)."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _from_sysfs(root: Path) -> dict:
    sizes = {}
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            sizes[{1: "l1d", 2: "l2", 3: "l3"}.get(level, f"l{level}")] = size
    return sizes


def _from_sysconf() -> dict:
    names = {"l1d": "SC_LEVEL1_DCACHE_SIZE", "l2": "SC_LEVEL2_CACHE_SIZE",
             "l3": "SC_LEVEL3_CACHE_SIZE"}
    sizes = {}
    for key, name in names.items():
        if name in os.sysconf_names:
            value = os.sysconf(name)
            if value > 0:
                sizes[key] = value
    return sizes


def _from_sysctl() -> dict:
    names = {"l1d": "hw.l1dcachesize", "l2": "hw.l2cachesize", "l3": "hw.l3cachesize"}
    sizes = {}
    for key, name in names.items():
        try:
            out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True,
                                 timeout=2, check=True).stdout
            if int(out) > 0:
                sizes[key] = int(out)
        except (OSError, subprocess.SubprocessError, ValueError):
            continue
    return sizes


@functools.lru_cache(maxsize=None)
def cache_sizes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> CacheSizes:
    """This machine's data caches from the OS, each missing level from :data:`DEFAULT_CACHES`."""
    for source, read in ((sysfs, lambda: _from_sysfs(Path(sysfs))),
                         ("os.sysconf", _from_sysconf),
                         ("sysctl", _from_sysctl if sys.platform == "darwin" else dict)):
        found = read()
        if found:
            missing = [k for k in ("l1d", "l2", "l3") if k not in found]
            note = f" ({', '.join(missing)}: default)" if missing else ""
            sizes = {k: found.get(k, getattr(DEFAULT_CACHES, k)) for k in ("l1d", "l2", "l3")}
            return CacheSizes(**sizes, source=source + note)
    return DEFAULT_CACHES


# ------------------------------------------------------------------------------------------------
# The target Numba compiles for
# ------------------------------------------------------------------------------------------------

AVX512_CPUS = frozenset({
    "knl", "knm", "skylake-avx512", "skx", "cascadelake", "cooperlake", "cannonlake",
    "icelake-client", "icelake-server", "rocketlake", "tigerlake", "sapphirerapids",
    "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids", "znver4", "znver5",
    "x86-64-v4",
})
"""LLVM CPU names whose own feature set includes AVX-512F."""

AVX2_FMA_CPUS = frozenset({
    "haswell", "core-avx2", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake",
    "arrowlake", "arrowlake-s", "lunarlake", "pantherlake", "gracemont", "sierraforest",
    "grandridge", "clearwaterforest", "znver1", "znver2", "znver3", "bdver4", "x86-64-v3",
})
"""LLVM CPU names with AVX2 and FMA but no AVX-512F."""


@dataclasses.dataclass(frozen=True)
class NumbaTarget:
    """The CPU model and features LLVM generates Numba's code for.

    Attributes:
        cpu_name: LLVM CPU name (``"znver5"``, ``"haswell"``, ``"generic"``, ``"apple-m1"``).
        features: The explicit feature string (``"+avx2,-avx512f,..."``); ``""`` for none
            beyond what the CPU name implies.
        name_source: Where ``cpu_name`` came from.
        features_source: Where ``features`` came from.
        machine: ``platform.machine()``: the architecture (``x86_64``, ``arm64``, ...).
    """

    cpu_name: str
    features: str
    name_source: str
    features_source: str
    machine: str

    def feature_flags(self) -> dict[str, bool]:
        """``{feature: on}``: what the CPU name implies, then the explicit ``+x``/``-x``."""
        flags = {}
        if self.cpu_name in AVX512_CPUS:
            flags.update(avx512f=True, avx2=True, fma=True)
        elif self.cpu_name in AVX2_FMA_CPUS:
            flags.update(avx2=True, fma=True)
        for item in filter(None, (f.strip() for f in self.features.split(","))):
            flags[item[1:] if item[0] in "+-" else item] = not item.startswith("-")
        return flags


def numba_target() -> NumbaTarget:
    """The target of the code Numba emits in this process (mirrors numba's ``CPUCodegen``)."""
    import llvmlite.binding as llvm
    from numba.core import config

    if config.CPU_NAME is not None:
        name, name_source = config.CPU_NAME, "NUMBA_CPU_NAME"
    else:
        name, name_source = llvm.get_host_cpu_name(), "the host, via llvmlite"
    if config.CPU_FEATURES is not None:
        features, features_source = config.CPU_FEATURES, "NUMBA_CPU_FEATURES"
    else:
        features, features_source = llvm.get_host_cpu_features().flatten(), "the host, via llvmlite"
    return NumbaTarget(name, features, name_source, features_source, platform.machine())


# ------------------------------------------------------------------------------------------------
# The choice
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Choice:
    """The configuration chosen for a target, and the reason in words."""

    config: PackedConfig
    target: NumbaTarget
    caches: CacheSizes
    reason: str

    def blocking(self, dtype) -> Blocking:
        """The chosen configuration's blocks for ``dtype`` on these caches."""
        return blocking_for(self.config, dtype, self.caches)

    def describe(self) -> str:
        """Several lines: the configuration, why, the caches and the blocks per dtype."""
        c, kib = self.caches, 1 << 10
        lines = [f"packed GEMM configuration: {self.config.name} ({self.config.isa})",
                 f"  why: {self.reason}",
                 f"  caches: L1d {c.l1d // kib} KiB, L2 {c.l2 // kib} KiB, L3 {c.l3 // kib} KiB "
                 f"(from {c.source})"]
        for dtype in (np.float32, np.float64):
            b = self.blocking(dtype)
            lines.append(
                f"  {np.dtype(dtype).name}: register tile {b.mr}×{b.nr} "
                f"({self.config.accumulators} vector accumulators), KC={b.kc} MC={b.mc} "
                f"NC={b.nc}")
        return "\n".join(lines)

    __str__ = describe


def choose(target: NumbaTarget, caches: CacheSizes | None = None) -> Choice:
    """The configuration for code compiled for ``target``; a pure function of its arguments."""
    caches = caches if caches is not None else cache_sizes()
    where = (f"Numba compiles for CPU {target.cpu_name!r} ({target.name_source}) with "
             + (f"the features of {target.features_source}" if target.features
                else f"only the CPU's own features ({target.features_source} is empty)"))
    x86 = target.machine.lower() in ("x86_64", "amd64", "i686", "x86")
    flags = target.feature_flags()
    if not x86:
        name, why = "portable", f"{target.machine} is not x86: 128-bit vectors (NEON)"
    elif flags.get("avx512f"):
        name, why = "avx512", "AVX-512F is on"
    elif flags.get("avx2") and flags.get("fma"):
        name, why = "avx2", "AVX2 and FMA are on, AVX-512F is off"
    else:
        missing = [f for f in ("avx2", "fma") if not flags.get(f)]
        name, why = "portable", f"no {' or '.join(missing).upper()}: 128-bit vectors (SSE)"
    return Choice(CONFIGS[name], target, caches, f"{where}; {why} -> {name}")


@functools.lru_cache(maxsize=None)
def selected() -> Choice:
    """The configuration for this process: ``choose(numba_target())``, computed once."""
    return choose(numba_target())
