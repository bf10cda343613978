"""Recorded GPU runs (data/runs/<run>/<part>.json), the A/B studies' data
(experiments/<question>/<name>.json) and the campaign's published tables
(data/campaign/*.csv), as dicts and pandas DataFrames.

Notebooks read these at run time and never copy a number out of them: a newer
recorded run replaces the JSON files and every notebook follows. This module only reads; on a GPU,
dsv4lab.bench measures the same tables live (``bench.measure_decode`` and its siblings).

The data folder sits beside the package in a repo checkout (editable install), and
experiments/ beside it; call :func:`use_data_dir` to read another copy of data/ (its
experiments/ is then the folder next to that copy).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from .device import VERSIONED
from .errors import OneLine

_DATA = [Path(__file__).resolve().parent.parent / "data"]


class MissingData(OneLine, FileNotFoundError):
    """A recorded file the caller needs is missing, unreadable or stale; the message says which file
    and how to get it (notebooks show the one line instead of a traceback)."""


def _how_to_get(run: str, part: str) -> str:
    from .record import PARTS
    cmd = (f"record it on a GPU with `python -m dsv4lab record --out data/runs/{run}"
           + (f" --only {part}`" if part in PARTS else "`"))
    if part == "indexer_step":
        cmd = f"write it on a GPU with `python experiments/indexer_topk/run.py data/runs/{run}/indexer_step.json`"
    elif part not in PARTS and part != "device":
        cmd = "it is not written by `python -m dsv4lab record`"
    return f"restore the repository's copy (`git checkout -- data/runs/{run}/{part}.json`) or {cmd}"


def use_data_dir(path):
    """Read recorded runs and campaign tables from ``path`` (a copy of the repo's data/ folder)."""
    _DATA[0] = Path(path)


def data_dir() -> Path:
    """The lab's data folder: ``data/`` next to the package, or the one :func:`use_data_dir` set."""
    path = _DATA[0]
    if not path.is_dir():
        raise MissingData(
            f"dsv4lab's data folder {path} does not exist. The recorded runs ship with the repo "
            f"checkout, not with the package: install the lab editable from a clone "
            f"(pip install -e .) or call dsv4lab.runs.use_data_dir() with a copy of its data/ folder.")
    return path


def available() -> list[str]:
    """Names of the recorded runs (folders of data/runs/ holding a device.json)."""
    root = data_dir() / "runs"
    return sorted(p.parent.name for p in root.glob("*/device.json"))


def load(part: str, run: str = "h200") -> dict:
    """One recorded part ("device", "checks", "decode", "tiles", "split", "indexer", "indexer_step") as
    the JSON dict.
    A missing or unreadable file raises :class:`MissingData` naming it and how to get it."""
    folder = data_dir() / "runs" / run
    if not folder.is_dir():
        raise MissingData(f"no recorded run {run!r}: {folder} does not exist; available: {available()} "
                          f"(or record one on a GPU: `python -m dsv4lab record --out data/runs/{run}`)")
    path = folder / f"{part}.json"
    if not path.exists():
        parts = sorted(p.stem for p in folder.glob("*.json"))
        raise MissingData(f"run {run!r} has no part {part!r}: {path} does not exist (it has {parts}); "
                          + _how_to_get(run, part))
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise MissingData(f"{path} cannot be read ({type(e).__name__}: {e}); {_how_to_get(run, part)}") from None


def require(part: str, columns, run: str = "h200") -> pd.DataFrame:
    """:func:`table` of ``part`` with ``columns`` present, else :class:`MissingData` saying the file is
    stale (recorded by an older lab) and how to re-record it: what a notebook calls before plotting."""
    df = table(part, run)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        path = data_dir() / "runs" / run / f"{part}.json"
        raise MissingData(f"{path} is stale: it has no column {', '.join(map(repr, missing))} (recorded by an "
                          f"older version of the lab); {_how_to_get(run, part)}")
    return df


def _frame(rows) -> pd.DataFrame:
    """Rows as a DataFrame; list cells (e.g. a check's case) become tuples, so they can be compared."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        if df[col].map(lambda v: isinstance(v, list)).any():
            df[col] = df[col].map(lambda v: tuple(v) if isinstance(v, list) else v)
    return df


def table(part: str, run: str = "h200") -> pd.DataFrame:
    """The rows of a recorded part as a DataFrame (list cells, e.g. a check's case, become tuples)."""
    rows = load(part, run).get("rows")
    if rows is None:
        raise KeyError(f"part {part!r} of run {run!r} has no rows (device.json holds only the environment)")
    return _frame(rows)


def experiments_dir() -> Path:
    """experiments/ next to the data folder: one folder per A/B study the lab ran, named by its
    question, with its README (question, prediction, result, decision), data and script."""
    return data_dir().parent / "experiments"


def experiment_names() -> dict[str, list[str]]:
    """{question: the names of its JSON files (without .json; sub-folders as "folder/name")}."""
    root = experiments_dir()
    if not root.is_dir():
        return {}
    return {d.name: sorted(p.relative_to(d).with_suffix("").as_posix() for p in d.rglob("*.json"))
            for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(("_", "."))}


def experiment(question: str, name: str) -> dict:
    """An A/B study's recorded data, experiments/<question>/<name>.json, as the JSON dict (``name``
    without .json; a file in a sub-folder as "folder/name"). Appendix notebooks read these."""
    names = experiment_names()
    if question not in names:
        raise FileNotFoundError(f"no experiment {question!r} in {experiments_dir()}; "
                                f"the experiments are {sorted(names)}")
    name = name.removesuffix(".json")
    if name not in names[question]:
        raise FileNotFoundError(f"experiment {question!r} has no data file {name!r}; it has {names[question]}")
    with open(experiments_dir() / question / f"{name}.json") as f:
        return json.load(f)


def experiment_table(question: str, name: str, key: str = "rows") -> pd.DataFrame:
    """``experiment(question, name)[key]`` (a list of rows) as a DataFrame."""
    d = experiment(question, name)
    if not isinstance(d.get(key), list):
        raise KeyError(f"experiments/{question}/{name}.json has no list {key!r}; its keys: {sorted(d)}")
    return _frame(d[key])


def trace_table() -> pd.DataFrame:
    """The program-clock study's recorded cases (experiments/program_clocks), one row each: the
    graph-replay time (also with the clock reads compiled in) and, from the programs' own clocks
    (medians over the replays, us), how long a program runs, how much of that is its tile loop,
    the spread of program starts, and for split-K the gap to the combine launch, the combine
    programs and the span from the first start to the last store."""
    rows = []
    for c in experiment("program_clocks", "trace_decode")["cases"]:
        m = c["medians"]
        rows.append(dict(case=c["case"], B=c["B"], same_tokens=c["same_tokens"], block_h=c.get("block_h"),
                         block_n=c.get("block_n"), nsplit=c.get("nsplit", 1), graph_us=c["graph_us"],
                         graph_us_traced=c["graph_us_traced"],
                         program_us=m["split_program_us"]["median"], loop_us=m["split_loop_us"]["median"],
                         after_loop_us=m["split_after_loop_us"]["median"], start_spread_us=m["split_start_spread_us"],
                         sms=m["sms"], gap_to_combine_us=m.get("gap_split_end_to_combine_start_us"),
                         combine_us=m.get("combine_program_us", {}).get("median"),
                         span_us=m.get("span_us", m["split_span_us"])))
    df = pd.DataFrame(rows)
    df["outside_kernels_us"] = df.graph_us_traced - df.span_us     # both with the clock reads in
    return df


def latest_experiment(question: str, prefix: str = "") -> str:
    """The name of ``question``'s newest data file (by its recorded ``date``) among those whose name
    starts with ``prefix``: a rerun added beside an older one (``h200_run2`` beside ``h200_run1``)
    is what notebooks read."""
    every = experiment_names()
    names = [n for n in every.get(question, []) if n.startswith(prefix)]
    if not names:
        raise FileNotFoundError(f"experiment {question!r} has no data file named {prefix}*.json" +
                                (f"; it has {every[question]}" if question in every else
                                 f"; the experiments are {sorted(every)}"))
    return max(names, key=lambda n: (str(experiment(question, n).get("date", "")), n))


#: the recorded replay docs/replay.md and notebooks 06-07 read: the newest, with every step of the current
#: stage table (the H200's predates S1's walk of the whole padded row: it prints its own definitions)
REPLAY_RUN = "h100"
#: the recorded kernel runs (decode, checks, indexer: ``python -m dsv4lab record``)
KERNEL_RUN = "h200"


def replay(run: str = REPLAY_RUN) -> dict:
    """The recorded campaign replay (``python -m dsv4lab reproduce``: the synthetic decode step through
    every stage) of run ``run``, data/runs/<run>/reproduce/reproduce.json, as the JSON dict: the config,
    the assumptions, every stage's steps, fit and profiles, the isolated decode calls, S0's glue
    scaling, the torch.compile lesson, and under "tables" every table its tables.md prints."""
    from .run_folder import verify
    path = data_dir() / "runs" / run / "reproduce" / "reproduce.json"
    if not path.exists():
        raise FileNotFoundError(f"run {run!r} has no recorded replay (data/runs/{run}/reproduce/reproduce.json; "
                                f"`python -m dsv4lab reproduce --out data/runs/{run}/reproduce` on a GPU writes it)")
    return verify(path.parent)


def replays() -> list[str]:
    """Names of the runs with a recorded replay (data/runs/<run>/reproduce/reproduce.json), REPLAY_RUN first."""
    found = sorted(p.parent.parent.name for p in (data_dir() / "runs").glob("*/reproduce/reproduce.json"))
    return sorted(found, key=lambda r: r != REPLAY_RUN)


def replay_table(name: str, run: str = REPLAY_RUN) -> pd.DataFrame:
    """One of the replay's tables ("throughput", "fits", "profile", "glue_ops", "decode", "story", ...)
    as a DataFrame."""
    tables = replay(run).get("tables", {})
    if name not in tables:
        raise KeyError(f"the replay of run {run!r} has no table {name!r}; it has {sorted(tables)}")
    return _frame(tables[name])


def replay_glue(stage: str, run: str = REPLAY_RUN) -> dict:
    """One stage's eager step in the replay, at the batch it profiled: ``ops``, its glue and FP32 GEMM
    kernel time charged to the aten op that launched each kernel (DataFrame op, us, share), every
    kernel's time by the profiler region that launched it (``region_us``: the model's parts, e.g.
    ``dsv4::indexer[torch_fp32]``), the step's kernel time (``total_us``) and the batch (``C``)."""
    d = replay(run)
    prof = d.get("stages", {}).get(stage, {}).get("profiles", {})
    eager = [p for p in prof.values() if p.get("glue_ops", {}).get("ops")]
    if not eager:
        raise KeyError(f"the replay of run {run!r} has no eager step of stage {stage!r}; "
                       f"stages: {sorted(d.get('stages', {}))}")
    g = eager[-1]["glue_ops"]
    return dict(ops=_frame(g["ops"]), region_us=g.get("region_us", {}), total_us=g["total_us"], C=eager[-1]["C"])


def optional(read, *args, **kwargs):
    """``read(*args, **kwargs)`` (one of this module's readers), or None after printing one line that
    says what is missing: a notebook keeps running on a data folder without that file or table."""
    try:
        return read(*args, **kwargs)
    except (FileNotFoundError, KeyError) as e:
        print(f"not recorded here: {e.args[0] if e.args else e}")
        return None


def ceilings(run: str = "h200"):
    """The run's measured ceilings as a dsv4lab.device.Ceilings."""
    from .device import Ceilings
    c = load("device", run)["ceilings"]
    return Ceilings(c["copy_tb_s"], c["bf16_tflops"], c.get("how", ""), c.get("fp32_tflops"))


def versions(env: dict) -> str:
    """'torch <version>, triton <version>' of a recorded run's environment."""
    return ", ".join(f"{name} {env[name]}" for name in VERSIONED)


def _provenance(d: dict, where: str) -> str:
    dev = d["device"]
    return (f"RECORDED (not live): {dev['name']}, {dev['sm_count']} SMs, capability {dev['capability']}; "
            f"{versions(d)}, sglang {d.get('sglang')}; {d['date']} [{where}]")


def provenance(part: str = "device", run: str = "h200") -> str:
    """One line saying where, when and with what a recorded part was measured."""
    return _provenance(load(part, run), f"data/runs/{run}/{part}.json")


def replay_provenance(run: str = REPLAY_RUN) -> str:
    """:func:`provenance` for the recorded replay."""
    env = replay(run)["environment"]
    return _provenance(env, f"data/runs/{run}/reproduce/reproduce.json")


def experiment_provenance(question: str, name: str) -> str:
    """:func:`provenance` for an experiment's data file."""
    return _provenance(experiment(question, name), f"experiments/{question}/{name}.json")


def tile_choice(use: str = "mma", run: str = "h200") -> dict:
    """The tile config the recorded run ended with for ``use`` (a use of the tile table,
    kernels.decode.planning.TILE_TABLE) on its own device: the table saved with the run's last part
    (later parts refit the costs)."""
    for part in ("decode", "checks", "split", "tiles"):
        try:
            d = load(part, run)
        except FileNotFoundError:
            continue
        key = f"{d['device']['capability']}/{use}"
        if key in d.get("tile_table", {}):
            return dict(d["tile_table"][key])
    raise KeyError(f"run {run!r} recorded no {use!r} tile config")


TILE_KEYS = ("block_h", "block_n", "num_warps", "num_stages", "loop", "prefetch", "dequant", "fold_scale")


def select(df: pd.DataFrame, cfg: dict) -> pd.DataFrame:
    """The rows of a sweep table (tiles or split) that were run with tile config ``cfg``."""
    keys = [k for k in TILE_KEYS if k in df.columns and k in cfg]
    mask = pd.Series(True, index=df.index)
    for k in keys:
        same = df[k] == cfg[k]
        if k in ("dequant", "fold_scale") and "nsplit" in df.columns:
            # rows record what ran, and split launches take "cvt" / no fold whatever the entry
            # says (planning.launch_for): there the entry's choice is not compared
            same |= df["nsplit"] > 1
        mask &= same
    return df[mask]


def campaign(name: str) -> pd.DataFrame:
    """A table the story published: "story_profile", "story_throughput" or "story_facts"
    (the "story_" prefix may be left out)."""
    folder = data_dir() / "campaign"
    stem = name.removesuffix(".csv")
    for cand in (stem, f"story_{stem}"):
        if (folder / f"{cand}.csv").exists():
            return pd.read_csv(folder / f"{cand}.csv")
    raise FileNotFoundError(f"no campaign table {name!r}; have {sorted(p.stem for p in folder.glob('*.csv'))}")


def story_fact(figure: str) -> str:
    """One published figure of the story_facts table, as its text (e.g. "cap context to 8192")."""
    facts = campaign("story_facts").set_index("figure")["value"]
    if figure not in facts:
        raise KeyError(f"story_facts has no figure {figure!r}; it has {list(facts.index)}")
    return str(facts[figure])


def story_glue_ops() -> dict[str, float]:
    """The story's breakdown of the glue by aten op after the MMA kernel, {"aten::copy_": 35.0, ...}
    (percent of the glue), parsed from its story_facts line."""
    text = story_fact("glue breakdown (op share of glue)")
    ops = {}
    for m in re.finditer(r"(aten::)?(\w+) ([\d.]+)%", text):
        ops[f"aten::{m.group(2)}"] = float(m.group(3))
    if not ops:
        raise ValueError(f"cannot read op shares from the story's glue breakdown {text!r}")
    return ops


def story_shares() -> dict[str, dict[str, float]]:
    """The story's published profile as two bars, {"story\nbefore": {category: %}, "story\nafter": ...},
    in dsv4lab.profile's categories; what the published rows leave is "other" (not published)."""
    from . import profile
    prof = campaign("story_profile")
    out = {}
    for when in ("before", "after"):
        shares = {c: float(prof[prof.kernel.str.startswith(name)][f"{when}_share_pct"].iloc[0])
                  for c, name in profile.STORY_CATEGORY.items()}
        shares[profile.OTHER] = max(0.0, 100.0 - sum(shares.values()))
        out[f"story\n{when}"] = shares
    return out


def story_pair(figure: str) -> tuple[float, float]:
    """The two numbers of a published "~a -> ~b" figure (e.g. the marginal per-request cost)."""
    nums = re.findall(r"[\d.]+", story_fact(figure))
    if len(nums) != 2:
        raise ValueError(f"story figure {figure!r} is not 'a -> b': {story_fact(figure)!r}")
    return float(nums[0]), float(nums[1])


def target_line(name: str, value: float, target: float, unit: str = "us", *, higher_is_better=False) -> str:
    """One line comparing a figure with an issue's target, saying plainly whether it misses and
    by how much. Notebooks print it; performance targets are reported, never asserted."""
    ok = value >= target if higher_is_better else value <= target
    verdict = "meets target" if ok else \
        f"MISSES target by {(target / value if higher_is_better else value / target):.2f}x"
    cmp = ">=" if higher_is_better else "<="
    return f"{name}: {value:.3g} {unit} (target {cmp} {target:.3g} {unit}): {verdict}"
