"""shardlab.autoshard's intra-op layer: the ILP (HiGHS) against exhaustive search on random
small problems, exact shrinking, the memory constraint, the time limit, and bad input."""

import warnings

import numpy as np
import pytest

pytest.importorskip("highspy")

from shardlab.autoshard import (Edge, MemoryLimitError, Node, Problem, SolverTimeLimitWarning,  # noqa: E402
                                Strategy, brute_force, greedy, solve)
from shardlab.autoshard import ilp as ilp_module  # noqa: E402
from shardlab.viz import progress  # noqa: E402


def _strategies(rng, n, *, uniform_compute=False):
    c = rng.uniform(0, 1)
    return [Strategy(f"s{j}", compute_s=c if uniform_compute else float(rng.uniform(0, 2)),
                     comm_s=float(rng.choice([0.0, rng.uniform(0, 2)])),
                     memory_bytes=float(rng.integers(0, 100))) for j in range(n)]


def _reshard(rng, na, nb, kind):
    if kind == "random":
        return rng.uniform(0, 3, size=(na, nb)) * (rng.uniform(size=(na, nb)) < 0.8)
    if kind == "constant":
        return np.full((na, nb), float(rng.uniform(0, 1)))
    if kind == "separable":
        return rng.uniform(0, 1, size=(na, 1)) + rng.uniform(0, 1, size=(1, nb))
    # "layout": zero when the layouts match, a price proportional to the tensor otherwise
    size = rng.uniform(0.5, 2)
    m = np.full((na, nb), size)
    for i in range(min(na, nb)):
        m[i, i] = 0.0
    return m


