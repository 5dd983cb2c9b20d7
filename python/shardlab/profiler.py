"""``shardlab.profiler``, as ``jax.profiler``: ``trace`` / ``start_trace`` / ``stop_trace``
write the ledger events of the emulated devices as a TensorBoard / Perfetto trace file;
``TraceAnnotation``, ``StepTraceAnnotation`` and ``annotate_function`` label spans and events
(see ``shardlab._src.profiler``)."""

from ._src.profiler import (  # noqa: F401
    StepTraceAnnotation, TraceAnnotation, annotate_function, last_trace, start_trace, stop_trace, trace,
)

__all__ = ["StepTraceAnnotation", "TraceAnnotation", "annotate_function", "last_trace", "start_trace", "stop_trace",
           "trace"]
