"""shardlab.autoshard's inter-op layer: Alpa's stage DP against exhaustive search on random cost
tables, the device cover, fixed stage counts and bad input; and a pipeline plan of the model
library's stages executed in the layouts the stage DP chose (ledger per stage and micro-batch,
loss and gradients against the unpipelined step)."""

import numpy as np
import pytest

import shardlab as sl
from shardlab.autoshard import brute_force_stages, model, plan_pipeline, plan_stages, submesh_choices
from shardlab.models import ModelConfig
from shardlab.train import pipeline as pp


def random_costs(seed, num_layers, shapes, *, refuse=0.2):
    """A random table of stage times: roughly work / devices plus noise; some entries refused
    for memory (more often on small sub-meshes and long stages)."""
    rng = np.random.default_rng(seed)
    table = {}
    for k in range(num_layers):
        for i in range(k + 1, num_layers + 1):
            for s in shapes:
                n = s[0] * s[1]
                t = float((i - k) * rng.uniform(0.5, 1.5) / n ** rng.uniform(0.6, 1.0) + rng.uniform(0, 0.3))
                ok = bool(rng.uniform() > refuse * (i - k) / n)
                table[(k, i, tuple(s))] = (t, ok)
    calls = []

    def cost(k, i, shape):
        calls.append((k, i, shape))
        return table[(k, i, tuple(shape))]

    cost.calls = calls
    return cost


def _check_plan(plan, num_layers, mesh_shape, cost, B):
    stages = plan.stages
    assert stages[0].layer_start == 0 and stages[-1].layer_end == num_layers
    assert all(a.layer_end == b.layer_start for a, b in zip(stages, stages[1:]))
    assert sum(s.submesh_shape[0] * s.submesh_shape[1] for s in stages) == mesh_shape[0] * mesh_shape[1]
    times = []
    for s in stages:
        t, ok = cost(s.layer_start, s.layer_end, s.submesh_shape)
        assert ok and s.seconds == t
        times.append(t)
    assert plan.latency_s == pytest.approx(sum(times) + (B - 1) * max(times))


def test_dp_equals_brute_force_on_random_tables():
    cases = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        mesh = [(1, 4), (2, 2), (2, 4), (1, 8), (3, 2)][seed % 5]
        shapes = submesh_choices(mesh)
        L = int(rng.integers(1, 6))
        B = int(rng.integers(1, 9))
        num_stages = None if seed % 3 else int(rng.integers(1, min(L, 3) + 1))
        cost = random_costs(seed, L, shapes)
        try:
            ref = brute_force_stages(L, mesh, cost, num_microbatches=B, num_stages=num_stages)
        except ValueError:
            with pytest.raises(ValueError, match="no feasible slicing"):
                plan_stages(L, mesh, cost, num_microbatches=B, num_stages=num_stages)
            continue
        got = plan_stages(L, mesh, cost, num_microbatches=B, num_stages=num_stages)
        assert got.latency_s == pytest.approx(ref.latency_s, rel=1e-12), seed
        _check_plan(got, L, mesh, cost, B)
        if num_stages is not None:
            assert len(got.stages) == num_stages
        cases += 1
    assert cases >= 40


def test_custom_submesh_shapes_and_placement():
    shapes = [(1, 1), (1, 3), (2, 3), (1, 2)]
    for seed in range(15):
        cost = random_costs(100 + seed, 4, shapes, refuse=0.0)
        ref = brute_force_stages(4, (2, 3), cost, num_microbatches=4, submesh_shapes=shapes)
        got = plan_stages(4, (2, 3), cost, num_microbatches=4, submesh_shapes=shapes)
        assert got.latency_s == pytest.approx(ref.latency_s, rel=1e-12)
        _check_plan(got, 4, (2, 3), cost, 4)


def test_each_stage_gets_its_own_devices():
    def cost(k, i, shape):  # compute splits over devices, a fixed collective overhead per device
        n = shape[0] * shape[1]
        return (i - k) / n + 0.05 * (n - 1), True

    plan = plan_stages(8, (2, 4), cost, num_microbatches=16)
    taken = set()
    for s in plan.stages:
        assert s.hosts is not None and (len(s.hosts), len(s.devices)) == s.submesh_shape
        cells = {(h, d) for h in s.hosts for d in s.devices}
        assert not cells & taken
        taken |= cells
    assert taken == {(h, d) for h in range(2) for d in range(4)}
    assert len(plan.stages) > 1  # with 16 micro-batches pipelining pays
    assert "latency" in plan.summary() and f"{len(plan.stages)} stages" in plan.summary()


