"""The MPI backend seen from one process: optional import, rank grids and their errors, and
faults under a real mpirun (skipped where mpirun or mpi4py is missing; the values and ledgers
across ranks are tests/mpi's, run by `make test` under mpirun -n 2 and -n 4)."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import shardlab as sl
from shardlab._src.backends.mpi.placement import rank_grid
from shardlab._src.backends.mpi.storage import assemble


def test_import_shardlab_does_not_load_mpi4py():
    code = "import sys, shardlab; print('mpi4py' in sys.modules, shardlab.process_count())"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["False", "1"], out.stderr


def test_under_mpirun_without_mpi4py_each_rank_runs_alone_with_a_warning():
    code = ("import sys, warnings; sys.modules['mpi4py'] = None; warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    import shardlab\n"
            "print(shardlab.process_count(), [str(x.message) for x in w if 'mpi4py' in str(x.message)])")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI"))}
    env["OMPI_COMM_WORLD_SIZE"] = "2"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.startswith("1 ["), out.stderr
    assert "pip install shardlab[mpi]" in out.stdout and "each rank runs the whole program on its own" in out.stdout


def test_one_process_is_index_0_of_1_and_holds_every_device():
    mesh = sl.make_mesh((2, 4), ("x", "y"))
    assert (sl.process_index(), sl.process_count(), sl.distributed.is_initialized()) == (0, 1, False)
    assert sl.distributed.addressable_devices(mesh) == list(mesh.devices.ravel())


@pytest.mark.parametrize("sizes,ranks,order,grid", [
    ((8,), 2, None, (2,)), ((8,), 8, None, (8,)), ((2, 4), 2, None, (2, 1)), ((2, 4), 4, None, (2, 2)),
    ((2, 4), 8, None, (2, 4)), ((4, 2), 2, ("y",), (1, 2)), ((2, 4), 1, None, (1, 1)),
])
def test_rank_grid_splits_axes_in_order(sizes, ranks, order, grid):
    names = ("x", "y")[:len(sizes)]
    assert rank_grid(names, sizes, ranks, order) == grid


def test_rank_grid_errors_name_the_mesh_and_the_fix():
    with pytest.raises(ValueError, match=r"a mesh of 6 devices \{'x': 6\} over 4 MPI ranks: 6 devices are not "
                                         r"divisible by 4 ranks"):
        rank_grid(("x",), (6,), 4, None)
    with pytest.raises(ValueError, match=r"axis 'x' of size 6 cannot be split evenly among the 4 ranks"):
        rank_grid(("x", "y"), (6, 4), 4, None)
    assert rank_grid(("x", "y"), (6, 4), 4, ("y", "x")) == (1, 4)  # the fix the message names
    with pytest.raises(ValueError, match=r"axis_order \('z',\) names \['z'\]"):
        rank_grid(("x",), (4,), 2, ("z",))


def test_assemble_puts_rank_blocks_side_by_side():
    full = np.arange(2 * 4 * 3).reshape(2, 4, 3)
    # a rank grid (2, 2): blocks of (1, 2) devices, received rank-major
    blocks = np.stack([full[i:i + 1, j * 2:(j + 1) * 2] for i in range(2) for j in range(2)])
    np.testing.assert_array_equal(assemble(blocks, (1, 2, 3), (0, 1), (2, 2)), full)
    blocks_y = np.stack([full[:, j * 2:(j + 1) * 2] for j in range(2)])
    np.testing.assert_array_equal(assemble(blocks_y, (2, 2, 3), (1,), (2,)), full)


_FAULT = textwrap.dedent("""
    import os, sys, time, numpy as np, shardlab as sl
    from shardlab import P, lax
    sl.distributed.initialize(timeout=2)
    mesh = sl.make_mesh((8,), ("x",))
    x = sl.device_put(np.ones((8, 4), np.float32), sl.NamedSharding(mesh, P("x")))
    f = sl.shard_map(lambda a: lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
    np.asarray(f(x))
    if sl.process_index() == 1:
        if sys.argv[1] == "die":
            os._exit(3)
        time.sleep(60)
    np.asarray(f(x))
""")


@pytest.mark.parametrize("fault,message", [
    ("die", r"\[mpi\] rank 0 was stopped \(another rank ended.*\) in collective psum\(axes=\('x',\)\)"),
    ("stuck", r"\[mpi\] rank 0 waited more than 2 s in collective psum\(axes=\('x',\)\); a rank is missing"),
])
def test_a_rank_dying_or_stuck_mid_collective_ends_the_job_naming_it(tmp_path, fault, message):
    pytest.importorskip("mpi4py")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (make system-deps installs Open MPI)")
    script = tmp_path / "fault.py"
    script.write_text(_FAULT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    out = subprocess.run([mpirun, "-n", "2", sys.executable, str(script), fault], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert re.search(message, text), text
    if fault == "die":
        assert re.search(r"Process name: \[\[\d+,1\],1\]\s+Exit code:\s+3", text), text  # mpirun names rank 1


def _engine_program():
    """Run on each ipyparallel engine (and here, on one process): device_put, a shard_map psum
    and a reshard on a (2, 4) mesh; what the rank sees."""
    import numpy as np
    import shardlab as sl
    from shardlab import P, lax

    mesh = sl.make_mesh((2, 4), ("x", "y"))
    host = np.arange(32.0, dtype=np.float32).reshape(4, 8) + 100 * sl.process_index()  # rank 0's is used
    with sl.Ledger() as ledger:
        x = sl.device_put(host, sl.NamedSharding(mesh, P("x", "y")))
        total = sl.shard_map(lambda a: lax.psum(a, "x"), mesh=mesh, in_specs=P("x", "y"), out_specs=P(None, "y"))(x)
        moved = sl.reshard(x, P("y", "x"))
    return (sl.process_index(), sl.process_count(), [s.device.id for s in x.addressable_shards],
            np.asarray(total), np.asarray(moved), [(e["op"], e["axes"], e["bytes_sent"]) for e in ledger.events])


def test_ipyparallel_mpi_engines_run_a_sharded_program_as_one_process(tmp_path, monkeypatch):
    """docs/mpi.md's Jupyter recipe: ipp.Cluster(engines="mpi", n=2) starts 2 engines under
    mpiexec; each is a rank holding 4 of the 8 devices, with the one-process values and ledger."""
    ipp = pytest.importorskip("ipyparallel")
    pytest.importorskip("mpi4py")
    if shutil.which("mpiexec") is None:
        pytest.skip("mpiexec is not installed (make system-deps installs Open MPI)")
    for k in [k for k in os.environ if k.startswith(("OMPI_", "PMIX_", "PMI_"))]:
        monkeypatch.delenv(k)  # a launcher's variables of this process would confuse the engines' mpiexec
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))  # the cluster's files stay in tmp_path
    # as a notebook's function: defined in __main__, so the engines get its code, not a module name
    program = types.FunctionType(_engine_program.__code__, {"__builtins__": __builtins__}, "program")
    program.__module__ = "__main__"
    with ipp.Cluster(engines="mpi", n=2, log_level=40) as rc:
        runs = sorted(rc[:].apply_sync(program), key=lambda r: r[0])
    rank, count, devices, total, moved, ledger = _engine_program()
    assert (rank, count, devices) == (0, 1, list(range(8)))
    assert [r[:3] for r in runs] == [(0, 2, [0, 1, 2, 3]), (1, 2, [4, 5, 6, 7])]
    for r in runs:
        np.testing.assert_array_equal(r[3], total)
        np.testing.assert_array_equal(r[4], moved)
        assert r[5] == ledger and [e[0] for e in ledger] == ["psum", "all_gather", "all_to_all"]
