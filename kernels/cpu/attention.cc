// Qwen3 self-attention for XLA:CPU, forward and backward, as XLA FFI handlers (`kernels/cpu_attention.py`
// registers them and documents the maths; `cpu_attention_reference` there is the spec).
//
// Why a hand-written kernel: XLA:CPU runs attention's batched products ([T, hd] x [hd, S] per batch row and
// head) through per-product calls at 60-130 GFLOP/s, against 290-345 for the model's weight matmuls, writes
// the scores out to memory between its fusions, and makes separate passes over q and k for their slices,
// norm and rope. Here each (batch row, KV head) pair is one task: its keys and each query head are normalised
// and rotated into scratch, its scores, probabilities and their gradients stay in the core's L2, and the
// products run through one register-blocked micro-kernel. The backward pass recomputes the probabilities from
// the saved log-sum-exp, as FlashAttention's.
//
// Layouts (row-major, float32), the model's own, so that XLA copies nothing on either side: qkv and dqkv
// [B, T, KV, G + 2, hd] (per KV head: G query heads, its key, its value); q_scale, k_scale [hd]; cos, sin
// [B, T, hd]; allowed [B, T, T] as uint8 (nonzero: query t may attend to key slot s); o, do
// [B, T, KV, G, hd]; lse [B, KV, G, T]; dq_scale, dk_scale [B, KV, hd] (each pair's part; the caller sums).
// causal != 0 promises that query t never attends past slot t, so the products skip the score blocks above
// the diagonal. A query row with no allowed key is uniform over the keys it considers (all T, or slots <= t
// when causal) and passes no gradient to q or k; its lse is NaN.
// hd must be a multiple of 32 (each half a whole number of vectors: 16 floats with AVX-512, 8 with AVX2).
//
// Vector width: chosen at compile time (-march=native) from the compiler's ISA macros. With AVX-512 a vector
// is 16 floats and the micro-kernel a 6 x 64 block (24 accumulators of the 32 zmm registers); with AVX2
// only, 8 floats and a 6 x 16 block (12 accumulators of the 16 ymm registers). The AVX-512 shapes compiled
// for AVX2 (each 16-float vector two ymm halves, 48 accumulators in 16 registers) spilled in the inner loop:
// on a 2-core AVX2-only AMD EPYC they ran the M train step's attention at 0.33x the XLA path's speed forward
// and 0.47x forward + backward; the AVX2 shapes at 2.1x and 3.4x (the whole f32 step: 0.78x -> 1.08x).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One machine register of floats: 16 with AVX-512, else 8 (AVX2's ymm; without AVX2, two SSE halves).
#ifdef __AVX512F__
constexpr int kLanes = 16;
constexpr int kNV = 4;        // the micro-kernel's column vectors: 6 x 4 accumulators of 32 zmm registers
#else
constexpr int kLanes = 8;
constexpr int kNV = 2;        // 6 x 2 accumulators, 2 B vectors and a broadcast: 15 of the 16 ymm registers
#endif
typedef float vf __attribute__((vector_size(4 * kLanes)));
typedef int32_t vi __attribute__((vector_size(4 * kLanes)));
typedef uint8_t vb __attribute__((vector_size(kLanes)));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// `vf{} + x` would compile to a scalar add of 0 (not foldable: -0 + 0 = +0) before every broadcast.
#ifdef __AVX512F__
inline vf splat(float x) { return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
constexpr vi kIota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
inline vf splat(float x) { return vf{x, x, x, x, x, x, x, x}; }
constexpr vi kIota = {0, 1, 2, 3, 4, 5, 6, 7};
#endif
// Lanes [s, s + kLanes) of a mask row of S slots: allowed, and below `keys` (the keys the row considers).
inline vi allowed_lanes(const uint8_t* allowed, int s, int keys, int S) {
  vi m;
  if (s + kLanes <= S) {
#ifdef __AVX512F__
    // GCC assembles __builtin_convertvector of 16 bytes lane by lane; vpmovzxbd is one instruction.
    __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(allowed + s)));
    std::memcpy(&m, &w, sizeof m);
    m = m != 0;
#elif defined(__AVX2__)
    __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(allowed + s)));
    std::memcpy(&m, &w, sizeof m);
    m = m != 0;