def test_one_microbatch_prefers_no_pipeline_when_compute_scales():
    plan = plan_stages(6, (1, 8), lambda k, i, s: ((i - k) / (s[0] * s[1]), True), num_microbatches=1)
    # B = 1: latency is the sum of stage times; one stage on all devices is as good as any
    assert plan.latency_s == pytest.approx(6 / 8)


def test_stage_cost_called_once_per_candidate():
    shapes = submesh_choices((2, 4))
    cost = random_costs(7, 5, shapes, refuse=0.0)
    plan_stages(5, (2, 4), cost, num_microbatches=4)
    assert len(cost.calls) == len(set(cost.calls)) == 5 * 6 // 2 * len(shapes)


def test_submesh_choices_are_alphas():
    assert submesh_choices((4, 8)) == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8), (4, 8)]
    assert submesh_choices((4, 8), "power_of_two") == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]
    assert submesh_choices((8,)) == [(1, 1), (1, 2), (1, 4), (1, 8)]
    with pytest.raises(ValueError, match="6 devices per host is not a power of two"):
        submesh_choices((2, 6))


# -- bad input ------------------------------------------------------------------------------------

def _ok(k, i, s):
    return float(i - k), True


def test_mesh_too_small_for_the_stages():
    with pytest.raises(ValueError, match=r"1x2 mesh \(2 devices\) is too small for 3 stages"):
        plan_stages(4, (1, 2), _ok, num_microbatches=2, num_stages=3)
    with pytest.raises(ValueError, match="cannot cut 2 layers into 3 stages"):
        plan_stages(2, (1, 8), _ok, num_microbatches=2, num_stages=3)


def test_no_feasible_slicing():
    with pytest.raises(ValueError, match=r"no feasible slicing of 3 layers .*refused 18 of the 18 "):
        plan_stages(3, (1, 4), lambda k, i, s: (1.0, False), num_microbatches=2)
    # only 1-device sub-meshes fit memory, but 2 layers cannot cover 4 devices
    with pytest.raises(ValueError, match="cannot cover all 4 devices"):
        plan_stages(2, (1, 4), lambda k, i, s: (1.0, s == (1, 1)), num_microbatches=2)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"sub-mesh \(1, 8\) does not fit the 1x4 mesh"):
        plan_stages(2, (1, 4), _ok, num_microbatches=1, submesh_shapes=[(1, 8)])
    with pytest.raises(ValueError, match="num_microbatches must be a positive integer"):
        plan_stages(2, (1, 4), _ok, num_microbatches=0)
    with pytest.raises(ValueError, match="num_layers must be a positive integer"):
        plan_stages(0, (1, 4), _ok, num_microbatches=1)
    with pytest.raises(ValueError, match="mesh_shape must be"):
        plan_stages(2, (0, 4), _ok, num_microbatches=1)
    with pytest.raises(TypeError, match=r"must return \(seconds, memory_ok\)"):
        plan_stages(2, (1, 1), lambda k, i, s: 1.0, num_microbatches=1)
    with pytest.raises(ValueError, match="stage times must be >= 0"):
        plan_stages(2, (1, 1), lambda k, i, s: (-1.0, True), num_microbatches=1)


# -- a pipeline plan runs its stages' layouts -----------------------------------------------------------

CFG = ModelConfig(num_layers=2, d_model=16, ffw_dim=32, num_heads=4, num_kv_heads=2, vocab_size=32)
BATCH, SEQ, MICRO = 8, 4, 2
COMMON = dict(hardware="tpu-v5p", num_microbatches=MICRO, num_stages=2, submesh_shapes=[(1, 2)])


