"""Where a decode kernel's warps wait: ncu's per-instruction stall sampling, summed. One JSON.

    python experiments/stall_reasons/stall_profile.py OUT.json IMPL B SPEC [SPEC ...] [--cpu-smoke]

For each tile spec (BLOCK_H,BLOCK_N,warps,stages,loop[,dequant,fold]; profile_decode.py) runs ncu
on one launch of the head-batched kernel at batch B and writes the kernel's duration, IPC,
occupancy, the share of stall samples per reason (long_sb = waiting on global memory, barrier =
a CTA barrier or a wgmma wait, wait = fixed-latency dependency, ...), the same by SASS opcode and
the 30 instructions holding the most samples. Needs ncu (CUDA toolkit) and a GPU: ~1 min a spec.
--cpu-smoke (automatic without ncu or a GPU) runs the ncu target once in the interpreter and
summarizes a small sample of ncu's CSV, so the parsing is exercised.
"""
import collections
import csv
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
import tempfile

import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

from dsv4lab import device
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
#: a few lines in the shape of ncu's source page (--page source --csv --print-source sass) and details page
SAMPLE_SOURCE = ('"Kernel","_head_batched_kernel"\n'
                 '"Address","Source","stall_long_sb","stall_barrier","stall_wait","stall_Not Issued"\n'
                 '"0x10","LDG.E.128 R4, [R2.64]","6","0","1","3"\n'
                 '"0x20","@P0 HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4], R24","0","3","0",""\n'
                 '"0x30","WARPGROUP.DEPBAR.LE gsb0, 0x0","0","2","1","1"\n')
SAMPLE_DETAILS = ("    Duration                         us        65.89\n    Executed Ipc Active   inst/cycle   0.92\n"
                  "    Achieved Occupancy                %        12.49\n    Registers Per Thread   register/thread   255\n"
                  "    L2 Hit Rate                       %        39.18\n"
                  "    Warp Cycles Per Issued Instruction  cycle   8.54\n")


def summarize(source_csv: str, details: str, spec: str, B: int) -> dict:
    """One row from ncu's source page (CSV, one line per SASS instruction, stall_* columns) and
    details page (text): stall shares by reason and by opcode, the hottest instructions, metrics."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    hdr, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    src_col = next((i for i, h in enumerate(hdr) if h.strip() == "Source"), None)
    stalls, by_op, per_ins = collections.Counter(), collections.Counter(), []
    for n, r in enumerate(data):
        here = {h[6:]: float(r[ix[h]]) for h in stall_cols if r[ix[h]] not in ("", "0")}
        stalls.update(here)
        cnt = sum(here.values())
        if not cnt or src_col is None:
            continue
        ins = r[src_col].strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", ins).split(" ")[0].split(".")[0]
        by_op[op] += cnt
        per_ins.append((cnt, n, ins, here))
    total = sum(stalls.values()) or 1.0
    per_ins.sort(key=lambda t: (-t[0], t[1]))
    hot = [dict(line=n, sass=ins[:90], share=round(c / total, 4),
                reasons={k: round(v / c, 3) for k, v in sorted(h.items(), key=lambda kv: -kv[1])[:3]})
           for c, n, ins, h in per_ins[:30]]

    def metric(name):
        m = re.search(rf"{re.escape(name)}\s+\S+\s+([\d.,]+)", details)
        return float(m.group(1).replace(",", "")) if m else None
    return dict(spec=spec, B=B, duration_us=metric("Duration"), ipc=metric("Executed Ipc Active"),
                achieved_occupancy_pct=metric("Achieved Occupancy"), registers=metric("Registers Per Thread"),
                l2_hit_pct=metric("L2 Hit Rate"), warp_cycles_per_issue=metric("Warp Cycles Per Issued Instruction"),
                stall_share={k: round(v / total, 4) for k, v in stalls.most_common()},
                stall_by_opcode={k: round(v / total, 4) for k, v in by_op.most_common(15)}, hot_sass=hot)


def profile(impl: str, B: int, spec: str) -> dict:
    """ncu on the third launch of the head-batched kernel in profile_decode.py."""
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "p")
        subprocess.run(["ncu", "--set", "full", "-k", "regex:_head_batched", "--launch-skip", "2", "--launch-count", "1",
                        "-o", rep, sys.executable, os.path.join(HERE, "profile_decode.py"), impl, str(B), spec],
                       check=True, capture_output=True)
        src = subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                             check=True, capture_output=True, text=True).stdout
        det = subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", "details"],
                             check=True, capture_output=True, text=True).stdout
    return summarize(src, det, spec, B)


def smoke_target(impl: str, spec: str):
    """One call of profile_decode.py's ncu target in the interpreter (this folder is not a package)."""
    where = importlib.util.spec_from_file_location("profile_decode", os.path.join(HERE, "profile_decode.py"))
    mod = importlib.util.module_from_spec(where)
    where.loader.exec_module(mod)
    mod.target(impl, 1, spec, smoke=True, calls=1)


def summary_of_the_sample() -> dict:
    """The summary of the two sample pages, held to the counts they hold (13 stall samples: 6 long
    scoreboard, 5 barrier, 2 wait; by opcode 7 LDG, 3 HGMMA, 3 WARPGROUP): what the smoke run checks."""
    row = summarize(SAMPLE_SOURCE, SAMPLE_DETAILS, "64,128,8,1,l2_hint", 128)
    near = lambda got, want: set(got) == set(want) and all(abs(got[k] - v) <= 1e-4 for k, v in want.items())  # noqa: E731
    ok = (near(row["stall_share"], {"long_sb": 6 / 13, "barrier": 5 / 13, "wait": 2 / 13})
          and near(row["stall_by_opcode"], {"LDG": 7 / 13, "HGMMA": 3 / 13, "WARPGROUP": 3 / 13})
          and row["hot_sass"][0]["sass"].startswith("LDG") and row["duration_us"] == 65.89 and row["registers"] == 255)
    return dict(kind="sample summary", ok=ok)


def main(argv=None):
    def add(p):
        p.add_argument("impl")
        p.add_argument("B", type=int)
        p.add_argument("specs", nargs="+", help="BLOCK_H,BLOCK_N,warps,stages,loop[,dequant,fold]")
    a = ab.parse_args(__doc__, add, argv)
    smoke = a.smoke or shutil.which("ncu") is None
    rows = []
    for spec in a.specs:
        if smoke:
            smoke_target(a.impl, spec)
            rows.append(ab.attempt({}, lambda: summarize(SAMPLE_SOURCE, SAMPLE_DETAILS, spec, a.B)))
            rows.append(ab.attempt({}, summary_of_the_sample))
        else:
            rows.append(ab.attempt({}, lambda: profile(a.impl, a.B, spec)))
    extra = {} if smoke else {"ceilings": device.ceilings().as_dict()}
    ab.write(a.out, "stall_reasons", smoke, tool="ncu --set full, source page stall sampling", rows=rows, **extra)


if __name__ == "__main__":
    main()
