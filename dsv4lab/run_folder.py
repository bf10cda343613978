"""The main job's output folder: complete and from one run, or visibly incomplete.

``python -m dsv4lab reproduce --out DIR`` writes into a fresh sibling folder ``.DIR.partial-<pid>``
(what a killed run leaves behind, named as such) and, once every file is written, moves it into
place in one rename; the previous ``DIR`` stays whole until then. A lock file beside ``DIR`` keeps
two runs from writing the same folder at once (the OS drops it with the process, so a killed run
leaves no stale lock). The run's ``reproduce.json`` names every other file it wrote with its
SHA-256 (``output``), and :func:`verify` checks them: a reader of the folder (``runs.replay``, the
README renderer, the notebooks) refuses a folder whose files come from two runs.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import os
import shutil
from pathlib import Path

MAIN_FILE = "reproduce.json"


class IncompleteRun(ValueError):
    """A run folder that is not complete, or whose files are not all from the run it names."""


def check_out(out) -> Path:
    """``out`` as a folder the replay may own: not empty, not the current directory or one above it,
    not the filesystem's root or the home folder, not a file."""
    if out is None or not str(out).strip():
        raise ValueError("--out must name a folder for the replay's files, got an empty path")
    path = Path(out).expanduser().resolve()
    cwd = Path.cwd().resolve()
    if path == cwd or path in cwd.parents or path == Path(path.anchor) or path == Path.home().resolve():
        raise ValueError(f"--out must name a folder of its own for the replay's files (it is replaced whole at "
                         f"the end of a run), not {str(out)!r}, which resolves to {path}")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out must be a folder, but {path} is a file")
    return path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest(folder: Path, names, run_id: str) -> dict:
    """The ``output`` entry of reproduce.json: the run's id and every other file's SHA-256."""
    return dict(run_id=run_id, complete=True, written=datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), files={n: sha256(folder / n) for n in sorted(names)})


@contextlib.contextmanager
def writing(out):
    """Yield a fresh staging folder for a run into ``out``; on leaving without an error, move it into
    place (the old folder goes only then). On an error or interrupt the staging folder stays, named
    ``.<name>.partial-<pid>``, and ``out`` keeps the previous run. Refuses a second writer of ``out``."""
    out = check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out.parent / f".{out.name}.lock"
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                lock.seek(0)
                raise ValueError(f"another run is writing {out} ({lock.read().strip() or 'its pid unknown'}); "
                                 f"wait for it or pass another --out") from None
            raise
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}\n")
        lock.flush()
        stage = out.parent / f".{out.name}.partial-{os.getpid()}"
        if stage.exists():
            shutil.rmtree(stage)
        stage.mkdir()
        yield stage
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            os.rename(out, old)
        os.rename(stage, out)
        shutil.rmtree(old, ignore_errors=True)


def verify(folder) -> dict:
    """The folder's reproduce.json, after checking that it says its run completed and that every file
    it names is there with the SHA-256 it wrote. Raises :class:`IncompleteRun` naming what is wrong."""
    import json
    folder = Path(folder)
    main = folder / MAIN_FILE
    if not main.exists():
        raise IncompleteRun(f"{folder} has no {MAIN_FILE}: not a replay's output folder")
    with open(main) as f:
        d = json.load(f)
    o = d.get("output")
    if not o or not o.get("complete"):
        raise IncompleteRun(f"{main} is from a run that did not finish (no complete 'output' entry): rerun "
                            f"`python -m dsv4lab reproduce --out {folder}`")
    bad = [n for n, h in o["files"].items() if not (folder / n).exists() or sha256(folder / n) != h]
    if bad:
        raise IncompleteRun(f"{folder}: {', '.join(bad)} not what run {o['run_id']} wrote (missing or from "
                            f"another run); rerun the replay into a fresh --out")
    return d
