"""Cross-tokenizer OPD: alignment masks and spans (exact on hand-made and real tokenizations, invariants on
random ones), the cache, batching, the shared vocabulary and renormalisation, span sums and the advantage."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.bpe import bpe_tokenizer
from rlkit.models.tokenizer import CharTokenizer
from rlkit.objectives.xtok import (MODES, align, align_batch, renormalise, shared_vocab, span_logp,
                                   teacher_at_student, xtok_opd_adv)

CHARS = "0123456789+= caféok€😀"   # a char tokenizer for the multi-byte text below
CORPUS = [f"{a}+{b}={a + b}" for a in range(0, 400, 7) for b in range(3, 900, 31)] + ["café €5 😀 ok"] * 30


@pytest.fixture(scope="module")
def bpes():
  return bpe_tokenizer(CORPUS, 280), bpe_tokenizer(CORPUS, 400)


def _offsets(cuts, n):
  """Offsets of the segmentation of n characters at the positions `cuts`."""
  edges = [0, *cuts, n]
  return [(a, b) for a, b in zip(edges[:-1], edges[1:])]


def _check_invariants(al, s_off, t_off):
  """What any alignment must satisfy, from the definitions in rlkit/objectives/xtok.py."""
  for i, (s, e) in enumerate(s_off):
    if al.aligned[i]:
      assert t_off[al.teacher_index[i]] == (s, e) and al.span_id[i] == -1
      assert sum(o == (s, e) for o in s_off) == 1   # strictly: no other student token shares the span
    else:
      assert al.teacher_index[i] == -1 and 0 <= al.span_id[i] < al.n_spans
      lo, hi = al.span_bounds[al.span_id[i]]
      assert lo <= s and e <= hi
  for k, (lo, hi) in enumerate(al.span_bounds):
    for ids, off in ((al.span_id, s_off), (al.teacher_span_id, t_off)):
      inside = [off[i] for i in np.flatnonzero(ids == k)]
      assert inside and min(s for s, _ in inside) == lo and max(e for _, e in inside) == hi
  assert set(np.flatnonzero(al.teacher_span_id == -1)) == set(al.teacher_index[al.aligned].tolist())
  assert np.all(np.diff(al.span_bounds.reshape(-1)) >= 0)   # spans in text order, disjoint


# ---------------------------------------------------------------------------------------------- align


def test_identical_tokenizations_align_everywhere(bpes):
  text = "12+345=357, 999+1=1000"
  for tok in (CharTokenizer(), *bpes):
    _, off = tok.encode_with_offsets(text)
    al = align(off, off)
    assert al.aligned.all() and al.n_spans == 0 and al.span_bounds.shape == (0, 2)
    np.testing.assert_array_equal(al.teacher_index, np.arange(len(off)))
    assert (al.span_id == -1).all() and (al.teacher_span_id == -1).all()


def test_hand_made_ascii_example_is_exact():
  # "12+345=357": student 12|+|34|5|=|357, teacher 1|2|+|345|=|35|7
  s = [(0, 2), (2, 3), (3, 5), (5, 6), (6, 7), (7, 10)]
  t = [(0, 1), (1, 2), (2, 3), (3, 6), (6, 7), (7, 9), (9, 10)]
  al = align(s, t)
  np.testing.assert_array_equal(al.aligned, [False, True, False, False, True, False])
  np.testing.assert_array_equal(al.teacher_index, [-1, 2, -1, -1, 4, -1])
  np.testing.assert_array_equal(al.span_id, [0, -1, 1, 1, -1, 2])
  np.testing.assert_array_equal(al.teacher_span_id, [0, 0, -1, 1, -1, 2, 2])
  np.testing.assert_array_equal(al.span_bounds, [[0, 2], [3, 6], [7, 10]])
  assert al.n_spans == 3


def test_split_characters_are_never_aligned_and_join_a_span():
  # "aé€b", byte-level: student a|Ã|©|âĤ¬|b (é split), teacher a|Ã©|â|Ĥ¬|b (€ split)
  s = [(0, 1), (1, 2), (1, 2), (2, 3), (3, 4)]
  t = [(0, 1), (1, 2), (2, 3), (2, 3), (3, 4)]
  al = align(s, t)
  np.testing.assert_array_equal(al.aligned, [True, False, False, False, True])
  np.testing.assert_array_equal(al.teacher_index, [0, -1, -1, -1, 4])
  np.testing.assert_array_equal(al.span_id, [-1, 0, 0, 1, -1])
  np.testing.assert_array_equal(al.teacher_span_id, [-1, 0, 1, 1, -1])
  np.testing.assert_array_equal(al.span_bounds, [[1, 2], [2, 3]])
  # Both split é the same way: the same bytes, but no character offset tells them apart, so still a span.
  al = align([(0, 1), (0, 1), (1, 2)], [(0, 1), (0, 1), (1, 2)])
  np.testing.assert_array_equal(al.aligned, [False, False, True])
  np.testing.assert_array_equal(al.span_id, [0, 0, -1])
  # A token across two characters chains them into one unit: "éñx" as Ã|©Ã|±x against chars.
  al = align([(0, 1), (0, 2), (1, 3)], [(0, 1), (1, 2), (2, 3)])
  assert not al.aligned.any() and al.n_spans == 1 and al.span_bounds.tolist() == [[0, 3]]
  np.testing.assert_array_equal(al.teacher_span_id, [0, 0, 0])


def test_zero_width_markers_join_the_next_token():
  # A prepended marker (0, 0) then "ab": one unit (0, 2) of two tokens, against a|b.
  al = align([(0, 0), (0, 2)], [(0, 1), (1, 2)])
  assert not al.aligned.any() and al.span_id.tolist() == [0, 0] and al.span_bounds.tolist() == [[0, 2]]
  al = align([(0, 0), (0, 1), (1, 2)], [(0, 1), (1, 2)])
  np.testing.assert_array_equal(al.aligned, [False, False, True])
  assert align([], []).n_spans == 0


def test_real_tokenizers_with_multibyte_text(bpes):
  small, large = bpes
  text = "12+345=357 café €5 😀 ok 999+1=1000 é€😀"
  for s_tok, t_tok in ((small, large), (large, small), (CharTokenizer(CHARS), large)):
    _, s_off = s_tok.encode_with_offsets(text)
    _, t_off = t_tok.encode_with_offsets(text)
    al = align(s_off, t_off)
    _check_invariants(al, s_off, t_off)
    assert 0 < al.aligned.sum() < len(s_off) and al.n_spans > 0
    # Every character of the text is in exactly one aligned token or one span.
    covered = sorted([s_off[i] for i in np.flatnonzero(al.aligned)] + [tuple(b) for b in al.span_bounds])
    assert "".join(text[a:b] for a, b in covered) == text



def test_random_segmentations_satisfy_the_invariants():
  rng = np.random.default_rng(0)
  for _ in range(200):
    n = int(rng.integers(1, 25))
    cuts = [sorted(rng.choice(np.arange(1, n), size=int(rng.integers(0, n)), replace=False).tolist())
            if n > 1 else [] for _ in range(2)]
    s_off, t_off = _offsets(cuts[0], n), _offsets(cuts[1], n)
    al = align(s_off, t_off)
    _check_invariants(al, s_off, t_off)
    shared = {0, n} | (set(cuts[0]) & set(cuts[1]))
    # The segments between shared boundaries are each an aligned pair or a span.
    assert al.aligned.sum() + al.n_spans == len(shared) - 1


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="cover different characters"):
    align([(0, 1), (1, 2)], [(0, 1)])
  with pytest.raises(ValueError, match="in text order"):
    align([(1, 2), (0, 1)], [(0, 1), (1, 2)])
  with pytest.raises(ValueError, match=r"student token 1 has span \(2, 1\).*0 <= start <= end"):
    align([(0, 2), (2, 1)], [(0, 1)])
  with pytest.raises(ValueError, match="integer \\(start, end\\) pairs"):
    align([(0.0, 1.5)], [(0, 1)])


def test_cache_returns_the_same_read_only_object():
  s, t = [(0, 2), (2, 3), (3, 4)], [(0, 1), (1, 3), (3, 4)]
  first = align(s, t)
  hits = align.cache_info().hits
  assert align(list(s), tuple(t)) is first and align(np.array(s), t) is first
  assert align.cache_info().hits == hits + 2
  with pytest.raises(ValueError, match="read-only"):
    first.aligned[0] = True


# ---------------------------------------------------------------------------------------------- batch


def test_align_batch_pads_to_static_shapes_and_offsets_columns():
  rows = [([(0, 2), (2, 3)], [(0, 1), (1, 2), (2, 3)]), ([(0, 1)], [(0, 1)])]
  b = align_batch(rows, student_start=[1, 0], teacher_start=[2, 0])
  assert b.aligned.shape == (2, 8) and b.teacher_span_id.shape == (2, 8) and b.span_mask.shape == (2, 8)
  np.testing.assert_array_equal(b.aligned[:, :3], [[False, False, True], [True, False, False]])
  np.testing.assert_array_equal(b.teacher_index[:, :3], [[-1, -1, 4], [0, -1, -1]])
  np.testing.assert_array_equal(b.span_id[:, :3], [[-1, 0, -1], [-1, -1, -1]])
  np.testing.assert_array_equal(b.teacher_span_id[:, :5], [[-1, -1, 0, 0, -1], [-1] * 5])
  np.testing.assert_array_equal(b.span_mask[:, :2], [[True, False], [False, False]])
  np.testing.assert_array_equal(b.n_spans, [1, 0])
  assert b.span_bounds[0, 0].tolist() == [0, 2] and not b.span_bounds[0, 1:].any()
  b = align_batch(rows, student_len=3, teacher_len=3, max_spans=1)
  assert b.aligned.shape == (2, 3) and b.span_mask.shape == (2, 1)
  with pytest.raises(ValueError, match="more than spans width 0"):
    align_batch(rows, max_spans=0)


# ---------------------------------------------------------------------------------------------- vocab


def test_shared_vocab_pairs_identical_strings(bpes):
  s_ids, t_ids = shared_vocab({"a": 0, "b": 1, "ab": 2, "<eos>": 3}, {"ab": 7, "a": 5, "c": 6, "<eos>": 0})
  assert s_ids.tolist() == [0, 2, 3] and t_ids.tolist() == [5, 7, 0]
  small, large = bpes
  s_ids, t_ids = shared_vocab(small.get_vocab(), large.get_vocab())
  assert len(s_ids) == small.vocab_size   # the smaller vocabulary's merges are a prefix of the larger's
  with pytest.raises(ValueError, match="share no token"):
    shared_vocab({"a": 0}, {"b": 0})


def test_renormalise_keeps_ratios_and_reports_the_exact_dropped_mass():
  logits = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 11)) * 2.0
  logp = jax.nn.log_softmax(logits)
  ids = jnp.array([0, 3, 4, 9])
  sub, dropped = jax.jit(renormalise)(logp, ids)
  p = np.exp(np.asarray(logp, np.float64))
  kept = p[..., np.asarray(ids)]
  np.testing.assert_allclose(np.exp(sub), kept / kept.sum(-1, keepdims=True), rtol=1e-5)
  np.testing.assert_allclose(dropped, 1.0 - kept.sum(-1), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(sub)[..., 1] - np.asarray(sub)[..., 2],
                             np.asarray(logp)[..., 3] - np.asarray(logp)[..., 4], atol=1e-5)
  # Logits give the same, and the whole vocabulary drops nothing.
  sub2, dropped2 = renormalise(logits, ids)
  np.testing.assert_allclose(sub2, sub, atol=1e-5)
  np.testing.assert_allclose(dropped2, dropped, atol=1e-6)
  full, none = renormalise(logp, jnp.arange(11))
  np.testing.assert_allclose(full, logp, atol=1e-6)
  np.testing.assert_allclose(none, 0.0, atol=1e-6)


# ---------------------------------------------------------------------------------------------- advantage


def test_span_logp_sums_exactly_and_ignores_padding():
  logp = jnp.array([[-1.0, -2.0, -0.5, -np.inf], [-0.25, -3.0, -1.0, -2.0]])
  span_id = jnp.array([[0, 0, 2, -1], [1, -1, 1, 0]])
  out = jax.jit(span_logp, static_argnums=2)(logp, span_id, 3)
  np.testing.assert_array_equal(out, [[-3.0, 0.0, -0.5], [-2.0, -1.25, 0.0]])


def test_teacher_at_student_moves_values_and_rows():
  t = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
  idx = jnp.array([[3, -1, 0], [-1, 1, 2]])
  np.testing.assert_array_equal(teacher_at_student(t[..., 0], idx), [[9, 0, 0], [0, 15, 18]])
  np.testing.assert_array_equal(teacher_at_student(t, idx)[0, 0], [9, 10, 11])
  np.testing.assert_array_equal(teacher_at_student(t, idx)[0, 1], [0, 0, 0])


def test_xtok_opd_adv_modes():
  s = jnp.array([[-1.0, -2.0, -0.5, -np.inf]])
  t_al = jnp.array([[-0.5, 0.0, 0.0, 0.0]])
  aligned = jnp.array([[True, False, False, False]])
  span_id = jnp.array([[-1, 0, 0, -1]])
  s_span, t_span = jnp.array([[-2.5, 0.0]]), jnp.array([[-1.0, -9.0]])
  adv_fn = jax.jit(xtok_opd_adv, static_argnames="mode")
  adv = {m: adv_fn(s, t_al, aligned, span_id, s_span, t_span, mode=m) for m in MODES}
  np.testing.assert_array_equal(adv["aligned"], [[0.5, 0.0, 0.0, 0.0]])
  np.testing.assert_array_equal(adv["spans"], [[0.0, 1.5, 1.5, 0.0]])
  np.testing.assert_array_equal(adv["both"], [[0.5, 1.5, 1.5, 0.0]])
  g = jax.grad(lambda x: xtok_opd_adv(x, t_al, aligned, span_id, s_span, t_span, "both").sum())(s)
  assert not np.asarray(g).any()   # stop-gradient
  with pytest.raises(ValueError, match="aligned, spans, both"):
    xtok_opd_adv(s, t_al, aligned, span_id, s_span, t_span, mode="all")


def test_end_to_end_identical_models_give_zero_and_spans_match_token_sums(bpes):
  """Spans from two real tokenizers, log-probs from one shared per-character model: the sum of token
  log-probs is the same for any tokenisation of a span, so the spans advantage vanishes exactly."""
  small, large = bpes
  texts = ["12+345=357", "999+1=1000 é€😀", "305+62=367"]
  char_logp = {c: -0.1 * (i + 1) for i, c in enumerate(sorted(set("".join(texts))))}
  pairs, s_lp, t_lp = [], [], []
  for text in texts:
    s_off, t_off = small.encode_with_offsets(text)[1], large.encode_with_offsets(text)[1]
    pairs.append((s_off, t_off))
    # Each character's log-prob counted once, on the last token that touches it.
    for off, out in ((s_off, s_lp), (t_off, t_lp)):
      last = {c: i for i, (a, b) in enumerate(off) for c in range(a, b)}
      out.append([sum(char_logp[text[c]] for c in last if last[c] == i) for i in range(len(off))])
  b = align_batch(pairs)
  pad = lambda rows, w: jnp.array([r + [0.0] * (w - len(r)) for r in rows])
  s_tok, t_tok = pad(s_lp, b.aligned.shape[1]), pad(t_lp, b.teacher_span_id.shape[1])
  nsp = b.span_mask.shape[1]
  s_span = span_logp(s_tok, jnp.asarray(b.span_id), nsp)
  t_span = span_logp(t_tok, jnp.asarray(b.teacher_span_id), nsp)
  np.testing.assert_allclose(s_span, t_span, atol=1e-5)
  t_on = teacher_at_student(t_tok, jnp.asarray(b.teacher_index))
  for mode in MODES:
    adv = xtok_opd_adv(s_tok, t_on, b.aligned, jnp.asarray(b.span_id), s_span, t_span, mode)
    np.testing.assert_allclose(adv, 0.0, atol=1e-5)
  assert b.n_spans.sum() > 0 and b.aligned.sum() > 0
