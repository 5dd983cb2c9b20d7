"""Training strategies as data: which mesh axes each logical axis of the params, optimizer
states and activations is split over, and the collectives the book prescribes for them.

A :class:`Strategy` is written once and applied to any ``ModelConfig`` through the logical
axis names of :func:`shardlab.models.param_axes` (``vocab, embed, heads, kv, mlp``):

========== ================================== ============================================
strategy   layout (book part 5 notation)      collectives per layer
========== ================================== ============================================
dp         In[B_X,D] W_in[D,F] W_out[F,D]     backward: AllReduce_X of every weight grad
zero1      dp + optimizer states [D_X, ...]   ReduceScatter_X grads, AllGather_X new params
zero2      zero1 + gradients [D_X, ...]       same bytes; grads reduce-scattered per microbatch
fsdp/zero3 W_in[D_X,F] W_out[F,D_X]           AllGather_X weights (fwd, again in bwd), RS_X grads
tp         In[B,D] W_in[D,F_Y] W_out[F_Y,D]   Megatron f (bwd AllReduce_Y) and g (fwd AllReduce_Y)
tp_sp      In[B,T_Y,D] W_in[D,F_Y] ...        AllGather_Y before, ReduceScatter_Y after a block
fsdp_tp    In[B_X,T_Y,D] W_in[D_X,F_Y] ...    both of the above
cp         In[B,T_C,D] (zig-zag chunks)       ring attention: 2(C-1) K/V ppermutes (fwd and bwd)
fsdp_cp    In[B_X,T_C,D] W_in[D_X,F]          fsdp over X + the ring over C
cp_tp      In[B,T_C,D] W_in[D,F_Y]            Megatron f/g over Y + the ring over C (local heads)
ep         dp + experts W_in[E_X,D,F] ...     AllToAll_X dispatch and combine (fwd and bwd)
fsdp_ep    fsdp + experts W_in[E_X,D,F] ...   both (expert weights are never gathered)
========== ================================== ============================================

Expert parallelism (GShard): the routed experts of a MoE layer are split over one of the data
axes (``expert``); each device routes its own tokens, AllToAll sends them to the devices
holding their experts and brings the outputs back (:mod:`shardlab.models.expert_parallel`).

Embeddings and the output head are vocab-parallel under a model axis (``vocab -> Y``): the
lookup all-reduces B·T·D, and the cross-entropy all-reduces B·T maxima, sums and target
logits instead of B·T·V logits.

Example:
    >>> from shardlab import train
    >>> s = train.strategies.fsdp_tp()
    >>> s.param_spec(("embed", "mlp")), s.batch_spec()
    (P('data', 'model'), P('data', None))
"""

from __future__ import annotations

import dataclasses
import math

from shardlab import P
from shardlab.models import param_axes, strategy_name
from shardlab.models.expert_parallel import alltoall_bytes

__all__ = ["Strategy", "param_sizes", "dp", "fsdp", "zero1", "zero2", "zero3", "tp", "tp_sp", "fsdp_tp", "cp", "fsdp_cp",
           "cp_tp", "ep", "fsdp_ep", "get", "NAMES"]

_TP_LOGICAL = ("heads", "kv", "mlp")


def param_sizes(cfg) -> dict:
    """The size of each logical axis of ``cfg``'s params (``vocab, embed, heads, kv, mlp, seq,
    experts, shared``)."""
    return {"vocab": cfg.vocab_size, "embed": cfg.d_model, "heads": cfg.num_heads * cfg.head_dim,
            "kv": cfg.num_kv_heads * cfg.head_dim, "mlp": cfg.ffw_dim, "seq": cfg.max_seq_len,
            "experts": cfg.num_experts, "shared": cfg.num_shared_experts}


