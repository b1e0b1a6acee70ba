"""Self-Retrospection Distillation on the RL stage (rlkit/train/srd.py): a tiny key-door run trains with the
`srd` and `srd_jsd` terms and logs the srd/ metrics; on that run's scored batch the hindsight teacher with an
empty block is the policy itself (zero SRD signal: log-probs, loss and gradient), episode and shuffled
hindsight give the teacher different inputs, and every `rl.srd` field changes what the scorer or the terms
produce; the section's checks name the key and the fix.

One in-process run (configs/agentic.py:test on key_door) captures the `hindsight` scorer's inputs of its
first iteration (the stage state's params, the batch after the advantages, the samples) and its `ScoreEnv`;
the other tests rebuild the scorer from that env with a flipped section and score the same batch, reusing the
run's compiled policy scorer."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs.agentic import get_config
from rlkit.core.errors import ConfigError
from rlkit.objectives import srd as S
from rlkit.objectives.loss_terms import LOSS_TERMS
from rlkit.rollout.scoring import processed_token_logprobs, response_forward
from rlkit.train import rl_stage, srd
from rlkit.train.catalog import STAGES
from rlkit.train.config_docs import field_comments
from rlkit.train.metrics import read_metrics
from rlkit.train.rl_config import rl_defaults
from tests.fast_compile import fast_compile

GROUP, PROMPTS = 4, 2


def key_door_config():
  c = get_config("test")
  c.task.name = "key_door"
  c.task.kwargs = ml_collections.ConfigDict()
  c.data.update(max_prompt_len=256, num_train=4, num_test=0)  # the room prompt is ~240 characters; 3 rooms
  c.eval.update(num_examples=0)                                # have 8 distinct prompts: no held-out split
  c.rl.multi_turn.env = "key_door"
  c.rl.reward.update(name="key_door", timeout_s=0.0)           # inline: no worker process
  c.rl.reward.kwargs = ml_collections.ConfigDict()             # (the preset's judge_noise is the calculator's)
  c.rl.update(advantage="group", max_new_tokens=64, group_size=GROUP, prompts_per_step=PROMPTS)
  c.rl.loss_terms.srd = 1.0
  c.rl.loss_terms.srd_jsd = 1.0
  return c


@pytest.fixture(scope="module")
def key_door_run(tmp_path_factory):
  """(the run's metric rows, its ScoreEnv, the hindsight scorer's first inputs {params, batch, samples})."""
  from rlkit.train.run import run
  envs, seen = [], {}

  def build(env):
    envs.append(env)
    return build_scorers(env)

  def scorers(entries, state, batch, samples):
    if any(name == "hindsight" for name, _ in entries) and not seen:
      seen.update(params=jax.tree.map(jnp.copy, state["train"].params), batch=jax.tree.map(jnp.copy, batch),
                  samples=dataclasses.replace(samples, rollout=jax.tree.map(jnp.copy, samples.rollout)))
    return run_scorers(entries, state, batch, samples)

  build_scorers, run_scorers = rl_stage.build_scorers, rl_stage.run_scorers
  workdir = tmp_path_factory.mktemp("srd")
  with pytest.MonkeyPatch.context() as mp, fast_compile():
    mp.setattr(rl_stage, "build_scorers", build)
    mp.setattr(rl_stage, "run_scorers", scorers)
    run(key_door_config(), str(workdir))
  return read_metrics(str(workdir / "metrics.jsonl")), envs[0], seen


def _section(**fields):
  cfg = key_door_config().rl
  for key, value in fields.items():
    if key == "loss_terms":
      cfg.loss_terms = ml_collections.ConfigDict(value)
    else:
      cfg.srd[key] = value
  STAGES.get("rl").validate(cfg, "rl")
  return cfg


def _score(key_door_run, batch=None, **fields):
  """The hindsight scorer of the run's env with `rl.srd` fields (and loss_terms) flipped, on the captured
  batch: (batch with the scorer's extras, metrics, the teacher's prompt rows)."""
  _, env, seen = key_door_run
  flipped = dataclasses.replace(env, cfg=_section(**fields))
  flipped.__dict__["policy_logp"] = env.policy_logp        # the run's compiled policy scorer
  batch = seen["batch"] if batch is None else batch
  with fast_compile():
    out, metrics = srd.hindsight_scorer(flipped).score({"train": _Params(seen["params"])}, batch, seen["samples"])
  return out, metrics, _teacher_rows(flipped.cfg.srd, seen["samples"], env.ctx.tokenizer)


@dataclasses.dataclass
class _Params:
  params: dict


def _teacher_rows(s, samples, tok):
  ro = samples.rollout
  texts = srd.hindsight_texts(samples.examples, s.hindsight, s.field, GROUP)
  rows, _ = srd.teacher_prompts(np.asarray(ro.prompt), np.asarray(ro.prompt_mask, bool), texts, s.template, tok)
  return rows


def _np(x):
  return np.asarray(jax.device_get(x))


# ------------------------------------------------------------------------------------------------ the run

def test_a_key_door_run_trains_with_both_terms_and_logs_the_srd_metrics(key_door_run):
  rows, _, seen = key_door_run
  steps = [r for r in rows if "loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  for r in steps:
    assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    for name in ("srd/zero_variance_frac", "srd/gap", "srd/hindsight_tokens", "srd/reverse_kl_sampled", "srd/jsd",
                 "srd/teacher_mass"):
      assert math.isfinite(r[name]), name
    assert r["srd/hindsight_tokens"] > 0 and r["srd/jsd"] > 0
    # an untrained policy never reaches the goal: every group is flat, GRPO's gradient is zero, SRD's is not
    assert r["reward"] == 0 and r["srd/zero_variance_frac"] == 1.0
  assert all("episode" in ex["fields"] and ex["fields"]["episode"]["solution"] for ex in seen["samples"].examples)


def test_episode_and_shuffled_hindsight_give_the_teacher_different_inputs(key_door_run):
  _, _, seen = key_door_run
  examples = seen["samples"].examples
  episode = srd.hindsight_texts(examples, "episode", "solution", GROUP)
  shuffled = srd.hindsight_texts(examples, "shuffled", "solution", GROUP)
  solutions = [ex["fields"]["episode"]["solution"] for ex in examples]
  assert episode == [f"The way was: {s}" for s in solutions]          # key_door's answer is its solution
  assert shuffled == episode[GROUP:] + episode[:GROUP]                 # group g reads group g+1's (2 groups)
  assert all(a != b for a, b in zip(episode, shuffled))                # the run's two prompts differ
  a, _, rows_a = _score(key_door_run)
  b, _, rows_b = _score(key_door_run, hindsight="shuffled")
  assert rows_a != rows_b
  mask = _np(seen["batch"].loss_mask)
  assert not np.allclose(_np(a.extras[S.TEACHER_LOGP])[mask], _np(b.extras[S.TEACHER_LOGP])[mask])


def test_the_teacher_inputs_keep_the_response_columns(key_door_run):
  """The prompt, then the block, left-padded together; the last R columns are the response as sampled."""
  _, env, seen = key_door_run
  tok, batch, ro = env.ctx.tokenizer, seen["batch"], seen["samples"].rollout
  rows = _teacher_rows(_section().srd, seen["samples"], tok)
  for i, row in enumerate(rows):
    prompt = _np(ro.prompt)[i][_np(ro.prompt_mask)[i]].tolist()
    assert row[:len(prompt)] == prompt and tok.decode(row[len(prompt):]).startswith("<hindsight>The way was: ")
  out, metrics, _ = _score(key_door_run)
  blocks = np.mean([len(r) for r in rows]) - _np(ro.prompt_mask).sum(1).mean()
  assert metrics["srd/hindsight_tokens"] == pytest.approx(blocks)
  assert out.extras[S.TEACHER_LOGP].shape == batch.old_logp.shape
  assert out.extras[S.TEACHER_DIST_LOGP].shape == batch.old_logp.shape + (16,)


# ------------------------------------------------------------------------------------------ the empty limit

_TERM_GRADS: dict = {}


def _terms_on(params, env, out, name="srd"):
  """(per-token loss, its gradient wrt the params) of loss term `name` on `out` (the scored batch), as the step
  computes them: the policy's logits and processed log-probs of the response. Compiled once per term and beta."""
  key = (name, env.cfg.srd.beta)
  if key not in _TERM_GRADS:
    term = LOSS_TERMS.get(name)(env.cfg)

    def loss(p, b):
      logits, _ = response_forward(env.model, p, b.tokens, b.attention_mask, b.response_len)
      logp = processed_token_logprobs(logits, b.response, env.sampling)
      n = jnp.maximum(b.loss_mask.sum(), 1)
      per_tok, _ = term(logp, logits, b, {"num_tokens": n})
      return jnp.sum(jnp.where(b.loss_mask, per_tok, 0.0)) / n, per_tok
    _TERM_GRADS[key] = jax.jit(jax.value_and_grad(loss, has_aux=True))
  with fast_compile():
    (_, per_tok), grads = _TERM_GRADS[key](params, out)
  return _np(per_tok), max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads))