@pytest.fixture(scope="module")
def pipelines():
    """Two stages of one layer on the rows of a 2x2 mesh: planned freely, and under 60% of the
    free plan's memory, which the replicated (or data-parallel) weights no longer fit."""
    pytest.importorskip("highspy")
    program = model.stage_program(CFG, BATCH // MICRO, SEQ)
    free = plan_pipeline(program, 2, (2, 2), **COMMON)
    need = max(free.plan_of(s).solution.memory_bytes for s in free.stages.stages)
    tight = plan_pipeline(program, 2, (2, 2), **COMMON, memory_limit_bytes=0.6 * need, time_limit_s=60)
    return free, tight, model.example_args(CFG, BATCH, SEQ)


def test_pipeline_runs_the_layouts_the_stage_dp_chose(pipelines):
    free, tight, args = pipelines
    limit = 0.6 * max(free.plan_of(s).solution.memory_bytes for s in free.stages.stages)
    plans = [tight.plan_of(s) for s in tight.stages.stages]
    for st, p in zip(tight.stages.stages, plans):  # not data parallel: some weights split over the row
        assert any(v != sl.P() for k, v in p.specs.items() if k.startswith("[0]"))
        assert p.solution.memory_bytes <= limit < free.plan_of(st).solution.memory_bytes
    res = tight.check(CFG, *args, rtol=1e-5)
    run = res["execution"]
    ref_loss, _ = pp.reference_step(*args, CFG)
    assert res["loss"] == pytest.approx(float(ref_loss), rel=1e-6) and res["max_rel_err"] <= 1e-5
    for s, (st, p) in enumerate(zip(tight.stages.stages, plans)):
        want = [c.key() for c in p.collectives]
        assert want and all(a == ("devices",) for _, a, _ in want)
        for k in range(MICRO):  # each micro-batch runs the stage plan's collectives, in order
            assert run.collectives(s, k) == want
            assert all(e["group_size"] == 2 for kind in ("forward", "backward") for e in run.events[(s, k, kind)]
                       if e["axes"])
        # on the stage's own row of the mesh
        ids = [d.id for d in np.ravel(run.meshes[s].devices)]
        assert ids == [h * 2 + d for h in st.hosts for d in st.devices] == [2 * s, 2 * s + 1]
    assert run.bytes_sent == pytest.approx(MICRO * sum(c.bytes_sent for p in plans for c in p.collectives))
    # the sends: one ppermute over the whole mesh per micro-batch and direction, the activation
    # [4, 4, 16] float32 as stage 0 holds it, then the receiver's resharding
    act = 4 * 4 * 16 * 4 / (2 if plans[0].value_spec(f"%{plans[0].program.outputs[0][1]}") != sl.P() else 1)
    for k in range(MICRO):
        moved = [(e["op"], e["axes"], e["bytes_sent"]) for e in run.events[(0, k, "send activation")] if e["axes"]]
        assert moved[0] == ("ppermute", ("hosts", "devices"), act)
        back = [e for e in run.events[(1, k, "send gradient")] if e["axes"]]
        assert back[0]["op"] == "ppermute" and back[0]["perm"] == ((2, 0), (3, 1))


def test_free_pipeline_runs_with_an_empty_ledger_and_matches(pipelines):
    free, tight, args = pipelines
    assert all(not free.plan_of(s).collectives for s in free.stages.stages)  # replicated stages
    res = free.check(CFG, *args, rtol=1e-5)
    assert res["execution"].bytes_sent == 0.0 and res["max_rel_err"] <= 1e-5
    assert res["loss"] == pytest.approx(tight.check(CFG, *args, rtol=1e-5)["loss"], rel=1e-6)


def test_pipeline_check_catches_a_wrong_ledger(pipelines):
    _, tight, args = pipelines
    run = tight.execute(CFG, *args)
    run.events[(1, 0, "backward")] = run.events[(1, 0, "backward")][:-1]
    with pytest.raises(AssertionError, match="stage 1, micro-batch 0: ledger"):
        run.check_ledger()
    run = tight.execute(CFG, *args)
    run.events[(0, 1, "send activation")] = []
    with pytest.raises(AssertionError, match="stage 0, micro-batch 1, send activation: ledger"):
        run.check_ledger()


def test_pipeline_run_bad_input(pipelines):
    free, _, (params, tok, tgt) = pipelines
    with pytest.raises(ValueError, match="batch a multiple of the 2 micro-batches"):
        free.check(CFG, params, tok[:7], tgt[:7])
    with pytest.raises(ValueError, match=r"model.stage_program\(cfg, 2, 4\)"):
        free.check(CFG, params, tok[:4], tgt[:4])  # the plan was made for micro-batches of 4