def random_problem(seed, *, dag=True):
    """2-6 nodes with 1-4 strategies, a chain plus (for dag) extra edges into shared nodes,
    random ties (follows=, repeated layer positions), a random memory limit that is sometimes
    below what any choice needs."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    counts = [int(rng.integers(1, 5)) for _ in range(n)]
    nodes = []
    for i in range(n):
        follows = layer_class = position = None
        same = [j for j in range(i) if counts[j] == counts[i]]
        if same and rng.uniform() < 0.25:
            follows = f"n{rng.choice(same)}"
        elif same and rng.uniform() < 0.25:
            j = int(rng.choice(same))
            layer_class, position = "block", f"p{j}"
            if nodes[j].layer_class is None:  # make j a tagged node too
                nodes[j] = Node(nodes[j].name, nodes[j].strategies, nodes[j].follows, "block", f"p{j}")
            else:
                position = nodes[j].position
        nodes.append(Node(f"n{i}", _strategies(rng, counts[i], uniform_compute=rng.uniform() < 0.3),
                          follows=follows, layer_class=layer_class, position=position))
    edges = []
    kinds = ["random", "constant", "separable", "layout"]
    for i in range(1, n):
        src = int(rng.integers(0, i)) if dag else i - 1
        edges.append(Edge(f"n{src}", f"n{i}", _reshard(rng, counts[src], counts[i], rng.choice(kinds))))
    if dag:
        for _ in range(int(rng.integers(0, n))):
            a, b = sorted(rng.choice(n, size=2, replace=False))
            edges.append(Edge(f"n{a}", f"n{b}", _reshard(rng, counts[a], counts[b], rng.choice(kinds))))
    p = Problem(nodes, edges)
    lo, shares = p.min_memory()
    hi = sum(float(m.max()) for m in p.memory)
    limit = rng.choice([None, lo, rng.uniform(lo, hi + 1), rng.uniform(0.5 * lo, lo) if lo > 0 else None])
    return Problem(nodes, edges, memory_limit_bytes=limit)


def _solve_or_error(fn, p):
    try:
        return fn(p)
    except MemoryLimitError:
        return None


@pytest.mark.parametrize("dag", [False, True], ids=["chain", "dag"])
def test_ilp_equals_brute_force_on_random_problems(dag):
    infeasible = proved = 0
    for seed in range(120):
        p = random_problem(seed + (1000 if dag else 0), dag=dag)
        ref = _solve_or_error(brute_force, p)
        for shrink in (True, False):
            got = _solve_or_error(lambda q: solve(q, shrink=shrink), p)
            if ref is None:
                assert got is None, (seed, shrink)
                continue
            assert got.proven_optimal
            assert got.objective == pytest.approx(ref.objective, rel=1e-6, abs=1e-9), (seed, shrink)
            assert p.is_feasible(got.choices), (seed, shrink)
            assert got.objective == pytest.approx(p.objective(got.choices))
        infeasible += ref is None
        proved += ref is not None
    assert infeasible >= 5 and proved >= 80  # both paths were exercised


def test_shrinking_keeps_the_optimum_and_shrinks():
    """Shrinking is exact on the random problems, and actually removes variables."""
    shrunk = followed = 0
    for seed in range(200):
        p = random_problem(5000 + seed)
        red = p.reduce()
        followed += red.num_vars < p.reduce(follow_leader=False).num_vars
        full = p.reduce(merge_layers=False, follow_leader=False, prune=False)
        tied = {i for g in p.tie_classes if len(g) > 1 for i in g}
        # no shrinking: a variable per node, except single-strategy untied nodes (constants)
        assert full.num_vars == sum(len(n.strategies) > 1 or i in tied for i, n in enumerate(p.nodes))
        assert red.num_vars <= full.num_vars
        shrunk += red.size_after.strategies < p.size.strategies
        try:
            ref = brute_force(p)
        except MemoryLimitError:
            continue
        # the reduced problem's own objective of its best choice equals the optimum
        got = solve(p)
        assert got.objective == pytest.approx(ref.objective, rel=1e-6, abs=1e-9)
        assert got.size_after == red.size_after
    assert shrunk > 100 and followed >= 10  # the passes ran (pruning, follow-the-leader)


def _elementwise_chain(n_layers, *, memory_limit=None):
    """x -> (matmul -> gelu -> add) per layer; elementwise ops resharded at a price when they
    differ from their operand, tied across layers."""
    nodes, edges = [Node("x", [Strategy("batch", comm_s=0.0, memory_bytes=4),
                               Strategy("replicated", comm_s=0.0, memory_bytes=16)])], []
    prev = "x"
    lay = np.array([[0.0, 1.0], [0.2, 0.0]])
    for layer in range(n_layers):
        mm, act, add = f"mm{layer}", f"gelu{layer}", f"add{layer}"
        nodes += [
            Node(mm, [Strategy("dp", compute_s=1.0, comm_s=0.3, memory_bytes=64),
                      Strategy("tp", compute_s=1.0, comm_s=0.5, memory_bytes=16),
                      Strategy("replicated", compute_s=4.0, memory_bytes=64)],
                 layer_class="block", position="mm"),
            Node(act, [Strategy("batch", compute_s=0.1, memory_bytes=4),
                       Strategy("replicated", compute_s=0.4, memory_bytes=16)],
                 layer_class="block", position="gelu"),
            Node(add, [Strategy("batch", compute_s=0.1, memory_bytes=4),
                       Strategy("replicated", compute_s=0.4, memory_bytes=16)],
                 layer_class="block", position="add"),
        ]
        edges += [Edge(prev, mm, [[0.0, 0.6, 0.0], [0.1, 0.0, 0.0]]),
                  Edge(mm, act, [[0.0, 1.0], [0.0, 1.0], [0.2, 0.0]]),
                  Edge(act, add, lay), Edge(prev, add, lay)]
        prev = add
    return Problem(nodes, edges, memory_limit_bytes=memory_limit)


def test_repeated_layers_share_variables_and_followers_merge():
    p = _elementwise_chain(6)
    red = p.reduce()
    assert red.size_before.nodes == 19
    assert red.num_vars <= 2  # x and the block's leader; gelu/add follow
    sol, ref = solve(p), brute_force(p)
    assert sol.objective == pytest.approx(ref.objective)
    assert len({sol.strategies[f"mm{i}"] for i in range(6)}) == 1  # one plan for every block
    assert sol.size_after.nodes == red.num_vars and sol.size_before.nodes == 19
    noshrink = solve(p, shrink=False)
    assert noshrink.objective == pytest.approx(ref.objective)
    assert noshrink.size_after.nodes == 19


def test_follow_leader_without_ties_is_exact():
    """Follow-the-leader alone (no tags) merges gelu/add into their operands when dominated."""
    p = _elementwise_chain(3)
    untagged = Problem([Node(n.name, n.strategies) for n in p.nodes], p.edges)
    red = untagged.reduce(merge_layers=True, prune=False)
    assert red.num_vars < len(untagged.nodes)
    assert solve(untagged).objective == pytest.approx(brute_force(untagged).objective)


def test_memory_constraint_binds():
    free = solve(_elementwise_chain(3))
    assert free.strategies["mm0"] == "dp"  # fastest, but 64 bytes per layer
    need = free.memory_bytes
    tight = _elementwise_chain(3, memory_limit=need - 1)
    sol, ref = solve(tight), brute_force(tight)
    assert sol.memory_bytes <= need - 1
    assert sol.objective == pytest.approx(ref.objective)
    assert sol.objective > free.objective  # the limit costs time
    assert sol.strategies["mm0"] == "tp"


def _three_weights(limit):
    """Three weights, each replicated (fast, 100 bytes), split (10 bytes) or split further
    (1 byte, slowest), with resharding between unequal neighbours (not separable)."""
    nodes = [Node(f"w{i}", [Strategy("R", memory_bytes=100), Strategy("S", comm_s=1.0, memory_bytes=10),
                            Strategy("T", comm_s=3.0, memory_bytes=1)]) for i in range(3)]
    swap = [[0.0, 5.0, 5.0], [5.0, 0.0, 5.0], [5.0, 5.0, 0.0]]
    return Problem(nodes, [Edge("w0", "w1", swap), Edge("w1", "w2", swap)], memory_limit_bytes=limit)


def test_choices_no_plan_can_afford_are_dropped_before_the_solver():
    """With 50 bytes over the least (3), replicating any weight (99 more) fits no plan: shrinking
    drops R everywhere, and the optimum equals the brute force's. With room for every choice,
    memory no longer decides anything."""
    tight = _three_weights(53.0)
    assert tight.reduce(follow_leader=False).size_after.strategies == 6  # S and T of each weight
    assert tight.reduce(prune=False).size_after.strategies == 9
    sol, ref = solve(tight), brute_force(tight)
    assert sol.strategies == ref.strategies == {"w0": "S", "w1": "S", "w2": "S"}
    assert solve(_three_weights(1000.0)).strategies == {"w0": "R", "w1": "R", "w2": "R"}
    # every choice fits: the fast replicated one dominates the small one, as without a limit
    one = [Node("w", [Strategy("R", memory_bytes=100), Strategy("S", comm_s=1.0, memory_bytes=10)])]
    assert Problem(one, memory_limit_bytes=1000.0).reduce().num_vars == 0
    assert Problem(one, memory_limit_bytes=100.0).reduce().num_vars == 0
    assert Problem(one, memory_limit_bytes=99.0).reduce().num_vars == 0  # only S fits
    assert Problem(one, memory_limit_bytes=1000.0).reduce(prune=False).num_vars == 1


def test_memory_limit_nothing_fits_says_how_much_and_where():
    p = _elementwise_chain(2)
    least, shares = p.min_memory()
    bad = _elementwise_chain(2, memory_limit=least - 1)
    with pytest.raises(MemoryLimitError, match=r"least any choice needs is .*mm0 \(\+1 tied\)"):
        solve(bad)
    with pytest.raises(ValueError):  # MemoryLimitError is a ValueError
        brute_force(bad)
    assert shares[0][0] == "mm0 (+1 tied)" and least == pytest.approx(sum(s for _, s in shares))


def _big_random(seed, n=400, k=8):
    rng = np.random.default_rng(seed)
    nodes = [Node(f"v{i}", _strategies(rng, k)) for i in range(n)]
    edges = []
    for i in range(1, n):
        for src in {i - 1, int(rng.integers(0, i))}:
            edges.append(Edge(f"v{src}", f"v{i}", rng.uniform(0, 3, size=(k, k))))
    lo = sum(min(s.memory_bytes for s in nd.strategies) for nd in nodes)
    return Problem(nodes, edges, memory_limit_bytes=lo * 1.3)


def test_time_limit_returns_best_plan_not_proven():
    p = _big_random(0)
    with pytest.warns(SolverTimeLimitWarning, match="not proven optimal"):
        sol = solve(p, time_limit_s=0.05)
    assert not sol.proven_optimal
    assert p.is_feasible(sol.choices)
    assert sol.objective <= greedy(p).objective + 1e-9  # at least as good as its warm start
    assert sol.objective == pytest.approx(p.objective(sol.choices))


def test_progress_bar_follows_the_optimality_gap(monkeypatch):
    """solve's progress bar counts the share of HiGHS's first optimality gap closed: it only
    grows, stays within 0..100, and reaches 100 when the optimum is proven."""
    seen = []

    class Recording(progress.bar):
        def advance(self, steps=1):
            super().advance(steps)
            seen.append(self.completed)

    monkeypatch.setattr(ilp_module.progress, "bar", Recording)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeLimitWarning)
        sol = solve(_big_random(1, n=60), time_limit_s=5.0, progress_bar=False)
    assert len(seen) >= 2 and seen == sorted(seen) and 0 < seen[0] < 100 and seen[-1] <= 100 + 1e-9  # gap reports, then done
    if sol.proven_optimal:
        assert seen[-1] == pytest.approx(100)


def test_greedy_is_feasible_and_never_better_than_optimal():
    for seed in range(40):
        p = random_problem(9000 + seed)
        try:
            ref = brute_force(p)
        except MemoryLimitError:
            continue
        g = greedy(p)
        assert p.is_feasible(g.choices) and not g.proven_optimal
        assert g.objective >= ref.objective - 1e-9


def test_solution_breakdown_adds_up():
    p = _elementwise_chain(2)
    s = solve(p)
    assert s.objective == pytest.approx(s.compute_s + s.comm_s + s.reshard_s)
    b = p.breakdown(s.choices)
    assert (b["compute_s"], b["comm_s"], b["reshard_s"]) == pytest.approx((s.compute_s, s.comm_s, s.reshard_s))
    assert "proven optimal" in s.summary() and s.solve_seconds > 0


# -- bad input ------------------------------------------------------------------------------------

def test_bad_problems_name_the_fault():
    a = Node("a", [Strategy("R"), Strategy("S")])
    b = Node("b", [Strategy("R")])
    with pytest.raises(ValueError, match=r"reshard_s has shape \(1, 2\), expected \(2, 1\)"):
        Problem([a, b], [Edge("a", "b", [[0.0, 1.0]])])
    with pytest.raises(ValueError, match="unknown node 'c'"):
        Problem([a, b], [Edge("a", "c", [[0.0], [1.0]])])
    with pytest.raises(ValueError, match="non-negative"):
        Problem([a, b], [Edge("a", "b", [[0.0], [-1.0]])])
    with pytest.raises(ValueError, match="node 'x' compute_s: costs must be non-negative"):
        Problem([Node("x", [Strategy("R", compute_s=-1.0)])])
    with pytest.raises(ValueError, match="finite"):
        Problem([Node("x", [Strategy("R", comm_s=float("nan"))])])
    with pytest.raises(ValueError, match="duplicate node name 'a'"):
        Problem([a, a])
    with pytest.raises(ValueError, match="has no strategies"):
        Problem([Node("x", [])])
    with pytest.raises(ValueError, match="follows='zz' is not a node"):
        Problem([Node("x", [Strategy("R")], follows="zz")])
    with pytest.raises(ValueError, match="'b' has 1 strategies and 'a' has 2"):
        Problem([a, Node("b", [Strategy("R")], follows="a")])
    with pytest.raises(ValueError, match="give both layer_class and position"):
        Problem([Node("x", [Strategy("R")], layer_class="block")])
    with pytest.raises(ValueError, match="cannot feed itself"):
        Problem([a], [Edge("a", "a", np.zeros((2, 2)))])
    with pytest.raises(ValueError, match="memory_limit_bytes must be >= 0"):
        Problem([a], memory_limit_bytes=-1)
    with pytest.raises(ValueError, match="node 'a' has 2 strategies, got 5"):
        Problem([a]).objective({"a": 5})
