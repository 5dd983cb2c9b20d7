"""Legacy import paths kept for code written against older JAX."""
