"""Which strategy and mesh to train on: the estimate's fastest fitting plan, beside the book's X_opt.

:func:`search` lays ``chips`` out as the hardware does (a TPU slice's torus axes, GPU nodes),
tries every strategy over every factorization of that mesh (the model or context axis of each
size that divides the chips, the data axes the rest of the torus), prices each plan with
:func:`~shardlab.train.estimate` and keeps the fastest that fits in HBM. Beside it: the book's
``X_opt = sqrt(B·M_X·N / (F·M_Y))`` and the batch above which each strategy is compute-bound
(:mod:`shardlab.train.rooflines`). Plans the model cannot be split by (heads over a model axis
that does not divide them, ...) are listed as skipped with the reason.

Each plan's estimate is kept in a cache keyed by everything it depends on (model, strategy, mesh
factorization, hardware, batch, sequence, recompute policy, precision, optimizer), so asking
again with another strategy list or a wider ``remat=`` prices only what is new.

Example:
    >>> from shardlab import train
    >>> from shardlab.models import ModelConfig
    >>> cfg = ModelConfig(num_layers=2, d_model=1024, ffw_dim=4096, num_heads=16, vocab_size=32000)
    >>> r = train.search(cfg, "tpu-v5p", chips=16, batch=16, seq=2048)
    >>> r.best.fits, r.best.step_seconds == min(e.step_seconds for e in r.table if e.fits)
    (True, True)
"""

from __future__ import annotations

import dataclasses
import html
import math
import time

from rich.console import Console
from rich.table import Table

from shardlab import units
from shardlab.models import get_hardware, remat_policy
from shardlab.viz import progress

from . import strategy as _strategy
from .estimate import estimate
from .rooflines import crossover_batches, x_opt

__all__ = ["search", "SearchResult", "plans", "DEFAULT_STRATEGIES", "MIN_RING_CHUNK", "clear_cache"]

#: what :func:`search` tries when ``strategies`` is not given (expert parallelism is added for a
#: MoE model; every name: ``strategies=train.strategy.NAMES``)
DEFAULT_STRATEGIES = ("dp", "zero1", "zero2", "fsdp", "tp", "tp_sp", "fsdp_tp", "cp", "fsdp_cp")
_CACHE: dict = {}
#: the fewest tokens a ring-attention chunk holds in a plan :func:`search` tries: a tile of the
#: flash-attention kernels (FlashAttention-2's and TPU splash attention's blocks are 128 and up);
#: smaller chunks leave the matrix units idle and make the ring all latency
MIN_RING_CHUNK = 128


def clear_cache() -> None:
    """Forgets the plans :func:`search` priced."""
    _CACHE.clear()


