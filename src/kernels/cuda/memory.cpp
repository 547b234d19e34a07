// The CUDA backend's runtime, one per GPU: a caching allocator over cudaMalloc, the one stream
// every op on that GPU runs on, the cuBLASLt handle and its workspace, and pinned staging for host
// metadata. A thread works on its CUDA current device (rank threads bind theirs with init(gpu));
// core's Device::CUDA memory forwards to that device's runtime. Every op is stream-ordered on
// its device's stream, so a freed block can be handed to the next allocation at once: any later
// use is queued after the earlier ones.
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/device_memory.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/step_graph_cuda.h"

namespace ms::cuda {

void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) [[likely]] return;
  fail("CUDA error in ", call, " (", file, ":", line, "): ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]] return;
  fail("cuBLAS error in ", call, " (", file, ":", line, "): status ", int(status));
}

void check_device_tensor(const Tensor& t, std::initializer_list<DType> allowed, const char* op, const char* what) {
  MS_CHECK(t.defined() && t.device() == Device::CUDA, op, ": ", what, " must be a CUDA tensor");
  check_dtype(t, allowed, std::string(op) + " " + what);
}

namespace {

class CachingAllocator;

struct PoolBlocks {
  std::multimap<size_t, void*> free;
  bool retired = false;  // its graphs are gone: blocks given back go to the shared cache
};

// A graph pool on one GPU (kernels/step_graph.h); its cached blocks are guarded by the owner's lock.
struct DeviceGraphPool final : ops::GraphPool {
  explicit DeviceGraphPool(CachingAllocator* a) : owner(a), blocks(std::make_shared<PoolBlocks>()) {}
  ~DeviceGraphPool() override;
  CachingAllocator* owner;
  std::shared_ptr<PoolBlocks> blocks;  // shared with the deleters of the blocks it handed out
};

// The pool this thread's capture allocates from, or null.
thread_local DeviceGraphPool* t_capture_pool = nullptr;

// Blocks are kept by size; a request takes the smallest cached block that is at most twice
// its size, else a new cudaMalloc. When cudaMalloc fails, the cache is returned to the driver
// and the allocation retried once.
class CachingAllocator final : public DeviceMemory {
 public:
  explicit CachingAllocator(cudaStream_t stream) : stream_(stream) {}

  std::shared_ptr<Buffer> allocate(size_t bytes) override {
    auto buf = allocate_uninit(bytes);
    if (bytes) MS_CUDA(cudaMemsetAsync(buf->data, 0, bytes, stream_));
    return buf;
  }

  // While this thread captures into a graph pool, blocks come from and go back to that pool.
  std::shared_ptr<Buffer> allocate_uninit(size_t bytes) {
    const size_t rounded = round_up(bytes);
    std::shared_ptr<PoolBlocks> pool = t_capture_pool ? t_capture_pool->blocks : nullptr;
    MS_CHECK(!pool || t_capture_pool->owner == this, "a graph pool is used on another GPU than its own");
    auto [ptr, size] = take_cached(pool ? pool->free : free_, rounded);
    if (!ptr) ptr = malloc_or_flush(size = rounded);
    auto buf = std::make_shared<Buffer>();
    buf->data = ptr;
    buf->bytes = bytes;
    buf->device = Device::CUDA;
    buf->keep_alive = std::shared_ptr<void>(ptr, [this, size, pool](void* p) { give_back(p, size, pool.get()); });
    return buf;
  }

  // The pool's blocks join the shared cache: its graphs are gone, and stream order keeps any
  // replay still queued ahead of the blocks' next users. Blocks still held return there later.
  void retire(PoolBlocks& pool) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.merge(pool.free);
    pool.retired = true;
  }

  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    cudaMemcpyKind kind = dst_device == Device::CUDA
                              ? (src_device == Device::CUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                              : cudaMemcpyDeviceToHost;
    // Host-to-device from pageable memory returns once the source is staged; device-to-host
    // must be complete before the caller reads the host copy.
    MS_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
    if (kind == cudaMemcpyDeviceToHost) MS_CUDA(cudaStreamSynchronize(stream_));
  }