#else
    vb b;
    std::memcpy(&b, allowed + s, sizeof b);
    m = __builtin_convertvector(b, vi) != 0;
#endif
  } else {
    for (int l = 0; l < kLanes; ++l) m[l] = (s + l < S && allowed[s + l]) ? -1 : 0;
  }
  if (s + kLanes <= keys) return m;
  return m & (kIota < keys - s);
}
// Horizontal sum and max by halving: 4 steps instead of 15 lane extractions (3 instead of 7 for 8 lanes).
template <class Op>
inline float reduce(vf v, Op op) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
#ifdef __AVX512F__
  v8 a = op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
            __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
#else
  v8 a = v;
#endif
  v4 b = op(__builtin_shufflevector(a, a, 0, 1, 2, 3), __builtin_shufflevector(a, a, 4, 5, 6, 7));
  return op(op(b[0], b[1]), op(b[2], b[3]));
}
inline float hsum(vf v) { return reduce(v, [](auto x, auto y) { return x + y; }); }
inline float hmax(vf v) { return reduce(v, [](auto x, auto y) { return x > y ? x : y; }); }

// exp(x) for x <= 0 (softmax's shifted scores): 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, and a degree 6
// polynomial for e^r (relative error ~2e-7). Inputs below -87 flush to 0.
inline vf exp_neg(vf x) {
  const vf lo = splat(-87.0f);
  vi tiny = x < lo;
  x = tiny ? lo : x;
  const float magic = 12582912.0f;                 // 1.5 * 2^23: adding it rounds to the nearest integer
  vf t = x * splat(1.44269504f) + splat(magic);
  vf n = t - splat(magic);
  vf r = x - n * splat(0.693145751953125f) - n * splat(1.428606765330187e-6f);
  vf p = splat(1.0f / 720);
  p = p * r + splat(1.0f / 120);
  p = p * r + splat(1.0f / 24);
  p = p * r + splat(1.0f / 6);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return tiny ? splat(0.0f) : p * scale;
}

