"""Quick GPU check + timing of head-batched tile configs, outside the recorded run.

    python tools/explore_tiles.py OUT.json "64,32,8,1,2" "16,64,8,1,2" ...

Each spec is BLOCK_H,BLOCK_N,num_warps,num_stages,prefetch[,lazy]; every config is checked
against the float64 reference before it is timed at B in {1, 32, 128} (dsv4lab.record.time_tiles,
the same loop as ``python -m dsv4lab record --only tiles``, which also picks the table's entry).
"""
import json
import sys

import dsv4lab  # noqa: F401
from dsv4lab import bench, record

specs = [tuple(int(v) for v in s.split(",")) for s in sys.argv[2:]]
rows = record.time_tiles([(*s[:5], bool(s[5]) if len(s) > 5 else False) for s in specs], batches=(1, 32, 128))
json.dump({**bench.environment(), "rows": rows}, open(sys.argv[1], "w"), indent=1, default=str)
