"""The `rquest` stage in-process: the proposer's questions are checked, fingerprinted against the memory bank
and answered by the solver; the proposer reward, the solver's rows and labels, the banks and the metrics follow
from them exactly; the reject head's verdicts train it and drop drafts; a resumed stage equals an uninterrupted
one, banks included.

Scripted drafts: a random tiny proposer writes garbage, so the tests replace the decoded text of its drafts and
of its verdicts by a script (`_recording`); the proposer still learns from its own sampled tokens, scored by the
scripted questions' and verdicts' rewards."""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.data.tasks import make_task
from rlkit.models.transformer import init_params
from rlkit.rewards import rquest as rq
from rlkit.train import checkpoint as ckpt
from rlkit.train.phases import score as score_phase
from rlkit.train import rl_stage, rquest_stage
from rlkit.core.errors import ConfigError
from rlkit.train.config import base_config
from rlkit.train.config_checks import validate
from rlkit.train.models import Model
from rlkit.train.catalog import STAGES
from rlkit.train.stages import Context
import test_stages as ts   # the RL stage's test components (pytest's rootdir import: the same module object)

TASK = make_task("rquest_questions")
BINDINGS = "a=3,b=5:"
SCRIPT = [["a+b", "b+a", "a*b", "a+", "x+1", "a*b", "a-b", "b-a"],      # iteration 1
          ["a+b", "b*a", "a*b+1", "a", "b-a", "a*a", "2*a+2*b", "(a+b)*2"]]    # iteration 2
VERDICTS = ["V", "V", "V", "I", "I", "I", "V", "x", "I", "V", "I", "?", "V", "V", "I", "I"]   # 2 per draft


def _cfg(**overrides):
  cfg = rquest_stage.rquest_defaults()
  cfg.update(dict(steps=2, prompts_per_step=1, group_size=4, max_new_tokens=3, ppo_epochs=1))
  cfg.rquest.update(dict(group=8, max_new_tokens=4, tau_cons=0.0))
  cfg.reward.timeout_s = 0.0
  STAGES.get("rquest").validate(ts.override(cfg, overrides), "rquest")
  return cfg


def _ctx(logger, checkpointer=None, prompt_len=20):
  config = base_config()
  config.data.max_prompt_len = prompt_len
  config.eval.update(batch_size=8, max_new_tokens=3, pass_k=0)
  source = [{"prompt": BINDINGS + "a+b=", "answer": "8", "bindings": BINDINGS}] * 8
  proposer = Model(ts.MODEL, init_params(ts.MODEL.cfg, jax.random.key(7)), ts.TOK, True)
  return Context(config=config, model=ts.MODEL, tokenizer=ts.TOK, task=TASK, train_source=source,
                 eval_records=[], logger=logger, checkpointer=checkpointer or ts._NoCkpt(),   # (no evaluation)
                 key=jax.random.key(1), put_batch=lambda b: b, models={"proposer": proposer})


@contextlib.contextmanager
def _recording(script=None, start=0):
  """Records every learner update (in call order) and, with a script, replaces the decoded drafts of the
  iterations from `start` on."""
  calls, sample, learn = [], rquest_stage._Iteration._sample, rl_stage.Learner.learn
  step = {"i": start}

  def scripted(self, learner, params, texts, key, group):
    samples, completions = sample(self, learner, params, texts, key, group)
    if script is not None and learner is self.learners["proposer/"]:
      completions = list(script[step["i"]])
      step["i"] += 1
    elif script is not None and learner is self.learners.get("judge/"):
      completions = list(VERDICTS)
    return samples, completions

  def recorded(self, state, samples, rewards, capacity, key, step=0):
    calls.append((samples, rewards, capacity))
    return learn(self, state, samples, rewards, capacity, key, step)

  with contextlib.ExitStack() as stack:
    stack.enter_context(ts._fast_compile())
    memo = [(owner, name, wrap(getattr(owner, name))) for owner, name, wrap in     # compiled once for all runs
            ((rl_stage, "make_rl_step", ts._memo_step), (score_phase, "make_scorer", ts._memo_scorer))]
    for owner, name, fn in ((rquest_stage._Iteration, "_sample", scripted), (rl_stage.Learner, "learn", recorded),
                            *memo):
      stack.callback(setattr, owner, name, getattr(owner, name))
      setattr(owner, name, fn)
    yield calls


