#include "huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <new>

namespace spmd {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Above every priority LibTorch registers its CPU allocators with, so that
// the scope wins, and the allocator it restores is set back with it too.
constexpr uint8_t kPriority = 255;

struct Region {
  void* base;
  size_t length;
};

void unmapRegion(void* context) {
  auto* region = static_cast<Region*>(context);
  ::munmap(region->base, region->length);
  delete region;
}

class HugePageAllocator final : public c10::Allocator {
 public:
  explicit HugePageAllocator(c10::Allocator* small) : small_(small) {}

  c10::DataPtr allocate(size_t n) override { return allocateBytes(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  c10::DataPtr allocateBytes(size_t n) const {
    if (n < kHugePage) return small_->allocate(n);
    // Over-allocate by a huge page and keep an aligned part, so that the
    // kernel can back it with whole huge pages.
    const size_t length = (n + 2 * kHugePage - 1) / kHugePage * kHugePage;
    void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return small_->allocate(n);
    const auto start = reinterpret_cast<uintptr_t>(base);
    const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    ::madvise(reinterpret_cast<void*>(aligned), n, MADV_HUGEPAGE);
    auto* region = new Region{base, length};
    return {reinterpret_cast<void*>(aligned), region, unmapRegion, c10::Device(c10::DeviceType::CPU)};
  }

  c10::Allocator* small_;
};

}  // namespace

HugePageAllocations::HugePageAllocations() : previous_(c10::GetCPUAllocator()) {
  // Never destroyed: a storage made in the scope keeps a pointer to the
  // allocator that made it (to grow), beyond the scope.
  static HugePageAllocator* const allocator = new HugePageAllocator(c10::GetCPUAllocator());
  if (previous_ != allocator) c10::SetCPUAllocator(allocator, kPriority);
}

HugePageAllocations::~HugePageAllocations() { c10::SetCPUAllocator(previous_, kPriority); }

}  // namespace spmd
