"""A process forked after the core ran its OpenMP kernels (multiprocessing's default on Linux)
can still run them: GEMM, a collective, a fused kernel. Without the core's fork handler the
child waits forever for the parent's OpenMP threads."""

import multiprocessing as mp

import numpy as np

import shardlab as sl
import shardlab.nn as snn
from shardlab import P
from shardlab.kernels import gemm


def _child(_):
    a = np.ones((256, 256), np.float32)
    mesh = sl.make_mesh((8,), ("x",))
    x = sl.device_put(np.ones((8, 1 << 16), np.float32), sl.NamedSharding(mesh, P("x")))
    total = sl.shard_map(lambda v: sl.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())(x)
    act = sl.shard_map(snn.silu, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    return float(gemm(a, a)[0, 0]), float(np.asarray(total)[0, 0]), float(np.asarray(act)[0, 0])


def test_a_forked_child_runs_the_openmp_kernels():
    _child(0)  # the parent's OpenMP threads exist now
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_child, (0,)).get(timeout=120)
    assert got == (256.0, 8.0, float(np.float32(1.0) / (1 + np.exp(np.float32(-1.0)))))
    assert _child(0)[0] == 256.0  # and the parent keeps all its threads
