"""Cross-tokenizer on-policy distillation (OUR DESIGN, methods/llm.md §6): aligning a student's tokens with a
teacher's tokens of the same text, and the per-token advantage that supervises the student through them.

The teacher scores text the student sampled, under its own tokenizer; to give the student a per-token signal
we compare the two tokenizations by character offsets (`Tokenizer.encode_with_offsets`):

  unit            a maximal run of tokens whose spans overlap (byte-level BPE splits a multi-byte character,
                  and each piece reports the whole character's span); most units are one token
  boundaries      B_S, B_T = the start and end positions of the units;  shared = B_S ∩ B_T
  strictly aligned  a student token that is a unit by itself whose span equals a teacher one-token unit
  mismatch span   the text between consecutive shared boundaries, when it holds an unaligned token

Both tokenizations must cover the same characters (byte-level BPE and char tokenizers cover all of them), so
each span's text is read by both models and every unaligned token lies in exactly one span. Tokens of a
split character are never aligned one by one (they have no character offsets of their own to compare); they
join the span around them, so their signal reaches the student in the spans mode.

Advantage (stop-gradient, per student token t; span k(t) is the span holding t):

  aligned   a_t = [t aligned] (log p_T(y_t) - log p_S(y_t))
  spans     a_t = [t in span k] (log p_T(span k) - log p_S(span k)),   log p(span) = sum of the model's own
            token log-probs over its tokens in the span (`span_logp`, the same segment sum for both models)
  both      the sum (the two masks are disjoint)

For the aligned mode's full-distribution form, `shared_vocab` pairs the tokens with identical strings and
`renormalise` restricts each side's distribution to them (returning the mass it dropped, to log).

Host side (numpy, cached per sequence because the same sequence is aligned every epoch): `align`,
`align_batch`, `shared_vocab`. Device side (jittable): `renormalise`, `span_logp`, `teacher_at_student`,
`xtok_opd_adv`.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

MODES = ("aligned", "spans", "both")
# Sequences. An entry holds ~30 bytes a token (keys and arrays): 16k rows of 512 tokens take ~250 MB.
_CACHE_SIZE = 1 << 14

Offsets = tuple[tuple[int, int], ...]


class Alignment(NamedTuple):
  """One sequence's alignment (read-only arrays, shared through the cache)."""
  aligned: np.ndarray          # [Ts] bool: the student token is strictly aligned
  teacher_index: np.ndarray    # [Ts] int32: the teacher token with the identical span, -1 if none
  span_id: np.ndarray          # [Ts] int32: the student token's mismatch span, -1 for aligned tokens
  teacher_span_id: np.ndarray  # [Tt] int32: the teacher token's mismatch span, -1 for aligned tokens
  span_bounds: np.ndarray      # [Nsp, 2] int32: each span's character (start, end)
  n_spans: int


class AlignedBatch(NamedTuple):
  """A batch of alignments padded to static shapes, ready to enter a jitted step."""
  aligned: np.ndarray          # [B, Ts] bool
  teacher_index: np.ndarray    # [B, Ts] int32: a column of the teacher's [B, Tt] arrays, -1 if none
  span_id: np.ndarray          # [B, Ts] int32, -1 off spans (and on padding)
  teacher_span_id: np.ndarray  # [B, Tt] int32, -1 off spans (and on padding)
  span_mask: np.ndarray        # [B, Nsp] bool: the span exists
  span_bounds: np.ndarray      # [B, Nsp, 2] int32 character (start, end); 0 on padding
  n_spans: np.ndarray          # [B] int32


# ---------------------------------------------------------------------------------------------- host side


def _as_key(offsets, who: str) -> bytes:
  """The offsets as int32 bytes: a compact, hashable cache key (8 bytes a token, where a tuple of tuples
  costs ~100)."""
  arr = np.asarray(offsets)
  if arr.size and (arr.dtype.kind not in "iu" or arr.ndim != 2 or arr.shape[1] != 2):
    raise ValueError(f"align: {who} offsets must be integer (start, end) pairs, got an array of dtype "
                     f"{arr.dtype} and shape {arr.shape}. Pass the offsets from Tokenizer.encode_with_offsets.")
  arr = arr.astype(np.int32).reshape(-1, 2)
  bad = np.flatnonzero((arr[:, 0] < 0) | (arr[:, 0] > arr[:, 1]))
  if bad.size:
    raise ValueError(f"align: {who} token {bad[0]} has span {tuple(arr[bad[0]].tolist())}; spans must satisfy "
                     "0 <= start <= end. Pass the offsets from Tokenizer.encode_with_offsets.")
  back = np.flatnonzero((np.diff(arr, axis=0) < 0).any(-1)) + 1
  if back.size:
    i = back[0]
    raise ValueError(f"align: {who} token {i} span {tuple(arr[i].tolist())} goes back from token {i - 1}'s "
                     f"{tuple(arr[i - 1].tolist())}; offsets must be in text order (encode the text in one "
                     "call).")
  return arr.tobytes()


