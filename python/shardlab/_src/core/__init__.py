"""shardlab internals: the core layer."""
