"""Hierarchical gradient reduction over a DCN axis between slices (book part 5, "Scaling
Across Pods"; the multi-slice recipe of MaxText and of the survey's hierarchical all-reduce).

Inside a slice (or a GPU node) the chips talk over the fast ICI / NVLink; between slices only
over the data-centre network (DCN, 6.25 GB/s per v5p chip, ~15x slower than one ICI link).
A flat all-reduce of the gradients over ``("dcn", "data")`` moves ``2·(N−1)/N·G`` bytes per chip
through collectives that include the DCN. The hierarchical recipe instead

1. reduce-scatters the gradients inside the slice over the ICI axes (each chip keeps 1/X),
2. all-reduces only that 1/X shard across the slices over the DCN: ``2·(S−1)/S·G/X`` bytes,
3. all-gathers inside the slice over ICI.

:func:`hierarchical` is that strategy. With ``zero=1`` (the default) step 3 gathers the
*updated* parameters instead of the gradients (the optimizer updates its 1/X shard, as ZeRO-1
inside the slice): the same bytes when gradients and parameters share a dtype, and the optimizer
states are split X ways instead of replicated. ``zero=2`` reduce-scatters per microbatch;
``zero=3`` is the book's "FSDP inside the slice, pure data parallelism across": the weights are
gathered over the slice's axes only and the shard's gradient is all-reduced over the DCN.
In every variant the DCN axis shards nothing, so the DCN carries 1/X of the gradient bytes.

Example:
    >>> from shardlab import train
    >>> s = train.hierarchical()
    >>> s.data, s.dcn, s.slice_axes
    (('dcn', 'data'), 'dcn', ('data',))
    >>> s.zero_split(("embed", "mlp"), (1024, 4096), {"dcn": 2, "data": 4})
    ((0, ('data',)),)
    >>> round(dcn_bytes_closed_form(1e9, slice_size=4, slices=2) / 1e9, 3)   # 2·(S−1)/S·G/X
    0.25
"""

from __future__ import annotations

import dataclasses

import shardlab.hardware as hw_mod
from shardlab.cost import formulas

from .strategy import Strategy

__all__ = ["Hierarchical", "hierarchical", "dcn_bytes_closed_form", "flat_dcn_bytes_closed_form", "CROSS_SLICE_LINKS"]

#: physical links that join slices (TPU data-centre network) or nodes (GPU InfiniBand)
CROSS_SLICE_LINKS = ("dcn", "ib")


