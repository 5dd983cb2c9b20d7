"""Ahead of time: ``Traced``, ``Lowered`` and ``Compiled``, as ``jax.stages``.

``jit(f).trace(*args)`` records the program `f` runs (shape-only, see ``program.py``);
``.lower()`` and ``.compile()`` keep it (there is nothing to compile) and answer what JAX's
stages answer: ``as_text()``, ``cost_analysis()``, ``memory_analysis()``, ``in_avals``,
``out_info``, ``input_shardings`` / ``output_shardings``. Calling a ``Compiled`` runs `f`
eagerly with jit's shardings, after checking the arguments against the traced types as JAX
does.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> mesh = sl.make_mesh((16, 16), ("x", "y"), hardware="tpu-v5p", abstract=True)
    >>> x = sl.ShapeDtypeStruct((4096, 8192), np.float32, sharding=sl.NamedSharding(mesh, P("x", "y")))
    >>> w = sl.ShapeDtypeStruct((8192, 1024), np.float32, sharding=sl.NamedSharding(mesh, P("y", None)))
    >>> lowered = sl.jit(lambda a, b: sl.matmul(a, b, out_sharding=P("x", None))).lower(x, w)
    >>> flops = 2 * 256 * 512 * 1024 + 256 * 1024     # per device: the local matmul, the psum's adds
    >>> lowered.cost_analysis()["flops"] == flops
    True
    >>> lowered.memory_analysis().argument_size_in_bytes == (256 * 512 + 512 * 1024) * 4   # one device's shards
    True
"""

from __future__ import annotations

import numpy as np

from ..arrays.local_array import LocalArray
from ..arrays.sharded_array import ShardedArray, device_put
from ..arrays.typeof import ShapedArray
from ..core import tree
from ..core.dtypes import canonicalize
from ..core.mesh import devices
from ..core.sharding import SingleDeviceSharding
from . import program as prog
from . import program_cost as cost
from . import program_text as text
from .eval_shape import ShapeDtypeStruct
from .jaxpr import ClosedJaxpr


class ArgInfo:
    """One argument of a stage: its abstract type and whether it is donated (``jax.stages.ArgInfo``)."""

    __slots__ = ("_aval", "donated")

    def __init__(self, aval: ShapedArray, donated: bool):
        self._aval = aval
        self.donated = donated

    @property
    def shape(self):
        return self._aval.shape

    @property
    def dtype(self):
        return self._aval.dtype

    def __repr__(self):
        return f"ArgInfo(_aval={self._aval!r}, donated={self.donated})"


class _Stage:
    """What Traced, Lowered and Compiled share (``jax.stages.Stage``)."""

    def __init__(self, traced: "Traced"):
        self._traced = traced

    @property
    def program(self) -> prog.Program:
        """The recorded program (shardlab's compiler IR)."""
        return self._traced._program

    @property
    def args_info(self):
        """A pytree of ArgInfo, shaped as ``(args, kwargs)`` without the static arguments."""
        t = self._traced
        infos = [ArgInfo(prog.shaped(v.aval), i in t._donated) for i, v in enumerate(t._program.invars)]
        return tree.unflatten(t._in_tree, infos)

    @property
    def in_tree(self):
        return self._traced._in_tree

    @property
    def out_tree(self):
        return self._traced._out_tree

    @property
    def in_avals(self):
        """The arguments' abstract types, shaped as ``(args, kwargs)``."""
        t = self._traced
        return tree.unflatten(t._in_tree, [prog.shaped(v.aval) for v in t._program.invars])

    @property
    def out_info(self):
        """ShapeDtypeStructs (with shardings) of the results, shaped as the function's output."""
        t = self._traced
        return tree.unflatten(t._out_tree, [v.aval.struct() for v in t._program.outvars])

    @property
    def donate_argnums(self) -> tuple:
        """Flat indices of the donated arguments."""
        return tuple(sorted(self._traced._donated))

    def cost_analysis(self) -> dict:
        """JAX's cost dict for one device ("flops", "transcendentals", "bytes accessed", the
        per-operand "bytes accessed{i}{}" and, on a mesh with hardware, "optimal_seconds"),
        summed over the recorded program as XLA counts unfused ops (see docs/transforms_aot.md)."""
        return cost.cost_analysis(self.program)

    def memory_analysis(self) -> cost.CompiledMemoryStats:
        """Per-device argument, output, alias and peak temporary bytes (XLA's CompiledMemoryStats names)."""
        return cost.memory_analysis(self.program, self._traced._donated)

    def as_text(self, dialect: str | None = None, *, debug_info: bool = False) -> str:
        """The program as text, in the form of XLA's partitioned HLO: one line per primitive and
        per collective, per-device shapes (``{V:x}``: varies along mesh axis x) and the global
        types in the book's notation. `dialect` may be None, 'hlo' or 'stablehlo' (one text)."""
        if dialect not in (None, "hlo", "stablehlo"):
            raise ValueError(f"unknown dialect: {dialect}")
        return text.hlo_text(self.program)

    def compiler_ir(self, dialect: str | None = None):
        """The recorded Program object."""
        if dialect not in (None, "hlo", "stablehlo"):
            raise ValueError(f"unknown dialect: {dialect}")
        return self.program


