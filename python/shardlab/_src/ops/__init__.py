"""shardlab internals: the ops layer."""
