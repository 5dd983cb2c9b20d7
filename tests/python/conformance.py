"""Import swap on real code: the JAX docs' sharding notebooks and the scaling book, cell by cell.

Each document under tests/data/conformance/ (one JSON per notebook or chapter, its cells in order)
runs twice, each time in its own subprocess and in one namespace: once with real JAX on 8 CPU
devices, once with the imports rewritten to shardlab (``import jax`` -> ``import shardlab as jax``,
see REWRITES). After every cell the worker records its outcome (ok, raised with the exception's
class, timeout, skipped) and its values: the last expression's value and every array, scalar,
dtype, shape, tuple, mesh, sharding or PartitionSpec the cell bound or rebound, converted to
plain data (numpy arrays, strings, tuples), plus what it printed. The parent compares the two
runs cell by cell (see compare_cell) and writes the report (docs/conformance.md). The JAX run
goes first: when a cell fails under shardlab, the shardlab run takes JAX's values for the names
that cell should have bound and goes on, charging the later cells that read them to the first
failure ("cascade") while still recording what they would do on their own (see run_worker).

    python tests/python/conformance.py                      # every document, a summary
    python tests/python/conformance.py --doc jax-parallel   # one document, failing cells in full
    python tests/python/conformance.py --report docs/conformance.md --update-expected
    python tests/python/conformance.py --commit auto        # the newest commit that imports, not
                                                            # the (shared, moving) working tree

Nothing is fetched: the cells are committed data (tests/data/conformance/README.md names their
sources, commits and licences).
"""

from __future__ import annotations

import argparse
import ast
import atexit
import contextlib
import io
import json
import math
import os
import pathlib
import pickle
import re
import shutil
import signal
import subprocess
import symtable
import sys
import tempfile
import time
import traceback
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "conformance"
EXPECTED = DATA / "expected_pass.json"
CELL_TIMEOUT_S = 120  # per cell, in each run
DOC_TIMEOUT_S = 1800  # per document and run (the subprocess)
PYTHON_TREE = [ROOT / "python"]  # the shardlab sources the shardlab run imports (--commit changes it)
MAX_ELEMENTS = 1 << 20  # larger arrays are compared by a summary (sums and a strided sample)

# --------------------------------------------------------------------------------------------
# The import rewrites (applied to import statements only, found with the ast module).
# --------------------------------------------------------------------------------------------
# Every module path that starts with `jax` starts with `shardlab` instead; the names a statement
# binds stay the names the cell uses:
REWRITES = [
    ("import jax", "import shardlab as jax"),
    ("import jax as j", "import shardlab as j"),
    ("import jax.numpy as jnp", "import shardlab.numpy as jnp"),
    ("import jax.sharding as shd", "import shardlab.sharding as shd"),
    ("import jax.lax", "import shardlab.lax, shardlab as jax"),
    ("from jax import lax, random, tree_util", "from shardlab import lax, random, tree_util"),
    ("from jax.sharding import Mesh, PartitionSpec as P", "from shardlab.sharding import Mesh, PartitionSpec as P"),
    ("from jax.experimental.shard_map import shard_map", "from shardlab.experimental.shard_map import shard_map"),
    ("from jax.experimental import mesh_utils", "from shardlab.experimental import mesh_utils"),
    ("from jax.tree_util import tree_map", "from shardlab.tree_util import tree_map"),
]


def _swap_module(name):
    if name == "jax" or (name and name.startswith("jax.")):
        return "shardlab" + name[3:]
    return name


def _rewrite_node(node):
    """The shardlab version of one Import / ImportFrom node, or None when it names no jax module."""
    if isinstance(node, ast.ImportFrom):
        if node.level or _swap_module(node.module) == node.module:
            return None
        return ast.ImportFrom(module=_swap_module(node.module), names=node.names, level=0)
    names, changed = [], False
    for a in node.names:
        new = _swap_module(a.name)
        if new == a.name:
            names.append(a)
        elif a.asname:
            names.append(ast.alias(new, a.asname)); changed = True
        elif "." not in a.name:  # import jax
            names.append(ast.alias("shardlab", "jax")); changed = True
        else:  # import jax.lax: load shardlab.lax and bind `jax` as the cell expects
            names += [ast.alias(new), ast.alias("shardlab", "jax")]; changed = True
    return ast.Import(names=names) if changed else None


