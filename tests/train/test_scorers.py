"""The scorer registry (phases/score.py): one hook mechanism between scoring and the update. A method's own
scorer plugs in by registering (it runs in order, sees the policy's old log-probs, and its update runs after
the policy's); scorers a section does not use are absent (no critic state without `gae`)."""
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.train.phases.score import SCORERS, WHEN, Scorer, ScorerSpec, build_scorers
import test_stages as ts   # the RL stage's test components (pytest's rootdir import: the same module object)

_ACTIVE = {"on": False}
_SEEN: dict = {}


def _hindsight(env):
  """A stand-in for a method's scorer (e.g. hindsight contexts): doubles the old log-probs into an extra."""
  if not _ACTIVE["on"]:
    return None

  def run(state, batch, samples):
    _SEEN["old_logp_at_score"] = np.asarray(batch.old_logp)
    return batch.replace(extras=dict(batch.extras, hindsight=2.0 * batch.old_logp)), {"hindsight/rows": 1.0 * len(samples)}

  def update(state, batch, key):
    _SEEN["updated_step"] = int(state["train"].step)
    return dict(state, hindsight_calls=state.get("hindsight_calls", 0) + 1), {"hindsight/updates": 1.0}
  return Scorer(run, update)


SCORERS.add("test_hindsight", ScorerSpec(_hindsight, order=35))


@pytest.fixture
def hindsight_on():
  _ACTIVE["on"] = True
  _SEEN.clear()
  yield
  _ACTIVE["on"] = False


def test_a_registered_scorer_runs_in_the_iteration(hindsight_on):
  run = ts.run_stage({})
  batch = run.batches[0]
  np.testing.assert_array_equal(batch.extras["hindsight"], 2.0 * batch.old_logp)
  np.testing.assert_array_equal(_SEEN["old_logp_at_score"], batch.old_logp)   # ran after the `policy` scorer
  assert np.any(batch.old_logp != 0)
  assert _SEEN["updated_step"] == 2        # its update saw the state after the policy's 2 optimizer steps
  assert run.state["hindsight_calls"] == 1
  assert run.metrics["hindsight/rows"] == ts.PROMPTS * ts.GROUP and run.metrics["hindsight/updates"] == 1.0


def test_scorers_run_in_registered_order_and_only_when_used():
  env = ts.score_env(ts._config({}))
  names = {when: [n for n, _ in scorers] for when, scorers in build_scorers(env).items()}
  assert set(names) == set(WHEN)
  assert names["score"] == ["policy"] and names["advantages"] == []      # grpo: nothing else is built
  env = ts.score_env(ts._config({"advantage": "gae", "kl_beta": 0.1, "score_roles": ("teacher",)}))
  assert [n for n, _ in build_scorers(env)["score"]] == ["policy", "reference", "roles", "critic"]


def test_the_critic_is_absent_when_off():
  assert "critic" not in ts.one_iteration().state
  assert "critic" in ts.one_iteration(advantage="gae").state