def _offsets(key: bytes) -> Offsets:
  return tuple(map(tuple, np.frombuffer(key, np.int32).reshape(-1, 2).tolist()))


def _units(offsets: Offsets) -> tuple[np.ndarray, list[tuple[int, int]], np.ndarray]:
  """(unit of each token [T], unit spans, tokens per unit [U]). A token joins the current unit when it starts
  before the unit ends (a split character) or the unit so far is zero-width (a marker, e.g. a prepended
  space symbol, belongs to the text after it); a trailing zero-width unit joins the one before."""
  unit_of = np.zeros(len(offsets), np.int32)
  spans: list[list[int]] = []
  for i, (s, e) in enumerate(offsets):
    if spans and (s < spans[-1][1] or spans[-1][0] == spans[-1][1]):
      spans[-1][1] = max(spans[-1][1], e)
    else:
      spans.append([s, e])
    unit_of[i] = len(spans) - 1
  if len(spans) > 1 and spans[-1][0] == spans[-1][1]:
    spans.pop()
    unit_of[unit_of == len(spans)] = len(spans) - 1
  return unit_of, [tuple(u) for u in spans], np.bincount(unit_of, minlength=len(spans))


def _coverage(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
  runs: list[list[int]] = []
  for s, e in spans:
    if s == e:
      continue
    if runs and s <= runs[-1][1]:
      runs[-1][1] = max(runs[-1][1], e)
    else:
      runs.append([s, e])
  return [tuple(r) for r in runs]


def _frozen(a: np.ndarray) -> np.ndarray:
  a.setflags(write=False)   # cached and shared between callers: a write would corrupt every later epoch
  return a


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _align(student: bytes, teacher: bytes) -> Alignment:
  s_unit, s_spans, s_size = _units(_offsets(student))
  t_unit, t_spans, t_size = _units(_offsets(teacher))
  s_cov, t_cov = _coverage(s_spans), _coverage(t_spans)
  if s_cov != t_cov:
    first = next((a, b) for a, b in zip(s_cov + [None], t_cov + [None]) if a != b)
    raise ValueError(f"align: the tokenizations cover different characters (student covers {first[0]}, "
                     f"teacher covers {first[1]}), so a span would compare different text. Use tokenizers that "
                     "cover every character (byte-level BPE, char), or offsets of the same text.")
  shared = np.array(sorted({b for u in s_spans for b in u} & {b for u in t_spans for b in u}), np.int64)

  # Each unit sits in the segment [shared[k], shared[k+1]) that holds its start: no unit straddles a shared
  # boundary, since a boundary of a tokenization is never inside one of its units.
  def segment(spans):
    return np.searchsorted(shared, np.array([s for s, _ in spans], np.int64), side="right") - 1

  s_seg, t_seg = segment(s_spans), segment(t_spans)
  n_seg = max(len(shared) - 1, 0)
  t_single = {span: u for u, span in enumerate(t_spans) if t_size[u] == 1 and span[0] < span[1]}
  t_first = np.searchsorted(t_unit, np.arange(len(t_spans)))       # the token of a one-token unit
  s_pair = np.array([t_single.get(span, -1) if s_size[u] == 1 else -1 for u, span in enumerate(s_spans)],
                    np.int64)
  unit_aligned = s_pair >= 0
  teacher_unit_aligned = np.zeros(len(t_spans), bool)
  teacher_unit_aligned[s_pair[unit_aligned]] = True

  # A zero-width unit (only when a whole tokenization is zero-width markers) lies in no segment.
  mismatch = np.zeros(n_seg, bool)
  for seg, done in ((s_seg, unit_aligned), (t_seg, teacher_unit_aligned)):
    mismatch[seg[~done & (seg >= 0) & (seg < n_seg)]] = True
  # Segment -> span id, with a trailing -1 that segments -1 and n_seg (no segment) read.
  seg_to_span = np.append(np.where(mismatch, np.cumsum(mismatch) - 1, -1), -1)
  span_bounds = np.stack([shared[:-1][mismatch], shared[1:][mismatch]], -1).reshape(-1, 2)

  def span_of(seg, done, unit):
    return seg_to_span[np.where(done, -1, seg)][unit]

  aligned = unit_aligned[s_unit]
  teacher_index = np.where(aligned, t_first[s_pair[s_unit].clip(0)] if len(t_spans) else -1, -1)
  span_id = span_of(s_seg, unit_aligned, s_unit)
  t_span_id = span_of(t_seg, teacher_unit_aligned, t_unit)
  i32 = lambda a: _frozen(np.asarray(a, np.int32))
  return Alignment(aligned=_frozen(aligned.astype(bool)), teacher_index=i32(teacher_index),
                   span_id=i32(span_id), teacher_span_id=i32(t_span_id), span_bounds=i32(span_bounds),
                   n_spans=int(mismatch.sum()))


def align(student_offsets: Sequence[tuple[int, int]], teacher_offsets: Sequence[tuple[int, int]]) -> Alignment:
  """Aligns two tokenizations of one text from their character offsets (see the module docstring).

  Cached on the offsets (`align.cache_info()`, `align.cache_clear()`): the same inputs return the same
  read-only `Alignment` object.
  """
  return _align(_as_key(student_offsets, "student"), _as_key(teacher_offsets, "teacher"))


align.cache_info = _align.cache_info
align.cache_clear = _align.cache_clear


def _width(n: int, given: Optional[int], what: str) -> int:
  from rlkit.models.tokenizer import bucket_length   # the padding rule the rest of the data path uses

  n = int(n)
  if given is None:
    return bucket_length(max(n, 1))
  if n > given:
    raise ValueError(f"align_batch: a row has {n} {what}, more than {what} width {given}; raise it or leave "
                     "it None (the power-of-two bucket of the longest row).")
  return given


def align_batch(pairs: Sequence[tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int]]]], *,
                student_len: Optional[int] = None, teacher_len: Optional[int] = None,
                max_spans: Optional[int] = None, student_start: Optional[Sequence[int]] = None,
                teacher_start: Optional[Sequence[int]] = None) -> AlignedBatch:
  """Aligns each (student offsets, teacher offsets) row and pads the results to `[B, Ts]`, `[B, Tt]`, `[B, Nsp]`.

  :param student_len, teacher_len, max_spans: padded widths; None: the power-of-two bucket of the longest row
    (bounded shapes, so a jitted consumer compiles once per bucket).
  :param student_start, teacher_start: per row, the column where the aligned text's first token sits in the
    padded arrays (e.g. after the prompt); default 0. `teacher_index` counts in teacher columns.
  """
  rows = [align(s, t) for s, t in pairs]
  b = len(rows)
  s0 = np.zeros(b, np.int64) if student_start is None else np.asarray(student_start, np.int64)
  t0 = np.zeros(b, np.int64) if teacher_start is None else np.asarray(teacher_start, np.int64)
  if s0.shape != (b,) or t0.shape != (b,):
    raise ValueError(f"align_batch: student_start / teacher_start need one column per row ({b}), got "
                     f"shapes {s0.shape} / {t0.shape}.")
  ts = _width(max([s + len(r.aligned) for s, r in zip(s0, rows)], default=0), student_len, "student tokens")
  tt = _width(max([t + len(r.teacher_span_id) for t, r in zip(t0, rows)], default=0), teacher_len,
              "teacher tokens")
  nsp = _width(max([r.n_spans for r in rows], default=0), max_spans, "spans")
  out = AlignedBatch(aligned=np.zeros((b, ts), bool), teacher_index=np.full((b, ts), -1, np.int32),
                     span_id=np.full((b, ts), -1, np.int32), teacher_span_id=np.full((b, tt), -1, np.int32),
                     span_mask=np.zeros((b, nsp), bool), span_bounds=np.zeros((b, nsp, 2), np.int32),
                     n_spans=np.array([r.n_spans for r in rows], np.int32).reshape(b))
  for i, r in enumerate(rows):
    cols, tcols = slice(s0[i], s0[i] + len(r.aligned)), slice(t0[i], t0[i] + len(r.teacher_span_id))
    out.aligned[i, cols] = r.aligned
    out.teacher_index[i, cols] = np.where(r.teacher_index >= 0, r.teacher_index + t0[i], -1)
    out.span_id[i, cols] = r.span_id
    out.teacher_span_id[i, tcols] = r.teacher_span_id
    out.span_mask[i, :r.n_spans] = True
    out.span_bounds[i, :r.n_spans] = r.span_bounds
  return out


