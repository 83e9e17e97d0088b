/* SPDX-License-Identifier: MIT
 *
 * shortaddr: a job that asks for socket addresses with buffers shorter
 * than the address (as POSIX allows: the address is truncated, the full
 * length reported). Built with -fsanitize=address and run under the
 * preload library (also built with it) by preload_test.go, so that a
 * write or read past the caller's buffer is caught.
 *
 * Usage: shortaddr DEST_IPV4 UDP_PORT
 * Prints one "ok NAME" line per check, "FAIL ..." and exits 1 otherwise.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int failed;

static void check(int ok, const char *name, const char *detail)
{
	if (ok) {
		printf("ok %s\n", name);
	} else {
		printf("FAIL %s: %s\n", name, detail);
		failed = 1;
	}
}

/* An address buffer of n bytes on the heap, so that ASan catches any byte
 * written or read past it. */
static struct sockaddr *shortbuf(size_t n)
{
	return malloc(n ? n : 1);
}

static int udp_socket(void)
{
	struct timeval tv = { 5, 0 };
	int fd = socket(AF_INET, SOCK_DGRAM, 0);

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

int main(int argc, char **argv)
{
	static const size_t room[] = { 0, 2, 4, 8, 15 };
	struct sockaddr_in dst, want;
	char buf[64];
	size_t i;

	if (argc != 3) {
		fprintf(stderr, "usage: shortaddr DEST_IPV4 UDP_PORT\n");
		return 2;
	}
	memset(&dst, 0, sizeof(dst));
	dst.sin_family = AF_INET;
	dst.sin_port = htons(atoi(argv[2]));
	inet_pton(AF_INET, argv[1], &dst.sin_addr);
	want = dst;

	/* recvfrom() through a relay, with less room than an address. */
	for (i = 0; i < sizeof(room) / sizeof(room[0]); i++) {
		size_t n = room[i];
		int fd = udp_socket();
		struct sockaddr *from = shortbuf(n);
		socklen_t len = n;
		char name[32];
		ssize_t r;

		snprintf(name, sizeof(name), "recvfrom-%zu", n);
		sendto(fd, "ping", 4, 0, (struct sockaddr *)&dst, sizeof(dst));
		r = recvfrom(fd, buf, sizeof(buf), 0, from, &len);
		check(r > 0 && len == sizeof(struct sockaddr_in) &&
			      !memcmp(from, &want, n),
		      name, r > 0 ? "address not truncated as POSIX says"
				  : "no answer");
		free(from);
		close(fd);
	}

	/* recvmsg() through a relay, 8 bytes of room. ASan's own recvmsg
	 * interceptor checks msg_namelen bytes as the kernel reports it (the
	 * full length), so the room is 8 bytes of a larger buffer whose other
	 * bytes must stay untouched. */
	{
		int fd = udp_socket();
		unsigned char *from = malloc(64), k;
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr m;
		ssize_t r;
		int intact = 1;

		memset(from, 0xaa, 64);
		memset(&m, 0, sizeof(m));
		m.msg_name = from;
		m.msg_namelen = 8;
		m.msg_iov = &iov;
		m.msg_iovlen = 1;
		sendto(fd, "ping", 4, 0, (struct sockaddr *)&dst, sizeof(dst));
		r = recvmsg(fd, &m, 0);
		for (k = 8; k < 64; k++)
			intact = intact && from[k] == 0xaa;
		check(r > 0 && m.msg_namelen == sizeof(struct sockaddr_in) &&
			      !memcmp(from, &want, 8),
		      "recvmsg-8", "address not truncated as POSIX says");
		check(intact, "recvmsg-8-room", "wrote past the caller's room");
		free(from);
		close(fd);
	}

	/* getpeername() and accept() with 4 bytes of room, on a loopback
	 * connection (not relayed: the library must not touch them). */
	{
		struct sockaddr_in lo;
		socklen_t ll = sizeof(lo), len = 4;
		struct sockaddr *p = shortbuf(4), *a = shortbuf(4);
		int l = socket(AF_INET, SOCK_STREAM, 0), c, s;

		memset(&lo, 0, sizeof(lo));
		lo.sin_family = AF_INET;
		lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		bind(l, (struct sockaddr *)&lo, sizeof(lo));
		listen(l, 1);
		getsockname(l, (struct sockaddr *)&lo, &ll);
		c = socket(AF_INET, SOCK_STREAM, 0);
		connect(c, (struct sockaddr *)&lo, sizeof(lo));
		s = accept(l, a, &len);
		check(s >= 0 && len == sizeof(struct sockaddr_in) &&
			      ((struct sockaddr_in *)a)->sin_family == AF_INET,
		      "accept-4", "bad accept");
		len = 4;
		check(getpeername(c, p, &len) == 0 &&
			      len == sizeof(struct sockaddr_in) &&
			      !memcmp(p, &lo, 4),
		      "getpeername-4", "bad getpeername");
		free(p);
		free(a);
		close(s);
		close(c);
		close(l);
	}
	return failed;
}
