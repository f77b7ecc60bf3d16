// allocbench's fake cuDNN (libcudnn.so.N), for `capture --backend driver`: NVIDIA's cuDNN links
// its own CUDA runtime, which needs the real driver's private tables, so it cannot start on the
// fake card. This stands in for the calls PyTorch's convolutions and batch norm make, so that they
// take cuDNN's path as on a GPU (their output and workspace allocations are PyTorch's, through its
// caching allocator: what the capture records) and the math does nothing:
// - the graph API (cudnn_frontend, Conv_v8.cpp): descriptors keep the attributes set on them and
//   give them back; a heuristic query answers one engine configuration; an execution plan asks for
//   the workspace `ALLOCBENCH_CUDNN_WORKSPACE_BYTES` says (0 by default: what NVIDIA's heuristics
//   would pick for the card is not known off it, and the capture says so);
// - the legacy calls of Conv_v7.cpp, BatchNorm.cpp, the grid sampler and pooling: descriptors,
//   workspace and reserve sizes (the same rule), launches that do nothing.
// Every other call torch's libraries import (cuDNN's RNN, CTC loss, dropout states) is a generated
// stub that answers CUDNN_STATUS_NOT_SUPPORTED and names itself in the error PyTorch raises; the
// capture runs RNNs and CTC loss on PyTorch's own kernels so they never get there.
#include <cudnn.h>

#include "fake_handles.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

extern "C" {
void allocbench_fake_kernel_ran();
cudaError_t allocbench_fake_unsupported(const char* call);
const char* allocbench_fake_unsupported_text();
}

namespace {

// The workspace every plan and legacy query asks for (bytes).
size_t workspace_bytes() {
  static const size_t bytes = [] {
    const char* v = std::getenv("ALLOCBENCH_CUDNN_WORKSPACE_BYTES");
    return v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : size_t{0};
  }();
  return bytes;
}

size_t element_size(cudnnBackendAttributeType_t type) {
  switch (type) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void*);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return sizeof(int64_t);
    case CUDNN_TYPE_DOUBLE: return sizeof(double);
    case CUDNN_TYPE_CHAR: return sizeof(char);
    case CUDNN_TYPE_FRACTION: return sizeof(cudnnFraction_t);
    default: return sizeof(int32_t);  // FLOAT, INT32 and the enums
  }
}

struct Attribute {
  cudnnBackendAttributeType_t type;
  int64_t count;
  std::vector<char> bytes;
};

struct Descriptor {
  cudnnBackendDescriptorType_t kind;
  std::map<cudnnBackendAttributeName_t, Attribute> attributes;
  bool finalized = false;
};

std::mutex descriptors_mu;
// Descriptors this library makes for its answers (a heuristic's engine configurations), kept for
// the process: the frontend copies them out into its own.
std::vector<Descriptor*>& owned() {
  static std::vector<Descriptor*> all;
  return all;
}

template <typename T>
void put(Descriptor* d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const std::vector<T>& values) {
  Attribute a{type, static_cast<int64_t>(values.size()), {}};
  a.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
  d->attributes[name] = std::move(a);
}

Descriptor* make(cudnnBackendDescriptorType_t kind) {
  auto* d = new Descriptor{kind, {}, true};
  owned().push_back(d);
  return d;
}

// One engine (global index 0, no numerical or behaviour notes: PyTorch's filters keep it) and its
// configuration without knobs, for a heuristic's answer about `graph`.
Descriptor* engine_config(void* graph) {
  Descriptor* engine = make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  put<void*>(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, {graph});
  put<int64_t>(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, {0});
  Descriptor* config = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  put<void*>(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, {engine});
  put<int64_t>(config, CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, {static_cast<int64_t>(workspace_bytes())});
  return config;
}

