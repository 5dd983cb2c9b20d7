"""The legacy positional form ``shard_map(f, mesh, in_specs, out_specs, check_rep=True)``,
deprecated as in JAX (``jax.experimental.shard_map`` warns since v0.8.0): importing it warns
with JAX's DeprecationWarning; use ``shardlab.shard_map``. ``auto=`` (older JAX) names the
axes left out of ``axis_names``.

Example:
    >>> import warnings, numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     from shardlab.experimental.shard_map import shard_map
    >>> mesh = sl.make_mesh((2,), ("x",))
    >>> shard_map(lambda a: a * 2, mesh, P("x"), P("x"))(np.ones(4)).shape
    (4,)
"""

import warnings

from .._src.transforms.shard_map import _shard_map


def _legacy_shard_map(f, mesh, in_specs, out_specs, check_rep: bool = True, auto=frozenset()):
    """Please use `shardlab.shard_map`. `jax.experimental.shard_map.shard_map` has been deprecated."""
    axis_names = frozenset(mesh.axis_names) - frozenset(auto) if auto else frozenset()
    return _shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_names=axis_names,
                      check_vma=check_rep)


_legacy_shard_map.__name__ = "shard_map"
_legacy_shard_map.__qualname__ = "shard_map"

_deprecations = {
    "shard_map": ("jax.experimental.shard_map is deprecated in v0.8.0. Used jax.shard_map instead.",
                  _legacy_shard_map),
}


def __getattr__(name):
    if name in _deprecations:
        message, fn = _deprecations[name]
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
