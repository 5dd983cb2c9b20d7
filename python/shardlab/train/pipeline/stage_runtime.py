"""One virtual pipeline stage at run time: forward, backward, input-gradient and weight-gradient
steps of one microbatch, as ``torch.distributed.pipelining``'s ``PipelineStage`` splits them.

A :class:`StageRuntime` owns what one virtual stage holds between the actions of a schedule:

- its pieces (:func:`~shardlab.train.pipeline.stages.pieces`), each run in
  :func:`shardlab.shard_map` over its device's slice of the mesh (the pipeline axis cut to that
  device, every other axis kept: data parallelism, and tensor parallelism on a model axis);
- per microbatch, the ``shardlab.vjp`` function of each piece from its forward (the microbatch's
  activations), held until that microbatch's backward;
- per microbatch, between a split backward's input step and its weight step, each piece's output
  cotangent;
- per piece, the weight gradient summed over the microbatches (each data replica's own).

The schedule's loop (:func:`~shardlab.train.pipeline.execute`) moves values between stages and
calls these methods; a stage knows nothing of the schedule.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab.train.pipeline import stages
    >>> from shardlab.train.pipeline.stage_runtime import StageRuntime
    >>> cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, num_kv_heads=2, vocab_size=20)
    >>> params = transformer.init_params(cfg, seed=0)
    >>> tok = np.random.default_rng(0).integers(0, 20, (2, 4)); tgt = np.roll(tok, -1, axis=1)
    >>> pcs = stages.pieces(params, cfg, range(1), first=True, last=True)
    >>> st = StageRuntime(0, pcs, sl.make_mesh((1,), ("stage",)), last=True)
    >>> losses = st.forward(0, tok, tgt)
    >>> st.backward(0, np.ones((1,), np.float32)) is None, st.holds(0), st.complete
    (True, False, True)
    >>> bool(np.isclose(float(losses[0]), float(transformer.loss(params, tok, tgt, cfg)), atol=1e-6))
    True
"""

from __future__ import annotations

import numpy as np

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import P

from . import stages as _stages
from ..step import tree_map
from .tensor import piece_axes

__all__ = ["StageRuntime"]


