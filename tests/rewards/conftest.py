"""One executor (one spawn worker) shared by the reward tests: its start-up is paid once."""
import pytest

from rlkit.rewards import VerifierExecutor

TIMEOUT_S = 0.5


@pytest.fixture(scope="session")
def executor():
  with VerifierExecutor(timeout_s=TIMEOUT_S) as ex:
    yield ex
