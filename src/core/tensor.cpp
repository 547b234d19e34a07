#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include <sys/mman.h>

#include "core/check.h"
#include "core/device_memory.h"

namespace ms {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

namespace {
DeviceMemory* g_device_memory[2] = {nullptr, nullptr};
}  // namespace

void register_device_memory(Device device, DeviceMemory* memory) { g_device_memory[int(device)] = memory; }

DeviceMemory* device_memory(Device device) {
  DeviceMemory* m = g_device_memory[int(device)];
  MS_CHECK(m, "no backend for device ", device == Device::CUDA ? "cuda" : "cpu",
           " (this build has no CUDA backend, or it was not initialised)");
  return m;
}

// Host allocations from this size on are mapped pages rather than heap blocks.
static constexpr size_t kLazyZeroBytes = size_t(1) << 20;

// Bytes of a contiguous tensor of `shape`, whose dimensions must not be negative.
static size_t checked_bytes(DType dtype, const Shape& shape) {
  int64_t n = 1;
  for (auto d : shape) {
    MS_CHECK(d >= 0, "negative dimension in ", shape_str(shape));
    n *= d;
  }
  return size_t(n) * dtype_size(dtype);
}

Tensor Tensor::empty(DType dtype, Shape shape, Device device) {
  const size_t bytes = checked_bytes(dtype, shape);
  if (device != Device::CPU) return from_buffer(device_memory(device)->allocate(bytes), 0, dtype, std::move(shape));
  auto buf = std::make_shared<Buffer>();
  buf->bytes = bytes;
  if (bytes >= kLazyZeroBytes) {
    // Anonymous pages are zero and only materialise when touched: a KV pool sized from host
    // memory costs nothing until tokens use it (memset would fault in gigabytes at start-up).
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    MS_CHECK(p != MAP_FAILED, "out of host memory allocating ", bytes, " bytes");
    buf->data = p;
    buf->keep_alive = std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
  } else {
    size_t alloc = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, alloc ? alloc : 64);
    MS_CHECK(p, "out of host memory allocating ", bytes, " bytes");
    std::memset(p, 0, alloc ? alloc : 64);
    buf->data = p;
    buf->keep_alive = std::shared_ptr<void>(p, std::free);
  }
  return from_buffer(std::move(buf), 0, dtype, std::move(shape));
}

// MOESERVE_POISON_UNINIT=1 (read once): host tensors from uninit() are filled with 0xff bytes
// (NaN in floating point, -1 in integers) rather than zeros, so that a reader of an element its
// producer left unwritten shows up on the CPU as it could on a GPU. The CPU test suite runs so.
static bool poison_uninit() {
  static const bool on = [] {
    const char* e = std::getenv("MOESERVE_POISON_UNINIT");
    return e && std::string(e) == "1";
  }();
  return on;
}

Tensor Tensor::uninit(DType dtype, Shape shape, Device device) {
  if (device == Device::CPU) {
    Tensor t = empty(dtype, std::move(shape), device);
    if (poison_uninit() && t.nbytes() > 0) std::memset(t.raw(), 0xff, t.nbytes());
    return t;
  }
  const size_t bytes = checked_bytes(dtype, shape);
  return from_buffer(device_memory(device)->allocate_uninit(bytes), 0, dtype, std::move(shape));
}

Tensor Tensor::from_buffer(std::shared_ptr<Buffer> buffer, size_t offset, DType dtype, Shape shape) {
  Tensor t;
  t.buffer_ = std::move(buffer);
  t.offset_ = offset;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  MS_ASSERT(offset + t.nbytes() <= t.buffer_->bytes);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, Shape shape) {
  Tensor t = empty(DType::F32, std::move(shape));
  MS_CHECK(size_t(t.numel()) == v.size(), "from_vector: ", v.size(), " values for shape ", shape_str(t.shape()));
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::view(Shape shape) const {
  MS_CHECK(is_contiguous(), "view of a non-contiguous tensor ", describe());
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) infer = int64_t(i); else known *= shape[i];
  }
  if (infer >= 0) shape[infer] = known ? numel() / known : 0;
  Tensor t = *this;
  t.shape_ = std::move(shape);
  MS_CHECK(t.numel() == numel(), "cannot view ", describe(), " as ", shape_str(t.shape_));
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