def shared_vocab(student_vocab: dict[str, int], teacher_vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
  """(student ids [K], teacher ids [K]) int32 of the token strings both vocabularies hold, by student id.

  Strings compare as stored: two byte-level BPE vocabularies share their byte alphabet ("Ġ" is a space in
  both), but a char vocabulary's "é" is not a byte-level "Ã©". Pass `Tokenizer.get_vocab()` of each side.
  """
  pairs = sorted((i, teacher_vocab[t]) for t, i in student_vocab.items() if t in teacher_vocab)
  if not pairs:
    raise ValueError("shared_vocab: the vocabularies share no token string, so the aligned mode has nothing to "
                     "compare; use the spans mode, or tokenizers over the same alphabet (e.g. both byte-level).")
  s_ids, t_ids = (np.array(c, np.int32) for c in zip(*pairs))
  return s_ids, t_ids


# ---------------------------------------------------------------------------------------------- device side


def renormalise(logp: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Log-probs `[..., K]` of the vocabulary subset `ids` (distinct) renormalised to sum to one, and the mass
  `[...]` the full distribution `logp [..., V]` (log-probs or logits) put outside it.

  Ratios between kept tokens are unchanged; the dropped mass says how much of either model the aligned
  mode's KL cannot see, so the loss logs it.
  """
  full = jax.nn.logsumexp(logp, axis=-1)
  sub = jnp.take(logp, jnp.asarray(ids), axis=-1)
  kept = jax.nn.logsumexp(sub, axis=-1)
  # 1 - exp(log kept mass), via expm1 for accuracy when almost nothing is dropped.
  return sub - kept[..., None], -jnp.expm1(kept - full)


def span_logp(token_logp: jax.Array, span_id: jax.Array, n_spans: int) -> jax.Array:
  """`[B, n_spans]` sums of `token_logp [B, T]` over each span's tokens (`span_id [B, T]`, -1: none).

  Each model's span log-prob comes from its own tokenisation: pass the student's log-probs with `span_id`,
  the teacher's with `teacher_span_id`. Positions off every span (padding included) add nothing, even -inf.
  """
  b = token_logp.shape[0]
  inside = (span_id >= 0) & (span_id < n_spans)
  segment = jnp.where(inside, span_id + n_spans * jnp.arange(b)[:, None], b * n_spans)
  sums = jax.ops.segment_sum(jnp.where(inside, token_logp, 0.0).reshape(-1), segment.reshape(-1),
                             num_segments=b * n_spans + 1)
  return sums[:-1].reshape(b, n_spans)


def teacher_at_student(teacher_values: jax.Array, teacher_index: jax.Array) -> jax.Array:
  """`teacher_values [B, Tt, ...]` (token log-probs, or log-prob rows [.., V]) moved to the student's
  aligned positions `[B, Ts, ...]`; zero where `teacher_index` is -1."""
  idx = jnp.maximum(teacher_index, 0)
  moved = jax.vmap(lambda v, i: v[i])(teacher_values, idx)
  keep = (teacher_index >= 0).reshape(teacher_index.shape + (1,) * (moved.ndim - 2))
  return jnp.where(keep, moved, 0)


def xtok_opd_adv(s_logp: jax.Array, t_logp_on_aligned: jax.Array, aligned_mask: jax.Array,
                 span_id: jax.Array, s_span_logp: jax.Array, t_span_logp: jax.Array,
                 mode: str = "aligned") -> jax.Array:
  """Stop-gradient per-token advantage `[B, Ts]` of cross-tokenizer OPD (module docstring).

  :param s_logp, t_logp_on_aligned, aligned_mask, span_id: `[B, Ts]`; the teacher's log-probs already at the
    student's positions (`teacher_at_student`).
  :param s_span_logp, t_span_logp: `[B, Nsp]` from `span_logp`.
  :param mode: "aligned", "spans" or "both" (static).
  """
  if mode not in MODES:
    raise ValueError(f"xtok_opd_adv: unknown mode {mode!r}; valid modes: {', '.join(MODES)}.")
  aligned_mask = jnp.asarray(aligned_mask, bool)
  # where, not a product: padded positions may hold -inf log-probs, and 0 * inf is nan.
  a_al = jnp.where(aligned_mask, t_logp_on_aligned - s_logp, 0.0)
  in_span = span_id >= 0
  per_span = jnp.take_along_axis(t_span_logp - s_span_logp, jnp.maximum(span_id, 0), axis=-1)
  a_sp = jnp.where(in_span, per_span, 0.0)
  a = {"aligned": a_al, "spans": a_sp, "both": a_al + a_sp}[mode]
  return jax.lax.stop_gradient(a)
