"""The package's import structure: the import-linter contracts in pyproject.toml (layers that
import one way, subsystems on the public face) and no import inside a function except for
optional dependencies."""

import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "shardlab"
# Imported inside functions on purpose: optional dependencies, loaded only when used.
OPTIONAL = {"pandas", "IPython", "matplotlib", "rich", "simpy", "mkdocs", "threadpoolctl", "torch", "jax", "highspy", "mpi4py"}


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (it comes with the [test] extra)")
    env = dict(os.environ)
    import shardlab

    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(shardlab.__file__).parents[1]),
                                         env.get("PYTHONPATH", "")])
    res = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


def _function_imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    yield inner.lineno, [a.name for a in inner.names]
                elif isinstance(inner, ast.ImportFrom):
                    yield inner.lineno, [("." * inner.level) + (inner.module or "")]


def test_no_import_inside_a_function_except_optional_dependencies():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, names in _function_imports(path):
            for name in names:
                if name.split(".")[0] not in OPTIONAL:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not bad, "\n".join(bad)
