"""The training step: forward, ``shardlab.grad``, gradient accumulation over microbatches and
the optimizer, for any ``ModelConfig`` under any :class:`~shardlab.train.Strategy`.

``Trainer(cfg, strategy, mesh)`` places params, gradients and optimizer states as the strategy
says (so their live buffers are the per-device memory the ZeRO paper counts), and
``Trainer.step`` runs one step on real data or, with abstract arrays, shape-only (that is what
``train.estimate`` does).

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab import train
    >>> cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=32, max_seq_len=8)
    >>> mesh = sl.make_mesh((4,), ("data",))
    >>> t = train.Trainer(cfg, train.strategies.fsdp(), mesh, optimizer=train.SGD(lr=0.1))
    >>> state = t.init(transformer.init_params(cfg, seed=0))
    >>> tok = np.random.default_rng(0).integers(0, 32, (4, 8))
    >>> state, loss = t.step(state, tok, tok)
    >>> round(float(loss), 2)
    3.52
"""

from __future__ import annotations

import dataclasses

import numpy as np

import shardlab as sl
import shardlab.numpy as jnp
from shardlab import NamedSharding, P, lax
from shardlab.models import param_axes, remat_policy, transformer

from . import strategy as _strategy
from .blocks import Blocks
from .context import check_context, to_zigzag
from .optim import get_optimizer

__all__ = ["Trainer", "TrainState", "tree_map", "reference_grads", "reference_step"]

# precision -> (param and grad dtype, fp32 master copy)
_PRECISIONS = {"fp32": (np.float32, False), "mixed": (sl.dtypes.bfloat16, True),
               "bf16_params": (sl.dtypes.bfloat16, False)}


def _is_leaf(x) -> bool:
    return not isinstance(x, (dict, list))


