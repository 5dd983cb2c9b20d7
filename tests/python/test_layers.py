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


def _module_file(path: pathlib.Path, level: int, module: str | None) -> pathlib.Path:
    """The file a relative (level > 0) or absolute ``from <module> import *`` in ``path`` names."""
    if level:
        base = path.parent
        for _ in range(level - 1):
            base = base.parent
    else:
        base, module = ROOT / "python", module
    target = base.joinpath(*(module or "").split(".")) if module else base
    return target / "__init__.py" if target.is_dir() else target.with_suffix(".py")


def test_every_star_imported_module_names_its_exports():
    """``from m import *`` exports what ``m.__all__`` lists, never the modules ``m`` imports
    (``shardlab.dtypes`` once exported ``np``, ``contextlib`` and ``ml_dtypes``)."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                target = _module_file(path, node.level, node.module)
                body = ast.parse(target.read_text()).body
                if not any(isinstance(s, (ast.Assign, ast.AnnAssign)) and "__all__" in ast.unparse(s).split("=")[0]
                           for s in body):
                    missing.append(f"{path.relative_to(ROOT)} star-imports {target.relative_to(ROOT)}, which has "
                                   f"no __all__")
    assert not missing, "\n".join(missing)
    import shardlab.dtypes
    import shardlab.numpy

    for mod in (shardlab.dtypes, shardlab.numpy):
        leaked = [n for n in ("np", "contextlib", "ml_dtypes", "builtins", "math", "LocalArray", "bind")
                  if n in vars(mod)]
        assert not leaked, f"{mod.__name__} exports its imports {leaked}"


def test_no_single_slot_hooks():
    """A lower layer takes what a higher one defines through a ``register_*`` function called
    beside the definition, not a ``HOOK = [None]`` list filled by ``HOOK[0] = fn`` at import."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for t in targets:
                if isinstance(t, ast.Subscript) and ast.unparse(t.slice) in ("0", ":"):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} fills a slot: {ast.unparse(node)}")
                elif (isinstance(value, ast.List) and len(value.elts) == 1
                      and all(isinstance(e, ast.Constant) and e.value is None for e in value.elts)
                      and isinstance(t, ast.Name) and t.id.isupper()):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} defines a slot: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)


def test_a_primitive_defined_anywhere_runs_shape_only_without_registering_an_abstract_impl():
    """The abstract backend needs no ``register_all()``: a primitive's abstract implementation
    is its shape rule, so one defined here, after the package loaded, still runs shape-only."""
    import numpy as np
    import shardlab as sl
    from shardlab import P
    from shardlab._src.primitives.primitive import Primitive, bind

    def shape_rule(avals, mesh):   # storage shapes: mesh dims first, then the local [rows, cols]
        s = tuple(avals[0].shape)
        return [(s[:-2] + (2 * s[-2], s[-1]), np.dtype(avals[0].dtype))]

    twice = Primitive("test_rows_twice", shape_rule=shape_rule)
    twice.impl["emulated"] = lambda storages, mesh: [np.concatenate([storages[0]] * 2, axis=-2)]
    mesh = sl.make_mesh((4,), ("x",))
    f = sl.shard_map(lambda v: bind(twice, [v], v.mesh), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    out = np.asarray(f(x))
    assert out.shape == (16, 3)
    np.testing.assert_array_equal(out[4:8], np.concatenate([x[2:4], x[2:4]]))   # device 1's block, twice
    assert "abstract" not in twice.impl
    shaped = sl.eval_shape(f, sl.ShapeDtypeStruct((8, 3), np.float32))
    assert (shaped.shape, shaped.dtype) == ((16, 3), np.float32)

    untaught = Primitive("test_untaught", shape_rule=shape_rule)
    g = sl.shard_map(lambda v: bind(untaught, [v], v.mesh), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    assert sl.eval_shape(g, sl.ShapeDtypeStruct((8, 3), np.float32)).shape == (16, 3)
    with pytest.raises(NotImplementedError, match=r"\[test_untaught\] has no emulated implementation"):
        g(x)


def test_the_architecture_page_names_every_layer_of_the_contract():
    """docs/architecture.md writes the layers down; every layer of the import-linter contract
    appears in it, so the page and the contract cannot drift apart silently."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = [c for c in contracts if c["type"] == "layers"][0]["layers"]
    page = (ROOT / "docs" / "architecture.md").read_text()
    names = [n.strip() for layer in layers for n in layer.replace(":", "|").split("|")]
    absent = [n for n in names if f"_src/{n}" not in page]
    assert not absent, f"docs/architecture.md does not mention layers {absent}"