def _factor(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def _balanced(n: int, k: int) -> list[int]:
    """``n`` as at most ``k`` factors as equal as possible (largest first), ones dropped."""
    sizes = [1] * max(k, 1)
    for p in sorted(_factor(n), reverse=True):
        sizes[sizes.index(min(sizes))] *= p
    return sorted((s for s in sizes if s > 1), reverse=True) or [1]


def _axis_count(hw, chips: int) -> int:
    """How many mesh axes the chips have physically: a TPU's torus axes, GPU nodes x GPUs."""
    if hw.family == "tpu":
        return len(hw.ici_axes)
    return 2 if hw.node_size and chips > hw.node_size else 1


def _data_axes(n: int, k: int, names: tuple) -> dict:
    return dict(zip(names, _balanced(n, k)))


def plans(hardware, chips: int, strategies=None, *, moe: bool = False, seq: int | None = None) -> list:
    """The (Strategy, mesh) pairs :func:`search` prices for ``chips`` chips of ``hardware``.

    Pure data strategies spread the batch over all the mesh axes (``M_X`` of them); a strategy
    with a model (or context) axis takes each size ``Y`` that divides the chips (``1 < Y``;
    ``Y = N`` for tensor or context parallelism alone) and spreads the data over the other axes.
    With ``seq``, a context axis of size ``C`` is tried only where each of the ``2C`` zig-zag
    chunks of a sequence holds at least :data:`MIN_RING_CHUNK` tokens.

    Example:
        >>> [(s.name, m) for s, m in plans("tpu-v5p", 64, ("fsdp", "fsdp_tp"))][:3]
        [('fsdp', {'x': 4, 'y': 4, 'z': 4}), ('fsdp_tp', {'x': 8, 'y': 4, 'model': 2}), ('fsdp_tp', {'x': 4, 'y': 4, 'model': 4})]
    """
    hw = get_hardware(hardware, "search")
    k = _axis_count(hw, chips)
    names = ("x", "y", "z", "w")[:k] if hw.family == "tpu" else (("node", "gpu") if k == 2 else ("gpu",))
    wanted = strategies or (DEFAULT_STRATEGIES + (("ep", "fsdp_ep") if moe else ()))
    divisors = [y for y in range(2, chips + 1) if chips % y == 0]
    out = []
    for name in wanted:
        s = _strategy.get(name)
        split = s.model or s.context
        if split is None:
            data = _data_axes(chips, k, names)
            out.append((_with_axes(s, tuple(data)), data))
            continue
        if s.model and s.context:   # TP and a ring (cp_tp): each pair of sizes, the data the rest
            for y in divisors:
                for c in divisors:
                    rest = chips // (y * c) if chips % (y * c) == 0 else 0
                    if not rest or (rest > 1) != bool(s.data) or (seq is not None and seq < 2 * c * MIN_RING_CHUNK):
                        continue
                    data = _data_axes(rest, max(k - 2, 1), names) if s.data else {}
                    out.append((_with_axes(s, tuple(data)), dict(data, model=y, context=c)))
            continue
        for y in divisors:
            if s.context and not s.model and seq is not None and seq < 2 * y * MIN_RING_CHUNK:
                continue
            if not s.data and y != chips:
                continue
            if s.data and y == chips:
                continue
            data = _data_axes(chips // y, max(k - 1, 1), names) if s.data else {}
            mesh = dict(data, **{("model" if s.model else "context"): y})
            out.append((_with_axes(s, tuple(data)), mesh))
    return out


def _with_axes(s, data: tuple):
    """``s`` with its data axes renamed to ``data`` (its expert axis the first of them)."""
    changes = {"data": data} if s.data else {}
    if s.expert is not None:
        changes["expert"] = data[0]
    if s.model is not None:
        changes["model"] = "model"
    if s.context is not None:
        changes["context"] = "context"
    try:
        return dataclasses.replace(s, **changes)
    except ValueError as err:
        raise ValueError(f"[search] strategy {s.name!r} cannot be laid over the mesh axes search makes ({err}); "
                         f"price it on your own mesh with train.estimate") from None


@dataclasses.dataclass
class SearchResult:
    """What :func:`search` found: ``best`` (an Estimate), ``table`` (every priced plan, fastest
    fitting first), ``skipped`` ((strategy, mesh, reason) of plans the model cannot be split
    by), ``x_opt`` (the book's FSDP degree for FSDP + TP), ``crossover`` (tokens above which each
    strategy is compute-bound, :func:`~shardlab.train.crossover_batches`). ``result["best"]``
    works as ``result.best``. Shown as a ranked table, the chosen plan highlighted."""

    best: object
    table: list
    skipped: list
    x_opt: float
    crossover: dict
    hardware: str
    chips: int
    batch_tokens: int
    seconds: float = 0.0

    def __getitem__(self, key):
        return getattr(self, key)

    def _row(self, rank: int, e) -> list[str]:
        X = math.prod(v for a, v in e.mesh.items() if a not in ("model", "context"))
        return [str(rank), e.strategy, " x ".join(f"{a}={v}" for a, v in e.mesh.items()), str(X),
                units.fmt_seconds(e.step_seconds), units.fmt_percent(e.mfu), e.bound,
                units.fmt_bytes(e.memory_per_device), "yes" if e.fits else "no"]

    _HEAD = ["#", "strategy", "mesh", "X (data)", "step", "MFU", "bound", "memory/device", "fits"]

    def _title(self) -> str:
        return (f"train.search: {self.chips} x {self.hardware}, {self.batch_tokens:,} tokens per step; "
                f"book's X_opt = {self.x_opt:,.0f}")

    def _footer(self) -> str:
        cross = ", ".join(f"{k} {units.fmt_count(v) if math.isfinite(v) else 'never'}"
                          for k, v in self.crossover.items())
        return (f"compute-bound above (tokens, book's closed forms): {cross}; "
                f"{len(self.skipped)} plans skipped (the model cannot be split so)")

    def rich_table(self) -> Table:
        """A rich Table of the plans, fastest fitting first, the chosen one in bold green."""
        t = Table(title=self._title(), caption=self._footer())
        for h in self._HEAD:
            t.add_column(h, justify="right" if h in ("#", "X (data)", "step", "MFU", "memory/device") else "left")
        for i, e in enumerate(self.table, 1):
            t.add_row(*self._row(i, e), style="bold green" if e is self.best else (None if e.fits else "dim"))
        return t

    def text(self) -> str:
        console = Console(width=140, record=True, file=_Null(), color_system=None)
        console.print(self.rich_table())
        return console.export_text().rstrip()

    def __str__(self):
        return self.text()

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEAD)
        rows = []
        for i, e in enumerate(self.table, 1):
            style = ' style="font-weight:bold;background:#d9f2d9"' if e is self.best else (
                ' style="color:#888"' if not e.fits else "")
            rows.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in self._row(i, e)) + "</tr>")
        return (f"<div><b>{html.escape(self._title())}</b><table><tr>{head}</tr>{''.join(rows)}</table>"
                f"<small>{html.escape(self._footer())}</small></div>")


