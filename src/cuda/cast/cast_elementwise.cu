// Elementwise scaled cast between floating-point dtypes (any arch; a memory-bound grid-stride
// kernel). Each thread converts packs of 8 elements with one vector load and one vector store;
// the pack width in bytes follows the dtype's width, so every access is naturally aligned given
// the 16-byte aligned base pointers that validation guarantees. The kernel is templated on both
// dtypes so decode and encode are straight-line code (v1 switched on the dtypes per element at run
// time and reached only 0.93 TB/s for BF16 -> FP8; see docs/KERNEL_NOTES.md).
#include "src/common/element_codec.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace {

constexpr int kPack = 8;

template <int Bits>
struct PackStorage;  // kPack elements of `Bits` bits, as one aligned vector
template <>
struct PackStorage<32> {
  using Type = uint4[2];
};
template <>
struct PackStorage<16> {
  using Type = uint4[1];
};
template <>
struct PackStorage<8> {
  using Type = uint2[1];
};
template <>
struct PackStorage<4> {
  using Type = uint32_t[1];
};

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

template <sfmoe_dtype In, sfmoe_dtype Out>
__global__ void cast_kernel(const void* __restrict__ input, void* __restrict__ output,
                            int64_t count, float scale, const float* __restrict__ scale_device) {
  constexpr int kInBits = In == SFMOE_DTYPE_FP32                               ? 32
                          : (In == SFMOE_DTYPE_BF16 || In == SFMOE_DTYPE_FP16) ? 16
                          : In == SFMOE_DTYPE_FP4_E2M1                         ? 4
                                                                               : 8;
  constexpr int kOutBits = Out == SFMOE_DTYPE_FP32                                ? 32
                           : (Out == SFMOE_DTYPE_BF16 || Out == SFMOE_DTYPE_FP16) ? 16
                           : Out == SFMOE_DTYPE_FP4_E2M1                          ? 4
                                                                                  : 8;
  const float multiplier = scale_device != nullptr ? *scale_device : scale;
  const int64_t packs = count / kPack;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  auto convert = [multiplier](uint32_t code) {
    return encode_element(Out, numerics::mul_rn(decode_element(In, code), multiplier));
  };
  for (int64_t pack = first; pack < packs; pack += stride) {
    uint32_t codes[kPack];
    load_pack<kInBits>(input, pack, codes);
#pragma unroll
    for (int i = 0; i < kPack; ++i) codes[i] = convert(codes[i]);
    store_pack<kOutBits>(output, pack, codes);
  }
  // The tail (< 8 elements) by one thread, which also keeps FP4 nibble pairs in one hand.
  if (first == 0) {
    for (int64_t i = packs * kPack; i < count; ++i) {
      const uint32_t code = convert(load_code(input, kInBits, i));
      if (kOutBits == 32) static_cast<uint32_t*>(output)[i] = code;
      if (kOutBits == 16) static_cast<uint16_t*>(output)[i] = static_cast<uint16_t>(code);
      if (kOutBits == 8) static_cast<uint8_t*>(output)[i] = static_cast<uint8_t>(code);
      if (kOutBits == 4 && (i & 1)) {
        const uint32_t low = convert(load_code(input, kInBits, i - 1));
        static_cast<uint8_t*>(output)[i >> 1] = static_cast<uint8_t>(low | (code << 4));
      }
    }
  }
}

using CastKernel = void (*)(const void*, void*, int64_t, float, const float*);

// The one dtype dispatch: input dtype, then output dtype, to an explicit instantiation.
template <sfmoe_dtype In>
CastKernel pick_output(sfmoe_dtype out) {
  switch (out) {
    case SFMOE_DTYPE_FP32:
      return cast_kernel<In, SFMOE_DTYPE_FP32>;
    case SFMOE_DTYPE_BF16:
      return cast_kernel<In, SFMOE_DTYPE_BF16>;
    case SFMOE_DTYPE_FP16:
      return cast_kernel<In, SFMOE_DTYPE_FP16>;
    case SFMOE_DTYPE_FP8_E4M3:
      return cast_kernel<In, SFMOE_DTYPE_FP8_E4M3>;
    case SFMOE_DTYPE_FP8_E5M2:
      return cast_kernel<In, SFMOE_DTYPE_FP8_E5M2>;
    case SFMOE_DTYPE_FP4_E2M1:
      return cast_kernel<In, SFMOE_DTYPE_FP4_E2M1>;
    default:
      return nullptr;
  }
}

CastKernel pick_kernel(sfmoe_dtype in, sfmoe_dtype out) {
  switch (in) {
    case SFMOE_DTYPE_FP32:
      return pick_output<SFMOE_DTYPE_FP32>(out);
    case SFMOE_DTYPE_BF16:
      return pick_output<SFMOE_DTYPE_BF16>(out);
    case SFMOE_DTYPE_FP16:
      return pick_output<SFMOE_DTYPE_FP16>(out);
    case SFMOE_DTYPE_FP8_E4M3:
      return pick_output<SFMOE_DTYPE_FP8_E4M3>(out);
    case SFMOE_DTYPE_FP8_E5M2:
      return pick_output<SFMOE_DTYPE_FP8_E5M2>(out);
    case SFMOE_DTYPE_FP4_E2M1:
      return pick_output<SFMOE_DTYPE_FP4_E2M1>(out);
    default:
      return nullptr;
  }
}

}  // namespace

sfmoe_status cast(const void* input, sfmoe_dtype input_dtype, void* output,
                  sfmoe_dtype output_dtype, int64_t count, float scale, const float* scale_device,
                  void* stream) {
  const CastKernel kernel = pick_kernel(input_dtype, output_dtype);
  if (kernel == nullptr) {
    return report(SFMOE_ERROR_UNSUPPORTED, "no kernel for %s -> %s", sfmoe_dtype_name(input_dtype),
                  sfmoe_dtype_name(output_dtype));
  }
  constexpr int kThreads = 256;
  kernel<<<grid_for(count / kPack + 1, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      input, output, count, scale, scale_device);
  return check_launch("cast_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
