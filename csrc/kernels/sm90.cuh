// PTX wrappers for the Hopper kernel (sm_90a): mbarriers, TMA tensor loads, wgmma fences
// and shared-memory matrix descriptors, register reallocation. Plain CUDA, no torch.
#pragma once

#include <cstdint>
#include "ptx.cuh"

namespace sage {

// ---- mbarriers (shared::cta) ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
// Makes the initialisation visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Makes this thread's shared-memory writes visible to the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Wait until the phase of parity `parity` has completed. A wait that never ends (a bug, or
// a fault elsewhere in the grid) traps after ~2^34 clocks (about 10 s) instead of hanging.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  const uint32_t addr = smem_addr(bar);
  uint32_t done = 0;
  long long start = 0;
  for (int polls = 0;; ++polls) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
    if (done) return;
    if (polls == 0) start = clock64();
    else if (clock64() - start > (1ll << 34)) __trap();
  }
}

// ---- TMA: 2-D tile global -> shared, completion counted on `bar` in bytes ----
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tmap, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
// ---- two-CTA clusters: K and V tiles shared by a pair of CTAs working on one head ----
// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster (release / acquire: the barrier initialisations
// before it are visible to the other CTAs after it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrives on the mbarrier at the same offset in the shared memory of cluster CTA `cta` (the
// default .release.cta: what it orders is that this CTA's consumers are done reading a slot,
// which they were before their own arrivals; .cluster scope costs a GPU-wide fence per call).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}
// tma_load_2d into the same offset of every CTA in `mask` (bit i: cluster rank i), each
// counting the bytes on its own mbarrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const void* tmap, int c0, int c1, uint64_t* bar,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}
// Stores v at shared address base ^ x (x a constant): the 128-byte swizzle's XOR of a 16-byte
// chunk index, computed at the store (the compiler would otherwise hoist every address out of
// the loops and keep, or spill, them).
__device__ __forceinline__ void st_shared_xor(uint32_t base, uint32_t x, uint32_t v) {
  asm volatile("{\n.reg .b32 a;\nxor.b32 a, %0, %1;\nst.shared.u32 [a], %2;\n}\n" ::"r"(base), "r"(x), "r"(v) : "memory");
}
// ---- TMA stores: a shared-memory box to a 4-D tensor (out-of-range parts are not written) ----
__device__ __forceinline__ void tma_store_4d(const void* tmap, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(tmap)),
      "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// The committed stores have read their shared-memory source (it may be overwritten).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// The committed stores are complete.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void tma_prefetch_desc(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// ---- wgmma ordering ----
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins a register so the compiler neither reads it before a wgmma wait nor reuses it early.
__device__ __forceinline__ void reg_fence(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void reg_fence(int32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
__device__ __forceinline__ void reg_fence(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

// Shared-memory matrix descriptor of a K-major tile whose rows are exactly SW bytes
// (128 or 64) long, laid out by TMA with the matching swizzle: 8-row groups SW*8 bytes
// apart. Kept as two 32-bit halves: the low one holds the address (< 2^14 units of 16 bytes,
// so steps along K, (bytes >> 4), or between ring slots added to it never carry out), the
// high one is a constant of the swizzle (stride: one 8-row group; swizzle mode); they are
// joined at the wgmma, so the kernel's descriptor arithmetic stays 32-bit.
template <int SW>
__device__ __forceinline__ uint32_t kmajor_desc_lo(uint32_t saddr) {
  return ((saddr & 0x3FFFF) >> 4) | (1u << 16);
}
template <int SW>
__device__ __forceinline__ uint64_t kmajor_desc_at(uint32_t lo) {
  static_assert(SW == 128 || SW == 64, "128- or 64-byte swizzle");
  constexpr uint32_t hi = ((8 * SW) >> 4) | ((SW == 128 ? 1u : 2u) << 30);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// ---- named barriers (id 0 is __syncthreads) ----
template <int THREADS>
__device__ __forceinline__ void named_bar_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
template <int THREADS>
__device__ __forceinline__ void named_bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}

// ---- register reallocation between warpgroups ----
template <int R>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

}  // namespace sage
