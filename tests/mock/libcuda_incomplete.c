/* A broken libcuda.so.1: cuInit succeeds but nothing else exists, so cudarc would panic on the
   next symbol lookup. allocbench must report it as an error, not crash. */
int cuInit(unsigned int flags) { (void)flags; return 0; }
