// Attention that reads the AR engine's paged KV pools in place (CPU).
//
// Rows are a step's sequences, their query tokens laid end to end (`query_starts`); row r
// has `context_lens[r]` keys, the last `n_r` of them its own tokens, so its query j sits at
// position context_lens[r] - n_r + j and attends to keys 0..that position (causal; a decode
// row is the case n_r = 1). Pools hold blocks of kBlock tokens, the row's blocks in position
// order in `block_tables[r]`:
//   keys   [num_blocks, kv_heads, head_dim, kBlock]  (each block transposed: a score row is
//          then whole-vector FMAs over the block's keys, no horizontal sums, no shuffles)
//   values [num_blocks * kBlock, kv_heads, value_dim] (slot = block * kBlock + offset)
//
// One task = one row, one key head and up to kQueryTile of the row's queries, with every
// query head of that key head's group (GQA): each key block is read once for all of them.
// Over the blocks, an online softmax (running max, running sum, rescaled accumulator), so the
// keys are read once, where gathering them first reads them, writes a copy and reads that.
// Sums are in fp32 whatever the pools hold (fp32, bf16 or fp16). The inner loops work on
// 16-float vectors (GCC/Clang vector extensions: a block's 16 keys are one AVX-512 register)
// in register tiles of 8 query vectors x 2 key blocks.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kBlock = 16;  // the engine's block size (omnistage/ar/block_manager.py)
constexpr int64_t kQueryTile = 32;  // queries of one row per task
constexpr int64_t kRows = 8;  // query vectors per register tile (4 for a tile's last few)
constexpr int kSpan = 2;  // key blocks per step of a register tile
constexpr int64_t kSpanKeys = kSpan * kBlock;
// A block's 16 keys are one 16-float vector: one AVX-512 register (two AVX ones, four NEON ones:
// the compiler splits it where the processor has narrower registers).
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));

template <typename V>
inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename V>
inline void store(float* p, V v) { std::memcpy(p, &v, sizeof(v)); }
inline vf16 splat(float x) { return vf16{} + x; }

// exp for x <= 0 (Cephes' expf polynomial, about 1e-7 relative), exactly 0 below -87 (a masked
// key's -inf included); vector arithmetic only, where std::exp is one call per score.
inline vf16 exp16(vf16 x) {
  const vf16 lo = splat(-87.f), big = splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf16 xc = x > lo ? x : lo;
  const vf16 n = (xc * 1.44269504088896341f + big) - big;
  const vf16 r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  vf16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const vi16 bits = (__builtin_convertvector(n, vi16) + 127) << 23;
  const vf16 y = p * reinterpret_cast<const vf16&>(bits);
  return x > lo ? y : splat(0.f);
}

inline float exp_nonpositive(float x) { return exp16(splat(x))[0]; }

// horizontal max / sum: halving shuffles (log2 16 steps, where a scalar loop takes 15)
inline float hmax(vf16 v) {
  const vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const vf8 b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const vf8 m8 = a > b ? a : b;
  float m = m8[0];
  for (int k = 1; k < 8; ++k) m = std::max(m, m8[k]);
  return m;
}

inline bool any(vi16 mask) {
  const vi8 m8 = __builtin_shufflevector(mask, mask, 0, 1, 2, 3, 4, 5, 6, 7) |
                 __builtin_shufflevector(mask, mask, 8, 9, 10, 11, 12, 13, 14, 15);
  int32_t x = 0;
  for (int k = 0; k < 8; ++k) x |= m8[k];
  return x != 0;
}

inline float hsum(vf16 v) {
  const vf8 s8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  float s = 0.f;
  for (int k = 0; k < 8; ++k) s += s8[k];
  return s;
}

// s[u][b] = q[u] . the 16 keys of block b, for R query vectors and NB blocks (kt[b]: [head_dim][kBlock]).
// Each head_dim step loads NB key vectors and R query floats for R * NB FMAs: with 2 blocks, the
// loads no longer outnumber the FMAs.
template <int R, int NB>
inline void scores(const float* q, const float* const* kt, int64_t head_dim, vf16 (*s)[kSpan]) {
  vf16 a[R][NB] = {};
  for (int64_t d = 0; d < head_dim; ++d) {
    vf16 k[NB];
    for (int b = 0; b < NB; ++b) k[b] = load<vf16>(kt[b] + d * kBlock);
    for (int u = 0; u < R; ++u) {
      const float x = q[u * head_dim + d];
      for (int b = 0; b < NB; ++b) a[u][b] += x * k[b];
    }
  }
  for (int u = 0; u < R; ++u)
    for (int b = 0; b < NB; ++b) s[u][b] = a[u][b];
}