def tree_map(fn, tree, *rest):
    """``fn`` over the leaves of nested dicts / lists (tuples are leaves: they name axes)."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [tree_map(fn, v, *(r[i] for r in rest)) for i, v in enumerate(tree)]
    return fn(tree, *rest)


def tree_leaves(tree) -> list:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in tree_leaves(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in tree_leaves(v)]
    return [tree]


@dataclasses.dataclass
class TrainState:
    """Params (compute dtype, strategy layout), the fp32 master copy (mixed precision), the
    optimizer states, the last accumulated gradients, and the step count."""

    params: dict
    master: dict | None
    opt_state: dict
    grads: dict | None = None
    step: int = 0


def _spec_with_lead(spec: P, lead) -> P:
    return P(lead, *tuple(spec))


class Trainer:
    """One training step of ``cfg`` under ``strategy`` on ``mesh``.

    Args:
        cfg: the model (``shardlab.models.ModelConfig``).
        strategy: a :class:`~shardlab.train.Strategy` or a built-in name ("fsdp", "tp", ...).
        mesh: a shardlab Mesh (real or abstract) with the strategy's axis names.
        optimizer: an ``AdamW`` / ``SGD`` instance or "adamw" / "sgd".
        precision: "fp32" (params, grads and states fp32), "mixed" (bf16 params and grads,
            fp32 master weights and moments) or "bf16_params" (bf16 params and grads, fp32
            moments, no master copy: the book's 10 bytes per parameter with Adam; under ZeRO-1/2
            the sharded copy the optimizer updates is bf16).
        remat: the recompute policy of each layer (``shardlab.models.remat``): None / "none",
            "full" (keep only the layer input), "selective" (recompute the attention core),
            "dots" (keep the matmul outputs), "ffw_outputs" (keep the MLP matmul outputs) or a
            set of checkpoint names (``shardlab.models.CHECKPOINT_NAMES``).
        microbatches: gradient accumulation steps per optimizer step.
    """

    def __init__(self, cfg, strategy, mesh, *, optimizer="adamw", precision: str = "fp32", remat=None,
                 microbatches: int = 1):
        self.cfg, self.mesh = cfg, mesh
        self.s = _strategy.get(strategy)
        if precision not in _PRECISIONS:
            raise ValueError(f"[Trainer] precision {precision!r} is not one of {', '.join(map(repr, _PRECISIONS))}")
        self.policy = remat_policy(remat, "Trainer")
        if not isinstance(microbatches, int) or microbatches < 1:
            raise ValueError(f"[Trainer] microbatches {microbatches!r} must be an int >= 1")
        self.opt = get_optimizer(optimizer)
        self.precision, self.remat, self.microbatches = precision, remat, microbatches
        self.dtype, self.mixed = _PRECISIONS[precision]
        #: dtype of the copy of the params the optimizer updates (mixed: fp32 master; ZeRO-1/2: the shard)
        self.master_dtype = np.float32 if (self.mixed or precision == "fp32") else self.dtype
        self.X, self.Y = self.s.sizes(mesh)
        self.C = self.s.context_size(mesh)
        self.s.validate(cfg, mesh)
        self.axes = param_axes(cfg)
        self.blocks = Blocks(cfg, self.s, self.X, self.Y, dict(mesh.shape), remat=self.policy)
        self._data = self.s.data[0] if len(self.s.data) == 1 else tuple(self.s.data)

    # -- layouts ----------------------------------------------------------------------------
    def sharding(self, spec: P) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def param_spec(self, axes: tuple) -> P:
        """A param's PartitionSpec as stored (ZeRO's data axes where :meth:`Blocks.split` puts them)."""
        return self.s.param_spec(axes, self.blocks.split(axes))

    def state_spec(self, axes: tuple) -> P:
        """Its optimizer states' (and fp32 master copy's) PartitionSpec."""
        return self.s.state_spec(axes, self.blocks.split(axes))

    def grad_spec(self, axes: tuple) -> P:
        """Its accumulated gradient's PartitionSpec."""
        return self.s.grad_spec(axes, self.blocks.split(axes))

    def _param_specs(self):
        return tree_map(self.param_spec, self.axes)

    def _state_specs(self):
        return tree_map(self.state_spec, self.axes)

    def _use_specs(self):
        """What the blocks receive: the params, or under ZeRO-1/2 a per-device view [X, ...]."""
        if self.s.zero in (1, 2):
            return tree_map(lambda sp: _spec_with_lead(sp, self._data), self._param_specs())
        return self._param_specs()

    def init(self, params) -> TrainState:
        """Places ``params`` (numpy, from ``transformer.init_params``) as the strategy says."""
        put = lambda x, sp, dt: sl.device_put(np.asarray(x).astype(dt), self.sharding(sp))  # noqa: E731
        p = tree_map(lambda x, sp: put(x, sp, self.dtype), params, self._param_specs())
        needs_master = self.mixed or self.s.zero in (1, 2)
        master = tree_map(lambda x, sp: put(x, sp, self.master_dtype), params, self._state_specs()) if needs_master else None
        base = master if master is not None else p
        opt_state = {n: tree_map(lambda m: self._zeros_like(m), base) for n in self.opt.state_names}
        return TrainState(p, master, opt_state)

    def _zeros_like(self, x):
        f = sl.shard_map(lambda a: a.astype(np.float32) * np.float32(0), mesh=self.mesh,
                         in_specs=x.sharding.spec, out_specs=x.sharding.spec)
        return f(x)

    # -- forward ----------------------------------------------------------------------------
    def _smap(self, fn, in_specs, out_specs):
        return sl.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs)

    def loss(self, params, tokens, targets, total_tokens: int):
        """The mean cross-entropy over ``total_tokens`` of this (micro)batch's summed losses."""
        B, ax, act, specs = self.blocks, self.axes, self.s.activation_spec(), self._use_specs()
        bspec = self.s.batch_spec()
        with sl.named_scope("embed"):
            params, specs, tied = self._tied_view(params, specs)
            table = (lambda v: v[0]) if tied else (lambda v: v)  # noqa: E731
            if "pos_embed" in params:
                f = self._smap(lambda v, t, pos: B.embed(table(v), t, pos), (specs["embed"], bspec, specs["pos_embed"]),
                               act)
                x = f(params["embed"], tokens, params["pos_embed"])
            else:
                x = self._smap(lambda v, t: B.embed(table(v), t), (specs["embed"], bspec), act)(params["embed"], tokens)
        for i, (lp, la, ls) in enumerate(zip(params["layers"], ax["layers"], specs["layers"])):
            with sl.named_scope(f"layer{i}"):
                if B.recorded is not None and self.policy.checkpointed:  # the checkpoint keeps the layer input
                    B.recorded["input"] = B.recorded.get("input", 0) + x.nbytes_per_device
                x = self._layer(la, ls, act)(lp, x)
        with sl.named_scope("head"):
            head_key = "head" if "head" in params else "embed"
            f = self._smap(lambda fn, h, x, t: B.head_loss(fn, ax["final_norm"], table(h) if head_key == "embed" else h,
                                                           ax[head_key], x, t, total_tokens),
                           (specs["final_norm"], specs[head_key], act, bspec), P())
            return f(params["final_norm"], params[head_key], x, targets)

    def _layer(self, la, ls, act):
        B = self.blocks
        attn_keys, mlp_keys = ("attn_norm", "attn"), ("mlp_norm", "moe" if "moe" in la else "mlp")

        def layer(lp, x):
            with sl.named_scope("attn"):
                f = self._smap(lambda p, x: B.attention(p, {k: la[k] for k in attn_keys}, x),
                               ({k: ls[k] for k in attn_keys}, act), act)
                x = f({k: lp[k] for k in attn_keys}, x)
            with sl.named_scope("mlp"):
                f = self._smap(lambda p, x: B.mlp(p, {k: la[k] for k in mlp_keys}, x),
                               ({k: ls[k] for k in mlp_keys}, act), act)
                return f({k: lp[k] for k in mlp_keys}, x)

        if not self.policy.checkpointed:
            return layer
        return sl.checkpoint(layer, policy=self.blocks.keep if self.policy.saved else None)

    def _tied_view(self, params, specs):
        """A tied embedding under replicated data parallelism: one per-device view [X, V, D] of
        the table for both its uses (lookup and head), so the backward pass sums the two
        gradients on each device and all-reduces them once over the data axes (two blocks each
        taking the replicated table would all-reduce its gradient twice)."""
        if "head" in params or self.s.zero != 0 or not self.s.data:
            return params, specs, False
        spec = specs["embed"]
        view = self._smap(lambda a: jnp.expand_dims(lax.pcast(a, self._data, to="varying"), 0), spec,
                          _spec_with_lead(spec, self._data))(params["embed"])
        return dict(params, embed=view), dict(specs, embed=_spec_with_lead(spec, self._data)), True

    # -- gradients ------------------------------------------------------------------------
    def _views(self, params):
        """ZeRO-1/2: each device's own copy of the replicated params as a [X, ...] array, so
        the backward pass leaves per-device gradients for an explicit reduce-scatter."""
        def view(w, sp):
            f = self._smap(lambda a: jnp.expand_dims(lax.pcast(a, self._data, to="varying"), 0), sp, _spec_with_lead(sp, self._data))
            return f(w)
        return tree_map(view, params, self._param_specs())

    def _reduce_scatter(self, g_view, axes):
        """Per-device gradients -> their sum, split over the data axes as the optimizer state
        is (a reduce-scatter on each dimension the split names; a psum over data axes that
        shard nothing of this param)."""
        sp, split = self.param_spec(axes), self.blocks.split(axes)
        rest = tuple(a for a in self.s.data if all(a not in d for _, d in split))

        def body(g):
            g = g[0]
            for dim, data_axes in split:
                g = lax.psum_scatter(g, _one(data_axes), scatter_dimension=dim, tiled=True)
            return lax.psum(g, _one(rest)) if rest else g

        return self._smap(body, _spec_with_lead(sp, self._data), self.state_spec(axes))(g_view)

    def _add(self, a, b):
        sp = a.sharding.spec
        return self._smap(lambda x, y: x + y, (sp, sp), sp)(a, b)

    def grads(self, params, microbatches):
        """(loss, accumulated grads in the strategy's gradient layout) over ``microbatches``,
        a list of (tokens, targets) global arrays."""
        total = sum(int(np.prod(t.shape)) for t, _ in microbatches)
        vg = sl.value_and_grad(self.loss)
        loss, acc = 0.0, None
        for tokens, targets in microbatches:
            if self.s.zero in (1, 2):
                value, g = vg(self._views(params), tokens, targets, total)
                if self.s.zero == 2:
                    with sl.named_scope("grad_sync"), sl.ledger_phase("backward"):
                        g = tree_map(self._reduce_scatter, g, self.axes)
            else:
                value, g = vg(params, tokens, targets, total)
            if acc is None:
                acc = g
            else:
                with sl.ledger_phase("backward"):
                    acc = tree_map(self._add, acc, g)
            loss = loss + float(np.asarray(value)) if not _abstract(value) else value
        buffer = acc  # ZeRO-1 keeps whole per-device gradients until the step's reduce-scatter
        if self.s.zero == 1:
            with sl.named_scope("grad_sync"), sl.ledger_phase("backward"):
                acc = tree_map(self._reduce_scatter, acc, self.axes)
        self._grad_buffer = buffer
        return loss, acc

    # -- the step ---------------------------------------------------------------------------
    def _update(self, state: TrainState, grads, step: int):
        opt, names = self.opt, self.opt.state_names
        z12 = self.s.zero in (1, 2)

        def leaf(axes, p, g, master, *st):
            sspec, pspec = self.state_spec(axes), self.param_spec(axes)
            m_spec = sspec if master is not None else pspec
            gspec = sspec if z12 else self.grad_spec(axes)

            def body(g, w, *st):
                new_w, new_st = opt.update(w.astype(np.float32), g, dict(zip(names, st)), step)
                out_p = new_w.astype(self.dtype)
                new_w = new_w.astype(self.master_dtype)
                if z12:
                    for dim, data_axes in self.blocks.split(axes):
                        out_p = lax.all_gather(out_p, _one(data_axes), axis=dim, tiled=True)
                return (out_p, new_w, *(new_st[n] for n in names))

            f = self._smap(body, (gspec, m_spec, *(sspec if master is not None else pspec for _ in st)),
                           (pspec, m_spec, *(m_spec for _ in st)))
            return f(g, master if master is not None else p, *st)

        masters = state.master if state.master is not None else tree_map(lambda _: None, self.axes)
        with sl.named_scope("optimizer"), sl.ledger_phase("optimizer"):
            outs = tree_map(lambda a, p, g, m, *st: _Out(leaf(a, p, g, m, *st)), self.axes, state.params, grads,
                            masters, *(state.opt_state[n] for n in names))
        params = tree_map(lambda o: o.v[0], outs)
        master = tree_map(lambda o: o.v[1], outs) if state.master is not None else None
        opt_state = {n: tree_map(lambda o, j=j: o.v[2 + j], outs) for j, n in enumerate(names)}
        return TrainState(params, master, opt_state, getattr(self, "_grad_buffer", grads), step)

    def place_batch(self, tokens, targets):
        """Splits a [B, T] batch into this trainer's microbatches, placed on the mesh."""
        B = tokens.shape[0]
        M = self.microbatches
        if B % M:
            raise ValueError(f"[Trainer.step] batch {B} is not divisible by microbatches {M}")
        mb = B // M
        if mb % self.X:
            raise ValueError(f"[{self.s.name}] microbatch {mb} (batch {B} / {M}) is not divisible by the data "
                             f"axes {self.s.data} of size {self.X}; use a batch that is a multiple of {M * self.X}")
        if self.s.sequence_parallel and tokens.shape[1] % self.Y:
            raise ValueError(f"[{self.s.name}] sequence length {tokens.shape[1]} is not divisible by the model "
                             f"axis {self.s.model!r} of size {self.Y} (sequence parallelism splits it)")
        sh = self.sharding(self.s.batch_spec())
        if self.s.context is not None:
            check_context(tokens.shape[1], self.C, self.s.context, self.s.name)
            if not _abstract(tokens):  # zig-zag chunks; the loss is a sum, so targets move the same way
                tokens, targets = to_zigzag(tokens, self.C), to_zigzag(targets, self.C)
        if _abstract(tokens):
            return [(tokens, targets)] * M
        return [(sl.device_put(np.asarray(tokens[j * mb:(j + 1) * mb]).astype(np.int32), sh),
                 sl.device_put(np.asarray(targets[j * mb:(j + 1) * mb]).astype(np.int32), sh)) for j in range(M)]

    def step(self, state: TrainState, tokens, targets):
        """One optimizer step on the batch ``tokens`` → ``targets`` ([B, T] ids); returns
        (new state, mean loss)."""
        loss, grads = self.grads(state.params, self.place_batch(tokens, targets))
        return self._update(state, grads, state.step + 1), loss

    # -- memory -----------------------------------------------------------------------------
    def memory(self, state: TrainState) -> dict:
        """Bytes per device of the live buffers: params, grads (accumulated), optimizer
        (master copy + states)."""
        def nbytes(tree):
            return int(sum(x.nbytes_per_device for x in tree_leaves(tree))) if tree is not None else 0
        opt = nbytes(state.master) + sum(nbytes(t) for t in state.opt_state.values())
        return {"params": nbytes(state.params), "grads": nbytes(state.grads), "optimizer": opt}

    def saved_activations(self, params, tokens) -> dict:
        """Bytes per device that the layers' checkpoints keep for the backward pass of one
        microbatch, by checkpoint name (``"input"``: the layer inputs every checkpoint keeps),
        read from the arrays of a forward pass under ``shardlab.vjp`` (the backward is not run).
        ``models.training_memory(...).parts["activations"]`` is their sum.

        Example:
            >>> import numpy as np, shardlab as sl
            >>> from shardlab import train
            >>> from shardlab.models import ModelConfig, transformer
            >>> cfg = ModelConfig(num_layers=2, d_model=32, ffw_dim=64, num_heads=4, vocab_size=32, max_seq_len=8)
            >>> t = train.Trainer(cfg, "dp", sl.make_mesh((2,), ("data",)), remat="ffw_outputs")
            >>> t.saved_activations(t.init(transformer.init_params(cfg)).params, np.zeros((2, 8), np.int32))
            {'input': 2048, 'mlp_hidden': 8192, 'mlp_down': 2048}
        """
        if not self.policy.checkpointed:
            raise ValueError("[Trainer.saved_activations] remat 'none' keeps every intermediate on the tape (no "
                             "checkpoint); measure a checkpointed policy ('full', 'selective', 'dots', ...)")
        tok, tgt = self.place_batch(tokens, tokens)[0]
        total = int(np.prod(tok.shape))
        use = self._views(params) if self.s.zero in (1, 2) else params
        self.blocks.recorded = {}
        try:
            sl.vjp(lambda p: self.loss(p, tok, tgt, total), use)
            return dict(self.blocks.recorded)
        finally:
            self.blocks.recorded = None


