"""Does what a process did just before an eager loop change the loop's host cost? One JSON.

    PYTHONPATH=. python experiments/eager_host_path/process_state.py OUT.json [--cpu-smoke]

The indexer step (``dsv4lab.indexer_topk(impl="triton")``, B 32, 8192 live, max context 262208)
is timed back to back (``bench.back_to_back_us``, five samples) in one process after each of:

* ``quiet``: nothing more (it follows the script's start: making the inputs, compiling, the graph's timing);
* ``after_cpu_reference``: the float64 top-k reference on the CPU over the [32, 262208] logits (what
  ``experiments/indexer_topk``'s checks run before its eager rows), timed right after it returns;
* ``after_cpu_reference_sleep``: the same, then two seconds of sleep;
* ``after_torch_fp32``: the story's fp32 fallback step on the GPU at the same shape (the
  [32, 262208, 64] glue that precedes indexer_topk's slow eager row), then a sync;
* ``after_torch_fp32_sleep``: the same, then two seconds of sleep;
* ``one_cpu_thread``: torch.set_num_threads(1), the CPU reference, then the loop.

Rows: ``samples_us`` (back to back, per call), ``median_us``, ``graph_us`` (the quiet graph
replay), ``torch_threads``. About a minute on an H200.
"""
import statistics
import time

import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import torch

from dsv4lab import bench, reference
from dsv4lab.testing import make_indexer_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "eager_host_path"


def main(argv=None):
    a = ab.parse_args(__doc__, argv=argv)
    smoke = a.smoke
    B, H, L, live, k = (2, 8, 700, 300, 16) if smoke else (32, 64, 262208, 8192, 512)
    inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=21)
    step = lambda: dsv4lab.indexer_topk(*inp.args(), max_seq_len=L, topk=k, impl="triton")  # noqa: E731
    fp32 = lambda: dsv4lab.indexer_topk(*inp.args(), max_seq_len=L, topk=k, impl="torch_fp32")  # noqa: E731
    logits = dsv4lab.indexer_logits(*inp.args(), max_seq_len=L, impl="triton")

    def cpu_reference():
        reference.topk_positions(logits.cpu(), k)

    def gpu_fp32():
        fp32()
        if not smoke:
            torch.cuda.synchronize()

    def measure():
        if smoke:
            step()
            return []
        return [round(bench.back_to_back_us(step)["per_call_us"], 2) for _ in range(5)]

    before = {
        "quiet": lambda: None,
        "after_cpu_reference": cpu_reference,
        "after_cpu_reference_sleep": lambda: (cpu_reference(), time.sleep(2)),
        "after_torch_fp32": gpu_fp32,
        "after_torch_fp32_sleep": lambda: (gpu_fp32(), time.sleep(2)),
        "one_cpu_thread": lambda: (torch.set_num_threads(1), cpu_reference()),
    }
    threads = torch.get_num_threads()
    graph = None if smoke else ab.time_us(step, smoke, graph=True)
    rows = []
    for name, prep in before.items():
        def one(prep=prep):
            prep()
            samples = measure()
            return dict(samples_us=samples, median_us=statistics.median(samples) if samples else None,
                        graph_us=graph, torch_threads=torch.get_num_threads())
        rows.append(ab.attempt(dict(condition=name), one))
    torch.set_num_threads(threads)
    ab.write(a.out, QUESTION, smoke, rows=rows, B=B, max_seq_len=L, live=live, topk=k)


if __name__ == "__main__":
    main()