class StageRuntime:
    """Virtual stage ``index``: its pieces compiled for its device's submesh, and its state.

    Args:
        index: the virtual stage.
        pieces: its pieces, in order.
        submesh: its device's slice of the mesh.
        data_axes: the mesh axes a microbatch is split over (data parallelism).
        replicas: the data-parallel replicas (the product of the data axes' sizes).
        last: the last virtual stage (its last piece returns the loss: one per replica).
        tp: the :class:`~shardlab.train.pipeline.tensor.TensorParallel` of a model axis, or None.
        fsdp: the :class:`~shardlab.train.pipeline.tensor.FullyShardedData` of ZeRO-3, or None.
        axes: the model's logical param axes (``models.param_axes``) when tp or fsdp is given.

    Attributes:
        weights: per piece, what it runs with: the params repeated once per replica
            (``[replicas, ...]``), or with fsdp the params themselves (stored split by ``weight_specs``).
        weight_specs: per piece, the PartitionSpec tree of its weights on the submesh.
        grads: per piece, the weight gradient summed over microbatches (None before any).
    """

    def __init__(self, index: int, pieces, submesh, *, data_axes: tuple = (), replicas: int = 1, last: bool,
                 tp=None, fsdp=None, axes=None):
        self.index, self.pieces, self.submesh = index, list(pieces), submesh
        self._fsdp, self._tp, self._axes = fsdp, tp, axes
        data_spec = P(data_axes) if data_axes else P()
        dp_entry = (data_axes[0] if len(data_axes) == 1 else data_axes) if data_axes else None
        self.weights = [q.params if fsdp is not None else _stack(q.params, replicas) for q in self.pieces]
        self.weight_specs = [self._weight_spec(q, data_spec, dp_entry) for q in self.pieces]
        self._fns = [self._piece_fn(k, data_spec, last and k == len(self.pieces) - 1)
                     for k in range(len(self.pieces))]
        self._vjps: dict = {}       # microbatch -> each piece's vjp function (its activations)
        self._deferred: dict = {}   # microbatch -> (vjp functions, their output cotangents), between I and W
        self.grads: list = [None] * len(self.pieces)

    def _weight_spec(self, q, data_spec, dp_entry):
        """The replicas over the data axes, each param's own split over the model axis
        (``strategies.tp``'s param spec of its logical axes); fsdp's split under ZeRO-3."""
        if self._fsdp is not None:
            return tree_map(self._fsdp.spec, piece_axes(self._axes, q.where, q.params))
        if self._tp is None:
            return data_spec
        tp = self._tp
        return tree_map(lambda ax: P(dp_entry, *tp.spec(ax)), piece_axes(self._axes, q.where, q.params))

    def _piece_fn(self, k: int, data_spec, returns_loss: bool):
        q, fs = self.pieces[k], self._fsdp
        axes = piece_axes(self._axes, q.where, q.params) if fs is not None else None

        def body(w, c, tgt):
            out = q.apply(fs.gather(w, axes) if fs is not None else _unstack(w), c, tgt)
            return jnp.reshape(out, (1,)) if returns_loss else out   # each replica's own loss

        return sl.shard_map(body, mesh=self.submesh, in_specs=(self.weight_specs[k], data_spec, data_spec),
                            out_specs=data_spec)

    def forward(self, mb: int, x, targets):
        """Runs the pieces on ``x`` (token ids on the first stage), one ``shardlab.vjp`` per piece
        kept until microbatch ``mb``'s backward; returns the output (the replicas' losses on the last)."""
        fns = []
        for k, q in enumerate(self.pieces):
            with sl.named_scope(q.name):
                if q.has_input:
                    x, f = sl.vjp(lambda w, c, fn=self._fns[k]: fn(w, c, targets), self.weights[k], x)
                else:
                    x, f = sl.vjp(lambda w, fn=self._fns[k], ids=x: fn(w, ids, targets), self.weights[k])
            fns.append(f)
        self._vjps[mb] = fns
        return x

    def backward(self, mb: int, ct):
        """The whole backward of microbatch ``mb`` from the output cotangent ``ct``: each piece's
        vjp gives its weight gradient (added to :attr:`grads`) and its input cotangent. Returns
        the stage's input cotangent (None on the first stage) and frees the microbatch."""
        fns = self._vjps.pop(mb)
        for k in range(len(fns) - 1, -1, -1):
            if not self.pieces[k].has_input:
                self._add_grad(k, fns[k](ct, argnums=0)[0])
                ct = None
            else:
                g, ct = fns[k](ct)
                self._add_grad(k, g)
        return ct

    def backward_input(self, mb: int, ct):
        """A zero-bubble input-gradient step: walks the pieces backwards with ``vjp_fn(ct,
        argnums=1)`` (the input cotangents only, none of the weight-gradient matmuls), keeping
        each piece's output cotangent for :meth:`backward_weight`. Returns the stage's input
        cotangent (None on the first stage)."""
        fns = self._vjps.pop(mb)
        cts = [None] * len(fns)
        for k in range(len(fns) - 1, -1, -1):
            cts[k] = ct
            ct = fns[k](ct, argnums=1)[1] if self.pieces[k].has_input else None
        self._deferred[mb] = (fns, cts)
        return ct

    def backward_weight(self, mb: int) -> None:
        """The weight-gradient step of microbatch ``mb``: ``vjp_fn(ct, argnums=0)`` of every piece
        on the cotangent its input step kept, added to :attr:`grads`; frees the microbatch."""
        fns, cts = self._deferred.pop(mb)
        for k, (f, ct) in enumerate(zip(fns, cts)):
            with sl.named_scope(self.pieces[k].name):
                self._add_grad(k, f(ct, argnums=0)[0])

    def holds(self, mb: int) -> bool:
        """Whether microbatch ``mb``'s activations or deferred cotangents are still held."""
        return mb in self._vjps or mb in self._deferred

    @property
    def complete(self) -> bool:
        """Whether every piece has a weight gradient (a schedule ran at least one backward)."""
        return all(g is not None for g in self.grads)

    def _add_grad(self, k: int, g) -> None:
        self.grads[k] = g if self.grads[k] is None else _stages.add_trees(self.grads[k], g)


def _stack(tree, dp: int):
    """Every leaf repeated along a new leading axis of size dp: each data-parallel replica's copy
    of the weights (so each computes its own weight gradient; they are summed once per step)."""
    if isinstance(tree, dict):
        return {k: _stack(v, dp) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_stack(v, dp) for v in tree)
    a = np.asarray(tree)
    return np.broadcast_to(a[None], (dp,) + a.shape)


def _unstack(tree):
    """Inside shard_map: the local copy ``[1, ...]`` of stacked weights as ``[...]``."""
    if isinstance(tree, dict):
        return {k: _unstack(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_unstack(v) for v in tree)
    return jnp.reshape(tree, tuple(tree.shape[1:]))