def rewrite_imports(source):
    """``source`` with every import of a jax module rewritten to the shardlab module.

    Only import statements change (located with the ast module, replaced in place so that line
    numbers and everything else stay as written):

    >>> print(rewrite_imports("import jax, numpy as np\\nfrom jax.sharding import PartitionSpec as P"))
    import shardlab as jax, numpy as np
    from shardlab.sharding import PartitionSpec as P
    >>> rewrite_imports("x = 'import jax'  # not an import")
    "x = 'import jax'  # not an import"
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            new = _rewrite_node(node)
            if new is not None:
                edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, ast.unparse(new)))
    if not edits:
        return source
    lines = source.splitlines(keepends=True)
    for l0, c0, l1, c1, text in sorted(edits, reverse=True):
        first, last = lines[l0 - 1], lines[l1 - 1]
        merged = first[:c0] + text + last[c1:]
        lines[l0 - 1:l1] = [merged] + [""] * (l1 - l0)
    return "".join(lines)


# --------------------------------------------------------------------------------------------
# Cells: IPython line magics and the last expression.
# --------------------------------------------------------------------------------------------
_TIMEIT = re.compile(r"^(\s*)%timeit\s+(?:-\w\s*\d*\s+)*(.*)$")


def strip_magics(source):
    """(python source, note): ``%timeit [-n N -r R] stmt`` runs ``stmt`` once; other magics or
    shell escapes make the cell unrunnable (note says which)."""
    out, note = [], None
    for line in source.splitlines():
        m = _TIMEIT.match(line)
        if m:
            out.append(m.group(1) + m.group(2)); note = "timeit"
        elif line.lstrip().startswith(("%", "!")):
            return None, f"IPython magic or shell escape: {line.strip()[:60]}"
        else:
            out.append(line)
    return "\n".join(out) + "\n", note


# --------------------------------------------------------------------------------------------
# Values as plain data (numpy arrays, str, tuples), the same for both runs.
# --------------------------------------------------------------------------------------------
SKIP = object()  # a value the comparison does not look at (functions, modules, ...)


def Opaque(tag):  # noqa: N802 - reads like the type it stands for
    """("object", type name): a value the converter could not turn into data (a plain tuple, so that
    the records unpickle in any process)."""
    return tuple(tag)


def _is_opaque(v):
    return isinstance(v, tuple) and len(v) == 2 and v[0] == "object"


def _spec_tuple(spec):
    """A PartitionSpec as a tuple: its entries, then "unreduced={...}" / "reduced={...}" when set."""
    out = []
    parts = getattr(spec, "partitions", None)  # JAX refuses to iterate a spec with unreduced axes
    for e in (tuple(parts) if parts is not None else tuple(spec)):
        if e is None or isinstance(e, str):
            out.append(e)
        elif isinstance(e, (tuple, list)):
            out.append(tuple(e))
        else:
            out.append(str(e))
    for attr in ("unreduced", "reduced"):
        axes = getattr(spec, attr, None)
        if axes:
            out.append(f"{attr}={{{', '.join(sorted(map(str, axes)))}}}")
    return tuple(out)


def _normal_spec(spec):
    """A spec tuple without trailing Nones before its unreduced/reduced marks (P('x', None) and
    P('x') shard alike) and with 1-tuples as their axis."""
    marks = [e for e in spec if isinstance(e, str) and e.endswith("}") and "=" in e]
    spec = [e for e in spec if e not in marks]
    while spec and spec[-1] is None:
        spec.pop()
    return tuple([tuple(e) if isinstance(e, tuple) and len(e) != 1 else (e[0] if isinstance(e, tuple) else e)
                  for e in spec] + marks)


def _mesh_plain(mesh):
    names = tuple(getattr(mesh, "axis_names", ()))
    shape = getattr(mesh, "shape", None)
    sizes = tuple(shape[n] for n in names) if isinstance(shape, dict) or hasattr(shape, "keys") else \
        tuple(getattr(mesh, "axis_sizes", ()))
    types_ = tuple(str(t).split(".")[-1] for t in (getattr(mesh, "axis_types", None) or ()))
    return ("Mesh", names, sizes, types_)


def _array_plain(obj):
    dtype = str(getattr(obj, "dtype", "?"))
    shape = tuple(int(s) for s in obj.shape)
    spec = mesh = None
    host = type(obj) is __import__("numpy").ndarray  # plain numpy (not an Array, nor a subclass) in that run
    sharding = getattr(obj, "sharding", None) if not host else None
    if sharding is not None and getattr(sharding, "spec", None) is not None:
        try:
            spec = _normal_spec(_spec_tuple(sharding.spec))
            mesh = _mesh_plain(sharding.mesh)
        except Exception:
            spec = mesh = None
    import numpy as np
    try:
        data = np.asarray(obj)
    except Exception as e:  # key arrays, abstract values
        return ("array", dtype, shape, ("unreadable", type(e).__name__), spec, mesh, host)
    if data.dtype == object:  # e.g. np.array(jax.devices()): the elements as plain data
        flat = data.reshape(-1)
        return ("objarray", shape, tuple(to_plain(x, 5 - 1) if k < 64 else SKIP for k, x in enumerate(flat[:64])))
    if data.size > MAX_ELEMENTS:
        flat = data.reshape(-1)
        step = max(1, flat.size // 4096)
        as64 = flat.astype(np.float64) if data.dtype.kind in "biuf" or str(data.dtype) == "bfloat16" else None
        summary = (("summary", float(as64.sum()), float((as64 * as64).sum()), np.array(flat[::step]))
                   if as64 is not None else ("summary-opaque",))
        return ("array", dtype, shape, summary, spec, mesh, host)
    return ("array", dtype, shape, np.array(data), spec, mesh, host)


def to_plain(obj, depth=0):
    """Plain data for the comparison, SKIP for values it ignores, Opaque for unconvertible ones."""
    import numpy as np
    if depth > 4:
        return SKIP
    if obj is None or isinstance(obj, (bool, int, float, complex)):
        return obj
    if isinstance(obj, str):
        return SKIP  # strings are compared through what a cell prints
    if isinstance(obj, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                        type(print), io.IOBase)) or callable(obj) and not hasattr(obj, "shape"):
        if (isinstance(obj, type) and issubclass(obj, np.generic)) or type(obj).__name__ == "_ScalarMeta" or (
                isinstance(obj, type) and isinstance(getattr(obj, "dtype", None), np.dtype)):
            try:  # a scalar type (np.float32, jnp.float32): its dtype
                return ("dtype", str(np.dtype(getattr(obj, "dtype", obj))))
            except Exception:
                return SKIP
        return SKIP
    if isinstance(obj, np.dtype):
        return ("dtype", str(obj))
    if isinstance(obj, np.generic):
        return ("scalar", str(obj.dtype), obj.item() if obj.dtype.kind != "V" else str(obj))
    cls = type(obj).__name__
    if cls in ("PartitionSpec", "P"):  # JAX 0.10 names the class P
        return ("P", _spec_tuple(obj))
    if cls in ("NamedSharding",):
        return ("NamedSharding", _mesh_plain(obj.mesh), _normal_spec(_spec_tuple(obj.spec)))
    if cls in ("Mesh", "AbstractMesh"):
        return _mesh_plain(obj)
    if cls in ("ShapedArray", "ShapeDtypeStruct") or (hasattr(obj, "shape") and hasattr(obj, "dtype")
                                                       and not hasattr(obj, "__array__")):
        return ("aval", str(getattr(obj, "dtype", "?")), tuple(getattr(obj, "shape", ())))
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        return _array_plain(obj)
    if hasattr(obj, "platform") and hasattr(obj, "id") and isinstance(getattr(obj, "id"), int):
        return ("Device", obj.id)
    if isinstance(obj, (tuple, list)):
        if len(obj) > 64:
            return ("seq-long", len(obj))
        items = [to_plain(x, depth + 1) for x in obj]
        if all(x is SKIP for x in items) and items:
            return SKIP
        return ("seq", tuple(items))
    if isinstance(obj, dict):
        if len(obj) > 64 or not all(isinstance(k, (str, int)) for k in obj):
            return SKIP
        items = {k: to_plain(v, depth + 1) for k, v in obj.items()}
        items = {k: v for k, v in items.items() if v is not SKIP}
        return ("dict", tuple(sorted(items.items(), key=lambda kv: str(kv[0])))) if items else SKIP
    return Opaque(("object", cls))


# --------------------------------------------------------------------------------------------
# The worker: runs one document in this process, writing one pickled record per cell.
# --------------------------------------------------------------------------------------------
class CellTimeout(BaseException):
    """Raised by the alarm when a cell runs past CELL_TIMEOUT_S (a BaseException, so that a
    cell's own ``except Exception`` does not swallow it)."""


def _on_alarm(signum, frame):
    raise CellTimeout()


def _exc_record(e, tb, filename):
    line = None
    for frame, lineno in traceback.walk_tb(tb):
        if frame.f_code.co_filename == filename:
            line = lineno
    msg = re.sub(r" \(/\S+\.py\)", "", str(e)).strip().splitlines()  # no temporary paths
    frames = list(traceback.walk_tb(tb))
    where = ""
    if frames:  # the innermost frame: names the function when the message says nothing
        code = frames[-1][0].f_code
        where = f"{code.co_name} ({'/'.join(code.co_filename.split('/')[-2:])}:{frames[-1][1]})"
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "msg": msg[0][:300] if msg else "", "lineno": line, "where": where}


def _install_shims():
    """Harness stand-ins for optional helpers the notebooks import (the same in both runs)."""
    try:
        import termcolor  # noqa: F401
    except ImportError:
        mod = types.ModuleType("termcolor")
        mod.colored = lambda text, *a, **k: text
        sys.modules["termcolor"] = mod
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        pass


