// allocbench's fake cuBLAS and cuBLASLt (libcublas.so.N, libcublasLt.so.N; this file is built
// into each, FAKE_CUBLASLT choosing which half), for `capture --backend driver`: handles,
// settings read back as they were set, one heuristic result that asks for no workspace of its
// own (torch allocates the cuBLAS workspaces itself, through its caching allocator: those are
// the allocations a capture records), and math that does nothing. Every other call torch's
// libraries import is a generated stub that succeeds (the builder lists them with `nm`).
#include <cstddef>
#include "fake_handles.h"

#include <cstdint>
#include <cstring>
#include <mutex>

namespace {
template <typename T>
T next_handle() {
  return next_fake_handle<T, 0x7c0000>();
}
}  // namespace

extern "C" {
#ifndef FAKE_CUBLASLT
// cublasHandle_t and its settings (cublas_api.h; enums are ints in the C ABI).
struct FakeCublas {
  void* stream = nullptr;
  int math_mode = 0;
  int pointer_mode = 0;
};
int cublasCreate_v2(FakeCublas** h) {
  *h = new FakeCublas();
  return 0;
}
int cublasDestroy_v2(FakeCublas* h) {
  delete h;
  return 0;
}
int cublasSetStream_v2(FakeCublas* h, void* s) {
  h->stream = s;
  return 0;
}
int cublasGetStream_v2(FakeCublas* h, void** s) {
  *s = h->stream;
  return 0;
}
int cublasSetMathMode(FakeCublas* h, int m) {
  h->math_mode = m;
  return 0;
}
int cublasGetMathMode(FakeCublas* h, int* m) {
  *m = h->math_mode;
  return 0;
}
int cublasSetPointerMode_v2(FakeCublas* h, int m) {
  h->pointer_mode = m;
  return 0;
}
int cublasGetPointerMode_v2(FakeCublas* h, int* m) {
  *m = h->pointer_mode;
  return 0;
}
int cublasGetVersion_v2(FakeCublas*, int* v) {
  *v = 130200;
  return 0;
}
int cublasGetProperty(int type, int* v) {
  const int parts[] = {13, 2, 0};  // MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
  *v = type >= 0 && type < 3 ? parts[type] : 0;
  return 0;
}
#else
// cuBLASLt: descriptors are handles; a heuristic query answers one algorithm, no workspace.
int cublasLtCreate(void** h) {
  *h = next_handle<void*>();
  return 0;
}
int cublasLtDestroy(void*) { return 0; }
size_t cublasLtGetVersion(void) { return 130200; }
size_t cublasLtGetCudartVersion(void) { return 13020; }
int cublasLtMatmulDescCreate(void** d, int, int) {
  *d = next_handle<void*>();
  return 0;
}
int cublasLtMatrixLayoutCreate(void** l, int, uint64_t, uint64_t, int64_t) {
  *l = next_handle<void*>();
  return 0;
}
int cublasLtMatmulPreferenceCreate(void** p) {
  *p = next_handle<void*>();
  return 0;
}
// cublasLtMatmulHeuristicResult_t: an algo (uint64_t data[8]), workspaceSize, state, wavesCount.
struct HeuristicResult {
  uint64_t algo[8];
  size_t workspace_size;
  int state;
  float waves_count;
  int reserved[4];
};
int cublasLtMatmulAlgoGetHeuristic(void*, void*, void*, void*, void*, void*, void*, int requested, HeuristicResult* results, int* returned) {
  if (requested < 1) {
    *returned = 0;
    return 0;
  }
  std::memset(results, 0, sizeof(HeuristicResult));
  results[0].waves_count = 1.0f;
  *returned = 1;
  return 0;
}
int cublasLtMatmulDescGetAttribute(void*, int, void* buf, size_t size, size_t* written) {
  if (buf) std::memset(buf, 0, size);
  if (written) *written = size;
  return 0;
}
int cublasLtMatrixLayoutGetAttribute(void*, int, void* buf, size_t size, size_t* written) { return cublasLtMatmulDescGetAttribute(nullptr, 0, buf, size, written); }
int cublasLtMatmulAlgoConfigGetAttribute(const void*, int, void* buf, size_t size, size_t* written) {
  return cublasLtMatmulDescGetAttribute(nullptr, 0, buf, size, written);
}
#endif
}  // extern "C"
