"""XLA's optimisation passes in tests. `fast_compile()`: most passes off, for tests whose cost is compiling small
jitted steps and whose assertions do not depend on XLA's fusion choices (about half the compile time). The test
run compiles this way by default (tests/conftest.py sets JAX_DISABLE_MOST_OPTIMIZATIONS); `fast_compile()` keeps
it so whatever the setting. `optimized()`: the passes on, for tests about the optimised program itself (its
memory analysis).

The flag is read at compile time only and restored at once; a function compiled inside is cached as compiled,
so it must not be reused outside (use shapes or models of its own)."""
import contextlib

import jax


@contextlib.contextmanager
def _most_optimizations_disabled(disabled: bool):
  old = jax.config.values["jax_disable_most_optimizations"]
  jax.config.update("jax_disable_most_optimizations", disabled)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", old)


def fast_compile():
  return _most_optimizations_disabled(True)


def optimized():
  return _most_optimizations_disabled(False)
