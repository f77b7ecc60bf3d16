// allocbench's fake NVML (libnvidia-ml.so.1): the calls c10's DriverAPI looks up
// (C10_NVML_DRIVER_API in c10/cuda/driver_api.h). torch 2.15's expandable segments ask NVML
// whether the card has fabric memory (get_fabric_access) and call it unchecked, as a machine
// with an NVIDIA driver always has it. The answer here: no fabric, no NVLink, no other process.
// NVML's types are passed as what they are in its C ABI (an enum is an int, a handle a pointer).
extern "C" {

constexpr int kSuccess = 0;         // NVML_SUCCESS
constexpr int kNotSupported = 3;    // NVML_ERROR_NOT_SUPPORTED

int nvmlInit_v2() { return kSuccess; }
int nvmlDeviceGetHandleByPciBusId_v2(const char*, void** device) {
  *device = reinterpret_cast<void*>(0x1);
  return kSuccess;
}
int nvmlDeviceGetNvLinkRemoteDeviceType(void*, unsigned, int*) { return kNotSupported; }
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void*, unsigned, void*) { return kNotSupported; }
int nvmlDeviceGetComputeRunningProcesses(void*, unsigned* count, void*) {
  *count = 0;
  return kSuccess;
}
int nvmlSystemGetCudaDriverVersion_v2(int* version) {
  *version = 13020;
  return kSuccess;
}
// nvmlGpuFabricInfoV_t: a version (NVML_STRUCT_VERSION: the struct's size in the low 24 bits),
// then a cluster UUID, a status, a clique, a state and health. All zero: fabric state
// NOT_SUPPORTED (torch 2.13 requires the call to succeed; 2.15 also takes NOT_SUPPORTED).
int nvmlDeviceGetGpuFabricInfoV(void*, void* info) {
  unsigned char* bytes = static_cast<unsigned char*>(info);
  unsigned size = *static_cast<unsigned*>(info) & 0xFFFFFFu;
  for (unsigned i = 4; i < size; i++) bytes[i] = 0;
  return kSuccess;
}

}  // extern "C"
