"""Where a decode step's GPU time goes: kernels by name, sorted into the story's categories.

The story's profile tables group kernel time into a few families (sparse-MLA decode, the FP32
SIMT GEMM of the indexer and the mHC pre-linear, the elementwise/copy/reduce glue, the MoE
GEMM). :data:`RULES` does that here: an ordered list of (category, regex) tried on each kernel
name, first match wins, anything unmatched is "other" (its share is reported; below 5% is the
target). The regexes cover the kernels an H200 run launches with torch 2.11 / cuBLAS 13 (nvjet,
xmma, cutlass and gemv GEMMs; at::native elementwise, reduce, index and copy kernels; top-k's
radix and bitonic sorts), the lab's Triton kernels and SGLang's. Under the Triton interpreter
there are no kernels: :func:`cpu_rows` builds ``"<region>/<op>"`` rows of CPU time from the step's
``dsv4::`` profiler regions, sorted by :data:`CPU_RULES`.

Kernels replayed from a CUDA graph carry no aten op, so the glue's breakdown by op comes from
one profiled *eager* step of the same stage (:func:`eager_breakdown`): each kernel is charged to
the innermost aten op that launched it, as the story's ``aten::copy_ 35%, mul 13.6%, ...``.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType

DECODE = "sparse-MLA decode"
FP32_GEMM = "FP32 SIMT GEMM (indexer + mHC)"
GLUE = "elementwise/copy/reduce glue"
MOE = "MoE GEMM (stand-in)"
BF16_GEMM = "bf16 GEMM (projections, router, bf16 indexer/mHC)"
INDEXER = "Triton indexer"
TOPK = "top-k / sort"
OTHER = "other"

#: plotting / table order
CATEGORIES = (DECODE, FP32_GEMM, GLUE, MOE, BF16_GEMM, INDEXER, TOPK, OTHER)

#: the story's names for the categories it published (data/campaign/story_profile.csv rows)
STORY_CATEGORY = {DECODE: "sparse-MLA decode", FP32_GEMM: "FP32 SIMT GEMM", GLUE: "elementwise/copy/reduce glue",
                  MOE: "FP4 MoE GEMM"}

#: (category, regex): tried in order on a GPU kernel name (re.search), first match wins.
RULES = [
    # the decode kernels: SGLang's SIMT kernel, the lab's SIMT / head-batched / story kernels, split-K's merge
    (DECODE, r"_tiled_sparse_decode_kernel|_simt_decode_kernel|_head_batched_kernel|_story_kernel|_combine_kernel"
             r"|_hopper_decode_kernel"),
    (INDEXER, r"_indexer_kernel"),
    (MOE, r"_moe_grouped_gemm_kernel|_moe_up_kernel|_moe_up_reduce_kernel|_moe_down_kernel"),
    # fp32 GEMMs without TF32 run on CUDA cores: ffma xmma/cutlass SIMT kernels, sgemm, float gemv
    (FP32_GEMM, r"f32f32_f32f32|sgemm|_ffma|nvjet_sss|(gemv|gemmSN|gemmk1)\w*<(int, ?int, ?)?float\b"
                r"|splitKreduce_kernel<[^>]*\bfloat, float, float, float\b"
                # cuBLAS's fp32 batched matrix-vector path (a bmm with one column): a dot, then a reduce
                r"|(dot_kernel|reduce_1Block_kernel)<float\b"),
    (BF16_GEMM, r"nvjet_|xmma_gemm|cutlass|gemv|gemmSN|gemmk1|splitKreduce|s16816gemm|(bf16|bfloat16).*gemm"),
    (TOPK, r"[Tt]op[Kk]|[Ss]ort|[Rr]adix|bitonic|KthValues|KthCounts|WithinKCounts"),
    # S5's fused glue (kernels/step/) by name, then torch's and Inductor's
    (GLUE, r"^_(mhc_mix_partial|mhc_mix|mhc_combine_norm|mhc_post|attn_input|norm_rope|decode_epilogue|router|silu_mul|moe_sum"
           r"|cache_ids)_kernel$"
           r"|at::native|at_cuda_detail|elementwise|reduce_kernel|Memcpy|Memset|memcpy|_mhc_sinkhorn_kernel"
           r"|^exp2_kernel"
           r"|^triton_(poi|red|per)_|CatArray|[Ii]ndex|gather|scatter|fill|copy|softmax|norm"),
]

#: the interpreter's rows ("<dsv4:: region>/<aten op>" or "<region>/python", see cpu_rows): the
#: region says which kernel ran (its Python time is the interpreted Triton kernel) or which GEMM
#: dtype a stage picked; the rest of a region's Python time is "other".
CPU_RULES = [
    (DECODE, r"^dsv4::decode\[[^\]]*\]/python$"),
    (INDEXER, r"^dsv4::indexer\[triton\]/python$"),
    (MOE, r"^dsv4::moe_experts/python$"),
    (FP32_GEMM, r"^dsv4::mhc_linear\[float32\]/aten::(mm|addmm|matmul|linear)$"
                r"|^dsv4::indexer\[torch_fp32\]/aten::(bmm|mm|matmul)$"),
    (BF16_GEMM, r"/aten::(mm|addmm|bmm|baddbmm|matmul|linear|einsum)$"),
    (TOPK, r"/aten::(topk|sort)$"),
    (GLUE, r"/aten::|^dsv4::sinkhorn/python$|^dsv4::glue\[[a-z_]+\]/python$"),
]

_COMPILED = [(cat, re.compile(rx)) for cat, rx in RULES]
_CPU_COMPILED = [(cat, re.compile(rx)) for cat, rx in CPU_RULES]


#: where each category's kernels may be launched from (the step's ``dsv4::`` regions): the check
#: of the name rules against what an eager step saw (region_mismatches); glue may come from anywhere
EXPECTED_REGIONS = {
    DECODE: r"^dsv4::decode\[",
    INDEXER: r"^dsv4::indexer\[triton\]$",
    MOE: r"^dsv4::moe_experts$",
    FP32_GEMM: r"^dsv4::(mhc_linear\[float32\]|indexer\[torch_fp32\])$",
    BF16_GEMM: r"^dsv4::(attn_proj|indexer_proj|compressor|moe_router|moe_shared|head|mhc_linear\[bfloat16\]"
               r"|indexer\[(torch_bf16|sglang)\])$",
    TOPK: r"^dsv4::(indexer\[|moe_router$)",
}


def classify(name: str) -> str:
    """The category of one kernel name under RULES (a ``dsv4::`` CPU row under CPU_RULES)."""
    for cat, rx in (_CPU_COMPILED if name.startswith("dsv4::") else _COMPILED):
        if rx.search(name):
            return cat
    return OTHER


@dataclass
class KernelProfile:
    """Kernel time of one step: rows {name, us, calls} per step (summed over the profiled runs,
    divided by ``runs``), where they came from, and the kernels' launching regions if known."""
    rows: list
    runs: int
    source: str                       # "graph replay", "eager", "cpu (interpreter)"
    regions: dict = field(default_factory=dict)   # kernel name -> {region: us}

    @property
    def total_us(self) -> float:
        return sum(r["us"] for r in self.rows)

    def by_category(self) -> dict:
        out = {c: 0.0 for c in CATEGORIES}
        for r in self.rows:
            out[classify(r["name"])] += r["us"]
        return out

    def unclassified_share(self) -> float:
        t = self.total_us
        return self.by_category()[OTHER] / t if t else 0.0

    def kernels(self) -> list:
        """Every kernel with its category (and launching regions when an eager step saw it)."""
        return [dict(r, category=classify(r["name"]), regions=self.regions.get(r["name"], {}))
                for r in sorted(self.rows, key=lambda r: -r["us"])]


