"""Contractions: ``matmul``, ``dot``, ``vdot``, ``inner``, ``outer``, ``einsum``, ``tensordot``,
``kron``, ``vecdot`` / ``matvec`` / ``vecmat`` and lax's ``dot_general``: one contraction
primitive on per-device values (a compute event in the ledger), shardlab's GEMM on host data,
the planner on global arrays.
"""

from __future__ import annotations

import builtins

import numpy as np

from ...arrays.local_array import lift, mesh_of
from ...core import dtypes as _dt
from ...core.einsum_spec import parse
from ...kernels.einsum import einsum_arrays, gemm_batched
from ...primitives import contractions as con
from ...primitives.primitive import bind
from .dispatch import _has_global, _implements, _is_local, _on_mesh, _scalar, GLOBAL
from .conversion import astype, ndim, shape
from .manipulation import ravel, reshape
from .creation import _create
from .elementwise import multiply, register_ufunc_call
from .reductions import sum

__all__ = ["matmul", "dot", "vdot", "inner", "outer", "einsum", "vecdot", "matvec", "vecmat", "tensordot", "kron"]


def _contract(terms, out, ops, mesh, op_name, preferred_element_type):
    dt = _dt.result_type(*[o.dtype for o in ops])
    ops = [astype(o, dt) for o in ops]
    return bind(con.EINSUM, ops, mesh, terms=tuple(terms), out=out, op_name=op_name,
                preferred_element_type=None if preferred_element_type is None
                else np.dtype(preferred_element_type))


def _host_result(out, preferred_element_type, operands):
    """A host contraction's result in JAX's dtype (operands promoted, then canonicalized)."""
    dt = _dt.result_type(*[np.asarray(o).dtype if not _scalar(o) else o for o in operands]) \
        if preferred_element_type is None else _dt.canonicalize_dtype(preferred_element_type)
    return np.asarray(out).astype(dt, copy=False)


def _host_placed(out, out_sharding, op: str):
    if out_sharding is not None:
        return _create(out, None, out_sharding, op)
    return _on_mesh(out)


@_implements(np.matmul)
def matmul(a, b, *, precision=None, preferred_element_type=None, out_sharding=None):
    """``a @ b`` with numpy's rules (1-D operands, broadcast batch dims); on global arrays JAX's
    dot_general sharding rule and the planner (``out_sharding=`` when it is ambiguous)."""
    if _has_global((a, b)):
        return GLOBAL["matmul"](a, b, out_sharding=out_sharding, preferred_element_type=preferred_element_type)
    if not _is_local(a, b):
        out = gemm_batched(np.asarray(a), np.asarray(b)) if np.ndim(a) >= 2 and np.ndim(b) >= 2 \
            else np.matmul(a, b)
        return _host_placed(_host_result(out, preferred_element_type, (a, b)), out_sharding, "matmul")
    mesh = mesh_of((a, b))
    A, B = lift(a, mesh), lift(b, mesh)
    if A.ndim == 0 or B.ndim == 0:
        raise ValueError(f"[matmul] operands must have rank >= 1, got local shapes {A.shape} and {B.shape}")
    kb = B.shape[-2 if B.ndim > 1 else 0]
    if A.shape[-1] != kb:
        raise ValueError(f"[matmul] local shapes {A.shape} and {B.shape}: contracting dims "
                         f"{A.shape[-1]} and {kb} differ")
    ra, rb = builtins.max(A.ndim - 2, 0), builtins.max(B.ndim - 2, 0)
    batch_a, batch_b = A.shape[:ra], B.shape[:rb]
    try:
        batch = np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        raise ValueError(f"[matmul] batch dims of local shapes {A.shape} and {B.shape} do not broadcast") from None
    letters = "abcdefghijklmnop"[:len(batch)]

    def term(X, rank, tail):
        """X's einsum term; a batch dim of size 1 that broadcasts is dropped (einsum then
        broadcasts the letter, so one [B·M, K] x [K, N] GEMM runs, not B broadcast copies)."""
        own = letters[len(batch) - rank:]
        keep = [i for i, c in enumerate(own) if X.shape[i] != 1 or batch[letters.index(c)] == 1]
        if len(keep) < rank:
            X = reshape(X, tuple(X.shape[i] for i in keep) + X.shape[rank:])
        return X, "".join(own[i] for i in keep) + tail

    A, ta = term(A, ra, "mk" if A.ndim > 1 else "k")
    B, tb = term(B, rb, "kn" if B.ndim > 1 else "k")
    out = letters + ("m" if ta.endswith("mk") else "") + ("n" if tb.endswith("kn") else "")
    return _contract([ta, tb], out, [A, B], mesh, "matmul", preferred_element_type)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _global_contract(op, sub, operands, out_sharding=None, preferred_element_type=None, prim="dot_general"):
    return GLOBAL["contract"](op, sub, operands, out_sharding=out_sharding,
                              preferred_element_type=preferred_element_type, prim=prim)


