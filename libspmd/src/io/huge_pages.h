// Large host buffers on transparent huge pages while a model's weights are
// read: jit::load copies every storage into fresh heap memory, and faulting
// in 650 MB one 4 KiB page at a time costs more than copying it. Measured on
// the 2-core CI machine, jit::load of GPT's weights alone: 2.3 s on 4 KiB
// pages, 0.7-1.6 s on 2 MiB pages (glibc's hugetlb tunable); inside
// spmd-expand with this scope, 1.7-2.2 s, varying from run to run.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace spmd {

// While alive, CPU allocations of 2 MiB and more are mappings advised to use
// huge pages; smaller ones go to the allocator that was in place, which is
// restored on exit. Scopes nest; not for use from several threads at once.
class HugePageAllocations {
 public:
  HugePageAllocations();
  ~HugePageAllocations();
  HugePageAllocations(const HugePageAllocations&) = delete;
  HugePageAllocations& operator=(const HugePageAllocations&) = delete;

 private:
  c10::Allocator* previous_;
};

}  // namespace spmd
