"""shardlab internals, in layers that import one way: docs/architecture.md draws them, says what
each may import and where a new primitive, op or transform goes; pyproject.toml's import-linter
contract holds them."""
