"""Re-creates the committed cell files from local git checkouts (run by hand, never by the tests).

    python tests/data/conformance/extract.py JAX_GIT_DIR BOOK_GIT_DIR

JAX_GIT_DIR is a clone of github.com/jax-ml/jax, BOOK_GIT_DIR one of github.com/jax-ml/scaling-book
(any clone holding the commits named below). The notebooks' code cells are taken in order; the
book's chapters give their ```py / ```python fenced blocks in order. Per-cell metadata that a
person decided (skips and their reasons) lives in SKIPS below, so a re-extraction keeps it.
"""

import json
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).parent

JAX_DOCS = {
    # name: (path, commit, title)
    "jax-sharded-computation": ("docs/sharded-computation.ipynb", "4c70e2d501c19dd61aa6a38fcda698fc2eaecf34",
                                "Introduction to parallel programming"),
    "jax-explicit-sharding": ("docs/notebooks/explicit-sharding.ipynb", "86d64e05a5dcf67a0b9b7beb0ea4ae49fb45d1c9",
                              "Explicit sharding (a.k.a. \"sharding in types\")"),
    "jax-distributed-arrays": ("docs/notebooks/Distributed_arrays_and_automatic_parallelization.ipynb",
                               "86d64e05a5dcf67a0b9b7beb0ea4ae49fb45d1c9",
                               "Distributed arrays and automatic parallelization"),
    "jax-shard-map": ("docs/notebooks/shard_map.ipynb", "cec06d116c05f0d52adfceee3d3b730fdbcb0ce5",
                      "Manual parallelism with shard_map"),
    "jax-parallel": ("docs/parallel.ipynb", "cec06d116c05f0d52adfceee3d3b730fdbcb0ce5",
                     "Distributed arrays and automatic parallelization (the 2026 successor)"),
    # The 2026 "201/301" docs (MyST markdown): 201/sharding.md holds the same cells as
    # docs/parallel.ipynb, so only these two are taken.
    "jax-201-shard-map": ("docs/new_docs/201/shard-map.md", "cec06d116c05f0d52adfceee3d3b730fdbcb0ce5",
                          "shard_map (JAX 201)"),
    "jax-301-sharding-ad": ("docs/new_docs/301/sharding-ad.md", "cec06d116c05f0d52adfceee3d3b730fdbcb0ce5",
                            "Sharding and autodiff: unreduced and reduced (JAX 301)"),
}
BOOK_COMMIT = "ccff50bb53ba47e191483f0ebc8cbb8b7150ff8d"
BOOK_CHAPTERS = {
    "book-jax-stuff": ("jax-stuff.md", "Programming TPUs in JAX"),
    "book-sharding": ("sharding.md", "Sharded Matrices and How to Multiply Them"),
    "book-profiling": ("profiling.md", "How to Profile TPU Programs"),
    "book-roofline": ("roofline.md", "All About Rooflines"),
    "book-training": ("training.md", "How to Parallelize a Transformer for Training"),
    "book-applied-inference": ("applied-inference.md", "Serving LLaMA 3-70B on TPUs"),
}
LICENSES = {"jax": "Apache-2.0 (jax-ml/jax LICENSE)", "book": "MIT (jax-ml/scaling-book LICENSE)"}

# Decided by hand, kept across re-extractions: per document an optional "prelude" (imports the
# prose assumes) and per cell "skip" (the reason the cell cannot run or is not code) or "edits"
# (exact [old, new] source replacements, applied in both runs, with "edits_reason").
OVERRIDES = json.loads((HERE / "overrides.json").read_text()) if (HERE / "overrides.json").exists() else {}


def git_show(git_dir, commit, path):
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def notebook_cells(text):
    nb = json.loads(text)
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        tags = cell.get("metadata", {}).get("tags", [])
        out.append({"source": src, "tags": tags})
    return out


def myst_cells(text):
    """The ```{code-cell} blocks of a MyST markdown file, their tags from the options block."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if not lines[i].startswith("```{code-cell}"):
            i += 1
            continue
        i += 1
        tags = []
        if i < len(lines) and lines[i].strip() == "---":
            i += 1
            while lines[i].strip() != "---":
                m = re.match(r"\s*tags:\s*\[(.*)\]", lines[i])
                if m:
                    tags = [t.strip().strip("'\"") for t in m.group(1).split(",") if t.strip()]
                i += 1
            i += 1
        while i < len(lines) and lines[i].startswith(":"):
            m = re.match(r":tags:\s*\[(.*)\]", lines[i])
            if m:
                tags = [t.strip().strip("'\"") for t in m.group(1).split(",") if t.strip()]
            i += 1
        body = []
        while not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        out.append({"source": "\n".join(body).strip("\n") + "\n", "tags": tags})
        i += 1
    return out


FENCE = re.compile(r"^(\s*)```(py|python)\s*$")


def markdown_blocks(text):
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, body, i = len(m.group(1)), [], i + 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        out.append({"source": "\n".join(body) + "\n", "tags": [], "line": None})
        i += 1
    return out


def write(name, meta, cells):
    over = OVERRIDES.get(name, {})
    for k, cell in enumerate(cells):
        cell["id"] = k
        cell.update(over.get("cells", {}).get(str(k), {}))
    doc = dict(meta, name=name)
    doc.update({k: v for k, v in over.items() if k != "cells"})
    doc["cells"] = cells
    (HERE / f"{name}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(name, len(cells), "cells")


def main(jax_git, book_git):
    for name, (path, commit, title) in JAX_DOCS.items():
        text = git_show(jax_git, commit, path)
        cells = notebook_cells(text) if path.endswith(".ipynb") else myst_cells(text)
        write(name, {"title": title, "repo": "jax-ml/jax", "path": path, "commit": commit,
                     "license": LICENSES["jax"]}, cells)
    for name, (path, title) in BOOK_CHAPTERS.items():
        cells = markdown_blocks(git_show(book_git, BOOK_COMMIT, path))
        for c in cells:
            c.pop("line")
        write(name, {"title": title, "repo": "jax-ml/scaling-book", "path": path, "commit": BOOK_COMMIT,
                     "license": LICENSES["book"]}, cells)


if __name__ == "__main__":
    main(*sys.argv[1:3])