  bool memory_info(size_t* free_bytes, size_t* total_bytes) override {
    MS_CUDA(cudaMemGetInfo(free_bytes, total_bytes));
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& block : free_) *free_bytes += block.first;  // cached blocks are ours to reuse
    return true;
  }

 private:
  static size_t round_up(size_t bytes) {
    const size_t unit = bytes < (size_t(1) << 20) ? 512 : (size_t(1) << 17);
    return std::max<size_t>(unit, (bytes + unit - 1) / unit * unit);
  }

  std::pair<void*, size_t> take_cached(std::multimap<size_t, void*>& free, size_t rounded) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free.lower_bound(rounded);
    if (it == free.end() || it->first > 2 * rounded) return {nullptr, 0};
    std::pair<void*, size_t> block{it->second, it->first};
    free.erase(it);
    return block;
  }

  // cudaMalloc counts as unsafe during a thread-local stream capture and would invalidate it;
  // a capture's new blocks are ordinary device memory, so relax the mode around the call.
  static cudaError_t malloc_relaxed(void** p, size_t bytes) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    MS_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t err = cudaMalloc(p, bytes);
    MS_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    return err;
  }

  void* malloc_or_flush(size_t rounded) {
    void* p = nullptr;
    cudaError_t err = malloc_relaxed(&p, rounded);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error state before retrying
      release_cache();
      err = malloc_relaxed(&p, rounded);
    }
    if (err != cudaSuccess) {
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      fail("cudaMalloc of ", rounded, " bytes failed: ", cudaGetErrorString(err), " (", free_b >> 20, " MiB free of ",
           total_b >> 20, ")");
    }
    return p;
  }

  void give_back(void* p, size_t size, PoolBlocks* pool) {
    std::lock_guard<std::mutex> lock(mu_);
    (pool && !pool->retired ? pool->free : free_).emplace(size, p);
  }

  void release_cache() {
    MS_CUDA(cudaStreamSynchronize(stream_));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, p] : free_) MS_CUDA(cudaFree(p));
    free_.clear();
  }

  cudaStream_t stream_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // cached blocks by their real size, for everyone
};

DeviceGraphPool::~DeviceGraphPool() { owner->retire(*blocks); }

// Pinned staging slots used round-robin; a slot is rewritten only after the copy that last
// read it has finished (its event), so uploads never wait on the whole stream.
class Staging {
 public:
  explicit Staging(cudaStream_t stream) : stream_(stream) {}

  void upload(void* dst, const void* src, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[next_++ % kSlots];
    if (s.event) MS_CUDA(cudaEventSynchronize(s.event));
    else MS_CUDA(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming));
    if (s.capacity < bytes) {
      if (s.host) MS_CUDA(cudaFreeHost(s.host));
      s.capacity = std::max<size_t>(bytes, size_t(1) << 20);
      MS_CUDA(cudaMallocHost(&s.host, s.capacity));
    }
    std::memcpy(s.host, src, bytes);
    MS_CUDA(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream_));
    MS_CUDA(cudaEventRecord(s.event, stream_));
  }

 private:
  struct Slot {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t event = nullptr;
  };
  static constexpr int kSlots = 32;
  cudaStream_t stream_;
  std::mutex mu_;
  Slot slots_[kSlots];
  uint64_t next_ = 0;
};

struct Runtime {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  int sms = 0;
  bool hopper = false;  // compute capability 9.0: the sm_90a kernels (wgmma) run
  CachingAllocator* allocator = nullptr;  // never freed: buffers may outlive static destruction
  Staging* staging = nullptr;
  // cuBLASLt's, made on first use with a cudaMalloc of its own: captured GEMMs keep its address,
  // so a larger request leaves the old one allocated for the graphs that use it.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

constexpr int kMaxDevices = 64;

int device_count() {
  static const int count = [] {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    MS_CHECK(err == cudaSuccess && n > 0, "no usable CUDA device (cudaGetDeviceCount: ",
             err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), ")");
    return std::min(n, kMaxDevices);
  }();
  return count;
}

Runtime& runtime();

// What core sees as Device::CUDA: the memory of the calling thread's GPU.
class CurrentDeviceMemory final : public DeviceMemory {
 public:
  std::shared_ptr<Buffer> allocate(size_t bytes) override { return runtime().allocator->allocate(bytes); }
  std::shared_ptr<Buffer> allocate_uninit(size_t bytes) override { return runtime().allocator->allocate_uninit(bytes); }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    runtime().allocator->copy(dst, dst_device, src, src_device, bytes);
  }
  bool memory_info(size_t* free_bytes, size_t* total_bytes) override {
    return runtime().allocator->memory_info(free_bytes, total_bytes);
  }
  void* stream() override { return runtime().stream; }
};

// Runtimes are made under the lock and never destroyed, so a reader needs the lock only while
// its device's slot is still empty.
std::mutex g_runtimes_mu;
std::array<std::atomic<Runtime*>, kMaxDevices> g_runtimes{};

Runtime* make_runtime(int device) {
  auto* r = new Runtime();
  MS_CUDA(cudaStreamCreate(&r->stream));
  MS_CUBLAS(cublasLtCreate(&r->lt));
  MS_CUDA(cudaDeviceGetAttribute(&r->sms, cudaDevAttrMultiProcessorCount, device));
  int major = 0, minor = 0;
  MS_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MS_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  r->hopper = major == 9 && minor == 0;
  r->allocator = new CachingAllocator(r->stream);
  r->staging = new Staging(r->stream);
  static std::once_flag registered;
  std::call_once(registered, [] { register_device_memory(Device::CUDA, new CurrentDeviceMemory()); });
  return r;
}

