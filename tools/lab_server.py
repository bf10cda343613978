"""Start JupyterLab on 127.0.0.1 with a fresh token and print the URL to open (``make lab``).

    python tools/lab_server.py [--port N] [--root DIR]

The browser test (tests/test_lab_browser.py) starts its server with the same functions.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(root: Path, port: int, token: str, *extra: str) -> list[str]:
    """The jupyter lab command line: loopback only, this port or fail, no browser of its own."""
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}",
           f"--IdentityProvider.token={token}", *extra]
    if os.geteuid() == 0:  # Jupyter refuses to run as root unless told; containers often run as root
        cmd.append("--allow-root")
    return cmd


def start(root: Path, port: int, token: str, *extra: str, env=None, log=None) -> subprocess.Popen:
    """Start the server in its own process group (so :func:`stop` ends it and its children)."""
    return subprocess.Popen(command(root, port, token, *extra), env=env, stdout=log, stderr=subprocess.STDOUT if log
                            else None, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_ready(proc: subprocess.Popen, port: int, token: str, timeout: float) -> None:
    """Return once the server answers its REST API; RuntimeError if it exits or stays silent."""
    url = f"http://127.0.0.1:{port}/api/status?token={token}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with code {proc.returncode} before answering on port {port}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"JupyterLab did not answer on port {port} within {timeout:.0f} s")


def stop(proc: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM the server's process group (Jupyter then shuts its kernels down), SIGKILL after ``grace`` s."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass


def main(argv=None):
    p = argparse.ArgumentParser(prog="python tools/lab_server.py", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=None, help="default: a free loopback port")
    p.add_argument("--root", type=Path, default=NOTEBOOKS, help="folder the file browser opens (default: notebooks/)")
    args = p.parse_args(argv)
    port, token = args.port or free_port(), secrets.token_hex(24)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # as Ctrl+C: leave no server behind
        signal.signal(sig, signal.default_int_handler)
    proc = start(args.root, port, token)
    try:
        wait_ready(proc, port, token, timeout=120)
        bar = "=" * 78
        print(f"\n{bar}\n  JupyterLab is running. Open this URL in your browser (Ctrl+C here stops it):\n\n"
              f"    http://127.0.0.1:{port}/lab?token={token}\n\n"
              f"  kernels \"Python (dsv4lab)\" and \"Python 3\" both run this environment\n"
              f"  files: {args.root}\n{bar}\n", flush=True)
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(proc)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