@_implements(np.dot)
def dot(a, b, *, precision=None, preferred_element_type=None, out_sharding=None):
    """``jnp.dot``: a's last dim against b's second-to-last (its only one if 1-D); scalars multiply."""
    ra, rb = ndim(a), ndim(b)

    def subscripts():  # JAX's: lax.dot_general contracting (ra-1, max(rb-2, 0)), no batch dims
        la = _LETTERS[:ra]
        lb = _LETTERS[ra:ra + rb - 1]
        lb = lb[:-1] + la[-1] + lb[-1:] if rb > 1 else la[-1]
        return f"{la},{lb}->" + la[:-1] + (lb[:-2] + lb[-1] if rb > 1 else "")

    if _has_global((a, b)):
        if ra == 0 or rb == 0:
            return multiply(a, b)
        return _global_contract("dot", subscripts(), (a, b), out_sharding, preferred_element_type)
    if ra > 2 or rb > 2:
        if not _is_local(a, b):
            return _host_placed(_host_result(np.dot(np.asarray(a), np.asarray(b)), preferred_element_type, (a, b)),
                                out_sharding, "dot")
        if ra == 0 or rb == 0:
            return multiply(a, b)
        mesh = mesh_of((a, b))
        A, B = lift(a, mesh), lift(b, mesh)
        k = B.shape[-2 if rb > 1 else 0]
        if A.shape[-1] != k:
            raise TypeError(f"[dot] dot_general requires contracting dimensions to have the same shape, got "
                            f"({A.shape[-1]},) and ({k},) (local shapes {A.shape} and {B.shape}): jnp.dot "
                            f"contracts a's last dim with b's second-to-last")
        return einsum(subscripts(), A, B, preferred_element_type=preferred_element_type)
    if ra == 0 or rb == 0:
        return multiply(a, b)
    return matmul(a, b, preferred_element_type=preferred_element_type, out_sharding=out_sharding)


@_implements(np.vdot)
def vdot(a, b, *, precision=None, preferred_element_type=None):
    """``jnp.vdot``: the flattened operands' dot product (on global arrays every dim contracts)."""
    if _has_global((a, b)):
        if ndim(a) != ndim(b) or shape(a) != shape(b):
            a, b = ravel(a), ravel(b)
        sub = _LETTERS[:ndim(a)]
        return _global_contract("vdot", f"{sub},{sub}->", (a, b), None, preferred_element_type)
    return sum(multiply(ravel(a), ravel(b)))


