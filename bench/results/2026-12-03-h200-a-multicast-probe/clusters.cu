// How many clusters of 1, 2, 4, 8 blocks fit on the GPU at once for a block of the GEMM engines' size
// (384 threads, 231680 bytes of dynamic shared memory: one block an SM), from cudaOccupancyMaxActiveClusters.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void probe(int* out) { if (out) out[blockIdx.x] = 1; }
int main() {
  const int smem = 231680;
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int size : {1, 2, 4, 8, 16}) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = size; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(size * 64); cfg.blockDim = dim3(384); cfg.dynamicSmemBytes = smem;
    cfg.attrs = attr; cfg.numAttrs = 1;
    int clusters = 0;
    cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, probe, &cfg);
    std::printf("cluster %2d: %3d clusters = %3d of %d SMs busy (%s)\n", size, clusters, clusters * size, sms,
                cudaGetErrorString(e));
  }
  return 0;
}
