/*
 * cm_probe: an rdma_cm program for the lab's guest (Linux siw through librdmacm), used by
 * crates/cli/tests/interop_siw.rs to see private data exactly as a kernel rdma_cm
 * application does: on connect requests, accepts, rejects, in both roles.
 *
 *   cm_probe server IP PORT [--accept N | --reject N] [--accept-delay-ms MS] [--recv K]
 *                           [--timeout SEC]
 *   cm_probe client IP PORT [--pd N] [--hold-ms MS] [--timeout SEC]
 *
 * --accept-delay-ms waits that long between CONNECT_REQUEST and rdma_accept; --recv K posts
 * K receives of 64 bytes before accepting and reports their completions.
 *
 * The private data we send is N bytes of (0x80 + i) & 0xff. Every event is one line on
 * stdout, private data as lowercase hex without separators:
 *
 *   LISTENING 192.168.77.2:7300
 *   CONNECT_REQUEST pd_len=N pd=HEX ird=I ord=O
 *   ACCEPT n=N rc=0 | ACCEPT n=N rc=-1 errno=22
 *   REJECT n=N rc=0
 *   ESTABLISHED pd_len=N pd=HEX ird=I ord=O
 *   REJECTED status=S pd_len=N pd=HEX
 *   RECV n=LEN status=S at_ms=T (--recv: a receive completed T ms after ESTABLISHED)
 *   DISCONNECTED
 *   EVENT name status=S          (anything else)
 *   TIMEOUT waiting for ...
 *
 * Exit codes: 0 connected and disconnected (client), accepted/rejected as asked and the
 * connection ended (server); 2 REJECTED; 3 another connect failure (CONNECT_ERROR,
 * UNREACHABLE, ADDR/ROUTE_ERROR); 4 timeout; 5 rdma_accept/rdma_reject/rdma_connect
 * refused the call; 1 usage or setup error.
 *
 * Built on the host against Debian's librdmacm-dev 44 (the guest has the same
 * librdmacm.so.1/libibverbs.so.1): gcc -O2 -Wall -o cm_probe cm_probe.c -lrdmacm -libverbs
 * Written from the librdmacm man pages (rdma_cm(7), rdma_connect(3), rdma_accept(3),
 * rdma_reject(3), rdma_get_cm_event(3)).
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int timeout_ms = 10000;
static int recv_count, accept_delay_ms;
static struct timespec t_established;

static long ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

/* Reports receive completions (--recv) until none is left. */
static void drain_recvs(struct rdma_cm_id *id)
{
	struct ibv_wc wc;

	/* librdmacm made a CQ of its own for the receive queue: only receives complete here. */
	while (recv_count && id->recv_cq && ibv_poll_cq(id->recv_cq, 1, &wc) == 1) {
		printf("RECV n=%u status=%d at_ms=%ld\n", wc.byte_len, wc.status, ms_since(&t_established));
		fflush(stdout);
	}
}

/* The next CM event, reporting receive completions meanwhile; NULL after timeout_ms. */
static struct rdma_cm_event *next_event_recv(struct rdma_event_channel *ch, struct rdma_cm_id *id,
					     const char *what)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int waited = 0;

	while (waited < timeout_ms) {
		drain_recvs(id);
		if (poll(&pfd, 1, 10) > 0) {
			drain_recvs(id);
			if (rdma_get_cm_event(ch, &ev)) {
				printf("ERROR rdma_get_cm_event errno=%d\n", errno);
				return NULL;
			}
			return ev;
		}
		waited += 10;
	}
	printf("TIMEOUT waiting for %s\n", what);
	fflush(stdout);
	return NULL;
}

static void print_pd(const void *data, unsigned len)
{
	const unsigned char *p = data;
	printf("pd_len=%u pd=", len);
	for (unsigned i = 0; i < len && p; i++)
		printf("%02x", p[i]);
}

static void pattern(unsigned char *buf, int n)
{
	for (int i = 0; i < n; i++)
		buf[i] = (unsigned char)(0x80 + i);
}

/* The next CM event within the timeout, or NULL (TIMEOUT printed). */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, const char *what)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	int rc = poll(&pfd, 1, timeout_ms);
	struct rdma_cm_event *ev;

	if (rc <= 0) {
		printf("TIMEOUT waiting for %s\n", what);
		fflush(stdout);
		return NULL;
	}
	if (rdma_get_cm_event(ch, &ev)) {
		printf("ERROR rdma_get_cm_event errno=%d\n", errno);
		fflush(stdout);
		return NULL;
	}
	return ev;
}

static void print_other(struct rdma_cm_event *ev)
{
	printf("EVENT %s status=%d\n", rdma_event_str(ev->event), ev->status);
	fflush(stdout);
}