def test_empty_hindsight_gives_exactly_the_policys_log_probs_and_no_srd_signal(key_door_run):
  _, env, seen = key_door_run
  batch = seen["batch"]
  mask = _np(batch.loss_mask)
  empty, metrics, rows = _score(key_door_run, hindsight="empty", loss_terms={"srd": 1.0})
  teacher = _np(empty.extras[S.TEACHER_LOGP])
  np.testing.assert_allclose(teacher[mask], _np(batch.old_logp)[mask], atol=2e-6)
  assert metrics["srd/hindsight_tokens"] == 0 and abs(metrics["srd/gap"]) < 1e-6
  per_tok, grad = _terms_on(seen["params"], env, empty)
  assert np.abs(per_tok[mask]).max() < 1e-5 and grad < 1e-5
  episode, _, _ = _score(key_door_run, loss_terms={"srd": 1.0})
  per_tok, grad_episode = _terms_on(seen["params"], env, episode)
  assert grad_episode > 1e3 * max(grad, 1e-9)                          # the episode's hindsight is a signal


def test_the_scorer_is_built_only_for_an_srd_term_with_weight(key_door_run):
  _, env, _ = key_door_run
  for terms, built in (({}, False), ({"srd": 0.0}, False), ({"srd_jsd": 0.0, "srd": 0.5}, True),
                       ({"srd_jsd": 1.0}, True)):
    assert (srd.hindsight_scorer(dataclasses.replace(env, cfg=_section(loss_terms=terms))) is not None) == built
  cfg = _section(loss_terms={"srd": 0.0})
  cfg.schedules["weight/srd"] = {"kind": "linear", "start": 0.0, "end": 1.0, "steps": 10}
  assert srd.active_terms(cfg) == ("srd",)


