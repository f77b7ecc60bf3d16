/* A stand-in libcuda.so.1 for machines without a GPU: cuInit reports CUDA_ERROR_NO_DEVICE (100),
   as the real driver does on a machine with the driver but no device. */
int cuInit(unsigned int flags) { (void)flags; return 100; }
