// Tensor: dtype, shape, strides and device over a shared buffer. The buffer is either owned
// (aligned host memory, or device memory from an allocator) or a view into an mmapped file,
// so checkpoint weights are used where they lie. Views and slices share the buffer; copies are
// explicit.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ms {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);

// A block of memory. `keep_alive` holds whatever owns the bytes (an mmap, an allocation).
struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  std::shared_ptr<void> keep_alive;
};

class Tensor {
 public:
  Tensor() = default;
  // A new contiguous tensor, zero-filled (device memory through its registered backend).
  static Tensor empty(DType dtype, Shape shape, Device device = Device::CPU);
  static Tensor zeros(DType dtype, Shape shape) { return empty(dtype, std::move(shape)); }
  // As empty(), but a device tensor's contents are left undefined (no fill launched): for
  // outputs that their producer writes whole. Host tensors are zeroed as by empty(), or
  // poisoned under MOESERVE_POISON_UNINIT=1 (tensor.cpp).
  static Tensor uninit(DType dtype, Shape shape, Device device);
  // A tensor over memory someone else owns (mmapped file, pool); `buffer` keeps it alive.
  static Tensor from_buffer(std::shared_ptr<Buffer> buffer, size_t offset, DType dtype, Shape shape);
  static Tensor from_vector(const std::vector<float>& v, Shape shape);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_ ? buffer_->device : Device::CPU; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return int(shape_.size()); }
  int64_t size(int d) const { return shape_.at(d < 0 ? d + dim() : d); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw() const { return static_cast<char*>(buffer_->data) + offset_; }
  template <class T> T* data() const { return static_cast<T*>(raw()); }
  template <class T> std::span<T> span() const { return {data<T>(), size_t(numel())}; }

  // Views (no copy). `view` needs a contiguous tensor; -1 infers one dimension.
  Tensor view(Shape shape) const;
  // Dimension d as `sizes` (their product its size), any strides: a column slice of rows can
  // be viewed as heads, which `view` refuses.
  Tensor unflatten(int d, const Shape& sizes) const;
  Tensor slice(int d, int64_t begin, int64_t end) const;  // [begin, end) along d
  Tensor select(int64_t index) const;                     // drops dimension 0
  Tensor narrow_rows(int64_t begin, int64_t count) const { return slice(0, begin, begin + count); }

  Tensor clone() const;               // contiguous copy on the same device
  Tensor to(Device device) const;     // contiguous copy on `device` (itself if already there and contiguous)
  void copy_from(const Tensor& src);  // same shape and dtype, any devices, both contiguous
  Tensor to_f32() const;              // contiguous F32 host copy (any dtype, any device)
  std::vector<float> to_vector() const { Tensor t = to_f32(); return {t.data<float>(), t.data<float>() + t.numel()}; }
  std::string describe() const;       // "BF16[1024, 128]"

 private:
  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;  // bytes
  DType dtype_ = DType::F32;
  Shape shape_, strides_;  // strides in elements
};

// Checks used at load time: the message names the tensor.
void check_shape(const Tensor& t, const Shape& expected, const std::string& name);
void check_dtype(const Tensor& t, std::initializer_list<DType> allowed, const std::string& name);

}  // namespace ms
