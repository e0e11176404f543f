// The command line of the standalone harnesses (sm90_harness.cu, quant_harness.cu):
// D B H N [switch] [iters], the switch 0 unless given (causal, or v_full).
#pragma once

#include <cstdio>
#include <cstdlib>

struct HarnessArgs {
  int d, b, h, n, sw, iters;
};

inline HarnessArgs harness_args(int argc, char** argv, const char* sw_name, int iters_default) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s D B H N [%s] [iters]\n", argv[0], sw_name);
    std::exit(2);
  }
  return {std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]),
          argc > 5 ? std::atoi(argv[5]) : 0, argc > 6 ? std::atoi(argv[6]) : iters_default};
}
