/*
 * A hook that interposes mremap(2) the way UCX's memory hooks (libucm 1.13)
 * do: the hook takes four arguments and forwards four, so MREMAP_FIXED's new address is
 * lost. Here the lost argument is made deterministic: a FIXED move lands at a fresh address
 * of the hook's choosing instead of the one asked for (as root, UCX's landed at address 0).
 *
 * softverbs moves registered pages into its MR memfd with mremap (docs/decisions/0005); if
 * it went through libc's mremap, a program with such a hook would keep its private pages
 * while peers wrote into the memfd. conformance.twoproc_semantics.mremap_hook runs the
 * two-process semantics test with this hook linked in and exported (as a preloaded library
 * would interpose it).
 */
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

void *mremap(void *old_address, size_t old_size, size_t new_size, int flags, ...)
{
	void *to = NULL;
	if (flags & MREMAP_FIXED) {
		/* The fifth argument never reaches the kernel: somewhere else, then. */
		to = mmap(NULL, new_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (to == MAP_FAILED)
			return MAP_FAILED;
	}
	return (void *)syscall(SYS_mremap, old_address, old_size, new_size, flags, to);
}
