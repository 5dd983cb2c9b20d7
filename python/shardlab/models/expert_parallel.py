"""Expert parallelism (GShard / Switch): the MoE block inside ``shard_map`` with its E routed
experts split over a mesh axis of N devices (E/N per device) and tokens moved by AllToAll.

Per device, on its own tokens x [B, T, D] (B sequences, each a routing group):

1. route locally (:func:`~shardlab.models.moe.route`) and pack the tokens into capacity slots
   [B, E, C, D] (``C = cfg.expert_capacity(T)``; a token past its expert's capacity is
   dropped and counted);
2. dispatch: ``all_to_all`` over the expert axis splits the E dimension into N blocks and
   sends block j to device j, which holds experts ``j·E/N ... (j+1)·E/N - 1``: it receives
   [N·B, E/N, C, D], every device's slots for its own experts;
3. the local experts run on those slots;
4. combine: the reverse ``all_to_all`` brings each slot back to the device of its token,
   [B, E, C, D], and the gates weight the k choices; shared experts (DeepSeek) run locally.

Each AllToAll moves the whole slot grid: a device puts in ``B·E·C·D·bytes`` and sends the
``(N-1)/N`` of it that leaves the device (:func:`alltoall_bytes`); the backward pass has
the two transposed AllToAlls of the same size. The result equals
:func:`shardlab.models.moe.moe_mlp` on one device, drops included, because routing groups
never span devices.

Example:
    >>> import numpy as np, shardlab as sl
    >>> from shardlab import P
    >>> from shardlab.models import ModelConfig, transformer
    >>> from shardlab.models.moe import moe_mlp
    >>> cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32,
    ...                   num_experts=8, top_k=2)
    >>> p = transformer.init_params(cfg, seed=0)["layers"][0]["moe"]
    >>> x = np.random.default_rng(0).standard_normal((4, 8, 16)).astype(np.float32)
    >>> mesh = sl.make_mesh((4,), ("x",))
    >>> f = sl.shard_map(lambda p, x: expert_parallel_mlp(p, x, cfg, "x"), mesh=mesh,
    ...                  in_specs=(expert_specs(p, "x"), P("x")), out_specs=P("x"))
    >>> with sl.Ledger() as led:
    ...     y = f(p, x)
    >>> bool(np.abs(np.asarray(y) - moe_mlp(p, x, cfg)).max() < 1e-5)
    True
    >>> [e["bytes_in"] for e in led.events if e["op"] == "all_to_all"] == [alltoall_bytes(cfg, 1, 8, 4)["bytes_in"]] * 2
    True
"""

from __future__ import annotations

import shardlab as sl
from shardlab import P, lax
from shardlab.cost import formulas

from .config import ModelConfig
from .moe import combine, dispatch, route, route_logits, routed_experts, shared_experts

__all__ = ["expert_parallel_mlp", "expert_specs", "alltoall_bytes", "check_experts"]


def check_experts(cfg: ModelConfig, axis, size: int, op: str = "expert_parallel_mlp") -> None:
    """Raises ValueError unless ``cfg`` is a mixture of experts whose E divides ``size``."""
    if not cfg.is_moe:
        raise ValueError(f"[{op}] expert parallelism needs a model with num_experts > 0 (got a dense model)")
    if cfg.num_experts % size:
        raise ValueError(f"[{op}] num_experts {cfg.num_experts} is not divisible by the expert axis {axis!r} "
                         f"of size {size}; use an expert axis whose size divides {cfg.num_experts}")


def expert_specs(p: dict, axis) -> dict:
    """PartitionSpecs of one MoE layer's params ``p`` for expert parallelism over ``axis``:
    the routed experts' weights split on their leading E dimension, the router, its bias and
    the shared experts replicated."""
    out = {}
    for k, v in p.items():
        if k == "shared":
            out[k] = {s: P() for s in v}
        elif k in ("router", "router_bias"):
            out[k] = P()
        else:
            out[k] = P(axis)
    return out


