// FastDiv (csrc/kernels/common.cuh) against the division operator, on the host: every divisor
// up to 4096 and divisors around every power of two up to 2^31 and random ones, each with the
// dividends where a quotient changes (multiples of d and their neighbours), the ends of the range
// and random ones. Built and run by tests/test_fast_div.py; prints the failures and a summary.
#include <cstdio>
#include <vector>

#include "common.cuh"

namespace {

uint64_t state = 0x9e3779b97f4a7c15ull;
uint32_t rnd() {  // xorshift64*
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return static_cast<uint32_t>((state * 0x2545f4914f6cdd1dull) >> 32);
}

long long checks = 0, failed = 0;

void check(const sage::FastDiv& f, uint32_t n) {
  if (n >= (1u << 31)) return;
  ++checks;
  const uint32_t q = f.div(n), r = f.mod(n, q);
  if (q != n / f.d || r != n % f.d) {
    if (++failed <= 20) std::printf("FAIL d=%u n=%u: %u r %u, expected %u r %u\n", f.d, n, q, r, n / f.d, n % f.d);
  }
}

void divisor(uint32_t d) {
  const sage::FastDiv f = sage::FastDiv::of(d);
  const uint32_t top = (1u << 31) - 1;
  for (uint32_t n : {0u, 1u, 2u, top, top - 1, top - d, top / d * d, top / d * d - 1}) check(f, n);
  for (uint32_t k = 1; k < 64; ++k) {  // the first multiples
    const uint64_t x = uint64_t{k} * d;
    if (x < top) check(f, static_cast<uint32_t>(x)), check(f, static_cast<uint32_t>(x - 1)), check(f, static_cast<uint32_t>(x + 1));
  }
  for (int i = 0; i < 64; ++i) {  // random multiples and random dividends
    const uint64_t x = uint64_t{rnd() % (top / d + 1)} * d;
    check(f, static_cast<uint32_t>(x)), check(f, static_cast<uint32_t>(x - 1)), check(f, rnd() & top);
  }
}

}  // namespace

int main() {
  std::vector<uint32_t> ds;
  for (uint32_t d = 1; d <= 4096; ++d) ds.push_back(d);
  for (int s = 12; s <= 31; ++s)
    for (int delta = -3; delta <= 3; ++delta) ds.push_back(static_cast<uint32_t>((int64_t{1} << s) + delta));
  for (int i = 0; i < 20000; ++i) ds.push_back(1 + (rnd() % ((1u << 31) - 1)));
  for (uint32_t d : ds)
    if (d >= 1 && d <= (1u << 31)) divisor(d);
  std::printf("%lld checks, %lld failed\n", checks, failed);
  return failed == 0 ? 0 : 1;
}