// acc[u] += sum_j p[u][j] * v[j] for R query vectors (p[u] at p + u * kSpanKeys, v[j] at
// v + j * v_stride), on the value's floats d..d + 16 * NV (groups of 4 query vectors x NV vectors:
// 16 accumulators at NV = 4)
template <int R, int NV>
inline void accumulate_cols(const float* p, const float* v, int64_t v_stride, int64_t value_dim, int64_t num_keys,
                            float* acc, int64_t d) {
  for (int u0 = 0; u0 < R; u0 += 4) {
    vf16 a[4][NV];
    for (int u = 0; u < 4; ++u)
      for (int c = 0; c < NV; ++c) a[u][c] = load<vf16>(acc + (u0 + u) * value_dim + d + 16 * c);
    for (int64_t j = 0; j < num_keys; ++j) {
      vf16 vj[NV];
      for (int c = 0; c < NV; ++c) vj[c] = load<vf16>(v + j * v_stride + d + 16 * c);
      for (int u = 0; u < 4; ++u) {
        const float b = p[(u0 + u) * kSpanKeys + j];
        for (int c = 0; c < NV; ++c) a[u][c] += b * vj[c];
      }
    }
    for (int u = 0; u < 4; ++u)
      for (int c = 0; c < NV; ++c) store(acc + (u0 + u) * value_dim + d + 16 * c, a[u][c]);
  }
}

template <int R>
inline void accumulate(const float* p, const float* v, int64_t v_stride, int64_t value_dim, int64_t num_keys,
                       float* acc) {
  int64_t d = 0;
  for (; d + 64 <= value_dim; d += 64) accumulate_cols<R, 4>(p, v, v_stride, value_dim, num_keys, acc, d);
  for (; d + 16 <= value_dim; d += 16) accumulate_cols<R, 1>(p, v, v_stride, value_dim, num_keys, acc, d);
  if (d < value_dim) {  // a value_dim of 8 mod 16
    for (int u = 0; u < R; ++u) {
      vf8 a = load<vf8>(acc + u * value_dim + d);
      for (int64_t j = 0; j < num_keys; ++j) a += p[u * kSpanKeys + j] * load<vf8>(v + j * v_stride + d);
      store(acc + u * value_dim + d, a);
    }
  }
}

// One register tile of R query vectors against NB key blocks (visible[u]: how many of their keys
// query vector u sees): scores, the online softmax's update of m, l and acc, then acc += p . values.
// l[u] is kept as 16 lane sums, added up once at the end; the max is taken only where a score passes
// the running one (after the first blocks, rarely: the update is then the same with none of its
// horizontal reductions).
template <int R, int NB>
inline void attend_tile(const float* q, const float* const* kt, const float* const* v, int64_t v_stride,
                        int64_t head_dim, int64_t value_dim, const int64_t* visible, float* m, vf16* l, float* acc,
                        float* p_buf) {
  int64_t tile_visible = 0;
  for (int u = 0; u < R; ++u) tile_visible = std::max(tile_visible, visible[u]);
  if (tile_visible <= 0) return;
  vf16 s[R][kSpan];
  scores<R, NB>(q, kt, head_dim, s);
  const vf16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const vf16 masked = splat(-std::numeric_limits<float>::infinity());
  for (int u = 0; u < R; ++u) {
    float* pu = p_buf + u * kSpanKeys;
    if (visible[u] <= 0) {
      for (int b = 0; b < NB; ++b) store(pu + b * kBlock, splat(0.f));
      continue;
    }
    vf16 su[NB];
    vi16 passes = {};
    for (int b = 0; b < NB; ++b) {
      su[b] = visible[u] >= (b + 1) * kBlock ? s[u][b] : lane < static_cast<float>(visible[u] - b * kBlock) ? s[u][b]
                                                                                                           : masked;
      passes |= su[b] > m[u];
    }
    if (any(passes)) {
      vf16 mx = su[0];
      for (int b = 1; b < NB; ++b) mx = mx > su[b] ? mx : su[b];
      const float new_max = hmax(mx);
      if (m[u] > -std::numeric_limits<float>::infinity()) {  // rescale what the earlier blocks added
        const float c = exp_nonpositive(m[u] - new_max);
        l[u] *= c;
        float* au = acc + u * value_dim;
        for (int64_t d = 0; d < value_dim; d += 8) store(au + d, load<vf8>(au + d) * c);
      }
      m[u] = new_max;
    }
    for (int b = 0; b < NB; ++b) {
      const vf16 pv = exp16(su[b] - m[u]);
      store(pu + b * kBlock, pv);
      l[u] += pv;
    }
  }
  for (int b = 0; b < NB; ++b) {
    const int64_t nk = std::min(kBlock, tile_visible - b * kBlock);
    if (nk > 0) accumulate<R>(p_buf + b * kBlock, v[b], v_stride, value_dim, nk, acc);
  }
}

