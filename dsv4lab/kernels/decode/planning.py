"""What a sparse-decode launch looks like, decided from shapes only: tiles, NSPLIT, options.

A CUDA graph captured for one batch size replays the same launches forever, so nothing here
may look at data. Three pieces:

* :class:`TileConfig`, one entry of the tile table per (device, use): "mma" (64 heads a
  program: the KV tile is gathered once for all heads) and "split" (16 heads: 4x the programs,
  for small batches), with the loop the kernel runs and two measured costs.
* :func:`model_us`, a launch-time model fitted to the recorded sweep, and :func:`plans` /
  :func:`choose`, which pick tiles and NSPLIT for ``splitk_auto`` by it.
* :class:`Launch`, the frozen options object a launcher takes: the tiles, NSPLIT and the
  choices that are not tiles (fp8 dequant, folded softmax scale, partials' dtype, PDL).
  Defaults come from the table and the device; an A/B study builds its own with
  :func:`dataclasses.replace` and passes it explicitly.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import triton

from ...config import HEAD_DIM
from ...device import info, is_interpret

#: the kernel loops head_batched runs (TileConfig.loop):
#: "plain"     indices and bytes loaded in the iteration that uses them
#: "registers" the raw bytes of tile i+1 loaded into registers before tile i is multiplied
#: "l2_hint"   indices one tile ahead, and tile i+1's bytes requested into L2 after tile i's
#:             Q @ K^T (GPU; the interpreter runs the same loop without the hint)
LOOPS = ("plain", "registers", "l2_hint")
#: recorded runs before loops had names wrote the loop's number ("prefetch")
LOOP_OF_PREFETCH = {0: "plain", 2: "registers", 5: "l2_hint"}


@dataclass(frozen=True)
class TileConfig:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    source: str = ""
    loop: str = "plain"
    us_per_tile: float | None = None   # measured: a program's time per BLOCK_N tile (the slope)
    fixed_us: float = 0.0              # measured: a launch's time beyond its tiles (the intercept)
    merge_us: float = 3.0              # measured: what split-K's merge adds to a launch of these tiles
    dequant: str = "cvt"               # "cvt" or "bits" (kv_tiles.dequant_kv), whole-row launches
    fold_scale: bool = False           # softmax scale inside exp2's FMA, whole-row launches

    def __post_init__(self):
        if self.dequant not in ("cvt", "bits"):
            raise ValueError(f"TileConfig.dequant must be 'cvt' or 'bits', got {self.dequant!r}")
        if self.loop not in LOOPS:
            raise ValueError(f"TileConfig.loop must be one of {LOOPS}, got {self.loop!r}")
        for name in ("block_h", "block_n", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two, got {v}")
        if self.block_h < 16 or self.block_n < 16:
            raise ValueError(f"tl.dot needs tiles of at least 16 rows: block_h={self.block_h}, block_n={self.block_n}")


#: Tile choices per (device capability, use). H200 entries come from the recorded sweep
#: (experiments/tile_sweep and experiments/split_sweep; notebooks 02-03) over candidates the offline
#: compiler report (dsv4lab.compile_report) showed with few spills. The sm_120 entries (the story's
#: RTX PRO 6000: 188 SMs, ~99 KB of shared memory a block) are NOT measured: sm_120 has no wgmma,
#: so mma.sync keeps the [BLOCK_H, 512] accumulator in registers, and compiled for sm_120 every
#: 64-head tile spills 1.8-26 KB a thread and every 32-head tile 0.4-2.5 KB; 16 x 64 with the register
#: pipeline spills nothing in ~82 KB (experiments/other_gpus_compile). us_per_tile and fixed_us
#: (model_us) are fitted to the B = 1 rows of the H200's NSPLIT sweep.
class _Table(dict):
    """The tile table: a dict that counts its changes, so launches decided from it can be kept per
    shape (:func:`per_shape`) and still follow a sweep that replaces an entry (record.py does)."""
    version = 0

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.version += 1

    def __delitem__(self, key):
        super().__delitem__(key)
        self.version += 1


TILE_TABLE = _Table({
    ("9.0", "mma"): TileConfig(64, 128, 8, 1, "H200 tile sweep (fastest at B=128); the l2_hint loop took B=128 "
                               "62.1 -> 58.6 us, bits + fold 58.6 -> 57.5 us; costs from the NSPLIT sweep",
                               loop="l2_hint", us_per_tile=9.76, fixed_us=9.66, merge_us=0.83,
                               dequant="bits", fold_scale=True),
    ("9.0", "split"): TileConfig(16, 64, 8, 1, "H200 NSPLIT sweep (fastest at B=1)",
                                 loop="registers", us_per_tile=3.287, fixed_us=10.09, merge_us=0.0),
    ("12.0", "mma"): TileConfig(16, 64, 8, 1, "sm_120 (RTX PRO 6000): the compiler's filter, not measured",
                                loop="registers"),
    ("12.0", "split"): TileConfig(16, 64, 8, 1, "sm_120 (RTX PRO 6000): the compiler's filter, not measured",
                                  loop="registers"),
    ("interpret", "mma"): TileConfig(16, 16, 4, 1, "interpreter: small tiles keep numpy fast"),
    ("interpret", "split"): TileConfig(16, 16, 4, 1, "interpreter: small tiles keep numpy fast"),
    ("default", "mma"): TileConfig(64, 32, 8, 2, "fallback for other GPUs: not measured"),
    ("default", "split"): TileConfig(64, 16, 8, 2, "fallback for other GPUs: not measured"),
})


def table_dict() -> dict:
    """The tile table as a recorded run stores it: {"<device>/<use>": the entry's fields}."""
    return {f"{k[0]}/{k[1]}": vars(v) for k, v in TILE_TABLE.items()}

#: The story's S1 launch as it published it: a head-batched grid (B, H / BLOCK_H) with two
#: programs per request for 64 heads, plain tl.dot loop, none of the lab's later refinements.
#: The story gives no tile size along the tokens: the lab takes 32 tokens, 8 warps, 1 stage, which
#: compiles to 98,304 B of shared memory for its GPU (sm_120), within the 101,376 B a block may use
#: there (experiments/other_gpus_compile). Used by impl "mma_story" on every device.
STORY_TILES = TileConfig(32, 32, 8, 1, "the story's S1 launch (BLOCK_H 32: 2 programs for 64 heads)")


def device_key() -> str:
    return "interpret" if is_interpret() else info().capability


#: shared memory a block needs for the "default" entries (64 x 32, 2 stages: 151,680 B compiled for
#: sm_121 and sm_89, whose mma.sync path sm_120 and sm_80 share); a GPU without an entry of its own that allows
#: less takes sm_120's entries (~82 KB). experiments/other_gpus_compile
DEFAULT_SMEM_NEED = 152_000


def _table_key(use: str) -> str:
    """The tile table's key for this device: its capability; else its family's (12.1, GB10 -> 12.0);
    else "12.0" where a block gets less shared memory than the default entries need (sm_86, sm_89);
    else "default"."""
    key = device_key()
    if (key, use) in TILE_TABLE:
        return key
    if key is None:                    # compile mode outside planned_for: no device to ask
        return "default"
    family = key.split(".")[0] + ".0"
    if (family, use) in TILE_TABLE:
        return family
    smem = info().smem_per_block
    return "12.0" if smem is not None and smem < DEFAULT_SMEM_NEED else "default"


def tile_config(num_heads: int | None = None, *, split: bool = False) -> TileConfig:
    """This device's table entry for "mma" (or "split"), shrunk for fewer heads than a block."""
    use = "split" if split else "mma"
    cfg = TILE_TABLE[(_table_key(use), use)]
    if num_heads is not None and num_heads < cfg.block_h:
        # fewer heads than a block (tensor parallelism): shrink, tl.dot needs >= 16 rows
        cfg = replace(cfg, block_h=max(16, triton.next_power_of_2(num_heads)), source=cfg.source + " (shrunk to H)")
    return cfg


def sm_count() -> int:
    return 4 if is_interpret() else info().sm_count


def model_us(cfg: TileConfig, B: int, H: int, K: int, nsplit: int = 1, sms: int | None = None):
    """(programs, waves, tiles per program, modeled us) of one launch of ``cfg``:

        fixed_us + waves x tiles per program x us_per_tile,   waves = ceil(programs / SMs)

    Programs of one wave run side by side, so a launch lasts as long as its longest chain of
    tiles, once per wave, plus what any launch costs (start, the first loads, the stores)."""
    per = triton.cdiv(triton.cdiv(K, cfg.block_n), nsplit)
    progs = B * triton.cdiv(H, cfg.block_h) * nsplit
    waves = triton.cdiv(progs, sms or sm_count())
    return progs, waves, per, cfg.fixed_us + waves * per * (cfg.us_per_tile or 1.0)


def choose_tiles(B: int, H: int, K: int, sms: int | None = None, cfgs=None) -> TileConfig:
    """The "mma" launch's tiles for this shape: the 64-head tiles unless their grid leaves SMs idle
    and the model says the 16-head tiles (4x the programs) finish sooner."""
    big, small = cfgs or (tile_config(H), tile_config(H, split=True))
    return min((big, small), key=lambda c: model_us(c, B, H, K, sms=sms)[3])


MAX_SPLIT = 16
#: the merge's cost beyond TileConfig.merge_us: the partials written and read back, us per MB
#: (fitted by hand to the B=16..64 rows of the H200 NSPLIT sweep)
PARTIAL_US_PER_MB = 0.35


@dataclass(frozen=True)
class Plan:
    """One candidate launch for a shape, and the time the model expects."""
    use: str            # "mma" (one launch, no merge) or "split" (NSPLIT slices + merge)
    cfg: TileConfig
    nsplit: int
    programs: int
    waves: int
    tiles_per_program: int
    model_us: float


def plans(B: int, H: int, K: int, *, sms: int | None = None, cfgs=None, partials_bytes: int | None = None) -> list[Plan]:
    """Every candidate launch over both tile entries (``cfgs``: another device's pair, e.g. the
    H200's from TILE_TABLE) and every NSPLIT that leaves no slice empty:

        model_us + [NSPLIT > 1] (merge_us + PARTIAL_US_PER_MB x MB of partials)"""
    nbytes = partials_bytes or (4 if is_interpret() else 2)
    out = []
    for cfg in dict.fromkeys(cfgs or [tile_config(H), tile_config(H, split=True)]):
        tiles = triton.cdiv(K, cfg.block_n)
        for n in range(1, min(MAX_SPLIT, tiles) + 1):
            if triton.cdiv(tiles, triton.cdiv(tiles, n)) != n:
                continue                              # would leave an empty trailing slice
            progs, waves, per, t = model_us(cfg, B, H, K, n, sms)
            if n > 1:
                t += cfg.merge_us + PARTIAL_US_PER_MB * B * H * n * HEAD_DIM * nbytes / 1e6
            out.append(Plan("split" if n > 1 else "mma", cfg, n, progs, waves, per, t))
    return out


def choose(B: int, H: int, K: int, *, sms: int | None = None, cfgs=None) -> Plan:
    """The modeled-fastest plan (``splitk_auto``)."""
    return min(plans(B, H, K, sms=sms, cfgs=cfgs), key=lambda p: (p.model_us, p.nsplit))


def choose_split(B: int, H: int, K: int, *, sms: int | None = None, cfgs=None) -> Plan:
    """The modeled-fastest plan with at least 2 slices when K allows (``splitk``)."""
    every = plans(B, H, K, sms=sms, cfgs=cfgs)
    split = [p for p in every if p.nsplit >= 2] or every
    return min(split, key=lambda p: (p.model_us, p.nsplit))


@dataclass(frozen=True)
class Launch:
    """Every choice of one sparse-decode launch besides its tensors. Build it with
    :func:`launch_for` (the lab's defaults for an impl and shape) and change a field with
    ``dataclasses.replace`` for an A/B run; kernels take it explicitly."""
    tiles: TileConfig
    nsplit: int = 1
    dequant: str = "cvt"          # fp8 -> bf16: "cvt" (conversion instructions) or "bits" (integer ops; GPU)
    fold_scale: bool = False      # softmax scale applied inside exp2's fused multiply-add
    partials: str = "bfloat16"    # split-K's partial outputs: "bfloat16" or "float32"
    pdl: bool = False             # split-K's combine as a programmatic dependent launch (sm_90+)

    def __post_init__(self):
        if self.nsplit < 1 or self.nsplit > MAX_SPLIT:
            raise ValueError(f"Launch.nsplit must lie in [1, {MAX_SPLIT}], got {self.nsplit}")
        if self.dequant not in ("cvt", "bits"):
            raise ValueError(f"Launch.dequant must be 'cvt' or 'bits', got {self.dequant!r}")
        if self.partials not in ("bfloat16", "float32"):
            raise ValueError(f"Launch.partials must be 'bfloat16' or 'float32', got {self.partials!r}")
        if is_interpret() and (self.dequant == "bits" or self.pdl):
            raise ValueError("the interpreter runs neither the 'bits' dequant (inline PTX) nor PDL: "
                             f"got dequant={self.dequant!r}, pdl={self.pdl}")

    def as_dict(self) -> dict:
        return {"block_h": self.tiles.block_h, "block_n": self.tiles.block_n, "num_warps": self.tiles.num_warps,
                "num_stages": self.tiles.num_stages, "loop": self.tiles.loop, "nsplit": self.nsplit,
                "dequant": self.dequant, "fold_scale": self.fold_scale, "partials": self.partials, "pdl": self.pdl}


def pdl_supported() -> bool:
    """Programmatic dependent launch: Hopper and later, GPU only."""
    if is_interpret():
        return False
    cap = info().capability
    return bool(cap) and int(cap.split(".")[0]) >= 9


def launch_for(tiles: TileConfig, nsplit: int = 1, programs: int | None = None) -> Launch:
    """The lab's defaults for a launch of ``tiles`` in ``nsplit`` slices on this device.

    * dequant / fold: the entry's choice for launches of whole rows; split slices take "cvt" and
      no fold, which the NSPLIT sweep measured faster on 1-2 tiles a slice (H200, us, cvt vs
      bits + fold: B=16 x4 22.1 vs 23.1, B=32 x4 26.2 vs 26.8, B=64 x2 40.3 vs 41.0).
    * partials: bf16 on the GPU (half the bytes, one more rounding: out error 2.1e-3 -> 2.6e-3,
      faster at every B measured), fp32 in the interpreter (its fp32 -> bf16 casts truncate).
    * pdl: where the split grid leaves at least half the SMs idle (the combine's programs wait
      on SMs nobody else needs): B=1 13.8 -> 13.0 us, B=2 13.6 -> 13.4; on fuller grids it was
      slower (B=4 14.2 -> 15.0, B=8 18.7 -> 19.1)."""
    whole = nsplit == 1
    interp = is_interpret()
    pdl = (not whole and programs is not None and 2 * programs <= sm_count() and pdl_supported())
    return Launch(tiles, nsplit,
                  dequant="cvt" if interp or not whole else tiles.dequant,
                  fold_scale=whole and tiles.fold_scale,
                  partials="float32" if interp else "bfloat16",
                  pdl=pdl)


def launch_of_plan(plan: Plan) -> Launch:
    return launch_for(plan.cfg, plan.nsplit, plan.programs)


def per_shape(fn):
    """``fn(B, H, K) -> Launch`` decided once per shape and tile-table version, not on every call: the
    model (plans) is pure Python over every candidate and costs more host time than the launch itself."""
    cached = functools.lru_cache(maxsize=1024)(lambda B, H, K, version: fn(B, H, K))

    @functools.wraps(fn)
    def launch(B: int, H: int, K: int):
        return cached(B, H, K, TILE_TABLE.version)
    launch.cache_clear = cached.cache_clear
    return launch