def run_worker(mode, doc_path, out_path, only=None, jax_records=None):
    """Runs one document's cells in order in one namespace, writing one pickled record per cell.

    With ``jax_records`` (the shardlab run, after the JAX run), a cell that raises where JAX ran it
    runs its remaining top-level statements anyway, and then the names JAX's run bound in it are
    set to JAX's values (converted to shardlab objects, see from_plain), so that later cells meet
    the state the document expects. Cells that then read such a name are recorded with
    ``uses_repaired`` (the comparison charges them to the cell that failed first) and their own
    result tells what would fail next once that cell is fixed."""
    doc = json.loads(pathlib.Path(doc_path).read_text())
    _install_shims()
    if mode == "jax":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jrecs = {}
    if jax_records:
        with open(jax_records, "rb") as f:
            jrecs = {r["id"]: r for r in pickle.load(f)}
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    if doc.get("prelude"):  # the imports a book chapter's prose assumes (see the README)
        prelude = doc["prelude"] if mode == "jax" else rewrite_imports(doc["prelude"])
        exec(compile(prelude, f"<{doc['name']} prelude>", "exec"), ns)
    seen, repaired = {}, {}  # repaired: name -> id of the cell whose JAX value it holds
    signal.signal(signal.SIGALRM, _on_alarm)
    with open(out_path, "wb") as out:
        for cell in doc["cells"]:
            rec = {"id": cell["id"], "status": "ok", "values": {}, "stdout": "", "seconds": 0.0}
            if cell.get("skip") or (only is not None and cell["id"] not in only):
                rec["status"] = "skipped"
                rec["reason"] = cell.get("skip") or "not selected"
                _dump(rec, out)
                continue
            source = cell["source"]
            for a, b in cell.get("edits", ()):
                source = source.replace(a, b)
            src, note = strip_magics(source)
            if src is None:
                rec.update(status="skipped", reason=note)
                _dump(rec, out)
                continue
            rec["timeit"] = note == "timeit"
            if mode == "shardlab":
                src = rewrite_imports(src)
            filename = f"<{doc['name']} cell {cell['id']}>"
            jrec = jrecs.get(cell["id"])
            recover = jrec is not None and jrec["status"] == "ok"
            buf = io.StringIO()
            t0 = time.perf_counter()
            try:
                statements = split_statements(src, filename)
            except SyntaxError as e:
                statements = None
                rec["status"] = "raised"
                rec["exc"] = _exc_record(e, e.__traceback__, filename)
            used = {}  # repaired names (from earlier cells) read up to the cell's first failing statement
            before = set(repaired)
            bound_before_failure = set()  # names this cell bound as the document intends
            if statements is not None:
                signal.alarm(int(cell.get("timeout", CELL_TIMEOUT_S)))
                try:
                    with contextlib.redirect_stdout(buf):
                        for code, loads, stores, is_last in statements:
                            reads = {n: repaired[n] for n in loads if n in repaired}
                            if rec["status"] == "ok":
                                used.update((n, c) for n, c in reads.items() if n in before)
                            try:
                                if is_last:
                                    value = eval(code, ns)
                                    if value is not None:
                                        rec["last"] = _safe_plain(value)
                                else:
                                    exec(code, ns)
                            except (CellTimeout, KeyboardInterrupt):
                                raise
                            except BaseException as e:  # noqa: BLE001 - every outcome is data here
                                if rec["status"] == "ok":
                                    rec["status"] = "raised"
                                    rec["exc"] = _exc_record(e, e.__traceback__, filename)
                                    for _, _, later, _ in statements[statements.index((code, loads, stores, is_last)):]:
                                        bound_before_failure -= later  # JAX's run binds them again after
                                if not recover:
                                    break
                                continue
                            if rec["status"] == "ok":
                                bound_before_failure |= stores
                            for n in stores:  # made from repaired values: repaired too
                                if reads:
                                    repaired[n] = min(reads.values())
                                else:
                                    repaired.pop(n, None)
                except CellTimeout:
                    rec["status"] = "timeout"
                finally:
                    signal.alarm(0)
            if used:
                rec["uses_repaired"] = used
            rec["seconds"] = time.perf_counter() - t0
            rec["stdout"] = buf.getvalue()[-20000:]
            for name, val in list(ns.items()):
                if name.startswith("_") or (name in seen and seen[name] is val):
                    continue
                seen[name] = val
                plain = _safe_plain(val)
                if plain is not SKIP:
                    rec["values"][name] = plain
            if recover and rec["status"] != "ok":
                rec["injected"] = _inject({k: v for k, v in jrec["values"].items()
                                           if k not in bound_before_failure}, ns, seen)
                for name in rec["injected"]:
                    repaired[name] = cell["id"]
            _dump(rec, out)


def _names(node):
    """(global names a statement reads, names it binds), from its symbol table: a function's
    parameters and locals are not reads of the namespace."""
    table = symtable.symtable(ast.unparse(node), "<statement>", "exec")
    loads, stores = set(), set()
    for sym in table.get_symbols():
        if sym.is_referenced():
            loads.add(sym.get_name())
        if sym.is_assigned() or sym.is_imported() or sym.is_namespace():
            stores.add(sym.get_name())
    todo = list(table.get_children())
    while todo:
        t = todo.pop()
        todo += t.get_children()
        for sym in t.get_symbols():
            if sym.is_referenced() and sym.is_global():
                loads.add(sym.get_name())
    return loads, stores


def split_statements(source, filename):
    """[(compiled statement, names it reads, names it binds)] for the cell's top-level statements;
    the last one, an expression, is compiled for eval (its value is the cell's value)."""
    tree = ast.parse(source, filename)
    out = []
    for k, st in enumerate(tree.body):
        loads, stores = _names(st)
        if k == len(tree.body) - 1 and isinstance(st, ast.Expr):
            code = compile(ast.Expression(st.value), filename, "eval")
        else:
            code = compile(ast.Module([st], type_ignores=[]), filename, "exec")
        out.append((code, loads, stores, isinstance(st, ast.Expr) and k == len(tree.body) - 1))
    return out


def _inject(values, ns, seen):
    """Sets the names of JAX's record to shardlab versions of its values; returns those set."""
    try:
        import shardlab as sl
    except Exception:
        return []
    done = []
    for name, plain in values.items():
        try:
            obj = from_plain(plain, sl)
        except Exception:
            obj = None
        if obj is not None:
            ns[name] = seen[name] = obj
            done.append(name)
    return sorted(done)


def from_plain(plain, sl):
    """A shardlab object for a plain value of the JAX run (None when there is none to make)."""
    import numpy as np
    if plain is None or isinstance(plain, (bool, int, float, complex)):
        return plain
    if not isinstance(plain, tuple) or not plain:
        return None
    kind = plain[0]
    if kind == "array":
        data = plain[3]
        if not isinstance(data, np.ndarray):
            return None
        spec, mesh = plain[4], plain[5] if len(plain) > 5 else None
        if len(plain) > 6 and plain[6]:
            return data  # numpy in the JAX run too
        if spec is not None and mesh is not None:
            m = _mesh_from_plain(mesh, sl)
            return sl.device_put(data, sl.NamedSharding(m, _spec_from_tuple(spec, sl)))
        return sl.numpy.asarray(data)
    if kind == "scalar":
        return np.dtype(plain[1]).type(plain[2])
    if kind == "dtype":
        return np.dtype(plain[1])
    if kind == "P":
        return _spec_from_tuple(plain[1], sl)
    if kind == "Mesh":
        return _mesh_from_plain(plain, sl)
    if kind == "NamedSharding":
        return sl.NamedSharding(_mesh_from_plain(plain[1], sl), _spec_from_tuple(plain[2], sl))
    if kind == "Device":
        return sl.devices()[plain[1]]
    if kind == "seq":
        items = [from_plain(x, sl) for x in plain[1]]
        return None if any(x is None and y is not None for x, y in zip(items, plain[1])) else tuple(items)
    if kind == "dict":
        items = {k: from_plain(v, sl) for k, v in plain[1]}
        return None if any(v is None for v in items.values()) else items
    return None


def _spec_from_tuple(spec, sl):
    entries = [e for e in spec if not (isinstance(e, str) and e.endswith("}") and "=" in e)]
    kw = {}
    for e in spec:
        if isinstance(e, str) and e.endswith("}") and "=" in e:
            k, v = e.split("=", 1)
            kw[k] = frozenset(a.strip() for a in v.strip("{}").split(",") if a.strip())
    return sl.P(*entries, **kw)


def _mesh_from_plain(plain, sl):
    _, names, sizes, types_ = plain
    try:
        at = sl.sharding.AxisType
        return sl.make_mesh(tuple(sizes), tuple(names), tuple(getattr(at, t) for t in types_))
    except Exception:
        return sl.make_mesh(tuple(sizes), tuple(names))


def _dump(rec, out):
    try:
        data = pickle.dumps(rec)
    except Exception as e:  # a value that will not pickle is reported as unconvertible
        rec["values"] = {k: v if _picklable(v) else Opaque(("object", f"unpicklable {type(e).__name__}"))
                         for k, v in rec["values"].items()}
        if "last" in rec and not _picklable(rec["last"]):
            rec["last"] = Opaque(("object", "unpicklable"))
        data = pickle.dumps(rec)
    out.write(data)
    out.flush()


def _picklable(v):
    try:
        pickle.dumps(v)
        return True
    except Exception:
        return False


def _safe_plain(value):
    try:
        return to_plain(value)
    except Exception as e:  # a value whose conversion itself fails is reported as such
        return Opaque(("object", f"{type(value).__name__} (conversion raised {type(e).__name__})"))


