// What the standalone GPU probes (bench/gemm_probe.cu, bench/attention_probe.cu) share: a CUDA
// call checked, and a sequence of kernels timed the way the decoder runs them, as one captured
// graph replayed.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// `body` (which enqueues `calls` kernels on `st` and returns whether it could) captured into one
// graph, replayed once to warm up, then 7 times 5 replays between two events: the median over the
// 7 of the microseconds a call. Negative when `body` could not enqueue its work.
template <class Body>
float graph_us(cudaStream_t st, int calls, Body&& body) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  const bool ok = body();
  CK(cudaStreamEndCapture(st, &g));
  float us = -1.0f;
  if (ok) {
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    std::vector<float> t;
    for (int r = 0; r < 7; ++r) {
      CK(cudaEventRecord(e0, st));
      for (int k = 0; k < 5; ++k) CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1000.0f / (5 * calls));
    }
    std::sort(t.begin(), t.end());
    us = t[t.size() / 2];
    CK(cudaGraphExecDestroy(ge));
  }
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return us;
}
