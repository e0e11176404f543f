// The Hopper kernel's work-tile schedule (csrc/kernels/attn_sm90_tiles.cuh) checked on the CPU:
// the same sm90_q_tiles, sm90_tile, sm90_tiles and sm90_tail the kernel and its host code use,
// walked over every tile of many calls. Built and run by tests/test_sm90_tiles.py; prints one
// line per failed check (the first 30) and exits 1 if any failed.
//
// What a call's tiles must satisfy, for each instance of sm90_tile the kernel has (192-row
// tiles with and without D=64's tail, 128-row tiles; dense and packed sequences):
//   - every query row of every (batch, head) lies in exactly one tile the consumers see
//     (packed: one with keys, nkb > 0; entries without keys or queries get none);
//   - every tile the consumers see starts below its last query row: consumer 0 has a real row
//     (D=64's idle consumers free their ring slots on the strength of its waits; a tile wholly
//     past the queries faulted the kernel, tests/test_cuda.py: test_sm90_tail_modes_agree);
//   - nkb is the key tiles of 128 up to the entry's keys (causal: up to the tile's last row);
//   - causal tiles of a head go longest first;
//   - with head_full > 0, the tiles numbered below tiles_full are full and the rest are each
//     head's last, partly filled tile, one per head.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "attn_sm90_tiles.cuh"

using sage::AttnParams;
using sage::Sm90Args;
using sage::Sm90Tile;

static int failures = 0;

