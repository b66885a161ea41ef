/*
 * A test-only LD_PRELOAD shim for perftest: ibv_query_device reports the vendor_part_id in
 * $SOFTVERBS_TEST_PART_ID instead of softverbs' own (0). Debian's perftest 4.5-0.17 uses the
 * ibv_wr_* post-send API only on the devices it recognises by that number (ConnectX-4 and
 * newer, BlueField, EFA: src/perftest_resources.c:1890-1908, ib_dev_name in
 * src/perftest_parameters.c:1766); on every other device it forces --use_old_post_send,
 * whatever the device offers (docs/qp-ex.md). softverbs does not claim another vendor's part
 * number; the perftest .wr_api tests preload this so that perftest's own workload runs on
 * softverbs' ibv_wr_* API. Only perftest sees the number: softverbs is not changed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

#include <infiniband/verbs.h>

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	int (*query)(struct ibv_context *, struct ibv_device_attr *) =
		(int (*)(struct ibv_context *, struct ibv_device_attr *))dlsym(RTLD_NEXT, "ibv_query_device");
	if (!query)
		return -1;
	int ret = query(context, attr);
	const char *part = getenv("SOFTVERBS_TEST_PART_ID");
	if (ret == 0 && part && *part)
		attr->vendor_part_id = (uint32_t)strtoul(part, NULL, 0);
	return ret;
}
