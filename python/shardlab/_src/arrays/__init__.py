"""shardlab internals: the arrays layer."""