Tensor Tensor::unflatten(int d, const Shape& sizes) const {
  if (d < 0) d += dim();
  int64_t n = 1;
  for (int64_t v : sizes) n *= v;
  MS_CHECK(d >= 0 && d < dim() && !sizes.empty() && n == shape_[d], "cannot unflatten dim ", d, " of ", describe(),
           " into ", shape_str(sizes));
  Tensor t = *this;
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  int64_t stride = strides_[d];
  for (size_t i = sizes.size(); i-- > 0;) {
    t.shape_.insert(t.shape_.begin() + d, sizes[i]);
    t.strides_.insert(t.strides_.begin() + d, stride);
    stride *= sizes[i];
  }
  return t;
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  if (d < 0) d += dim();
  MS_CHECK(d >= 0 && d < dim() && 0 <= begin && begin <= end && end <= shape_[d],
           "slice [", begin, ", ", end, ") out of range for dim ", d, " of ", describe());
  Tensor t = *this;
  t.offset_ += size_t(begin * strides_[d]) * dtype_size(dtype_);
  t.shape_[d] = end - begin;
  return t;
}

Tensor Tensor::select(int64_t index) const {
  Tensor t = slice(0, index, index + 1);
  t.shape_.erase(t.shape_.begin());
  t.strides_.erase(t.strides_.begin());
  return t;
}

Tensor Tensor::to(Device target) const {
  if (device() == target && is_contiguous()) return *this;
  Tensor src = is_contiguous() ? *this : clone();
  Tensor out = uninit(dtype_, shape_, target);
  out.copy_from(src);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  MS_CHECK(src.dtype_ == dtype_ && src.shape_ == shape_ && is_contiguous() && src.is_contiguous(), "copy_from: ",
           src.describe(), " into ", describe());
  if (nbytes() == 0) return;
  if (device() == Device::CPU && src.device() == Device::CPU) {
    std::memcpy(raw(), src.raw(), nbytes());
    return;
  }
  Device backend = device() != Device::CPU ? device() : src.device();
  device_memory(backend)->copy(raw(), device(), src.raw(), src.device(), nbytes());
}

Tensor Tensor::clone() const {
  if (device() != Device::CPU) {
    MS_CHECK(is_contiguous(), "clone of a strided device tensor");
    Tensor out = uninit(dtype_, shape_, device());
    out.copy_from(*this);
    return out;
  }
  Tensor out = empty(dtype_, shape_);
  if (is_contiguous()) {
    std::memcpy(out.raw(), raw(), nbytes());
    return out;
  }
  // Generic strided copy, one element at a time (used rarely: loading and tests).
  size_t es = dtype_size(dtype_);
  std::vector<int64_t> idx(shape_.size(), 0);
  char* dst = static_cast<char*>(out.raw());
  for (int64_t n = 0; n < numel(); ++n) {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides_[i];
    std::memcpy(dst + n * es, static_cast<const char*>(raw()) + off * es, es);
    for (int i = int(idx.size()) - 1; i >= 0; --i) {
      if (++idx[i] < shape_[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

Tensor Tensor::to_f32() const {
  if (device() != Device::CPU) return to(Device::CPU).to_f32();
  Tensor src = is_contiguous() ? *this : clone();
  Tensor out = empty(DType::F32, shape_);
  float* o = out.data<float>();
  int64_t n = numel();
  switch (dtype_) {
    case DType::F32: std::memcpy(o, src.raw(), n * 4); break;
    case DType::BF16: for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(src.data<uint16_t>()[i]); break;
    case DType::F16: for (int64_t i = 0; i < n; ++i) o[i] = f16_to_f32(src.data<uint16_t>()[i]); break;
    case DType::F8_E4M3: {
      const float* table = fp8_e4m3_table();
      for (int64_t i = 0; i < n; ++i) o[i] = table[src.data<uint8_t>()[i]];
      break;
    }
    case DType::I64: for (int64_t i = 0; i < n; ++i) o[i] = float(src.data<int64_t>()[i]); break;
    case DType::I32: for (int64_t i = 0; i < n; ++i) o[i] = float(src.data<int32_t>()[i]); break;
    case DType::U8: for (int64_t i = 0; i < n; ++i) o[i] = float(src.data<uint8_t>()[i]); break;
  }
  return out;
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

void check_shape(const Tensor& t, const Shape& expected, const std::string& name) {
  MS_CHECK(t.shape() == expected, "tensor ", name, " has shape ", shape_str(t.shape()), ", expected ",
           shape_str(expected));
}

void check_dtype(const Tensor& t, std::initializer_list<DType> allowed, const std::string& name) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string list;
  for (DType d : allowed) list += (list.empty() ? "" : " or ") + std::string(dtype_name(d));
  fail("tensor ", name, " has dtype ", dtype_name(t.dtype()), ", expected ", list);
}

}  // namespace ms
