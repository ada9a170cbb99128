"""Deployments: a named hardware profile x batch size, as data.

A deployment says what the cost model and the compiler may assume: HBM bandwidth, bf16 peak,
SM count, L2 size, launch and graph-replay overhead, memory, batch size and context range, and
which device/dtype the compiled module runs in. Built-in profiles: ``{h100,h200,a100}-bs{1,8,16,32}``
and ``cpu``; a custom one comes from a TOML or JSON file with the same fields (``base = "h200"``
inherits a built-in GPU's fields). Calibration (``specc calibrate``) writes measured efficiency
factors into such a file.

Figures are datasheet leads except where a comment says measured (the ``cpu`` profile's are a
rough guess for a small x86 machine, see ``_builtin``); calibration replaces them.
Link figures: NVLink 4 (H100/H200 SXM) 900 GB/s bidirectional = 450 GB/s per direction, NVLink 3
(A100) 600 GB/s = 300 GB/s; ring-step latency a few microseconds (leads, not measured here).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from specc.errors import UserError

GPUS: dict[str, dict[str, Any]] = {
    # H200 SXM: 4.8 TB/s datasheet; 4.26 TB/s read+write measured by a D2D copy here (DESIGN.md).
    "h200": dict(gpu="NVIDIA H200", hbm_bandwidth=4.8e12, bf16_flops=989e12, sm_count=132, l2_bytes=50 * 2**20,
                 memory_bytes=141e9, launch_overhead_s=4e-6, graph_node_overhead_s=1.5e-6,
                 bandwidth_efficiency=0.72, flops_efficiency=0.78, link_bandwidth=450e9, link_latency_s=3e-6,
                 # bf12 layout-3 linears (the tensor-core kernel at 1-32 rows), packed bytes / time / HBM
                 # per M: at 1 and 16 rows the values that make the cost model's packed / unpacked
                 # Qwen3-8B step ratios the ones measured on the H200 (AR 0.978, Q = 16 verify 1.032,
                 # docs/benchmarks/run32.md; the layout-1 table before priced them 0.889 and 1.78);
                 # 4, 24 and 32 rows scaled from 1 and 16 as the H100's shipped launches measured
                 # (run34.md, section 1); 64 rows (the Triton kernel) layout 1's, h200-run5.md. Not
                 # per-linear measurements: `bench_bf12.py --deployment h200-bs1` replaces them.
                 packed_linear_bandwidth_by_m=((1, 0.568), (4, 0.547), (16, 0.522), (24, 0.463), (32, 0.450),
                                               (64, 0.172)),
                 # measured: B = 16 speculative step's acceptance + between-step device idle (0.615 ms)
                 # less the AR step's (0.228 ms), examples/profile_batch_parts.py (docs/benchmarks/run26.md)
                 spec_host_s=0.39e-3),
    "h100": dict(gpu="NVIDIA H100 SXM", hbm_bandwidth=3.35e12, bf16_flops=989e12, sm_count=132, l2_bytes=50 * 2**20,
                 memory_bytes=80e9, launch_overhead_s=4e-6, graph_node_overhead_s=1.5e-6,
                 bandwidth_efficiency=0.80, flops_efficiency=0.75, link_bandwidth=450e9, link_latency_s=3e-6,
                 # measured: bf12 linears of a Qwen3-8B layer (qkv, o, gate_up, down) alone, median packed
                 # bytes / time / HBM per M, layout 3 (the pack pass's default), the launch engines run
                 # (linear_bf12_mma.get_config): the tensor-core kernel at 1-32 rows (one launch), the
                 # Triton kernel at 64 (docs/benchmarks/run34.md, section 1)
                 packed_linear_bandwidth_by_m=((1, 0.775), (4, 0.747), (16, 0.641), (24, 0.569), (32, 0.553),
                                               (64, 0.112)),
                 # measured as h200's: 0.859 - 0.285 ms at B = 16, 0.927 - 0.266 at B = 32 (run24.md)
                 spec_host_s=0.6e-3),
    "a100": dict(gpu="NVIDIA A100 SXM 80GB", hbm_bandwidth=2.04e12, bf16_flops=312e12, sm_count=108,
                 l2_bytes=40 * 2**20, memory_bytes=80e9, launch_overhead_s=5e-6, graph_node_overhead_s=2e-6,
                 bandwidth_efficiency=0.85, flops_efficiency=0.75, link_bandwidth=300e9, link_latency_s=4e-6),
}
BATCH_SIZES = (1, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class Deployment:
    name: str
    gpu: str
    device: str  # "cuda" | "cpu"
    dtype: str  # compute dtype of the compiled module
    batch_size: int
    hbm_bandwidth: float  # bytes/s (datasheet)
    bf16_flops: float  # FLOP/s (datasheet, dense)
    sm_count: int
    l2_bytes: int
    memory_bytes: float
    launch_overhead_s: float  # one kernel launch, eager
    graph_node_overhead_s: float  # one kernel inside a CUDA graph replay
    bandwidth_efficiency: float = 0.8  # achieved / datasheet bandwidth (calibration sets it)
    flops_efficiency: float = 0.7
    # GPU-to-GPU link (NVLink) per direction, and the fixed cost of one ring step: the cost of the
    # all-reduce nodes of tensor-parallel steps. 0 = no link (single GPU, CPU).
    link_bandwidth: float = 0.0
    link_latency_s: float = 0.0
    # Bandwidth efficiency (on packed bytes) of the bf12 linears per row count M, where measured:
    # they lose efficiency with M much faster than bf16 ones, so ``bandwidth_efficiency`` would
    # have the cost model pack where packing loses. A calibration record's table replaces it.
    # ((M, efficiency), ...), sorted by M; a file may give {"1": 0.63, "16": 0.29}.
    packed_linear_bandwidth_by_m: tuple = ()
    # Host time a batched speculative step (B > 1, drafts verified) spends beyond an AR step's
    # while the GPU waits: reading the decision, the drafter's and the loop's per-row bookkeeping
    # between steps. Measured on the GPU machines' hosts (``examples/profile_batch_parts.py``:
    # acceptance + between-step parts of the speculative step less the AR step's); the cost
    # model adds it to every batched verify forward's acceptance read. At batch 1 the loop's
    # whole-step graphs and drafting ahead hide it (priced 0 there).
    spec_host_s: float = 0.0
    context_min: int = 0
    context_max: int = 4096
    calibrated: bool = False
    source: str = "built-in"

    @property
    def effective_bandwidth(self) -> float:
        return self.hbm_bandwidth * self.bandwidth_efficiency

    @property
    def effective_flops(self) -> float:
        return self.bf16_flops * self.flops_efficiency

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _builtin() -> dict[str, Deployment]:
    table = {}
    for gpu, fields in GPUS.items():
        for bs in BATCH_SIZES:
            name = f"{gpu}-bs{bs}"
            table[name] = Deployment(name=name, device="cuda", dtype="bfloat16", batch_size=bs, **fields)
    # The CPU profile: fp32 reference kernels run by torch. A rough guess, not a datasheet: CPUs
    # differ too much for one profile, so predictions on it can be far off until
    # `specc calibrate --deployment cpu` measures the machine. The leads are a small x86 machine
    # (2 cores, AVX2/AVX-512, dual-channel memory, 32 MiB last-level cache) decoding with one
    # thread: memory ~50 GB/s (a copy past the cache measured 56-61 GB/s on such a machine), of
    # which one thread's fp32 GEMV streams ~0.35 (15-23 GB/s by shape); fp32 peak ~200 GFLOP/s
    # for 2 cores, of which a one-thread GEMM at verify row counts (M = 16) keeps ~0.3; one
    # aten op dispatch ~3 us (1.9-3.1 us measured), the cost every IR launch is priced at.
    table["cpu"] = Deployment(name="cpu", gpu="cpu", device="cpu", dtype="float32", batch_size=1,
                              hbm_bandwidth=50e9, bf16_flops=200e9, sm_count=2, l2_bytes=32 * 2**20,
                              memory_bytes=24e9, launch_overhead_s=3e-6, graph_node_overhead_s=3e-6,
                              bandwidth_efficiency=0.35, flops_efficiency=0.3)
    return table


BUILTIN = _builtin()


def deployment_names() -> list[str]:
    return list(BUILTIN)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read deployment file ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: deployment file is not UTF-8 text ({exc.reason})") from exc
    try:
        if path.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                raise UserError(f"{path}: TOML deployment files need Python 3.11+ (give a .json file)") from None
            return tomllib.loads(text)
        return json.loads(text)
    except Exception as exc:
        raise UserError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'} ({exc})") from exc


_POSITIVE = ("hbm_bandwidth", "bf16_flops", "memory_bytes", "bandwidth_efficiency", "flops_efficiency")
_NON_NEGATIVE = ("launch_overhead_s", "graph_node_overhead_s", "link_bandwidth", "link_latency_s", "spec_host_s")


def _check_fields(fields: dict[str, Any], source: str) -> None:
    """Types and ranges of every deployment field (one-line UserError naming the field)."""
    import math

    def bad(name, what):
        return UserError(f"{source}: deployment field {name} = {fields.get(name)!r} {what}")

    for name in ("name", "gpu", "device", "dtype", "source"):
        if not isinstance(fields.get(name), str):
            raise bad(name, "must be a string")
    if fields["dtype"] not in ("float32", "bfloat16", "float16"):
        raise bad("dtype", "must be float32, bfloat16 or float16")
    for name in ("batch_size", "sm_count", "l2_bytes", "context_min", "context_max"):
        v = fields.get(name)
        if not isinstance(v, int) or isinstance(v, bool):
            raise bad(name, "must be an integer")
    if not 1 <= fields["batch_size"] <= 65536:
        raise bad("batch_size", "must be in 1..65536")
    if fields["sm_count"] < 1 or fields["l2_bytes"] < 0:
        raise bad("sm_count" if fields["sm_count"] < 1 else "l2_bytes", "is out of range")
    if not 0 <= fields["context_min"] <= fields["context_max"] <= 1 << 24:
        raise bad("context_max", f"must satisfy 0 <= context_min <= context_max <= {1 << 24}")
    for name in _POSITIVE + _NON_NEGATIVE:
        v = fields.get(name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise bad(name, "must be a finite number")
        if v < 0 or (name in _POSITIVE and v == 0):
            raise bad(name, "must be " + ("> 0" if name in _POSITIVE else ">= 0"))
    for name in ("bandwidth_efficiency", "flops_efficiency"):
        if fields[name] > 4:
            raise bad(name, "is not an efficiency (expected about 0..1)")
    if not isinstance(fields.get("calibrated", False), bool):
        raise bad("calibrated", "must be true or false")


def from_dict(data: dict[str, Any], source: str) -> Deployment:
    if not isinstance(data, dict):
        raise UserError(f"{source}: a deployment file holds one object (table) of fields")
    data = dict(data)
    base = data.pop("base", None)
    fields: dict[str, Any] = {}
    if base is not None:
        if not isinstance(base, str):
            raise UserError(f"{source}: base must be a name (built-in GPUs: {', '.join(GPUS)})")
        if base in BUILTIN:
            fields.update(dataclasses.asdict(BUILTIN[base]))
        elif base in GPUS:
            fields.update(GPUS[base], device="cuda", dtype="bfloat16", batch_size=1)
        else:
            raise UserError(f"{source}: unknown base {base!r} (built-in GPUs: {', '.join(GPUS)})")
    fields.update(data)
    fields.setdefault("name", Path(source).stem)
    fields["source"] = source
    known = {f.name for f in dataclasses.fields(Deployment)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UserError(f"{source}: unknown deployment fields {unknown} (known: {sorted(known)})")
    missing = sorted(f.name for f in dataclasses.fields(Deployment)
                     if f.name not in fields and f.default is dataclasses.MISSING)
    if missing:
        raise UserError(f"{source}: deployment misses fields {missing} (or give base = \"h200\")")
    for f in dataclasses.fields(Deployment):  # a GPU base names its figures, not every default
        if f.name not in fields and f.default is not dataclasses.MISSING:
            fields[f.name] = f.default
    if fields["device"] not in ("cuda", "cpu"):
        raise UserError(f"{source}: device must be 'cuda' or 'cpu'")
    for name in ("memory_bytes", "l2_bytes", "hbm_bandwidth", "bf16_flops", "link_bandwidth"):
        # TOML/JSON users write 141e9: an integral float is fine for the integer fields
        if isinstance(fields.get(name), float) and name == "l2_bytes" and fields[name].is_integer():
            fields[name] = int(fields[name])
    if "packed_linear_bandwidth_by_m" in fields:
        fields["packed_linear_bandwidth_by_m"] = _packed_table(fields["packed_linear_bandwidth_by_m"], source)
    _check_fields(fields, source)
    return Deployment(**fields)


def _packed_table(value, source: str) -> tuple:
    """``{"1": 0.63, ...}`` or ``[[1, 0.63], ...]`` -> ((1, 0.63), ...) sorted by M, checked."""
    pairs = value.items() if isinstance(value, dict) else value
    try:
        table = tuple(sorted((int(m), float(e)) for m, e in pairs))
    except (TypeError, ValueError):
        raise UserError(f"{source}: packed_linear_bandwidth_by_m must map row counts M to efficiencies "
                        f"(e.g. {{\"1\": 0.63, \"16\": 0.29}})") from None
    if any(m < 1 or not 0 < e <= 1 for m, e in table):
        raise UserError(f"{source}: packed_linear_bandwidth_by_m needs M >= 1 and efficiencies in (0, 1]")
    return table


def get_deployment(name_or_path: str) -> Deployment:
    """A built-in name (``h200-bs1``, ``cpu``...) or a TOML/JSON file path."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".toml", ".json"):
        if not path.is_file():
            raise UserError(f"{path}: no such deployment file")
        return from_dict(_read_file(path), str(path))
    raise UserError(f"unknown deployment {name_or_path!r}; valid: {', '.join(BUILTIN)} or a .toml/.json file")


def save_deployment(dep: Deployment, path) -> None:
    from specc.fileio import atomic_write_text, file_lock

    with file_lock(Path(path)):
        atomic_write_text(Path(path), json.dumps(dep.to_json(), indent=2) + "\n")