// What finalizing computes for the descriptors whose answers PyTorch reads back.
void finalize(Descriptor* d) {
  switch (d->kind) {
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      put<int64_t>(d, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, {1});
      break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
      void* graph = nullptr;
      auto it = d->attributes.find(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
      if (it != d->attributes.end() && !it->second.bytes.empty()) std::memcpy(&graph, it->second.bytes.data(), sizeof(void*));
      put<void*>(d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, {engine_config(graph)});
      break;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
      put<int64_t>(d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, {static_cast<int64_t>(workspace_bytes())});
      static const char json[] = "{\"engineId\":0,\"knobs\":{}}";
      put<char>(d, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, std::vector<char>(json, json + sizeof(json)));
      break;
    }
    default: break;
  }
  d->finalized = true;
}

std::string last_error;

cudnnStatus_t unsupported(const char* call) {
  allocbench_fake_unsupported(call);
  last_error = allocbench_fake_unsupported_text();
  return CUDNN_STATUS_NOT_SUPPORTED;
}

// A legacy algorithm query's answer: one algorithm, the first of its enum, with the workspace rule.
template <typename Perf>
cudnnStatus_t one_algorithm(int requested, int* returned, Perf* perf) {
  if (requested < 1) return CUDNN_STATUS_BAD_PARAM;
  std::memset(perf, 0, sizeof(*perf));
  perf->algo = static_cast<decltype(perf->algo)>(0);
  perf->status = CUDNN_STATUS_SUCCESS;
  perf->time = 1.0f;
  perf->memory = workspace_bytes();
  perf->determinism = CUDNN_DETERMINISTIC;
  perf->mathType = CUDNN_DEFAULT_MATH;
  *returned = 1;
  return CUDNN_STATUS_SUCCESS;
}

// A handle and the stream it runs on.
struct Handle {
  cudaStream_t stream = nullptr;
};

}  // namespace

// The legacy descriptors: what was set, given back.
struct cudnnTensorStruct {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<int> dims, strides;
};
struct cudnnFilterStruct {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  std::vector<int> dims;
};
struct cudnnConvolutionStruct {};
struct cudnnActivationStruct {};
struct cudnnPoolingStruct {};
struct cudnnSpatialTransformerStruct {};

namespace {
template <typename T>
cudnnStatus_t created(T** d) {
  *d = new T();
  return CUDNN_STATUS_SUCCESS;
}
template <typename T>
cudnnStatus_t destroyed(T* d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
// A launch: it does nothing (and what was copied to the device is no longer known to be there).
cudnnStatus_t ran() {
  allocbench_fake_kernel_ran();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t workspace_asked(size_t* bytes) {
  *bytes = workspace_bytes();
  return CUDNN_STATUS_SUCCESS;
}
}  // namespace

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }
size_t cudnnGetCudartVersion(void) { return CUDART_VERSION; }
cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int* value) {
  switch (type) {
    case MAJOR_VERSION: *value = CUDNN_MAJOR; break;
    case MINOR_VERSION: *value = CUDNN_MINOR; break;
    case PATCH_LEVEL: *value = CUDNN_PATCHLEVEL; break;
    default: return CUDNN_STATUS_BAD_PARAM;
  }
  return CUDNN_STATUS_SUCCESS;
}
const char* cudnnGetErrorString(cudnnStatus_t status) {
  if (status == CUDNN_STATUS_SUCCESS) return "CUDNN_STATUS_SUCCESS";
  return status == CUDNN_STATUS_NOT_SUPPORTED && !last_error.empty() ? last_error.c_str() : "CUDNN_STATUS_NOT_SUPPORTED (allocbench's fake cuDNN)";
}
void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (max_size == 0) return;
  std::strncpy(message, last_error.c_str(), max_size - 1);
  message[max_size - 1] = '\0';
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  *handle = reinterpret_cast<cudnnHandle_t>(new Handle());
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete reinterpret_cast<Handle*>(handle);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  reinterpret_cast<Handle*>(handle)->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  *stream = reinterpret_cast<Handle*>(handle)->stream;
  return CUDNN_STATUS_SUCCESS;
}