def alltoall_bytes(cfg: ModelConfig, groups: int, group_tokens: int, axis_size: int,
                   dtype_bytes: float = 4) -> dict:
    """The closed form of one dispatch (or combine) AllToAll, per device.

    A device holding ``groups`` routing groups (sequences) of ``group_tokens`` tokens puts in
    its slot grid, ``bytes_in = E·C·D·bytes`` with ``C = groups · cfg.expert_capacity(T)``
    slots per expert, and sends ``bytes_sent = E·C·D·bytes·(N-1)/N`` (the blocks of the
    experts other devices hold). One MoE layer has 2 such AllToAlls forward, 2 backward.

    Example:
        >>> from shardlab.models import ModelConfig
        >>> cfg = ModelConfig(num_layers=1, d_model=16, ffw_dim=32, num_heads=2, vocab_size=32,
        ...                   num_experts=8, top_k=2)
        >>> alltoall_bytes(cfg, groups=1, group_tokens=8, axis_size=4)
        {'capacity': 2, 'bytes_in': 1024, 'bytes_sent': 768.0}
    """
    C = groups * cfg.expert_capacity(group_tokens)
    b_in = cfg.num_experts * C * cfg.d_model * dtype_bytes   # the slot grid E·C·D each device puts in
    return {"capacity": C, "bytes_in": b_in, "bytes_sent": formulas.collective_bytes("all_to_all", axis_size, b_in)[2]}


def expert_parallel_mlp(p: dict, x, cfg: ModelConfig, axis, *, return_dropped: bool = False,
                        router=None, experts=None, shared=None):
    """The MoE block on this device's tokens x [B, T, D] with experts split over ``axis``.

    Call inside ``shard_map``; ``p`` holds this device's E/N routed experts (weights
    [E/N, D, F], ...), the whole router [D, E] and the shared experts (see
    :func:`expert_specs`).

    Args:
        p: one MoE layer's params, as laid out by :func:`expert_specs`.
        x: [B, T, D] local tokens; each sequence is a routing group.
        cfg: the model.
        axis: the mesh axis (or tuple of axes) the experts are split over; None: every
            expert is on this device and nothing moves (:func:`~shardlab.models.moe.moe_mlp`).
        return_dropped: also return this device's count of dropped (token, choice) pairs
            (int32; ``lax.psum`` it over the token axes for the global count).
        router, experts, shared: optional functions ``router(x) -> logits [B, T, E]``,
            ``experts(slots [N·B, E/N, C, D]) -> outputs`` and ``shared(x) -> [B, T, D]``
            used instead of the params in ``p`` (a trainer gathers FSDP shards there).

    Returns:
        [B, T, D] in x's dtype, or ``(out, dropped)``.
    """
    try:
        n = lax.axis_size(axis) if axis is not None else 1
    except NameError as e:  # say which call named the axis
        raise NameError(f"[expert_parallel_mlp] {e}") from None
    check_experts(cfg, axis, n)
    if experts is None:
        local = p["w_down"].shape[0]
        if local * n != cfg.num_experts:
            raise ValueError(f"[expert_parallel_mlp] this device holds {local} experts but num_experts "
                             f"{cfg.num_experts} / axis {axis!r} of size {n} is {cfg.num_experts // n}; "
                             f"split the expert weights with expert_specs(p, {axis!r})")
        experts = lambda xe: routed_experts(p, xe, cfg)  # noqa: E731
    if router is None:
        idx, gates = route(p, x, cfg)
    else:
        idx, gates = route_logits(router(x), cfg, p.get("router_bias"))
    xe, plan = dispatch(x, idx, gates, cfg)                              # [B, E, C, D]
    if axis is not None:
        with sl.named_scope("dispatch"):
            xe = lax.all_to_all(xe, axis, 1, 0, tiled=True)              # [N·B, E/N, C, D]
    ye = experts(xe)
    if axis is not None:
        with sl.named_scope("combine"):
            ye = lax.all_to_all(ye, axis, 0, 1, tiled=True)              # [B, E, C, D]
    out = combine(ye, plan)
    if cfg.num_shared_experts:
        out = out + (shared(x) if shared is not None else shared_experts(p["shared"], x, cfg))
    out = out.astype(x.dtype)
    return (out, plan.dropped) if return_dropped else out
