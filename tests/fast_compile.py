"""`fast_compile()`: compile under XLA with most optimisation passes off, for tests whose cost is compiling
small jitted steps and whose assertions do not depend on XLA's fusion choices (about half the compile time).

The flag is read at compile time only and restored at once, so no other test compiles under it; a function
compiled inside must not be reused outside (use shapes or models of its own)."""
import contextlib

import jax


@contextlib.contextmanager
def fast_compile():
  old = jax.config.values["jax_disable_most_optimizations"]
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", old)
