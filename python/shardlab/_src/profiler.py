"""``jax.profiler`` on the emulated mesh: a trace is the ledger's events as a timeline file.

``trace(log_dir)`` (or ``start_trace`` / ``stop_trace``) records every ledger event made
inside it and writes them as a Chrome / Perfetto trace-event file in TensorBoard's layout,
``<log_dir>/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.trace.json.gz``, which TensorBoard's
profile plugin and https://ui.perfetto.dev open:

- one process per emulated device, each with a ``compute`` and a ``collectives`` thread: every
  device runs every event (SPMD). On a mesh with hardware (``make_mesh(...,
  hardware="tpu-v5e")``) an event lasts its modelled time and the lanes overlap as in
  ``shardlab.viz.timeline``; without a hardware model it spans the host time the emulation
  took (from the previous event to its own), so the timeline is ordered and proportional to
  the emulator's work, not to an accelerator's. Each event's ``args`` hold its ledger row:
  op, mesh axes, group size, dtype, bytes in / out / sent, FLOPs, phase and named-scope label.
- a ``host`` process with the ``TraceAnnotation`` / ``StepTraceAnnotation`` spans (host time).

``TraceAnnotation(name)`` also labels the events made inside it, as ``named_scope`` does, so
they carry its name in the ledger and in the trace.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gzip
import json
import os
import socket
import threading
import time

from .core.context import CTX, named_scope
from .ledger.ledger import Ledger

_LOCK = threading.Lock()


class _TraceLedger(Ledger):
    """A Ledger that also notes when (host time) and on which mesh each event was made."""

    def __init__(self):
        super().__init__()
        self.stamps: list = []
        self.meshes: list = []

    def _append(self, event, mesh) -> None:
        super()._append(event, mesh)
        self.stamps.append(time.perf_counter())
        self.meshes.append(mesh)


class _State:
    def __init__(self):
        self.ledger: _TraceLedger | None = None
        self.log_dir = None
        self.start = 0.0
        self.wall_start = None
        self.spans: list = []  # (name, kind, start, end, args)
        self.perfetto = False
        self.last_path = None


_STATE = _State()


def start_trace(log_dir, create_perfetto_link: bool = False, create_perfetto_trace: bool = False,
                profiler_options=None) -> None:
    """Starts recording a trace (``jax.profiler.start_trace``); :func:`stop_trace` writes it
    under `log_dir`. Only one trace may run at a time (RuntimeError, as JAX).

    `create_perfetto_trace` (or `create_perfetto_link`) also writes ``perfetto_trace.json.gz``
    beside it; no link is served (the emulator has no trace server): open the file in
    https://ui.perfetto.dev. `profiler_options` is accepted for JAX's signature.
    """
    with _LOCK:
        if _STATE.ledger is not None:
            raise RuntimeError("Profile has already been started. Only one profile may be run at a time.")
        if not isinstance(log_dir, (str, os.PathLike)):
            raise TypeError(f"[profiler] log_dir must be a path (str or os.PathLike), got {log_dir!r}")
        ledger = _TraceLedger()
        CTX.ledgers.append(ledger)
        _STATE.ledger = ledger
        _STATE.log_dir = os.fspath(log_dir)
        _STATE.start = time.perf_counter()
        _STATE.wall_start = datetime.datetime.now()
        _STATE.spans = []
        _STATE.perfetto = bool(create_perfetto_trace or create_perfetto_link)


def stop_trace() -> str:
    """Stops the trace and writes it (``jax.profiler.stop_trace``); returns the path of the
    ``.trace.json.gz`` file. RuntimeError if no trace was started, as JAX."""
    with _LOCK:
        ledger = _STATE.ledger
        if ledger is None:
            raise RuntimeError("No profile started")
        if ledger in CTX.ledgers:
            CTX.ledgers.remove(ledger)
        _STATE.ledger = None
        end = time.perf_counter()
        doc = trace_events(ledger, _STATE.spans, _STATE.start, end)
        run = _STATE.wall_start.strftime("%Y_%m_%d_%H_%M_%S")
        folder = os.path.join(_STATE.log_dir, "plugins", "profile", run)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{socket.gethostname()}.trace.json.gz")
        data = json.dumps(doc).encode("utf-8")
        with gzip.open(path, "wb") as f:
            f.write(data)
        if _STATE.perfetto:
            with gzip.open(os.path.join(folder, "perfetto_trace.json.gz"), "wb") as f:
                f.write(data)
        _STATE.last_path = path
        return path


@contextlib.contextmanager
def trace(log_dir, create_perfetto_link: bool = False, create_perfetto_trace: bool = False, profiler_options=None):
    """Records a trace of the block (``jax.profiler.trace``): see :func:`start_trace`.

    Example:
        >>> import tempfile, numpy as np, shardlab as sl
        >>> from shardlab import P
        >>> mesh = sl.make_mesh((4,), ("x",))
        >>> f = sl.shard_map(lambda a: sl.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())
        >>> with sl.profiler.trace(tempfile.mkdtemp()):
        ...     _ = f(np.ones(8, np.float32))
        >>> sl.profiler.last_trace()["traceEvents"][-1]["name"]
        'psum'
    """
    start_trace(log_dir, create_perfetto_link, create_perfetto_trace, profiler_options)
    try:
        yield
    finally:
        stop_trace()


def last_trace() -> dict | None:
    """The trace-event document the last :func:`stop_trace` wrote (read back), or None."""
    if _STATE.last_path is None:
        return None
    with gzip.open(_STATE.last_path, "rb") as f:
        return json.load(f)


class TraceAnnotation:
    """A named span (``jax.profiler.TraceAnnotation``): shown on the trace's host timeline, and
    the ledger events made inside it are labelled with `name`, as ``named_scope`` labels them.
    Extra keyword arguments are kept as the span's args.

    Example:
        >>> import numpy as np, shardlab as sl
        >>> mesh = sl.make_mesh((2,), ("x",))
        >>> f = sl.shard_map(lambda a: sl.lax.psum(a, "x"), mesh=mesh, in_specs=sl.P("x"), out_specs=sl.P())
        >>> with sl.Ledger() as ledger, sl.profiler.TraceAnnotation("reduce"):
        ...     _ = f(np.ones(4, np.float32))
        >>> ledger.events[0]["label"]
        'reduce'
    """

    _kind = "annotation"

    def __init__(self, name: str, **kwargs):
        if not isinstance(name, str) or not name:
            raise TypeError(f"[profiler] {type(self).__name__} name must be a non-empty string, got {name!r}")
        self.name = name
        self.kwargs = kwargs
        self._scope = None
        self._start = None

    def __enter__(self):
        self._start = time.perf_counter()
        self._scope = named_scope(self.name)
        self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        self._scope.__exit__(*exc)
        if _STATE.ledger is not None and self._start >= _STATE.start:
            _STATE.spans.append((self.name, self._kind, self._start, time.perf_counter(), dict(self.kwargs)))
        return False


class StepTraceAnnotation(TraceAnnotation):
    """A training step's span (``jax.profiler.StepTraceAnnotation``; pass ``step_num=``): shown
    on the host's ``steps`` thread, and labels the events inside it as TraceAnnotation does."""

    _kind = "step"