@_implements(np.inner)
def inner(a, b, *, precision=None, preferred_element_type=None):
    """``jnp.inner``: the last dims contract."""
    ra, rb = ndim(a), ndim(b)
    if ra == 0 or rb == 0:
        return multiply(a, b)
    la, lb = _LETTERS[:ra], _LETTERS[ra:ra + rb - 1] + _LETTERS[ra - 1]
    sub = f"{la},{lb}->{la[:-1]}{lb[:-1]}"
    if _has_global((a, b)):
        return _global_contract("inner", sub, (a, b), None, preferred_element_type)
    if not _is_local(a, b):
        return _on_mesh(_host_result(np.inner(np.asarray(a), np.asarray(b)), preferred_element_type, (a, b)))
    return einsum(sub, a, b, preferred_element_type=preferred_element_type)


@_implements(np.outer)
def outer(a, b, out=None):
    """``jnp.outer``: ravel(a)[:, None] * ravel(b)[None, :] (on global arrays: the broadcasting rule)."""
    if _has_global((a, b)):
        return _global_contract("outer", "i,j->ij", (ravel(a) if ndim(a) != 1 else a, ravel(b) if ndim(b) != 1
                                                       else b), None, None, prim="mul")
    if not _is_local(a, b):
        return _on_mesh(_host_result(np.outer(a, b), None, (a, b)))
    return einsum("i,j->ij", ravel(a), ravel(b))


def _dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, out_sharding=None):
    """``lax.dot_general``: contract ``lhs`` and ``rhs`` along ``dimension_numbers`` =
    ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)); the result is batch dims,
    then lhs's free dims, then rhs's. On global arrays JAX's ``_dot_general_sharding_rule``
    (``out_sharding=`` where contracting dims are sharded on both sides) and the planner.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> sl.lax.dot_general(np.ones((2, 3)), np.ones((3, 4)), (((1,), (0,)), ((), ()))).shape
        (2, 4)
    """
    (lc, rc), (lb, rb) = dimension_numbers
    ra, rb_ = ndim(lhs), ndim(rhs)
    lc, rc, lb, rb = ([int(i) % r for i in ax] for ax, r in ((lc, ra), (rc, rb_), (lb, ra), (rb, rb_)))
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise TypeError(f"[dot_general] dimension_numbers {dimension_numbers} pair {len(lc)} lhs with {len(rc)} rhs "
                        f"contracting and {len(lb)} with {len(rb)} batch dims; give as many on each side")
    lt = list(_LETTERS[:ra])
    rt = list(_LETTERS[ra:ra + rb_])
    for i, j in zip(lc + lb, rc + rb):
        rt[j] = lt[i]
    out = "".join(lt[i] for i in lb) + "".join(c for i, c in enumerate(lt) if i not in lc and i not in lb) + \
        "".join(c for j, c in enumerate(rt) if j not in rc and j not in rb)
    sub = f"{''.join(lt)},{''.join(rt)}->{out}"
    if _has_global((lhs, rhs)):
        return GLOBAL["contract"]("dot_general", sub, (lhs, rhs), out_sharding=out_sharding,
                                  preferred_element_type=preferred_element_type, jnp_order=False)
    return einsum(sub, lhs, rhs, preferred_element_type=preferred_element_type, out_sharding=out_sharding)


@_implements(np.einsum)
def einsum(subscripts, *operands, out=None, optimize="auto", precision=None, preferred_element_type=None,
           _dot_general=None, out_sharding=None):
    """``jnp.einsum``. On global ShardedArrays: JAX's sharding rule decides the output sharding
    (``out_sharding=`` where contracting dims are sharded on both sides) and the planner runs it
    with the collectives it needs, recorded in the ledger. On per-device values: local shapes;
    two-operand contractions run as one batched GEMM.

    Example:
        >>> import numpy as np, shardlab as sl, shardlab.numpy as jnp
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((2, 4), ("X", "Y"))
        >>> a = sl.device_put(np.ones((8, 4), np.float32), sl.NamedSharding(mesh, P("X", None)))
        >>> b = sl.device_put(np.ones((4, 8), np.float32), sl.NamedSharding(mesh, P(None, "Y")))
        >>> jnp.einsum("ij,jk->ik", a, b).sharding.spec
        P('X', 'Y')
    """
    if out is not None:
        raise TypeError("[einsum] out= is not supported: arrays are immutable, as in JAX")
    if _has_global(operands):
        return _global_contract("einsum", subscripts, operands, out_sharding, preferred_element_type)
    if not _is_local(*operands):
        arrays = [np.asarray(o) for o in operands]
        terms, out = parse(subscripts, [a.shape for a in arrays])
        res = einsum_arrays(terms, out, arrays)
        return _host_placed(_host_result(res, preferred_element_type, arrays), out_sharding, "einsum")
    mesh = mesh_of(operands)
    ops = [lift(o, mesh) for o in operands]
    terms, out = parse(subscripts, [o.shape for o in ops])
    return _contract(terms, out, ops, mesh, "einsum", preferred_element_type)


