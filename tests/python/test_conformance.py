"""The import-swap acceptance harness (tests/python/conformance.py) on a sample of its documents.

The cells recorded as passing in tests/data/conformance/expected_pass.json must still pass (a
regression fails; cells of features still being built are not asserted), and the harness itself
must see a wrong value, a wrong dtype, wrong printed numbers and a wrong kind of error when it is
fed a deliberately wrong shardlab run.
"""

import copy
import json
import pathlib
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.jax
jax = pytest.importorskip("jax")

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import conformance  # noqa: E402

# Small documents whose two runs (a JAX subprocess and a shardlab one each) stay well inside the
# test's time budget; `make conformance` runs every document.
SAMPLE = ["jax-sharded-computation", "jax-explicit-sharding", "jax-parallel", "book-sharding", "book-training"]


@pytest.mark.parametrize("table_row", conformance.REWRITES, ids=[r[0] for r in conformance.REWRITES])
def test_import_rewrites_follow_the_table(table_row):
    jax_line, shardlab_line = table_row
    assert conformance.rewrite_imports(jax_line) == shardlab_line


def test_rewrites_touch_import_statements_only():
    src = ("import numpy as np\nx = 'import jax'\n"
           "def f():\n    import jax.numpy as jnp  # inside a function too\n    return jnp\n"
           "import os; from jax import lax\n")
    out = conformance.rewrite_imports(src)
    assert out.splitlines() == ["import numpy as np", "x = 'import jax'", "def f():",
                                "    import shardlab.numpy as jnp  # inside a function too", "    return jnp",
                                "import os; from shardlab import lax"]


def test_timeit_runs_its_statement_once():
    src, note = conformance.strip_magics("%timeit -n 5 -r 5 jnp.sin(x).block_until_ready()\n")
    assert (src.strip(), note) == ("jnp.sin(x).block_until_ready()", "timeit")
    assert conformance.strip_magics("!pip install foo\n")[0] is None


@pytest.fixture(scope="module")
def tiny_doc(tmp_path_factory):
    """A four-cell document and its real JAX run (one subprocess)."""
    doc = {"name": "tiny", "title": "tiny", "cells": [
        {"id": 0, "tags": [], "source": "import jax.numpy as jnp\nx = jnp.arange(4.0) * 2\nshape = x.shape\n"},
        {"id": 1, "tags": [], "source": "y = x.astype(jnp.int32)\ny.dtype\n"},
        {"id": 2, "tags": [], "source": "print(x.sum())\n"},
        {"id": 3, "tags": [], "source": "jnp.ones(3) + jnp.ones(4)\n"},
        {"id": 4, "tags": [], "source": "import jax\nfrom jax.sharding import PartitionSpec as P\n"
                                        "mesh = jax.make_mesh((2, 4), ('x', 'y'))\n"
                                        "s = jax.NamedSharding(mesh, P('x', None))\n"
                                        "z = jax.device_put(jnp.arange(8.0), jax.NamedSharding(mesh, P('y')))\n"
                                        "dt = jnp.float32\np = P(('x', 'y'))\n"},
    ]}
    path = tmp_path_factory.mktemp("conformance") / "tiny.json"
    path.write_text(json.dumps(doc))
    return doc, path, conformance.run_document(path, "jax")


def _verdicts(doc, jrecs, srecs):
    return [conformance.compare_cell(j, s, c) for c, j, s in zip(doc["cells"], jrecs, srecs)]


def test_real_jax_run_records_values(tiny_doc):
    doc, _, jrecs = tiny_doc
    assert [r["status"] for r in jrecs] == ["ok", "ok", "ok", "raised", "ok"]
    kind, dtype, shape, data = jrecs[0]["values"]["x"][:4]
    assert (kind, dtype, shape) == ("array", "float32", (4,))
    np.testing.assert_array_equal(data, [0, 2, 4, 6])
    assert jrecs[0]["values"]["shape"] == ("seq", (4,))
    assert jrecs[1]["last"] == ("dtype", "int32")
    assert conformance.numbers_in(jrecs[2]["stdout"]) == [12.0]
    assert jrecs[3]["exc"]["type"] == "TypeError"
    v = jrecs[4]["values"]
    assert v["mesh"] == ("Mesh", ("x", "y"), (2, 4), ("Explicit", "Explicit"))
    assert v["s"] == ("NamedSharding", v["mesh"], ("x",))
    assert v["z"][4:6] == (("y",), v["mesh"]) and v["dt"] == ("dtype", "float32") and v["p"] == ("P", (("x", "y"),))
    # The same run compared with itself passes everywhere.
    assert [v for v, _ in _verdicts(doc, jrecs, jrecs)] == ["pass"] * 5


