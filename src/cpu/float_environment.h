// The CPU reference's floating-point environment: IEEE round-to-nearest-even with subnormals kept,
// whatever the calling thread set. Callers may run with flush-to-zero and denormals-are-zero
// (XLA's CPU threads do, as do programs built with -ffast-math), which would change the reference's
// bits wherever a subnormal appears (FP8 / FP4 scaling, small gradients). Every CPU backend call
// holds one of these; threads it starts inherit the environment it set.
#pragma once

#include <fenv.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace sfmoe {
namespace cpu {

class IeeeFloatEnvironment {
 public:
  IeeeFloatEnvironment() : rounding_(fegetround()) {
    if (rounding_ != FE_TONEAREST) fesetround(FE_TONEAREST);
#if defined(__x86_64__) || defined(__i386__)
    csr_ = _mm_getcsr();
    const unsigned int ieee = csr_ & ~(kFlushToZero | kDenormalsAreZero);
    if (ieee != csr_) _mm_setcsr(ieee);
#elif defined(__aarch64__)
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr_));
    const uint64_t ieee = fpcr_ & ~(kFlushToZeroBit | kFlushToZero16Bit);
    if (ieee != fpcr_) __asm__ __volatile__("msr fpcr, %0" : : "r"(ieee));
#endif
  }
  ~IeeeFloatEnvironment() {
#if defined(__x86_64__) || defined(__i386__)
    if (_mm_getcsr() != csr_) _mm_setcsr(csr_);
#elif defined(__aarch64__)
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr_));
#endif
    if (rounding_ != FE_TONEAREST) fesetround(rounding_);
  }
  IeeeFloatEnvironment(const IeeeFloatEnvironment&) = delete;
  IeeeFloatEnvironment& operator=(const IeeeFloatEnvironment&) = delete;

 private:
  int rounding_;
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned int kFlushToZero = 0x8000u;       // MXCSR.FTZ
  static constexpr unsigned int kDenormalsAreZero = 0x0040u;  // MXCSR.DAZ
  unsigned int csr_ = 0;
#elif defined(__aarch64__)
  static constexpr uint64_t kFlushToZeroBit = uint64_t{1} << 24;    // FPCR.FZ
  static constexpr uint64_t kFlushToZero16Bit = uint64_t{1} << 19;  // FPCR.FZ16
  uint64_t fpcr_ = 0;
#endif
};

}  // namespace cpu
}  // namespace sfmoe
