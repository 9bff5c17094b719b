// The decode attention alone (policy/cuda_kernels.cu's decode_attention, compiled into this file),
// timed as the decoder runs it: one captured graph of one call per layer over the layers' own
// caches (so nothing comes from L2), at the 1.5B shape's heads by default (12 query heads over 2
// kv heads of 128). Prints, per split count, microseconds a call and the bandwidth of the keys and
// values it reads, beside the split count the decoder picks. With group G > 1 and shared S, the
// rows come in groups of G whose first S keys are read from the group's first row (decode_attention's
// share: a GRPO group's common prompt), as the decoder runs groups of samples of one prompt.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 -I. bench/attention_probe.cu -o attention_probe
//   ./attention_probe [rows=64] [keys=384] [nh=12] [nkv=2] [D=128] [group=1] [shared=256]
//   KERNELRL_ATTN_MMA=0 ./attention_probe ...   (the scalar kernel)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "graph_timer.cuh"
#include "policy/cuda_kernels.cu"

__global__ void fill_bf16(uint16_t* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float f = float(h & 0xffff) / 32768.0f - 1.0f;
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}

int main(int argc, char** argv) {
  const int R = argc > 1 ? std::atoi(argv[1]) : 64, keys = argc > 2 ? std::atoi(argv[2]) : 384;
  const int nh = argc > 3 ? std::atoi(argv[3]) : 12, nkv = argc > 4 ? std::atoi(argv[4]) : 2;
  const int D = argc > 5 ? std::atoi(argv[5]) : 128, layers = 28;
  const int group = argc > 6 ? std::atoi(argv[6]) : 1, shared = argc > 7 ? std::atoi(argv[7]) : 256;
  const int64_t cap = (keys + 255) / 256 * 256;
  const int klen = int(cap);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t cn = size_t(R) * nkv * cap * D;
  std::vector<uint16_t*> kc(layers), vc(layers);
  for (int l = 0; l < layers; ++l) {
    CK(cudaMalloc(&kc[l], cn * 2));
    CK(cudaMalloc(&vc[l], cn * 2));
    fill_bf16<<<1024, 256, 0, st>>>(kc[l], cn, 1 + 2 * l);
    fill_bf16<<<1024, 256, 0, st>>>(vc[l], cn, 2 + 2 * l);
  }
  uint16_t *q, *out;
  CK(cudaMalloc(&q, size_t(R) * nh * D * 2));
  CK(cudaMalloc(&out, size_t(R) * nh * D * 2));
  fill_bf16<<<64, 256, 0, st>>>(q, size_t(R) * nh * D, 99);
  std::vector<int64_t> hpos(R, keys - 1);
  int64_t* pos;
  CK(cudaMalloc(&pos, R * sizeof(int64_t)));
  CK(cudaMemcpy(pos, hpos.data(), R * sizeof(int64_t), cudaMemcpyHostToDevice));
  int32_t* share = nullptr;
  if (group > 1) {
    std::vector<int32_t> hs(2 * R);
    for (int r = 0; r < R; ++r) {
      hs[2 * r] = r / group * group;
      hs[2 * r + 1] = r % group ? std::min(shared, keys) : 0;
    }
    CK(cudaMalloc(&share, hs.size() * sizeof(int32_t)));
    CK(cudaMemcpy(share, hs.data(), hs.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  float* work;
  int* counters;
  CK(cudaMalloc(&work, size_t(R) * nh * 64 * (D + 2) * 4));
  CK(cudaMalloc(&counters, size_t(R) * nkv * 4));
  CK(cudaMemset(counters, 0, size_t(R) * nkv * 4));
  const double mb = double(R) * nkv * keys * D * 2 * 2 / 1e6;  // (read; from HBM once a group where shared)
  const int picked = kernelrl::cuda::decode_attention_splits(R, nkv, D, klen, prop.multiProcessorCount);
  std::printf(
      "%s, %d SMs; rows %d, keys %d, heads %d/%d of %d: %.1f MB of keys and values a call; decoder's split %d; "
      "groups of %d sharing %d keys\n",
      prop.name, prop.multiProcessorCount, R, keys, nh, nkv, D, mb, picked, group, group > 1 ? shared : 0);
  const float scale = 1.0f / std::sqrt(float(D));
  for (int splits : {1, 2, 3, 4, 6, 8, 12, 16}) {
    auto body = [&] {
      for (int l = 0; l < layers; ++l)
        kernelrl::cuda::decode_attention(q, kc[l], vc[l], pos, share, R, nh, nkv, D, cap, klen, scale, splits, work,
                                         counters, out, nullptr, st);
    };
    body();
    CK(cudaStreamSynchronize(st));
    const float us = graph_us(st, layers, [&] {
      body();
      return true;
    });
    std::printf("splits %2d: %6.2f us a call, %.2f TB/s%s\n", splits, us, mb / us,
                splits == picked ? "  (the decoder's)" : "");
  }
  return 0;
}
