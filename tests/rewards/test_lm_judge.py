"""The LM judge (rlkit/rewards/lm_judge.py) and rubric items of kind "lm": P(yes) renormalised over yes/no,
independent of padding and batching; the rubric reward fills those items from the judge role's model; a run
whose rubric reward names a judge that config.models lacks fails validation naming it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.data.tasks import Arithmetic
from rlkit.models.tokenizer import CharTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.rewards import REWARDS
from rlkit.rewards.lm_judge import DEFAULT_TEMPLATE, LMJudge
from rlkit.train.models import Model
from tests.rewards import _verifiers as V

TOK = CharTokenizer()
CFG = TransformerConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16, tie_word_embeddings=True, rope_theta=10_000.0)
JUDGE = Model(Transformer(CFG), init_params(CFG, jax.random.key(0)), TOK, False)


def _reference(text):
  ids = jnp.asarray([TOK.encode(text, add_bos=True)])
  logits = jax.jit(JUDGE.module.apply)({"params": JUDGE.params}, ids)[0, -1]   # jitted: eager is 5x slower
  y, n = TOK.encode("Y")[0], TOK.encode("N")[0]
  return float(jax.nn.softmax(jnp.stack([logits[y], logits[n]]))[0])


def test_judgment_is_yes_against_no_whatever_the_padding_and_batch():
  texts = ["1+2=3 ok? ", "4+5=9 no? ", "7+1=8 ok? "]      # one length: the reference compiles once
  want = [_reference(t) for t in texts]
  assert len({round(w, 6) for w in want}) == 3            # an untrained judge still tells the prompts apart
  np.testing.assert_allclose(LMJudge(JUDGE, batch_size=4)(texts), want, atol=1e-5)
  np.testing.assert_allclose(LMJudge(JUDGE, batch_size=2)(texts), want, atol=1e-5)    # a padded last batch


def test_judge_refuses_words_it_cannot_tell_apart():
  with pytest.raises(ValueError, match="start with the same token"):
    LMJudge(JUDGE, yes="Yes", no="Yo")


def test_rubric_lm_items_come_from_the_judge_model(executor):
  rubric = [{"criterion": "the sum is right", "points": 2, "check": {"kind": "answer_correct"}},
            {"criterion": "polite", "points": 1, "check": {"kind": "lm", "question": "is it polite"}}]
  batch = V.make_batch(["3", "4"], ["3", "3"], fields=[{"rubric": rubric}] * 2)
  reward_fn = REWARDS.get("rubric")(Arithmetic(), executor, models={"judge": JUDGE}, mode="additive",
                                    judge_role="judge")
  out = reward_fn(batch)
  p = LMJudge(JUDGE)([DEFAULT_TEMPLATE.format(prompt=batch.prompts[i], completion=c, criterion="is it polite")
                      for i, c in enumerate(batch.completions)])
  np.testing.assert_allclose(out.rewards, (2 * np.array([1.0, 0.0]) + p) / 3, atol=1e-6)
  no_judge = REWARDS.get("rubric")(Arithmetic(), executor, models={})
  with pytest.raises(ValueError, match="judge_role"):
    no_judge(batch)
  with pytest.raises(ValueError, match="judge_role='critic' is not a model of this run"):
    REWARDS.get("rubric")(Arithmetic(), executor, models={"judge": JUDGE}, judge_role="critic")


def test_a_judge_role_missing_from_the_run_fails_validation():
  import importlib.util
  import os
  from rlkit.core.errors import ConfigError
  from rlkit.train.config_checks import validate
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  spec = importlib.util.spec_from_file_location("grpo_arith", os.path.join(root, "configs", "grpo_arith.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("test")
  c.rl.reward.name = "rubric"
  c.rl.reward.kwargs = {"judge_role": "judge"}
  with pytest.raises(ConfigError, match="rl.reward.kwargs.judge_role='judge'.*config.models has no such role"):
    validate(c)