@pytest.mark.parametrize("mutate, cell, expect", [
    (lambda r: r[0]["values"]["x"][3].__setitem__(2, 5.0), 0, "values differ at [2]"),
    (lambda r: r[0]["values"].__setitem__("x", ("array", "float64") + r[0]["values"]["x"][2:]), 0,
     "dtype float64 where JAX has float32"),
    (lambda r: r[0]["values"].__setitem__("shape", ("seq", (5,))), 0, "shape[0]: 5 where JAX has 4"),
    (lambda r: r[1].__setitem__("last", ("dtype", "int64")), 1, "the cell's value"),
    (lambda r: r[2].__setitem__("stdout", "12.5\n"), 2, "printed output differs"),
    (lambda r: r[3]["exc"].update(type="RuntimeError", mro=["RuntimeError", "Exception"]), 3,
     "where JAX raises TypeError"),
    (lambda r: r[3].update(status="ok", exc=None), 3, "no error where JAX raises TypeError"),
    (lambda r: r[1].update(status="raised", exc={"type": "AttributeError", "mro": ["AttributeError"],
                                                   "msg": "module 'shardlab' has no attribute 'typeof'",
                                                   "lineno": 1}), 1, "raises AttributeError"),
    (lambda r: r[4]["values"].__setitem__("z", r[4]["values"]["z"][:4] + (("x",),) + r[4]["values"]["z"][5:]), 4,
     "sharding spec ('x',) where JAX has ('y',)"),
    (lambda r: r[4]["values"].__setitem__("p", ("P", ("x", "y"))), 4, "p: "),
], ids=["value", "dtype", "shape", "last-expression", "stdout", "error-kind", "no-error", "missing-api",
        "array-sharding", "partition-spec"])
def test_harness_detects_a_wrong_shardlab_result(tiny_doc, mutate, cell, expect):
    doc, _, jrecs = tiny_doc
    wrong = copy.deepcopy(jrecs)
    mutate(wrong)
    verdicts = _verdicts(doc, jrecs, wrong)
    assert verdicts[cell][0] == "fail" and expect in verdicts[cell][1], verdicts[cell]
    assert all(v == "pass" for k, (v, _) in enumerate(verdicts) if k != cell)


def test_missing_api_is_ranked_and_cascades_are_charged_to_it(tiny_doc):
    doc, path, jrecs = tiny_doc
    wrong = copy.deepcopy(jrecs)
    wrong[0].update(status="raised", values={}, exc={"type": "AttributeError", "mro": ["AttributeError"],
                                                     "msg": "module 'shardlab.numpy' has no attribute 'arange'",
                                                     "lineno": 2})
    wrong[1].update(status="raised", values={}, exc={"type": "NameError", "mro": ["NameError"],
                                                     "msg": "name 'x' is not defined", "lineno": 1})
    result = conformance.check_document(path, shardlab_records=wrong, jax_records=jrecs)
    causes = {e["id"]: e.get("cause") for e in result["cells"]}
    assert causes[0] == "missing jax.numpy.arange" and causes[1] == "cascade from cell 0"
    (cause, count, where, _), *_ = conformance.ranking([result])
    assert (cause, count, where) == ("missing jax.numpy.arange", 2, [("tiny", 0), ("tiny", 1)])


@pytest.mark.parametrize("name", SAMPLE)
def test_cells_known_to_pass_still_pass(name):
    expected = set(conformance.expected_passes().get(name, []))
    result = conformance.check_document(name)
    regressions = [f"cell {e['id']}: {e['detail']}" for e in result["cells"]
                   if e["id"] in expected and e["verdict"] != "pass"]
    assert not regressions, f"{name}: cells that passed before fail now:\n" + "\n".join(regressions)


def test_after_a_failing_cell_the_run_goes_on_from_jax_values(tmp_path):
    """A cell that fails only in shardlab (here: it checks the module's name) leaves JAX's values
    behind it; the cell reading them is charged to it, and its own result (it passes) is kept."""
    doc = {"name": "repair", "title": "repair", "cells": [
        {"id": 0, "tags": [], "source": "import jax\nimport numpy as np\nassert jax.__name__ == 'jax'\n"
                                        "x = np.arange(3.0) * 2\n"},
        {"id": 1, "tags": [], "source": "y = x + 1\n"},
        {"id": 2, "tags": [], "source": "z = len([1, 2])\n"},
    ]}
    path = tmp_path / "repair.json"
    path.write_text(json.dumps(doc))
    result = conformance.check_document(path)
    cells = {e["id"]: e for e in result["cells"]}
    assert cells[0]["verdict"] == "fail" and cells[0]["cause"].startswith("AssertionError")
    assert (cells[1]["verdict"], cells[1]["cause"], cells[1]["own"]) == ("fail", "cascade from cell 0", "pass")
    assert cells[2]["verdict"] == "pass"
    (cause, count, _, _), = conformance.ranking([result])
    assert count == 2 and cause.startswith("AssertionError")
