// Helpers shared by the torch bindings (ops.cpp, ops_fp4.cpp): argument checks that name
// the op and the argument, the kernels' view of an input tensor, and the empty Python module
// whose import registers the ops. SAGE_OPS (the op namespace) and SAGE_EXT (the module name)
// come from the build (scripts/cuda_archs.py). Include once, from one .cpp per extension.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../kernels/launch.h"

#define SAGE_STR2(x) #x
#define SAGE_STR(x) SAGE_STR2(x)
#define SAGE_CAT2(a, b) a##b
#define SAGE_CAT(a, b) SAGE_CAT2(a, b)

namespace {

using at::Tensor;

constexpr const char* kOps = SAGE_STR(SAGE_OPS);

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, kOps, "::", what, ": CUDA error: ", cudaGetErrorString(err));
}

sage::DType dtype_of(const Tensor& t, const char* op, const char* arg) {
  if (t.scalar_type() == at::kHalf) return sage::DType::kHalf;
  if (t.scalar_type() == at::kBFloat16) return sage::DType::kBFloat16;
  TORCH_CHECK(false, kOps, "::", op, ": ", arg, " must be float16 or bfloat16, got ", t.scalar_type());
}

void check_input(const Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(t.is_cuda(), kOps, "::", op, ": ", arg, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 4, kOps, "::", op, ": ", arg, " must be 4-D [B, H, N, D], got ", t.dim(), "-D");
  TORCH_CHECK(t.size(3) == 1 || t.stride(3) == 1, kOps, "::", op, ": ", arg, " needs unit stride on the last dim");
}

// The kernels' view of a [B, H, N, D] input.
[[maybe_unused]] sage::Input4D input_of(const Tensor& t, const char* op, const char* arg) {
  check_input(t, op, arg);
  sage::Input4D in{};
  in.data = t.data_ptr();
  in.dtype = dtype_of(t, op, arg);
  in.stride_b = t.stride(0), in.stride_h = t.stride(1), in.stride_n = t.stride(2);
  in.batch = t.size(0), in.heads = t.size(1), in.n = t.size(2), in.d = t.size(3);
  return in;
}

void check_f32(const Tensor& t, const char* op, const char* arg, std::initializer_list<int64_t> shape) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), kOps, "::", op, ": ", arg,
              " must be a contiguous float32 tensor");
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), kOps, "::", op, ": ", arg, " has shape ", t.sizes(),
              ", expected ", at::IntArrayRef(shape));
}

}  // namespace

// The module object itself is empty: importing it registers the ops.
#define SAGE_DEFINE_MODULE()                                                                   \
  extern "C" PyObject* SAGE_CAT(PyInit_, SAGE_EXT)(void) {                                      \
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, SAGE_STR(SAGE_EXT), nullptr, -1, nullptr, \
                              nullptr, nullptr, nullptr, nullptr};                             \
    return PyModule_Create(&def);                                                              \
  }
