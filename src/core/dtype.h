// Element types as safetensors names them, with bf16/fp8 conversions used by every backend.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ms {

enum class DType : uint8_t { F32, BF16, F16, F8_E4M3, I64, I32, U8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);           // "F32", "BF16", ... (safetensors spelling)
DType dtype_from_name(std::string_view name);   // throws on an unknown name

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities, 0x7f/0xff are NaN.
float fp8_e4m3_to_f32(uint8_t v);
const float* fp8_e4m3_table();  // 256 entries, the decoded value of each byte
uint8_t f32_to_fp8_e4m3(float f);  // round to nearest even, saturating at +-448

}  // namespace ms