class _Out:
    """A tuple of results held as one leaf while mapping over a params tree."""

    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v


def _one(axes: tuple):
    """A mesh axis name, or a tuple of them."""
    return axes[0] if len(axes) == 1 else tuple(axes)


def _abstract(x) -> bool:
    return bool(getattr(x, "is_abstract", False))


def reference_grads(cfg, params, tokens, targets, microbatches: int = 1, *, causal: bool = True):
    """``(loss, grads)`` of the model library's own ``transformer.loss`` (fp32) on one device with
    plain numpy arrays, averaged over ``microbatches`` equal slices of the batch: the ground truth
    every strategy (:func:`reference_step`) and every pipeline schedule
    (``pipeline.reference_step``) is compared with."""
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    mb = tokens.shape[0] // microbatches
    loss, grads = 0.0, None
    for j in range(microbatches):
        t, y = tokens[j * mb:(j + 1) * mb], targets[j * mb:(j + 1) * mb]
        v, g = sl.value_and_grad(lambda p: transformer.loss(p, t, y, cfg, causal=causal))(params)
        loss += float(np.asarray(v)) / microbatches
        g = tree_map(lambda a: np.asarray(a) / np.float32(microbatches), g)
        grads = g if grads is None else tree_map(np.add, grads, g)
    return loss, grads


def reference_step(cfg, params, tokens, targets, optimizer, step: int, state=None, microbatches: int = 1):
    """The same step on one device with plain numpy arrays: :func:`reference_grads` and the
    optimizer's update; the ground truth every strategy is compared with."""
    opt = get_optimizer(optimizer)
    state = state if state is not None else {n: tree_map(lambda x: np.zeros_like(x, np.float32), params)
                                             for n in opt.state_names}
    _, grads = reference_grads(cfg, params, tokens, targets, microbatches)
    names = opt.state_names
    outs = tree_map(lambda p, g, *st: opt.update(p, g, dict(zip(names, st)), step), params, grads,
                    *(state[n] for n in names))
    is_out = lambda o: isinstance(o, tuple)  # noqa: E731
    new_p = _map_outs(lambda o: np.asarray(o[0], np.float32), outs, is_out)
    new_s = {n: _map_outs(lambda o, n=n: np.asarray(o[1][n]), outs, is_out) for n in names}
    return new_p, new_s


def _map_outs(fn, tree, is_out):
    if isinstance(tree, dict):
        return {k: _map_outs(fn, v, is_out) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_map_outs(fn, v, is_out) for v in tree]
    return fn(tree)
