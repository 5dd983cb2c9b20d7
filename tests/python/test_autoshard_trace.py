"""shardlab.autoshard on traced programs: the plan found for a global-view function runs on the
virtual devices with outputs equal to the unsharded program and a ledger equal to the plan's
predicted collectives; the ILP equals brute force on a traced program; bad input is named."""

import numpy as np
import pytest

import shardlab as sl
import shardlab.numpy as jnp
from shardlab.models import ModelConfig, transformer

pytest.importorskip("highspy")

from shardlab.autoshard import (MemoryLimitError, SolverTimeLimitWarning, UntraceableError, autoshard,  # noqa: E402
                                brute_force, examples, solve)
from shardlab.autoshard import book, compare, explain, plan_pipeline, trace_program  # noqa: E402
from shardlab.autoshard.specs import pspec  # noqa: E402


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
    # the public view of the choice: each argument's layout is its spec, each op run has a candidate
    prog = plan.program
    for i in prog.inputs:
        v = prog.values[i]
        assert len(plan.dims(i)) == len(v.shape)
        assert pspec(plan.dims(i)) == plan.specs[v.name]
    assert plan.ops and [op.index for op in plan.ops] == sorted(op.index for op in plan.ops)
    assert all(plan.dims(op.output) and plan.layout(op.output) for op in plan.ops)
    with pytest.raises(IndexError, match=r"\[ShardingPlan.dims\] value index 100000 is not one of the program's"):
        plan.dims(100_000)


def _sgd(params, x):
    loss, grads = sl.value_and_grad(lambda ps: _mlp(x, *ps))(params)
    return loss, tuple(w - 0.1 * g for w, g in zip(params, grads))


def test_carried_results_come_back_in_their_arguments_layout_and_the_move_is_priced():
    """A training step's new weights are the next step's weights: with carry= each is returned in
    its argument's layout, the run's ledger holds the resharding the plan predicted, and the
    estimate is never below the plan that may leave them anywhere."""
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    x, w1, w2 = _args()
    limit = 120_000
    free = autoshard(_sgd, (w1, w2), x, mesh=mesh, memory_limit_bytes=limit)
    plan = autoshard(_sgd, (w1, w2), x, mesh=mesh, memory_limit_bytes=limit, carry=[(1, 0)], pricer=free.program.pricer)
    assert plan.solution.proven_optimal and len(plan.program.carry) == 2
    assert plan.estimate_s >= free.estimate_s * (1 - 1e-9)
    res = plan.check((w1, w2), x, rtol=1e-5)  # outputs equal the unsharded step, ledger equals the prediction
    new_params = res["outputs"][1]
    def trimmed(spec):
        e = list(spec)
        while e and e[-1] is None:
            e.pop()
        return tuple(e)

    assert [trimmed(a.sharding.spec) for a in new_params] == [trimmed(s) for s in plan.in_specs[0]]
    assert any(s != sl.P() for s in plan.in_specs[0])  # the limit makes the step shard its weights
    # the edge the carry adds is what the plan pays: pricing the found choice by hand agrees
    assert plan.program.problem.objective(plan.solution.choices) == pytest.approx(plan.estimate_s)
    # without a limit the free plan updates whole weights into split ones (cheaper this step,
    # not a step the next one can start from); carrying them costs more
    free = autoshard(_sgd, (w1, w2), x, mesh=mesh)
    plan = autoshard(_sgd, (w1, w2), x, mesh=mesh, carry=[(1, 0)], pricer=free.program.pricer)
    new_specs = [free.specs[plan.program.values[vo].name] for _, vo, _ in plan.program.carry]
    assert free.in_specs[0] == (sl.P(), sl.P()) and any(s != sl.P() for s in new_specs)
    assert plan.estimate_s > free.estimate_s
    plan.check((w1, w2), x, rtol=1e-5)
    with pytest.raises(ValueError, match=r"carry pair \(0, 0\): result 0 has leaves of shapes \[\(\)\]"):
        autoshard(_sgd, (w1, w2), x, mesh=mesh, carry=[(0, 0)])
    with pytest.raises(ValueError, match="returns 2 results and takes 2 arguments"):
        autoshard(_sgd, (w1, w2), x, mesh=mesh, carry=[(2, 0)])


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


def test_solver_time_out_returns_the_best_plan_found_which_runs():
    """A time limit too short for HiGHS: the plan returned is the best found (at worst the greedy
    one), flagged not proven optimal with a warning that says so, within the memory limit, and
    it runs with outputs equal to the unsharded step and the predicted ledger."""
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    params, x = examples.init(layers=1, batch=8, seq=4, d_model=16, heads=4, head_dim=4, ffw=32)
    prog = trace_program(examples.train_step, params, x, mesh=mesh)
    limit = 1.2 * prog.problem.min_memory()[0]  # tight: most layouts do not fit
    with pytest.warns(SolverTimeLimitWarning, match="not proven optimal. Raise time_limit_s"):
        plan = autoshard(examples.train_step, params, x, mesh=mesh, memory_limit_bytes=limit, time_limit_s=1e-4,
                         pricer=prog.pricer)
    assert not plan.solution.proven_optimal and plan.solution.size_after.nodes > 0
    assert plan.solution.memory_bytes <= limit and "NOT proven optimal" in plan.summary()
    plan.check(params, x, rtol=1e-4)


