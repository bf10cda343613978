"""compute-sanitizer memcheck and racecheck over every kernel the lab ships, at small shapes. One JSON.

    PYTHONPATH=. python experiments/compute_sanitizer/run.py OUT.json [--cpu-smoke] [--tools memcheck racecheck]
        [--only TARGET_PREFIX]

The driver runs this same file once per tool under ``compute-sanitizer --tool TOOL`` with
``--targets``: every target (a decode impl, the merged two-cache decode, the indexer's logits and
top-k, each with the guard launches its API path adds; on a GPU also the top-k with its shared-memory
histogram, `topk:shared*`, whose barriers the lab places) runs once at a small shape with padding,
a topk_len, a sink, indices on page boundaries and, for the decode, indices past the cache that
the device-side checks must read as padding. The child prints one line per target it finished;
the driver parses the sanitizer's ``ERROR SUMMARY`` and the kernels its reports name.

On sm_90 three more targets are controls, not lab kernels: Gluon kernels with the ``hopper``
kernel's warp specialization (8 default warps, a 4-warp worker at 96 registers, a 168-register
cap) and none of its data protocol. ``control:warp_specialize``: each partition writes one value to
global memory; ``control:warp_specialize_capture``: plus a value loaded before the split, handed to
both; ``control:warp_specialize_smem``: plus what ``hopper`` does around the split (a tile stored to
shared memory and read by the default partition, two mbarriers initialized, a shared-memory store
and load among the worker's warps); ``control:mbarrier_array`` / ``control:mbarrier_separate``:
the second control after two mbarrier inits, of one allocation (Triton puts ``bar.sync 0, 256``
between them, as in ``hopper``) or of two (no barrier). Hazards in them come from Triton's
partition hand-off, not from code the lab wrote (README: run 2).

Rows (``rows``): one per (tool, target): ``finished`` (the target ran to its end under the tool),
``errors`` (the sanitizer's count for the whole process, shared by its targets), ``kernels``
(the kernel names in its reports). ``status`` per tool: "clean", "errors", or "refused" (the
sanitizer could not attach on this runtime: reported, never counted as clean). The run also
keeps the sanitizer's version and the last lines of its output. With ``--cpu-smoke`` (automatic
without a GPU) the targets run once through Triton's interpreter and no sanitizer runs.
Expected runtime on an H200: up to 2 minutes per tool (130 s limit each), most of it Triton loading the kernels
under the tool (run after another GPU script has filled Triton's cache).
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path
import time

import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import torch

from dsv4lab import api, errors
from dsv4lab.kernels.decode import hopper
from dsv4lab.kernels.indexer.topk import TopkLaunch, topk_triton
from dsv4lab.testing import make_decode_inputs, make_indexer_inputs, make_merged_decode_inputs
from dsv4lab import registry
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "compute_sanitizer"
DECODE_IMPLS = ("simt", "mma_story", "mma", "splitk", "splitk_auto", "auto", "hopper", "sglang")


def targets(smoke: bool) -> dict:
    """name -> a call that runs that target once (small shapes)."""
    H, K, ctx = (4, 24, 80) if smoke else (64, 100, 300)
    dec = make_decode_inputs(3, H, K, context=ctx, pad_frac=0.1, topk_len=True, sink=True, seed=1)
    dec.indices[0, :4] = torch.tensor([63, 64, 127, 128], dtype=torch.int32)           # page boundaries
    dec.indices[1, 0] = dec.cache.num_tokens + 5                                        # past the cache
    merged = make_merged_decode_inputs(2, H, 16 if smoke else 128, 16 if smoke else 64,
                                       window_context=64 if smoke else 256,
                                       compressed_context=64 if smoke else 512, topk_len=True, sink=True, seed=2)
    L = 200 if smoke else 1000
    idx = make_indexer_inputs(3, 8 if smoke else 64, L, seq_lens=[L, 65, 0], seed=3)
    out = {}
    for impl in DECODE_IMPLS:
        if impl in registry.impls() and not (smoke and "gpu" in registry.impl_info("sparse_decode", impl).needs):
            out[f"decode:{impl}"] = lambda impl=impl: api.sparse_decode(
                dec.q, dec.cache, dec.indices, impl=impl, **dec.kwargs())
    out["merged:auto"] = lambda: dsv4lab.flash_mla_sparse_decode(*merged.sglang_args(), impl="auto")
    out["indexer_logits:triton"] = lambda: dsv4lab.indexer_logits(*idx.args(), max_seq_len=L, impl="triton")
    out["indexer_topk:triton"] = lambda: dsv4lab.indexer_topk(*idx.args(), max_seq_len=L, topk=16 if smoke else 64,
                                                               impl="triton")
    if not smoke:                       # the top-k's shared-memory histogram: its barriers are the lab's own
        g = torch.Generator().manual_seed(4)
        xs, ns = torch.randn(2, 3000, generator=g).cuda(), torch.tensor([3000, 1700], dtype=torch.int32).cuda()
        for name, launch in {"topk:shared": TopkLaunch(histogram="shared", split=2),
                             "topk:shared_streamed": TopkLaunch(tile=1024, histogram="shared", split=2),
                             "topk:shared_one_program": TopkLaunch(tile=1024, histogram="shared", split=1)}.items():
            out[name] = lambda launch=launch: topk_triton(xs, ns, 512, launch=launch)
    if not smoke and hopper.unavailable_reason() is None:
        out["control:warp_specialize"] = control(_control_kernel, captured=False)
        out["control:warp_specialize_capture"] = control(_capture_kernel)
        out["control:warp_specialize_smem"] = control(_smem_kernel, tile=True)
        out["control:mbarrier_array"] = control(_mbarrier_array_kernel)
        out["control:mbarrier_separate"] = control(_mbarrier_separate_kernel)
    return out


try:                                    # Gluon (triton >= 3.4) for the control target only
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
except Exception:  # noqa: BLE001
    gluon = None

if gluon is not None:
    @gluon.jit
    def _control_default(OUT):
        gl.store(OUT + gl.program_id(0) * 2, gl.program_id(0))

    @gluon.jit
    def _control_worker(OUT):
        gl.store(OUT + gl.program_id(0) * 2 + 1, gl.program_id(0) + 1)

    @gluon.jit
    def _control_kernel(OUT, num_warps: gl.constexpr):
        gl.warp_specialize([(_control_default, (OUT,)), (_control_worker, (OUT,))], [4], [96])

    @gluon.jit
    def _capture_default(OUT, v):
        gl.store(OUT + gl.program_id(0) * 2, v)

    @gluon.jit
    def _capture_worker(OUT, v):
        gl.store(OUT + gl.program_id(0) * 2 + 1, v + 1)

    @gluon.jit
    def _capture_kernel(OUT, IN, num_warps: gl.constexpr):
        v = gl.load(IN + gl.program_id(0))            # a value computed before the split, as hopper's row / lo / hi
        gl.warp_specialize([(_capture_default, (OUT, v)), (_capture_worker, (OUT, v))], [4], [96])

    @gluon.jit
    def _mbarrier_array_kernel(OUT, IN, num_warps: gl.constexpr):
        # two mbarriers of one allocation: Triton puts a barrier of the default warps (bar.sync 0, 256)
        # between their inits, as in hopper's prologue
        v = gl.load(IN + gl.program_id(0))
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        gl.warp_specialize([(_capture_default, (OUT, v)), (_capture_worker, (OUT, v))], [4], [96])

    @gluon.jit
    def _mbarrier_separate_kernel(OUT, IN, num_warps: gl.constexpr):
        # the same two mbarriers as two allocations: no barrier between the inits (SASS, triton 3.6)
        v = gl.load(IN + gl.program_id(0))
        b0 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        b1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(b0, count=1)
        mbarrier.init(b1, count=1)
        fence_async_shared()
        gl.warp_specialize([(_capture_default, (OUT, v)), (_capture_worker, (OUT, v))], [4], [96])

    @gluon.jit
    def _smem_default(OUT, SUM, v, tile):
        # reads the tile the default warps stored before the split (as hopper's consumers read Q)
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
        gl.store(SUM + gl.program_id(0), gl.sum(gl.sum(tile.load(ld).to(gl.float32), axis=1), axis=0))
        gl.store(OUT + gl.program_id(0) * 2, v)

    @gluon.jit
    def _smem_worker(OUT, v, wbuf):
        # a store and a load of shared memory among the worker's own warps (as hopper's producer)
        lw: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        i = gl.arange(0, 128, layout=lw)
        wbuf.store(i + v)
        got = wbuf.load(lw)
        gl.store(OUT + gl.program_id(0) * 2 + 1, gl.max(got, axis=0) - 126)

    @gluon.jit
    def _smem_kernel(OUT, SUM, IN, X, num_warps: gl.constexpr):
        # what hopper does before its split: a tile stored to shared memory, two mbarriers initialized
        v = gl.load(IN + gl.program_id(0))
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
        cols = gl.arange(0, 256, layout=gl.SliceLayout(0, ld))
        x = gl.load(X + gl.expand_dims(rows, 1) * 256 + gl.expand_dims(cols, 0))
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 256], gl.bfloat16)
        tile = gl.allocate_shared_memory(gl.bfloat16, [64, 256], layout, x)
        wbuf = gl.allocate_shared_memory(gl.int32, [128], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        gl.warp_specialize([(_smem_default, (OUT, SUM, v, tile)), (_smem_worker, (OUT, v, wbuf))], [4], [96])


def control(kernel, *, captured: bool = True, tile: bool = False):
    """A control target: ``kernel`` on 8 programs, each partition writing one value to ``out``
    (the default partition program p at 2p, the worker p + 1 at 2p + 1); ``captured``: p comes in
    through a tensor loaded before the split; ``tile``: a [64, 256] bf16 tile of ones is stored to
    shared memory and summed by the default partition. Raises unless every value is right."""
    def run():
        dev = "cuda"
        out = torch.zeros(16, dtype=torch.int32, device=dev)
        args = [out]
        sums = torch.zeros(8, dtype=torch.float32, device=dev)
        if tile:
            args.append(sums)
        if captured:
            args.append(torch.arange(8, dtype=torch.int32, device=dev))
        if tile:
            args.append(torch.ones(64, 256, dtype=torch.bfloat16, device=dev))
        kernel[(8,)](*args, num_warps=8, maxnreg=168)
        want = (torch.arange(16, device=dev) // 2 + torch.arange(16, device=dev) % 2).to(torch.int32)
        if not torch.equal(out, want) or (tile and not bool((sums == 64 * 256).all())):
            name = getattr(kernel, "fn", kernel).__name__
            raise RuntimeError(f"the control kernel {name} wrote {out.tolist()}, {sums.tolist()}")
    return run


def run_targets(smoke: bool, log=print, only: str = "") -> list[dict]:
    rows = []
    for name, fn in targets(smoke).items():
        if not name.startswith(only):
            continue
        row = {"target": name}
        try:
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            row["finished"] = True
        except Exception as e:  # a refusal (e.g. hopper off Hopper) is a row
            row.update(finished=False, error=repr(e)[:200])
        log(f"TARGET {name} finished={row['finished']}", flush=True)
        rows.append(row)
    errors.read()           # the past-the-cache index set the flag on purpose
    return rows


def sanitize(tool: str, timeout_s: float, only: str = "") -> dict:
    """Run the targets under ``compute-sanitizer --tool TOOL`` in a child process."""
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        return {"tool": tool, "status": "refused", "reason": "compute-sanitizer is not installed here"}
    cmd = [exe, "--tool", tool, "--print-limit", "20", sys.executable, __file__, "-", "--targets", only]
    t = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        text, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = ((e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace"), None)
    seconds = time.time() - t
    return {"tool": tool, "seconds": round(seconds, 1), "returncode": rc, **parse(text), "tail": text[-3000:]}


def parse(text: str) -> dict:
    """What the tool's output says: the targets that finished, the error count of its summary line
    (memcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: N hazards displayed (E errors,
    W warnings)"), the kernels its reports name, and the status."""
    finished = re.findall(r"TARGET (\S+) finished=(True|False)", text)
    summary = (re.search(r"ERROR SUMMARY: (\d+) error", text)
               or re.search(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?", text))
    kernels = sorted(set(re.findall(r"(?:access|Access) at (\w+)\+0x", text)) | set(re.findall(r"in (\w+)\s*\n\s+by thread", text)))
    res = {"targets_finished": {n: f == "True" for n, f in finished},
           "errors": int(summary.group(1)) if summary else None, "kernels_named": kernels[:40]}
    if summary is None or not finished:
        res["status"] = "refused"
        res["reason"] = "no summary line from the tool" if finished else "the targets never ran under the tool"
    else:
        res["status"] = "clean" if res["errors"] == 0 else "errors"
    return res


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--targets" in argv:                    # the child, under the sanitizer
        rest = argv[argv.index("--targets") + 1:]
        run_targets(smoke=False, only=rest[0] if rest else "")
        return

    def add(p):
        p.add_argument("--tools", nargs="+", default=["memcheck", "racecheck"])
        p.add_argument("--only", default="", help="run only the targets whose name starts with this")
    a = ab.parse_args(__doc__, add=add, argv=argv)
    payload = {"rows": [], "complete": False}
    if a.smoke:
        payload["rows"] = [{"tool": "none (interpreter)", **r, "ok": r["finished"]} for r in run_targets(True)]
    else:
        version = subprocess.run(["compute-sanitizer", "--version"], capture_output=True, text=True) \
            if shutil.which("compute-sanitizer") else None
        payload["sanitizer_version"] = version.stdout.strip().splitlines()[-1] if version else None
        payload["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True).stdout.strip()
        for tool in a.tools:
            res = sanitize(tool, 130, a.only)
            payload.setdefault("tools", []).append(res)
            for name, done in res.get("targets_finished", {}).items():
                payload["rows"].append({"tool": tool, "target": name, "finished": done, "status": res["status"],
                                        "errors": res.get("errors")})
            print(tool, res["status"], res.get("errors"), res.get("kernels_named"), flush=True)
            ab.write(a.out, QUESTION, a.smoke, **payload)
    payload["complete"] = True
    ab.write(a.out, QUESTION, a.smoke, **payload)


if __name__ == "__main__":
    main()
