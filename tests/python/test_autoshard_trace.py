"""shardlab.autoshard on traced programs: the plan found for a global-view function runs on the
virtual devices with outputs equal to the unsharded program and a ledger equal to the plan's
predicted collectives; the ILP equals brute force on a traced program; bad input is named."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp

pytest.importorskip("highspy")

from shardlab.autoshard import MemoryLimitError, UntraceableError, autoshard, brute_force, examples, solve  # noqa: E402
from shardlab.autoshard import trace_program  # noqa: E402


def _mlp(x, w1, w2):
    return jnp.sum(jnp.tanh(x @ w1) @ w2)


def _args(b=256, d=64, f=128, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) / np.sqrt(s[0]) for s in [(b, d), (d, f), (f, d)]]


def test_mlp_gradient_plan_runs_equal_and_ledger_matches_prediction():
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    args = _args()
    g = sl.grad(_mlp, argnums=(1, 2))
    # replicated params + activations need more than this: the search must shard
    plan = autoshard(g, *args, mesh=mesh, memory_limit_bytes=90_000)
    assert plan.solution.proven_optimal and plan.solution.memory_bytes <= 90_000
    assert any(s != sl.P() for s in plan.in_specs)
    res = plan.check(*args, rtol=1e-5)
    assert res["max_rel_err"] <= 1e-5
    assert len(plan.collectives) == len([e for e in res["ledger"].events if e["axes"]]) > 0
    # every value has a spec; the params' are PartitionSpecs of their rank
    assert set(plan.specs) >= {"[0]", "[1]", "[2]"}
    assert all(isinstance(s, sl.PartitionSpec) for s in plan.in_specs)


def test_tight_memory_limit_names_the_least_and_the_largest_nodes():
    mesh = sl.make_mesh((2,), ("x",), hardware="tpu-v5p")
    with pytest.raises(MemoryLimitError, match="least any choice needs"):
        autoshard(sl.grad(_mlp, argnums=(1, 2)), *_args(), mesh=mesh, memory_limit_bytes=1000)


def test_ilp_equals_brute_force_on_a_traced_program():
    mesh = sl.make_mesh((2,), ("x",), hardware="tpu-v5p")
    args = _args(b=64, d=32, f=64)
    prog = trace_program(lambda x, w1, w2: jnp.tanh(x @ w1) @ w2, *args, mesh=mesh, memory_limit_bytes=40_000)
    ilp, brute = solve(prog.problem), brute_force(prog.problem)
    assert ilp.proven_optimal
    assert ilp.objective == pytest.approx(brute.objective, rel=1e-9)
    assert ilp.memory_bytes <= 40_000 and brute.memory_bytes <= 40_000


def test_repeated_layers_share_decisions_and_the_step_matches():
    mesh = sl.make_mesh((2,), ("x",), hardware="tpu-v5p")
    params, x = examples.init(layers=3, batch=4, seq=4, d_model=8, heads=2, head_dim=4, ffw=16)
    plan = autoshard(examples.train_step, params, x, mesh=mesh)
    size, after = plan.program.problem.size, plan.solution.size_after
    assert after.nodes < size.nodes / 3
    tied = plan.program.problem.tie_classes
    assert max(len(c) for c in tied) >= 3  # one op in each of the 3 blocks
    plan.check(params, x, rtol=1e-5)
    # the updated parameters come back in the layer structure
    out, _ = plan.run(params, x)
    assert len(out[1]) == 3 and set(out[1][0]) == set(params[0])


def test_abstract_mesh_plans_and_lowers_with_the_predicted_collectives():
    mesh = sl.make_mesh((16, 16), ("x", "y"), hardware="tpu-v5p", abstract=True)
    x = sl.ShapeDtypeStruct((8192, 4096), np.float32)
    w = sl.ShapeDtypeStruct((4096, 4096), np.float32)
    plan = autoshard(lambda x, w: jnp.tanh(x @ w), x, w, mesh=mesh, memory_limit_bytes=2**20)
    events = [e.event.as_dict() for e in plan.lower().compiler_ir().eqns if e.event is not None]
    seen = [(e["op"], tuple(e["axes"]), float(e["bytes_sent"])) for e in events if e["axes"]]
    assert seen == [c.key() for c in plan.collectives]
    with pytest.raises(ValueError, match="abstract"):
        plan.run(np.ones((8192, 4096), np.float32), np.ones((4096, 4096), np.float32))


def test_untraceable_function_names_the_primitive():
    mesh = sl.make_mesh((2,), ("x",), hardware="tpu-v5p")
    with pytest.raises(UntraceableError, match="cumsum"):
        autoshard(lambda x: jnp.cumsum(x, axis=0), np.ones((8, 4), np.float32), mesh=mesh)


def test_mesh_without_hardware_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="hardware="):
        autoshard(lambda x: x * 2.0, np.ones((8, 4), np.float32), mesh=sl.make_mesh((2,), ("x",)))
