// A test arena of guarded buffers in one memory (host or CUDA): every buffer sits between two guard
// regions; damage() says whether any guard or any input changed. The adversarial and determinism
// cases (tests/cpp/adversarial_cases.h, determinism_cases.h) take one, so that the same case runs
// on both backends (HostArena here, DeviceArena in tests/cuda/device_arena.h).
#pragma once

#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

#include "sfmoe/sfmoe.h"

namespace sfmoe {
namespace testing {

class Arena {
 public:
  virtual ~Arena();
  virtual sfmoe_memory memory() const = 0;
  virtual void* stream() const = 0;
  bool on_device() const { return memory() == SFMOE_MEMORY_CUDA; }

  // A buffer of `bytes` between guard regions, every byte set to `fill`; an output.
  void* out(size_t bytes, uint8_t fill = 0xEE);
  // A guarded copy of `values`; an input (checked unchanged after the case).
  template <class T>
  T* in(const std::vector<T>& values) {
    return static_cast<T*>(place(values.data(), values.size() * sizeof(T), true, 0));
  }
  // A guarded copy of `values` the op writes (an output with initial contents).
  template <class T>
  T* out_init(const std::vector<T>& values) {
    return static_cast<T*>(place(values.data(), values.size() * sizeof(T), false, 0));
  }
  template <class T>
  std::vector<T> get(const void* buffer, size_t count) {
    std::vector<T> host(count);
    sync();
    copy_out(host.data(), buffer, count * sizeof(T));
    return host;
  }
  // Whether every byte of an output buffer still holds its fill (nothing written).
  bool untouched(const void* buffer);

  // The status word, cleared on first use.
  sfmoe_status_word* word();
  // The word's report after everything enqueued so far (snapshot, synchronize, read).
  sfmoe_fault_report fault();

  // Empty when every guard and every input is as placed; otherwise what changed.
  std::string damage();
  void sync_now() { sync(); }

 protected:
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* p) = 0;
  virtual void copy_in(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_out(void* dst, const void* src, size_t bytes) = 0;
  virtual void sync() = 0;
  void release_all();

 private:
  struct Block {
    uint8_t* base;  // guard | bytes | guard
    size_t bytes;
    bool input;
    std::vector<uint8_t> contents;  // as placed (inputs) or the fill (outputs)
  };
  void* place(const void* src, size_t bytes, bool input, uint8_t fill);
  std::vector<Block> blocks_;
  sfmoe_status_word* word_ = nullptr;
};

// A plain tensor descriptor of an arena buffer.
inline sfmoe_tensor tensor(Arena& m, void* data, sfmoe_dtype dtype, std::vector<int64_t> dims) {
  return sfmoe_tensor_make(data, dtype, static_cast<int32_t>(dims.size()), dims.data(), m.memory(),
                           0);
}

class HostArena : public Arena {
 public:
  ~HostArena() override { release_all(); }
  sfmoe_memory memory() const override { return SFMOE_MEMORY_HOST; }
  void* stream() const override { return nullptr; }

 protected:
  void* raw_alloc(size_t bytes) override;
  void raw_free(void* p) override;
  void copy_in(void* dst, const void* src, size_t bytes) override { memcpy(dst, src, bytes); }
  void copy_out(void* dst, const void* src, size_t bytes) override { memcpy(dst, src, bytes); }
  void sync() override {}
};

}  // namespace testing
}  // namespace sfmoe