template <typename scalar_t>
void attend(const scalar_t* query, int64_t q_token_stride, int64_t q_head_stride,
            const scalar_t* keys, const scalar_t* values, const int32_t* tables, int64_t table_width,
            const int32_t* query_starts, const int32_t* context_lens, int64_t num_rows,
            int64_t num_heads, int64_t kv_heads, int64_t head_dim, int64_t value_dim, float scale, scalar_t* out) {
  const int64_t group = num_heads / kv_heads;
  // tasks: (row, first query of the tile); each runs once per key head
  std::vector<std::pair<int32_t, int32_t>> tiles;
  for (int64_t r = 0; r < num_rows; ++r) {
    const int32_t n = query_starts[r + 1] - query_starts[r];
    for (int32_t q0 = 0; q0 < n; q0 += kQueryTile) tiles.emplace_back(static_cast<int32_t>(r), q0);
  }
  const int64_t num_tasks = static_cast<int64_t>(tiles.size()) * kv_heads;
  const int64_t value_stride = kv_heads * value_dim;
  constexpr bool is_float = std::is_same<scalar_t, float>::value;

  at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    const int64_t rows_max = (kQueryTile * group + 3) / 4 * 4;
    std::vector<float> q(rows_max * head_dim), acc(rows_max * value_dim), m(rows_max);
    std::vector<vf16> l(rows_max);
    std::vector<float> p(kRows * kSpanKeys), kt(is_float ? 0 : kSpan * head_dim * kBlock);
    std::vector<float> v(is_float ? 0 : kSpanKeys * value_dim);
    std::vector<int64_t> visible(rows_max);
    for (int64_t task = begin; task < end; ++task) {
      const auto [r, q0] = tiles[task / kv_heads];
      const int64_t g = task % kv_heads;
      const int64_t n = query_starts[r + 1] - query_starts[r];
      const int64_t num_q = std::min<int64_t>(kQueryTile, n - q0);
      const int64_t first_pos = context_lens[r] - n + q0;  // position of the tile's first query
      const int64_t num_keys = first_pos + num_q;  // the last query sees keys 0..num_keys-1
      const int64_t rows = num_q * group;  // query vectors: i = (query i / group, head g * group + i % group)
      const int64_t padded = (rows + 3) / 4 * 4;  // tiles of kRows, the last one of 4 where that covers it
      for (int64_t i = 0; i < padded; ++i) {
        float* qi = &q[i * head_dim];
        if (i < rows) {
          const scalar_t* src = query + (query_starts[r] + q0 + i / group) * q_token_stride +
                                (g * group + i % group) * q_head_stride;
          for (int64_t d = 0; d < head_dim; ++d) qi[d] = static_cast<float>(src[d]) * scale;
        } else {
          std::fill(qi, qi + head_dim, 0.f);  // padding of the last register tile
        }
        m[i] = -std::numeric_limits<float>::infinity();
        l[i] = splat(0.f);
      }
      std::fill(acc.begin(), acc.begin() + padded * value_dim, 0.f);
      for (int64_t k0 = 0; k0 < num_keys; k0 += kSpanKeys) {
        const int64_t nk = std::min(kSpanKeys, num_keys - k0);
        const int nb = nk > kBlock ? 2 : 1;  // a row's table may end at its last block: no block past it is read
        const float* kt_blocks[kSpan];
        const float* v_blocks[kSpan];
        int64_t v_stride = value_stride;
        for (int b = 0; b < nb; ++b) {
          const int64_t block = tables[r * table_width + k0 / kBlock + b];
          const scalar_t* kb = keys + (block * kv_heads + g) * head_dim * kBlock;
          const scalar_t* vb = values + block * kBlock * value_stride + g * value_dim;
          if constexpr (is_float) {
            kt_blocks[b] = kb;
            v_blocks[b] = vb;
          } else {  // one fp32 copy of the block, shared by every query vector of the task
            float* ktb = &kt[b * head_dim * kBlock];
            float* vbf = &v[b * kBlock * value_dim];
            for (int64_t x = 0; x < head_dim * kBlock; ++x) ktb[x] = static_cast<float>(kb[x]);
            for (int64_t j = 0; j < std::min(kBlock, nk - b * kBlock); ++j)
              for (int64_t d = 0; d < value_dim; ++d) vbf[j * value_dim + d] = static_cast<float>(vb[j * value_stride + d]);
            kt_blocks[b] = ktb;
            v_blocks[b] = vbf;
            v_stride = value_dim;
          }
        }
        // the next blocks are anywhere in the pool: no hardware prefetcher guesses them
        for (int64_t k1 = k0 + kSpanKeys; k1 < std::min(num_keys, k0 + 2 * kSpanKeys); k1 += kBlock) {
          const int64_t next = tables[r * table_width + k1 / kBlock];
          const char* nk_ptr = reinterpret_cast<const char*>(keys + (next * kv_heads + g) * head_dim * kBlock);
          for (int64_t x = 0; x < head_dim * kBlock * int64_t(sizeof(scalar_t)); x += 64) __builtin_prefetch(nk_ptr + x);
          for (int64_t j = 0; j < kBlock; ++j) {
            const char* nv_ptr = reinterpret_cast<const char*>(values + (next * kBlock + j) * value_stride + g * value_dim);
            for (int64_t x = 0; x < value_dim * int64_t(sizeof(scalar_t)); x += 64) __builtin_prefetch(nv_ptr + x);
          }
        }
        // causal: query vector i sees the span's keys up to its own position
        for (int64_t i = 0; i < padded; ++i) visible[i] = i < rows ? std::min(nk, first_pos + i / group - k0 + 1) : 0;
        int64_t i0 = 0;
        const auto tile = [&](auto rows_c, auto blocks_c) {
          attend_tile<decltype(rows_c)::value, decltype(blocks_c)::value>(
              &q[i0 * head_dim], kt_blocks, v_blocks, v_stride, head_dim, value_dim, &visible[i0], &m[i0], &l[i0],
              &acc[i0 * value_dim], p.data());
        };
        using full = std::integral_constant<int, kRows>;
        using last = std::integral_constant<int, 4>;
        using one = std::integral_constant<int, 1>;
        using two = std::integral_constant<int, 2>;
        for (; i0 + kRows <= padded; i0 += kRows) nb == 2 ? tile(full{}, two{}) : tile(full{}, one{});
        if (i0 < padded) nb == 2 ? tile(last{}, two{}) : tile(last{}, one{});
      }
      for (int64_t i = 0; i < rows; ++i) {
        scalar_t* dst = out + ((query_starts[r] + q0 + i / group) * num_heads + g * group + i % group) * value_dim;
        const float inv = 1.f / hsum(l[i]);
        for (int64_t d = 0; d < value_dim; ++d) dst[d] = static_cast<scalar_t>(acc[i * value_dim + d] * inv);
      }
    }
  });
}