// The calling thread's current device's runtime (made on first use, on that device).
Runtime& runtime() {
  const int count = device_count();
  int device = 0;
  MS_CUDA(cudaGetDevice(&device));
  MS_CHECK(device < count, "CUDA device ", device, " is beyond the ", count, " this backend serves");
  if (Runtime* r = g_runtimes[size_t(device)].load(std::memory_order_acquire)) return *r;
  std::lock_guard<std::mutex> lock(g_runtimes_mu);
  if (!g_runtimes[size_t(device)].load()) g_runtimes[size_t(device)].store(make_runtime(device), std::memory_order_release);
  return *g_runtimes[size_t(device)].load();
}

}  // namespace

void init(int gpu) {
  const int count = device_count();
  if (gpu >= 0) {
    MS_CHECK(gpu < count, "GPU ", gpu, " requested but ", count, " CUDA device", count == 1 ? " is" : "s are", " visible");
    MS_CUDA(cudaSetDevice(gpu));
  }
  (void)runtime();
}

int current_device() {
  int device = 0;
  MS_CUDA(cudaGetDevice(&device));
  return device;
}

cudaStream_t stream() { return runtime().stream; }
cublasLtHandle_t lt_handle() { return runtime().lt; }
int sm_count() { return runtime().sms; }
bool hopper() { return runtime().hopper; }

// A switch that is on unless the variable is "0".
static bool unless_zero(const char* variable) {
  const char* env = std::getenv(variable);
  return !env || std::string(env) != "0";
}

bool pdl_enabled() {
  static const bool on = unless_zero("MOESERVE_PDL");
  return on;
}

bool weights_evict_first() {
  static const bool on = unless_zero("MOESERVE_L2_STREAM");
  return on;
}

bool beside_allowed() {
  static const bool on = unless_zero("MOESERVE_BESIDE");
  return on;
}

void* lt_workspace(size_t bytes) {
  Runtime& r = runtime();
  if (r.workspace_bytes < bytes) {
    MS_CHECK(!capturing(), "cuBLASLt workspace: first use inside a graph capture");
    MS_CUDA(cudaMalloc(&r.workspace, bytes));
    r.workspace_bytes = bytes;
  }
  return r.workspace;
}

std::shared_ptr<ops::GraphPool> make_graph_pool() { return std::make_shared<DeviceGraphPool>(runtime().allocator); }

void set_capture_pool(ops::GraphPool* pool) {
  t_capture_pool = pool ? &dynamic_cast<DeviceGraphPool&>(*pool) : nullptr;
}

Tensor scratch(DType dtype, Shape shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  auto buf = runtime().allocator->allocate_uninit(size_t(n) * dtype_size(dtype));
  return Tensor::from_buffer(std::move(buf), 0, dtype, std::move(shape));
}

namespace {

// Under capture: the step's own arrays are already on the device (the staged arena); anything
// else is a constant of this step shape (e.g. last-token rows), copied at every replay from
// pinned memory the captured step keeps.
Tensor staged_upload(StagedStep& s, std::span<const int32_t> host) {
  for (const auto& a : s.arrays)
    if (a.host == host.data() && int64_t(host.size()) <= a.device.numel()) return a.device.slice(0, 0, int64_t(host.size()));
  const size_t bytes = host.size_bytes();
  MS_CHECK(s.pinned_used + bytes <= s.pinned_capacity, "captured step: ", s.pinned_used + bytes,
           " bytes of constant metadata exceed the step's pinned buffer");
  char* src = s.pinned + s.pinned_used;
  s.pinned_used += (bytes + 15) / 16 * 16;
  std::memcpy(src, host.data(), bytes);
  Tensor t = scratch(DType::I32, {int64_t(host.size())});
  MS_CUDA(cudaMemcpyAsync(t.raw(), src, bytes, cudaMemcpyHostToDevice, stream()));
  return t;
}

}  // namespace

Tensor upload_i32(std::span<const int32_t> host) {
  if (StagedStep* s = staged_step(); s && !host.empty()) return staged_upload(*s, host);
  Tensor t = scratch(DType::I32, {int64_t(host.size())});
  if (!host.empty()) runtime().staging->upload(t.raw(), host.data(), host.size_bytes());
  return t;
}

bool capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MS_CUDA(cudaStreamIsCapturing(stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

bool copy_kernels() {
  static const bool on = unless_zero("MOESERVE_COPY_KERNELS");
  return on;
}

void* alloc_mapped(size_t bytes) {
  void* p = nullptr;
  MS_CUDA(cudaHostAlloc(&p, std::max<size_t>(bytes, 16), cudaHostAllocMapped));
  return p;
}

void* mapped_device_ptr(void* host) {
  void* d = nullptr;
  MS_CUDA(cudaHostGetDevicePointer(&d, host, 0));
  return d;
}

void download(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
  MS_CUDA(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream()));
  MS_CUDA(cudaStreamSynchronize(stream()));
}

}  // namespace ms::cuda