#: the share of a kernel's time that may sit in no ``dsv4::`` region ('(none)') before it counts as
#: a mismatch: torch.profiler now and then loses the link from a device kernel to the launch that
#: made it (the H200 replay of 2026-12-04T07:15Z: one 5.4 us call of a bf16 GEMM's 129, 0.7%)
UNATTRIBUTED_SHARE = 0.02


def region_mismatches(kernels) -> list:
    """Kernels whose name-rule category disagrees with where an eager step launched them:
    ``kernels`` as KernelProfile.kernels() gives them ({name, category, regions: {region: us}}).
    Time in no region at all counts only past UNATTRIBUTED_SHARE of the kernel's."""
    out = []
    for k in kernels:
        rx = EXPECTED_REGIONS.get(k["category"])
        regions = k.get("regions", {})
        total = sum(regions.values())
        bad = {r: us for r, us in regions.items() if rx and not re.search(rx, r)
               and not (r == "(none)" and us <= UNATTRIBUTED_SHARE * total)}
        if bad:
            out.append(dict(name=k["name"], category=k["category"], unexpected_regions=bad))
    return out


def _activities():
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _device_kernels(events):
    """(name, us) of every device activity (kernels, memcpy, memset) in a profile."""
    for e in events:
        if e.device_type == DeviceType.CUDA:
            yield e.name, e.time_range.end - e.time_range.start