// C[MR, kLanes NV] (+)= A[MR, K] B[K, kLanes NV]: A(i, kk) = a[i * ars + kk * acs] (either layout), B
// row-major. MR = 6, NV = 4 keeps 24 accumulators, 4 B vectors and one broadcast in the 32 AVX-512
// registers; NV = 2 (AVX2) 12 accumulators, 2 B vectors and one broadcast in the 16 ymm ones.
template <int MR, int NV>
void micro(int k, const float* a, long ars, long acs, const float* b, long ldb, float* c, long ldc, bool add) {
  vf acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = vf{};
  for (int kk = 0; kk < k; ++kk) {
    vf bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = load(b + kk * ldb + kLanes * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      vf av = splat(a[i * ars + kk * acs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += av * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* p = c + i * ldc + kLanes * v;
      store(p, add ? load(p) + acc[i][v] : acc[i][v]);
    }
}

using Micro = void (*)(int, const float*, long, long, const float*, long, float*, long, bool);
constexpr int kMR = 6;

#ifdef __AVX512F__
template <int MR>
constexpr Micro kRow[kNV] = {micro<MR, 1>, micro<MR, 2>, micro<MR, 3>, micro<MR, 4>};
#else
template <int MR>
constexpr Micro kRow[kNV] = {micro<MR, 1>, micro<MR, 2>};
#endif
constexpr const Micro* kMicro[kMR + 1] = {nullptr, kRow<1>, kRow<2>, kRow<3>, kRow<4>, kRow<5>, kRow<6>};

struct Span { int k0, k1, n; };

// C[m, :] (+)= A B, where the rows [i0, i1) of each block contract kk in [k0, k1) and compute the columns
// [0, n), as span(i0, i1) says (n a multiple of kLanes): the causal products skip what the mask zeroes.
// Rows go in chunks of kChunk, each chunk sweeping the column blocks, so that a column block of B (at most
// kNV * kLanes columns by K rows) stays in L1 while the chunk's row blocks use it; the scores' 132 GFLOP/s
// row-block order reread all of K^T (64 KB) from L2 for every 6 rows. (With AVX2, chunks of 4 or 16 row
// blocks ran the M attention within the machine's noise of 8.)
constexpr int kChunk = 8 * kMR;

template <class SpanFn>
void gemm(int m, const float* a, long ars, long acs, const float* b, long ldb, float* c, long ldc, bool add,
          SpanFn span) {
  for (int c0 = 0; c0 < m; c0 += kChunk) {
    int c1 = std::min(m, c0 + kChunk);
    int n_max = 0;
    for (int i0 = c0; i0 < c1; i0 += kMR) n_max = std::max(n_max, span(i0, std::min(c1, i0 + kMR)).n);
    for (int j = 0; j < n_max; j += kNV * kLanes) {
      for (int i0 = c0; i0 < c1; i0 += kMR) {
        int mr = std::min(kMR, c1 - i0);
        Span s = span(i0, i0 + mr);
        if (j >= s.n) continue;
        int nv = std::min(kNV, (s.n - j) / kLanes);
        kMicro[mr][nv - 1](s.k1 - s.k0, a + i0 * ars + long(s.k0) * acs, ars, acs, b + long(s.k0) * ldb + j,
                           ldb, c + long(i0) * ldc + j, ldc, add);
      }
    }
  }
}

inline int round_lanes(int n) { return (n + kLanes - 1) / kLanes * kLanes; }

struct Shape {
  int64_t B, T, KV, G, hd;
  bool causal, qk_norm;
  float eps;
  int S() const { return int(T); }                // self-attention: the keys are the queries' own tokens
  int Sp() const { return round_lanes(S()); }
  // Row stride of the [*, Sp] scratch matrices, one vector more than Sp: at a power-of-two stride (Sp = 256,
  // 1 KB) a 64-row panel of K^T maps onto a quarter of L1's sets. (At M the scores ran at the same speed
  // either way, within this machine's noise; the padding costs 6% more scratch.)
  int ld() const { return Sp() + kLanes; }
  long qkv_row() const { return KV * (G + 2) * hd; }   // qkv, dqkv: [B, T, KV, G + 2, hd]
  long o_row() const { return KV * G * hd; }            // o, do: [B, T, KV, G, hd]
  // Keys query t considers: all S, or slots <= t when causal.
  int keys(int t) const { return causal ? t + 1 : S(); }
};

// Kt [hd, Sp] (row stride ld_kt) = K^T of the S rows of K (row stride ld_k), zero-padded to Sp columns.
// kLanes rows of K at a time: their 64 cache lines stay in L1 while each is read hd times (row by row, K's 1 KB
// row stride put every line in a quarter of L1's sets and this took 18 us per M pair instead of 4.5).
void transpose_padded(const float* k, long ld_k, int S, int hd, int Sp, float* kt, long ld_kt) {
  for (int s0 = 0; s0 < Sp; s0 += kLanes) {
    for (int h = 0; h < hd; ++h) {
      vf col;
      for (int l = 0; l < kLanes; ++l) col[l] = s0 + l < S ? k[(s0 + l) * ld_k + h] : 0.0f;
      store(kt + h * ld_kt + s0, col);
    }
  }
}

// The attention input of one head's rows: rope(norm(x)) (Qwen3; rope(x) without qk_norm), in float32:
//   norm(x) = scale * x / sqrt(mean(x^2) + eps),   rope(y) = y * cos + [-y2, y1] * sin   (y = [y1, y2])
// x: `rows` rows of hd at stride ld_x (one head's slice of qkv); cos, sin: [rows, hd]; out: [rows, hd].
// Each half of hd is a whole number of vectors (hd % 32 == 0, checked).
inline float inv_rms(const Shape& sh, const float* x) {
  vf ss = vf{};
  for (int h = 0; h < sh.hd; h += kLanes) ss += load(x + h) * load(x + h);
  return 1.0f / std::sqrt(hsum(ss) / float(sh.hd) + sh.eps);
}

void prep_rows(const Shape& sh, const float* x, long ld_x, int rows, const float* scale, const float* cos,
               const float* sin, float* out) {
  int hd = int(sh.hd), half = hd / 2;
  for (int r = 0; r < rows; ++r) {
    const float *xr = x + r * ld_x, *c = cos + long(r) * hd, *sn = sin + long(r) * hd;
    float* y = out + long(r) * hd;
    vf rs = splat(sh.qk_norm ? inv_rms(sh, xr) : 1.0f);
    for (int h = 0; h < half; h += kLanes) {
      vf n1 = load(xr + h) * rs, n2 = load(xr + half + h) * rs;
      if (sh.qk_norm) {
        n1 *= load(scale + h);
        n2 *= load(scale + half + h);
      }
      store(y + h, n1 * load(c + h) - n2 * load(sn + h));
      store(y + half + h, n2 * load(c + half + h) + n1 * load(sn + half + h));
    }
  }
}

// The gradient through `prep_rows`: dx (written at stride ld_dx) from dy, the gradient of its output, and
// the norm scale's gradient added into dscale [hd]. rope's transpose is [d2 s2, -d1 s1] (the rotation's
// inverse); the norm's, with n = x r (r = 1 / rms): dx = r (dn - n mean(dn n)), dn = (that) * scale.
void unprep_rows(const Shape& sh, const float* x, long ld_x, int rows, const float* scale, const float* cos,
                 const float* sin, const float* dy, float* dx, long ld_dx, float* dscale) {
  int hd = int(sh.hd), half = hd / 2;
  for (int r = 0; r < rows; ++r) {
    const float *xr = x + r * ld_x, *c = cos + long(r) * hd, *sn = sin + long(r) * hd, *d = dy + long(r) * hd;
    float* out = dx + r * ld_dx;
    if (!sh.qk_norm) {
      for (int h = 0; h < half; h += kLanes) {
        store(out + h, load(d + h) * load(c + h) + load(d + half + h) * load(sn + half + h));
        store(out + half + h, load(d + half + h) * load(c + half + h) - load(d + h) * load(sn + h));
      }
      continue;
    }
    float rs = inv_rms(sh, xr);
    vf dot = vf{};
    for (int h = 0; h < half; h += kLanes) {
      vf g1 = load(d + h) * load(c + h) + load(d + half + h) * load(sn + half + h);
      vf g2 = load(d + half + h) * load(c + half + h) - load(d + h) * load(sn + h);
      vf n1 = load(xr + h) * splat(rs), n2 = load(xr + half + h) * splat(rs);
      store(dscale + h, load(dscale + h) + g1 * n1);
      store(dscale + half + h, load(dscale + half + h) + g2 * n2);
      g1 *= load(scale + h);
      g2 *= load(scale + half + h);
      dot += g1 * n1 + g2 * n2;
      store(out + h, g1);                          // dn, finished below
      store(out + half + h, g2);
    }
    vf mean = splat(hsum(dot) / float(hd)), rv = splat(rs);
    for (int h = 0; h < hd; h += kLanes) store(out + h, rv * (load(out + h) - load(xr + h) * rv * mean));
  }
}

// Scores [T, Sp] of the T query rows of q (row stride ld) against keys [0, keys(last row of the block)),
// rounded up to whole vectors.
void scores(const Shape& sh, const float* q, long ld, const float* kt, float* out) {
  int hd = int(sh.hd), Sp = sh.Sp();
  gemm(int(sh.T), q, ld, 1, kt, sh.ld(), out, sh.ld(), false,
       [&](int, int i1) { return Span{0, hd, std::min(round_lanes(sh.keys(i1 - 1)), Sp)}; });
}

// One row's unnormalised probabilities exp(x - max), in place over `row` (scores in, zero past the considered
// keys up to Sp). Returns {log-sum-exp, 1 / sum}; for a row with no allowed key (then uniform over the
// considered keys) {NaN, 1 / keys}. The forward pass scales the output rows by 1 / sum instead of p.
std::pair<float, float> softmax_row(float* row, const uint8_t* allowed, int keys, int S, int Sp, float scale) {
  const float neg = -INFINITY;
  vf mx = splat(neg);
  for (int s = 0; s < keys; s += kLanes) {
    vf x = load(row + s);
    mx = allowed_lanes(allowed, s, keys, S) ? (x > mx ? x : mx) : mx;
  }
  float m = hmax(mx) * scale;
  if (m == neg) {
    for (int s = 0; s < Sp; ++s) row[s] = s < keys ? 1.0f : 0.0f;
    return {NAN, 1.0f / keys};
  }
  vf sum = vf{};
  int end = round_lanes(keys);
  for (int s = 0; s < end; s += kLanes) {
    vf p = exp_neg(load(row + s) * splat(scale) - splat(m));
    p = allowed_lanes(allowed, s, keys, S) ? p : vf{};
    sum += p;
    store(row + s, p);
  }
  std::fill(row + end, row + Sp, 0.0f);
  float total = hsum(sum);
  return {m + std::log(total), 1.0f / total};
}

// p of one row recomputed from its scores and lse, and ds = p * (dp - d) * scale where allowed (0 elsewhere),
// both in place (row: scores -> p, drow: dp -> ds), zero past the considered keys up to Sp.
void softmax_grad_row(float* row, float* drow, const uint8_t* allowed, int keys, int S, int Sp, float scale,
                      float lse, float d) {
  if (std::isnan(lse)) {
    for (int s = 0; s < Sp; ++s) { row[s] = s < keys ? 1.0f / keys : 0.0f; drow[s] = 0.0f; }
    return;
  }
  int end = round_lanes(keys);
  for (int s = 0; s < end; s += kLanes) {
    vf p = exp_neg(load(row + s) * splat(scale) - splat(lse));
    p = allowed_lanes(allowed, s, keys, S) ? p : vf{};
    store(row + s, p);
    store(drow + s, p * (load(drow + s) - splat(d)) * splat(scale));
  }
  for (int s = end; s < Sp; ++s) { row[s] = 0.0f; drow[s] = 0.0f; }
}

// Runs f(0..n-1) on the caller and the pool's threads. Workers take items from a shared counter, so the
// caller never waits on a task that has not started (a pool busy elsewhere cannot deadlock it).
template <class F>
void parallel_for(ffi::ThreadPool& pool, int n, const F& f) {
  struct Shared { std::atomic<int> next{0}, done{0}; };
  auto shared = std::make_shared<Shared>();
  auto work = [shared, n, &f] {
    for (int i; (i = shared->next.fetch_add(1)) < n;) {
      f(i);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  int helpers = int(std::min<int64_t>(pool.num_threads(), n)) - 1;
  for (int h = 0; h < helpers; ++h) pool.Schedule([work] { work(); });
  work();
  while (shared->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

// Pointers of one (batch row b, KV head) pair: its slice of qkv, o and do (rows qkv_row() and o_row()
// apart), its batch row of allowed, cos and sin, and its [G, T] block of lse.
struct Pair {
  const float *qkv, *cos, *sin;
  const uint8_t* allowed;
  long o, lse;
  Pair(const Shape& sh, int i, const float* qkv_base, const float* cos_base, const float* sin_base,
       const uint8_t* allowed_base) {
    long b = i / sh.KV, kv = i % sh.KV;
    qkv = qkv_base + b * sh.T * sh.qkv_row() + kv * (sh.G + 2) * sh.hd;
    cos = cos_base + b * sh.T * sh.hd;
    sin = sin_base + b * sh.T * sh.hd;
    allowed = allowed_base + b * sh.T * sh.S();
    o = b * sh.T * sh.o_row() + kv * sh.G * sh.hd;
    lse = long(i) * sh.G * sh.T;
  }
};

// The pair's keys after norm and rope, row-major (kp [S, hd]) and transposed (kt [hd, ld]).
void prep_keys(const Shape& sh, const Pair& at, const float* k_scale, float* kp, float* kt) {
  int hd = int(sh.hd);
  prep_rows(sh, at.qkv + sh.G * hd, sh.qkv_row(), sh.S(), k_scale, at.cos, at.sin, kp);
  transpose_padded(kp, hd, sh.S(), hd, sh.Sp(), kt, sh.ld());
}

// One pair's working arrays, in a per-thread buffer reused across calls: the keys after norm and rope (kp
// [S, hd]) and transposed (kt [hd, ld]), the values transposed (vt), one query head after norm and rope (qp
// [T, hd]), its probabilities (p [T, ld]) and their gradients (ds), the gradients of qp and kp (dqp, dkp),
// and the rows' 1 / sum (inv [T]).
struct Scratch {
  float *kp, *kt, *vt, *qp, *p, *ds, *dqp, *dkp, *inv;

  explicit Scratch(const Shape& sh) {
    thread_local std::vector<float> buffer;
    size_t rows = size_t(sh.T) * sh.hd, cols = size_t(sh.hd) * sh.ld(), scores = size_t(sh.T) * sh.ld();
    size_t sizes[] = {rows, cols, cols, rows, scores, scores, rows, rows, size_t(sh.T)};
    float** slots[] = {&kp, &kt, &vt, &qp, &p, &ds, &dqp, &dkp, &inv};
    size_t total = 0;
    for (size_t n : sizes) total += n;
    if (buffer.size() < total) buffer.resize(total);
    float* at = buffer.data();
    for (int i = 0; i < 9; ++i) {
      *slots[i] = at;
      at += sizes[i];
    }
  }
};

void forward_pair(const Shape& sh, const Pair& at, const float* q_scale, const float* k_scale, float* o,
                  float* lse) {
  int T = int(sh.T), S = sh.S(), Sp = sh.Sp(), hd = int(sh.hd), ld = sh.ld();
  long qr = sh.qkv_row(), orow = sh.o_row();
  Scratch w(sh);
  float *kp = w.kp, *kt = w.kt, *qp = w.qp, *p = w.p, *inv = w.inv;
  float scale = 1.0f / std::sqrt(float(hd));
  prep_keys(sh, at, k_scale, kp, kt);
  const float* v = at.qkv + (sh.G + 1) * hd;
  for (int g = 0; g < sh.G; ++g) {
    float* og = o + g * hd;
    prep_rows(sh, at.qkv + g * hd, qr, T, q_scale, at.cos, at.sin, qp);
    scores(sh, qp, hd, kt, p);
    for (int t = 0; t < T; ++t) {
      auto [row_lse, row_inv] =
          softmax_row(p + long(t) * ld, at.allowed + long(t) * S, sh.keys(t), S, Sp, scale);
      lse[g * T + t] = row_lse;
      inv[t] = row_inv;
    }
    gemm(T, p, ld, 1, v, qr, og, orow, false, [&](int, int i1) { return Span{0, sh.keys(i1 - 1), hd}; });
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < hd; h += kLanes) store(og + t * orow + h, load(og + t * orow + h) * splat(inv[t]));
  }
}

// dqkv: the pair's slice of the qkv gradient; dq_scale, dk_scale: the pair's [hd] parts of the norm scales'.
void backward_pair(const Shape& sh, const Pair& at, const float* q_scale, const float* k_scale, const float* o,
                   const float* lse, const float* dout, float* dqkv, float* dq_scale, float* dk_scale) {
  int T = int(sh.T), S = sh.S(), Sp = sh.Sp(), hd = int(sh.hd), ld = sh.ld();
  long qr = sh.qkv_row(), orow = sh.o_row();
  Scratch w(sh);
  float *kp = w.kp, *kt = w.kt, *vt = w.vt, *qp = w.qp, *p = w.p, *ds = w.ds, *dqp = w.dqp, *dkp = w.dkp;
  float scale = 1.0f / std::sqrt(float(hd));
  prep_keys(sh, at, k_scale, kp, kt);
  transpose_padded(at.qkv + (sh.G + 1) * hd, qr, S, hd, Sp, vt, ld);
  std::fill(dq_scale, dq_scale + hd, 0.0f);
  std::fill(dk_scale, dk_scale + hd, 0.0f);
  // Key s only gets gradient from the query rows t >= s when causal.
  auto rows_after = [&](int i0, int) { return Span{sh.causal ? i0 : 0, T, hd}; };
  for (int g = 0; g < sh.G; ++g) {
    const float *og = o + g * hd, *dog = dout + g * hd;
    prep_rows(sh, at.qkv + g * hd, qr, T, q_scale, at.cos, at.sin, qp);
    scores(sh, qp, hd, kt, p);
    scores(sh, dog, orow, vt, ds);                  // dp = do v^T, over the same columns
    for (int t = 0; t < T; ++t) {
      vf acc = vf{};
      for (int h = 0; h < hd; h += kLanes) acc += load(dog + t * orow + h) * load(og + t * orow + h);
      softmax_grad_row(p + long(t) * ld, ds + long(t) * ld, at.allowed + long(t) * S, sh.keys(t), S, Sp, scale,
                       lse[g * T + t], hsum(acc));
    }
    // dq = ds k (then through the query's rope and norm); dk += ds^T q and dv += p^T do over the G heads.
    gemm(T, ds, ld, 1, kp, hd, dqp, hd, false, [&](int, int i1) { return Span{0, sh.keys(i1 - 1), hd}; });
    unprep_rows(sh, at.qkv + g * hd, qr, T, q_scale, at.cos, at.sin, dqp, dqkv + g * hd, qr, dq_scale);
    gemm(S, ds, 1, ld, qp, hd, dkp, hd, g > 0, rows_after);
    gemm(S, p, 1, ld, dog, orow, dqkv + (sh.G + 1) * hd, qr, g > 0, rows_after);
  }
  unprep_rows(sh, at.qkv + sh.G * hd, qr, S, k_scale, at.cos, at.sin, dkp, dqkv + sh.G * hd, qr, dk_scale);
}

ffi::Error check_shapes(const ffi::Buffer<ffi::F32>& qkv, const ffi::Buffer<ffi::F32>& q_scale,
                        const ffi::Buffer<ffi::F32>& k_scale, const ffi::Buffer<ffi::F32>& cos,
                        const ffi::Buffer<ffi::F32>& sin, const ffi::Buffer<ffi::U8>& allowed, int32_t causal,
                        int32_t qk_norm, float eps, Shape* sh) {
  auto d = qkv.dimensions(), c = cos.dimensions(), sn = sin.dimensions(), a = allowed.dimensions();
  if (d.size() != 5 || c.size() != 3 || sn.size() != 3 || a.size() != 3 || q_scale.dimensions().size() != 1 ||
      k_scale.dimensions().size() != 1)
    return ffi::Error::InvalidArgument("rlkit attention: expected qkv [B, T, KV, G + 2, hd], scales [hd], "
                                       "cos and sin [B, T, hd], allowed [B, T, T]");
  *sh = Shape{d[0], d[1], d[2], d[3] - 2, d[4], causal != 0, qk_norm != 0, eps};
  bool ok = sh->G >= 1 && sh->hd % (2 * kLanes) == 0 && q_scale.dimensions()[0] == sh->hd &&
            k_scale.dimensions()[0] == sh->hd && c[0] == sh->B && c[1] == sh->T && c[2] == sh->hd &&
            sn[0] == c[0] && sn[1] == c[1] && sn[2] == c[2] && a[0] == sh->B && a[1] == sh->T && a[2] == sh->T;
  if (!ok)
    return ffi::Error::InvalidArgument("rlkit attention: inconsistent shapes (see kernels/cpu/attention.cc)");
  return ffi::Error::Success();
}

using F32 = ffi::Buffer<ffi::F32>;
using U8 = ffi::Buffer<ffi::U8>;
using F32Out = ffi::ResultBuffer<ffi::F32>;

ffi::Error AttentionForward(ffi::ThreadPool pool, F32 qkv, F32 q_scale, F32 k_scale, F32 cos, F32 sin,
                            U8 allowed, F32Out o, F32Out lse, int32_t causal, int32_t qk_norm, float eps) {
  Shape sh;
  auto err = check_shapes(qkv, q_scale, k_scale, cos, sin, allowed, causal, qk_norm, eps, &sh);
  if (err.failure()) return err;
  parallel_for(pool, int(sh.B * sh.KV), [&](int i) {
    Pair at(sh, i, qkv.typed_data(), cos.typed_data(), sin.typed_data(), allowed.typed_data());
    forward_pair(sh, at, q_scale.typed_data(), k_scale.typed_data(), o->typed_data() + at.o,
                 lse->typed_data() + at.lse);
  });
  return ffi::Error::Success();
}

ffi::Error AttentionBackward(ffi::ThreadPool pool, F32 qkv, F32 q_scale, F32 k_scale, F32 cos, F32 sin,
                             U8 allowed, F32 o, F32 lse, F32 dout, F32Out dqkv, F32Out dq_scale,
                             F32Out dk_scale, int32_t causal, int32_t qk_norm, float eps) {
  Shape sh;
  auto err = check_shapes(qkv, q_scale, k_scale, cos, sin, allowed, causal, qk_norm, eps, &sh);
  if (err.failure()) return err;
  parallel_for(pool, int(sh.B * sh.KV), [&](int i) {
    Pair at(sh, i, qkv.typed_data(), cos.typed_data(), sin.typed_data(), allowed.typed_data());
    long qkv_at = at.qkv - qkv.typed_data();
    backward_pair(sh, at, q_scale.typed_data(), k_scale.typed_data(), o.typed_data() + at.o,
                  lse.typed_data() + at.lse, dout.typed_data() + at.o, dqkv->typed_data() + qkv_at,
                  dq_scale->typed_data() + long(i) * sh.hd, dk_scale->typed_data() + long(i) * sh.hd);
  });
  return ffi::Error::Success();
}

// The bindings' shared parts: the context and the six inputs both kernels take first (qkv, q_scale, k_scale,
// cos, sin, allowed), and the attributes both take last.
auto bind_inputs() {
  return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<F32>().Arg<F32>().Arg<F32>().Arg<F32>().Arg<F32>()
      .Arg<U8>();
}

template <class Binding>
auto bind_attrs(Binding binding) {
  return std::move(binding)
      .template Attr<int32_t>("causal")
      .template Attr<int32_t>("qk_norm")
      .template Attr<float>("eps");
}

}  // namespace

// Forward: the inputs -> o, lse.
XLA_FFI_DEFINE_HANDLER_SYMBOL(RlkitAttentionForward, AttentionForward,
                              bind_attrs(bind_inputs().Ret<F32>().Ret<F32>()));

// Backward: the inputs, o, lse, do -> dqkv, dq_scale, dk_scale (per pair [B, KV, hd]).
XLA_FFI_DEFINE_HANDLER_SYMBOL(RlkitAttentionBackward, AttentionBackward,
                              bind_attrs(bind_inputs().Arg<F32>().Arg<F32>().Arg<F32>().Ret<F32>().Ret<F32>()
                                             .Ret<F32>()));

// The vector width this build chose from the compiler's ISA macros: 16 floats (AVX-512) or 8 (AVX2 or
// narrower); `kernels.cpu_attention.vector_lanes()` reads it.
extern "C" int RlkitAttentionLanes() { return kLanes; }
