"""The model library's transformer, block by block, as per-device code for a strategy.

Each block (embedding, attention, MLP, head + loss) runs inside its own ``shard_map`` on the
local shards its strategy gives it; between blocks the residual stream is a global array laid
out by ``Strategy.activation_spec``. So every collective lands in the ledger under the block's
named scope (``layer3/mlp``), in the backward pass too, and a replicated weight's gradient
all-reduce happens where the weight enters its block.

Where the collectives come from:

* FSDP / ZeRO-3: each weight is all-gathered over the data axes inside ``checkpoint`` (policy
  ``dots_saveable``; the layer's own checkpoint when a recompute policy wraps the layer), so the
  gathered copy is not kept: the backward pass gathers it again (phase ``recompute``) and the
  transpose of the gather reduce-scatters its gradient. The embedding table is not gathered
  again: the lookup's gradient (a scatter-add of rows) does not read it.
* Recompute policies (``shardlab.models.remat``): the layer names its intermediates
  (``attn_norm``, ``qkv``, ``attn_out``, ...); :meth:`Blocks.keep` is the layer checkpoint's
  policy: it keeps the matmul (or attention) that produces a kept name, so that matmul is not
  recomputed, and the ``checkpoint_name`` values of kept norms and activations.
* Megatron f / g: a block's input is the same on every device of the model axis and meets
  weights split over it (f: identity forward; its backward all-reduce is the psum of the
  partial gradients at the block's boundary); the block's output partial sums are psum-ed (g).
* Sequence parallelism: all_gather of the sequence before the first matmul, psum_scatter after
  the last (their transposes in the backward pass).
* Vocab-parallel embedding and cross-entropy (see :func:`head_loss`).
* Context parallelism: the sequence is split over the context axis in zig-zag order; the
  attention block runs ``shardlab.train.context.ring_attention`` (K/V ppermutes) with rotary
  tables / learned positions at each token's global position; the loss sums over the axis.

Example:
    >>> from shardlab.models import ModelConfig
    >>> from shardlab.train import blocks, strategies
    >>> cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=16)
    >>> blocks.local_config(cfg, 2).num_heads
    2
"""

from __future__ import annotations

import numpy as np

import shardlab as sl
import shardlab.nn as snn
import shardlab.numpy as jnp
from shardlab import LocalArray, lax
from shardlab.ad_checkpoint import checkpoint_name
from shardlab.models import remat_policy
from shardlab.models.expert_parallel import expert_parallel_mlp
from shardlab.models.layers import apply_rotary, norm, rotary_tables
from shardlab.models.moe import routed_experts, shared_experts
from shardlab.models.ops import activation, gated_activation
from shardlab.models.transformer import embedding_lookup

from .context import ring_attention, rotary_zigzag, zigzag_positions
from .strategy import param_shape, param_sizes

__all__ = ["local_config", "Blocks"]


