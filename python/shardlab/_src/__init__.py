"""shardlab internals, in layers that import one way (see docs/concepts.md)."""
