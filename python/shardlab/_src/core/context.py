"""The one context stack: what is current while a program runs.

Everything that used to be a module-level global in several files lives here, thread-local:
the meshes of running shard_map bodies, the `with Ledger()` blocks, the named-scope labels,
the autodiff phase and the active gradient tapes. Upper layers push and pop; lower layers
only read.

Example:
    >>> from shardlab._src.core import context
    >>> with context.named_scope("layer0"), context.named_scope("mlp"):
    ...     context.current_label()
    'layer0/mlp'
"""

from __future__ import annotations

import contextlib
import threading


class _Context(threading.local):
    def __init__(self):
        self.meshes: list = []          # meshes of running shard_map bodies, innermost last
        self.ledgers: list = []         # active `with Ledger()` blocks
        self.scopes: list[str] = []     # named_scope labels, outermost first
        self.phase: str = "forward"     # 'forward', 'backward' or 'recompute'
        self.tapes: list = []           # active gradient tapes, innermost last
        self.wanted = None              # ids of values whose cotangents a backward walk needs (None: all)
        self.remat_saving = None        # (keep(prim, args, params) test, outputs saved) in a checkpoint
        self.remat_replay = None        # (the same test, saved outputs to hand back)
        self.mesh_stack: list = []      # `with mesh:` blocks
        self.global_mesh = None         # set_mesh(...)
        self.recorders: list = []       # jit(f).trace/lower program recorders: each sees every bind


CTX = _Context()


def current_shard_map_mesh(op: str, axis_name=None):
    """The mesh of the innermost running shard_map; NameError outside one (as JAX)."""
    if not CTX.meshes:
        name = axis_name if axis_name is not None else "?"
        raise NameError(f"unbound axis name: {name!r}. [{op}] collectives run inside "
                        f"shard_map, where the mesh's axis names are bound")
    return CTX.meshes[-1]


@contextlib.contextmanager
def shard_map_frame(mesh):
    """Binds `mesh`'s axis names while a shard_map body runs."""
    CTX.meshes.append(mesh)
    if CTX.recorders:  # a jit trace marks where the shard_map body's program starts
        for r in CTX.recorders:
            r.begin_shard_map(mesh)
    try:
        yield mesh
    finally:
        CTX.meshes.pop()


@contextlib.contextmanager
def named_scope(name: str):
    """Labels every ledger event recorded inside (``jax.named_scope``); scopes nest with '/'.

    Example:
        >>> import shardlab as sl
        >>> with sl.named_scope("layer3"), sl.named_scope("mlp"):
        ...     pass
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"[named_scope] name must be a non-empty string, got {name!r}")
    CTX.scopes.append(name)
    try:
        yield
    finally:
        CTX.scopes.pop()


def current_label() -> str:
    return "/".join(CTX.scopes)


@contextlib.contextmanager
def phase(name: str):
    """Tags events recorded inside with `name` ('forward', 'backward', 'recompute')."""
    previous = CTX.phase
    CTX.phase = name
    try:
        yield
    finally:
        CTX.phase = previous


def wanted(value) -> bool:
    """Whether the running backward walk needs `value`'s cotangent (rules may skip the work
    for values it does not, e.g. a weight gradient when only input gradients are asked for)."""
    return CTX.wanted is None or id(value) in CTX.wanted


_ledger_factory = None   # the Ledger class: register_ledger_factory


def register_ledger_factory(factory) -> None:
    """``factory()`` makes a mesh's default ledger; ``ledger/ledger.py`` registers its
    ``Ledger`` beside the class (core cannot import the ledger layer)."""
    global _ledger_factory
    _ledger_factory = factory


def new_ledger():
    """A new default ledger (for a mesh that records)."""
    return _ledger_factory()
