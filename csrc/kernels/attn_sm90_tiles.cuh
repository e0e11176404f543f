// The Hopper kernel's work tiles (attn_sm90.cuh), on the host and the device: how many a call
// has, which head, query rows and key tiles each one holds, and where the heads' partly filled
// last tiles go. No kernel code: tests/cpp/sm90_tiles.cu checks the schedule on the CPU.
#pragma once

#include <cuda.h>
#include <cstdint>
#include <cstdlib>

#include "launch.h"

namespace sage {

struct Sm90Args {
  CUtensorMap tq, tk, tv;  // int8 Q [rows, D], int8 K [rows, D], e4m3 V^T [rows, nk_pad]
  CUtensorMap to;          // O [batch, heads, nq, d_out] (packed: [1, heads, total_q, d_out]) in 64x64 boxes, when o_tma
  int o_tma;               // O is written by TMA (else by plain stores: strides TMA cannot take)
  AttnParams p;
  // The heads' last, partly filled work tiles (sm90_tail below): a consumer whose
  // 64 rows all lie past the end skips them (skip_idle); head_full > 0: each head has that many
  // full tiles, tiles_full of them in all, numbered first, and the partial ones come after all
  // of them (sm90_tile)
  int skip_idle, head_full, tiles_full;  // (after p: the other instances' parameter offsets stay)
};

// One work tile: BQ (128 or 192) query rows of one (batch, head). Tiles are numbered with the query
// block fastest, so the CTAs running at one time share a head's K and V in L2; causal
// tiles of a head go longest first. With a.head_full > 0 (192-row tiles, non-causal, each
// head ending in a partly filled tile) the heads' full tiles come first, then their last
// tiles, one per head: the fixed stride then gives those cheaper tiles (idle consumers) to the
// CTAs' last rounds, where the CTAs that run one tile more than the others take one of them.
// nq, nk: the batch entry's queries and keys (packed sequences: its own, which may leave the
// tile empty, nkb = 0; the producer skips those).
struct Sm90Tile {
  int q0, h, b, nkb, nq, nk;
};

// Work tiles of one head. 128-row tiles cover nq_pad (a multiple of 128); 192-row tiles cover nq,
// so that no tile lies wholly past the last query row (with nq_pad, nq = 129..192 made two tiles
// and 8200 made 44, each last one all padding). That keeps consumer 0 working in every tile the
// consumers see, which D=64's idle consumers rely on (their ring slots are ordered by its waits).
__host__ __device__ inline int sm90_q_tiles(const AttnParams& p, int bq) {
  return bq == 128 ? p.nq_pad / 128 : (p.nq + bq - 1) / bq;
}

template <int BQ, bool VL, bool TAIL>
__host__ __device__ __forceinline__ Sm90Tile sm90_tile(const Sm90Args& a, int w) {
  const AttnParams& p = a.p;
  const int ntq = sm90_q_tiles(p, BQ);
  int qi, bh;
  if (TAIL && !VL && a.head_full > 0) {
    const int full = a.tiles_full;
    if (w < full) {
      qi = w % a.head_full, bh = w / a.head_full;
    } else {
      qi = a.head_full, bh = w - full;
    }
  } else {
    qi = w % ntq, bh = w / ntq;
  }
  Sm90Tile t;
  t.q0 = (p.causal ? ntq - 1 - qi : qi) * BQ;
  t.h = bh % p.heads_q;
  t.b = bh / p.heads_q;
  t.nq = VL ? min(max(p.seq_q[p.batch + t.b], 0), p.nq) : p.nq;
  t.nk = VL ? min(max(p.seq_k[p.batch + t.b], 0), p.nk) : p.nk;
  int kv_lim = t.nk;
  if (p.causal) kv_lim = min(kv_lim, t.q0 + BQ);
  t.nkb = (kv_lim + kSm90BlockK - 1) / kSm90BlockK;  // >= 1 without packed sequences: nk > 0
  if (VL && t.q0 >= t.nq) t.nkb = 0;
  return t;
}

// Work tiles of one call with BQ-row tiles (the last of each head may be partly filled).
inline int64_t sm90_tiles(const AttnParams& p, int bq) {
  return static_cast<int64_t>(sm90_q_tiles(p, bq)) * p.heads_q * p.batch;
}

// A per-call switch (read on every call, so A/B runs and tests can flip it in one process): the
// digit 0..max that the variable holds, or -1 when it is unset or holds anything else.
inline int env_digit(const char* name, int max) {
  const char* e = std::getenv(name);
  return e && e[0] >= '0' && e[0] <= '0' + max && e[1] == '\0' ? e[0] - '0' : -1;
}

// The heads' last, partly filled tiles (Sm90Args::skip_idle, head_full) of BQ-row tiles.
inline void sm90_tail(const AttnParams& p, int head_dim, int bq, bool packed, Sm90Args& a) {
  // SAGEATTN_SM90_TAIL: 0 neither of the two below, 1 idle consumers only, 2 the order only,
  // 3 (the default) both. The kernel has them at D=64 only (attn_sm90.cuh: kTail).
  const int forced = env_digit("SAGEATTN_SM90_TAIL", 3);
  const int mode = head_dim != 64 ? 0 : forced >= 0 ? forced : 3;
  // a consumer whose 64 query rows all lie past the end (of the head, or of a packed sequence)
  // computes nothing
  a.skip_idle = mode & 1;
  // with 192-row tiles a head whose nq is not a multiple of 192 ends in a partly filled tile
  // (its idle consumers: 64 real rows or fewer leave two, 65 to 128 one); non-causal calls on
  // the fixed stride number those after every full tile (causal ones take their tiles longest
  // first from the counter, packed sequences end anywhere)
  const int full = p.nq / bq;  // (192-row tiles cover nq: sm90_q_tiles)
  a.head_full = (mode & 2) && !packed && !p.causal && p.nq % bq != 0 && full > 0 ? full : 0;
  a.tiles_full = a.head_full * p.batch * p.heads_q;  // (fewer than the call's tiles, an int)
}

}  // namespace sage