/* The next CM event is `type` (acknowledged): 0; none came: 4; another (printed): 3. */
static int expect_event(struct rdma_event_channel *ch, enum rdma_cm_event_type type, const char *what)
{
	struct rdma_cm_event *ev = next_event(ch, what);

	if (!ev)
		return 4;
	if (ev->event != type) {
		print_other(ev);
		return 3;
	}
	rdma_ack_cm_event(ev);
	return 0;
}

static int make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = 4;
	attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	/* NULL pd and no CQs: librdmacm uses the device's default PD and makes the CQs. */
	if (rdma_create_qp(id, NULL, &attr)) {
		printf("ERROR rdma_create_qp errno=%d\n", errno);
		return -1;
	}
	return 0;
}

/* After ESTABLISHED: wait for DISCONNECTED (the peer's or, with hold_ms >= 0, ours). */
static int until_disconnected(struct rdma_event_channel *ch, struct rdma_cm_id *id, int hold_ms)
{
	struct rdma_cm_event *ev;

	if (hold_ms >= 0) {
		usleep(hold_ms * 1000);
		rdma_disconnect(id);
	}
	for (;;) {
		ev = next_event_recv(ch, id, "DISCONNECTED");
		if (!ev)
			return 4;
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED) {
			printf("DISCONNECTED\n");
			fflush(stdout);
			rdma_ack_cm_event(ev);
			return 0;
		}
		print_other(ev);
		rdma_ack_cm_event(ev);
	}
}

static int resolve(const char *ip, const char *port, struct sockaddr_storage *out)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_flags = AI_NUMERICHOST }, *res;

	if (getaddrinfo(ip, port, &hints, &res)) {
		printf("ERROR bad address %s:%s\n", ip, port);
		return -1;
	}
	memcpy(out, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	return 0;
}

static int server(const char *ip, const char *port, int accept_n, int reject_n)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen_id, *id;
	struct rdma_cm_event *ev;
	struct rdma_conn_param param;
	struct sockaddr_storage addr;
	unsigned char pd[256];
	int rc;

	if (!ch || resolve(ip, port, &addr))
		return 1;
	if (rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen_id, (struct sockaddr *)&addr) || rdma_listen(listen_id, 4)) {
		printf("ERROR listen errno=%d\n", errno);
		return 1;
	}
	printf("LISTENING %s:%s\n", ip, port);
	fflush(stdout);
	for (;;) {
		ev = next_event(ch, "CONNECT_REQUEST");
		if (!ev)
			return 4;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			break;
		print_other(ev);
		rdma_ack_cm_event(ev);
	}
	id = ev->id;
	printf("CONNECT_REQUEST ");
	print_pd(ev->param.conn.private_data, ev->param.conn.private_data_len);
	printf(" ird=%u ord=%u\n", ev->param.conn.responder_resources, ev->param.conn.initiator_depth);
	fflush(stdout);
	memset(&param, 0, sizeof(param));
	/* As rping's server: the IRD/ORD the client stated, seen from our side. */
	param.responder_resources = ev->param.conn.initiator_depth;
	param.initiator_depth = ev->param.conn.responder_resources;
	rdma_ack_cm_event(ev);

	if (reject_n >= 0) {
		pattern(pd, reject_n);
		rc = rdma_reject(id, reject_n ? pd : NULL, (uint8_t)reject_n);
		printf("REJECT n=%d rc=%d", reject_n, rc);
		if (rc)
			printf(" errno=%d", errno);
		printf("\n");
		fflush(stdout);
		rdma_destroy_id(id);
		rdma_destroy_id(listen_id);
		rdma_destroy_event_channel(ch);
		return rc ? 5 : 0;
	}
	if (make_qp(id))
		return 1;
	if (recv_count) {
		static unsigned char bufs[16][64];
		struct ibv_mr *mr = ibv_reg_mr(id->pd, bufs, sizeof(bufs), IBV_ACCESS_LOCAL_WRITE);

		for (int i = 0; mr && i < recv_count; i++) {
			struct ibv_sge sge = { .addr = (uintptr_t)bufs[i], .length = 64, .lkey = mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

			if (ibv_post_recv(id->qp, &wr, &bad))
				mr = NULL;
		}
		if (!mr) {
			printf("ERROR posting receives errno=%d\n", errno);
			return 1;
		}
	}
	if (accept_delay_ms)
		usleep(accept_delay_ms * 1000);
	pattern(pd, accept_n);
	param.private_data = accept_n ? pd : NULL;
	param.private_data_len = (uint8_t)accept_n;
	rc = rdma_accept(id, &param);
	printf("ACCEPT n=%d rc=%d", accept_n, rc);
	if (rc)
		printf(" errno=%d", errno);
	printf("\n");
	fflush(stdout);
	if (rc) {
		/* Give the kernel's teardown of the refused connection a moment before we exit. */
		usleep(200 * 1000);
		return 5;
	}
	for (;;) {
		ev = next_event(ch, "ESTABLISHED");
		if (!ev)
			return 4;
		if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {
			clock_gettime(CLOCK_MONOTONIC, &t_established);
			printf("ESTABLISHED\n");
			fflush(stdout);
			rdma_ack_cm_event(ev);
			break;
		}
		print_other(ev);
		rc = ev->event == RDMA_CM_EVENT_DISCONNECTED;
		rdma_ack_cm_event(ev);
		if (rc)
			return 3;
	}
	rc = until_disconnected(ch, id, -1);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	return rc;
}

