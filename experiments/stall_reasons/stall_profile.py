"""Where a decode kernel's warps wait: ncu's per-instruction stall sampling, summed.

    python tools/stall_profile.py OUT.json mma 128 64,32,8,1,2 [more specs...]

For each tile spec (BLOCK_H,BLOCK_N,warps,stages,prefetch) runs ncu on one launch of the
head-batched kernel at batch B and writes the kernel's duration, IPC, occupancy and the
share of stall samples per reason (long_sb = waiting on global memory, barrier = a CTA
barrier or a wgmma wait, wait = fixed-latency dependency, ...). Needs ncu (CUDA toolkit).
"""
import collections
import csv
import io
import json
import os
import re
import subprocess
import sys
import tempfile

out_path, impl, B, specs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
here = os.path.dirname(os.path.abspath(__file__))
res = []
for spec in specs:
    with tempfile.TemporaryDirectory() as d:
        rep = os.path.join(d, "p")
        subprocess.run(["ncu", "--set", "full", "-k", "regex:_head_batched", "--launch-skip", "2",
                        "--launch-count", "1", "-o", rep, sys.executable, os.path.join(here, "profile_decode.py"),
                        impl, B, spec], check=True, capture_output=True)
        src = subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                             check=True, capture_output=True, text=True).stdout
        det = subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", "details"],
                             check=True, capture_output=True, text=True).stdout
    rows = list(csv.reader(io.StringIO(src)))
    hdr, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = collections.Counter()
    for r in data:
        for h in hdr:
            if h.startswith("stall_") and "Not Issued" not in h and r[ix[h]]:
                stalls[h[6:]] += float(r[ix[h]])
    total = sum(stalls.values())
    # per SASS instruction: which ones the samples sit on, and by opcode (LDG, HGMMA, BAR, ...)
    src_col = next((i for i, h in enumerate(hdr) if h.strip() == "Source"), None)
    per_ins, by_op = [], collections.Counter()
    for n, r in enumerate(data):
        here_ = {h[6:]: float(r[ix[h]]) for h in hdr
                 if h.startswith("stall_") and "Not Issued" not in h and r[ix[h]] not in ("", "0")}
        cnt = sum(here_.values())
        if not cnt or src_col is None:
            continue
        ins = r[src_col].strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", ins).split(" ")[0].split(".")[0]
        by_op[op] += cnt
        per_ins.append((cnt, n, ins, here_))
    per_ins.sort(reverse=True)
    hot = [dict(line=n, sass=ins[:90], share=round(c / total, 4),
                reasons={k: round(v / c, 3) for k, v in sorted(here_.items(), key=lambda kv: -kv[1])[:3]})
           for c, n, ins, here_ in per_ins[:30]]

    def metric(name):
        m = re.search(rf"{re.escape(name)}\s+\S+\s+([\d.,]+)", det)
        return float(m.group(1).replace(",", "")) if m else None
    row = dict(spec=spec, B=int(B), duration_us=metric("Duration"), ipc=metric("Executed Ipc Active"),
               achieved_occupancy_pct=metric("Achieved Occupancy"), registers=metric("Registers Per Thread"),
               l2_hit_pct=metric("L2 Hit Rate"), warp_cycles_per_issue=metric("Warp Cycles Per Issued Instruction"),
               stall_share={k: round(v / total, 4) for k, v in stalls.most_common()},
               stall_by_opcode={k: round(v / total, 4) for k, v in by_op.most_common(15)}, hot_sass=hot)
    print({k: v for k, v in row.items() if k != "hot_sass"}, flush=True)
    res.append(row)
sys.path.insert(0, os.path.dirname(here))
from dsv4lab import bench, device  # noqa: E402
json.dump({**bench.environment(), "ceilings": device.ceilings().as_dict(), "tool": "ncu --set full, source page stall sampling", "rows": res},
          open(out_path, "w"), indent=1, default=str)
