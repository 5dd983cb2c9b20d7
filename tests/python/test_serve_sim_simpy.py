"""The serving simulator against the SimPy processes it replaced: the same requests through
both give bit-identical first-token and finish times, utilisation, prefix hit rate and transfer
time, in every layout (chunked and whole-prompt prefill, several replicas, disaggregated with
several prefill and decode replicas, a prefix cache that evicts, speculative decoding, requests
that can never fit).

The reference below is the previous simulator (one SimPy process per engine, prefill server
and KV transfer, a Store and a Resource for the link), kept verbatim in its logic."""

import heapq
import math
from collections import deque

import numpy as np
import pytest

simpy = pytest.importorskip("simpy")

from shardlab.models import presets  # noqa: E402
from shardlab.serve import PrefixCache, Request, ServingConfig, StepModel, poisson_requests, simulate  # noqa: E402
from shardlab.serve import simulator  # noqa: E402
from shardlab.serve.simulator import SimResult, _capacity_blocks, tokens_per_verify  # noqa: E402

MODEL = StepModel(presets.get("llama3-8b"), "tpu-v5e", {"x": 8})


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
    _cum = staticmethod(simulator._Engine._cum)
    _steps_within = simulator._Engine._steps_within

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
        budget = cfg.chunk_size or self.prefilling[0].todo     # None: one whole prompt per step
        tokens, pairs, ctx, done = 0, 0.0, 0, []
        for q in self.prefilling:
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




def _same(a, b):
    np.testing.assert_array_equal(a.first_token, b.first_token)
    np.testing.assert_array_equal(a.finish, b.finish)
    assert a.kv_utilization == b.kv_utilization
    assert a.prefix_hit_rate == b.prefix_hit_rate
    assert a.transfer_seconds == b.transfer_seconds
    assert a.rejected == b.rejected
    assert a.summary() == b.summary()


REQS = poisson_requests(1500, 40.0, prompt_len=("lognormal", 600, 0.8), output_len=("exponential", 60),
                        shared_prefixes=12, prefix_len=128, prefix_fraction=0.6, seed=3)
CONFIGS = {
    "interleaved chunked, 2 replicas, prefix LRU evicting": ServingConfig(replicas=2, max_batch=48, chunk_size=256,
                                                                          prefix_cache_blocks=40),
    "interleaved whole prompts, small KV": ServingConfig(max_batch=64, chunk_size=None, kv_capacity_tokens=30_000),
    "interleaved speculative": ServingConfig(max_batch=32, chunk_size=128, speculative_k=3, acceptance=0.7),
    "disaggregated": ServingConfig(mode="disaggregated", max_batch=64, prefix_cache_blocks=4096),
    "disaggregated 3 prefill, 2 decode, slow link": ServingConfig(mode="disaggregated", prefill_replicas=3,
                                                                  decode_replicas=2, max_batch=24,
                                                                  transfer_bandwidth=2e9, prefix_cache_blocks=60),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_equal_to_the_simpy_processes(name):
    cfg = CONFIGS[name]
    new, ref = simulate(REQS, MODEL, cfg), simpy_simulate(REQS, MODEL, cfg)
    assert new.completed > 0
    _same(new, ref)


def test_rejections_and_one_token_outputs_equal_the_simpy_processes():
    reqs = [Request(0, 0.0, 100, 1), Request(1, 0.1, 9000, 5), Request(2, 0.1, 300, 40), Request(3, 0.2, 50, 1)]
    for cfg in (ServingConfig(kv_capacity_tokens=2048, replicas=2),
                ServingConfig(mode="disaggregated", kv_capacity_tokens=2048)):
        new, ref = simulate(reqs, MODEL, cfg), simpy_simulate(reqs, MODEL, cfg)
        _same(new, ref)
        assert new.rejected == [1]