def _run(cfg, ctx, start=0, state=None, meta=None):
  stage = STAGES.get("rquest")
  state = state if state is not None else stage.init(ctx, cfg, jax.tree.map(jnp.copy, ts._initial_params()))
  return stage.run(ctx, cfg, state, start, meta or {"stage": "rquest", "stage_index": 0, "offset": 0})


CFG = dict(**{"rquest.labels": "checker", "rquest.judge_samples": 2})


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory):
  """Two scripted iterations with the reject head, checkpointed after each."""
  logger, directory = ts._Log(), tmp_path_factory.mktemp("rquest")
  with _recording(SCRIPT) as calls:
    state = _run(_cfg(**CFG), _ctx(logger, ckpt.Checkpointer(str(directory), every=1, max_to_keep=3)))
  return state, [r for r in logger.rows if "loss" in r], calls, directory


def test_duplicates_hidden_duplicates_and_the_bank_follow_the_fingerprints(scripted_run):
  state, rows, _, _ = scripted_run
  first, second = rows
  # iteration 1, valid: a+b, b+a, a*b, a*b, a-b, b-a (a+ does not parse, x is unbound); skill duplicates: b+a
  # (of a+b), the second a*b (the same text: not hidden), b-a (a-b renamed)
  assert first["rquest/invalid"] == 2 / 8 and first["rquest/invalid/parse"] == 1 / 8
  assert first["rquest/invalid/unbound"] == 1 / 8
  assert first["rquest/duplicate"] == 3 / 6 and first["rquest/hidden_duplicate"] == 2 / 6
  assert first["rquest/unique"] == 3
  # iteration 2, valid: a+b (known text), b*a (known skill), a*b+1 (new), b-a (known text), 2*a+2*b (new) and
  # (a+b)*2 (the same polynomial, later in the batch); `a` and a*a leave b unused
  assert second["rquest/invalid/unused"] == 2 / 8
  assert second["rquest/duplicate"] == 4 / 6 and second["rquest/hidden_duplicate"] == 2 / 6
  assert second["rquest/unique"] == 3 + 2
  bank = state["rquest"]["bank"]                  # every skill of iteration 1 was seen again: all last seen at 1
  assert int(bank.cursor) == 5 and bank.steps[:5].tolist() == [1] * 5


def _kept():
  """The scripted verdicts, and the drafts the reject head keeps: at least half of their verdicts say V."""
  said = [rq.parse_judgment(v) for v in VERDICTS]
  return said, np.array([x is True for x in said]).reshape(-1, 2).sum(1) * 2 >= 2


