// The NCCL backend of DeviceComm on two GPUs (one rank thread each, bound to its GPU, the
// collectives on that GPU's stream), checked like the shared-memory backend: uneven rows, an
// empty rank, every collective, and the collective timing. Skipped with fewer than two GPUs.
// NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "core/device_memory.h"
#include "kernels/ops.h"
#include "parallel/nccl/nccl_comm.h"

namespace ms {
namespace {

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

Tensor on_gpu(std::vector<float> v, Shape s) { return Tensor::from_vector(v, std::move(s)).to(Device::CUDA); }

TEST(NcclComm, CollectivesOnTwoGpus) {
  if (gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  const NcclId id = nccl_unique_id();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        ops::init_backend(Device::CUDA, r);
        NcclComm c(id, 2, r, r, device_memory(Device::CUDA)->stream());
        c.time_collectives(true);
        Tensor x = on_gpu({float(r + 1), 10.f * (r + 1)}, {1, 2});
        c.all_reduce(x);
        EXPECT_EQ(x.to_vector(), (std::vector<float>{3, 30}));
        Tensor rows = on_gpu(std::vector<float>(size_t(2 * r), 7.f), {r, 2});  // rank 0 sends none
        EXPECT_EQ(c.all_gather_v(rows).size(0), 1);
        Tensor part = c.reduce_scatter_v(on_gpu({1, 1, 2, 2, 3, 3}, {3, 2}), {1, 2});
        EXPECT_EQ(part.to_vector(), r == 0 ? (std::vector<float>{2, 2}) : (std::vector<float>{4, 4, 6, 6}));
        std::vector<int64_t> recv;
        Tensor a2a = c.all_to_all_v(on_gpu({float(r), float(r), float(r), float(r)}, {2, 2}), {1, 1}, &recv);
        EXPECT_EQ(recv, (std::vector<int64_t>{1, 1}));
        EXPECT_EQ(a2a.to_vector(), (std::vector<float>{0, 0, 1, 1}));
        EXPECT_EQ(c.all_gather_values(r + 5), (std::vector<int64_t>{5, 6}));
        EXPECT_GT(c.collective_seconds(), 0.0);
        EXPECT_EQ(c.collective_seconds(), 0.0) << "reading restarts the count";
        c.time_collectives(false);
        c.barrier();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& e : errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace ms
