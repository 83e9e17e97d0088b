/* SPDX-License-Identifier: MIT
 *
 * airlock preload library: SOCKS5 client (RFC 1928, RFC 1929) for the
 * local proxy of airlock run, including Airlock's UDP relay command. All
 * I/O is blocking with a poll() timeout, on sockets this file puts in
 * blocking mode for the exchange. See preload.c for the theory of
 * operation.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "preload.h"

/**
 * wait_fd() - Wait until a socket is readable or writable
 * @fd:		Socket
 * @events:	POLLIN or POLLOUT
 *
 * Return: 0 when ready, -1 with errno ETIMEDOUT or from poll()
 */
static int wait_fd(int fd, short events)
{
	struct pollfd p = { .fd = fd, .events = events };
	int n;

	do {
		n = poll(&p, 1, AL_TIMEOUT_MS);
	} while (n < 0 && errno == EINTR);
	if (n == 0) {
		errno = ETIMEDOUT;
		return -1;
	}
	return n < 0 ? -1 : 0;
}

/**
 * write_all() - Write a whole buffer to a socket
 * @fd:		Socket
 * @buf:	Data
 * @len:	Length of @buf
 *
 * Return: 0 on success, -1 with errno set
 */
static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	ssize_t n;

	while (len) {
		if (wait_fd(fd, POLLOUT) < 0)
			return -1;
		n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/**
 * read_all() - Read exactly len bytes from a socket
 * @fd:		Socket
 * @buf:	Buffer
 * @len:	Bytes to read
 *
 * Return: 0 on success, -1 with errno set (ECONNRESET on early end of
 * stream)
 */
static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	ssize_t n;

	while (len) {
		if (wait_fd(fd, POLLIN) < 0)
			return -1;
		n = recv(fd, p, len, 0);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			return -1;
		if (n == 0) {
			errno = ECONNRESET;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/**
 * put_addr() - Append ATYP, ADDR, PORT of an IPv4 or IPv6 address
 * @b:		Buffer with at least 19 bytes free
 * @sa:		Address (AF_INET or AF_INET6; v4-mapped IPv6 sent as IPv4)
 *
 * Return: bytes written
 */
static size_t put_addr(unsigned char *b, const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;

		b[0] = 1;
		memcpy(b + 1, &s->sin_addr, 4);
		memcpy(b + 5, &s->sin_port, 2);
		return 7;
	} else {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;

		if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) {
			b[0] = 1;
			memcpy(b + 1, s->sin6_addr.s6_addr + 12, 4);
			memcpy(b + 5, &s->sin6_port, 2);
			return 7;
		}
		b[0] = 4;
		memcpy(b + 1, &s->sin6_addr, 16);
		memcpy(b + 17, &s->sin6_port, 2);
		return 19;
	}
}

/**
 * reply_errno() - Map a SOCKS5 reply code to an errno
 * @rep:	Reply code (non-zero)
 *
 * Return: the errno a kernel socket would give for the same failure
 */
static int reply_errno(unsigned char rep)
{
	switch (rep) {
	case 3:
		return ENETUNREACH;
	case 4:
		return EHOSTUNREACH;
	case 5:
		return ECONNREFUSED;
	case 6:
		return ETIMEDOUT;
	default:
		return ECONNREFUSED;
	}
}

/**
 * handshake() - Authenticate and send one request on a connected socket
 * @fd:		Socket connected to the proxy, blocking
 * @cmd:	SOCKS command (AL_CMD_CONNECT or AL_CMD_UDP_RELAY)
 * @dst:	Destination
 * @src:	For AL_CMD_UDP_RELAY: the UDP socket's loopback address
 * @bnd:	If not NULL, receives BND.ADDR:BND.PORT
 *
 * Return: 0 on success, -1 with errno set
 */
static int handshake(int fd, int cmd, const struct sockaddr *dst,
		     const struct sockaddr *src, struct sockaddr_storage *bnd)
{
	unsigned char b[600];
	size_t n = 0, slen = strlen(al_secret());
	unsigned char r[4];

	/* Greeting, username/password and request in one write. */
	b[n++] = 5;
	b[n++] = 1;
	b[n++] = 2;
	b[n++] = 1;
	b[n++] = 3;
	memcpy(b + n, "job", 3);
	n += 3;
	b[n++] = (unsigned char)slen;
	memcpy(b + n, al_secret(), slen);
	n += slen;
	b[n++] = 5;
	b[n++] = (unsigned char)cmd;
	b[n++] = 0;
	n += put_addr(b + n, dst);
	if (src)
		n += put_addr(b + n, src);
	if (write_all(fd, b, n) < 0)
		return -1;

	if (read_all(fd, r, 4) < 0)
		return -1;
	if (r[0] != 5 || r[1] != 2 || r[2] != 1 || r[3] != 0) {
		errno = EACCES; /* proxy refused our secret */
		return -1;
	}
	if (read_all(fd, r, 4) < 0)
		return -1;
	if (r[1] != 0) {
		errno = reply_errno(r[1]);
		return -1;
	}
	if (r[3] == 1) {
		if (read_all(fd, b, 6) < 0)
			return -1;
		if (bnd) {
			struct sockaddr_in *s4 = (struct sockaddr_in *)bnd;

			memset(bnd, 0, sizeof(*bnd));
			s4->sin_family = AF_INET;
			memcpy(&s4->sin_addr, b, 4);
			memcpy(&s4->sin_port, b + 4, 2);
		}
	} else if (r[3] == 4) {
		if (read_all(fd, b, 18) < 0)
			return -1;
		if (bnd) {
			struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)bnd;

			memset(bnd, 0, sizeof(*bnd));
			s6->sin6_family = AF_INET6;
			memcpy(&s6->sin6_addr, b, 16);
			memcpy(&s6->sin6_port, b + 16, 2);
		}
	} else {
		errno = EPROTO;
		return -1;
	}
	return 0;
}

