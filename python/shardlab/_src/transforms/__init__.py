"""shardlab internals: the transforms layer."""