// --- the graph (backend) API ---------------------------------------------------------------
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t kind, cudnnBackendDescriptor_t* out) {
  *out = new Descriptor{kind, {}, false};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  delete static_cast<Descriptor*>(d);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                                       const void* elements) {
  if (desc == nullptr || count < 0 || (count > 0 && elements == nullptr)) return CUDNN_STATUS_BAD_PARAM;
  auto* d = static_cast<Descriptor*>(desc);
  Attribute a{type, count, std::vector<char>(static_cast<size_t>(count) * element_size(type))};
  if (count > 0) std::memcpy(a.bytes.data(), elements, a.bytes.size());
  std::lock_guard<std::mutex> g(descriptors_mu);
  d->attributes[name] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc) {
  if (desc == nullptr) return CUDNN_STATUS_BAD_PARAM;
  std::lock_guard<std::mutex> g(descriptors_mu);
  finalize(static_cast<Descriptor*>(desc));
  return CUDNN_STATUS_SUCCESS;
}
// An attribute as set or computed; a descriptor-valued one is copied into the descriptors the
// caller made for it (the frontend's engine configurations, engines, knob choices). An attribute
// never set reads as having no elements: the lists PyTorch asks for (numerical and behaviour
// notes, knobs, intermediates) are empty on the fake card.
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const desc, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                                       int64_t requested, int64_t* count, void* elements) {
  if (desc == nullptr || requested < 0) return CUDNN_STATUS_BAD_PARAM;
  std::lock_guard<std::mutex> g(descriptors_mu);
  auto* d = static_cast<Descriptor*>(desc);
  auto it = d->attributes.find(name);
  if (it == d->attributes.end()) {
    if (count) *count = 0;
    return CUDNN_STATUS_SUCCESS;
  }
  const Attribute& a = it->second;
  if (count) *count = a.count;
  int64_t n = std::min(requested, a.count);
  if (n == 0 || elements == nullptr) return CUDNN_STATUS_SUCCESS;
  if (a.type == CUDNN_TYPE_BACKEND_DESCRIPTOR && type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    auto* from = reinterpret_cast<Descriptor* const*>(a.bytes.data());
    auto* to = static_cast<Descriptor**>(elements);
    for (int64_t i = 0; i < n; ++i) {
      if (to[i] == nullptr || from[i] == nullptr) return CUDNN_STATUS_BAD_PARAM;
      to[i]->attributes = from[i]->attributes;
      to[i]->finalized = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (element_size(a.type) != element_size(type)) return CUDNN_STATUS_BAD_PARAM;
  std::memcpy(elements, a.bytes.data(), static_cast<size_t>(n) * element_size(type));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  if (plan == nullptr || pack == nullptr) return CUDNN_STATUS_BAD_PARAM;
  return ran();
}

// --- legacy descriptors ---------------------------------------------------------------------
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) { return created(d); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) { return destroyed(d); }
cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t d, cudnnDataType_t type, int n, const int dims[], const int strides[]) {
  if (n <= 0) return CUDNN_STATUS_BAD_PARAM;
  d->type = type;
  d->dims.assign(dims, dims + n);
  d->strides.assign(strides, strides + n);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t d, int requested, cudnnDataType_t* type, int* n, int dims[], int strides[]) {
  *type = d->type;
  *n = static_cast<int>(d->dims.size());
  for (int i = 0; i < requested && i < *n; ++i) dims[i] = d->dims[i], strides[i] = d->strides[i];
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) { return created(d); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) { return destroyed(d); }
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type, cudnnTensorFormat_t format, int n, const int dims[]) {
  if (n <= 0) return CUDNN_STATUS_BAD_PARAM;
  d->type = type, d->format = format;
  d->dims.assign(dims, dims + n);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetFilterNdDescriptor(const cudnnFilterDescriptor_t d, int requested, cudnnDataType_t* type, cudnnTensorFormat_t* format, int* n, int dims[]) {
  *type = d->type, *format = d->format;
  *n = static_cast<int>(d->dims.size());
  for (int i = 0; i < requested && i < *n; ++i) dims[i] = d->dims[i];
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) { return created(d); }
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) { return destroyed(d); }
cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t, int, const int[], const int[], const int[], cudnnConvolutionMode_t, cudnnDataType_t) {
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t, int) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t, cudnnMathType_t) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* d) { return created(d); }
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t d) { return destroyed(d); }
cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t, cudnnActivationMode_t, cudnnNanPropagation_t, double) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t* d) { return created(d); }
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t, cudnnPoolingMode_t, cudnnNanPropagation_t, int, int, int, int, int, int) {
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateSpatialTransformerDescriptor(cudnnSpatialTransformerDescriptor_t* d) { return created(d); }
cudnnStatus_t cudnnDestroySpatialTransformerDescriptor(cudnnSpatialTransformerDescriptor_t d) { return destroyed(d); }
cudnnStatus_t cudnnSetSpatialTransformerNdDescriptor(cudnnSpatialTransformerDescriptor_t, cudnnSamplerType_t, cudnnDataType_t, const int, const int[]) {
  return CUDNN_STATUS_SUCCESS;
}

// --- legacy convolutions (Conv_v7.cpp, under TORCH_CUDNN_V8_API_DISABLED=1) -------------------
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnFilterDescriptor_t,
                                                     const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t, const int requested, int* returned,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf) {
  return one_algorithm(requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, const cudnnFilterDescriptor_t, const cudnnTensorDescriptor_t,
                                                          const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t, const int requested,
                                                          int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  return one_algorithm(requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                            const cudnnConvolutionDescriptor_t, const cudnnFilterDescriptor_t, const int requested,
                                                            int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  return one_algorithm(requested, returned, perf);
}
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t, const cudnnTensorDescriptor_t, const void*, const cudnnFilterDescriptor_t, const void*,
                                                     const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t, void*, const int requested,
                                                     int* returned, cudnnConvolutionFwdAlgoPerf_t* perf, void*, size_t) {
  return one_algorithm(requested, returned, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t, const cudnnFilterDescriptor_t, const void*, const cudnnTensorDescriptor_t,
                                                          const void*, const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t, void*,
                                                          const int requested, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf, void*, size_t) {
  return one_algorithm(requested, returned, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t, const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t,
                                                            const void*, const cudnnConvolutionDescriptor_t, const cudnnFilterDescriptor_t, void*,
                                                            const int requested, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void*,
                                                            size_t) {
  return one_algorithm(requested, returned, perf);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnFilterDescriptor_t,
                                                      const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t, cudnnConvolutionFwdAlgo_t,
                                                      size_t* bytes) { return workspace_asked(bytes); }
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, const cudnnFilterDescriptor_t, const cudnnTensorDescriptor_t,
                                                           const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t, cudnnConvolutionBwdDataAlgo_t,
                                                           size_t* bytes) { return workspace_asked(bytes); }
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                             const cudnnConvolutionDescriptor_t, const cudnnFilterDescriptor_t,
                                                             cudnnConvolutionBwdFilterAlgo_t, size_t* bytes) { return workspace_asked(bytes); }
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t, const void*, const cudnnTensorDescriptor_t, const void*, const cudnnFilterDescriptor_t, const void*,
                                      const cudnnConvolutionDescriptor_t, cudnnConvolutionFwdAlgo_t, void*, size_t, const void*,
                                      const cudnnTensorDescriptor_t, void*) { return ran(); }
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t, const void*, const cudnnFilterDescriptor_t, const void*, const cudnnTensorDescriptor_t,
                                           const void*, const cudnnConvolutionDescriptor_t, cudnnConvolutionBwdDataAlgo_t, void*, size_t, const void*,
                                           const cudnnTensorDescriptor_t, void*) { return ran(); }
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t, const void*, const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t,
                                             const void*, const cudnnConvolutionDescriptor_t, cudnnConvolutionBwdFilterAlgo_t, void*, size_t, const void*,
                                             const cudnnFilterDescriptor_t, void*) { return ran(); }
