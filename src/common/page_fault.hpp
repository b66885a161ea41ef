// Page faults without signals: what an on-demand-paging (ODP) NIC does when it touches a page
// of an ODP memory region that is not present. The pages are faulted in by the kernel on our
// behalf (madvise MADV_POPULATE_READ/WRITE); a fault that cannot be served (the range is not
// mapped, or not writable for a write) is reported as false, never as SIGSEGV/SIGBUS. The
// caller turns that into the access error a NIC gives (LOC_PROT_ERR / REM_ACCESS_ERR).
#pragma once

#include <cstddef>

namespace softverbs {

// Faults in [addr, addr + length) for reading, or for writing when `write`: true when every
// page is now present with that permission.
bool fault_in(const void* addr, size_t length, bool write);

// Makes the pages of [addr, addr + length) that are present already visible to the device
// (IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT): nothing to do for a device that shares the page
// tables, but the range must be in the address space: false when a part is not mapped.
bool range_mapped(const void* addr, size_t length);

}  // namespace softverbs