def param_shape(cfg, axes: tuple) -> tuple:
    """The global shape of a param with logical ``axes`` (an expert's ``mlp`` is its own F).

    Example:
        >>> from shardlab.models import ModelConfig
        >>> cfg = ModelConfig(num_layers=1, d_model=32, ffw_dim=64, num_heads=4, vocab_size=16,
        ...                   num_experts=8, top_k=2, expert_ffw_dim=16)
        >>> param_shape(cfg, ("experts", "embed", "mlp")), param_shape(cfg, ("embed", "mlp"))
        ((8, 32, 16), (32, 64))
    """
    sizes = param_sizes(cfg)
    moe = bool(axes) and axes[0] in ("experts", "shared")
    return tuple(cfg.moe_ffw_dim if (a == "mlp" and moe) else sizes[a] for a in axes)


def _expert_sharded(axes: tuple) -> bool:
    """A routed expert's weight or bias: its leading dimension is E (the router's is not)."""
    return len(axes) > 1 and axes[0] == "experts"


def _leaves(tree) -> list:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


def _axes_tuple(axes) -> tuple:
    if axes is None:
        return ()
    if isinstance(axes, str):
        return (axes,)
    return tuple(axes)


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A sharding strategy over logical axes.

    Attributes:
        name: a label.
        data: mesh axes the batch is split over (data parallelism, ZeRO, FSDP).
        model: the tensor-parallel mesh axis, or None.
        zero: 0 (replicated params and states), 1 (optimizer states sharded over ``data``),
            2 (+ gradients), 3 (+ parameters: FSDP).
        sequence_parallel: between blocks the residual stream is split over ``model`` along the
            sequence (all-gather / reduce-scatter instead of all-reduce).
        vocab_parallel: embedding and head split over ``model`` along the vocabulary.
        context: the context-parallel mesh axis, or None: the sequence is split over it in
            zig-zag order (``shardlab.train.context``) and attention runs as a ring.
        expert: the data axis the routed experts of MoE layers are split over (expert
            parallelism: AllToAll dispatch and combine), or None.
    """

    name: str
    data: tuple = ()
    model: str | None = None
    zero: int = 0
    sequence_parallel: bool = False
    vocab_parallel: bool = True
    context: str | None = None
    expert: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "data", _axes_tuple(self.data))
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"[Strategy] zero stage {self.zero!r} must be 0, 1, 2 or 3")
        if self.zero and not self.data:
            raise ValueError(f"[Strategy] ZeRO stage {self.zero} shards over the data axes, but data=() ")
        if self.sequence_parallel and self.model is None:
            raise ValueError("[Strategy] sequence_parallel needs a model axis")
        if self.model is not None and self.model in self.data:
            raise ValueError(f"[Strategy] mesh axis {self.model!r} is both a data and the model axis")
        if self.context is not None and (self.context in self.data or self.context == self.model):
            raise ValueError(f"[Strategy] mesh axis {self.context!r} is the context axis and also a data or the "
                             f"model axis; give context parallelism its own mesh axis")
        if self.context is not None and self.sequence_parallel:
            raise ValueError("[Strategy] sequence_parallel and context parallelism both split the sequence; "
                             "use one of them (cp_tp keeps Megatron's all-reduces)")
        if self.expert is not None:
            if self.expert not in self.data:
                raise ValueError(f"[Strategy] expert axis {self.expert!r} must be one of the data axes {self.data} "
                                 f"(each device routes its own tokens, as in GShard)")
            if self.zero in (1, 2):
                raise ValueError(f"[Strategy] expert parallelism with ZeRO-{self.zero} is not supported; use "
                                 f"zero=0 (strategies.ep) or zero=3 (strategies.fsdp_ep)")

    # -- rules -----------------------------------------------------------------------------
    def rules(self) -> dict:
        """The strategy as a table: ``{"params" | "states" | "grads" | "activations":
        {logical axis: mesh axes}}``."""
        tp = self._tp()
        sharded = dict(tp, embed=self.data)
        act = {"batch": self.data}
        if self.sequence_parallel:
            act["seq"] = (self.model,)
        if self.context is not None:
            act["seq"] = (self.context,)
        return {"params": sharded if self.zero >= 3 else tp,
                "grads": sharded if self.zero >= 2 else tp,
                "states": sharded if self.zero >= 1 else tp,
                "activations": act}

    def zero_split(self, axes: tuple, shape: tuple, mesh_shape) -> tuple:
        """Where ZeRO puts the data axes in a param of logical ``axes`` and global ``shape``.

        Each data axis goes to the first dimension (the ``embed`` one first, as the book's
        ``W_in[D_X, F]``) whose local size it divides after the model axis and the data axes
        placed before it; so ZeRO-3 over a 16x16x16 mesh shards LLaMA-2 13B's ``D = 5120``
        over two axes and ``F`` over the third. A vector (norm scale, bias) that no remaining
        axis divides stays replicated over that axis; a matrix raises ValueError.

        Returns:
            ``((dim, (mesh axes...)), ...)`` in dimension order; ``()`` without ZeRO.

        Example:
            >>> fsdp(("x", "y", "z")).zero_split(("embed", "mlp"), (5120, 13824), {"x": 16, "y": 16, "z": 16})
            ((0, ('x', 'y')), (1, ('z',)))
        """
        if not self.zero:
            return ()
        sizes = dict(mesh_shape)
        y = sizes.get(self.model, 1) if self.model else 1
        tp = self._tp()
        local = [n // (y if tp.get(a) else 1) for a, n in zip(axes, shape)]
        by_expert = self.expert is not None and _expert_sharded(axes)
        if by_expert:  # the expert axis already splits E; the other data axes go as usual
            local[0] //= sizes[self.expert]
        order = [i for i, a in enumerate(axes) if a == "embed"] + [i for i, a in enumerate(axes) if a != "embed"]
        placed: dict = {}
        for a in self.data:
            if by_expert and a == self.expert:
                continue
            n = sizes[a]
            dim = next((i for i in order if local[i] % n == 0), None)
            if dim is None:
                if len(shape) >= 2:
                    raise ValueError(
                        f"[{self.name}] no dimension of a weight with axes {axes} and shape {tuple(shape)} "
                        f"(local {tuple(local)}) is divisible by the data axis {a!r} of size {n} (ZeRO-{self.zero} "
                        f"shards it); split the data axis into several (e.g. 16x16x16 instead of 4096) so "
                        f"each can shard a different dimension")
                continue
            local[dim] //= n
            placed.setdefault(dim, []).append(a)
        return tuple((d, tuple(placed[d])) for d in sorted(placed))

    def _tp(self) -> dict:
        """Logical axis -> the model axis, for the tensor-parallel dimensions."""
        tp = {n: (self.model,) for n in _TP_LOGICAL} if self.model else {}
        if self.model and self.vocab_parallel:
            tp["vocab"] = (self.model,)
        return tp

    def _spec(self, axes: tuple, table: dict, split=None, sharded: bool = False) -> P:
        tp = self._tp()
        # expert parallelism: a routed expert's leading E dimension over the expert axis
        lead = (self.expert,) if self.expert is not None and _expert_sharded(axes) else ()
        if split is None:  # the book's layout: every data axis on the embed dimension
            entries = []
            for i, name in enumerate(axes):
                mesh_axes = lead if (lead and i == 0) else tuple(a for a in table.get(name, ()) if a not in lead)
                entries.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes))
            return P(*entries)
        by_dim = dict(split) if sharded else {}
        entries = []
        for i, name in enumerate(axes):
            mesh_axes = (lead if i == 0 else ()) + tuple(tp.get(name, ())) + tuple(by_dim.get(i, ()))  # model major
            entries.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
        return P(*entries)

    def param_spec(self, axes: tuple, split=None) -> P:
        """The PartitionSpec of a param with logical ``axes`` as stored (``split`` from
        :meth:`zero_split`; without it every data axis shards the embed dimension)."""
        return self._spec(axes, self.rules()["params"], split, self.zero >= 3)

    def state_spec(self, axes: tuple, split=None) -> P:
        """The PartitionSpec of its optimizer states (and fp32 master copy)."""
        return self._spec(axes, self.rules()["states"], split, self.zero >= 1)

    def grad_spec(self, axes: tuple, split=None) -> P:
        """The PartitionSpec of its (accumulated) gradient."""
        return self._spec(axes, self.rules()["grads"], split, self.zero >= 2)

    def batch_spec(self) -> P:
        """Token ids ``[B, T]``."""
        return P(self.data[0] if len(self.data) == 1 else (self.data or None), self.context)

    def activation_spec(self) -> P:
        """The residual stream ``[B, T, D]`` between blocks."""
        b = self.data[0] if len(self.data) == 1 else (self.data or None)
        return P(b, self.model if self.sequence_parallel else self.context, None)

    def collectives(self) -> list:
        """The collectives the strategy prescribes, as (where, op, mesh axes) rows."""
        rows = []
        d, y = self.data, self.model
        if self.zero == 3:
            rows += [("forward: each weight", "all_gather", d), ("backward: each weight (re-gather)", "all_gather", d),
                     ("backward: each weight grad", "psum_scatter", d)]
        elif self.zero in (1, 2):
            rows += [("after backward: grads", "psum_scatter", d), ("after update: params", "all_gather", d)]
        elif d:
            rows += [("backward: each weight grad", "psum", d)]
        if self.expert is not None:
            rows += [("forward: MoE dispatch and combine (E·C·D each)", "all_to_all, all_to_all", (self.expert,)),
                     ("backward: their transposes", "all_to_all, all_to_all", (self.expert,))]
        if y and self.sequence_parallel:
            rows += [("forward: block input", "all_gather", (y,)), ("forward: block output", "psum_scatter", (y,)),
                     ("backward: block output grad", "all_gather", (y,)),
                     ("backward: block input grad", "psum_scatter", (y,))]
        elif y:
            rows += [("forward: g after each block", "psum", (y,)), ("backward: f before each block", "psum", (y,))]
        if self.context is not None:
            rows += [("forward: K and V blocks around the ring, 2(C-1) per layer", "ppermute", (self.context,)),
                     ("backward: their transposes, the reverse ring", "ppermute", (self.context,)),
                     ("backward: each replicated weight grad", "psum", (self.context,))]
        if y and self.vocab_parallel:
            rows += [("forward: embedding lookup", "psum" if not self.sequence_parallel else "psum_scatter", (y,)),
                     ("forward: softmax max / sum / target logit (B·T each)", "pmax, psum, psum", (y,))]
        return rows

    # -- checks -----------------------------------------------------------------------------
    def sizes(self, mesh) -> tuple[int, int]:
        """(data-parallel size X, model-parallel size Y) on ``mesh``."""
        shape = dict(mesh.shape)
        named = self.data + tuple(a for a in (self.model, self.context) if a)
        for a in named:
            if a not in shape:
                raise ValueError(f"[{self.name}] mesh axis {a!r} is not in the mesh ({list(shape)}); "
                                 f"make a mesh with axis names {named}")
        return math.prod(shape[a] for a in self.data), (shape[self.model] if self.model else 1)

    def context_size(self, mesh) -> int:
        """The context-parallel size C on ``mesh`` (1 without a context axis)."""
        return dict(mesh.shape)[self.context] if self.context else 1

    def validate(self, cfg, mesh, batch: int | None = None, seq: int | None = None) -> None:
        """Raises ValueError naming the dimension and the axis when ``mesh`` cannot split
        ``cfg`` (heads, kv heads, F, vocab, D) or the batch / sequence this way."""
        X, Y = self.sizes(mesh)
        op = f"[{self.name}]"
        if cfg.is_moe:
            self._validate_moe(cfg, mesh)
        elif self.expert is not None:
            raise ValueError(f"{op} expert axis {self.expert!r} given but the model is dense (num_experts 0); "
                             f"use a strategy without an expert axis")
        if Y > 1:
            checks = [("num_heads", cfg.num_heads), ("num_kv_heads", cfg.num_kv_heads)]
            checks += [("ffw_dim", cfg.ffw_dim)] if not cfg.is_moe else [("expert_ffw_dim", cfg.moe_ffw_dim)]
            if self.vocab_parallel:
                checks.append(("vocab_size", cfg.vocab_size))
            for name, v in checks:
                if v % Y:
                    raise ValueError(f"{op} {name} {v} is not divisible by the model axis {self.model!r} of size {Y}; "
                                     f"use a model axis that divides it")
            if self.sequence_parallel and seq is not None and seq % Y:
                raise ValueError(f"{op} sequence length {seq} is not divisible by the model axis "
                                 f"{self.model!r} of size {Y} (sequence parallelism splits it)")
        if self.context is not None and seq is not None:
            C = self.context_size(mesh)
            if seq % (2 * C):
                raise ValueError(f"{op} sequence length {seq} is not divisible by 2 x the context axis "
                                 f"{self.context!r} of size {C} (= {2 * C}: the zig-zag layout cuts it into "
                                 f"{2 * C} chunks); use a multiple of {2 * C}")
        if self.zero and X > 1:
            for axes in _leaves(param_axes(cfg)):
                self.zero_split(axes, param_shape(cfg, axes), mesh.shape)
        if batch is not None and batch % X:
            raise ValueError(f"{op} batch {batch} is not divisible by the data axes {self.data} of size {X}; "
                             f"use a multiple of {X}")

    def _validate_moe(self, cfg, mesh) -> None:
        """A MoE layer routes whole sequences on one device: no model or context axis; the
        expert axis divides E."""
        op = f"[{self.name}]"
        for kind, axis in (("model", self.model), ("context", self.context)):
            if axis is not None:
                raise ValueError(f"{op} mixture-of-experts layers are not supported with a {kind} axis ({axis!r}); "
                                 f"use dp / fsdp or expert parallelism (strategies.ep, strategies.fsdp_ep)")
        if self.expert is not None:
            n = dict(mesh.shape)[self.expert]
            if cfg.num_experts % n:
                raise ValueError(f"{op} num_experts {cfg.num_experts} is not divisible by the expert axis "
                                 f"{self.expert!r} of size {n}; use an expert axis whose size divides "
                                 f"{cfg.num_experts}")

    def moe_alltoall_bytes(self, cfg, mesh, batch: int, seq: int, dtype_bytes: float = 4) -> dict:
        """The closed form of one dispatch (or combine) AllToAll of a MoE layer, per device:
        ``E·C·D·bytes`` in and ``E·C·D·bytes·(N-1)/N`` sent, with C the slots per expert of the
        device's ``batch / X`` sequences (see :func:`shardlab.models.expert_parallel.alltoall_bytes`).
        A layer has two forward (dispatch, combine) and two backward.

        Example:
            >>> from shardlab.models import ModelConfig
            >>> cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32,
            ...                   num_experts=8, top_k=2)
            >>> ep().moe_alltoall_bytes(cfg, {"data": 4}, batch=8, seq=8)
            {'capacity': 4, 'bytes_in': 2048, 'bytes_sent': 1536.0}
        """
        if self.expert is None:
            raise ValueError(f"[{self.name}] has no expert axis: its MoE layers make no AllToAll")
        shape = dict(mesh) if isinstance(mesh, dict) else dict(mesh.shape)
        X = math.prod(shape[a] for a in self.data)
        return alltoall_bytes(cfg, batch // X, seq, shape[self.expert], dtype_bytes)


def dp(data="data") -> Strategy:
    """Data parallelism: params and optimizer states replicated, the batch split."""
    return Strategy("dp", data=data)


def zero1(data="data") -> Strategy:
    """ZeRO-1 (P_os): optimizer states split over the data axes."""
    return Strategy("zero1", data=data, zero=1)


def zero2(data="data") -> Strategy:
    """ZeRO-2 (P_os+g): optimizer states and gradients split over the data axes."""
    return Strategy("zero2", data=data, zero=2)


def fsdp(data="data") -> Strategy:
    """FSDP = ZeRO-3 (P_os+g+p): params too, gathered for use (and again in the backward)."""
    return Strategy("fsdp", data=data, zero=3)


def zero3(data="data") -> Strategy:
    """The same as :func:`fsdp`."""
    return Strategy("zero3", data=data, zero=3)


def tp(model="model", data=()) -> Strategy:
    """Megatron tensor parallelism with the f / g operators (all-reduces)."""
    return Strategy("tp", data=data, model=model)


def tp_sp(model="model", data=()) -> Strategy:
    """Tensor + sequence parallelism: all-gather / reduce-scatter of the sequence-split stream."""
    return Strategy("tp_sp", data=data, model=model, sequence_parallel=True)


def fsdp_tp(data="data", model="model") -> Strategy:
    """FSDP over ``data`` and tensor (+ sequence) parallelism over ``model`` on a 2-D mesh."""
    return Strategy("fsdp_tp", data=data, model=model, zero=3, sequence_parallel=True)


def ep(data="data") -> Strategy:
    """Expert parallelism (GShard): data parallel, the routed experts of MoE layers split over
    ``data`` (the first data axis if several) with AllToAll dispatch and combine."""
    axes = _axes_tuple(data)
    return Strategy("ep", data=axes, expert=axes[0])


def fsdp_ep(data="data") -> Strategy:
    """FSDP (ZeRO-3) with the routed experts split over ``data`` instead of gathered."""
    axes = _axes_tuple(data)
    return Strategy("fsdp_ep", data=axes, zero=3, expert=axes[0])


def cp(context="context", data=()) -> Strategy:
    """Context parallelism: the sequence split over ``context`` in zig-zag order, attention as
    a ring of K/V ppermutes (``shardlab.train.context``); params replicated."""
    return Strategy("cp", data=data, context=context)


def fsdp_cp(data="data", context="context") -> Strategy:
    """FSDP over ``data`` and context parallelism over ``context`` on a 2-D mesh."""
    return Strategy("fsdp_cp", data=data, zero=3, context=context)


def cp_tp(context="context", model="model", data=()) -> Strategy:
    """Context parallelism over ``context`` and Megatron TP (f/g all-reduces) over ``model``:
    each device runs the ring over its local heads."""
    return Strategy("cp_tp", data=data, model=model, context=context)


_FACTORIES = {"dp": dp, "zero1": zero1, "zero2": zero2, "fsdp": fsdp, "zero3": zero3, "tp": tp, "tp_sp": tp_sp,
              "fsdp_tp": fsdp_tp, "cp": cp, "fsdp_cp": fsdp_cp, "cp_tp": cp_tp,
              "ep": ep, "fsdp_ep": fsdp_ep}
NAMES = tuple(_FACTORIES)


def get(name) -> Strategy:
    """A built-in strategy by name (a Strategy is returned as is). One spelling: the parts of a
    combined strategy are joined by ``_`` (``"fsdp_tp"``); the book's ``"fsdp+tp"`` is accepted.

    Example:
        >>> get("fsdp+tp").name, get("tp_sp").sequence_parallel
        ('fsdp_tp', True)
    """
    if isinstance(name, Strategy):
        return name
    key = strategy_name(name)
    if key not in _FACTORIES:
        raise ValueError(f"[strategy] {name!r} is not a strategy; use one of {', '.join(NAMES)} (a '+' may join "
                         f"the parts: 'fsdp+tp'), or build one: train.Strategy('mine', data=('data',), "
                         f"model='model', zero=3, sequence_parallel=True)")
    return _FACTORIES[key]()
