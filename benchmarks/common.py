"""What every benchmark script shares: the CPU's name, numpy's OpenBLAS, and the timers."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import time

import threadpoolctl
from rich.console import Console
from rich.table import Table


def cpu_model() -> str:
    """The CPU as /proc/cpuinfo names it, with family and model (Zen 3 is family 25)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown CPU"
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def openblas_info() -> str:
    """numpy's OpenBLAS: version, the kernel it runs (architecture) and its threading layer."""
    infos = [i for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]
    # scipy (imported by shardlab) loads its own OpenBLAS too; numpy's is the one timed here.
    infos = [i for i in infos if "numpy" in i["filepath"]] or infos
    if not infos:
        return "numpy is not linked to OpenBLAS"
    i = infos[0]
    return f"OpenBLAS {i['version']}, kernel/architecture {i['architecture']}, {i['threading_layer']}"


def settled_seconds(fn, settle: float, warm: float = 0.02, window: float = 0.01) -> float:
    """Seconds per call of `fn` once the cores are busy: after a `settle` pause, calls of `fn`
    for `warm` seconds (at least one) untimed, then the median of the calls timed one by one
    over `window` seconds (at least one).

    The pause lets the other library's idle threads stop spinning (OpenBLAS's and libgomp's spin
    for up to 0.1 s after a call and would share the cores with this one). The untimed calls then
    wake the cores again: on the 2-vCPU VM of docs/benchmarks.md a call right after an idle
    pause ran 2-4x slower (a 1.5 ms GEMM took 3.7-6.5 ms after 0.15 s idle, its second thread
    waiting for its vCPU to be scheduled), and a single untimed call of a 1.3 ms GEMM was not
    enough: timed right after it, the median 512^3 GEMM reached 0.43-0.56 of the FMA peak and
    the best 0.82-0.86, against 0.86-0.87 in steady state. Calls longer than `warm` and
    `window` (attention, large GEMMs) get one untimed and one timed call.
    """
    time.sleep(settle)
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < warm:
        fn()
    times = []
    start = time.perf_counter()
    while not times or time.perf_counter() - start < window:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def best(fn, repeat: int = 5, number: int = 1, clock=time.perf_counter) -> float:
    """Seconds per call of `fn`: the best of `repeat` timings of `number` calls, after a warm-up.
    ``clock=time.process_time`` times single-threaded work by the CPU it used, so time the
    scheduler gave to other processes on a shared machine does not count."""
    fn()
    times = []
    for _ in range(repeat):
        t = clock()
        for _ in range(number):
            fn()
        times.append((clock() - t) / number)
    return min(times)


def report(name: str, title: str, rows: list, width: int = 200) -> None:
    """Prints (case, ours, reference, ratio) rows as a table headed by `title` and the CPU, and
    writes them to benchmarks/results/<name>.json."""
    table = Table(title=f"{title} on {cpu_model()} ({os.cpu_count()} cores, OMP threads "
                        f"{os.environ.get('OMP_NUM_THREADS', 'default')}, load {os.getloadavg()[0]:.2f})")
    for col in ("case", "shardlab", "reference", "ratio (reference / ours; higher is better)"):
        table.add_column(col)
    for case, ours, ref, ratio in rows:
        table.add_row(case, ours, ref, f"{ratio:.2f}x")
    Console(width=width).print(table)
    out = pathlib.Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(
        [dict(zip(("case", "ours", "reference", "ratio"), r)) for r in rows], indent=1))