void check_tables(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kInt && t.is_contiguous() && t.device().is_cpu(),
              "paged_attention: ", name, " must be a contiguous int32 CPU tensor");
}

}  // namespace

// query [N, H, D] (the last dim contiguous), key_pool [B, H_kv, D, kBlock] and value_pool
// [B * kBlock, H_kv, Dv] contiguous, block_tables [R, W], query_starts [R + 1] and
// context_lens [R] int32. Returns [N, H, Dv] in the query's dtype.
at::Tensor paged_attention(const at::Tensor& query, const at::Tensor& key_pool,
                              const at::Tensor& value_pool, const at::Tensor& block_tables,
                              const at::Tensor& query_starts, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(query.device().is_cpu() && key_pool.device().is_cpu() && value_pool.device().is_cpu(),
              "paged_attention: CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && key_pool.dim() == 4 && value_pool.dim() == 3, "paged_attention: tensor ranks");
  TORCH_CHECK(query.stride(2) == 1, "paged_attention: the query's head dim must be contiguous");
  TORCH_CHECK(key_pool.is_contiguous() && value_pool.is_contiguous(), "paged_attention: contiguous pools");
  TORCH_CHECK(query.scalar_type() == key_pool.scalar_type() && key_pool.scalar_type() == value_pool.scalar_type(),
              "paged_attention: query and pools must share a dtype");
  check_tables(block_tables, "block_tables");
  check_tables(query_starts, "query_starts");
  check_tables(context_lens, "context_lens");
  const int64_t num_heads = query.size(1), kv_heads = key_pool.size(1);
  const int64_t head_dim = query.size(2), value_dim = value_pool.size(2);
  TORCH_CHECK(key_pool.size(3) == kBlock && value_pool.size(0) == key_pool.size(0) * kBlock,
              "paged_attention: blocks of ", kBlock, " tokens");
  TORCH_CHECK(num_heads % kv_heads == 0 && value_pool.size(1) == kv_heads,
              "paged_attention: query heads must be a multiple of key heads");
  TORCH_CHECK(key_pool.size(2) == head_dim && value_dim % 8 == 0, "paged_attention: head dims");
  TORCH_CHECK(query_starts.numel() == context_lens.numel() + 1 && block_tables.size(0) == context_lens.numel(),
              "paged_attention: one table, start and length per row");
  auto out = at::empty({query.size(0), num_heads, value_dim}, query.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention", [&] {
    attend<scalar_t>(query.data_ptr<scalar_t>(), query.stride(0), query.stride(1), key_pool.data_ptr<scalar_t>(),
                     value_pool.data_ptr<scalar_t>(), block_tables.data_ptr<int32_t>(), block_tables.size(1),
                     query_starts.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(), context_lens.size(0),
                     num_heads, kv_heads, head_dim, value_dim, static_cast<float>(scale), out.data_ptr<scalar_t>());
  });
  return out;
}

