"""Sampler: greedy = step-wise argmax, log-probs = trainer re-score, exact top-k/top-p, unbiased sampling."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.rollout.sampler import SamplingConfig, generate, processed_logprobs
from rlkit.rollout.scoring import response_forward, response_logprobs

CFG = TransformerConfig(vocab_size=48, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, rope_theta=10_000.0)
MOE = CFG.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


@pytest.fixture(scope="module")
def dense():
  return Transformer(CFG), init_params(CFG, jax.random.key(0))


def _prompts(b=4, p=6, vocab=48):
  tokens = jax.random.randint(jax.random.key(1), (b, p), 3, vocab)
  mask = jnp.arange(p)[None, :] >= jnp.array([0, 2, 3, 5])[:b, None]
  return jnp.where(mask, tokens, 0), mask


def test_greedy_equals_stepwise_argmax_of_full_forward(dense):
  model, params = dense
  prompt, mask = _prompts()
  out = generate(model, params, prompt, mask, jax.random.key(0), SamplingConfig(max_new_tokens=7, greedy=True))
  # Full forwards over a fixed-length buffer (one compile): causal attention keeps the not-yet-written slots
  # out of every earlier position's logits, and positions come from the mask.
  p = prompt.shape[1]
  tokens, m = jnp.pad(prompt, ((0, 0), (0, 7))), jnp.pad(mask, ((0, 0), (0, 7)))
  forward = jax.jit(lambda t, a: model.apply({"params": params}, t, attention_mask=a))
  for i in range(7):
    nxt = jnp.argmax(forward(tokens, m)[:, p + i - 1], -1)
    tokens, m = tokens.at[:, p + i].set(nxt), m.at[:, p + i].set(True)
  np.testing.assert_array_equal(out.response, tokens[:, p:])


@pytest.mark.parametrize("cfg", [
    SamplingConfig(max_new_tokens=8),
    SamplingConfig(max_new_tokens=8, temperature=0.7, top_k=10, top_p=0.9),
], ids=["t1", "t0.7-topk-topp"])
def test_logprobs_equal_trainer_rescore(dense, cfg):
  model, params = dense
  prompt, mask = _prompts()
  out = generate(model, params, prompt, mask, jax.random.key(3), cfg)
  rescored = response_logprobs(model, params, out, cfg)
  assert np.all(np.isfinite(out.logprobs))
  np.testing.assert_allclose(rescored, out.logprobs, atol=1e-5)
  assert float(jnp.abs(out.logprobs).sum()) > 0


def test_stop_tokens_end_rows_and_mask_the_rest(dense):
  model, params = dense
  prompt, mask = _prompts()
  free = generate(model, params, prompt, mask, jax.random.key(4), SamplingConfig(max_new_tokens=12))
  stop = int(free.response[0, 2])          # row 0 emits this token at step 2 (same key => same draws)
  out = generate(model, params, prompt, mask, jax.random.key(4),
                 SamplingConfig(max_new_tokens=12, stop_ids=(stop,), pad_id=0))
  resp, m = np.asarray(out.response), np.asarray(out.response_mask)
  assert out.finished[0] and out.lengths[0] <= 3
  for i in range(4):
    n = int(out.lengths[i])
    assert m[i, :n].all() and not m[i, n:].any()
    assert (resp[i, n:] == 0).all() and (np.asarray(out.logprobs)[i, n:] == 0).all()
    if out.finished[i]:
      assert resp[i, n - 1] == stop and stop not in resp[i, :n - 1]
    else:
      assert n == 12
  # Before a row stops, the draws are the same as without stop tokens.
  np.testing.assert_array_equal(resp[0, :3], np.asarray(free.response)[0, :3])


def test_early_exit_when_all_rows_finish(dense):
  model, params = dense
  prompt, mask = _prompts()
  every_token = tuple(range(CFG.vocab_size))
  out = generate(model, params, prompt, mask, jax.random.key(5),
                 SamplingConfig(max_new_tokens=10, stop_ids=every_token))
  np.testing.assert_array_equal(out.lengths, 1)
  assert out.finished.all()


def _reference_mask(logits, k, p):
  x = np.asarray(logits, np.float64)
  keep = np.ones_like(x, bool)
  if k:
    keep &= x >= np.sort(x)[-k]
  if p < 1:
    order = np.argsort(-np.where(keep, x, -np.inf))
    probs = np.exp(x - x.max()) * keep
    probs /= probs.sum()
    cum, nucleus = 0.0, np.zeros_like(keep)
    for i in order:
      if cum >= p:
        break
      nucleus[i] = True
      cum += probs[i]
    keep &= nucleus
  return keep


@pytest.mark.parametrize("k,p", [(5, 1.0), (0, 0.6), (12, 0.8), (1, 1.0), (0, 0.999)])
def test_top_k_top_p_masks_are_exact(k, p):
  logits = jax.random.normal(jax.random.key(6), (8, 48)) * 3
  logp = processed_logprobs(logits, SamplingConfig(max_new_tokens=1, top_k=k, top_p=p))
  for row in range(8):
    keep = _reference_mask(logits[row], k, p)
    np.testing.assert_array_equal(np.isfinite(logp[row]), keep)
    kept = np.asarray(logits[row], np.float64)[keep]
    np.testing.assert_allclose(np.asarray(logp[row])[keep], kept - np.log(np.exp(kept).sum()), atol=1e-5)


def test_empirical_distribution_matches_softmax(dense):
  """Chi-square goodness of fit of 8192 first-token draws at temperature 1 (fixed seed)."""
  model, params = dense
  n = 8192
  prompt = jnp.tile(jnp.array([[5, 9, 11]], jnp.int32), (n, 1))
  out = generate(model, params, prompt, jnp.ones_like(prompt, bool), jax.random.key(7),
                 SamplingConfig(max_new_tokens=1))
  probs = np.asarray(jax.nn.softmax(model.apply({"params": params}, prompt[:1])[0, -1]), np.float64)
  counts = np.bincount(np.asarray(out.response[:, 0]), minlength=CFG.vocab_size)
  expected = probs * n
  big = expected >= 5          # pool rare tokens into one bin, as the chi-square test requires

  def pvalue(c):
    obs, exp = c[big], expected[big]
    if (~big).any():
      obs, exp = np.append(obs, c[~big].sum()), np.append(exp, expected[~big].sum())
    return scipy.stats.chisquare(obs, exp * obs.sum() / exp.sum())[1]

  assert pvalue(counts) > 1e-3
  # The same test must reject a wrong distribution (temperature 0.5): the check has teeth.
  cold = generate(model, params, prompt, jnp.ones_like(prompt, bool), jax.random.key(7),
                  SamplingConfig(max_new_tokens=1, temperature=0.5))
  assert pvalue(np.bincount(np.asarray(cold.response[:, 0]), minlength=CFG.vocab_size)) < 1e-6


def test_moe_rollout_records_routing_and_replay_rescores_exactly():
  params = init_params(MOE, jax.random.key(0))
  model = Transformer(MOE)
  prompt, mask = _prompts()
  cfg = SamplingConfig(max_new_tokens=6)
  out = generate(model, params, prompt, mask, jax.random.key(8), cfg)
  routed = out.extras["routed_experts"]
  assert routed.shape == (4, prompt.shape[1] + 6, len(MOE.moe_layers), 2)
  np.testing.assert_allclose(response_logprobs(model, params, out, cfg, replay_routing=True), out.logprobs,
                             atol=1e-5)
  _, full = response_forward(model, params, out.tokens, out.attention_mask, out.response.shape[1])
  valid = np.asarray(out.attention_mask)
  same = np.sort(np.asarray(full.routed_experts), -1) == np.sort(np.asarray(routed), -1)
  assert same.all(axis=(-1, -2))[valid].all()


def test_bad_sampling_config_is_rejected():
  with pytest.raises(ValueError, match="top_p"):
    SamplingConfig(max_new_tokens=4, top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    SamplingConfig(max_new_tokens=4, temperature=0.0)