def local_config(cfg, tp: int):
    """``cfg`` with the heads one device of a ``tp``-way model axis holds."""
    if tp == 1:
        return cfg
    return cfg.replace(num_heads=cfg.num_heads // tp, num_kv_heads=cfg.num_kv_heads // tp, head_dim=cfg.head_dim)


def _stop(x):
    """A value the tape does not know: a constant for the gradient (the softmax max shift)."""
    return LocalArray(x.storage, x.mesh) if isinstance(x, LocalArray) else x


class Blocks:
    """Per-device block functions of ``cfg`` under ``strategy`` on a mesh with data size X and
    model size Y (from ``strategy.sizes(mesh)``)."""

    def __init__(self, cfg, strategy, X: int, Y: int, mesh_shape=None, remat=None):
        self.cfg, self.s, self.X, self.Y = cfg, strategy, X, Y
        self.policy = remat_policy(remat, "Trainer")
        self._tag = None          # the checkpoint name of the matmul / attention being bound
        self.recorded = None      # {name: bytes per device} while Trainer.saved_activations runs
        self._rotary: dict = {}   # (T) -> the rotary tables of the local heads
        self.lcfg = local_config(cfg, Y)
        self.data = strategy.data[0] if len(strategy.data) == 1 else tuple(strategy.data)
        self.model = strategy.model
        self.context = strategy.context
        self.mesh_shape = dict(mesh_shape) if mesh_shape is not None else {a: X for a in strategy.data[:1]}
        self._sizes = param_sizes(cfg)
        self._splits: dict = {}

    def split(self, axes: tuple) -> tuple:
        """``Strategy.zero_split`` of a param with logical ``axes`` (its shape follows from them)."""
        if axes not in self._splits:
            shape = param_shape(self.cfg, axes)
            self._splits[axes] = self.s.zero_split(axes, shape, self.mesh_shape)
        return self._splits[axes]

    # -- params as the block sees them -------------------------------------------------------
    def use(self, w, axes: tuple):
        """The weight a device computes with: gathered over the data axes under ZeRO-3 (on each
        dimension :meth:`split` put them), the
        device's copy under ZeRO-1/2 (passed as a per-device view), the local shard otherwise."""
        if self.s.zero in (1, 2):
            return w[0]
        if self.s.zero == 3:
            # the dimension with the fewest data axes first: the bigger gather gets the most links
            for dim, data_axes in sorted(self.split(axes), key=lambda d: len(d[1])):
                w = lax.all_gather(w, data_axes[0] if len(data_axes) == 1 else data_axes, axis=dim, tiled=True)
        return w

    def _ckpt(self, fn, in_layer: bool = True):
        """FSDP: re-gather in the backward pass instead of keeping gathered weights (inside a
        layer that the recompute policy checkpoints, the layer's checkpoint does it: a nested
        one would recompute the matmuls it keeps a second time)."""
        if self.s.zero != 3 or (in_layer and self.policy.checkpointed):
            return fn
        return sl.checkpoint(fn, policy="dots_saveable")

    # -- recompute policy -------------------------------------------------------------------
    def keep(self, prim, *avals, **params) -> bool:
        """The layer checkpoint's policy (JAX's signature): keep a ``checkpoint_name`` value the
        policy names, and the matmul / attention core whose output it names."""
        saved, name = self.policy.saved, str(prim)
        if name == "name":
            return params["name"] in saved
        tag = self._tag
        if tag is None or tag not in saved:
            return False
        return name == ("attention" if tag == "attn_out" else "dot_general")

    def _tagged(self, tag: str, fn, *args, **kwargs):
        """``fn(*args)`` with its matmul (or attention) known as checkpoint name ``tag``."""
        if not self.policy.checkpointed:
            return fn(*args, **kwargs)
        previous, self._tag = self._tag, tag
        try:
            out = fn(*args, **kwargs)
        finally:
            self._tag = previous
        self._record(tag, out)
        return out

    def _name(self, x, name: str):
        """``checkpoint_name(x, name)`` under a checkpointed policy."""
        if not self.policy.checkpointed:
            return x
        self._record(name, x)
        return checkpoint_name(x, name)

    def _record(self, name: str, x) -> None:
        if self.recorded is not None and name in self.policy.saved:
            nbytes = x.size * x.dtype.itemsize
            if name == "attn_out":  # the kernel keeps its fp32 logsumexp beside the output
                b, t, n, _ = x.shape
                nbytes += b * t * n * 4
            self.recorded[name] = self.recorded.get(name, 0) + int(nbytes)

    def _rope(self, q, k):
        T = q.shape[1]
        if T not in self._rotary:
            self._rotary[T] = rotary_tables(self.lcfg, np.arange(T))
        cos, sin = self._rotary[T]
        return apply_rotary(q, cos, sin, self.lcfg), apply_rotary(k, cos, sin, self.lcfg)

    def _norm(self, p, axes, x):
        def run(p, x):
            return norm({k: self.use(v, axes[k]) for k, v in p.items()}, x, self.cfg)
        return self._ckpt(run)(p, x)

    def _proj(self, x, w, axes, b=None, b_axes=None):
        def run(x, w, *b):
            y = jnp.matmul(x, self.use(w, axes))
            return y + self.use(b[0], b_axes) if b else y
        return self._ckpt(run)(x, w, *(() if b is None else (b,)))

    def _projs(self, x, p, axes, names, biases):
        """x times the concatenation of the weights ``names`` (plus the biases', if all are
        present) as one matmul, the pieces side by side on the last axis: one GEMM forward and
        two backward where separate projections run one each per weight and add their input
        cotangents. Each weight is still gathered (FSDP) and its gradient reduced on its own,
        so the ledger is the same."""
        bs = [p.get(b) for b in biases]
        with_bias = all(b is not None for b in bs)
        if not with_bias and any(b is not None for b in bs):
            return jnp.concatenate([self._proj(x, p[n], axes[n], p.get(b), axes.get(b)) for n, b in zip(names, biases)],
                                   axis=-1)
        k = len(names)

        def run(x, *wb):
            y = jnp.matmul(x, jnp.concatenate([self.use(v, axes[n]) for v, n in zip(wb[:k], names)], axis=-1))
            if with_bias:
                y = y + jnp.concatenate([self.use(v, axes[n]) for v, n in zip(wb[k:], biases)], axis=-1)
            return y

        return self._ckpt(run)(x, *(p[n] for n in names), *(bs if with_bias else ()))

    def _gather_seq(self, h):
        return lax.all_gather(h, self.model, axis=1, tiled=True) if self.s.sequence_parallel else h

    def _reduce_out(self, y):
        """g: the block output's partial sums over the model axis."""
        if self.model is None:
            return y
        if self.s.sequence_parallel:
            return lax.psum_scatter(y, self.model, scatter_dimension=1, tiled=True)
        return lax.psum(y, self.model)

    def _add_bias_after(self, y, p, name, axes):
        return y if name not in p else y + self.use(p[name], axes[name])

    # -- blocks ---------------------------------------------------------------------------
    def embed(self, table, tokens, pos=None):
        """Token ids [b, T] → residual stream; vocab-parallel under a model axis."""
        cfg, axes = self.cfg, ("vocab", "embed")

        def run(table, tokens):
            e = self.use(table, axes)
            idx = tokens.astype(np.int32)
            if self.model is not None and self.s.vocab_parallel:
                v_local = e.shape[0]
                local = idx - lax.axis_index(self.model) * np.int32(v_local)
                inside = jnp.logical_and(local >= 0, local < v_local)
                rows = embedding_lookup(e, jnp.clip(local, 0, v_local - 1))
                x = jnp.where(jnp.expand_dims(inside, -1), rows, jnp.zeros_like(rows))
            else:
                x = embedding_lookup(e, idx)
                if self.s.sequence_parallel:  # vocab replicated: each device keeps its slice
                    t = x.shape[1] // self.Y
                    x = lax.dynamic_slice_in_dim(x, lax.axis_index(self.model) * np.int32(t), t, axis=1)
            return x

        x = run(table, tokens)  # no checkpoint: the lookup's gradient does not read the table
        if self.model is not None and self.s.vocab_parallel:
            x = self._reduce_out(x)  # g: the partial rows of the vocabulary shards (B·T·D)
        if pos is not None:
            def add_pos(x, pos):
                table_p = self.use(pos, ("seq", "embed"))
                t = x.shape[1]
                if self.context is not None:  # zig-zag chunks of the sequence: their global rows
                    return x + embedding_lookup(table_p, jnp.expand_dims(zigzag_positions(self.context, t), 0))
                if self.s.sequence_parallel:
                    start = lax.axis_index(self.model) * np.int32(t)
                    return x + lax.dynamic_slice_in_dim(table_p, start, t, axis=0)[None]
                return x + table_p[:t][None]
            x = self._ckpt(add_pos, in_layer=False)(x, pos)
        return x

    def attention(self, p, axes, x):
        """x + attention(norm(x)) with the local heads; under context parallelism a ring over
        the context axis (rotary at the tokens' global positions)."""
        cfg, lcfg = self.cfg, self.lcfg
        a, aa = p["attn"], axes["attn"]
        h = self._gather_seq(self._name(self._norm(p["attn_norm"], axes["attn_norm"], x), "attn_norm"))
        B, T, _ = h.shape
        N, K, H = lcfg.num_heads, lcfg.num_kv_heads, lcfg.head_dim
        qkv = self._tagged("qkv", self._projs, h, a, aa, ("wq", "wk", "wv"), ("bq", "bk", "bv"))
        q, k, v = jnp.split(qkv, [N * H, (N + K) * H], axis=-1)
        q, k, v = jnp.reshape(q, (B, T, N, H)), jnp.reshape(k, (B, T, K, H)), jnp.reshape(v, (B, T, K, H))
        if self.context is not None:
            if cfg.positions == "rotary":
                q, k = rotary_zigzag((q, k), lcfg, self.context)
            o = self._tagged("attn_out", ring_attention, q, k, v, self.context, is_causal=True)
        else:
            if cfg.positions == "rotary":
                q, k = self._rope(q, k)
            o = self._tagged("attn_out", snn.dot_product_attention, q, k, v, is_causal=True)
        y = self._reduce_out(self._tagged("attn_proj", self._proj, jnp.reshape(o, (B, T, N * H)), a["wo"], aa["wo"]))
        return x + self._add_bias_after(y, a, "bo", aa)

    def mlp(self, p, axes, x):
        """x + mlp(norm(x)) with the local slice of F (a MoE layer: :meth:`moe`)."""
        if "moe" in p:
            return self.moe(p, axes, x)
        cfg = self.cfg
        m, ma = p["mlp"], axes["mlp"]
        h = self._gather_seq(self._name(self._norm(p["mlp_norm"], axes["mlp_norm"], x), "mlp_norm"))
        if cfg.gated_mlp:
            z = gated_activation(cfg.activation, self._tagged("mlp_hidden", self._projs, h, m, ma, ("w_gate", "w_up"),
                                                              ("b_gate", "b_up")))
        else:
            z = activation(cfg.activation, self._tagged("mlp_hidden", self._proj, h, m["w_in"], ma["w_in"], m.get("b_in"),
                                                        ma.get("b_in")))
        z = self._name(z.astype(x.dtype), "mlp_act")
        y = self._reduce_out(self._tagged("mlp_down", self._proj, z, m["w_down"], ma["w_down"]))
        return x + self._add_bias_after(y, m, "b_down", ma)

    def _use_tree(self, p, axes):
        return {k: self._use_tree(v, axes[k]) if isinstance(v, dict) else self.use(v, axes[k]) for k, v in p.items()}

    def moe(self, p, axes, x):
        """x + moe(norm(x)). With an expert axis the routed experts are this device's E/N and
        tokens travel by AllToAll (``models.expert_parallel``); without one every device runs
        all E on its own sequences. Under FSDP the router, the shared experts and any expert
        weight the expert axis does not split are gathered inside checkpoints (re-gathered in
        the backward pass); the expert axis's shards are never gathered."""
        cfg = self.cfg
        m, ma = p["moe"], axes["moe"]
        h = self._name(self._norm(p["mlp_norm"], axes["mlp_norm"], x), "mlp_norm")
        routed = {k: v for k, v in m.items() if k not in ("router", "router_bias", "shared")}
        extra = {"router_bias": self.use(m["router_bias"], ma["router_bias"])} if "router_bias" in m else {}
        ckpt = self._ckpt

        def router(h):
            return ckpt(lambda h, w: jnp.matmul(h, self.use(w, ma["router"])))(h, m["router"])

        def experts(xe):
            return ckpt(lambda xe, w: routed_experts(self._use_tree(w, ma), xe, cfg))(xe, routed)

        def shared(h):
            return ckpt(lambda h, w: shared_experts(self._use_tree(w, ma["shared"]), h, cfg))(h, m["shared"])

        y = self._tagged("mlp_hidden", expert_parallel_mlp, extra, h, cfg, self.s.expert, router=router,
                         experts=experts, shared=shared if "shared" in m else None)
        return x + y

    def head_loss(self, final_norm, fn_axes, head, head_axes, x, targets, total_tokens: int):
        """Summed cross-entropy of this device's tokens / ``total_tokens``, summed over the
        data axes. Vocab-parallel: the softmax needs the B·T maximum and sum of the shards'
        logsumexps and B·T target logits from the model axis (three B·T collectives), never
        the B·T·V logits."""
        h = self._gather_seq(self._ckpt(lambda p, x: norm({k: self.use(v, fn_axes[k]) for k, v in p.items()}, x, self.cfg),
                                        in_layer=False)(final_norm, x))

        def logits_of(h, w):
            w = self.use(w, head_axes)
            return jnp.matmul(h, w.T if head_axes == ("vocab", "embed") else w)

        logits = self._ckpt(logits_of, in_layer=False)(h, head).astype(np.float32)
        t = targets.astype(np.int32)
        lse = snn.logsumexp(logits, axis=-1)  # of this device's logits (one fused pass)
        if self.model is not None and self.s.vocab_parallel:
            # merge the shards' logsumexps: log sum_d exp(lse_d), shifted by their max
            v_local = logits.shape[-1]
            m = _stop(lax.pmax(lse, self.model))
            lse = jnp.log(lax.psum(jnp.exp(lse - m), self.model)) + m
            local = t - lax.axis_index(self.model) * np.int32(v_local)
            inside = jnp.logical_and(local >= 0, local < v_local)
            picked = jnp.take_along_axis(logits, jnp.expand_dims(jnp.clip(local, 0, v_local - 1), -1), axis=-1)[..., 0]
            target = lax.psum(jnp.where(inside, picked, jnp.zeros_like(picked)), self.model)
        else:
            target = jnp.take_along_axis(logits, jnp.expand_dims(t, -1), axis=-1)[..., 0]
        nll = lse - target
        loss = jnp.sum(nll) / np.float32(total_tokens)
        over = self.s.data + ((self.context,) if self.context else ())
        return lax.psum(loss, over[0] if len(over) == 1 else over) if over else loss
