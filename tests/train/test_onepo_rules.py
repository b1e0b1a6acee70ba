"""OnePO's rules in the trainer (rlkit/train/onepo.py), on hand-made groups: the released rule (`huatuo`) replaces
at most one rollout of a group, only where the teacher's reward is strictly above every student's, and retires on
its schedule; the config section refuses what the rule cannot do. (Every `rl.onepo` field on the real RL stage:
tests/train/test_stage_switches.py; the maths: tests/objectives/test_onepo.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.errors import ConfigError
from rlkit.core.types import ROW_SOURCE, Rollout
from rlkit.models.tokenizer import CharTokenizer
from rlkit.rewards import RewardOutput
from rlkit.train.catalog import STAGES
from rlkit.train.onepo import offered_groups, onepo_augmenter
from rlkit.train.phases.augment import AugmentEnv
from rlkit.train.phases.collect import Samples
from rlkit.train.phases.reward import compute_rewards
from rlkit.train.rl_config import rl_defaults

TOK = CharTokenizer()
G, WIDTH = 4, 4
# Each group's students' completions: group 0 all wrong, group 1 has the right answer (the teacher only ties
# it), group 2 all wrong.
STUDENTS = [["9", "9", "8", "7"], ["9", "2", "9", "9"], ["1", "", "5", "0"]]


def _exact(batch):
  r = np.array([float(c == a) for c, a in zip(batch.completions, batch.answers)])
  return RewardOutput(rewards=r, correct=r > 0, components={"exact": r.copy()}, failures={})


def _cfg(**onepo):
  cfg = rl_defaults()
  cfg.update(dict(group_size=G, max_new_tokens=WIDTH, prompts_per_step=len(STUDENTS), augment="onepo"))
  cfg.onepo.update({"rule": "huatuo", "anneal_steps": 10, **onepo})
  return cfg


def _samples():
  examples = [{"prompt": f"{g}+1=", "answer": str(g + 1), "demonstration": str(g + 1), "fields": {}}
              for g in range(len(STUDENTS))]
  texts = [t for group in STUDENTS for t in group]
  response = np.full((len(texts), WIDTH), TOK.pad_id, np.int32)
  for i, t in enumerate(texts):
    ids = TOK.encode(t, add_eos=True)
    response[i, :len(ids)] = ids
  mask = response != TOK.pad_id
  prompt = np.stack([np.asarray(TOK.encode(examples[i // G]["prompt"]), np.int32) for i in range(len(texts))])
  rollout = Rollout(prompt=jnp.asarray(prompt), prompt_mask=jnp.ones(prompt.shape, bool),
                    response=jnp.asarray(response), response_mask=jnp.asarray(mask),
                    logprobs=jnp.full(response.shape, -1.0),
                    lengths=jnp.asarray(mask.sum(1), jnp.int32), finished=jnp.ones(len(texts), bool),
                    group_ids=jnp.asarray(np.arange(len(texts)) // G, jnp.int32), extras={})
  samples = Samples(rollout, [examples[i // G] for i in range(len(texts))],
                    np.full(len(texts), ROW_SOURCE["policy"], np.int32), np.ones(len(texts), bool))
  return samples, compute_rewards(_exact, samples, TOK, _cfg())


def _augment(cfg, step, key=0):
  samples, rewards = _samples()
  env = AugmentEnv(tokenizer=TOK, reward_fn=_exact, cfg=cfg, put_batch=lambda b: b)
  out, out_rewards = onepo_augmenter(cfg, env)(samples, rewards, jax.random.key(key), step)
  return samples, rewards, out, out_rewards


def test_huatuo_replaces_one_rollout_only_where_the_teacher_beats_every_student():
  for key in range(4):                           # the replaced row is drawn uniformly: several keys
    samples, rewards, out, out_rewards = _augment(_cfg(), step=0, key=key)
    assert len(out) == len(samples)              # groups keep their size
    teacher = (out.row_source == ROW_SOURCE["teacher"]).reshape(-1, G)
    np.testing.assert_array_equal(teacher.sum(1), [1, 0, 1])   # group 1: the teacher only ties its best
    changed = np.any(np.asarray(out.rollout.response) != np.asarray(samples.rollout.response), axis=1)
    np.testing.assert_array_equal(changed.reshape(-1, G), teacher)   # every other row is the student's
    np.testing.assert_array_equal(out_rewards.rewards[teacher.reshape(-1)], [1.0, 1.0])
    keep = ~teacher.reshape(-1)
    np.testing.assert_array_equal(out_rewards.rewards[keep], rewards.rewards[keep])
    assert [out.examples[i]["answer"] for i in np.flatnonzero(teacher)] == ["1", "3"]
    assert np.asarray(out.valid).all() and out.weight is None


def test_huatuo_retires_on_its_schedule():
  samples, _, out, out_rewards = _augment(_cfg(), step=10)          # cutoff at T = 10: steps 0..9 only
  assert out is samples
  assert (_augment(_cfg(), step=9)[2].row_source == ROW_SOURCE["teacher"]).sum() == 2
  for key in range(6):
    # linear: share 1 - 8/10 of the 3 groups offered, floor(0.6 + u) = 0 or 1 groups
    out = _augment(_cfg(retire="linear"), step=8, key=key)[2]
    assert (out.row_source == ROW_SOURCE["teacher"]).sum() <= 1
  samples, _, out, _ = _augment(_cfg(anneal_steps=0), step=0)      # no teacher at all: the input back
  assert out is samples


def test_offered_groups_draws_the_scheduled_share():
  key = jax.random.key(3)
  assert offered_groups(key, 8, 1.0).all() and not offered_groups(key, 8, 0.0).any()
  assert offered_groups(key, 1000, 0.25).sum() == 250
  counts = {int(offered_groups(jax.random.key(k), 4, 0.3).sum()) for k in range(40)}
  assert counts == {1, 2}                        # floor(1.2 + u): 1 or 2, 1.2 on average


@pytest.mark.parametrize("onepo,needle", [
    ({"rule": "luffy"}, r"rl.onepo.rule='luffy' is not a known onepo rule; choose one of: guidance, huatuo"),
    ({"retire": "cosine"}, r"rl.onepo.retire='cosine' is not a known onepo retirement"),
    ({"rule": "huatuo", "teacher_rows": 4}, r"replaces at most one rollout per prompt; set rl.onepo.teacher_rows=1"),
    ({"floor": 1.0}, r"0 < floor < 1"),
])
def test_bad_onepo_settings_are_config_errors(onepo, needle):
  cfg = rl_defaults()
  cfg.onepo.update(onepo)
  with pytest.raises(ConfigError, match=needle):
    STAGES.get("rl").validate(cfg, "rl")
