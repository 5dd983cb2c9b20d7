"""Executes every notebook in notebooks/ in place (``make notebooks``), so the committed
outputs are those of the current code; the docs site renders them.

Usage: python docs/run_notebooks.py [NAME ...]   (default: all of notebooks/*.ipynb)
"""

import pathlib
import sys

import nbclient
import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def main(names) -> int:
    paths = [ROOT / n for n in names] if names else sorted(ROOT.glob("*.ipynb"))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        nbclient.NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(ROOT)}}).execute()
        nbformat.write(nb, path)
        print(f"executed {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
