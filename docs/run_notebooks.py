"""Executes notebooks in place (``make notebooks``), so the committed outputs are those of the
current code; the docs site renders them.

Usage: python docs/run_notebooks.py [NOTEBOOK ...]
    NOTEBOOK: a path (notebooks/03_sharded_matmul.ipynb), a file name (03_sharded_matmul.ipynb) or
    a number prefix (03); default: every notebooks/*.ipynb.

The kernel sees this process's shardlab (PYTHONPATH and SHARDLAB_CORE_DIR made absolute). A run
whose outputs contain this machine's repository path fails: committed outputs must read the same
on every machine.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import nbclient
import nbformat

REPO = pathlib.Path(__file__).resolve().parents[1]
ROOT = REPO / "notebooks"


def find(name: str) -> pathlib.Path:
    """The notebook a command-line argument names."""
    for p in (pathlib.Path(name), REPO / name, ROOT / name):
        if p.is_file():
            return p.resolve()
    hits = sorted(ROOT.glob(f"{name}*.ipynb"))
    if len(hits) == 1:
        return hits[0]
    raise SystemExit(f"[run_notebooks] no single notebook matches {name!r} in {ROOT} "
                     f"({', '.join(h.name for h in hits) or 'none'})")


def kernel_env() -> dict:
    env = dict(os.environ)
    for key in ("PYTHONPATH", "SHARDLAB_CORE_DIR"):
        if env.get(key):
            env[key] = os.pathsep.join(str(pathlib.Path(p).resolve()) if p else p for p in env[key].split(os.pathsep))
    return env


def main(names) -> int:
    paths = [find(n) for n in names] if names else sorted(ROOT.glob("*.ipynb"))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        t = time.perf_counter()
        nbclient.NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(path.parent)}}).execute(
            env=kernel_env())
        text = nbformat.writes(nb)
        if str(REPO) in text:
            raise SystemExit(f"[run_notebooks] {path.name}: an output shows the path {REPO}; print paths relative "
                             f"to the repository (or none) so the notebook reads the same everywhere")
        nbformat.write(nb, path)
        print(f"executed {path.name} in {time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