def _region(e) -> str:
    """The innermost ``dsv4::`` profiler region holding event e (itself included), or '(none)'."""
    while e is not None:
        if e.name.startswith("dsv4::"):
            return e.name
        e = e.cpu_parent
    return "(none)"


def _aggregate(pairs, runs) -> list:
    us, calls = defaultdict(float), Counter()
    for name, t in pairs:
        us[name] += t
        calls[name] += 1
    return [dict(name=n, us=us[n] / runs, calls=calls[n] / runs) for n in us]


def profile_runs(fn, runs: int = 3) -> tuple:
    """Profile ``runs`` calls of fn (e.g. a graph's replay), synchronizing after each.
    Returns the torch profiler (events available) and runs."""
    with torch.profiler.profile(activities=_activities()) as prof:
        for _ in range(runs):
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    return prof, runs


def kernel_profile(prof, runs: int, source: str) -> KernelProfile:
    """Device kernel rows of a profile (GPU)."""
    return KernelProfile(_aggregate(_device_kernels(prof.events()), runs), runs, source)


def cpu_rows(prof, runs: int) -> KernelProfile:
    """The interpreter's stand-in for kernel rows: CPU self time per ``<region>/<aten op>`` and
    per ``<region>/python`` (the region's own time: Python and the interpreted Triton kernels)."""
    pairs = []
    for e in prof.events():
        if e.device_type != DeviceType.CPU:
            continue
        if e.name.startswith("dsv4::"):
            pairs.append((f"{e.name}/python", e.self_cpu_time_total))
        elif e.name.startswith("aten::"):
            pairs.append((f"{_region(e.cpu_parent)}/{e.name}", e.self_cpu_time_total))
    rows = [r for r in _aggregate(pairs, runs) if r["us"] > 0]
    return KernelProfile(rows, runs, "cpu (interpreter): CPU self time per region/op, not GPU kernel time")


def launches(prof):
    """(launching CPU event, kernel name, us) for every kernel an eager profile attributes to an op
    or a profiler region (Triton launches are charged to the region that made them)."""
    for e in prof.events():
        if e.device_type == DeviceType.CPU and e.kernels:
            for k in e.kernels:
                yield e, k.name, k.duration


@dataclass
class EagerBreakdown:
    """One eager step: the glue's device time by aten op, and each kernel's launching regions."""
    ops: list                 # [{op, us, share}] over the glue + FP32 GEMM kernels, largest first
    regions: dict             # kernel name -> {region: us}
    region_us: dict           # region -> us of kernels launched inside it
    total_us: float           # every kernel of the eager step


def eager_breakdown(prof, runs: int = 1, categories=(GLUE, FP32_GEMM)) -> EagerBreakdown:
    """Charge each kernel of an eager profile to the innermost aten op that launched it (the
    story counts the indexer's bmm inside the glue, so the default set is the glue and the FP32
    GEMM kernels); Triton kernels launched outside aten ops appear as ``triton:<kernel>``."""
    ops, regions, region_us = defaultdict(float), defaultdict(lambda: defaultdict(float)), defaultdict(float)
    total = 0.0
    for e, name, us in launches(prof):
        total += us
        reg = _region(e)
        regions[name][reg] += us / runs
        region_us[reg] += us / runs
        if classify(name) in categories:
            op = e.name if e.name.startswith("aten::") else f"triton:{name}"
            ops[op] += us / runs
    glue = sum(ops.values())
    rows = [dict(op=k, us=v, share=v / glue if glue else 0.0) for k, v in sorted(ops.items(), key=lambda kv: -kv[1])]
    return EagerBreakdown(rows, {k: dict(v) for k, v in regions.items()}, dict(region_us), total / runs)


