// Elementwise scaled cast between floating-point dtypes (any arch; a memory-bound grid-stride
// kernel). Each thread converts packs of 8 elements with one vector load and one vector store;
// the pack width in bytes follows the dtype's width, so every access is naturally aligned given
// the 16-byte aligned base pointers that validation guarantees. The kernel is templated on the
// element widths only; the dtype within a width is a warp-uniform branch, which keeps the number
// of instantiations at 16 while the loop stays bound by memory.
#include "src/common/element_codec.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace {

constexpr int kPack = 8;

template <int Bits>
struct PackStorage;  // kPack elements of `Bits` bits, as one aligned vector
template <> struct PackStorage<32> { using Type = uint4[2]; };
template <> struct PackStorage<16> { using Type = uint4[1]; };
template <> struct PackStorage<8> { using Type = uint2[1]; };
template <> struct PackStorage<4> { using Type = uint32_t[1]; };

template <int Bits>
__device__ __forceinline__ void load_pack(const void* base, int64_t pack, uint32_t codes[kPack]) {
  using Vec = typename PackStorage<Bits>::Type;
  Vec raw;
  const auto* src = reinterpret_cast<const Vec*>(base) + pack;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(Vec) / sizeof(raw[0])); ++i) raw[i] = (*src)[i];
  const auto* bytes = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
  for (int i = 0; i < kPack; ++i) codes[i] = load_code(bytes, Bits, i);
}

template <int Bits>
__device__ __forceinline__ void store_pack(void* base, int64_t pack, const uint32_t codes[kPack]) {
  using Vec = typename PackStorage<Bits>::Type;
  Vec raw;
  auto* bytes = reinterpret_cast<uint8_t*>(&raw);
#pragma unroll
  for (int i = 0; i < kPack; ++i) {
    if (Bits == 32) reinterpret_cast<uint32_t*>(bytes)[i] = codes[i];
    if (Bits == 16) reinterpret_cast<uint16_t*>(bytes)[i] = static_cast<uint16_t>(codes[i]);
    if (Bits == 8) bytes[i] = static_cast<uint8_t>(codes[i]);
    if (Bits == 4 && (i & 1)) bytes[i >> 1] = static_cast<uint8_t>(codes[i - 1] | (codes[i] << 4));
  }
  auto* dst = reinterpret_cast<Vec*>(base) + pack;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(Vec) / sizeof(raw[0])); ++i) (*dst)[i] = raw[i];
}

template <int InBits, int OutBits>
__global__ void cast_kernel(const void* __restrict__ input, sfmoe_dtype input_dtype,
                            void* __restrict__ output, sfmoe_dtype output_dtype, int64_t count,
                            float scale, const float* __restrict__ scale_device) {
  const float multiplier = scale_device != nullptr ? *scale_device : scale;
  const int64_t packs = count / kPack;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t pack = first; pack < packs; pack += stride) {
    uint32_t codes[kPack];
    load_pack<InBits>(input, pack, codes);
#pragma unroll
    for (int i = 0; i < kPack; ++i) {
      codes[i] = encode_element(
          output_dtype, numerics::mul_rn(decode_element(input_dtype, codes[i]), multiplier));
    }
    store_pack<OutBits>(output, pack, codes);
  }
  // The tail (< 8 elements) by one thread, which also keeps FP4 nibble pairs in one hand.
  if (first == 0) {
    for (int64_t i = packs * kPack; i < count; ++i) {
      const uint32_t code = encode_element(
          output_dtype, numerics::mul_rn(decode_element(input_dtype, load_code(input, InBits, i)),
                                         multiplier));
      if (OutBits == 32) static_cast<uint32_t*>(output)[i] = code;
      if (OutBits == 16) static_cast<uint16_t*>(output)[i] = static_cast<uint16_t>(code);
      if (OutBits == 8) static_cast<uint8_t*>(output)[i] = static_cast<uint8_t>(code);
      if (OutBits == 4 && (i & 1)) {
        const uint32_t low = encode_element(
            output_dtype,
            numerics::mul_rn(decode_element(input_dtype, load_code(input, InBits, i - 1)),
                             multiplier));
        static_cast<uint8_t*>(output)[i >> 1] = static_cast<uint8_t>(low | (code << 4));
      }
    }
  }
}

using CastKernel = void (*)(const void*, sfmoe_dtype, void*, sfmoe_dtype, int64_t, float,
                            const float*);

template <int InBits>
CastKernel pick_output(int out_bits) {
  switch (out_bits) {
    case 32: return cast_kernel<InBits, 32>;
    case 16: return cast_kernel<InBits, 16>;
    case 8: return cast_kernel<InBits, 8>;
    case 4: return cast_kernel<InBits, 4>;
    default: return nullptr;
  }
}

CastKernel pick_kernel(int in_bits, int out_bits) {
  switch (in_bits) {
    case 32: return pick_output<32>(out_bits);
    case 16: return pick_output<16>(out_bits);
    case 8: return pick_output<8>(out_bits);
    case 4: return pick_output<4>(out_bits);
    default: return nullptr;
  }
}

}  // namespace

sfmoe_status cast(const void* input, sfmoe_dtype input_dtype, void* output,
                  sfmoe_dtype output_dtype, int64_t count, float scale, const float* scale_device,
                  void* stream) {
  const CastKernel kernel = pick_kernel(sfmoe_dtype_bits(input_dtype), sfmoe_dtype_bits(output_dtype));
  if (kernel == nullptr) {
    return fail(SFMOE_ERROR_UNSUPPORTED, "sfmoe_cast: no kernel for %s -> %s",
                sfmoe_dtype_name(input_dtype), sfmoe_dtype_name(output_dtype));
  }
  constexpr int kThreads = 256;
  kernel<<<grid_for(count / kPack + 1, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      input, input_dtype, output, output_dtype, count, scale, scale_device);
  return check_launch("sfmoe_cast", "cast_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
