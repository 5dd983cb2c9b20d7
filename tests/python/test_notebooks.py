"""Executes every notebook in notebooks/ headless; a cell that raises (a failed assert
included) fails the test.

The kernel inherits this process's environment, so the notebooks see the same shardlab as
the tests: the installed package, or a developer build through SHARDLAB_CORE_DIR and
PYTHONPATH.
"""

import os
import pathlib

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def _kernel_env() -> dict:
    env = dict(os.environ)
    # The kernel runs from the notebook's directory; an in-tree python/ on a relative
    # PYTHONPATH must still resolve.
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(str(pathlib.Path(p).resolve()) if p else p
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    if env.get("SHARDLAB_CORE_DIR"):
        env["SHARDLAB_CORE_DIR"] = str(pathlib.Path(env["SHARDLAB_CORE_DIR"]).resolve())
    return env


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory, monkeypatch_module):
    """A kernel spec for this very interpreter, found first: a stale "python3" spec in the
    user's Jupyter directory could otherwise start a Python without shardlab."""
    from ipykernel.kernelspec import write_kernel_spec

    root = tmp_path_factory.mktemp("jupyter")
    write_kernel_spec(str(root / "kernels" / "shardlab-test"))
    monkeypatch_module.setenv("JUPYTER_PATH", str(root))
    return "shardlab-test"


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_name):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name=kernel_name,
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute(env=_kernel_env())
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell failed\n{e}", pytrace=False)


def test_notebooks_are_committed_executed():
    """Committed with the outputs of one run of the current code, top to bottom (the docs site
    renders them; `make notebooks` re-executes them in place)."""
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        counts = [c.get("execution_count") for c in nb.cells if c.cell_type == "code"]
        assert counts and None not in counts, f"{path.name}: some code cells were not executed; run make notebooks"
        assert counts == sorted(counts) and len(set(counts)) == len(counts), \
            f"{path.name}: cells ran out of order ({counts}); run make notebooks"
        errors = [c for c in nb.cells if c.cell_type == "code"
                  for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: a committed output is an error; run make notebooks"
