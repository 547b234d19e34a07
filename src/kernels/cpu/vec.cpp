// Vector primitives and weight-row decoding: the inner loops of every CPU kernel.
#include <immintrin.h>

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace ms::cpu {

float dot_f32(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  float s = 0.f;
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 va = _mm512_set1_ps(alpha);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += alpha * x[i];
}

static void decode_bf16(const uint16_t* src, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(w));
  }
#endif
  for (; i < n; ++i) out[i] = bf16_to_f32(src[i]);
}

void decode_weight_row(const Weight& w, int64_t row, float* out) {
  const int64_t k = w.in_features();
  const Tensor& t = w.w;
  const char* base = static_cast<const char*>(t.raw()) + row * t.strides()[0] * int64_t(dtype_size(t.dtype()));
  switch (t.dtype()) {
    case DType::F32: std::memcpy(out, base, k * 4); return;
    case DType::BF16: decode_bf16(reinterpret_cast<const uint16_t*>(base), out, k); return;
    case DType::F16: {
      auto* s = reinterpret_cast<const uint16_t*>(base);
      for (int64_t i = 0; i < k; ++i) out[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F8_E4M3: {
      const float* table = fp8_e4m3_table();
      const auto* s = reinterpret_cast<const uint8_t*>(base);
      const float* scales = w.scale_inv.data<float>() + (row / w.block_n) * w.scale_inv.strides()[0];
      for (int64_t kb = 0; kb * w.block_k < k; ++kb) {
        float sc = scales[kb];
        int64_t end = std::min<int64_t>(k, (kb + 1) * w.block_k);
        for (int64_t i = kb * w.block_k; i < end; ++i) out[i] = table[s[i]] * sc;
      }
      return;
    }
    default: fail("linear: unsupported weight dtype ", dtype_name(t.dtype()));
  }
}

}  // namespace ms::cpu
