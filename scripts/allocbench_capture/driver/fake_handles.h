// The handles allocbench's fake CUDA libraries hand out (modules, kernels, cuBLAS descriptors):
// never dereferenced, but not null, pointer-like and distinct, each library from its own range.
#pragma once

#include <cstdint>
#include <mutex>

template <typename T, std::uintptr_t Base>
T next_fake_handle() {
  static std::uintptr_t h = Base;
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  h += 0x100;
  return reinterpret_cast<T>(h);
}
