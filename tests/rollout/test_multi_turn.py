"""Multi-turn rollouts: stop strings match text however it is tokenised; every turn's tokens are the sampled ones,
unchanged by later turns and scored by the trainer as sampled; observations are attended, never trained."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.labels import SEGMENT_KINDS
from rlkit.models.bpe import train_bpe
from rlkit.models.tokenizer import CharTokenizer, HFTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.objectives.aggregation import aggregate
from rlkit.objectives.policy_losses import POLICY_LOSSES
from rlkit.rollout.multi_turn import PlainRenderer, TurnBudget, rollout_arrays, run_episodes
from rlkit.rollout.resumable import decode_until, prefill
from rlkit.rollout.sampler import SamplingConfig
from rlkit.rollout.scoring import score_response
from rlkit.rollout.stop_strings import stop_string_table
from rlkit.agents.envs import Step

TOK = CharTokenizer()
CFG = TransformerConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=48, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10_000.0)
STOPS = tuple("abcdef")          # single letters: ~6% of draws, so some turns stop on a string, some on budget


def test_stop_string_automaton_matches_a_text_search_over_bpe_tokens():
  corpus = ["<call>mul(23,4)</call><result>92</result><say>23 times 4 is 92.</say>"] * 20 + ["a call, all calls"]
  tok = HFTokenizer(train_bpe(corpus, 300), eos_token="<eos>", pad_token="<pad>")
  # BPE merges across the marker's end, so it ends inside a token ("><" here): the reason for the automaton
  assert not any(tok.decode([i]).endswith("</call>") for i in tok.encode(corpus[0]))
  strings = ("</call>", "ll")
  table = stop_string_table(tok, strings)
  rng = np.random.default_rng(0)
  ids = tok.encode(corpus[0]) + tok.encode(corpus[-1])
  for _ in range(200):
    seq = [int(t) for t in rng.choice(ids, size=12)]
    states = np.zeros(len(strings), np.int32)
    for n, t in enumerate(seq, 1):
      states = table.table[np.arange(len(strings)), states, t]
      text = tok.decode(seq[:n])
      for s, string in enumerate(strings):
        assert (states[s] == table.accept[s]) == (string in text), (seq[:n], string)


@pytest.fixture(scope="module")
def model():
  return Transformer(CFG), init_params(CFG, jax.random.key(0))


@dataclasses.dataclass(frozen=True)
class Turns:
  row: int
  seen: tuple = ()


class ScriptedEnv:
  """Answers each turn with an observation of the row's own length ("[" + "o" * k + "]"), ends after 3 turns;
  row 0 gets a final observation on its second turn. Records the text of every turn it is shown."""
  stop_strings = STOPS

  def reset(self, example, seed):
    return Turns(example["row"])

  def step(self, states, turns, run):
    out = []
    for st, text in zip(states, turns):
      st = dataclasses.replace(st, seen=st.seen + (text,))
      k = len(st.seen)
      if k == 3:
        out.append(Step(None, st))
      else:
        final = k == 2 and st.row == 0
        out.append(Step("[" + "o" * (1 + len(text) % 3) + "]", st, {"answered": 1}, done=final))
    return out

  def summary(self, st):
    return {"turns": list(st.seen)}


def _episodes(model, b=6, turn_tokens=6, capacity=40, temperature=1.0):
  net, params = model
  prompt = jnp.asarray(np.random.default_rng(1).integers(3, TOK.vocab_size, (b, 5)), jnp.int32)
  mask = jnp.ones((b, 5), bool)
  sampling = SamplingConfig(max_new_tokens=capacity, temperature=temperature, stop_ids=TOK.stop_ids,
                            pad_id=TOK.pad_id)
  state = prefill(net, params, prompt, mask, jax.random.key(3), capacity, TOK.pad_id)
  env = ScriptedEnv()
  states = [env.reset({"row": r}, 0) for r in range(b)]
  state, episodes = run_episodes(net, params, state, sampling, env, states, [None] * b, lambda calls: [], TOK,
                                 PlainRenderer(STOPS), TurnBudget(4, turn_tokens), stop_string_table(TOK, STOPS))
  return prompt, mask, sampling, state, episodes


def test_turns_are_the_sampled_tokens_and_the_trainer_scores_them_as_sampled(model):
  prompt, mask, sampling, state, episodes = _episodes(model)
  out = rollout_arrays(state, episodes, TOK.pad_id)
  for r in range(len(out["lengths"])):
    n = out["lengths"][r]
    toks, turn, seg, train = (out[k][r, :n] for k in ("response", "turn_ids", "segment_ids", "loss_mask"))
    assert not out["response_mask"][r, n:].any() and out["response_mask"][r, :n].all()
    seen = episodes.states[r].seen
    assert out["num_calls"][r] == len(seen)
    for k, text in enumerate(seen):
      # turn k's trained tokens are exactly what the environment was shown as turn k, whatever came later
      assert TOK.decode(toks[(turn == k) & train].tolist()) == text
      obs = toks[(turn == k) & ~train]
      if k < len(seen) - 1 or obs.size:
        assert TOK.decode(obs.tolist()).startswith("[")
    kinds = np.where(train, np.where(turn == turn[train].max(), SEGMENT_KINDS["summary"], SEGMENT_KINDS["tool_call"]),
                     SEGMENT_KINDS["observation"])
    np.testing.assert_array_equal(seg, kinds)
    assert (out["logprobs"][r, :n][~train] == 0).all()
  assert episodes.counts["answered"] > 0 and episodes.finished[0]
  # The trainer's teacher-forced log-probs over [prompt | response] equal the sampler's on every trained token.
  net, params = model
  tokens = jnp.concatenate([prompt, jnp.asarray(out["response"])], axis=1)
  attn = jnp.concatenate([mask, jnp.asarray(out["response_mask"])], axis=1)
  scored = np.asarray(score_response(net, params, tokens, attn, out["response"].shape[1], sampling))
  np.testing.assert_allclose(scored[out["loss_mask"]], out["logprobs"][out["loss_mask"]], atol=2e-5)


def test_moe_routing_is_compacted_with_the_tokens_and_replays_exactly():
  """An MoE policy: the routing recorded for the compacted response replays to the sampler's log-probs."""
  cfg = CFG.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
  moe = (Transformer(cfg), init_params(cfg, jax.random.key(0)))
  prompt, mask, sampling, state, episodes = _episodes(moe, b=4)
  out = rollout_arrays(state, episodes, TOK.pad_id)
  tokens = jnp.concatenate([prompt, jnp.asarray(out["response"])], axis=1)
  attn = jnp.concatenate([mask, jnp.asarray(out["response_mask"])], axis=1)
  scored = np.asarray(score_response(moe[0], moe[1], tokens, attn, out["response"].shape[1], sampling,
                                     routed=jnp.asarray(out["routed_experts"])))
  train = out["loss_mask"]
  assert (out["segment_ids"] == SEGMENT_KINDS["observation"]).any()
  np.testing.assert_allclose(scored[train], out["logprobs"][train], atol=2e-5)