def annotate_function(func, name: str | None = None, **decorator_kwargs):
    """Wraps `func` in a :class:`TraceAnnotation` named `name` (default: its qualified name),
    as ``jax.profiler.annotate_function``."""
    name = name or getattr(func, "__qualname__", None) or func.__name__

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with TraceAnnotation(name, **decorator_kwargs):
            return func(*args, **kwargs)

    return wrapper


# -- the trace-event document ------------------------------------------------------------------
_ARG_FIELDS = ("op", "axes", "group_size", "num_groups", "dtype", "bytes_in", "bytes_out", "bytes_sent",
               "algorithm", "flops", "hbm_bytes", "phase", "label", "seconds", "book_seconds", "bound")
_MAX_DEVICES = 64  # device processes written; larger meshes run the same schedule (SPMD)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def trace_events(ledger: _TraceLedger, spans: list, start: float, end: float) -> dict:
    """The Chrome trace-event document (``{"traceEvents": [...]}``) of a trace's events."""
    events = ledger._events
    modelled = bool(events) and all(e.seconds is not None for e in events)
    n_dev = max((m.size for m in ledger.meshes), default=1)
    shown = min(n_dev, _MAX_DEVICES)
    hw = next((getattr(m.hardware, "name", str(m.hardware)) for m in ledger.meshes if m.hardware is not None), None)
    clock = f"modelled on {hw}" if modelled else "host time of the emulation (no hardware model)"
    out = []
    for d in range(shown):
        out.append({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"/device:{d} (shardlab, {clock})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": d, "args": {"sort_index": d}})
        out.append({"ph": "M", "name": "thread_name", "pid": d, "tid": 1, "args": {"name": "compute"}})
        out.append({"ph": "M", "name": "thread_name", "pid": d, "tid": 2, "args": {"name": "collectives"}})
    host = _MAX_DEVICES + 1
    out.append({"ph": "M", "name": "process_name", "pid": host, "args": {"name": "host (python)"}})
    out.append({"ph": "M", "name": "thread_name", "pid": host, "tid": 1, "args": {"name": "annotations"}})
    out.append({"ph": "M", "name": "thread_name", "pid": host, "tid": 2, "args": {"name": "steps"}})
    for name, kind, t0, t1, args in spans:
        out.append({"ph": "X", "name": name, "cat": kind, "pid": host, "tid": 2 if kind == "step" else 1,
                    "ts": _us(t0 - start), "dur": _us(t1 - t0), "args": {k: _plain(v) for k, v in args.items()}})
    lanes = {1: 0.0, 2: 0.0}
    previous = start
    for e, stamp, mesh in zip(events, ledger.stamps, ledger.meshes):
        tid = 1 if e.is_compute else 2
        if modelled:
            t0, dur = lanes[tid], float(e.seconds)
            lanes[tid] = t0 + dur
        else:
            t0, dur = previous - start, stamp - previous
        previous = stamp
        args = {f: _plain(getattr(e, f)) for f in _ARG_FIELDS}
        args["devices"] = mesh.size
        for d in range(min(mesh.size, shown)):
            out.append({"ph": "X", "name": e.op, "cat": "collective" if tid == 2 else "compute", "pid": d,
                        "tid": tid, "ts": _us(t0), "dur": _us(dur), "args": args})
    return {"displayTimeUnit": "ns", "traceEvents": out,
            "otherData": {"generator": "shardlab.profiler", "clock": clock, "devices": n_dev,
                          "host_seconds": end - start}}


def _plain(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return str(v)