class Traced(_Stage):
    """A function traced for given argument types (``jax.stages.Traced``): ``.jaxpr``, ``.lower()``."""

    def __init__(self, program, in_tree, out_tree, donated, run, static, fun_name):
        self._program = program
        self._in_tree = in_tree
        self._out_tree = out_tree
        self._donated = frozenset(donated)
        self._run = run  # the jitted callable (eager, with its shardings)
        self._static = static  # (static positional args by index, static kwargs)
        self.fun_name = fun_name
        super().__init__(self)

    @property
    def jaxpr(self):
        """The program as a ClosedJaxpr (what ``make_jaxpr`` prints)."""
        return ClosedJaxpr(self._program)

    @property
    def out_avals(self):
        return tree.unflatten(self._out_tree, [prog.shaped(v.aval) for v in self._program.outvars])

    def lower(self, *, lowering_platforms=None, _private_parameters=None) -> "Lowered":
        """The lowered stage (``lowering_platforms`` is accepted and ignored: one platform)."""
        return Lowered(self)

    def __call__(self, *args, **kwargs):
        return self._run(*args, **kwargs)


class Lowered(_Stage):
    """A lowered function (``jax.stages.Lowered``): ``.as_text()``, ``.cost_analysis()``, ``.compile()``."""

    def compile(self, compiler_options=None, *, device_assignment=None) -> "Compiled":
        """The compiled stage (options are accepted and ignored: shardlab runs eagerly)."""
        return Compiled(self._traced)


class Compiled(_Stage):
    """A compiled function (``jax.stages.Compiled``): callable with arguments of the traced
    types (static arguments left out, as in JAX); runs the function eagerly with jit's shardings."""

    @property
    def input_shardings(self):
        """Each argument's sharding, shaped as ``(args, kwargs)``."""
        t = self._traced
        return tree.unflatten(t._in_tree, [_sharding_of(v.aval) for v in t._program.invars])

    @property
    def output_shardings(self):
        """Each result's sharding, shaped as the function's output."""
        t = self._traced
        return tree.unflatten(t._out_tree, [_sharding_of(v.aval) for v in t._program.outvars])

    def runtime_executable(self):
        """None: there is no executable, the function runs eagerly."""
        return None

    def __call__(self, *args, **kwargs):
        t = self._traced
        leaves, in_tree = tree.flatten((args, kwargs), _is_leaf)
        if in_tree != t._in_tree:
            raise TypeError(f"Function compiled with input pytree does not match the input pytree it was called "
                            f"with: compiled for {t._in_tree}, called with {in_tree}")
        errors = []
        for i, (x, v) in enumerate(zip(leaves, t._program.invars)):
            want = prog.shaped(v.aval)
            shape, dtype = _shape_dtype(x)
            if (tuple(shape), np.dtype(dtype)) != (want.shape, want.dtype):
                errors.append(f"Argument {i} compiled with {want.dtype.name}[{','.join(map(str, want.shape))}] "
                              f"and called with {np.dtype(dtype).name}[{','.join(map(str, shape))}]")
        if errors:
            n = len(errors)
            head = f"The first 5 of {n}" if n >= 5 else "The"
            raise TypeError("Argument types differ from the types for which this computation was compiled. "
                            f"{head} mismatches are:\n" + "\n".join(errors[:5]))
        placed, mismatches = [], []
        for i, (x, v) in enumerate(zip(leaves, t._program.invars)):
            want = v.aval.sharding
            if want is not None and isinstance(x, ShardedArray) and not x.sharding.is_equivalent_to(want, x.ndim):
                mismatches.append(f"Argument {i} with shape {prog.shaped(prog.Aval.of(x))}:\n  Passed sharding: "
                                  f"{x.sharding!r}\n  Required sharding: {want!r}")
            elif want is not None and not isinstance(x, ShardedArray):
                x = device_put(x, want)  # placed as the computation was compiled for
            placed.append(x)
        if mismatches:
            raise ValueError("Computation was compiled for input shardings that disagree with the shardings of "
                             f"arguments passed to it. Here are the {len(mismatches)} mismatches:\n"
                             + "\n".join(mismatches))
        args, kwargs = tree.unflatten(in_tree, placed)
        static_pos, static_kw = t._static
        full = list(args)
        for i in sorted(static_pos):
            full.insert(i, static_pos[i])
        return t._run(*full, **kwargs, **static_kw)


def _is_leaf(x) -> bool:
    return isinstance(x, (ShardedArray, LocalArray, ShapeDtypeStruct, np.ndarray))


def _shape_dtype(x):
    if isinstance(x, (ShardedArray, LocalArray, ShapeDtypeStruct, np.ndarray, np.generic)):
        return x.shape, x.dtype
    arr = np.asarray(x)
    return arr.shape, canonicalize(arr, "jit").dtype


def _sharding_of(aval: prog.Aval):
    if aval.sharding is not None:
        return aval.sharding
    return SingleDeviceSharding(devices()[0])
