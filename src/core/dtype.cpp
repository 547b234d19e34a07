#include "core/dtype.h"

#include <array>
#include <cmath>

#include "core/check.h"

namespace ms {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::F8_E4M3: return 1;
    case DType::I64: return 8;
    case DType::I32: return 4;
    case DType::U8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"F32", DType::F32},   {"BF16", DType::BF16},         {"F16", DType::F16},
      {"I64", DType::I64},   {"I32", DType::I32},           {"U8", DType::U8},
      {"F8_E4M3", DType::F8_E4M3}};
  for (auto& [n, t] : kNames)
    if (n == name) return t;
  fail("unsupported dtype '", name, "'");
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);
    return sign ? -f : f;
  }
  if (exp == 31) {
    uint32_t bits = sign | 0x7f800000u | (man << 13);
    std::memcpy(&f, &bits, 4);
    return f;
  }
  uint32_t bits = sign | ((exp + 112) << 23) | (man << 13);
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  // Through the compiler's _Float16 conversion (round to nearest even).
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

float fp8_e4m3_to_f32(uint8_t v) {
  int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 15 && man == 7) return NAN;
  float mag = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + man / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

const float* fp8_e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table.data();
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  // Pick the nearest of the 127 non-negative finite codes (ties to the even code).
  const float* t = fp8_e4m3_table();
  int lo = 0, hi = 0x7e;
  while (lo < hi) {  // first code with value >= a
    int mid = (lo + hi) / 2;
    if (t[mid] < a) lo = mid + 1; else hi = mid;
  }
  if (lo == 0) return sign;
  float up = t[lo], down = t[lo - 1];
  int code = (up - a < a - down) ? lo : (up - a > a - down) ? lo - 1 : ((lo & 1) ? lo - 1 : lo);
  return sign | uint8_t(code);
}

}  // namespace ms