#define EXPECT(cond, ...)                                       \
  do {                                                          \
    if (!(cond)) {                                              \
      if (failures++ < 30) {                                    \
        std::printf("FAIL %s:%d %s: ", __FILE__, __LINE__, #cond); \
        std::printf(__VA_ARGS__);                               \
        std::printf("\n");                                      \
      }                                                         \
    }                                                           \
  } while (0)

struct Call {
  int batch, heads, nq, nk;
  bool causal;
  std::vector<int> seq_q, seq_k;  // packed: starts then counts (2 x batch); empty: dense
};

template <int BQ, bool VL, bool TAIL>
static void check(const Call& c, int head_dim, const char* tail_env) {
  if (tail_env) setenv("SAGEATTN_SM90_TAIL", tail_env, 1);
  else unsetenv("SAGEATTN_SM90_TAIL");
  Sm90Args a{};
  AttnParams& p = a.p;
  p.batch = c.batch, p.heads_q = c.heads, p.heads_kv = 1, p.nq = c.nq, p.nk = c.nk;
  p.nq_pad = (c.nq + 127) / 128 * 128, p.nk_pad = (c.nk + 127) / 128 * 128;
  p.causal = c.causal;
  p.seq_q = VL ? c.seq_q.data() : nullptr;
  p.seq_k = VL ? c.seq_k.data() : nullptr;
  sage::sm90_tail(p, head_dim, BQ, VL, a);
  const int64_t tiles = sage::sm90_tiles(p, BQ);
  const char* what = VL ? "packed" : "dense";
  // rows covered, per (batch, head), by the tiles the consumers see
  std::vector<int> seen(static_cast<size_t>(c.batch) * c.heads * c.nq, 0);
  std::vector<int> last_q0(static_cast<size_t>(c.batch) * c.heads, -1);
  std::vector<int> partial(static_cast<size_t>(c.batch) * c.heads, 0);
  for (int w = 0; w < tiles; ++w) {
    const Sm90Tile t = sage::sm90_tile<BQ, VL, TAIL>(a, w);
    EXPECT(t.b >= 0 && t.b < c.batch && t.h >= 0 && t.h < c.heads, "%s BQ=%d nq=%d tile %d: batch %d head %d", what,
           BQ, c.nq, w, t.b, t.h);
    if (!(t.b >= 0 && t.b < c.batch && t.h >= 0 && t.h < c.heads)) continue;
    const int nq = VL ? c.seq_q[c.batch + t.b] : c.nq, nk = VL ? c.seq_k[c.batch + t.b] : c.nk;
    EXPECT(t.nq == nq && t.nk == nk, "%s tile %d: nq %d nk %d, the entry has %d and %d", what, w, t.nq, t.nk, nq, nk);
    EXPECT(t.q0 >= 0 && t.q0 % BQ == 0, "%s BQ=%d tile %d: q0 %d", what, BQ, w, t.q0);
    const int kv = c.causal ? (nk < t.q0 + BQ ? nk : t.q0 + BQ) : nk;
    const int nkb = VL && t.q0 >= nq ? 0 : (kv + 127) / 128;
    EXPECT(t.nkb == nkb, "%s BQ=%d nq=%d nk=%d causal=%d tile %d (q0 %d): nkb %d, expected %d", what, BQ, c.nq, c.nk,
           c.causal, w, t.q0, t.nkb, nkb);
    if (VL && t.nkb == 0) continue;  // the producer skips it: the consumers never see it
    EXPECT(t.q0 < nq, "%s BQ=%d nq=%d nk=%d causal=%d tile %d of %lld: q0 %d, no query row for consumer 0", what, BQ,
           c.nq, c.nk, c.causal, w, static_cast<long long>(tiles), t.q0);
    const size_t bh = static_cast<size_t>(t.b) * c.heads + t.h;
    for (int r = t.q0; r < t.q0 + BQ && r < nq; ++r) ++seen[bh * c.nq + r];
    if (c.causal && !VL) {
      EXPECT(last_q0[bh] < 0 || t.q0 < last_q0[bh], "causal BQ=%d nq=%d: tile %d (q0 %d) after q0 %d of its head", BQ,
             c.nq, w, t.q0, last_q0[bh]);
    }
    last_q0[bh] = t.q0;
    if (a.head_full > 0) {
      const bool full = t.q0 + BQ <= nq;
      EXPECT(full == (w < a.tiles_full), "tail order BQ=%d nq=%d: tile %d (q0 %d) %s, tiles_full %d", BQ, c.nq, w,
             t.q0, full ? "full" : "partial", a.tiles_full);
      partial[bh] += !full;
    }
  }
  for (int b = 0; b < c.batch; ++b) {
    const int nq = VL ? c.seq_q[c.batch + b] : c.nq, nk = VL ? c.seq_k[c.batch + b] : c.nk;
    for (int h = 0; h < c.heads; ++h) {
      const size_t bh = static_cast<size_t>(b) * c.heads + h;
      int wrong = 0, first = -1;
      for (int r = 0; r < c.nq; ++r) {
        const int want = r < nq && nk > 0 ? 1 : 0;
        if (seen[bh * c.nq + r] != want && wrong++ == 0) first = r;
      }
      EXPECT(wrong == 0, "%s BQ=%d nq=%d nk=%d causal=%d: batch %d head %d, %d rows not covered once (first %d, %d times)",
             what, BQ, c.nq, c.nk, c.causal, b, h, wrong, first, first >= 0 ? seen[bh * c.nq + first] : 0);
      if (a.head_full > 0) EXPECT(partial[bh] == 1, "tail order nq=%d: head %zu has %d partial tiles", c.nq, bh, partial[bh]);
    }
  }
}

int main() {
  int calls = 0;
  const int nks[] = {1, 130, 4097};
  for (int nq = 1; nq <= 1200; ++nq)
    for (int nk : nks)
      for (int causal = 0; causal < 2; ++causal) {
        const Call c{2, 3, nq, nk, causal != 0, {}, {}};
        check<192, false, true>(c, 64, nullptr);
        check<192, false, true>(c, 64, "0");
        check<192, false, true>(c, 64, "2");
        check<192, false, false>(c, 128, nullptr);
        check<128, false, false>(c, 128, nullptr);
        calls += 5;
      }
  for (int nq : {2051, 4097, 8200, 16384, 16385, 32768})
    for (int causal = 0; causal < 2; ++causal) {
      const Call c{1, 2, nq, nq, causal != 0, {}, {}};
      check<192, false, true>(c, 64, nullptr);
      check<192, false, false>(c, 128, nullptr);
      check<128, false, false>(c, 128, nullptr);
      calls += 3;
    }
  // packed sequences: starts then counts; an entry without queries and one without keys
  const std::vector<std::vector<int>> lens = {{1, 17, 0, 1000, 4097, 33}, {150, 192, 193, 2051, 64, 8200}};
  for (const auto& lq : lens)
    for (int causal = 0; causal < 2; ++causal) {
      const int b = static_cast<int>(lq.size());
      Call c{b, 2, 0, 0, causal != 0, std::vector<int>(2 * b), std::vector<int>(2 * b)};
      int rows = 0;
      for (int i = 0; i < b; ++i) {
        const int nk = i == 4 ? 0 : lq[i] + (causal ? 0 : 7 * i);
        c.seq_q[i] = rows, c.seq_q[b + i] = lq[i], rows += lq[i];
        c.seq_k[i] = 0, c.seq_k[b + i] = nk;
        c.nq = lq[i] > c.nq ? lq[i] : c.nq, c.nk = nk > c.nk ? nk : c.nk;
      }
      check<192, true, true>(c, 64, nullptr);
      check<192, true, false>(c, 128, nullptr);
      check<128, true, false>(c, 128, nullptr);
      calls += 3;
    }
  std::printf("%d calls checked, %d failed checks\n", calls, failures);
  return failures ? 1 : 0;
}
