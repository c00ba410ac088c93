/*
 * smc_cat: an AF_SMC netcat for the lab's Linux 6.12 guest, used by
 * crates/cli/tests/interop_smc612.rs (built statically on the host, run from the 9p share).
 *
 *   smc_cat listen PORT < IN > OUT      accept one AF_SMC connection
 *   smc_cat connect IP PORT < IN > OUT  connect with AF_SMC
 *
 * Both directions at once: a child copies stdin to the socket and then shuts the write
 * side down; the parent copies the socket to stdout until EOF. With both done and before
 * the socket is closed, the command in $SMC_CAT_DIAG (e.g. "smc_test diag") runs, so that
 * smc_diag still sees the connection with its mode. Status lines go to stderr:
 *   CONNECTED ms=T   SENT n=N   RECEIVED n=N   CLOSED close_ms=T total_ms=T   ERROR what errno=E
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef AF_SMC
#define AF_SMC 43
#endif

static char buf[1 << 16];

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int fail(const char *what)
{
	fprintf(stderr, "ERROR %s errno=%d (%s)\n", what, errno, strerror(errno));
	return 1;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int s, c;
	double t0 = now();
	if (argc == 3 && !strcmp(argv[1], "listen")) {
		int one = 1;
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
		s = socket(AF_SMC, SOCK_STREAM, 0);
		if (s < 0)
			return fail("socket");
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 4))
			return fail("bind/listen");
		fprintf(stderr, "LISTENING port=%s\n", argv[2]);
		c = accept(s, NULL, NULL);
		if (c < 0)
			return fail("accept");
		close(s);
	} else if (argc == 4 && !strcmp(argv[1], "connect")) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
		if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1)
			return fail("address");
		c = socket(AF_SMC, SOCK_STREAM, 0);
		if (c < 0)
			return fail("socket");
		if (connect(c, (struct sockaddr *)&a, sizeof(a)))
			return fail("connect");
	} else {
		fprintf(stderr, "usage: smc_cat listen PORT | smc_cat connect IP PORT\n");
		return 2;
	}
	fprintf(stderr, "CONNECTED ms=%.1f\n", (now() - t0) * 1e3);
	pid_t pid = fork();
	if (pid < 0)
		return fail("fork");
	if (pid == 0) {
		long long sent = 0;
		ssize_t r;
		while ((r = read(0, buf, sizeof(buf))) > 0) {
			if (write_all(c, buf, (size_t)r))
				return fail("send");
			sent += r;
		}
		if (r < 0)
			return fail("stdin");
		shutdown(c, SHUT_WR);
		fprintf(stderr, "SENT n=%lld\n", sent);
		return 0;
	}
	long long got = 0;
	ssize_t r;
	while ((r = read(c, buf, sizeof(buf))) > 0) {
		if (write_all(1, buf, (size_t)r))
			return fail("stdout");
		got += r;
	}
	if (r < 0)
		fail("recv");
	int st = 1;
	waitpid(pid, &st, 0);
	fprintf(stderr, "RECEIVED n=%lld\n", got);
	const char *diag = getenv("SMC_CAT_DIAG");
	if (diag && *diag) {
		fflush(stdout);
		if (system(diag) != 0)
			fprintf(stderr, "ERROR diag\n");
	}
	double tc = now();
	close(c);
	fprintf(stderr, "CLOSED close_ms=%.1f total_ms=%.1f\n", (now() - tc) * 1e3, (now() - t0) * 1e3);
	return r < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}
