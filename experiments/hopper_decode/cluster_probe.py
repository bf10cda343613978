"""Can the split slices of one request run as a thread-block cluster in Triton's Gluon, each CTA on
its own slice, so the merge happens in the same launch? A compile-only probe (no GPU needed).

    python experiments/hopper_decode/cluster_probe.py OUT.json

The single-launch merge designed in the README ("Small B: one launch for the whole call?") puts a
request's NSPLIT slices in one cluster: each CTA computes its own slice's partial, a hardware
cluster barrier replaces the in-memory one, and the merge reads the peers' partials. Triton
launches clusters through ``num_ctas`` (the launcher sets the cluster dimension to it), and with
num_ctas > 1 a Gluon layout says how the cluster's CTAs share a tensor (``cga_layout``). This
compiles, for sm_90a with the installed triton and its ptxas:

* a small kernel at num_ctas = 2 whose tensors are replicated on both CTAs (a zero basis), each
  CTA storing a row named by its own ``%cluster_ctarank`` after an inline-asm cluster barrier:
  what ``program_id`` reads, and whether Triton predicates the store;
* the same with the store written as inline PTX;
* the shipped hopper kernel at num_ctas = 2, as it is.

Each row records what the PTX shows. The compiles run in a child process in compile mode
(``--compile-child``), whatever this process's mode; ``--cpu-smoke`` (what CI runs) does the same,
as nothing here needs a GPU.
"""
import dsv4lab  # noqa: F401  (first: it decides the mode)

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import triton

from dsv4lab import compile_report as cr
from dsv4lab.kernels.decode import hopper
from dsv4lab.kernels.decode.hopper import kernel as hopper_kernel
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402
import hopper_study  # noqa: E402

QUESTION = "hopper_decode"
gluon, gl = hopper_kernel.gluon, hopper_kernel.gl

if gluon is not None:
    _REPLICATED = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[0]]))
    _RANK = gl.constexpr("mov.u32 $0, %cluster_ctarank;")
    _BARRIER = gl.constexpr("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
                            "mov.u32 $0, 0;")
    _STORE = gl.constexpr("st.global.b32 [$1], $2;\nmov.u32 $0, 0;")

    @gluon.jit
    def _rank_rows(X, Y, ASM_STORE: gl.constexpr):
        """Each CTA of a 2-CTA cluster stores X + its rank into row 2 * program_id + rank of Y."""
        rank = gl.inline_asm_elementwise(_RANK, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        offs = gl.arange(0, 128, layout=_REPLICATED)
        x = gl.load(X + offs)
        zero = gl.inline_asm_elementwise(_BARRIER, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        ptr = Y + (gl.program_id(0) * 2 + rank + zero) * 128 + offs
        if ASM_STORE:
            gl.inline_asm_elementwise(_STORE, "=r,l,r", [ptr, x + rank], dtype=gl.int32, is_pure=False, pack=1)
        else:
            gl.store(ptr, x + rank)


def special_registers_behind(body: str, reg: str) -> set:
    """The special registers (%tid.x, %cluster_ctarank, ...) a PTX register's value is computed from:
    its defining instructions followed back through their source operands."""
    defs: dict[str, list[str]] = {}
    for line in body.splitlines():
        m = re.match(r"\s*(?:@!?%p\d+\s+)?[a-z][\w.:]*\s+(%\w+)\s*,\s*(.*?);", line)
        if m:
            defs.setdefault(m.group(1), []).append(m.group(2))
    seen, todo, found = set(), [reg], set()
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        for operands in defs.get(r, []):
            found.update(re.findall(r"%(?:cluster_ctarank|clusterid\.\w|ctaid\.\w|tid\.\w|cluster_nctarank)", operands))
            todo += re.findall(r"%(?:p|r|rd)\d+", operands)
    return found


def small_kernel_row(asm_store: bool) -> dict:
    k = cr.compile_kernel(_rank_rows, {"ASM_STORE": asm_store}, ptr_types={"X": "*i32", "Y": "*i32"}, num_ctas=2)
    ptx = k.asm["ptx"]
    body = ptx[ptx.find(".entry"):]
    body = body[:body.find("$L__func_end0")]
    store = next(line.strip() for line in body.splitlines() if "st.global" in line)
    pred = re.match(r"@!?(%p\d+)", store)
    return dict(kind="cluster_compile", kernel="rank_rows", store="inline PTX" if asm_store else "gl.store",
                num_ctas=2, cluster_in_ptx=re.findall(r"\.reqnctapercluster \d+", ptx),
                program_id_reads="%clusterid.x" if "%clusterid.x" in body else "%ctaid.x" if "%ctaid.x" in body
                else "derived from %cluster_ctarank",
                store_instruction=store, store_predicated=bool(pred),
                predicate_reads=sorted(special_registers_behind(body, pred.group(1))) if pred else [],
                cluster_barrier=bool(re.search(r"barrier\.cluster\.arrive\.release", body)),
                ptxas_ok=cr.report(k, 90)["ptxas_ok"])


def compile_rows():
    """The compiles, in this process (compile mode): the two small-kernel rows printed as JSON lines,
    then the shipped kernel at num_ctas = 2, which raises what the compiler refuses."""
    for asm_store in (False, True):
        print(json.dumps(small_kernel_row(asm_store)), flush=True)
    hopper_study.compile_kernel(num_ctas=2)


def rows_from_child() -> list[dict]:
    """compile_rows in a child process in compile mode: compile_report's compiles need Triton out of
    interpreter mode, and the compiler's diagnostics go to the process's stderr, not into the
    exception."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env.update(DSV4LAB_MODE="compile", PYTHONPATH=os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])]))
    r = subprocess.run([sys.executable, __file__, "unused.json", "--compile-child"], capture_output=True, text=True,
                       timeout=600, env=env)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    if len(rows) != 2:                    # the small kernels must compile: their failure is no finding
        raise RuntimeError(f"the small kernels did not compile: {r.stderr[-2000:]}")
    row = dict(kind="cluster_compile", kernel="hopper (shipped layouts)", num_ctas=2, compiles=r.returncode == 0)
    if r.returncode != 0:
        found = re.search(r"Layout has \d+ CTAs per CGA, but the context requires \d+ CTAs per CGA", r.stderr)
        row["refusal"] = found.group(0) if found else r.stderr.strip().splitlines()[-1][:300]
    return rows + [row]


def main(argv=None):
    a = ab.parse_args(__doc__, lambda p: p.add_argument("--compile-child", action="store_true",
                                                         help="only the compiles, rows on stdout (rows_from_child's child)"),
                      argv)
    if a.compile_child:
        compile_rows()
        return
    rows = [dict(kind="cluster_compile", skipped=hopper.GLUON_ERROR)] if gluon is None else rows_from_child()
    for r in rows:
        print(r, flush=True)
    ab.write(a.out, QUESTION, a.smoke, triton=triton.__version__, rows=rows, complete=True)


if __name__ == "__main__":
    main()