def test_proposer_rewards_and_solver_rows_follow_the_checker_and_the_solver_answers(scripted_run):
  _, _, calls, _ = scripted_run
  solver, proposer = calls[:2]                 # per iteration: the solver, the proposer, the reject head
  samples, rewards, capacity = solver
  assert capacity == 4 and len(samples) == 8 * 4
  texts = [BINDINGS + x for x in SCRIPT[0]]
  valid = np.array([rquest_stage.checker.check_validity(t)[0] for t in texts])
  answers = [rquest_stage.checker.check_validity(t)[2] for t in texts]
  _, kept = _kept()
  assert 0 < (valid & kept).sum() < valid.sum()                   # the head drops some valid drafts
  np.testing.assert_array_equal(samples.valid, np.repeat(valid & kept, 4))   # labels=checker: valid, kept ones
  completions = rquest_stage.reward_batch(samples, ts.TOK).completions
  got = [rquest_stage._canonical(TASK.extract_answer(c)) for c in completions]
  np.testing.assert_array_equal(rewards.rewards, [float(g is not None and g == str(answers[i // 4]))
                                                  for i, g in enumerate(got)])
  _, agree = rq.solver_agreement([got[i:i + 4] for i in range(0, 32, 4)])
  dup = np.array([False, True, False, False, False, True, False, True])
  expected = valid * (1 - 2 * np.abs(agree - 0.5) - 0.5 * dup) - 0.5 * (1 - valid)    # tau_cons = 0
  np.testing.assert_allclose(proposer[1].rewards, expected)
  assert proposer[2] == 8 and len(proposer[0]) == 8


def test_the_reject_head_learns_from_the_checker_and_drops_drafts(scripted_run):
  state, rows, calls, _ = scripted_run
  judge = calls[2]
  valid = np.array([rquest_stage.checker.check_validity(BINDINGS + x)[0] for x in SCRIPT[0]])
  said, kept = _kept()
  assert judge[2] == 2 and len(judge[0]) == 8 * 2
  np.testing.assert_array_equal(judge[1].rewards, rq.reject_reward(said, np.repeat(valid, 2)))
  assert rows[0]["reject/dropped"] == float((~kept).mean()) and "judge/loss" in rows[0]
  assert int(state["proposer"]["train"].step) == 4          # two proposer updates a step: questions and verdicts


def test_both_models_train(scripted_run):
  state, rows, _, _ = scripted_run
  assert int(state["train"].step) == 2
  assert "proposer/loss" in rows[0] and "loss" in rows[0] and "rquest/label_correct" in rows[0]


def test_resume_equals_uninterrupted_banks_included(scripted_run):
  whole, _, _, directory = scripted_run
  cfg, ctx = _cfg(**CFG), _ctx(ts._Log())
  with _recording(SCRIPT, start=1):
    target = STAGES.get("rquest").init(ctx, cfg, jax.tree.map(jnp.copy, ts._initial_params()))
    state, meta = ckpt.Checkpointer(str(directory), every=1, max_to_keep=3).restore(1, target)
    # Restored arrays are committed to the device, fresh ones are not: as they are, every jitted function of the
    # fixture's run would compile again for them. The same values, uncommitted:
    state = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)) if isinstance(x, jax.Array) else x, state)
    resumed = _run(cfg, ctx, start=1, state=state, meta=meta)
  a, b = (jax.tree.leaves(jax.device_get(x)) for x in (whole, resumed))
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert np.asarray(resumed["rquest"]["bank"].hashes).dtype == np.uint64


def test_a_question_longer_than_the_solver_prompt_is_invalid_and_never_trains():
  """A BPE proposer's max_new_tokens tokens can decode to a question that tokenizes longer than
  data.max_prompt_len (experiments/rquest's base): the solver's prompt batch raised on it. Now it is invalid
  ("length"), the solver reads its bindings alone, and nothing learns from its answers."""
  logger = ts._Log()
  script = [["a*b+a*b+a*b+1"] + SCRIPT[0][1:], SCRIPT[1]]      # 8 + 13 characters, "=" and BOS: 23 > 20 tokens
  with _recording(script) as calls:
    _run(_cfg(**{"rquest.labels": "checker", "rquest.reward": "rzero"}), _ctx(logger))
  samples, rewards, _ = calls[0]
  assert not samples.valid[:4].any() and samples.valid[4:].any() and not rewards.rewards[:4].any()
  first = [r for r in logger.rows if "loss" in r][0]
  assert first["rquest/invalid/length"] == 1 / 8


def test_rzero_scores_are_frontier_minus_repetition_and_train_on_every_answered_question():
  cfg = _cfg(**{"rquest.reward": "rzero"})
  texts = ["a=1:a+1", "a=1:a+1", "b=2:b*3"]
  x = rq.ProposerInputs(texts, np.array([True, True, False]), np.array([0.5, 0.0, 1.0]), np.zeros(3, bool))
  reward, trains = rq.PROPOSER_REWARDS.get("rzero")(x, cfg.rquest)
  rep = rq.surface_repetition(texts, threshold=0.5)
  np.testing.assert_allclose(reward, 1 - 2 * np.abs(x.agree - 0.5) - rep)
  np.testing.assert_array_equal(trains, [True, False, True])         # validity plays no part


def test_config_errors():
  with pytest.raises(ConfigError, match="rquest.reward"):
    _cfg(**{"rquest.reward": "nope"})
  with pytest.raises(ConfigError, match="judge_samples 0 or >= 2"):
    _cfg(**{"rquest.judge_samples": 1})
  with pytest.raises(ConfigError, match="group advantage"):
    _cfg(advantage="gae")
  with pytest.raises(ConfigError, match="data.max_prompt_len=10"):
    STAGES.get("rquest").init(_ctx(ts._Log(), prompt_len=10), _cfg(), ts._initial_params())
  config = base_config()
  config.stages = ("rquest",)
  config.rquest = _cfg()
  with pytest.raises(ConfigError, match="config.models.proposer with trainable=True"):
    validate(config)