// keys [N, H_kv, D] into key_pool [B, H_kv, D, kBlock] at `slots` [N] (int64; slot = block * kBlock + offset)
void write_keys(const at::Tensor& key_pool, const at::Tensor& keys, const at::Tensor& slots) {
  TORCH_CHECK(key_pool.is_contiguous() && key_pool.dim() == 4 && key_pool.size(3) == kBlock,
              "write_keys: a contiguous [B, H_kv, D, 16] pool");
  TORCH_CHECK(keys.dim() == 3 && keys.size(1) == key_pool.size(1) && keys.size(2) == key_pool.size(2) &&
                  keys.scalar_type() == key_pool.scalar_type(),
              "write_keys: keys [N, H_kv, D] of the pool's dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == keys.size(0),
              "write_keys: one int64 slot per key");
  const int64_t n = keys.size(0), heads = keys.size(1), dim = keys.size(2);
  const int64_t num_slots = key_pool.size(0) * kBlock;
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < n; ++t) TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "write_keys: slot out of range");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, keys.scalar_type(), "write_keys", [&] {
    const auto src = keys.accessor<scalar_t, 3>();
    scalar_t* pool = key_pool.data_ptr<scalar_t>();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t block = slot[t] / kBlock, offset = slot[t] % kBlock;
      for (int64_t h = 0; h < heads; ++h) {
        scalar_t* dst = pool + ((block * heads + h) * dim) * kBlock + offset;
        for (int64_t d = 0; d < dim; ++d) dst[d * kBlock] = src[t][h][d];
      }
    }
  });
}

// Ops under torch.ops.omnistage_paged (loaded as a plain library: no pybind11 to compile).
TORCH_LIBRARY(omnistage_paged, m) {
  m.def("paged_attention(Tensor query, Tensor key_pool, Tensor value_pool, Tensor block_tables, "
        "Tensor query_starts, Tensor context_lens, float scale) -> Tensor");
  m.def("write_keys(Tensor(a!) key_pool, Tensor keys, Tensor slots) -> ()");
}

TORCH_LIBRARY_IMPL(omnistage_paged, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("write_keys", &write_keys);
}