def cpu_breakdown(kp: KernelProfile, categories=(GLUE, FP32_GEMM)) -> EagerBreakdown:
    """The interpreter's version of eager_breakdown, from cpu_rows: CPU time by aten op."""
    ops, region_us = defaultdict(float), defaultdict(float)
    for r in kp.rows:
        region, _, op = r["name"].partition("/")
        region_us[region] += r["us"]
        if classify(r["name"]) in categories:
            ops[op if op.startswith("aten::") else f"{region}/{op}"] += r["us"]
    glue = sum(ops.values())
    rows = [dict(op=k, us=v, share=v / glue if glue else 0.0) for k, v in sorted(ops.items(), key=lambda kv: -kv[1])]
    return EagerBreakdown(rows, {}, dict(region_us), kp.total_us)


@contextlib.contextmanager
def _no_fd2():
    """File descriptor 2 to /dev/null: the profiler's C++ side writes a timestamped line there at every
    start and stop (torch 2.13), which a notebook would show as output."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def device_kernel_count(fn) -> int:
    """The device activities (kernels, memcpy, memset) one call of ``fn`` makes, profiled on a GPU."""
    torch.cuda.synchronize()
    with _no_fd2():
        prof, _ = profile_runs(fn, 1)
    return sum(1 for _ in _device_kernels(prof.events()))


def op_breakdown(fn, region: str, categories=(GLUE, FP32_GEMM)) -> EagerBreakdown:
    """One eager call of ``fn`` inside the profiler region ``region`` (a ``dsv4::`` name the rules
    know, e.g. ``dsv4::indexer[torch_fp32]``: there a bmm counts as the FP32 GEMM) after one unprofiled
    call, its time charged to aten ops: each GPU kernel to the op that launched it on a GPU
    (:func:`eager_breakdown`), CPU self time per op under the interpreter (:func:`cpu_breakdown`)."""
    def call():
        with torch.profiler.record_function(region):
            fn()
    call()                                   # first-call work (allocator, library handles) stays out
    with _no_fd2():
        prof, runs = profile_runs(call, 1)
    if torch.cuda.is_available():
        return eager_breakdown(prof, runs, categories)
    return cpu_breakdown(cpu_rows(prof, runs), categories)


def transition_table(before: dict, after: dict, before_name: str, after_name: str) -> list:
    """The story's before/after table: per category ms and share of each stage's kernel time,
    and the speedup (before / after); a final row with the totals. ``before``/``after``: category -> us."""
    tb, ta = sum(before.values()), sum(after.values())
    rows = []
    for c in CATEGORIES:
        b, a = before.get(c, 0.0), after.get(c, 0.0)
        if not b and not a:
            continue
        rows.append({"kernel category": c, f"{before_name} ms": b / 1e3, f"{before_name} %": 100 * b / tb if tb else 0,
                     f"{after_name} ms": a / 1e3, f"{after_name} %": 100 * a / ta if ta else 0,
                     "speedup": b / a if a else float("nan")})
    rows.append({"kernel category": "total kernel time", f"{before_name} ms": tb / 1e3, f"{before_name} %": 100.0,
                 f"{after_name} ms": ta / 1e3, f"{after_name} %": 100.0, "speedup": tb / ta if ta else float("nan")})
    return rows


COLORS = {DECODE: "C3", FP32_GEMM: "C1", GLUE: "C7", MOE: "C2", BF16_GEMM: "C0", INDEXER: "C4", TOPK: "C5",
          OTHER: "C8"}


def category_bars(ax, per_stage: dict, *, share: bool = False, title: str | None = None):
    """Stacked bars, one per stage: kernel time per step by category (ms), or shares (%) with
    ``share``. ``per_stage``: stage name -> {category: us}, in plotting order."""
    names = list(per_stage)
    bottom = [0.0] * len(names)
    for c in CATEGORIES:
        vals = []
        for s in names:
            tot = sum(per_stage[s].values()) or 1.0
            v = per_stage[s].get(c, 0.0)
            vals.append(100 * v / tot if share else v / 1e3)
        if not any(vals):
            continue
        ax.bar(names, vals, bottom=bottom, label=c, color=COLORS[c])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("share of kernel time (%)" if share else "kernel time per step (ms)")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.tick_params(axis="x", labelsize=8)
    return ax