def test_stop_strings_end_turns_where_the_text_first_contains_one(model):
  _, _, _, state, episodes = _episodes(model)
  turns = [t for st in episodes.states for t in st.seen]
  stopped = [t for t in turns if any(s in t for s in STOPS)]
  assert stopped and len(stopped) < len(turns)     # both kinds of turn end occur
  for t in stopped:                                 # the turn ends at the first stop string, not later
    assert not any(s in t[:-1] for s in STOPS)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES.names()))
def test_observation_tokens_get_no_gradient_in_any_policy_loss(model, name):
  _, _, _, state, episodes = _episodes(model)
  out = rollout_arrays(state, episodes, TOK.pad_id)
  train = jnp.asarray(out["loss_mask"])
  observed = out["segment_ids"] == SEGMENT_KINDS["observation"]
  assert observed.any()
  old = jnp.asarray(out["logprobs"])
  adv = jnp.asarray(np.random.default_rng(0).normal(size=train.shape), jnp.float32)

  def loss(logp):
    per_token, _ = POLICY_LOSSES.get(name)(logp, old, adv, train)
    return aggregate(per_token, train, "token-mean")

  grad = np.asarray(jax.grad(loss)(old + 0.1))
  assert np.abs(grad[observed]).max() == 0 and np.abs(grad[out["loss_mask"]]).max() > 0
