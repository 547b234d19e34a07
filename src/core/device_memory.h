// The seam between core and a device backend: a backend (kernels/cuda) registers how it
// allocates and copies memory of its device, so Tensor can make and move device tensors
// without core depending on the backend.
#pragma once
#include <memory>

#include "core/tensor.h"

namespace ms {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `bytes` of zero-filled device memory; the Buffer frees it when the last tensor goes.
  virtual std::shared_ptr<Buffer> allocate(size_t bytes) = 0;
  // The same without the fill, for memory its first user writes whole: in a captured step a
  // fill is a graph node of its own, which idles the GPU and breaks early launches around it.
  virtual std::shared_ptr<Buffer> allocate_uninit(size_t bytes) { return allocate(bytes); }
  // Copies between host and this device (either direction) or within the device.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  // Free and total bytes of the device (free counts memory the backend caches for reuse);
  // false when the backend cannot tell. Sizes the KV pool from --mem-fraction-static.
  virtual bool memory_info(size_t* free_bytes, size_t* total_bytes) { return false; }
  // The queue the calling thread's work on this device is ordered on (a cudaStream_t; nullptr
  // where there is none): collectives that must follow and precede its ops are enqueued there.
  virtual void* stream() { return nullptr; }
};

void register_device_memory(Device device, DeviceMemory* memory);
DeviceMemory* device_memory(Device device);  // throws when the device has no backend

}  // namespace ms
