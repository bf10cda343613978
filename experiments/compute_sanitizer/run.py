"""compute-sanitizer memcheck and racecheck over every kernel the lab ships, at small shapes. One JSON.

    PYTHONPATH=. python experiments/compute_sanitizer/run.py OUT.json [--cpu-smoke] [--tools memcheck racecheck]

The driver runs this same file once per tool under ``compute-sanitizer --tool TOOL`` with
``--targets``: every target (a decode impl, the merged two-cache decode, the indexer's logits and
top-k, each with the guard launches its API path adds) runs once at a small shape with padding,
a topk_len, a sink, indices on page boundaries and, for the decode, indices past the cache that
the device-side checks must read as padding. The child prints one line per target it finished;
the driver parses the sanitizer's ``ERROR SUMMARY`` and the kernels its reports name.

Rows (``rows``): one per (tool, target): ``finished`` (the target ran to its end under the tool),
``errors`` (the sanitizer's count for the whole process, shared by its targets), ``kernels``
(the kernel names in its reports). ``status`` per tool: "clean", "errors", or "refused" (the
sanitizer could not attach on this runtime: reported, never counted as clean). The run also
keeps the sanitizer's version and the last lines of its output. With ``--cpu-smoke`` (automatic
without a GPU) the targets run once through Triton's interpreter and no sanitizer runs.
Expected runtime on an H200: about 2 minutes per tool, most of it Triton loading the kernels
under the tool (run after another GPU script has filled Triton's cache).
"""
import re
import shutil
import subprocess
import sys
import time

import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import torch

from dsv4lab import ab, api, errors
from dsv4lab.testing import make_decode_inputs, make_indexer_inputs, make_merged_decode_inputs

QUESTION = "compute_sanitizer"
DECODE_IMPLS = ("simt", "mma_story", "mma", "splitk", "auto", "hopper", "sglang")


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
        if impl in api.impls() and not (smoke and "gpu" in api.impl_info("sparse_decode", impl).needs):
            out[f"decode:{impl}"] = lambda impl=impl: api.sparse_decode(
                dec.q, dec.cache, dec.indices, impl=impl, **dec.kwargs())
    out["merged:auto"] = lambda: dsv4lab.flash_mla_sparse_decode(*merged.sglang_args(), impl="auto")
    out["indexer_logits:triton"] = lambda: dsv4lab.indexer_logits(*idx.args(), max_seq_len=L, impl="triton")
    out["indexer_topk:triton"] = lambda: dsv4lab.indexer_topk(*idx.args(), max_seq_len=L, topk=16 if smoke else 64,
                                                               impl="triton")
    return out


def run_targets(smoke: bool, log=print) -> list[dict]:
    rows = []
    for name, fn in targets(smoke).items():
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


def sanitize(tool: str, timeout_s: float) -> dict:
    """Run the targets under ``compute-sanitizer --tool TOOL`` in a child process."""
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        return {"tool": tool, "status": "refused", "reason": "compute-sanitizer is not installed here"}
    cmd = [exe, "--tool", tool, "--print-limit", "20", sys.executable, __file__, "-", "--targets"]
    t = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        text, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = ((e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace"), None)
    seconds = time.time() - t
    finished = re.findall(r"TARGET (\S+) finished=(True|False)", text)
    summary = re.search(r"ERROR SUMMARY: (\d+) error", text)
    kernels = sorted(set(re.findall(r"in (\w+)\s*\n\s+by thread", text)) | set(re.findall(r"kernel (\w+)", text)))
    res = {"tool": tool, "seconds": round(seconds, 1), "returncode": rc,
           "targets_finished": {n: f == "True" for n, f in finished},
           "errors": int(summary.group(1)) if summary else None, "kernels_named": kernels[:40],
           "tail": text[-3000:]}
    if summary is None or not finished:
        res["status"] = "refused"
        res["reason"] = "no ERROR SUMMARY from the tool" if finished else "the targets never ran under the tool"
    else:
        res["status"] = "clean" if res["errors"] == 0 else "errors"
    return res


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--targets" in argv:                    # the child, under the sanitizer
        run_targets(smoke=False)
        return
    a = ab.parse_args(__doc__, add=lambda p: p.add_argument("--tools", nargs="+", default=["memcheck", "racecheck"]),
                      argv=argv)
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
            res = sanitize(tool, 240)
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
