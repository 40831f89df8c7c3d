// What tests may ask the simulated CUDA runtime + NCCL (libsimgpu, docs/simgpu.md) beyond the
// real API: which devices this process touched, what it allocated, and a way to keep a stream
// busy as a long kernel would. Only in test builds linked to simgpu (ddp_simgpu, train_simgpu).
#pragma once

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bit d set: some thread of this process used simulated device d (a CUDA context was made on it:
// cudaSetDevice(d), or any call that needs a context on a thread whose current device is d).
unsigned simgpu_touched_devices(void);
// Calls that needed a context on a thread that never called cudaSetDevice: CUDA puts them on
// device 0 (a stray context there); each one is counted here.
long simgpu_implicit_device0_calls(void);
// Forgets the touches above (the start of a test case).
void simgpu_reset_touches(void);

// Successful cudaMalloc / cudaFree / cudaHostAlloc (incl. cudaMallocHost) calls so far.
long simgpu_device_malloc_calls(void);
long simgpu_device_free_calls(void);
long simgpu_host_alloc_calls(void);
// Device allocations alive now, on every device.
long simgpu_live_device_allocations(void);

// Enqueues on `stream` a "kernel" that runs until simgpu_release_stream_block(handle): a long
// compute kernel on that stream (nullptr: the legacy default stream of the current device).
// Returns 0 when the stream is not valid.
unsigned long simgpu_block_stream(cudaStream_t stream);
void simgpu_release_stream_block(unsigned long handle);

// Re-reads DDPRUN_SIMGPU_* fault variables (tests set them with setenv before a case).
void simgpu_reload_faults(void);

#ifdef __cplusplus
}
#endif