/**
 * proxy_for() - The proxy's address in the family of a socket
 * @fd:		The socket
 * @family:	Its family, AF_INET or AF_INET6
 * @ss:		Storage for the address
 *
 * IPv6 sockets reach the IPv4 loopback proxy through a v4-mapped address;
 * those that cannot (al_v6_loopback()) reach its IPv6 loopback listener.
 *
 * Return: the address length, or 0 with errno ENETUNREACH if the socket
 * cannot reach the proxy
 */
static socklen_t proxy_for(int fd, int family, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET6 && al_v6_loopback(fd)) {
		if (!al_proxy6_addr()) {
			errno = ENETUNREACH;
			return 0;
		}
		memcpy(ss, al_proxy6_addr(), sizeof(struct sockaddr_in6));
		return sizeof(struct sockaddr_in6);
	}
	if (family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = al_proxy_addr()->sin_port;
		s6->sin6_addr.s6_addr[10] = 0xff;
		s6->sin6_addr.s6_addr[11] = 0xff;
		memcpy(s6->sin6_addr.s6_addr + 12, &al_proxy_addr()->sin_addr, 4);
		return sizeof(*s6);
	}
	memcpy(ss, al_proxy_addr(), sizeof(struct sockaddr_in));
	return sizeof(struct sockaddr_in);
}

/**
 * al_socks_open() - Connect a socket to the proxy and run one request
 * @fd:		The program's unconnected TCP socket
 * @cmd:	SOCKS command
 * @dst:	Destination
 * @src:	For AL_CMD_UDP_RELAY, the UDP socket's address; else NULL
 * @bnd:	If not NULL, receives the proxy's BND address
 *
 * The socket is blocking during the exchange and gets its file status
 * flags (O_NONBLOCK) back afterwards.
 *
 * Return: 0 on success, -1 with errno set
 */
int al_socks_open(int fd, int cmd, const struct sockaddr *dst,
		  const struct sockaddr *src, struct sockaddr_storage *bnd)
{
	struct sockaddr_storage ss;
	socklen_t sslen;
	int domain = AF_INET, flags, rc, saved;
	socklen_t dl = sizeof(domain);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dl) < 0)
		return -1;
	sslen = proxy_for(fd, domain, &ss);
	if (!sslen)
		return -1;
	flags = fcntl(fd, F_GETFL);
	if (flags < 0)
		return -1;
	if (flags & O_NONBLOCK)
		fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
	do {
		rc = al_real_connect(fd, (struct sockaddr *)&ss, sslen);
	} while (rc < 0 && errno == EINTR);
	if (rc == 0)
		rc = handshake(fd, cmd, dst, src, bnd);
	saved = errno;
	if (flags & O_NONBLOCK)
		fcntl(fd, F_SETFL, flags);
	errno = saved;
	return rc;
}

/**
 * al_socks_ctl() - Open a control connection of its own and run a request
 * @cmd:	SOCKS command
 * @dst:	Destination
 * @src:	For AL_CMD_UDP_RELAY, the UDP socket's address; else NULL
 * @bnd:	If not NULL, receives the proxy's BND address
 *
 * The connection gets a high, close-on-exec fd so that it does not take
 * the small fd numbers programs expect to get for their own files.
 *
 * Return: the connected socket, or -1 with errno set
 */
int al_socks_ctl(int cmd, const struct sockaddr *dst,
		 const struct sockaddr *src, struct sockaddr_storage *bnd)
{
	int fd, hi, saved;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	hi = fcntl(fd, F_DUPFD_CLOEXEC, 1000);
	if (hi >= 0) {
		al_real_close(fd);
		fd = hi;
	}
	if (al_socks_open(fd, cmd, dst, src, bnd) < 0) {
		saved = errno;
		al_real_close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}
