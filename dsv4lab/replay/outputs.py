"""The replay's run folder: reproduce.json, tables.md, the CSVs, kernels.json, the two plots and one
.tar.gz of everything (dsv4lab.run_folder checks it later against reproduce.json's manifest)."""
from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

from .. import bench, profile, run_folder
from .figures import write_figures
from .markdown import tables_markdown
from .tables import build_tables, stages_run


def write_outputs(out: Path, results: dict, quick: bool):
    """reproduce.json, tables.md, throughput.csv, profile.csv, kernels.json, two PNGs and one
    .tar.gz of everything (at most 8 files, one folder; the smaller CSVs only in the .tar.gz).
    reproduce.json is written after the others and names each with its SHA-256 (``output``)."""
    import pandas as pd

    st = results.get("stages", {})
    t = build_tables(results)
    files = {"reproduce.json": out / "reproduce.json", "kernels.json": out / "kernels.json",
             "throughput.csv": out / "throughput.csv", "profile.csv": out / "profile.csv",
             "tables.md": out / "tables.md", "profile_shift.png": out / "profile_shift.png",
             "throughput.png": out / "throughput.png"}
    bench.save(files["kernels.json"], dict(
        device=results["environment"]["device"], torch=results["environment"]["torch"], rules=profile.RULES,
        stages={n: {C: dict(source=p["source"], kernels=p["kernels"], region_mismatches=p["region_mismatches"])
                    for C, p in st[n].get("profiles", {}).items()} for n in stages_run(results)}))
    pd.DataFrame(t["throughput"]).to_csv(files["throughput.csv"], index=False)
    pd.DataFrame(t["profile"]).to_csv(files["profile.csv"], index=False)
    extra = {"fits.csv": t["fits"],
             "transitions.csv": [dict(before=x["before"], after=x["after"], **r) for x in t["transitions"]
                                 for r in x["rows"]],
             "glue_ops.csv": t["glue_ops"], "decode.csv": t["decode"], "story_vs_here.csv": t["story"],
             "glue_scaling.csv": results.get("glue_scaling", {}).get("rows", []),
             "isolated_decode.csv": results.get("isolated_decode", []),
             "c1.csv": t["c1"], "factors.csv": [dict(part=part, **r) for part in ("step", "c1")
                                                for r in results.get("factors", {}).get(part, {}).get("factors", [])],
             "sensitivity.csv": results.get("sensitivity", {}).get("rows", []),
             "floor.csv": results.get("byte_floor", {}).get("rows", []), "above_floor.csv": t["above_floor"]}
    files["tables.md"].write_text(tables_markdown(results, quick))
    write_figures(results, files["profile_shift.png"], files["throughput.png"])
    # reproduce.json last but the tar: it names every other file with its hash (run_folder.verify)
    results["output"] = run_folder.manifest(out, [n for n in files if n != "reproduce.json"],
                                            results.get("run_id", "unnamed"))
    bench.save(files["reproduce.json"], results)
    tar = out / "reproduce.tar.gz"                   # everything, with the smaller CSVs only here
    with tarfile.open(tar, "w:gz") as tf:
        for p in files.values():
            tf.add(p, arcname=f"reproduce/{p.name}")
        for name, rows in extra.items():
            data = pd.DataFrame(rows).to_csv(index=False).encode()
            info = tarfile.TarInfo(f"reproduce/{name}")
            info.size, info.mtime = len(data), int(time.time())
            tf.addfile(info, io.BytesIO(data))
    files["reproduce.tar.gz"] = tar
    return files