cudnnStatus_t cudnnConvolutionBiasActivationForward(cudnnHandle_t, const void*, const cudnnTensorDescriptor_t, const void*, const cudnnFilterDescriptor_t,
                                                    const void*, const cudnnConvolutionDescriptor_t, cudnnConvolutionFwdAlgo_t, void*, size_t,
                                                    const void*, const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t, const void*,
                                                    const cudnnActivationDescriptor_t, const cudnnTensorDescriptor_t, void*) { return ran(); }

// --- batch norm (BatchNorm.cpp), the grid sampler, pooling -----------------------------------
cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t, const cudnnTensorDescriptor_t,
                                                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                                       const cudnnTensorDescriptor_t, const cudnnActivationDescriptor_t, size_t* bytes) { return workspace_asked(bytes); }
cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t, const cudnnTensorDescriptor_t,
                                                                const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                                const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                                                const cudnnActivationDescriptor_t, size_t* bytes) { return workspace_asked(bytes); }
// The reserve space cuDNN keeps between a batch norm's forward and backward: none without a fused
// activation (PyTorch asks with CUDNN_BATCHNORM_OPS_BN and no activation).
cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                                                   const cudnnActivationDescriptor_t, const cudnnTensorDescriptor_t, size_t* bytes) {
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t, const void*, const void*,
                                                       const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t, const void*,
                                                       const cudnnTensorDescriptor_t, void*, const cudnnTensorDescriptor_t, const void*, const void*,
                                                       double, void*, void*, double, void*, void*, cudnnActivationDescriptor_t, void*, size_t, void*,
                                                       size_t) { return ran(); }
