"""Tensor parallelism inside a pipeline stage: Megatron's f / g over a ``model`` mesh axis.

A :class:`TensorParallel` turns the pieces of :mod:`.stages` into per-device code for a model
axis of size ``Y``, reusing the training library's rules rather than a second copy of them:

- the weights' layout is ``shardlab.train.strategies.tp(model)``'s ``param_spec`` of each
  param's logical axes (``shardlab.models.param_axes``): Q/K/V and W_in / W_gate / W_up split
  over the heads / F columns, W_O and W_down over their rows, the embedding and the head over
  the vocabulary, norms (and output biases) replicated;
- attention and the MLP run the model library's own ``attention`` / ``mlp`` on the device's
  heads / slice of F (``shardlab.train.blocks.local_config``), then ``psum`` the partial output
  over ``model`` (Megatron's g). The input enters the piece's ``shard_map`` replicated over
  ``model`` and its cotangent comes back varying, so the backward psums it at the piece's
  boundary (Megatron's f) -- inside the input-gradient step of a zero-bubble schedule;
- the embedding and the final norm + head + loss are ``Blocks.embed`` / ``Blocks.head_loss``
  (vocab-parallel: the lookup psums B·T·D, the cross-entropy three B·T vectors).

Divisibility (heads, kv heads, F, vocabulary by ``Y``) is checked by the strategy's own
``validate`` and reported naming the pipeline op.

:class:`FullyShardedData` adds ZeRO-3 / FSDP over the data axes: each param is stored split over
them where ``strategies.fsdp`` / ``fsdp_tp``'s ``zero_split`` puts them (model axis major, data
minor), a piece all-gathers its weights over the data axes when it runs (``Blocks.use``), and the
transpose of that gather reduce-scatters their gradients in the backward: no gradient all-reduce
at the end of the step.

Example:
    >>> from shardlab.models import ModelConfig
    >>> from shardlab.train.pipeline.tensor import TensorParallel
    >>> cfg = ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2, vocab_size=50)
    >>> tp = TensorParallel(cfg, "model", 2)
    >>> tp.spec(("embed", "heads")), tp.spec(("heads", "embed")), tp.spec(("embed",))
    (P(None, 'model'), P('model', None), P(None,))
    >>> TensorParallel(cfg.replace(vocab_size=51), "model", 2)
    Traceback (most recent call last):
    ...
    ValueError: [pipeline.execute] vocab_size 51 is not divisible by the model axis 'model' of size 2; use a model axis that divides it
"""

from __future__ import annotations

from shardlab import lax
from shardlab.models import ModelConfig, param_axes
from shardlab.models.layers import attention, mlp

from .. import strategy as _strategy
from ..blocks import Blocks, local_config

__all__ = ["TensorParallel", "FullyShardedData", "piece_axes"]

_OP = "pipeline.execute"


class _Shape:
    """The two numbers ``Strategy.validate`` reads from a mesh."""

    def __init__(self, axis: str, size: int):
        self.shape = {axis: size}