class _Null:
    def write(self, _):
        return 0

    def flush(self):
        pass


def _key(cfg, s, mesh, hw, batch, seq, remat, precision, optimizer, prices):
    return (cfg, s, tuple(mesh.items()), hw, batch, seq, remat, precision, optimizer, prices)


def search(cfg, hardware, chips: int, batch: int, seq: int, *, remat="full", strategies=None,
           precision: str = "mixed", optimizer: str = "adamw", prices=None, show_progress=None) -> SearchResult:
    """The fastest strategy, mesh factorization (and recompute policy) that fits in HBM.

    Args:
        cfg: the model.
        hardware: a preset name or a Hardware.
        chips: N.
        batch, seq: sequences per step and tokens per sequence.
        remat: a recompute policy, or a tuple of them to search over too.
        strategies: names or Strategies to try (default :data:`DEFAULT_STRATEGIES`, plus expert
            parallelism for a MoE model).
        precision, optimizer, prices: as :func:`~shardlab.train.estimate` (``prices="ideal"``
            for a chip without a price list).
        show_progress: draw a progress bar (default: only when a person watches, see
            ``shardlab.viz.progress``).

    Returns:
        A :class:`SearchResult` (``best``, ``table``, ``skipped``, ``x_opt``, ``crossover``).

    Raises:
        ValueError: nothing fits (by how much the smallest footprint is over HBM), or no plan
            can split the model.
    """
    op = "search"
    hw = get_hardware(hardware, op)
    for name, v in (("chips", chips), ("batch", batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"[{op}] {name}={v!r} must be an int >= 1")
    policies = [remat_policy(r, op) for r in (remat if isinstance(remat, (tuple, list)) else (remat,))]
    todo = [(s, m, p) for s, m in plans(hw, chips, strategies, moe=cfg.is_moe, seq=seq) for p in policies]
    table, skipped = [], []
    start = time.perf_counter()
    items = progress.track(todo, f"train.search: {len(todo)} plans", enabled=show_progress)
    for s, mesh, policy in items:
        key = _key(cfg, s, mesh, hw, batch, seq, policy, precision, optimizer, prices)
        found = _CACHE.get(key)
        if found is None:
            try:
                found = estimate(cfg, s, mesh, hw, batch, seq, remat=policy, precision=precision, optimizer=optimizer,
                                 prices=prices)
            except ValueError as err:
                found = err
            _CACHE[key] = found
        if isinstance(found, ValueError):
            skipped.append((s.name, mesh, str(found)))
        else:
            table.append(found)
    if not table:
        raise ValueError(f"[{op}] no plan can split the model over {chips} chips: "
                         + "; ".join(f"{n} {m}: {r}" for n, m, r in skipped[:3]))
    table.sort(key=lambda e: (not e.fits, e.step_seconds))
    best = table[0] if table[0].fits else None
    if best is None:
        least = min(table, key=lambda e: e.memory_per_device)
        over = least.memory_per_device - hw.hbm_capacity
        raise ValueError(f"[{op}] nothing fits: the smallest footprint ({least.strategy} on {least.mesh}) is "
                         f"{units.fmt_bytes(over)} over the HBM of {hw.name}")
    k = _axis_count(hw, chips)
    m_x = max(k - 1, 1)
    return SearchResult(best, table, skipped, x_opt(batch * seq, cfg.ffw_dim, chips, m_x, 1),
                        crossover_batches(cfg.ffw_dim, hw, chips, mesh_axes=max(k, 2),
                                          link="ici" if hw.family == "tpu" else "nvlink"),
                        hw.name, chips, batch * seq, time.perf_counter() - start)
