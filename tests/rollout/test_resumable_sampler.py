"""Resumable sampler: prefill + decode_until is generate bit for bit; append continues the live cache exactly as
re-encoding the whole context would; stop sets, budgets and capacity are respected across calls."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.types import SEGMENT_KINDS
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.rollout.mismatch import LogitNoise
from rlkit.rollout.resumable import append, decode_layout_params, decode_until, prefill, to_rollout
from rlkit.rollout.sampler import SamplingConfig, generate
from rlkit.rollout.scoring import score_response

CFG = TransformerConfig(vocab_size=48, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, rope_theta=10_000.0)
MOE = CFG.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
STOPS = (3, 8, 13, 21, 30, 41)    # ~1/8 of the vocabulary: rows stop at different steps
# The multi-turn tests share these static shapes and configs, so their jitted pieces compile once.
CAP = 12
FIRST = SamplingConfig(max_new_tokens=5, stop_ids=STOPS)


@pytest.fixture(scope="module")
def models():
  return {name: (Transformer(c), init_params(c, jax.random.key(0))) for name, c in (("dense", CFG), ("moe", MOE))}


def _prompts(b=4, p=6):
  tokens = jax.random.randint(jax.random.key(1), (b, p), 3, CFG.vocab_size)
  mask = jnp.arange(p)[None, :] >= jnp.array([0, 2, 3, 5])[:b, None]
  return jnp.where(mask, tokens, 0), mask


def _full_forward(model, params, prompt, mask, state):
  """One forward pass over [prompt | the state's whole buffer] with its attention mask; and the logits at the
  last column written, which predict each live row's next token (causal: later columns change nothing)."""
  tokens = jnp.concatenate([prompt, state.tokens], axis=1)
  attn = jnp.concatenate([mask, state.mask], axis=1)
  out = model.apply({"params": params}, tokens, None, attn, method=Transformer.forward)
  return tokens, attn, out, np.asarray(out.logits[:, prompt.shape[1] + int(state.used) - 1])


@pytest.mark.parametrize("name,cfg,noise", [
    ("dense", SamplingConfig(max_new_tokens=8, temperature=0.7, top_k=10, top_p=0.9, stop_ids=STOPS, pad_id=1),
     False),
    ("dense", SamplingConfig(max_new_tokens=8, top_p=0.95, pad_id=1), True),
    ("moe", SamplingConfig(max_new_tokens=8, greedy=True, stop_ids=STOPS), False),
], ids=["topk-topp-stops", "perturb", "moe-greedy"])
def test_prefill_then_decode_until_is_generate_bit_for_bit(models, name, cfg, noise):
  model, params = models[name]
  prompt, mask = _prompts()
  key = jax.random.key(11)
  perturb = LogitNoise(0.3, "tail", cfg) if noise else None
  ref = generate(model, params, prompt, mask, key, cfg, perturb=perturb)
  state = decode_until(model, params, prefill(model, params, prompt, mask, key, cfg.max_new_tokens, cfg.pad_id),
                       cfg, perturb=perturb)
  out = to_rollout(state, prompt, mask, ref.group_ids)
  for field in ("response", "logprobs", "response_mask", "lengths", "finished"):
    np.testing.assert_array_equal(getattr(out, field), getattr(ref, field), err_msg=field)
  assert set(out.extras) == set(ref.extras) == ({"routed_experts", "routed_weights"} if name == "moe" else set())
  assert not state.appended.any()
  np.testing.assert_array_equal(out.loss_mask, ref.response_mask)     # single-turn: trained = attended
  if cfg.stop_ids and not cfg.greedy:     # the case has teeth: some rows stop, some run to the budget
    assert ref.finished.any() and not ref.finished.all()
  if name == "moe":
    for extra in ("routed_experts", "routed_weights"):
      np.testing.assert_array_equal(out.extras[extra], ref.extras[extra])
    # Resuming changes nothing: greedy decoding split in two calls (the last token fed after the first
    # loop, the second call drawing from the state's logits) gives the same tokens and routing as one.
    split = prefill(model, params, prompt, mask, key, cfg.max_new_tokens, cfg.pad_id)
    split = decode_until(model, params, split, cfg, budget=4)
    split = decode_until(model, params, split, cfg, budget=4)
    np.testing.assert_array_equal(split.tokens, ref.response)
    np.testing.assert_allclose(split.logprobs, ref.logprobs, atol=1e-6)
    real = np.asarray(ref.attention_mask)      # (a finished row's masked pad steps route as they fall)
    np.testing.assert_array_equal(np.asarray(split.routed["routed_experts"])[real],
                                  np.asarray(ref.extras["routed_experts"])[real])


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_append_then_decode_equals_reencoding_the_whole_context(models, name):
  model, params = models[name]
  prompt, mask = _prompts()
  # The pieces take the params as they are or with the decode layout's copies made once: both are used.
  pp = decode_layout_params(model, params) if name == "moe" else params
  state = decode_until(model, pp, prefill(model, pp, prompt, mask, jax.random.key(2), CAP), FIRST)
  done1, used1 = np.asarray(state.done), int(state.used)
  assert done1.any() and not done1.all() and used1 == 5     # holes after early stops; a row hits the budget
  # A left-padded observation of 1-4 tokens per row; one stopped row gets none and must stay stopped.
  quiet = int(np.flatnonzero(done1)[0])
  counts = np.array([4, 1, 3, 2])
  counts[quiet] = 0
  obs_mask = np.arange(4)[None, :] >= 4 - counts[:, None]
  obs = np.where(obs_mask, np.arange(40, 44)[None, :] - np.arange(4)[:, None], 7)
  state = append(model, pp, state, obs, obs_mask)
  assert int(state.used) == used1 + 4
  np.testing.assert_array_equal(state.done, done1 & (counts == 0))

  _, attn, _, next_logits = _full_forward(model, params, prompt, mask, state)
  live = counts > 0
  np.testing.assert_allclose(np.asarray(state.logits)[live], next_logits[live], atol=1e-5)
  np.testing.assert_array_equal(np.asarray(state.positions), np.asarray(attn.sum(1)))
  cols = slice(used1, used1 + 4)
  np.testing.assert_array_equal(np.asarray(state.appended)[:, cols], obs_mask)
  np.testing.assert_array_equal(np.asarray(state.tokens)[:, cols], np.where(obs_mask, obs, 0))
  np.testing.assert_array_equal(np.asarray(state.logprobs)[:, cols], 0.0)

  before = jax.tree.map(np.asarray, (state.tokens, state.mask, state.appended))
  state = decode_until(model, pp, state, FIRST, stop_ids=(), budget=3)
  # The second call writes after the appended tokens, for the rows given one, and leaves the rest as it was.
  assert int(state.used) == used1 + 4 + 3 == CAP
  for a, b in zip(before, (state.tokens, state.mask, state.appended)):
    np.testing.assert_array_equal(np.asarray(b)[:, :used1 + 4], a[:, :used1 + 4])
  np.testing.assert_array_equal(np.asarray(state.mask)[:, used1 + 4:], np.broadcast_to(live[:, None], (4, 3)))
  sampled = np.asarray(state.sampled_mask)
  assert not (sampled & np.asarray(state.appended)).any()
  rollout = to_rollout(state, prompt, mask, jnp.arange(4))
  np.testing.assert_array_equal(rollout.loss_mask, sampled)
  np.testing.assert_array_equal(rollout.segment_ids == SEGMENT_KINDS["observation"], np.asarray(state.appended))

  tokens, attn, full, next_logits = _full_forward(model, params, prompt, mask, state)
  # The sampler's log-probs of every sampled token, both turns, are the trainer's re-score of the whole
  # multi-turn sequence; the observations are attended but not sampled (log-prob 0).
  rescored = score_response(model, params, tokens, attn, state.capacity, FIRST)
  np.testing.assert_allclose(np.asarray(rescored)[sampled], np.asarray(state.logprobs)[sampled], atol=1e-5)
  assert (np.asarray(state.logprobs)[~sampled] == 0).all()
  np.testing.assert_allclose(np.asarray(state.logits)[live], next_logits[live], atol=1e-5)
  if name == "moe":   # routing of prompt, sampled and appended tokens: that of the full forward
    same = np.sort(np.asarray(state.routed["routed_experts"]), -1) == np.sort(np.asarray(full.routed_experts), -1)
    assert same.all(axis=(-1, -2))[np.asarray(attn)].all()


def test_decode_until_respects_stop_set_budget_and_capacity(models):
  model, params = models["dense"]
  prompt, mask = _prompts()
  state = decode_until(model, params, prefill(model, params, prompt, mask, jax.random.key(5), CAP), FIRST)
  tok, m = np.asarray(state.tokens), np.asarray(state.mask)
  done, used = np.asarray(state.done), int(state.used)
  assert done.any() and not done.all() and used == 5
  for row in range(4):
    n = int(m[row].sum())
    assert m[row, :n].all() and (tok[row, n:] == FIRST.pad_id).all()
    stops = np.isin(tok[row, :n], STOPS)
    if done[row]:
      assert stops[-1] and not stops[:-1].any() and n < 5
    else:
      assert not stops.any() and n == 5

  # Without stops, 3 more per call: stopped rows draw nothing, the others continue where they were cut;
  # the third call is cut at 1 token by the capacity, and a fourth leaves the full buffer as it is.
  for used in (8, 11, 12):
    state = decode_until(model, params, state, FIRST, stop_ids=(), budget=3)
    assert int(state.used) == used
  m = np.asarray(state.mask)
  np.testing.assert_array_equal(m[:, 5:], np.broadcast_to(~done[:, None], (4, CAP - 5)))
  full_tokens = np.asarray(state.tokens)
  state = decode_until(model, params, state, FIRST, stop_ids=(), budget=3)
  np.testing.assert_array_equal(np.asarray(state.tokens), full_tokens)
  with pytest.raises(ValueError, match="do not fit"):
    append(model, params, state, np.ones((4, 1), np.int32), np.ones((4, 1), bool))