class TensorParallel:
    """Per-device stage code for a ``size``-way model axis named ``axis``.

    Raises:
        ValueError: a dimension the model axis must split (num_heads, num_kv_heads, ffw_dim,
            vocab_size) that it does not divide, naming both.
        NotImplementedError: mixture-of-experts layers.
    """

    def __init__(self, cfg: ModelConfig, axis: str, size: int):
        self.cfg, self.axis, self.size = cfg, axis, size
        self.strategy = _strategy.tp(model=axis)
        if cfg.is_moe:
            raise NotImplementedError(f"[{_OP}] tensor parallelism over {axis!r} inside a pipeline stage does not "
                                      f"support mixture-of-experts layers; use a mesh without the {axis!r} axis")
        try:
            self.strategy.validate(cfg, _Shape(axis, size))
        except ValueError as e:
            msg = str(e).split("] ", 1)[1]
            raise ValueError(f"[{_OP}] {msg}") from None
        self.lcfg = local_config(cfg, size)
        self.blocks = Blocks(cfg, self.strategy, 1, size, {axis: size})
        self.axes = param_axes(cfg)

    def spec(self, logical: tuple):
        """The PartitionSpec over the model axis of a param with these logical axes."""
        return self.strategy.param_spec(tuple(logical))

    # -- the per-device pieces ------------------------------------------------------------------
    def embed(self, p: dict, ids):
        """Vocab-parallel lookup (psum of the partial rows over the model axis), + positions."""
        return self.blocks.embed(p["embed"], ids, p.get("pos_embed"))

    def _g(self, fn, p: dict, bias: str, h):
        """Megatron's g: the partial output of the local heads / F slice summed over the model
        axis; the (replicated) output bias added once, after the sum."""
        y = lax.psum(fn({k: v for k, v in p.items() if k != bias}, h), self.axis)
        return y + p[bias] if bias in p else y

    def attention(self, p: dict, h, causal: bool = True):
        """Attention of the device's heads on the (replicated) normed input ``h``."""
        return self._g(lambda q, x: attention(q, x, self.lcfg, causal=causal), p, "bo", h)

    def mlp(self, p: dict, h):
        """The MLP on the device's slice of F."""
        return self._g(lambda q, x: mlp(q, x, self.lcfg), p, "b_down", h)

    def head_loss(self, p: dict, x, targets):
        """Final norm, head and the microbatch shard's mean cross-entropy, vocab-parallel."""
        key = "head" if "head" in p else "embed"
        b, t = x.shape[0], x.shape[1]
        return self.blocks.head_loss(p["final_norm"], self.axes["final_norm"], p[key], self.axes[key], x, targets,
                                     b * t)


def piece_axes(axes: dict, where: tuple, keys) -> dict:
    """The logical axes of a piece's params from ``param_axes(cfg)`` (``where`` and keys as in
    :class:`.stages.Piece`)."""
    src = axes if where == () else axes["layers"][where[1]]
    return {k: src[k] for k in keys}


class FullyShardedData:
    """ZeRO-3 / FSDP over ``data`` axes (sizes in ``mesh_shape``), with an optional model axis.

    Raises:
        ValueError: no data axis, or a weight no data axis can split (the strategy's message,
            naming the pipeline op).

    Example:
        >>> from shardlab.models import ModelConfig
        >>> from shardlab.train.pipeline.tensor import FullyShardedData
        >>> cfg = ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=2, vocab_size=50)
        >>> fs = FullyShardedData(cfg, ("data",), None, {"data": 2, "model": 2})
        >>> fs.spec(("embed", "heads")), fs.spec(("embed",))
        (P('data', None), P('data',))
    """

    def __init__(self, cfg: ModelConfig, data: tuple, model: str | None, mesh_shape: dict):
        if not data:
            raise ValueError(f"[{_OP}] fsdp=True shards the weights over the data axes, but the mesh has none "
                             f"besides the pipeline{' and model' if model else ''} axes; add a data axis or "
                             f"pass fsdp=False")
        self.cfg, self.data, self.model = cfg, tuple(data), model
        self.mesh_shape = dict(mesh_shape)
        self.strategy = _strategy.Strategy("fsdp_tp" if model else "fsdp", data=self.data, model=model, zero=3)
        try:
            self.strategy.validate(cfg, _Mesh(self.mesh_shape))
        except ValueError as e:
            msg = str(e).split("] ", 1)[1]
            raise ValueError(f"[{_OP}] {msg}") from None
        X, Y = self.strategy.sizes(_Mesh(self.mesh_shape))
        self.blocks = Blocks(cfg, self.strategy, X, Y, self.mesh_shape)
        self.axes = param_axes(cfg)

    def spec(self, logical: tuple):
        """The PartitionSpec of a param with these logical axes, stored: model axis and data axes."""
        return self.strategy.param_spec(tuple(logical), self.blocks.split(tuple(logical)))

    def gather(self, w, axes):
        """Inside shard_map: every leaf of the weights ``w`` (logical ``axes``, same tree)
        all-gathered over the data axes: the device's model-axis shard of each whole weight."""
        if isinstance(w, dict):
            return {k: self.gather(v, axes[k]) for k, v in w.items()}
        return self.blocks.use(w, tuple(axes))


class _Mesh:
    def __init__(self, shape: dict):
        self.shape = shape
