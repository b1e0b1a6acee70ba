"""The objective tests compile many small jitted functions and check values, not XLA's fusion choices: they
compile with most optimisation passes off (tests/fast_compile.py). An executable compiled here can be reused
in the same worker only by a call with the same static arguments and shapes: of the other tests, only the
RL stage's (tests/train/test_stages.py, itself under fast_compile) call these functions outside a jitted
step."""
import pytest

from tests.fast_compile import fast_compile


@pytest.fixture(autouse=True)
def _fast_compile():
  with fast_compile():
    yield