@dataclasses.dataclass(frozen=True)
class Hierarchical(Strategy):
    """A data-parallel strategy whose data axes include one cross-slice axis ``dcn``.

    ZeRO shards over the slice's axes only (``slice_axes``); the ``dcn`` axis stays whole, so
    each gradient is reduce-scattered over ICI, its shard all-reduced over the DCN, and the
    result (ZeRO-1/2: the updated parameters; ZeRO-3: nothing, the weight is gathered when
    used) all-gathered over ICI.

    Attributes:
        dcn: the mesh axis between slices; must be one of ``data`` and be laid on the DCN (or
            InfiniBand) by the mesh's hardware.
    """

    dcn: str = "dcn"

    def __post_init__(self):
        super().__post_init__()
        op = f"[{self.name}]"
        if self.dcn not in self.data:
            raise ValueError(f"{op} the cross-slice axis {self.dcn!r} is not one of the data axes {self.data}; "
                             f"put it first, e.g. data=({self.dcn!r}, 'data')")
        if not self.slice_axes:
            raise ValueError(f"{op} data axes {self.data} have no axis inside the slice to reduce-scatter over; "
                             f"add one, e.g. data=({self.dcn!r}, 'data')")
        if self.zero == 0:
            raise ValueError(f"{op} zero=0 all-reduces every gradient over all data axes at once (flat); the "
                             f"hierarchical reduction needs zero=1, 2 or 3")

    @property
    def slice_axes(self) -> tuple:
        """The data axes inside a slice (over ICI / NVLink)."""
        return tuple(a for a in self.data if a != self.dcn)

    def _inner(self) -> Strategy:
        return Strategy(self.name, data=self.slice_axes, model=self.model, zero=self.zero,
                        sequence_parallel=self.sequence_parallel, vocab_parallel=self.vocab_parallel)

    def zero_split(self, axes: tuple, shape: tuple, mesh_shape) -> tuple:
        """As :meth:`Strategy.zero_split` over the slice's axes only: the DCN axis shards nothing."""
        return self._inner().zero_split(axes, shape, mesh_shape)

    def rules(self) -> dict:
        """The strategy as a table; params, grads and states shard over the slice axes only."""
        r = self._inner().rules()
        r["activations"] = dict(r["activations"], batch=self.data)
        return r

    def collectives(self) -> list:
        """The collectives it prescribes, as (where, op, mesh axes) rows: ICI reduce-scatter, DCN
        all-reduce of the shard, ICI gather (plus the model axis's, if any)."""
        d, x = (self.dcn,), self.slice_axes
        if self.zero == 3:
            rows = [("forward: each weight", "all_gather", x), ("backward: each weight (re-gather)", "all_gather", x),
                    ("backward: each weight grad", "psum_scatter", x),
                    ("backward: the grad's 1/X shard across slices", "psum", d)]
        else:
            rows = [("after backward: grads", "psum_scatter", x),
                    ("after backward: the 1/X shard across slices", "psum", d),
                    ("after update: params", "all_gather", x)]
        return rows + [r for r in Strategy.collectives(self._inner()) if r[2] != x]

    def physical_axes(self) -> dict:
        """The physical link map an abstract mesh for this strategy needs: ``{dcn: "dcn"}``."""
        return {self.dcn: "dcn"}

    def sizes(self, mesh) -> tuple[int, int]:
        """(data size X over all data axes, model size Y); checks that the mesh's hardware lays
        ``dcn`` over a cross-slice link (a TPU mesh of two axes otherwise puts it on torus x)."""
        X, Y = super().sizes(mesh)
        hw = getattr(mesh, "hardware", None)
        if hw is not None:
            shape = dict(mesh.shape)
            link = hw_mod.resolve_physical_axes(hw, tuple(shape), shape, getattr(mesh, "physical_axes", None))
            if link[self.dcn] not in CROSS_SLICE_LINKS:
                raise ValueError(f"[{self.name}] mesh axis {self.dcn!r} is laid over {link[self.dcn]!r} of "
                                 f"{hw_mod.get(hw).name}, not between slices; make the mesh with "
                                 f"physical_axes={{{self.dcn!r}: 'dcn'}} (or 'ib' on GPUs)")
        return X, Y


def hierarchical(dcn="dcn", data="data", zero: int = 1, model=None, sequence_parallel: bool = False) -> Hierarchical:
    """Hierarchical data parallelism: reduce-scatter over ``data`` (ICI), all-reduce the shard
    over ``dcn``, all-gather over ``data``.

    Args:
        dcn: the cross-slice mesh axis.
        data: the data axis (or axes) inside a slice.
        zero: 1 (optimizer states split inside the slice; default), 2 (also gradients, scattered
            per microbatch) or 3 (FSDP inside the slice, pure DP across).
        model: an optional tensor-parallel axis inside the slice.
        sequence_parallel: with ``model``, split the residual stream along the sequence.
    """
    inner = (data,) if isinstance(data, str) else tuple(data)
    return Hierarchical("hierarchical", data=(dcn,) + inner, model=model, zero=zero,
                        sequence_parallel=sequence_parallel, dcn=dcn)


def dcn_bytes_closed_form(grad_bytes: float, slice_size: int, slices: int) -> float:
    """Bytes one chip sends over the DCN per step with the hierarchical reduction:
    ``2·(S−1)/S · G/X`` (a ring all-reduce of the 1/X shard over S slices)."""
    return formulas.collective_bytes("psum", slices, grad_bytes / slice_size)[2]


def flat_dcn_bytes_closed_form(grad_bytes: float, slice_size: int, slices: int) -> float:
    """Bytes one chip sends in the flat all-reduce over all ``N = X·S`` chips: ``2·(N−1)/N · G``
    (every byte of it in a collective that crosses the DCN)."""
    return formulas.collective_bytes("psum", slice_size * slices, grad_bytes)[2]
