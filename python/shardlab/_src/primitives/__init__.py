"""The primitives layer: Primitive, bind, the tape, and every rule table."""

from . import attention, broadcasting, collectives, contractions, elementwise, fallback, reductions, structural  # noqa: F401
