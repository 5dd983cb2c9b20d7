"""shardlab internals: the kernels layer."""