static int client(const char *ip, const char *port, int pd_n, int hold_ms)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	struct rdma_conn_param param;
	struct sockaddr_storage addr;
	unsigned char pd[256];
	int rc;

	if (!ch || resolve(ip, port, &addr))
		return 1;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000)) {
		printf("ERROR resolve_addr errno=%d\n", errno);
		return 1;
	}
	rc = expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "ADDR_RESOLVED");
	if (rc)
		return rc;
	if (rdma_resolve_route(id, 2000)) {
		printf("ERROR resolve_route errno=%d\n", errno);
		return 1;
	}
	rc = expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "ROUTE_RESOLVED");
	if (rc)
		return rc;
	if (make_qp(id))
		return 1;
	memset(&param, 0, sizeof(param));
	param.responder_resources = 1;
	param.initiator_depth = 1;
	pattern(pd, pd_n);
	param.private_data = pd_n ? pd : NULL;
	param.private_data_len = (uint8_t)pd_n;
	rc = rdma_connect(id, &param);
	printf("CONNECT n=%d rc=%d", pd_n, rc);
	if (rc)
		printf(" errno=%d", errno);
	printf("\n");
	fflush(stdout);
	if (rc)
		return 5;
	ev = next_event(ch, "ESTABLISHED or REJECTED");
	if (!ev)
		return 4;
	switch (ev->event) {
	case RDMA_CM_EVENT_ESTABLISHED:
		printf("ESTABLISHED ");
		print_pd(ev->param.conn.private_data, ev->param.conn.private_data_len);
		printf(" ird=%u ord=%u\n", ev->param.conn.responder_resources, ev->param.conn.initiator_depth);
		fflush(stdout);
		rdma_ack_cm_event(ev);
		rc = until_disconnected(ch, id, hold_ms);
		break;
	case RDMA_CM_EVENT_REJECTED:
		printf("REJECTED status=%d ", ev->status);
		print_pd(ev->param.conn.private_data, ev->param.conn.private_data_len);
		printf("\n");
		fflush(stdout);
		rdma_ack_cm_event(ev);
		rc = 2;
		break;
	default:
		print_other(ev);
		rdma_ack_cm_event(ev);
		rc = 3;
	}
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return rc;
}

static int usage(void)
{
	fprintf(stderr, "usage: cm_probe server IP PORT [--accept N | --reject N] [--accept-delay-ms MS]\n"
			"                       [--recv K] [--timeout SEC]\n"
			"       cm_probe client IP PORT [--pd N] [--hold-ms MS] [--timeout SEC]\n"
			"N: 0..255 bytes of private data (rdma_cm's length is a u8)\n");
	return 1;
}

static int arg_n(const char *s, int max, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (*s == 0 || *end != 0 || v < 0 || v > max)
		return -1;
	*out = (int)v;
	return 0;
}

int main(int argc, char **argv)
{
	int accept_n = 0, reject_n = -1, pd_n = 0, hold_ms = 200, secs;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 4)
		return usage();
	for (int i = 4; i < argc; i++) {
		if (i + 1 >= argc)
			return usage();
		if (!strcmp(argv[i], "--accept") && !arg_n(argv[i + 1], 255, &accept_n))
			i++;
		else if (!strcmp(argv[i], "--reject") && !arg_n(argv[i + 1], 255, &reject_n))
			i++;
		else if (!strcmp(argv[i], "--pd") && !arg_n(argv[i + 1], 255, &pd_n))
			i++;
		else if (!strcmp(argv[i], "--hold-ms") && !arg_n(argv[i + 1], 60000, &hold_ms))
			i++;
		else if (!strcmp(argv[i], "--accept-delay-ms") && !arg_n(argv[i + 1], 60000, &accept_delay_ms))
			i++;
		else if (!strcmp(argv[i], "--recv") && !arg_n(argv[i + 1], 16, &recv_count))
			i++;
		else if (!strcmp(argv[i], "--timeout") && !arg_n(argv[i + 1], 600, &secs)) {
			timeout_ms = secs * 1000;
			i++;
		} else
			return usage();
	}
	if (!strcmp(argv[1], "server"))
		return server(argv[2], argv[3], accept_n, reject_n);
	if (!strcmp(argv[1], "client"))
		return client(argv[2], argv[3], pd_n, hold_ms);
	return usage();
}
