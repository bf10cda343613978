"""The Hopper-native Gluon kernel (impl "hopper") on the GPU: checks, then timings beside the lab's impls.

    python experiments/hopper_decode/run.py OUT.json [--batches 1 2 4 8 16 32 64 128] [--topk 512] [--cpu-smoke]

1. the compiler's resource report of the kernel as launched (registers, spills, shared memory,
   wgmma shapes, counts of the PTX instructions of its schedule), whole rows and split slices;
   then one small decode in a child process (``testing.probe``): a kernel that has never run may
   hang, and a hang there costs 90 s and a row; without a good probe the hopper rows are
   skipped and the baselines still timed;
2. correctness: every case of dsv4lab.checks.CHECK_CASES (odd H and K, -1 padding, topk_len, sink,
   page sizes 64 and 256, more programs than SMs) against the float64 reference with poisoned
   outputs, and the CUDA-graph replay bitwise equal to the eager call;
3. determinism: 20 eager reruns bitwise equal, graph replay bitwise (checks.determinism);
4. timings at each B (H = 64, K = 512 or ``--topk``, e.g. 128 for SGLang's window call, context
   8192, page 64): hopper, splitk_auto (named auto in runs
   1-4), mma, mma_story and, from run 5, ``auto`` (which runs hopper or splitk_auto: ``ran``) in one run, interleaved, best of 2 passes: a CUDA graph of one call (graph_us) and per call in a
   graph of 8 calls on copies of the inputs (graph_layer_us), TFLOP/s, and the NSPLIT hopper took;
   where its rule splits, also hopper with half the slices ("hopper nsplit=N").
Every case is caught into its row (``error``); the JSON is rewritten after each B. ~2-3 min on an H200.

With ``--cpu-smoke`` (automatic without a GPU) the Gluon kernel cannot run: the script records its
refusal and runs the baselines' path at tiny shapes through the interpreter. ``--resources-only``
writes step 1 alone; without a GPU it needs ``DSV4LAB_MODE=compile`` (the compiler, not the
interpreter), e.g. to read the report of the Triton the GPU machine runs.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

from dsv4lab import api, checks
from dsv4lab.device import info
from dsv4lab.kernels.decode import auto, hopper
from dsv4lab.testing import make_decode_inputs, probe
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402
import hopper_study  # noqa: E402

QUESTION = "hopper_decode"
BASELINES = ("splitk_auto", "mma", "mma_story")


def caller(impl):
    return lambda x: api.sparse_decode(x.q, x.cache, x.indices, impl=impl, sm_scale=ab.SCALE, **x.kwargs())


def hopper_with(nsplit):
    """The kernel with a given NSPLIT (no API checks: the same launches as impl "hopper")."""
    return lambda x: hopper.sparse_decode_hopper(x.q, x.cache, x.indices, sm_scale=ab.SCALE, nsplit=nsplit,
                                                 **x.kwargs())


def variants(impls, B, H, K) -> dict:
    """name -> call(x): the impls, and where the rule splits, hopper with half the slices (longer
    slices: two or more tiles each, so its producer and consumers overlap)."""
    out = {i: caller(i) for i in impls}
    if "hopper" in impls:
        n = hopper.nsplit_for(B, H, K, info().sm_count)
        if n > 1:
            out[f"hopper nsplit={n // 2}"] = hopper_with(n // 2)
    return out


def resources() -> list[dict]:
    rows = []
    for split in (False, True):
        rows.append(ab.attempt(dict(kind="resources", split=split), lambda s=split: hopper_study.compile_report(split=s)))
    return rows


def refusal(smoke: bool) -> dict:
    """Smoke mode: the impl must refuse with a ValueError that says what it needs."""
    inp = make_decode_inputs(1, 4, 16, context=32, seed=3)
    try:
        caller("hopper")(inp)
    except ValueError as e:
        return dict(kind="refusal", message=str(e), ok="sm_90" in str(e))
    return dict(kind="refusal", ok=False, message="ran in a process that cannot run Gluon")


def main(argv=None):
    def options(p):
        p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
        p.add_argument("--topk", type=int, default=512, help="K: tokens a request attends to (512, or 128: the window)")
        p.add_argument("--resources-only", action="store_true", help="the compiler's report alone (no GPU needed)")
    a = ab.parse_args(__doc__, options, argv)
    if a.resources_only:
        ab.write(a.out, QUESTION, a.smoke, rows=resources(), complete=True)
        return
    H, K, ctx = (4, 32, 64) if a.smoke else (64, a.topk, 8192)
    impls = BASELINES if a.smoke else ("hopper", *BASELINES, "auto")
    rows = []
    if a.smoke:
        rows.append(refusal(a.smoke))
        print(rows[-1], flush=True)
    else:
        rows += resources()
        probe = ab.attempt(dict(kind="probe"), lambda: probe("hopper"))      # a child process: a hang costs 90 s, not the run
        rows.append(probe)
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)
        if "error" in probe:
            impls = (*BASELINES, "auto")
    if not a.smoke and "hopper" in impls:
        for case in checks.CHECK_CASES:
            B, Hc, Kc, cctx, ps, pad, tl_, sink = case
            inp = make_decode_inputs(B, Hc, Kc, context=cctx, page_size=ps, pad_frac=pad, topk_len=tl_, sink=sink,
                                     seed=hash(case) % 2**31)
            rows.append(ab.attempt(dict(kind="check", impl="hopper", case=case), lambda: ab.check(caller("hopper"), inp, False)))
        for r in checks.determinism(impls=["hopper"], log=print):
            rows.append(dict(kind="determinism", **r))
    chk = make_decode_inputs(2, H, K, context=ctx, topk_len=True, sink=True, pad_frac=0.1, seed=41)
    for impl in (*BASELINES, "auto"):
        rows.append(ab.attempt(dict(kind="check", impl=impl), lambda i=impl: ab.check(caller(i), chk, a.smoke)))
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)
    for B in ([1] if a.smoke else a.batches):
        try:
            inp = make_decode_inputs(B, H, K, context=ctx, seed=B)
            got = ab.time_variants(variants(impls, B, H, K), inp, a.smoke)
        except Exception as e:  # one batch size failing is a row, not the end of the run
            rows.append(dict(kind="time", B=B, error=repr(e)[:300]))
            continue
        for impl, t in got.items():
            row = dict(kind="time", B=B, impl=impl, **t)
            if impl.startswith("hopper"):
                n = int(impl.split("=")[1]) if "=" in impl else hopper.nsplit_for(B, H, K, info().sm_count)
                row.update(nsplit=n, pdl=hopper.pdl_for(B, H, n, info().sm_count))
            if impl == "auto":
                row["ran"] = auto.chosen(B, H, K)
            rows.append(row)
            print(row, flush=True)
        del inp
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)   # kept if cut short
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=True)


if __name__ == "__main__":
    main()