# --------------------------------------------------------------------------------------------
# The parent: two subprocesses per document, then the comparison.
# --------------------------------------------------------------------------------------------
def _worker_env(mode):
    env = dict(os.environ)
    if mode == "jax":
        flag = "--xla_force_host_platform_device_count=8"
        if flag not in env.get("XLA_FLAGS", ""):
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
        env["JAX_PLATFORMS"] = "cpu"
    # The worker runs in the temporary directory: relative paths given by the caller become absolute.
    if env.get("SHARDLAB_CORE_DIR"):
        env["SHARDLAB_CORE_DIR"] = os.path.abspath(env["SHARDLAB_CORE_DIR"])
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    core = ROOT / "build" / "core"
    if mode == "shardlab" and (env.get("SHARDLAB_CORE_DIR") or core.is_dir()):
        env.setdefault("SHARDLAB_CORE_DIR", str(core))
        env["PYTHONPATH"] = os.pathsep.join([str(PYTHON_TREE[0])] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONWARNINGS"] = "ignore"
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def run_document(doc_path, mode, only=None, timeout=DOC_TIMEOUT_S, jax_records=None):
    """The records of one run (a list of dicts, one per cell in order). The shardlab run given the
    JAX run's records repairs its state after a failing cell (see run_worker)."""
    doc = json.loads(pathlib.Path(doc_path).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "records.pkl"
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", mode, str(doc_path), str(out)]
        if only is not None:
            cmd += ["--only", ",".join(map(str, sorted(only)))]
        if jax_records is not None:
            (pathlib.Path(tmp) / "jax.pkl").write_bytes(pickle.dumps(jax_records))
            cmd += ["--jax-records", str(pathlib.Path(tmp) / "jax.pkl")]
        try:
            proc = subprocess.run(cmd, env=_worker_env(mode), cwd=tempfile.gettempdir(), capture_output=True,
                                  text=True, timeout=timeout)
            died = None if proc.returncode == 0 else f"worker exited with {proc.returncode}: " + \
                (proc.stderr.strip().splitlines() or [""])[-1][:200]
        except subprocess.TimeoutExpired:
            died = f"document timed out after {timeout} s"
        records = []
        if out.exists():
            with open(out, "rb") as f:
                while True:
                    try:
                        records.append(pickle.load(f))
                    except EOFError:
                        break
                    except Exception as e:  # a record cut short when the worker died
                        died = died or f"record unreadable ({type(e).__name__}: {e})"
                        break
    done = {r["id"] for r in records}
    for cell in doc["cells"]:
        if cell["id"] not in done:
            records.append({"id": cell["id"], "status": "crashed", "reason": died or "no record",
                            "values": {}, "stdout": ""})
    records.sort(key=lambda r: r["id"])
    return records


# Exception classes that JAX raises and shardlab may raise under another name: JAX's name ->
# names accepted from shardlab (besides the same name anywhere in shardlab's exception's MRO).
EXCEPTION_EQUIVALENTS = {
    "ShardingTypeError": {"ShardingTypeError"},
    "JaxRuntimeError": {"JaxRuntimeError", "XlaRuntimeError", "RuntimeError"},
    "XlaRuntimeError": {"JaxRuntimeError", "XlaRuntimeError", "RuntimeError"},
    "ConcretizationTypeError": {"ConcretizationTypeError", "TracerBoolConversionError", "TypeError"},
    "TracerBoolConversionError": {"ConcretizationTypeError", "TracerBoolConversionError", "TypeError"},
    "TracerIntegerConversionError": {"ConcretizationTypeError", "TracerIntegerConversionError", "TypeError"},
    "UnexpectedTracerError": {"UnexpectedTracerError"},
}


def same_exception_kind(jax_exc, sl_exc):
    """True when shardlab's exception is the kind JAX raised (same class name, one of its MRO
    names, or an EXCEPTION_EQUIVALENTS entry)."""
    if jax_exc["type"] in sl_exc["mro"]:
        return True
    return sl_exc["type"] in EXCEPTION_EQUIVALENTS.get(jax_exc["type"], ())


_NUMBER = re.compile(r"(?<![A-Za-z_\d.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|(?<![A-Za-z_])(?:nan|inf)(?![A-Za-z_])")


def numbers_in(text):
    """The numbers a cell printed (words with digits such as float32 or TFRT_CPU_0 are not numbers).

    >>> numbers_in("f32[8@X,4] Array([1., 2.5], dtype=float32) 1e-3 nan")
    [8.0, 4.0, 1.0, 2.5, 0.001, nan]
    """
    out = []
    for tok in _NUMBER.findall(text):
        try:
            out.append(float(tok))
        except ValueError:
            pass
    return out


def _close(a, b, rtol):
    if math.isnan(a) and math.isnan(b):
        return True
    return a == b or abs(a - b) <= rtol * max(abs(a), abs(b)) + 1e-6


def _tolerance(dtype):
    return {"bfloat16": 1e-2, "float16": 1e-3}.get(dtype, 1e-5)


def compare_plain(j, s, where="value"):
    """None when the two plain values agree, else a one-line description of the first difference."""
    import numpy as np
    if _is_opaque(j) or j is SKIP:
        return None
    if _is_opaque(s) or s is SKIP:
        return f"{where}: JAX gives {_describe(j)}, shardlab gives {s[1] if _is_opaque(s) else 'nothing'}"
    if isinstance(j, tuple) and j and j[0] == "array":
        if not (isinstance(s, tuple) and s and s[0] == "array"):
            return f"{where}: JAX gives {_describe(j)}, shardlab gives {_describe(s)}"
        _, jd, jshape, jdata, jspec = j[:5]
        _, sd, sshape, sdata, sspec = s[:5]
        if jshape != sshape:
            return f"{where}: shape {list(sshape)} where JAX has {list(jshape)}"
        if jd != sd:
            return f"{where}: dtype {sd} where JAX has {jd}"
        if isinstance(jdata, tuple) or isinstance(sdata, tuple):
            if isinstance(jdata, tuple) and isinstance(sdata, tuple):
                if jdata[0] == "summary" and sdata[0] == "summary":
                    tol = _tolerance(jd) * 10
                    if not (_close(jdata[1], sdata[1], tol) and _close(jdata[2], sdata[2], tol)
                            and np.allclose(jdata[3].astype(np.float64), sdata[3].astype(np.float64),
                                            rtol=_tolerance(jd), atol=1e-6, equal_nan=True)):
                        return f"{where}: values differ (large array summary)"
                elif jdata[0] != sdata[0]:
                    return f"{where}: values {sdata} where JAX has {jdata}"
            elif isinstance(sdata, tuple):
                return f"{where}: values unreadable in shardlab ({sdata[1] if len(sdata) > 1 else sdata[0]})"
            else:
                return None  # JAX's are unreadable (a key array): nothing to compare
        else:
            err = _array_diff(jdata, sdata, jd)
            if err:
                return f"{where}: {err}"
        if jspec is not None and sspec is not None and jspec != sspec:
            return f"{where}: sharding spec {sspec} where JAX has {jspec}"
        return None
    if isinstance(j, (bool, int, float, complex)) or j is None:
        if type(j) is not type(s) and not (isinstance(j, (int, float)) and isinstance(s, (int, float))
                                           and not isinstance(j, bool) and not isinstance(s, bool)):
            return f"{where}: {_describe(s)} where JAX has {_describe(j)}"
        if isinstance(j, float) or isinstance(s, float):
            return None if _close(float(j), float(s), 1e-5) else f"{where}: {s!r} where JAX has {j!r}"
        return None if j == s else f"{where}: {s!r} where JAX has {j!r}"
    if isinstance(j, tuple) and j and j[0] in ("seq", "dict"):
        if not (isinstance(s, tuple) and s and s[0] == j[0]) or len(s[1]) != len(j[1]):
            return f"{where}: {_describe(s)} where JAX has {_describe(j)}"
        for k, (jj, ss) in enumerate(zip(j[1], s[1])):
            if j[0] == "dict":
                if jj[0] != ss[0]:
                    return f"{where}: keys {[x[0] for x in s[1]]} where JAX has {[x[0] for x in j[1]]}"
                err = compare_plain(jj[1], ss[1], f"{where}[{jj[0]!r}]")
            else:
                err = compare_plain(jj, ss, f"{where}[{k}]")
            if err:
                return err
        return None
    if isinstance(j, tuple) and j and j[0] == "objarray":
        if not (isinstance(s, tuple) and s and s[0] == "objarray") or s[1] != j[1]:
            return f"{where}: {_describe(s)} where JAX has an object array of shape {list(j[1])}"
        for k, (jj, ss) in enumerate(zip(j[2], s[2])):
            err = compare_plain(jj, ss, f"{where}.flat[{k}]")
            if err:
                return err
        return None
    if isinstance(j, tuple) and j and j[0] == "scalar":
        if not (isinstance(s, tuple) and s and s[0] == "scalar"):
            return f"{where}: {_describe(s)} where JAX has {_describe(j)}"
        if j[1] != s[1]:
            return f"{where}: scalar dtype {s[1]} where JAX has {j[1]}"
        try:
            ok = _close(float(j[2]), float(s[2]), _tolerance(j[1]))
        except (TypeError, ValueError):
            ok = j[2] == s[2]
        return None if ok else f"{where}: {s[2]!r} where JAX has {j[2]!r}"
    try:
        differ = bool(j != s)
    except Exception:  # arrays nested somewhere unexpected: compare their pickles
        differ = pickle.dumps(j) != pickle.dumps(s)
    if differ:
        return f"{where}: {_describe(s)} where JAX has {_describe(j)}"
    return None


def _array_diff(a, b, dtype):
    import numpy as np
    if a.dtype.kind in "fc" or str(a.dtype) in ("bfloat16", "float16"):
        a64, b64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64), \
            b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
        tol = _tolerance(dtype)
        finite = np.abs(a64[np.isfinite(a64)]) if a64.size else np.zeros(1)
        scale = float(finite.max()) if finite.size else 0.0
        # relative to the element and to the array's largest magnitude: a float32 sum of K terms
        # carries rounding of order eps * K * |terms|, which need not be small next to a
        # cancelled-out element (a matmul's near-zero entries)
        close = np.isclose(a64, b64, rtol=tol, atol=tol * max(scale, 1e-30), equal_nan=True)
        if close.all():
            return None
        idx = tuple(int(i) for i in np.argwhere(~close)[0])
        return f"values differ at {list(idx)}: {b64[idx]!r} where JAX has {a64[idx]!r} ({int((~close).sum())} of {a.size})"
    if a.dtype.kind == "V" or b.dtype.kind == "V":
        return None if a.tobytes() == b.tobytes() else "values differ"
    neq = a != b
    if not np.any(neq):
        return None
    idx = tuple(int(i) for i in np.argwhere(neq)[0]) if neq.ndim else ()
    return f"values differ at {list(idx)}: {b[idx]!r} where JAX has {a[idx]!r} ({int(np.sum(neq))} of {a.size})"


def _describe(v):
    if isinstance(v, tuple) and v:
        if v[0] == "array":
            return f"array {v[1]}{list(v[2])}"
        if v[0] == "object":
            return f"a {v[1]} object"
        if v[0] == "seq":
            return f"a sequence of {len(v[1])}"
        if v[0] == "dict":
            return f"a dict of {len(v[1])}"
        if v[0] in ("dtype", "P", "Mesh", "NamedSharding", "Device", "aval", "scalar"):
            return repr(v)
    if v is SKIP:
        return "nothing"
    return f"{type(v).__name__} {v!r}"[:120]


def compare_cell(jrec, srec, cell):
    """(verdict, detail) for one cell: verdict one of 'pass', 'fail', 'skip' (skipped by its
    metadata, or JAX itself times out or crashes), 'jax-error' (JAX raises for a reason of this
    environment, named in the cell's "jax_fails" metadata: listed, not counted). A cell that
    JAX makes raise counts like any other: it passes when shardlab raises the same kind."""
    if jrec["status"] == "skipped":
        return "skip", jrec.get("reason", "")
    if jrec["status"] in ("timeout", "crashed"):
        return "skip", f"JAX: {jrec['status']} ({jrec.get('reason', '')})"
    verdict = "jax-error" if jrec["status"] == "raised" and cell.get("jax_fails") else None
    if srec["status"] in ("timeout", "crashed", "skipped"):
        return verdict or "fail", f"shardlab: {srec['status']} {srec.get('reason', '')}".strip()
    if jrec["status"] == "raised":
        if srec["status"] != "raised":
            return verdict or "fail", f"no error where JAX raises {jrec['exc']['type']}: {jrec['exc']['msg'][:120]}"
        if not same_exception_kind(jrec["exc"], srec["exc"]):
            return verdict or "fail", (f"raises {srec['exc']['type']}: {srec['exc']['msg'][:160]} where JAX raises "
                                       f"{jrec['exc']['type']}")
        return verdict or "pass", ""
    if srec["status"] == "raised":
        e = srec["exc"]
        return "fail", f"raises {e['type']}: {e['msg'][:200] or '(no message) in ' + e.get('where', '?')}"
    if "last" in jrec:
        err = compare_plain(jrec["last"], srec.get("last", SKIP), "the cell's value")
        if err:
            return "fail", err
    for name, jv in jrec["values"].items():
        err = compare_plain(jv, srec["values"].get(name, SKIP), name)
        if err:
            return "fail", err
    if prints_caught_exception(cell["source"]):
        if bool(jrec["stdout"].strip()) != bool(srec["stdout"].strip()):
            return "fail", ("prints nothing where JAX prints a caught error" if jrec["stdout"].strip()
                            else f"prints {srec['stdout'].strip()[:100]!r} where JAX prints nothing")
    elif not cell.get("ignore_stdout") and not jrec.get("timeit"):
        jn, sn = numbers_in(jrec["stdout"]), numbers_in(srec["stdout"])
        if len(jn) != len(sn) or not all(_close(a, b, 1e-5) for a, b in zip(jn, sn)):
            return "fail", f"printed output differs: {_first_line_diff(jrec['stdout'], srec['stdout'])}"
    return "pass", ""


def host_array_names(jrec, srec):
    """Names (and the cell's value, as "_") that are Arrays in JAX's run but numpy arrays in
    shardlab's: not counted as a failure (the values agree), listed in the report."""
    out = []
    pairs = [("_", jrec.get("last"), srec.get("last"))] + [
        (n, v, srec["values"].get(n)) for n, v in jrec.get("values", {}).items()]
    for name, j, s in pairs:
        if (isinstance(j, tuple) and isinstance(s, tuple) and len(j) > 6 and len(s) > 6 and j[0] == s[0] == "array"
                and not j[6] and s[6]):
            out.append(name)
    return out


def prints_caught_exception(source):
    r"""True when the cell prints an exception it catches (``except E as e: print(e)``): its printed
    text is JAX's error message, whose wording is not part of the contract, so only whether the
    cell printed is compared.

    >>> prints_caught_exception("try:\n  f()\nexcept ValueError as e:\n  print(e)\n")
    True
    """
    try:
        tree = ast.parse(strip_magics(source)[0] or "")
    except SyntaxError:
        return False
    for h in ast.walk(tree):
        if isinstance(h, ast.ExceptHandler) and h.name:
            for n in ast.walk(ast.Module(h.body, type_ignores=[])):
                if isinstance(n, ast.Call) and any(isinstance(a, ast.Name) and a.id == h.name for a in n.args):
                    return True
    return False


def _first_line_diff(a, b):
    al, bl = a.splitlines(), b.splitlines()
    for k in range(max(len(al), len(bl))):
        x = al[k] if k < len(al) else "<nothing>"
        y = bl[k] if k < len(bl) else "<nothing>"
        if numbers_in(x) != numbers_in(y) or (x != y and not numbers_in(x)):
            if len(numbers_in(x)) != len(numbers_in(y)) or not all(_close(p, q, 1e-5) for p, q in zip(numbers_in(x), numbers_in(y))):
                return f"line {k + 1}: {y.strip()[:100]!r} where JAX prints {x.strip()[:100]!r}"
    return "the numbers differ"


# --------------------------------------------------------------------------------------------
# Causes: what a failing cell is missing, as a key the ranking can count.
# --------------------------------------------------------------------------------------------
def _jaxname(mod):
    return "jax" + mod[len("shardlab"):] if mod.startswith("shardlab") else mod


def cause_of(detail, srec, cell_source):
    """A short key naming the missing or mismatching API behind a failure."""
    exc = srec.get("exc")
    if srec["status"] == "raised" and detail.startswith("raises"):
        t, m = exc["type"], exc["msg"]
        r = re.search(r"module '([\w.]+)' has no attribute '(\w+)'", m)
        if r:
            return f"missing {_jaxname(r.group(1))}.{r.group(2)}"
        r = re.search(r"cannot import name '(\w+)' from '([\w.]+)'", m)
        if r:
            return f"missing {_jaxname(r.group(2))}.{r.group(1)}"
        r = re.search(r"No module named '([\w.]+)'", m)
        if r:
            return f"missing module {_jaxname(r.group(1))}"
        if "ndarray" in m and ("object has no attribute" in m or "got ndarray" in m):
            return "a plain numpy.ndarray where JAX has an Array (no .at, .sharding, .block_until_ready, ...)"
        r = re.search(r"'([\w.]+)' object has no attribute '(\w+)'", m)
        if r:
            return f"missing {r.group(1)}.{r.group(2)}"
        r = re.search(r"([\w.]+)\(\) got an unexpected keyword argument '(\w+)'", m)
        if r:
            return f"missing keyword {r.group(1)}({r.group(2)}=)"
        r = re.search(r"([\w.]+)\(\) (?:takes|missing) ", m)
        if r:
            return f"signature of {r.group(1)}(): {re.sub(r'[0-9]+', '#', m)[:80]}"
        m = re.sub(r"0x[0-9a-fA-F]+", "0x…", m)
        if not m.strip():
            return f"{t} (no message) in {exc.get('where', '?')}"
        return f"{t}: {re.sub(r'[0-9]+', '#', m)[:90]}"
    if detail.startswith("printed output"):
        m = re.search(r"where JAX prints '(.*)'$", detail)
        jline = m.group(1) if m else ""
        if re.search("[\u2500-\u257f]", jline) or ("visualize_array_sharding" in cell_source and not jline):
            what = "jax.debug.visualize_array_sharding picture"
        elif re.search(r"\w\[[^\]]*@|\{V:|typeof", jline) or re.search(r"\w+\[[\d,]*\]", jline):
            what = "jax.typeof / aval string"
        elif "Sharding(" in jline or "PartitionSpec(" in jline or "P(" in jline or "Mesh(" in jline:
            what = "sharding / mesh repr"
        elif re.match(r"^\s*(\[|Array\(|-?\d)", jline) or "Array(" in jline:
            what = "array str/repr"
        elif "Device" in jline or "CPU" in jline or "cpu" in jline:
            what = "device repr"
        else:
            what = "other printed text"
        return f"printed output differs: {what}"
    r = re.match(r"[^:]+: (dtype|shape|sharding spec|values differ|values unreadable)", detail)
    if r:
        kind = r.group(1)
        if kind == "dtype":
            m = re.search(r"dtype (\S+) where JAX has (\S+)", detail)
            return f"value: dtype {m.group(1)} where JAX has {m.group(2)}" if m else "value: dtype"
        return f"value: {kind}"
    if detail.startswith("prints nothing where JAX prints a caught error"):
        return "no error where JAX raises (a cell that catches and prints it)"
    if detail.startswith("no error where JAX raises"):
        return "no error where JAX raises " + detail.split("raises ")[1].split(":")[0]
    if detail.startswith("shardlab:"):
        return detail.split(" (")[0][:60]
    return "value: " + re.sub(r"[0-9]+", "#", detail.split(": ", 1)[-1])[:80]


def _cell_line(source, lineno):
    if not lineno:
        return None
    lines = source.splitlines()
    return lines[lineno - 1].strip()[:90] if 0 < lineno <= len(lines) else None


# --------------------------------------------------------------------------------------------
# One document, all documents, the report.
# --------------------------------------------------------------------------------------------
def documents():
    return sorted(p.stem for p in DATA.glob("*.json") if p.stem not in ("expected_pass", "overrides"))


def load_doc(name):
    return json.loads((DATA / f"{name}.json").read_text())


def check_document(name, only=None, shardlab_records=None, jax_records=None):
    """Runs (or takes) both runs of one document and compares them: a dict with the cells' verdicts.

    ``name`` is a document under tests/data/conformance or the path of a JSON file like them."""
    path = pathlib.Path(name) if str(name).endswith(".json") else DATA / f"{name}.json"
    doc = json.loads(path.read_text())
    name = doc.get("name", path.stem)
    t0 = time.time()
    jrecs = jax_records if jax_records is not None else run_document(path, "jax", only)
    t1 = time.time()
    srecs = shardlab_records if shardlab_records is not None else run_document(path, "shardlab", only,
                                                                               jax_records=jrecs)
    t2 = time.time()
    cells = []
    failed_defs = {}  # name -> id of an earlier cell that bound it in JAX but failed in shardlab
    for cell, jr, sr in zip(doc["cells"], jrecs, srecs):
        verdict, detail = compare_cell(jr, sr, cell)
        entry = {"id": cell["id"], "verdict": verdict, "detail": detail,
                 "jax": jr["status"], "shardlab": sr["status"], "source": cell["source"],
                 "seconds": (round(jr.get("seconds", 0), 1), round(sr.get("seconds", 0), 1)),
                 "note": cell.get("note")}
        if sr.get("exc") and sr["exc"].get("lineno"):
            entry["line"] = _cell_line(cell["source"], sr["exc"]["lineno"])
        if verdict == "pass" and jr["status"] == "ok" and not (
                any(not _is_opaque(v) for v in jr["values"].values()) or jr.get("last") is not None
                or jr["stdout"].strip()):
            entry["nothing_compared"] = True  # it ran, but bound and printed nothing to compare
        if verdict == "pass" and sr["status"] == "ok":
            hosts = host_array_names(jr, sr)
            if hosts:
                entry["host_arrays"] = hosts
        name_cascade = None
        if sr.get("exc", {}).get("type") == "NameError":
            m = re.search(r"name '(\w+)' is not defined", sr["exc"]["msg"])
            if m and m.group(1) in failed_defs:
                name_cascade = f"cascade from cell {failed_defs[m.group(1)]}"
        if sr["status"] != "ok" and jr["status"] == "ok":  # what this cell should have defined
            for n in jr["values"]:
                failed_defs.setdefault(n, cell["id"])
            try:
                for node in ast.walk(ast.parse(strip_magics(cell["source"])[0] or "")):
                    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                        failed_defs.setdefault(node.name, cell["id"])
                    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                        failed_defs.setdefault(node.id, cell["id"])
                    elif isinstance(node, ast.alias):
                        failed_defs.setdefault((node.asname or node.name).split(".")[0], cell["id"])
            except SyntaxError:
                pass
        if sr.get("uses_repaired") and verdict in ("pass", "fail"):
            root = min(sr["uses_repaired"].values())
            names = ", ".join(n for n, c in sr["uses_repaired"].items() if c == root)
            entry["own"] = "pass" if verdict == "pass" else (name_cascade or cause_of(detail, sr, cell["source"]))
            entry["own_detail"] = detail
            entry["verdict"], entry["cause"] = "fail", f"cascade from cell {root}"
            entry["detail"] = (f"reads {names}, which cell {root} failed to make; given JAX's values it "
                               + ("passes" if verdict == "pass" else f"fails: {detail}"))
            cells.append(entry)
            continue
        if verdict == "fail":
            entry["cause"] = name_cascade or cause_of(detail, sr, cell["source"])
        cells.append(entry)
    return {"name": name, "title": doc.get("title", name), "cells": cells,
            "seconds": {"jax": round(t1 - t0, 1), "shardlab": round(t2 - t1, 1)}}


def summarize(result):
    c = result["cells"]
    counted = [e for e in c if e["verdict"] in ("pass", "fail")]
    raising = [e for e in counted if e["jax"] == "raised"]
    return {"cells": len(c), "counted": len(counted), "pass": sum(e["verdict"] == "pass" for e in c),
            "skip": sum(e["verdict"] == "skip" for e in c), "jax_error": sum(e["verdict"] == "jax-error" for e in c),
            "ok_counted": len(counted) - len(raising),
            "ok_pass": sum(e["verdict"] == "pass" for e in counted if e["jax"] != "raised"),
            "raise_counted": len(raising), "raise_pass": sum(e["verdict"] == "pass" for e in raising)}


def ranking(results):
    """[(cause, count, [(doc, cell id)...], example source line)] sorted by count, cascades charged
    to the cell that caused them."""
    by_cell = {}
    for r in results:
        for e in r["cells"]:
            if e["verdict"] == "fail":
                by_cell[(r["name"], e["id"])] = e
    counts = {}
    for (doc, cid), e in by_cell.items():
        cause = e["cause"]
        seen = set()
        while cause.startswith("cascade from cell") and (doc, cid) not in seen:
            seen.add((doc, cid))
            root = int(cause.rsplit(" ", 1)[1])
            root_entry = by_cell.get((doc, root))
            if root_entry is None:
                break
            cid, cause = root, root_entry["cause"]
        counts.setdefault(cause, []).append((doc, e["id"]))
    out = []
    for cause, where in counts.items():
        doc, cid = where[0]
        e = by_cell[(doc, cid)]
        out.append((cause, len(where), where, e))
    out.sort(key=lambda t: (-t[1], t[0]))
    return out


def next_blockers(results):
    """[(cause, [(doc, cell)], example entry)] of the cascaded cells' own failures, by count."""
    groups = {}
    for r in results:
        for e in r["cells"]:
            if e.get("own") and e["own"] != "pass" and not e["own"].startswith("cascade"):
                groups.setdefault(e["own"], []).append(((r["name"], e["id"]), e))
    out = [(cause, [w for w, _ in items], items[0][1]) for cause, items in groups.items()]
    out.sort(key=lambda t: (-len(t[1]), t[0]))
    return out


# Which part of issue #24 a cause most likely belongs to (first match), for routing.
SECTION_HINTS = [
    (r"random|tree_util|jax\.tree\b|vmap|make_jaxpr|\bscan\b|while_loop|\bcond\b|local_devices|"
     r"process_index|config|profiler|numpy\.ndarray|dtype (int|float)64|jnp on host", "§3 rest of the namespace"),
    (r"shard_map|pcast|pvary|all_gather|psum|ppermute|axis_index|per-device|checkpoint|remat|"
     r"manual_axis_type|\bdot\] per-device|fori_loop", "§4 shard_map and lax"),
    (r"lower|compile|as_text|cost_analysis|memory_analysis|trace\(|jaxpr", "§5 ahead of time"),
    (r"typeof|aval|AbstractMesh|abstract_mesh|set_mesh|get_mesh|AxisType|make_mesh|unreduced|reduced|"
     r"PartitionSpec|Mesh\(|mesh repr", "§1 meshes and types"),
    (r"reshard|auto_axes|explicit_axes|with_sharding_constraint|out_sharding|device=|einsum|dot|matmul|"
     r"sharding spec|visualize|ShardedArray|ShardingTypeError|Device not understood|str/repr|copy", "§2 sharding in types"),
]


def section_of(cause, detail=""):
    for pattern, section in SECTION_HINTS:
        if re.search(pattern, cause) or (detail and re.search(pattern, detail)):
            return section
    return "?"


def render_report(results, when):
    lines = ["# Import swap on real code (conformance)", "",
             "The JAX documentation's sharding notebooks and the code blocks of the scaling book "
             "(\"How to Scale Your Model\"), run cell by cell twice: with JAX 0.10.2 on 8 CPU devices, "
             "and with the imports swapped to shardlab (`import shardlab as jax`, `import shardlab.numpy as jnp`, "
             "...). A cell passes when shardlab runs it if and only if JAX does, every value it binds "
             "(arrays with their dtype, shape and sharding spec; scalars, dtypes, shapes, meshes, "
             "PartitionSpecs) and what it prints (its numbers) are equal (float32 to 1e-5), and, where JAX "
             "raises, shardlab raises the same kind of error. The cells, their sources and licences: "
             "`tests/data/conformance/` (README.md there). Run it with `make conformance` "
             "(`python tests/python/conformance.py --report docs/conformance.md`).", "",
             "How cells are compared, in short: the values are converted to plain data in each run "
             "(arrays through `np.asarray`, dtypes as strings, PartitionSpecs as tuples, meshes as "
             "names, sizes and axis types) and compared with float32 to 1e-5 (bfloat16 to 1e-2), relative "
             "to the element or to the array's largest magnitude (a matmul's near-zero entries carry "
             "the rounding of its large terms); "
             "printed text is compared on its numbers only, and a cell that prints an exception it "
             "catches only on whether it printed (JAX's wording is not the contract). JAX's exception "
             "class must appear in the class hierarchy of shardlab's (or be listed as equivalent in "
             "`EXCEPTION_EQUIVALENTS`). When a cell fails in shardlab, the rest of that cell still "
             "runs and the names JAX's run bound in it are set to JAX's values, so that one missing "
             "API does not hide the next: a later cell that reads those names fails as a *cascade* "
             "and is charged to the first failure, and what it would do on its own is listed under "
             "\"Behind the cascades\". The test (`tests/python/test_conformance.py`) runs a sample of "
             "the documents and fails when a cell of `tests/data/conformance/expected_pass.json` "
             "stops passing; `--update-expected` rewrites that list.", "",
             f"Last run: {when}.", "",
             "## Pass rate per document", "",
             "| document | cells | JAX runs on CPU (counted) | shardlab passes | pass rate | not counted |",
             "|---|---:|---:|---:|---:|---|"]
    tot_c = tot_p = 0
    for r in results:
        s = summarize(r)
        tot_c += s["counted"]; tot_p += s["pass"]
        rate = f"{100 * s['pass'] / s['counted']:.0f}%" if s["counted"] else "-"
        nc = []
        if s["skip"]:
            nc.append(f"{s['skip']} skipped")
        if s["jax_error"]:
            nc.append(f"{s['jax_error']} JAX errors")
        lines.append(f"| {r['name']} | {s['cells']} | {s['counted']} | {s['pass']} | {rate} | {', '.join(nc)} |")
    rate = f"{100 * tot_p / tot_c:.0f}%" if tot_c else "-"
    ss = [summarize(r) for r in results]
    okc, okp = sum(x["ok_counted"] for x in ss), sum(x["ok_pass"] for x in ss)
    rc, rp = sum(x["raise_counted"] for x in ss), sum(x["raise_pass"] for x in ss)
    hosts = [(r["name"], e["id"], e["host_arrays"]) for r in results for e in r["cells"] if e.get("host_arrays")]
    lines += [f"| **all** | | **{tot_c}** | **{tot_p}** | **{rate}** | |", "",
              "Against the issue's goals: of the cells JAX runs without error, "
              f"**{okp} of {okc}** ({100 * okp / max(okc, 1):.0f}%, goal 95%) run under shardlab with equal "
              f"values; of the cells JAX makes raise, **{rp} of {rc}** raise the same kind of error in "
              "shardlab (goal: all).", ""]
    empty = sum(1 for r in results for e in r["cells"] if e.get("nothing_compared"))
    lines += [f"Of the passing cells, {empty} bind and print nothing to compare (they define functions, "
              "set a mesh, ...): they pass by running without error.", ""]
    if hosts:
        lines += [f"Passing cells where a value is a numpy array in shardlab but a `jax.Array` in JAX (equal "
                  f"values, so not counted as a failure; `isinstance(x, jax.Array)` would differ): {len(hosts)}, "
                  "e.g. " + ", ".join(f"{d}:{c} (`{', '.join(n)[:40]}`)" for d, c, n in hosts[:6]) + ".", ""]
    lines += [
              "## What costs the most cells", "",
              "Each failing cell is charged to one cause (a cell that fails only because an earlier "
              "cell failed is charged to the earlier cell's cause). Examples are `document:cell`.", "",
              "| cause | cells | issue #24 (a guess) | example | first difference there |",
              "|---|---:|---|---|---|"]
    for cause, n, where, e in ranking(results):
        ex = ", ".join(f"{d}:{c}" for d, c in where[:3]) + (" ..." if len(where) > 3 else "")
        at = f" (at `{_code(e['line'])}`)" if e.get("line") else ""
        sec = section_of(cause, e.get("line") or "")
        lines.append(f"| {_md(cause)} | {n} | {sec} | {ex} | {_md(e['detail'][:140])}{at} |")
    nxt = next_blockers(results)
    if nxt:
        lines += ["", "### Behind the cascades: what fails next", "",
                  "After a failing cell the shardlab run goes on from JAX's values of the names that cell "
                  "binds. The cells that read them are charged above to the first failure; here is what "
                  "they hit themselves, i.e. what will fail once the causes above are fixed "
                  f"({sum(1 for r in results for e in r['cells'] if e.get('own') == 'pass')} of them pass "
                  "as they are).", "",
                  "| cause | cells | example | first difference there |", "|---|---:|---|---|"]
        for cause, where, e in nxt:
            ex = ", ".join(f"{d}:{c}" for d, c in where[:3]) + (" ..." if len(where) > 3 else "")
            lines.append(f"| {_md(cause)} | {len(where)} | {ex} | {_md(e['own_detail'][:140])} |")
    lines += ["", "## Cells that cannot pass on 8 CPU devices", ""]
    for r in results:
        rows = [e for e in r["cells"] if e["verdict"] in ("skip", "jax-error")]
        if not rows:
            continue
        lines.append(f"**{r['name']}**")
        lines.append("")
        for e in rows:
            why = e["detail"] if e["verdict"] == "skip" else f"JAX raises on CPU ({e['jax']}); {e['detail'] or 'shardlab agrees'}"
            lines.append(f"- cell {e['id']}: {_md(why[:200])}")
        lines.append("")
    lines += ["## Failing cells", ""]
    for r in results:
        rows = [e for e in r["cells"] if e["verdict"] == "fail"]
        if not rows:
            continue
        lines += [f"### {r['name']} ({r['title']})", ""]
        for e in rows:
            first = e.get("line") or next((ln.strip() for ln in e["source"].splitlines() if ln.strip() and not
                                           ln.strip().startswith(("#", "import ", "from ", "@"))), "")
            casc = f" ({e['cause']})" if e.get("cause", "").startswith("cascade") else ""
            note = f" *Note: {_md(e['note'])}*" if e.get("note") else ""
            lines.append(f"- cell {e['id']} (`{_code(first[:80])}`): {_md(e['detail'][:220])}{casc}{note}")
        lines.append("")
    return "\n".join(lines) + "\n"


def _md(text):
    """Plain text for a markdown line or table cell (no links, no code spans, no column breaks)."""
    text = str(text).replace("\n", " ").replace("`", "'")
    for ch in "\\|[]*_>":
        text = text.replace(ch, "\\" + ch)
    return text.replace("<", "&lt;")


def _code(text):
    """Text for inside a code span in a table row."""
    return str(text).replace("\n", " ").replace("`", "'").replace("|", "¦")


def expected_passes():
    return json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}


