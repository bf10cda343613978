"""One (stage, C) cell's kernel profile: graph replays by kernel name, the glue by aten op, and the
decode kernels' time per launching region and layer kind (dsv4lab.profile does the reading)."""
from __future__ import annotations

from .. import profile
from ..model import Model


def decode_regions(kp: profile.KernelProfile, br: profile.EagerBreakdown) -> dict:
    """Decode-kernel time per ``dsv4::decode[impl,cR]`` region of one eager step (a GPU run:
    the kernels' launching regions; the interpreter: the regions' own CPU time)."""
    out = {}
    if br.regions:
        for name, regs in br.regions.items():
            if profile.classify(name) == profile.DECODE:
                for reg, us in regs.items():
                    if reg.startswith("dsv4::decode["):
                        out[reg] = out.get(reg, 0.0) + us
    else:
        for r in kp.rows:
            reg = r["name"].split("/")[0]
            if reg.startswith("dsv4::decode[") and profile.classify(r["name"]) == profile.DECODE:
                out[reg] = out.get(reg, 0.0) + r["us"]
    return out


def category_by_region(kp: profile.KernelProfile, br: profile.EagerBreakdown) -> dict:
    """{region: {category: us}} of one eager step (GPU: kernels by launching region; the
    interpreter: the CPU rows' regions)."""
    out = {}
    if br.regions:
        for name, regs in br.regions.items():
            c = profile.classify(name)
            for reg, us in regs.items():
                out.setdefault(reg, {}).setdefault(c, 0.0)
                out[reg][c] += us
    else:
        for r in kp.rows:
            reg = r["name"].split("/")[0]
            if reg.startswith("dsv4::"):                    # the interpreter's rows
                c = profile.classify(r["name"])
                out.setdefault(reg, {}).setdefault(c, 0.0)
                out[reg][c] += r["us"]
    return out


def decode_by_kind(per_region: dict, ratios: list) -> list:
    """Rows per layer kind: a dsv4::decode[impl,cR] region holds both decodes of a layer (window +
    compressed cache) and their merge; only decode-category time counts."""
    rows = []
    for reg, us in sorted(per_region.items()):
        ratio = int(reg.rsplit(",c", 1)[1].rstrip("]"))
        n = ratios.count(ratio)
        rows.append(dict(region=reg, layer_kind=f"ratio {ratio}" if ratio else "window only", layers=n,
                         decode_us_per_layer=us / n, decode_us_all_layers=us))
    return rows


def profile_cell(model: Model, fn, run_once, gpu: bool, C: int, eager: bool = True) -> dict:
    """The kernel profile of one (stage, C): graph replays by kernel name (GPU; the interpreter:
    CPU time per region/op), and with ``eager`` one eager step for the glue by op and the
    kernels' launching regions (decode time per layer kind, the classifier's region check)."""
    if gpu:
        prof, runs = profile.profile_runs(run_once, 3)
        kp = profile.kernel_profile(prof, runs, "graph replay")
        if not kp.rows:                                      # no kernel activity seen in graph replays
            prof, runs = profile.profile_runs(fn, 1)
            kp = profile.kernel_profile(prof, runs, "eager (graph replays showed no kernels)")
        br = (profile.eager_breakdown(profile.profile_runs(fn, 1)[0]) if eager
              else profile.EagerBreakdown([], {}, {}, 0.0))
    else:
        kp = profile.cpu_rows(profile.profile_runs(fn, 1)[0], 1)
        br = profile.cpu_breakdown(kp)
    kp.regions = br.regions
    kernels = kp.kernels()
    return dict(C=C, source=kp.source, runs=kp.runs, total_us=kp.total_us, by_category=kp.by_category(),
                category_by_region=category_by_region(kp, br),
                unclassified_share=kp.unclassified_share(), region_mismatches=profile.region_mismatches(kernels),
                kernels=kernels, decode_by_kind=decode_by_kind(decode_regions(kp, br), model.ratios),
                glue_ops=dict(source="one eager step" + ("" if gpu else ", CPU time"), total_us=br.total_us,
                              ops=br.ops, region_us=br.region_us))

