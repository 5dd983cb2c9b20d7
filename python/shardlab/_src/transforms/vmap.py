"""vmap (placeholder while it is written)."""


def vmap(fun, in_axes=0, out_axes=0, axis_name=None, axis_size=None, spmd_axis_name=None):
    raise NotImplementedError("[vmap] not yet available")