@_implements(np.vecdot)
def vecdot(x1, x2, /, *, axis=-1, precision=None, preferred_element_type=None):
    if not _is_local(x1, x2) and not _has_global((x1, x2)):
        return _on_mesh(_host_result(np.vecdot(x1, x2, axis=axis), preferred_element_type, (x1, x2)))
    return sum(multiply(x1, x2), axis=axis)


@_implements(np.matvec)
def matvec(x1, x2, /):
    if not _is_local(x1, x2) and not _has_global((x1, x2)):
        return _on_mesh(_host_result(np.matvec(x1, x2), None, (x1, x2)))
    return einsum("...ij,...j->...i", x1, x2)


@_implements(np.vecmat)
def vecmat(x1, x2, /):
    if not _is_local(x1, x2) and not _has_global((x1, x2)):
        return _on_mesh(_host_result(np.vecmat(x1, x2), None, (x1, x2)))
    return einsum("...i,...ij->...j", x1, x2)


@_implements(np.tensordot)
def tensordot(a, b, axes=2, *, precision=None, preferred_element_type=None, out_sharding=None):
    """``jnp.tensordot``; on global arrays JAX's dot_general sharding rule and the planner."""
    ra, rb = ndim(a), ndim(b)
    if isinstance(axes, (int, np.integer)):
        ax_a, ax_b = list(range(ra - axes, ra)), list(range(int(axes)))
    else:
        ax_a, ax_b = ([axes[0]] if np.ndim(axes[0]) == 0 else list(axes[0]),
                      [axes[1]] if np.ndim(axes[1]) == 0 else list(axes[1]))
    ax_a, ax_b = [a_ % ra for a_ in ax_a], [b_ % rb for b_ in ax_b]
    letters = "abcdefghijklmnopqrstuvwxyz"
    ta = list(letters[:ra])
    tb = list(letters[ra:ra + rb])
    for i, j in zip(ax_a, ax_b):
        tb[j] = ta[i]
    out = [c for i, c in enumerate(ta) if i not in ax_a] + [c for j, c in enumerate(tb) if j not in ax_b]
    return einsum(f"{''.join(ta)},{''.join(tb)}->{''.join(out)}", a, b, out_sharding=out_sharding,
                  preferred_element_type=preferred_element_type)


@_implements(np.kron)
def kron(a, b):
    if not _is_local(a, b):
        return np.kron(a, b)
    mesh = mesh_of((a, b))
    a, b = lift(a, mesh), lift(b, mesh)
    r = builtins.max(a.ndim, b.ndim)
    a, b = reshape(a, (1,) * (r - a.ndim) + a.shape), reshape(b, (1,) * (r - b.ndim) + b.shape)
    la, lb = "abcdefgh"[:r], "ijklmnop"[:r]
    out = einsum(f"{la},{lb}->{''.join(x + y for x, y in zip(la, lb))}", a, b)
    return reshape(out, tuple(p * q for p, q in zip(a.shape, b.shape)))


register_ufunc_call(np.matmul, matmul)   # np.matmul(a, b) on per-device values
