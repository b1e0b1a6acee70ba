"""Every objectives registry refuses unknown names with the list of valid ones."""
import pytest

from rlkit.objectives import ADVANTAGES
from rlkit.objectives import AGGREGATIONS
from rlkit.objectives import KL_ESTIMATORS
from rlkit.objectives import POLICY_LOSSES
from rlkit.objectives import aggregate
from rlkit.objectives import group_advantages
from rlkit.objectives import kl_penalty


@pytest.mark.parametrize("registry, names", [
    (ADVANTAGES, ["batch", "group", "none", "rloo"]),
    (POLICY_LOSSES, ["cispo", "cispo_trl", "gmpo", "gspo", "gspo_token", "ppo_clip", "sapo"]),
    (KL_ESTIMATORS, ["abs", "k1", "k1+", "k2", "k3", "k3+"]),
    (AGGREGATIONS, ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean",
                    "token-sum"]),
])
def test_unknown_name_lists_valid_names(registry, names):
  assert registry.names() == names
  with pytest.raises(KeyError) as err:
    registry.get("nope")
  assert all(n in str(err.value) for n in names)
  with pytest.raises(ValueError, match="objective.x="):
    registry.check("nope", key="objective.x")


def test_convenience_functions_raise_on_unknown_names():
  with pytest.raises(KeyError, match="rloo"):
    group_advantages("grpo", [1.0, 0.0], 2)
  with pytest.raises(KeyError, match="k3"):
    kl_penalty("k4", [0.0], [0.0])
  with pytest.raises(KeyError, match="token-mean"):
    aggregate([[0.0]], [[True]], "mean")