def test_untraceable_function_names_the_primitive():
    mesh = sl.make_mesh((2,), ("x",), hardware="tpu-v5p")
    with pytest.raises(UntraceableError, match="cumsum"):
        autoshard(lambda x: jnp.cumsum(x, axis=0), np.ones((8, 4), np.float32), mesh=mesh)


def test_mesh_without_hardware_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="hardware="):
        autoshard(lambda x: x * 2.0, np.ones((8, 4), np.float32), mesh=sl.make_mesh((2,), ("x",)))


def test_explain_lists_each_argument_with_costlier_or_infeasible_alternatives():
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    plan = autoshard(sl.grad(_mlp, argnums=(1, 2)), *_args(), mesh=mesh, memory_limit_bytes=90_000)
    ex = explain(plan)
    assert [r.name for r in ex.rows] == ["[0]", "[1]", "[2]"]
    for r in ex.rows:
        assert r.chosen == plan.specs[r.name] and r.seconds == pytest.approx(plan.estimate_s)
        assert r.rejected and all(a.spec != r.chosen for a in r.rejected)
        # the plan is optimal: no feasible alternative is cheaper
        assert all(a.seconds >= r.seconds * (1 - 1e-9) for a in r.rejected if a.fits)
    assert "cheapest rejected" in ex.table() and "<table>" in ex._repr_html_()


def test_compare_runs_every_strategy_and_the_free_plan_is_no_slower():
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p")
    params, x = examples.init(layers=1, batch=8, seq=4, d_model=16, heads=4, head_dim=4, ffw=32)
    hand = examples.strategies(params)
    assert set(hand) == {"dp", "fsdp", "tp", "fsdp_tp"}
    c = compare(examples.train_step, params, x, mesh=mesh, strategies={k: hand[k] for k in ("dp", "fsdp_tp")},
                rtol=1e-5)
    names = [r.name for r in c.rows]
    assert names == ["autoshard", "dp", "fsdp_tp"]
    assert all(r.ran and r.max_rel_err <= 1e-5 for r in c.rows)
    free = c.rows[0].plan.estimate_s
    assert all(free <= r.plan.estimate_s * (1 + 1e-9) for r in c.rows[1:])
    assert c.best().plan.estimate_s == pytest.approx(free)
    # the hand-written layouts were imposed
    assert c.rows[2].plan.specs["[0][0]['w1']"] == sl.P("x", "y")
    assert c.rows[1].plan.specs["[1]"] == sl.P(("x", "y"))
    assert "fsdp_tp" in c.table()


def test_stage_dp_with_intra_op_costs_gives_a_schedule_that_runs():
    def stage(k):
        return examples.train_step, examples.abstract(k, 4, 16, 32, 4, 8, 64)

    pl = plan_pipeline(stage, 4, (2, 2), hardware="tpu-v5p", num_microbatches=4, num_stages=2,
                       submesh_shapes=[(1, 2)])
    assert [(s.layer_start, s.layer_end) for s in pl.stages.stages] == [(0, 2), (2, 4)]
    assert pl.schedule.p == 2 and pl.schedule.m == 4
    t = pl.stages.stages[0].seconds
    assert t == pytest.approx(pl.stage_plans[(2, (1, 2))].estimate_s)
    assert pl.stages.latency_s == pytest.approx(2 * t + 3 * t)
    cfg = ModelConfig(num_layers=4, d_model=32, ffw_dim=64, num_heads=4, num_kv_heads=4, vocab_size=64)
    rng = np.random.default_rng(0)
    tok, tgt = rng.integers(0, 64, (8, 8)), rng.integers(0, 64, (8, 8))
    ex = pl.execute(cfg, transformer.init_params(cfg, seed=0), tok, tgt)  # checks loss and grads
    assert np.isfinite(ex.loss)