cudnnStatus_t cudnnBatchNormalizationBackwardEx(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t, const void*, const void*, const void*, const void*,
                                                const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t, const void*,
                                                const cudnnTensorDescriptor_t, const void*, const cudnnTensorDescriptor_t, void*,
                                                const cudnnTensorDescriptor_t, void*, const cudnnTensorDescriptor_t, const void*, const void*, void*, void*,
                                                double, const void*, const void*, cudnnActivationDescriptor_t, void*, size_t, void*, size_t) { return ran(); }
cudnnStatus_t cudnnBatchNormalizationForwardInference(cudnnHandle_t, cudnnBatchNormMode_t, const void*, const void*, const cudnnTensorDescriptor_t,
                                                      const void*, const cudnnTensorDescriptor_t, void*, const cudnnTensorDescriptor_t, const void*,
                                                      const void*, const void*, const void*, double) { return ran(); }
cudnnStatus_t cudnnSpatialTfGridGeneratorForward(cudnnHandle_t, const cudnnSpatialTransformerDescriptor_t, const void*, void*) { return ran(); }
cudnnStatus_t cudnnSpatialTfGridGeneratorBackward(cudnnHandle_t, const cudnnSpatialTransformerDescriptor_t, const void*, void*) { return ran(); }
cudnnStatus_t cudnnSpatialTfSamplerForward(cudnnHandle_t, cudnnSpatialTransformerDescriptor_t, const void*, const cudnnTensorDescriptor_t, const void*,
                                           const void*, const void*, cudnnTensorDescriptor_t, void*) { return ran(); }
cudnnStatus_t cudnnSpatialTfSamplerBackward(cudnnHandle_t, cudnnSpatialTransformerDescriptor_t, const void*, const cudnnTensorDescriptor_t, const void*,
                                            const void*, const cudnnTensorDescriptor_t, void*, const void*, const cudnnTensorDescriptor_t, const void*,
                                            const void*, const void*, void*) { return ran(); }
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t, const cudnnPoolingDescriptor_t, const void*, const cudnnTensorDescriptor_t, const void*, const void*,
                                  const cudnnTensorDescriptor_t, void*) { return ran(); }

// (The generated stubs name themselves through this.)
int allocbench_fake_cudnn_unsupported(const char* call) { return unsupported(call); }

}  // extern "C"
