"""The serving simulator as SimPy processes: the test oracle :func:`shardlab.serve.simulate` is
checked against, bit for bit.

This is the engine the simulator replaced -- one SimPy process per engine, prefill server and KV
transfer, a Store and a Resource for the link -- kept in its logic so the event-free engine of
:mod:`shardlab.serve.simulator` can be compared with an implementation that really runs a
discrete-event loop (``tests/python/test_serve_sim_simpy.py``, ``benchmarks/bench_serve.py``).
Needs SimPy (the ``test`` and ``bench`` extras); it is a test oracle, not part of the package.

Example:
    >>> from shardlab.models import presets
    >>> from shardlab.serve import ServingConfig, StepModel, poisson_requests, simulate
    >>> from simpy_reference import simpy_simulate
    >>> model = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})
    >>> reqs = poisson_requests(50, 20.0, seed=0)
    >>> bool((simpy_simulate(reqs, model).finish == simulate(reqs, model).finish).all())
    True
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np
import simpy

from shardlab.serve.estimate import StepModel
from shardlab.serve.prefix_cache import PrefixCache
from shardlab.serve.simulator import (ServingConfig, SimResult, _capacity_blocks, _Engine as _EventFreeEngine,
                                      take_prefill_chunks, tokens_per_verify)

__all__ = ["simpy_simulate"]


class _Req:
    __slots__ = ("r", "todo", "done", "cached", "blocks", "start_step", "ctx")

    def __init__(self, r):
        self.r = r
        self.todo = r.prompt_len
        self.done = 0
        self.cached = 0
        self.blocks = 0
        self.start_step = 0
        self.ctx = 0.0


class _Engine:
    """One replica's continuous-batching loop."""

    def __init__(self, env, sim, model: StepModel, cfg: ServingConfig, capacity_blocks: int, prefill: bool):
        self.env, self.sim, self.model, self.cfg = env, sim, model, cfg
        self.capacity, self.prefill_enabled = capacity_blocks, prefill
        self.queue: deque = deque()
        self.prefilling: deque = deque()
        self.heap: list = []
        self.seq = 0
        self.counter = 0
        self.S = 0.0
        self.blocks_used = 0
        self.util_area = 0.0
        self.wake = None
        self.g = tokens_per_verify(cfg.speculative_k, cfg.acceptance)
        self._lines: dict = {}
        self.prefix = PrefixCache(cfg.prefix_cache_blocks) if prefill else None
        env.process(self.run())

    # -- admission ------------------------------------------------------------------------------
    def put(self, q: _Req) -> None:
        self.queue.append(q)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def _room(self) -> bool:
        return len(self.heap) + len(self.prefilling) < self.cfg.max_batch

    def _admit(self) -> None:
        bs = self.cfg.block_size
        while self.queue and self._room():
            q = self.queue[0]
            need = -(-(q.r.prompt_len + q.r.output_len) // bs)
            if need > self.capacity:
                self.queue.popleft()
                self.sim.rejected.append(q.r.id)
                continue
            if self.blocks_used + need > self.capacity:
                break
            self.queue.popleft()
            q.blocks = need
            self.blocks_used += need
            if self.prefill_enabled:
                self.sim.lookup_prefix(self.prefix, q)
                self.prefilling.append(q)
            else:
                self._start_decoding(q)

    def _start_decoding(self, q: _Req) -> None:
        q.ctx = float(q.r.prompt_len)
        self.S += q.ctx
        rest = q.r.output_len - 1
        if rest <= 0:
            self._finish(q, self.env.now)
            return
        q.start_step = self.counter
        self.seq += 1
        heapq.heappush(self.heap, (self.counter + math.ceil(rest / self.g - 1e-9), self.seq, q))

    def _finish(self, q: _Req, t: float) -> None:
        self.sim.finish[q.r.id] = t
        self.blocks_used -= q.blocks

    # -- step times -----------------------------------------------------------------------------
    def _line(self, B: int):
        """(a, c): a decode step at batch B over S cached tokens takes a + c S."""
        if B not in self._lines:
            k = self.cfg.speculative_k
            m = self.model
            a = m.step(B, 0.0, verify_tokens=k + 1).seconds + k * self.cfg.draft_cost * m.decode(B, 0.0).seconds
            c = m.kv_bytes_per_token / m.hbm_bw * (1 + k * self.cfg.draft_cost)
            self._lines[B] = (a, c)
        return self._lines[B]

    # How many decode steps fit in a time budget: arithmetic, not the event loop under test.
    _cum = staticmethod(_EventFreeEngine._cum)
    _steps_within = _EventFreeEngine._steps_within

    # -- the loop -------------------------------------------------------------------------------
    def run(self):
        env = self.env
        while True:
            self._admit()
            if not self.prefilling and not self.heap:
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            t0 = env.now
            if self.prefilling:
                yield from self._mixed_step()
                continue
            B = len(self.heap)
            a, c = self._line(B)
            dS = B * self.g
            n_fin = self.heap[0][0] - self.counter
            T = self._cum(n_fin, a, c, self.S, dS)
            if self._room():       # an arrival could join before the stretch ends
                self.wake = env.event()
                timer = env.timeout(T)
                yield timer | self.wake
                self.wake = None
                if not timer.triggered or env.now < t0 + T:
                    n = min(self._steps_within(env.now - t0, a, c, self.S, dS, n_fin) + 1, n_fin)
                    end = t0 + self._cum(n, a, c, self.S, dS)
                    if end > env.now:
                        yield env.timeout(end - env.now)
                else:
                    n = n_fin
            else:
                yield env.timeout(T)
                n = n_fin
            self.util_area += self.blocks_used * (env.now - t0)
            self.S += n * dS
            self.counter += n
            while self.heap and self.heap[0][0] <= self.counter:
                fs, _, q = heapq.heappop(self.heap)
                self.S -= q.ctx + (fs - q.start_step) * self.g
                self._finish(q, env.now)      # a stretch ends at its first finish

    def _mixed_step(self):
        env, cfg = self.env, self.cfg
        tokens, pairs, ctx, done = take_prefill_chunks(self.prefilling, cfg.chunk_size)
        B = len(self.heap)
        k = cfg.speculative_k
        st = self.model.step(B, self.S + ctx, tokens, pairs, verify_tokens=k + 1).seconds
        if B and k:
            st += k * cfg.draft_cost * self.model.decode(B, self.S).seconds
        yield env.timeout(st)
        self.util_area += self.blocks_used * st
        if B:
            self.counter += 1
            self.S += B * self.g
            while self.heap and self.heap[0][0] <= self.counter:
                fs, _, q = heapq.heappop(self.heap)
                self.S -= q.ctx + (fs - q.start_step) * self.g
                self._finish(q, env.now)
        for q in done:                  # chunks go in order, so the finished prompts lead the queue
            self.prefilling.popleft()
            self.sim.first_token[q.r.id] = env.now
            self.sim.insert_prefix(self.prefix, q)
            self._start_decoding(q)


class _Sim:
    """Per-request times and the prefix bookkeeping shared by the engines."""

    def __init__(self, requests, cfg: ServingConfig):
        n = len(requests)
        self.cfg = cfg
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.rejected: list = []

    def lookup_prefix(self, cache, q: _Req) -> None:
        r = q.r
        if cache is None or r.prefix_id is None or r.prefix_len <= 0:
            return
        hit = cache.lookup(r.prefix_id, r.prefix_len // self.cfg.block_size)
        q.cached = min(hit * self.cfg.block_size, r.prompt_len - 1)   # the last token is always run
        q.todo = r.prompt_len - q.cached

    def insert_prefix(self, cache, q: _Req) -> None:
        r = q.r
        if cache is not None and r.prefix_id is not None and r.prefix_len > 0:
            cache.insert(r.prefix_id, r.prefix_len // self.cfg.block_size)



def simpy_simulate(requests, model: StepModel, config: ServingConfig | None = None, *,
                   prefill_model: StepModel | None = None) -> SimResult:
    """:func:`shardlab.serve.simulate`'s result for the same arguments, from SimPy processes."""
    cfg = config or ServingConfig()
    reqs = sorted(requests, key=lambda r: r.arrival)
    index = {id(r): i for i, r in enumerate(reqs)}
    env = simpy.Environment()
    sim = _Sim(reqs, cfg)
    capacity = _capacity_blocks(model, cfg)
    transfer_total = [0.0]

    class _View:     # engines record by position in the sorted list
        __slots__ = ("id", "prompt_len", "output_len", "prefix_id", "prefix_len")

    def view(r):
        v = _View()
        v.id, v.prompt_len, v.output_len, v.prefix_id, v.prefix_len = (index[id(r)], r.prompt_len, r.output_len,
                                                                       r.prefix_id, r.prefix_len)
        return v

    if cfg.mode == "interleaved":
        engines = [_Engine(env, sim, model, cfg, capacity, prefill=True) for _ in range(cfg.replicas)]
        prefix_caches = [e.prefix for e in engines]

        def arrivals():
            for i, r in enumerate(reqs):
                if r.arrival > env.now:
                    yield env.timeout(r.arrival - env.now)
                engines[i % len(engines)].put(_Req(view(r)))
    else:
        pm = prefill_model or model
        decoders = [_Engine(env, sim, model, cfg, capacity, prefill=False) for _ in range(cfg.decode_replicas)]
        store = simpy.Store(env)
        link = simpy.Resource(env, capacity=1)
        prefix = PrefixCache(cfg.prefix_cache_blocks)
        prefix_caches = [prefix]
        bw = cfg.transfer_bandwidth or model.chips * model.hw.dcn_bandwidth   # each chip ships its shard
        lat = cfg.transfer_latency if cfg.transfer_latency is not None else model.hw.dcn_latency
        rr = [0]

        def transfer(q):
            with link.request() as req:
                yield req
                t = q.r.prompt_len * model.kv_bytes_per_token / bw + lat
                transfer_total[0] += t
                yield env.timeout(t)
            decoders[rr[0] % len(decoders)].put(q)
            rr[0] += 1

        def prefill_server():
            while True:
                q = yield store.get()
                sim.lookup_prefix(prefix, q)
                yield env.timeout(pm.prefill(q.todo, 1, q.cached).seconds)
                sim.first_token[q.r.id] = env.now
                sim.insert_prefix(prefix, q)
                if q.r.output_len <= 1:
                    sim.finish[q.r.id] = env.now
                else:
                    env.process(transfer(q))

        for _ in range(cfg.prefill_replicas):
            env.process(prefill_server())
        engines = decoders

        def arrivals():
            for r in reqs:
                if r.arrival > env.now:
                    yield env.timeout(r.arrival - env.now)
                store.put(_Req(view(r)))

    env.process(arrivals())
    env.run()
    end = env.now
    start = reqs[0].arrival if reqs else 0.0
    span = max(end - start, 1e-30)
    util = sum(e.util_area for e in engines) / (len(engines) * capacity * span) if capacity else 0.0
    lookups = sum(c.lookups for c in prefix_caches if c is not None)
    hits = sum(c.hits for c in prefix_caches if c is not None)
    return SimResult(cfg.mode, np.array([r.arrival for r in reqs]), sim.first_token, sim.finish,
                     np.array([r.output_len for r in reqs]), util, hits / lookups if lookups else 0.0,
                     sim.rejected, transfer_total[0])