def use_commit(rev):
    """Makes the shardlab runs import ``rev``'s python/ tree; ``auto``: the newest of the last 20
    commits whose shardlab imports (others land features while this runs). Returns the commit."""
    revs = [rev] if rev != "auto" else subprocess.run(
        ["git", "-C", str(ROOT), "rev-list", "-n", "20", "HEAD"], capture_output=True, text=True,
        check=True).stdout.split()
    for r in revs:
        tmp = tempfile.mkdtemp(prefix="conformance-tree-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", r, "python"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        PYTHON_TREE[0] = pathlib.Path(tmp) / "python"
        ok = subprocess.run([sys.executable, "-c", "import shardlab, shardlab.numpy, shardlab.sharding"],
                            env=_worker_env("shardlab"), capture_output=True, cwd=tempfile.gettempdir())
        if ok.returncode == 0 or rev != "auto":
            return r
        print(f"commit {r[:10]}: shardlab does not import, trying its parent", file=sys.stderr)
    raise SystemExit("no importable commit among the last 20")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--doc", action="append", help="a document's name (repeatable); default: all")
    ap.add_argument("--report", help="write the markdown report here (e.g. docs/conformance.md)")
    ap.add_argument("--update-expected", action="store_true",
                    help="record the passing cells in tests/data/conformance/expected_pass.json")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--worker", nargs=3, metavar=("MODE", "DOC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--only", help=argparse.SUPPRESS)
    ap.add_argument("--jax-records", help=argparse.SUPPRESS)
    ap.add_argument("--commit", help="measure this commit's python/ tree (git archive into a temporary "
                    "directory; the C++ core from build/core) instead of the working tree; 'auto': the "
                    "newest commit whose shardlab imports")
    args = ap.parse_args(argv)
    if args.commit and not args.worker:
        args.commit = use_commit(args.commit)
    if args.worker:
        only = {int(x) for x in args.only.split(",")} if args.only else None
        run_worker(*args.worker, only=only, jax_records=args.jax_records)
        return 0
    names = args.doc or documents()
    results = []
    for name in names:
        r = check_document(name)
        results.append(r)
        s = summarize(r)
        print(f"{name}: {s['pass']}/{s['counted']} pass ({s['skip']} skipped, {s['jax_error']} JAX errors) "
              f"[jax {r['seconds']['jax']} s, shardlab {r['seconds']['shardlab']} s]", flush=True)
        if args.doc:
            for e in r["cells"]:
                if e["verdict"] != "pass":
                    print(f"  cell {e['id']} {e['verdict']}: {e['detail'][:200]}  <{e.get('cause', '')}>")
    if args.report:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        try:
            rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.commit or "HEAD"],
                                 capture_output=True, text=True).stdout.strip()
            when += f" on commit {rev}" if args.commit else f" on the working tree (HEAD {rev})"
        except OSError:
            pass
        pathlib.Path(args.report).write_text(render_report(results, when))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.update_expected:
        exp = expected_passes()
        for r in results:
            exp[r["name"]] = [e["id"] for e in r["cells"] if e["verdict"] == "pass"]
        EXPECTED.write_text(json.dumps(exp, indent=1, sort_keys=True) + "\n")
    tot = [summarize(r) for r in results]
    print(f"all: {sum(s['pass'] for s in tot)}/{sum(s['counted'] for s in tot)} cells pass "
          f"(JAX runs: {sum(s['ok_pass'] for s in tot)}/{sum(s['ok_counted'] for s in tot)}; "
          f"JAX raises: {sum(s['raise_pass'] for s in tot)}/{sum(s['raise_counted'] for s in tot)} same kind)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
