// The numerics helpers: the header-only numerics (include/sfmoe/numerics/) over NumPy arrays, for
// tests and inspection.
#include "binding.h"

namespace sfmoe_binding {
namespace {

// ---- numerics over NumPy arrays -----------------------------------------------------------------

template <class T>
using HostIn = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;
template <class T>
using HostOut = nb::ndarray<T, nb::c_contig, nb::device::cpu>;

template <class A, class B>
void require_same_size(const char* function, const A& a, const B& b) {
  if (a.size() != b.size()) {
    throw nb::value_error((std::string(function) + ": the input has " + std::to_string(a.size()) +
                           " elements but out has " + std::to_string(b.size()))
                              .c_str());
  }
}

// out[i] = f(in[i]) with the GIL released.
template <class In, class Out, class F>
void map_elements(const char* function, HostIn<In> in, HostOut<Out> out, F f) {
  require_same_size(function, in, out);
  const In* src = in.data();
  Out* dst = out.data();
  const size_t n = in.size();
  nb::gil_scoped_release release;
  for (size_t i = 0; i < n; ++i) dst[i] = f(src[i]);
}

// Registers `name`: out[i] = f(input[i], parameters...). The input array's keyword is `input`; the
// scalar parameters (of types Params, named by `keywords`) follow `out`.
template <class In, class Out, class... Params, class F, class... Keywords>
void def_map(nb::module_& m, const char* name, F f, const char* doc, nb::arg input = "x"_a,
             Keywords... keywords) {
  static_assert(sizeof...(Params) == sizeof...(Keywords), "one keyword per parameter");
  m.def(
      name,
      [name, f](HostIn<In> in, HostOut<Out> out, Params... parameters) {
        map_elements<In, Out>(name, in, out, [&](In x) { return f(x, parameters...); });
      },
      input.noconvert(), "out"_a.noconvert(), keywords..., doc);
}

}  // namespace

void register_numerics(nb::module_& m) {
  namespace num = sfmoe::numerics;
  def_map<float, uint8_t>(
      m, "f32_to_e4m3", [](float x) { return num::f32_to_e4m3(x); },
      "out[i] = E4M3 code of x[i] (RN, saturating, NaN -> 0x7F).");
  def_map<float, uint8_t>(
      m, "f32_to_e5m2", [](float x) { return num::f32_to_e5m2(x); },
      "out[i] = E5M2 code of x[i] (RN, saturating, NaN -> 0x7F).");
  def_map<float, uint8_t>(
      m, "f32_to_e2m1", [](float x) { return num::f32_to_e2m1(x); },
      "out[i] = E2M1 code of x[i], one per byte (RN, saturating, NaN -> 0x7).");
  def_map<float, uint16_t>(
      m, "f32_to_bf16", [](float x) { return num::f32_to_bf16(x); },
      "out[i] = BF16 bits of x[i] (RN, IEEE overflow, NaN -> 0x7FFF).");
  def_map<float, uint16_t>(
      m, "f32_to_fp16", [](float x) { return num::f32_to_fp16(x); },
      "out[i] = FP16 bits of x[i] (RN, IEEE overflow, NaN -> 0x7FFF).");
  def_map<float, uint8_t>(
      m, "f32_to_e8m0", [](float x) { return num::f32_to_e8m0(x); },
      "out[i] = E8M0 code of |x[i]| rounded up to a power of two.");
  def_map<uint8_t, float>(
      m, "e4m3_to_f32", [](uint8_t c) { return num::e4m3_to_f32(c); },
      "out[i] = value of E4M3 code c[i].");
  def_map<uint8_t, float>(
      m, "e5m2_to_f32", [](uint8_t c) { return num::e5m2_to_f32(c); },
      "out[i] = value of E5M2 code c[i].");
  def_map<uint8_t, float>(
      m, "e2m1_to_f32", [](uint8_t c) { return num::e2m1_to_f32(c); },
      "out[i] = value of the E2M1 code in the low nibble of c[i].");
  def_map<uint16_t, float>(
      m, "bf16_to_f32", [](uint16_t c) { return num::bf16_to_f32(c); },
      "out[i] = value of BF16 bits c[i].");
  def_map<uint16_t, float>(
      m, "fp16_to_f32", [](uint16_t c) { return num::fp16_to_f32(c); },
      "out[i] = value of FP16 bits c[i].");
  def_map<uint8_t, float>(
      m, "e8m0_to_f32", [](uint8_t e) { return num::e8m0_to_f32(e); },
      "out[i] = 2^(e[i] - 127) (code 255: NaN).");
  def_map<uint8_t, float>(
      m, "mx_multiplier", [](uint8_t e) { return num::mx_multiplier(e); },
      "out[i] = the MXFP8 element multiplier 2^(127 - e[i]).");
  def_map<float, float>(
      m, "scale_inverse", [](float s) { return num::scale_inverse(s); },
      "out[i] = 1 / scale[i] (FP32, RN).");
  def_map<float, float>(
      m, "nvfp4_global_encode_scale",
      [](float amax) { return num::nvfp4_global_encode_scale(amax); },
      "out[i] = the NVFP4 global encode scale S_enc for global amax[i].");

  def_map<float, float, float, bool>(
      m, "fp8_scale_from_amax",
      [](float amax, float fp8_max, bool power_of_two) {
        return num::fp8_scale_from_amax(amax, fp8_max, power_of_two);
      },
      "out[i] = the FP8 per-tensor / blockwise scale for amax[i].", "amax"_a, "fp8_max"_a,
      "power_of_two"_a);
  def_map<float, uint8_t, float>(
      m, "mx_scale_from_amax",
      [](float amax, float fp8_max) { return num::mx_scale_from_amax(amax, fp8_max); },
      "out[i] = the MXFP8 E8M0 block scale for block amax[i].", "amax"_a, "fp8_max"_a);
  def_map<float, uint8_t, float>(
      m, "nvfp4_block_scale",
      [](float amax, float s_enc) { return num::nvfp4_block_scale(amax, s_enc); },
      "out[i] = the E4M3 NVFP4 block scale code for block amax[i].", "amax"_a,
      "global_encode_scale"_a);
  def_map<uint8_t, float, float>(
      m, "nvfp4_block_multiplier",
      [](uint8_t code, float s_enc) { return num::nvfp4_block_multiplier(code, s_enc); },
      "out[i] = the NVFP4 element multiplier for block scale code[i].", "code"_a,
      "global_encode_scale"_a);
  m.def(
      "philox_random_bits",
      [](uint64_t seed, uint64_t offset, HostIn<uint64_t> index, HostOut<uint32_t> out) {
        map_elements<uint64_t, uint32_t>("philox_random_bits", index, out, [=](uint64_t i) {
          return num::philox_random_bits(seed, offset, i);
        });
      },
      "seed"_a, "offset"_a, "index"_a.noconvert(), "out"_a.noconvert(),
      "out[i] = the 32 random bits of element index[i] of the stream (seed, offset).");
  m.def(
      "f32_to_e2m1_stochastic",
      [](HostIn<float> x, HostIn<uint32_t> random_bits, HostOut<uint8_t> out) {
        require_same_size("f32_to_e2m1_stochastic", x, random_bits);
        require_same_size("f32_to_e2m1_stochastic", x, out);
        const float* src = x.data();
        const uint32_t* bits = random_bits.data();
        uint8_t* dst = out.data();
        const size_t n = x.size();
        nb::gil_scoped_release release;
        for (size_t i = 0; i < n; ++i) dst[i] = num::f32_to_e2m1_stochastic(src[i], bits[i]);
      },
      "x"_a.noconvert(), "random_bits"_a.noconvert(), "out"_a.noconvert(),
      "out[i] = E2M1 code of x[i], rounded stochastically with random_bits[i].");
  m.def(
      "hadamard16_transform",
      [](HostIn<float> x, HostOut<float> out) {
        require_same_size("hadamard16_transform", x, out);
        if (x.size() % num::kHadamardSize != 0) {
          throw nb::value_error("hadamard16_transform: the size must be a multiple of 16");
        }
        const float* src = x.data();
        float* dst = out.data();
        const size_t n = x.size();
        nb::gil_scoped_release release;
        for (size_t block = 0; block < n; block += num::kHadamardSize) {
          float v[num::kHadamardSize];
          for (int i = 0; i < num::kHadamardSize; ++i) v[i] = src[block + i];
          num::hadamard16_transform(v);
          for (int i = 0; i < num::kHadamardSize; ++i) dst[block + i] = v[i];
        }
      },
      "x"_a.noconvert(), "out"_a.noconvert(),
      "out = the 16-point random Hadamard transform of each consecutive block of 16 in x.");
}

}  // namespace sfmoe_binding