# --------------------------------------------------------------------------------------- no dead switches

def test_every_srd_field_acts(key_door_run):
  _, env, seen = key_door_run
  batch, mask = seen["batch"], _np(seen["batch"].loss_mask)
  sampled = {"loss_terms": {"srd": 1.0}}        # no distribution scorer where the flip does not need it
  base, _, base_rows = _score(key_door_run, **sampled)
  logp = lambda out: _np(out.extras[S.TEACHER_LOGP])[mask]

  def differs(**flip):
    out, _, rows = _score(key_door_run, **sampled, **flip)
    return rows != base_rows and not np.allclose(logp(out), logp(base))

  acted = {"hindsight": differs(hindsight="empty") and differs(hindsight="shuffled"),
           "field": differs(field="actions"),                          # the episode's action count instead
           "template": differs(template="Hint: {hindsight}\n")}

  # The row weights: group 0 gets an advantage of 0.5 on its loss tokens (signal), group 1 none.
  adv = np.where(mask, np.repeat([0.5, 0.0], GROUP)[:, None], 0.0).astype(np.float32)
  signal = batch.replace(advantages=jnp.asarray(adv))
  weight = lambda **flip: _np(_score(key_door_run, batch=signal, **sampled, **flip)[0].extras[S.ROW_WEIGHT])
  np.testing.assert_allclose(weight(), np.repeat([0.1, 1.0], GROUP))
  acted["weight_hi"] = not np.allclose(weight(weight_hi=2.0), weight())
  acted["weight_lo"] = not np.allclose(weight(weight_lo=0.3), weight())
  acted["zero_tol"] = np.allclose(weight(zero_tol=1.0), 1.0)           # 0.5 is no signal at this tolerance

  jsd = {"loss_terms": {"srd_jsd": 1.0}}
  full, _, _ = _score(key_door_run, **jsd)
  small, _, _ = _score(key_door_run, **jsd, top_k=4)
  acted["top_k"] = (full.extras[S.TEACHER_DIST_IDS].shape[-1], small.extras[S.TEACHER_DIST_IDS].shape[-1]) == (16, 4)

  def jsd_loss(beta):
    e = dataclasses.replace(env, cfg=_section(**jsd, beta=beta))
    return _terms_on(seen["params"], e, full, "srd_jsd")[0][mask]
  acted["beta"] = not np.allclose(jsd_loss(0.5), jsd_loss(0.9))
  assert set(acted) == set(srd.srd_defaults()), "a field of rl.srd without a flip here"
  assert all(acted.values()), {k: v for k, v in acted.items() if not v}


# ------------------------------------------------------------------------------------------------ checks

def test_every_srd_field_is_commented_for_the_config_printer():
  assert set(field_comments(srd.srd_defaults)) == set(srd.srd_defaults())


@pytest.mark.parametrize("fields, match", [
    ({"hindsight": "future"}, r"rl.srd.hindsight='future': choose one of episode, shuffled, empty"),
    ({"field": ""}, r"rl.srd.field=''"),
    ({"template": "<h></h>"}, r"rl.srd.template='<h></h>' has no '\{hindsight\}' placeholder"),
    ({"template": "{hindsight} {x}"}, r"rl.srd.template=.*not a format string"),
    ({"weight_hi": -1.0}, r"rl.srd.weight_hi=-1.0 must be >= 0"),
    ({"weight_lo": -0.1}, r"rl.srd.weight_lo=-0.1 must be >= 0"),
    ({"zero_tol": -1e-3}, r"rl.srd.zero_tol=-0.001 must be >= 0"),
    ({"top_k": 0}, r"rl.srd.top_k=0 must be >= 1"),
    ({"beta": 1.5}, r"rl.srd.beta=1.5 must be in \[0, 1\]"),
])
def test_the_checks_name_the_key_and_the_fix(fields, match):
  cfg = rl_defaults()
  cfg.srd.update(fields)
  with pytest.raises(ConfigError, match=match):
    STAGES.get("rl").validate(cfg, "rl")


def test_shuffled_hindsight_needs_two_groups():
  cfg = rl_defaults()
  cfg.update(prompts_per_step=1)
  cfg.srd.hindsight = "shuffled"
  STAGES.get("rl").validate(cfg, "rl")                                 # no SRD term: nothing reads it
  cfg.loss_terms.srd = 1.0
  with pytest.raises(ConfigError, match="prompts_per_step=1 makes one group"):
    STAGES.get("rl").validate(cfg, "rl")