def test_book_part5_llama13b_on_the_v5p_cube_beats_the_nearest_fsdp_tp():
    """All 40 of LLaMA-2 13B's MLP blocks with Adam on the v5p 16x16x16 cube under 96 GB per chip
    (abstract, seconds): pure DP does not fit, FSDP over all 4096 chips cannot split D = 5120,
    and the search finds a plan below the book's FSDP + TP at the cube's nearest X to X_opt
    (256 x 16): data parallel over all 4096 chips with the weights whole and the Adam moments
    (256 x 16): data parallel over all 4096 chips with the Adam moments split 4096 ways (ZeRO-1:
    gradients reduce-scattered, updated weights all-gathered), no activation all-reduce."""
    assert book.part5_x_opt() == pytest.approx(1365.33, rel=1e-3)  # the book rounds 3e6 tokens: 1333
    c = book.part5()
    rows = {r.name: r for r in c.rows}
    assert rows["dp"].plan is None and "memory limit" in rows["dp"].error
    assert rows["fsdp (X=4096)"].plan is None and "cannot shard" in rows["fsdp (X=4096)"].error
    free, fsdp_tp = rows["autoshard"].plan, rows["fsdp_tp (X=256, Y=16)"].plan
    assert len(free.program.problem.nodes) > 40 * 3 * 10  # every layer traced, not a sample
    assert free.solution.proven_optimal and fsdp_tp.solution.proven_optimal
    assert free.estimate_s < fsdp_tp.estimate_s
    assert 0.3 < free.estimate_s < 0.45  # the book: ~300 ms at 40% MFU for FSDP + TP at X_opt
    assert free.solution.memory_bytes <= book.HBM_BYTES
    assert fsdp_tp.specs["[0][0][0]"] == sl.P(("x", "y"), "z")
    # the new weights and moments are carried: each comes back in its argument's layout, priced
    assert len(free.program.carry) == 3 * 3 * 40
    assert {c.op for c in free.collectives} == {"psum_scatter", "all_gather", "psum"}
    assert not any(c.op == "psum" and c.bytes_sent > 1e3 for c in free.collectives)  # no activation all-reduce
    assert any(c.op == "psum" and c.bytes_sent > 1e8 for c in fsdp_tp.collectives)  # TP's

    def axes(spec):
        return tuple(a for e in spec if e for a in ((e,) if isinstance(e, str) else e))

    # the found plan: the batch over all 4096 chips, every Adam moment split 4096 ways, the same layouts in every layer
    assert free.specs["[3]"] == sl.P(("x", "y", "z"))
    assert all(len(axes(free.specs[f"[{s}][{layer}][{k}]"])) == 3
               for s in (1, 2) for layer in range(40) for k in range(3))
    # the weights whole (ZeRO-1: the updated weights are all-gathered once a step), but for the first
    # layer's, split to fit the 96 GB (that layer differs from the others: its input is the batch)
    assert all(free.specs[f"[0][{layer}][{k}]"] == sl.P() for layer in range(1, 40) for k in range(3))
    assert any(free.specs[f"[0][0][{k}]"] != sl.P() for k in range(3))
    assert "autoshard" in c.table() and c.best().name == "autoshard"


def test_book_part5_at_x_opt_lands_on_the_books_x_and_y_and_gathers_weights_once():
    """The same chips as a 1024 x 4 mesh, all 40 layers: the book's FSDP + TP (X=1024, Y=4) is
    priced, and the free plan takes the book's split (batch over the 1024, F over the 4-way model
    axis) with the weights whole over the data axis and the moments split there (ZeRO-1): one
    all-gather of each weight per step where FSDP gathers before the forward and the backward."""
    c = book.part5_at_x_opt()
    rows = {r.name: r for r in c.rows}
    free, book_plan = rows["autoshard"].plan, rows["fsdp_tp (X=1024, Y=4)"].plan
    assert free.solution.proven_optimal and book_plan.solution.proven_optimal
    assert free.estimate_s < book_plan.estimate_s < 0.45
    assert 0.25 < free.estimate_s < 0.35  # the book: ~300 ms a step
    assert book_plan.specs["[0][5][0]"] == sl.P("data", "model")
    assert free.specs["[3]"] == sl.P("data")
    for layer in range(40):
        assert free.specs[f"[0][{layer}][0]"] == free.specs[f"[0][{layer}][1]"] == sl.P(None, "model")
        assert free.specs[f"[0][{layer}][2]"] == sl.P("model")
        assert "data" in free.specs[f"[1][{layer}][0]"] and "data" in free.specs[f"[2][{layer}][2]"]

    def gathers(plan):
        return sum(c.op == "all_gather" and c.axes == ("data",) for c in plan.collectives)

    assert gathers(free) == 3 * 40 and gathers(book_plan) == 2 * 3 * 40 - 2  # the last layer's w_out: once


def test_a_reused_pricer_reuses_the_recorded_program():
    """As jit caches a trace by function and argument types, a pricer passed to another plan of
    the same function on arguments of the same shapes reuses the recorded program (compare
    imposes each hand-written strategy this way); other shapes are recorded anew."""
    mesh = sl.make_mesh((2, 2), ("x", "y"), hardware="tpu-v5p", abstract=True)
    args = [sl.ShapeDtypeStruct(s, np.float32) for s in [(64, 32), (32, 16), (16, 32)]]
    first = trace_program(_mlp, *args, mesh=mesh)
    again = trace_program(_mlp, *args, mesh=mesh, in_specs=(sl.P("x"), None, None), pricer=first.pricer)
    assert again.pricer is first.pricer and len(first.pricer._records) == 1
    assert [op.prim for op in again.ops] == [op.prim for op in first.ops]
    assert again.input_dims[again.inputs[0]] == [(("x",), ())]
    other = [sl.ShapeDtypeStruct(s, np.float32) for s in [(128, 32), (32, 16), (16, 32)]]
    third = trace_program(_mlp, *other, mesh=mesh, pricer=first.pricer)
    assert len(first.pricer._records) == 2 and third.values[third.inputs[0]].shape == (128, 32)