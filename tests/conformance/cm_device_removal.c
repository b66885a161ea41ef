/*
 * RDMA_CM_EVENT_DEVICE_REMOVAL (rdma_cm(7)): when the device goes away (here: `softverbs
 * inject device-fatal`, which writes the state directory's "device" file), every id bound
 * to it gets DEVICE_REMOVAL once; an id not yet on a device gets nothing. The ids can then
 * be destroyed as usual.
 */
#include "common.h"

#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/stat.h>

#define NAME "cm_device_removal"

static struct rdma_cm_event *next_event(struct rdma_event_channel *c, int timeout_ms)
{
	struct rdma_cm_event *ev = NULL;
	struct pollfd p = { .fd = c->fd, .events = POLLIN };
	if (poll(&p, 1, timeout_ms) != 1)
		return NULL;
	CHECK(rdma_get_cm_event(c, &ev) == 0);
	return ev;
}

/* What `softverbs inject device-fatal` does: replace the file atomically. */
static void inject_device_fatal(const char *dir)
{
	char tmp[512], path[512];
	FILE *f;
	snprintf(tmp, sizeof(tmp), "%s/.device.%d", dir, (int)getpid());
	snprintf(path, sizeof(path), "%s/device", dir);
	f = fopen(tmp, "w");
	CHECK(f != NULL);
	fprintf(f, "fatal %d\n", (int)getpid());
	CHECK(fclose(f) == 0);
	CHECK(rename(tmp, path) == 0);
}

int main(void)
{
	char dir[] = "/tmp/softverbs-cm-removal-XXXXXX";
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listener, *client, *unbound;
	struct rdma_cm_event *ev;
	struct sockaddr_in addr = { .sin_family = AF_INET };
	int seen_listener = 0, seen_client = 0;

	sv_init(NAME);
	/* A state directory of our own: the device fails for this test only. */
	CHECK(mkdtemp(dir) != NULL);
	CHECK(setenv("SOFTVERBS_STATE_DIR", dir, 1) == 0);

	sv_step("a listener and a resolved id on the device, one id on none");
	ch = rdma_create_event_channel();
	CHECK(ch != NULL);
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0);
	CHECK(rdma_listen(listener, 4) == 0);
	addr.sin_port = rdma_get_src_port(listener);
	CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&addr, 2000) == 0);
	ev = next_event(ch, SV_WAIT_MS);
	CHECK(ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(rdma_ack_cm_event(ev) == 0);
	CHECK(rdma_create_id(ch, &unbound, NULL, RDMA_PS_TCP) == 0);

	sv_step("the device fails: DEVICE_REMOVAL for each id on it, once");
	inject_device_fatal(dir);
	for (int i = 0; i < 2; ++i) {
		ev = next_event(ch, SV_WAIT_MS);
		CHECKF(ev != NULL, "DEVICE_REMOVAL #%d did not come", i + 1);
		CHECKF(ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL, "got %s", rdma_event_str(ev->event));
		CHECK(ev->id == listener || ev->id == client);
		seen_listener += ev->id == listener;
		seen_client += ev->id == client;
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	CHECK(seen_listener == 1 && seen_client == 1);
	ev = next_event(ch, SV_QUIET_MS);
	CHECKF(ev == NULL, "unexpected %s", ev ? rdma_event_str(ev->event) : "");

	sv_step("the ids are destroyed as usual");
	CHECK(rdma_destroy_id(unbound) == 0);
	CHECK(rdma_destroy_id(client) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(ch);
	{
		char path[512];
		snprintf(path, sizeof(path), "%s/device", dir);
		unlink(path);
		rmdir(dir); /* other files (the host registry) may remain: best effort */
	}
	sv_pass();
	return 0;
}
