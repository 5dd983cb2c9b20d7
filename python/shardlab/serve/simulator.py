"""A discrete-event serving simulator whose step times come from ``serve.estimate``.

Engines do continuous batching: a request joins the running batch as soon as it has a slot and
KV blocks (reserved for prompt + output at admission, so nothing is ever preempted), and leaves
the step it finishes. Two layouts:

* ``interleaved``: each replica runs prefill and decode on the same chips; a step carries up
  to ``chunk_size`` prompt tokens (chunked prefill) plus one token of every running sequence,
  so a long prompt stalls decoding for as long as its chunks take, and no longer.
* ``disaggregated``: prefill replicas run prompts at batch 1; the KV cache then crosses the
  interconnect (``prompt_len x KV bytes per token`` over one link, FIFO) to a decode replica.

Step time is ``StepModel.step``: KV traffic + max(weights, FLOPs, collectives) -- the formula of
the book's tables -- so a decode-only step at batch B and context S takes exactly what
``estimate`` prints. Between events the engine jumps over runs of identical-shaped decode steps
in closed form (step k costs a + c (S0 + k dS), a sum of an arithmetic series), so a simulation
costs a few events per request, not one per token.

Why no SimPy event loop (it ran this simulator until 100,000 requests had to take under 10 s):
nothing in these layouts feeds back. Arrivals go round-robin; the disaggregated front end is
FIFO prefill servers then one FIFO link, whose times do not depend on the decode engines (a
Lindley recursion, :func:`_prefill_pool`); engines never talk to each other. So every engine's
inputs -- (time, request) -- are known before it runs, and each engine is simulated on its own
clock, taking a request when the clock reaches it. The SimPy version processed 1.47 M events
for the benchmark's 100,000 disaggregated requests (15 per request: Store get/put, Timeout,
Resource request/release, Process start, the AnyOf of a timer and a wake-up) and spent about
two thirds of its profile in SimPy's event machinery (``Environment.step``,
``Process._resume``, ``schedule``, event construction); without it the run takes about a
quarter of the time. ``tests/python/simpy_reference.py`` keeps the SimPy processes as a
reference and requires bit-identical times from both. A layout with feedback (preemption,
load-aware routing) would need a shared event queue again.

Prefix caching (an LRU over blocks of shared prompt prefixes, :class:`PrefixCache`) skips the
cached part of a prompt; speculative decoding with ``k`` draft tokens and acceptance rate
``a`` emits (1 - a^(k+1)) / (1 - a) tokens per verify step, which reads the KV cache once but
does the FLOPs of k + 1 tokens, plus k draft steps at ``draft_cost`` of a target step.

Example:
    >>> from shardlab.models import presets
    >>> from shardlab.serve import StepModel
    >>> from shardlab.serve.simulator import ServingConfig, simulate
    >>> from shardlab.serve.workload import poisson_requests
    >>> model = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})
    >>> reqs = poisson_requests(200, rate=20.0, prompt_len=("uniform", 200, 800), output_len=64, seed=0)
    >>> r = simulate(reqs, model, ServingConfig(max_batch=32))
    >>> r.completed, bool(r.ttft.min() > 0), bool(r.tpot.min() >= model.decode(1, 200).seconds)
    (200, True, True)
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque

import numpy as np

from shardlab import units
from shardlab.viz import Displayed
from shardlab.viz.plots import throughput_latency_plot as plot_throughput_latency
from shardlab.viz.progress import track
from shardlab.viz.serving import sim_result_view, sim_summary

from .estimate import StepModel
from .prefix_cache import PrefixCache

__all__ = ["ServingConfig", "SimResult", "simulate", "sweep", "plot_throughput_latency", "tokens_per_verify"]


@dataclasses.dataclass
class ServingConfig:
    """How the serving system is laid out.

    Attributes:
        mode: "interleaved" or "disaggregated".
        max_batch: decode slots per engine.
        chunk_size: prompt tokens per interleaved step (None: a whole prompt per step).
        replicas: interleaved engines (requests go round-robin).
        prefill_replicas, decode_replicas: disaggregated pools.
        block_size: tokens per KV block.
        kv_capacity_tokens: KV tokens an engine holds (None: HBM left after the weights).
        prefix_cache_blocks: LRU capacity in blocks (0: no prefix cache).
        transfer_bandwidth: bytes/s of the prefill -> decode link (None: the DCN bandwidth of every
            chip of a replica, each sending its shard of the cache).
        transfer_latency: seconds per transfer (None: the hardware's DCN latency).
        speculative_k: draft tokens per verify step (0: plain decoding).
        acceptance: probability a draft token is accepted.
        draft_cost: a draft step's time as a fraction of a target decode step.
    """

    mode: str = "interleaved"
    max_batch: int = 64
    chunk_size: int | None = 512
    replicas: int = 1
    prefill_replicas: int = 1
    decode_replicas: int = 1
    block_size: int = 16
    kv_capacity_tokens: int | None = None
    prefix_cache_blocks: int = 0
    transfer_bandwidth: float | None = None
    transfer_latency: float | None = None
    speculative_k: int = 0
    acceptance: float = 0.0
    draft_cost: float = 0.05

    def __post_init__(self):
        if self.mode not in ("interleaved", "disaggregated"):
            raise ValueError(f"[simulate] mode {self.mode!r} must be 'interleaved' or 'disaggregated'")
        for f in ("max_batch", "replicas", "prefill_replicas", "decode_replicas", "block_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"[simulate] {f} {getattr(self, f)} must be >= 1")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"[simulate] chunk_size {self.chunk_size} must be >= 1 or None")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"[simulate] acceptance {self.acceptance} must be in [0, 1]")


def tokens_per_verify(k: int, acceptance: float) -> float:
    """Expected tokens per verify step with k draft tokens accepted independently with
    probability a: 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    if k == 0:
        return 1.0
    if acceptance >= 1.0:
        return float(k + 1)
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


class _Req:
    __slots__ = ("id", "prompt_len", "output_len", "prefix_id", "prefix_len", "todo", "done", "cached", "blocks",
                 "start_step", "ctx")

    def __init__(self, i: int, r):
        self.id, self.prompt_len, self.output_len = i, r.prompt_len, r.output_len
        self.prefix_id, self.prefix_len = r.prefix_id, r.prefix_len
        self.todo = r.prompt_len
        self.done = 0
        self.cached = 0
        self.blocks = 0
        self.start_step = 0
        self.ctx = 0.0


def take_prefill_chunks(prefilling, chunk_size) -> tuple[int, float, int, list]:
    """One step's prefill work under chunked prefill: prompts in ``prefilling`` (queue order)
    advance by up to ``chunk_size`` tokens in all (None: the first whole prompt). Returns
    (tokens, attention pairs, cached keys read, the requests whose prompt is now done); each
    request's ``done`` / ``todo`` counters move. The bookkeeping both engines share
    (``tests/python/simpy_reference.py`` is the other)."""
    budget = chunk_size or prefilling[0].todo
    tokens, pairs, ctx, done = 0, 0.0, 0, []
    for q in prefilling:
        take = min(budget, q.todo)
        pairs += take * (q.cached + q.done + (take + 1) / 2)
        ctx += q.cached + q.done                               # cached keys this chunk reads
        q.done += take
        q.todo -= take
        tokens += take
        budget -= take
        if q.todo == 0:
            done.append(q)
        if budget <= 0:
            break
    return tokens, pairs, ctx, done


class _Engine:
    """One replica's continuous-batching loop on its own clock ``t``.

    ``inbox`` lists the ``(time, request)`` pairs routed to this engine, in time order; a request
    joins the queue once the clock reaches its time. A stretch of decode steps that has a free
    slot stops at the step during which the next request arrives, so it can be admitted.
    """

    def __init__(self, sim, model: StepModel, cfg: ServingConfig, capacity_blocks: int, prefill: bool, inbox):
        self.sim, self.model, self.cfg = sim, model, cfg
        self.capacity, self.prefill_enabled = capacity_blocks, prefill
        self.inbox, self.next = inbox, 0
        self.t = 0.0
        self.queue: deque = deque()
        self.prefilling: deque = deque()
        self.heap: list = []
        self.seq = 0
        self.counter = 0
        self.S = 0.0
        self.blocks_used = 0
        self.util_area = 0.0
        self.g = tokens_per_verify(cfg.speculative_k, cfg.acceptance)
        self._lines: dict = {}
        self.prefix = PrefixCache(cfg.prefix_cache_blocks) if prefill else None
        self.rejected: list = []

    # -- admission ------------------------------------------------------------------------------
    def _pull(self) -> None:
        """Moves the requests that have arrived by ``t`` into the queue."""
        inbox, i, t = self.inbox, self.next, self.t
        n = len(inbox)
        while i < n and inbox[i][0] <= t:
            self.queue.append(inbox[i][1])
            i += 1
        self.next = i

    def _room(self) -> bool:
        return len(self.heap) + len(self.prefilling) < self.cfg.max_batch

    def _admit(self) -> None:
        bs = self.cfg.block_size
        queue, max_batch = self.queue, self.cfg.max_batch
        while queue and len(self.heap) + len(self.prefilling) < max_batch:
            q = queue[0]
            need = -(-(q.prompt_len + q.output_len) // bs)
            if need > self.capacity:
                queue.popleft()
                self.rejected.append((self.t, q.id))
                continue
            if self.blocks_used + need > self.capacity:
                break
            queue.popleft()
            q.blocks = need
            self.blocks_used += need
            if self.prefill_enabled:
                self.sim.lookup_prefix(self.prefix, q)
                self.prefilling.append(q)
            else:
                self._start_decoding(q)

    def _start_decoding(self, q: _Req) -> None:
        q.ctx = float(q.prompt_len)
        self.S += q.ctx
        rest = q.output_len - 1
        if rest <= 0:
            self._finish(q, self.t)
            return
        q.start_step = self.counter
        self.seq += 1
        heapq.heappush(self.heap, (self.counter + math.ceil(rest / self.g - 1e-9), self.seq, q))

    def _finish(self, q: _Req, t: float) -> None:
        self.sim.finish[q.id] = t
        self.blocks_used -= q.blocks

    def _retire(self) -> None:
        """Ends the sequences whose last step is ``counter``."""
        heap, t = self.heap, self.t
        while heap and heap[0][0] <= self.counter:
            fs, _, q = heapq.heappop(heap)
            self.S -= q.ctx + (fs - q.start_step) * self.g
            self._finish(q, t)

    # -- step times -----------------------------------------------------------------------------
    def _line(self, B: int):
        """(a, c): a decode step at batch B over S cached tokens takes a + c S."""
        if B not in self._lines:
            k = self.cfg.speculative_k
            m = self.model
            a = m.step_seconds(B, 0.0, verify_tokens=k + 1) + k * self.cfg.draft_cost * m.step_seconds(B, 0.0)
            c = m.kv_bytes_per_token / m.hbm_bw * (1 + k * self.cfg.draft_cost)
            self._lines[B] = (a, c)
        return self._lines[B]

    @staticmethod
    def _cum(n, a, c, S0, dS):
        return n * a + c * (n * S0 + dS * n * (n - 1) / 2)

    def _steps_within(self, e, a, c, S0, dS, cap) -> int:
        A, Bq = c * dS / 2, a + c * S0 - c * dS / 2
        n = int((-Bq + math.sqrt(Bq * Bq + 4 * A * e)) / (2 * A)) if A > 0 else int(e / Bq)
        n = max(0, min(n, cap))
        while n < cap and self._cum(n + 1, a, c, S0, dS) <= e:
            n += 1
        while n > 0 and self._cum(n, a, c, S0, dS) > e:
            n -= 1
        return n

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        """Runs until the inbox is empty and every admitted request has finished."""
        inbox = self.inbox
        while True:
            if self.next < len(inbox) and inbox[self.next][0] <= self.t:
                self._pull()
            if self.queue:
                self._admit()
            if not self.prefilling and not self.heap:
                if self.next >= len(inbox):
                    return
                self.t = inbox[self.next][0]          # idle until the next arrival
                continue
            if self.prefilling:
                self._mixed_step()
                continue
            t0 = self.t
            B = len(self.heap)
            a, c = self._line(B)
            dS = B * self.g
            n_fin = self.heap[0][0] - self.counter
            T = self._cum(n_fin, a, c, self.S, dS)
            tp = inbox[self.next][0] if self.next < len(inbox) and self._room() else math.inf
            if tp < t0 + T:          # an arrival can join before the stretch ends: stop after its step
                n = min(self._steps_within(tp - t0, a, c, self.S, dS, n_fin) + 1, n_fin)
                end = t0 + self._cum(n, a, c, self.S, dS)
                self.t = tp + (end - tp) if end > tp else tp
            else:
                n = n_fin
                self.t = t0 + T
            self.util_area += self.blocks_used * (self.t - t0)
            self.S += n * dS
            self.counter += n
            self._retire()          # a stretch ends at its first finish

    def _mixed_step(self) -> None:
        cfg = self.cfg
        tokens, pairs, ctx, done = take_prefill_chunks(self.prefilling, cfg.chunk_size)
        B = len(self.heap)
        k = cfg.speculative_k
        st = self.model.step_seconds(B, self.S + ctx, tokens, pairs, k + 1)
        if B and k:
            st += k * cfg.draft_cost * self.model.step_seconds(B, self.S)
        self.util_area += self.blocks_used * st
        self.t += st
        if B:
            self.counter += 1
            self.S += B * self.g
            if self.heap[0][0] <= self.counter:
                self._retire()
        for q in done:                  # chunks go in order, so the finished prompts lead the queue
            self.prefilling.popleft()
            self.sim.first_token[q.id] = self.t
            self.sim.insert_prefix(self.prefix, q)
            self._start_decoding(q)


class _Sim:
    """Per-request times and the prefix bookkeeping shared by the engines."""

    def __init__(self, n: int, cfg: ServingConfig):
        self.cfg = cfg
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)

    def lookup_prefix(self, cache, q: _Req) -> None:
        if cache is None or q.prefix_id is None or q.prefix_len <= 0:
            return
        hit = cache.lookup(q.prefix_id, q.prefix_len // self.cfg.block_size)
        q.cached = min(hit * self.cfg.block_size, q.prompt_len - 1)   # the last token is always run
        q.todo = q.prompt_len - q.cached

    def insert_prefix(self, cache, q: _Req) -> None:
        if cache is not None and q.prefix_id is not None and q.prefix_len > 0:
            cache.insert(q.prefix_id, q.prefix_len // self.cfg.block_size)


@dataclasses.dataclass(repr=False)
class SimResult(Displayed):
    """Per-request arrays (seconds) and system figures of one simulation.

    ``ttft`` = first token - arrival, ``tpot`` = (finish - first token) / (output tokens - 1)
    (requests with one output token have none), ``e2e`` = finish - arrival.

    Displays itself (Jupyter, ``rich.print``, ``print``) as a one-line summary, the latency
    percentiles and a picture of the run (``shardlab.viz.serving``), never the raw arrays.
    """

    mode: str
    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    output_len: np.ndarray
    kv_utilization: float
    prefix_hit_rate: float
    rejected: list
    transfer_seconds: float = 0.0

    @property
    def done(self) -> np.ndarray:
        return np.isfinite(self.finish)

    @property
    def completed(self) -> int:
        return int(self.done.sum())

    @property
    def ttft(self) -> np.ndarray:
        return (self.first_token - self.arrival)[self.done]

    @property
    def e2e(self) -> np.ndarray:
        return (self.finish - self.arrival)[self.done]

    @property
    def tpot(self) -> np.ndarray:
        m = self.done & (self.output_len > 1)
        return (self.finish - self.first_token)[m] / (self.output_len[m] - 1)

    @property
    def duration(self) -> float:
        return float(np.nanmax(self.finish) - self.arrival.min()) if self.completed else 0.0

    @property
    def throughput(self) -> float:
        """Output tokens per second over the whole run."""
        return float(self.output_len[self.done].sum() / self.duration) if self.duration else 0.0

    def summary(self) -> dict:
        q = lambda a, p: float(np.percentile(a, p)) if len(a) else float("nan")  # noqa: E731
        return {"mode": self.mode, "completed": self.completed, "rejected": len(self.rejected),
                "throughput_tok_s": self.throughput,
                "ttft_p50": q(self.ttft, 50), "ttft_p99": q(self.ttft, 99),
                "tpot_p50": q(self.tpot, 50), "tpot_p99": q(self.tpot, 99),
                "e2e_p50": q(self.e2e, 50), "e2e_p99": q(self.e2e, 99),
                "kv_utilization": self.kv_utilization, "prefix_hit_rate": self.prefix_hit_rate}

    def text(self) -> str:
        """The summary, the latency percentiles and the system figures as text."""
        return self.view().text

    def view(self):
        """The display: a ``shardlab.viz.View`` (``.save("run.svg")`` and friends)."""
        return sim_result_view(self)

    def __repr__(self) -> str:
        return f"<SimResult {sim_summary(self)}>"


def _capacity_blocks(model: StepModel, cfg: ServingConfig) -> int:
    tokens = cfg.kv_capacity_tokens
    if tokens is None:
        free = model.hbm_bytes - model.param_bytes
        if free <= 0:
            raise ValueError(f"[simulate] the weights ({units.fmt_bytes(model.param_bytes)}) do not fit in "
                             f"{model.chips} x {model.hw.name} ({units.fmt_bytes(model.hbm_bytes)}); use more chips")
        tokens = int(free // model.kv_bytes_per_token)
    return tokens // cfg.block_size


def _arrival_times(reqs) -> list:
    """When each request enters the system: its arrival, or time 0 for a negative one."""
    now, out = 0.0, []
    for r in reqs:
        if r.arrival > now:
            now = now + (r.arrival - now)
        out.append(now)
    return out


def _prefill_pool(qs, arrive, sim, prefix, pm: StepModel, model: StepModel, cfg: ServingConfig, decoders: int):
    """The disaggregated front end: ``prefill_replicas`` FIFO servers at batch 1, then one FIFO
    link to the decode pool. Returns each decoder's inbox, the link's busy seconds and the time
    the last prefill or transfer ended."""
    free = [0.0] * cfg.prefill_replicas           # when each prefill server is next idle (a heap)
    pending: list = []                            # (end, order, request): prefixes not yet cached
    ready = []
    last = 0.0
    for i, q in enumerate(qs):
        f = heapq.heappop(free)
        start = arrive[i] if arrive[i] > f else f
        while pending and pending[0][0] <= start:
            sim.insert_prefix(prefix, heapq.heappop(pending)[2])
        sim.lookup_prefix(prefix, q)
        end = start + pm.prefill_seconds(q.todo, 1, q.cached)
        heapq.heappush(free, end)
        heapq.heappush(pending, (end, i, q))
        sim.first_token[q.id] = end
        last = max(last, end)
        if q.output_len <= 1:
            sim.finish[q.id] = end
        else:
            ready.append((end, i, q))
    while pending:
        sim.insert_prefix(prefix, heapq.heappop(pending)[2])
    if cfg.prefill_replicas > 1:
        ready.sort(key=lambda e: (e[0], e[1]))
    bw = cfg.transfer_bandwidth or model.chips * model.hw.dcn_bandwidth   # each chip ships its shard
    lat = cfg.transfer_latency if cfg.transfer_latency is not None else model.hw.dcn_latency
    inboxes = [[] for _ in range(decoders)]
    link, busy = 0.0, 0.0
    for j, (end, _, q) in enumerate(ready):
        t = q.prompt_len * model.kv_bytes_per_token / bw + lat
        busy += t
        link = (end if end > link else link) + t
        inboxes[j % decoders].append((link, q))
    return inboxes, busy, max(last, link)


def simulate(requests, model: StepModel, config: ServingConfig | None = None, *,
             prefill_model: StepModel | None = None) -> SimResult:
    """Runs ``requests`` (from ``workload``) through the serving system until all finish.

    Args:
        requests: Request list (any order; sorted by arrival here).
        model: step times of one engine (decode engines when disaggregated).
        config: the layout (default: interleaved, batch 64, chunks of 512).
        prefill_model: step times of a prefill replica (default: ``model``).
    """
    cfg = config or ServingConfig()
    reqs = sorted(requests, key=lambda r: r.arrival)
    sim = _Sim(len(reqs), cfg)
    capacity = _capacity_blocks(model, cfg)
    arrive = _arrival_times(reqs)
    qs = [_Req(i, r) for i, r in enumerate(reqs)]
    transfer = 0.0
    last = arrive[-1] if arrive else 0.0
    if cfg.mode == "interleaved":
        n = cfg.replicas                                        # requests go round-robin
        engines = [_Engine(sim, model, cfg, capacity, True, list(zip(arrive[e::n], qs[e::n]))) for e in range(n)]
        prefix_caches = [e.prefix for e in engines]
    else:
        prefix = PrefixCache(cfg.prefix_cache_blocks)
        prefix_caches = [prefix]
        inboxes, transfer, t = _prefill_pool(qs, arrive, sim, prefix, prefill_model or model, model, cfg,
                                             cfg.decode_replicas)
        last = max(last, t)
        engines = [_Engine(sim, model, cfg, capacity, False, box) for box in inboxes]
    for e in engines:
        e.run()
    end = max([last] + [e.t for e in engines])
    start = reqs[0].arrival if reqs else 0.0
    span = max(end - start, 1e-30)
    util = sum(e.util_area for e in engines) / (len(engines) * capacity * span) if capacity else 0.0
    lookups = sum(c.lookups for c in prefix_caches if c is not None)
    hits = sum(c.hits for c in prefix_caches if c is not None)
    rejected = [i for _, _, i in sorted((t, k, i) for k, e in enumerate(engines) for t, i in e.rejected)]
    return SimResult(cfg.mode, np.array([r.arrival for r in reqs], dtype=float), sim.first_token, sim.finish,
                     np.array([r.output_len for r in reqs], dtype=np.int64), util,
                     hits / lookups if lookups else 0.0, rejected, transfer)


def sweep(make_requests, rates, model: StepModel, config: ServingConfig | None = None, **kw) -> list:
    """``simulate(make_requests(rate), ...)`` for every arrival rate; returns SimResults (with a
    progress bar when someone watches)."""
    return [simulate(make_requests(rate), model, config, **kw) for rate in track(rates, "simulating rates")]
