"""Where the hopper kernel's warps wait, per partition: ncu's stall sampling on the split launch
and on its two ablations (hopper's ABLATE: the producer alone, the consumers alone). One JSON.

    python experiments/hopper_decode/stalls.py OUT.json [--batches 128] [--module hopper_study]

For each B (H = 64, K = 512, context 8192, page 64, the rule's NSPLIT) and each launch (0: both
partitions, 1: producer alone, 2: consumers alone), ncu --set full profiles the third launch of
the kernel (``_hopper_decode_kernel``) and the source page's per-instruction stall samples are
summed by reason and by SASS opcode (experiments/stall_reasons's summary; an idle partition's
mbarrier waits show up as its own opcodes). ``--module``: the module whose kernel is launched (an
A/B against an earlier copy of the kernel). ~30 s a launch on an H200. Needs ncu; --cpu-smoke
(automatic without ncu or a GPU) records the refusal of the kernel and no profile.
"""
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
import tempfile
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402


HERE = os.path.dirname(os.path.abspath(__file__))
H, K, CTX = 64, 512, 8192


def target(module: str, B: int, ablate: int, calls: int = 4):
    """ncu's target: ``calls`` split launches of the kernel of ``module`` at batch B."""
    import torch
    from dsv4lab.device import info
    from dsv4lab.kernels.decode import split_k
    from dsv4lab.kernels.buffers import alloc
    from dsv4lab.testing import make_decode_inputs
    hop = importlib.import_module(module)
    inp = make_decode_inputs(B, H, K, context=CTX, seed=B)
    ns = hop.nsplit_for(B, H, K, info().sm_count)
    q = inp.q.contiguous()
    if ns > 1:
        out, lse = split_k.partials_for(B, H, ns, q.device, "bfloat16")
    else:
        out, lse = alloc((B, H, 512), torch.bfloat16, q.device), alloc((B, H), torch.float32, q.device)
    for _ in range(calls):
        hop.launch(q, inp.cache, inp.indices, inp.topk_len, ab.SCALE, None, out, lse, ns, False, ablate=ablate)
    torch.cuda.synchronize()


def profile(module: str, B: int, ablate: int) -> dict:
    sys.path.insert(0, os.path.join(HERE, "..", "stall_reasons"))
    from stall_profile import summarize
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "p")
        code = f"import sys; sys.path.insert(0, {HERE!r}); import stalls; stalls.target({module!r}, {B}, {ablate})"
        subprocess.run(["ncu", "--set", "full", "--import-source", "no", "-k", "regex:_hopper_decode_kernel",
                        "--launch-skip", "2", "--launch-count", "1", "-o", rep, sys.executable, "-c", code],
                       check=True, capture_output=True)
        src = subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                             check=True, capture_output=True, text=True).stdout
        det = subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", "details"],
                             check=True, capture_output=True, text=True).stdout
    return summarize(src, det, f"ablate={ablate}", B)


def main(argv=None):
    def options(p):
        p.add_argument("--batches", type=int, nargs="+", default=[128])
        p.add_argument("--module", default="hopper_study")
    a = ab.parse_args(__doc__, options, argv)
    smoke = a.smoke or shutil.which("ncu") is None
    rows = []
    if smoke:
        from dsv4lab.kernels.decode import hopper
        rows.append(dict(kind="refusal", reason=hopper.unavailable_reason() or "no ncu on this machine"))
    else:
        for B in a.batches:
            for ablate in (0, 1, 2):
                row = ab.attempt(dict(kind="stalls", module=a.module, B=B, ablate=ablate),
                                 lambda: profile(a.module, B, ablate))
                rows.append(row)
                ab.write(a.out, "hopper_decode", smoke, tool="ncu --set full, source page stall sampling", rows=rows,
                         complete=False)
    ab.write(a.out, "hopper_decode", smoke, tool="ncu --set full, source page stall sampling", rows=rows,
             complete=True)


if __name__ == "__main__":
    main()
