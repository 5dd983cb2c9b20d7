"""The emulated backend's einsum: every device's contraction in one call of the einsum
kernel, with the varying mesh dims as batch letters."""

from __future__ import annotations

from ...core.einsum_spec import free_letters
from ...kernels.einsum import einsum_arrays
from ...primitives import contractions as con
from .common import _impl


@_impl(con.EINSUM)
def _einsum(storages, mesh, *, terms, out, op_name="einsum", preferred_element_type=None):
    k = mesh.ndim
    mesh_letters = free_letters("".join(terms) + out, k)
    arrays, full_terms, varying = [], [], [False] * k
    for s, t in zip(storages, terms):
        keep = [j for j in range(k) if s.shape[j] != 1]
        for j in keep:
            varying[j] = True
        arrays.append(s.reshape(tuple(s.shape[j] for j in keep) + tuple(s.shape[k:])))
        full_terms.append("".join(mesh_letters[j] for j in keep) + t)
    out_mesh = "".join(mesh_letters[j] for j in range(k) if varying[j])
    res = einsum_arrays(full_terms, out_mesh + out, arrays)
    res = res.reshape(tuple(mesh.axis_sizes[j] if varying[j] else 1 for j in range(k)) + res.shape[len(out_mesh):])
    if preferred_element_type is not None:
        res = res.astype(preferred_element_type)
    return [res]
