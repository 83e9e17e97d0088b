/* SPDX-License-Identifier: MIT
 *
 * airlock preload library: the socket calls it replaces — connect() for
 * TCP and UDP, sendto()/sendmsg()/recvfrom()/recvmsg() for UDP, close().
 * See preload.c for the theory of operation.
 */
/*
 * No _GNU_SOURCE here: with it, glibc declares connect() and friends with
 * a transparent union argument, which the definitions below would not match.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "preload.h"

/**
 * al_intercepted() - Decide whether a destination goes through the tunnel
 * @sa:		Destination as the program gave it
 * @len:	Its length
 * @out:	Where it really goes (DNS queries: the tunnel's DNS server)
 *
 * Loopback, unspecified and multicast destinations stay local, except
 * port 53, which always goes to the tunnel's DNS server: the host's
 * resolvers cannot be reached from the compute node.
 *
 * Return: 1 if the destination goes through the tunnel, 0 if not
 */
int al_intercepted(const struct sockaddr *sa, socklen_t len,
		   struct sockaddr_storage *out)
{
	uint16_t port;
	uint32_t v4 = 0;
	int is4 = 0, local = 0;

	if (!al_active() || !sa)
		return 0;
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;

		port = ntohs(s->sin_port);
		v4 = ntohl(s->sin_addr.s_addr);
		is4 = 1;
	} else if (sa->sa_family == AF_INET6 &&
		   len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;

		port = ntohs(s->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) {
			memcpy(&v4, s->sin6_addr.s6_addr + 12, 4);
			v4 = ntohl(v4);
			is4 = 1;
		} else {
			local = IN6_IS_ADDR_LOOPBACK(&s->sin6_addr) ||
				IN6_IS_ADDR_UNSPECIFIED(&s->sin6_addr) ||
				IN6_IS_ADDR_MULTICAST(&s->sin6_addr) ||
				IN6_IS_ADDR_LINKLOCAL(&s->sin6_addr);
		}
	} else {
		return 0;
	}
	if (is4)
		local = (v4 >> 24) == 127 || v4 == 0 || (v4 >> 28) == 14;
	memset(out, 0, sizeof(*out));
	if (port == 53) {
		memcpy(out, al_dns_addr(), sizeof(struct sockaddr_in));
		return 1;
	}
	if (local)
		return 0;
	memcpy(out, sa, sa->sa_family == AF_INET ? sizeof(struct sockaddr_in) :
						     sizeof(struct sockaddr_in6));
	return 1;
}

/**
 * sock_type() - SO_TYPE of a socket
 * @fd:		Socket
 *
 * Return: SOCK_STREAM, SOCK_DGRAM, … or -1 if @fd is not a socket
 */
static int sock_type(int fd)
{
	int t;
	socklen_t l = sizeof(t);

	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &l) < 0)
		return -1;
	return t;
}

/**
 * same_addr() - Compare two IP socket addresses (address and port)
 * @a:		First
 * @b:		Second
 *
 * Return: non-zero if equal
 */
static int same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return 0;
	if (a->sa_family == AF_INET)
		return !memcmp(&((const struct sockaddr_in *)a)->sin_addr,
			       &((const struct sockaddr_in *)b)->sin_addr, 4) &&
		       ((const struct sockaddr_in *)a)->sin_port ==
			       ((const struct sockaddr_in *)b)->sin_port;
	return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		       &((const struct sockaddr_in6 *)b)->sin6_addr, 16) &&
	       ((const struct sockaddr_in6 *)a)->sin6_port ==
		       ((const struct sockaddr_in6 *)b)->sin6_port;
}

/**
 * sock_domain() - SO_DOMAIN of a socket
 * @fd:		Socket
 *
 * Return: AF_INET, AF_INET6, … (AF_INET if it cannot be read)
 */
static int sock_domain(int fd)
{
	int domain = AF_INET;
	socklen_t dl = sizeof(domain);

	getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dl);
	return domain;
}

/**
 * al_v6_loopback() - Whether an IPv6 socket must use the IPv6 loopback
 * @fd:		Socket
 *
 * An AF_INET6 socket reaches the IPv4 loopback proxy and relays through
 * IPv4-mapped addresses unless it has IPV6_V6ONLY set or is bound to an
 * IPv6 address (not :: and not IPv4-mapped).
 *
 * Return: non-zero if @fd is such a socket
 */
int al_v6_loopback(int fd)
{
	struct sockaddr_in6 local;
	socklen_t ll = sizeof(local);
	int only = 0;
	socklen_t ol = sizeof(only);

	if (sock_domain(fd) != AF_INET6)
		return 0;
	if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, &ol) == 0 && only)
		return 1;
	memset(&local, 0, sizeof(local));
	if (getsockname(fd, (struct sockaddr *)&local, &ll) < 0 ||
	    local.sin6_family != AF_INET6)
		return 0;
	return !IN6_IS_ADDR_UNSPECIFIED(&local.sin6_addr) &&
	       !IN6_IS_ADDR_V4MAPPED(&local.sin6_addr);
}

/**
 * relay_addr_for() - A relay's address in the family of the socket
 * @fd:		The program's UDP socket
 * @relay:	Relay address (127.0.0.1 or ::1)
 * @ss:		Storage for the result
 *
 * Return: length of the address in @ss
 */
static socklen_t relay_addr_for(int fd, const struct sockaddr_storage *relay,
				struct sockaddr_storage *ss)
{
	const struct sockaddr_in *r4 = (const struct sockaddr_in *)relay;

	memset(ss, 0, sizeof(*ss));
	if (relay->ss_family == AF_INET6) {
		memcpy(ss, relay, sizeof(struct sockaddr_in6));
		return sizeof(struct sockaddr_in6);
	}
	if (sock_domain(fd) == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = r4->sin_port;
		s6->sin6_addr.s6_addr[10] = 0xff;
		s6->sin6_addr.s6_addr[11] = 0xff;
		memcpy(s6->sin6_addr.s6_addr + 12, &r4->sin_addr, 4);
		return sizeof(*s6);
	}
	memcpy(ss, relay, sizeof(*r4));
	return sizeof(*r4);
}

/**
 * relay_port() - Port of a relay address, in network order
 * @relay:	Relay address (AF_INET or AF_INET6)
 *
 * Return: the port
 */
static in_port_t relay_port(const struct sockaddr_storage *relay)
{
	if (relay->ss_family == AF_INET6)
		return ((const struct sockaddr_in6 *)relay)->sin6_port;
	return ((const struct sockaddr_in *)relay)->sin_port;
}

/**
 * udp_relay() - Find or open the relay of a UDP socket to a destination
 * @fd:		The program's UDP socket
 * @dst:	Destination as the program named it
 * @dstlen:	Its length
 * @via:	Where the datagrams really go (see al_intercepted())
 * @relay:	Receives the relay's loopback address
 *
 * Binds an unbound socket to an ephemeral port first, as sending would:
 * the relay accepts datagrams from this socket's port only, at 127.0.0.1
 * (or ::1 for a socket that cannot use IPv4-mapped addresses).
 *
 * Return: 0 on success, -1 with errno set
 */
static int udp_relay(int fd, const struct sockaddr *dst, socklen_t dstlen,
		     const struct sockaddr_storage *via,
		     struct sockaddr_storage *relay)
{
	struct sockaddr_storage local, src;
	socklen_t ll = sizeof(local);
	struct al_fdstate *st;
	int i, ctl;

	al_lock();
	st = al_state(fd, 0);
	for (i = 0; st && i < st->n; i++) {
		if (same_addr((struct sockaddr *)&st->r[i].dst, dst)) {
			*relay = st->r[i].relay;
			al_unlock();
			return 0;
		}
	}
	al_unlock();

	if (getsockname(fd, (struct sockaddr *)&local, &ll) < 0)
		return -1;
	if ((local.ss_family == AF_INET &&
	     ((struct sockaddr_in *)&local)->sin_port == 0) ||
	    (local.ss_family == AF_INET6 &&
	     ((struct sockaddr_in6 *)&local)->sin6_port == 0)) {
		struct sockaddr_storage any;

		memset(&any, 0, sizeof(any));
		any.ss_family = local.ss_family;
		if (bind(fd, (struct sockaddr *)&any,
			 local.ss_family == AF_INET ? sizeof(struct sockaddr_in) :
						      sizeof(struct sockaddr_in6)) < 0)
			return -1;
		ll = sizeof(local);
		if (getsockname(fd, (struct sockaddr *)&local, &ll) < 0)
			return -1;
	}
	memset(&src, 0, sizeof(src));
	if (al_v6_loopback(fd)) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&src;

		s6->sin6_family = AF_INET6;
		s6->sin6_addr = in6addr_loopback;
		s6->sin6_port = ((struct sockaddr_in6 *)&local)->sin6_port;
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&src;

		s4->sin_family = AF_INET;
		s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		s4->sin_port = local.ss_family == AF_INET ?
				       ((struct sockaddr_in *)&local)->sin_port :
				       ((struct sockaddr_in6 *)&local)->sin6_port;
	}

	ctl = al_socks_ctl(AL_CMD_UDP_RELAY, (const struct sockaddr *)via,
			   (const struct sockaddr *)&src, relay);
	if (ctl < 0)
		return -1;

	al_lock();
	st = al_state(fd, 1);
	if (!st || st->n == AL_UDP_DESTS) {
		al_unlock();
		al_real_close(ctl);
		errno = st ? ENOBUFS : ENOMEM;
		return -1;
	}
	memset(&st->r[st->n], 0, sizeof(st->r[st->n]));
	memcpy(&st->r[st->n].dst, dst,
	       dstlen < sizeof(st->r[st->n].dst) ? dstlen :
						     sizeof(st->r[st->n].dst));
	st->r[st->n].dstlen = dstlen < sizeof(st->r[st->n].dst) ?
				      dstlen :
				      sizeof(st->r[st->n].dst);
	st->r[st->n].relay = *relay;
	st->r[st->n].ctl = ctl;
	st->n++;
	al_unlock();
	al_debug("udp fd %d: relay on loopback port %d", fd,
		 ntohs(relay_port(relay)));
	return 0;
}

/**
 * connect() - Connect a socket, through the tunnel for IP destinations
 * @fd:		Socket
 * @addr:	Destination
 * @len:	Length of @addr
 *
 * Return: 0 on success, -1 with errno set
 */
int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct sockaddr_storage via, rs, relay;
	int type;

	al_ensure();
	if (!al_intercepted(addr, len, &via))
		return al_real_connect(fd, addr, len);
	type = sock_type(fd);
	if (type == SOCK_STREAM) {
		al_debug("tcp fd %d: connect through the tunnel", fd);
		return al_socks_open(fd, AL_CMD_CONNECT,
				     (const struct sockaddr *)&via, NULL, NULL);
	}
	if (type == SOCK_DGRAM) {
		if (udp_relay(fd, addr, len, &via, &relay) < 0)
			return -1;
		return al_real_connect(fd, (struct sockaddr *)&rs,
				       relay_addr_for(fd, &relay, &rs));
	}
	return al_real_connect(fd, addr, len);
}

/**
 * __connect() - glibc's exported alias of connect(), which other libraries call
 * @fd:		Socket
 * @addr:	Destination
 * @len:	Length of @addr
 *
 * Return: as connect()
 */
int __connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	return connect(fd, addr, len);
}

/**
 * sendto() - Send a datagram, through a relay for IP destinations
 * @fd:		Socket
 * @buf:	Data
 * @len:	Length of @buf
 * @flags:	send() flags
 * @addr:	Destination, or NULL on a connected socket
 * @alen:	Length of @addr
 *
 * Return: bytes sent, or -1 with errno set
 */
ssize_t sendto(int fd, const void *buf, size_t len, int flags,
	       const struct sockaddr *addr, socklen_t alen)
{
	struct sockaddr_storage via, rs, relay;

	al_ensure();
	if (!addr || !al_intercepted(addr, alen, &via) ||
	    sock_type(fd) != SOCK_DGRAM)
		return al_real_sendto(fd, buf, len, flags, addr, alen);
	if (udp_relay(fd, addr, alen, &via, &relay) < 0)
		return -1;
	return al_real_sendto(fd, buf, len, flags, (struct sockaddr *)&rs,
			      relay_addr_for(fd, &relay, &rs));
}

/**
 * sendmsg() - Send a message, through a relay for IP destinations
 * @fd:		Socket
 * @msg:	Message; msg_name is the destination or NULL
 * @flags:	send() flags
 *
 * Return: bytes sent, or -1 with errno set
 */
ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	struct sockaddr_storage via, rs, relay;
	struct msghdr m;

	al_ensure();
	if (!msg || !msg->msg_name ||
	    !al_intercepted(msg->msg_name, msg->msg_namelen, &via) ||
	    sock_type(fd) != SOCK_DGRAM)
		return al_real_sendmsg(fd, msg, flags);
	if (udp_relay(fd, msg->msg_name, msg->msg_namelen, &via, &relay) < 0)
		return -1;
	m = *msg;
	m.msg_namelen = relay_addr_for(fd, &relay, &rs);
	m.msg_name = &rs;
	return al_real_sendmsg(fd, &m, flags);
}

/**
 * unrelay() - Replace a relay's address by the destination it stands for
 * @fd:		Socket that received a datagram
 * @from:	Sender address (in/out), in a buffer of sizeof(struct
 *		sockaddr_storage) bytes
 * @fromlen:	Its length (in/out)
 */
static void unrelay(int fd, struct sockaddr_storage *from, socklen_t *fromlen)
{
	struct al_fdstate *st;
	in_port_t port;
	int i, six;

	if (from->ss_family == AF_INET && *fromlen >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)from;

		if (ntohl(s4->sin_addr.s_addr) != INADDR_LOOPBACK)
			return;
		port = s4->sin_port;
		six = 0;
	} else if (from->ss_family == AF_INET6 &&
		   *fromlen >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)from;
		uint32_t v4;

		port = s6->sin6_port;
		if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
			memcpy(&v4, s6->sin6_addr.s6_addr + 12, 4);
			if (ntohl(v4) != INADDR_LOOPBACK)
				return;
			six = 0;
		} else if (IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr)) {
			six = 1;
		} else {
			return;
		}
	} else {
		return;
	}
	al_lock();
	st = al_state(fd, 0);
	for (i = 0; st && i < st->n; i++) {
		if ((st->r[i].relay.ss_family == AF_INET6) == six &&
		    relay_port(&st->r[i].relay) == port) {
			memcpy(from, &st->r[i].dst, st->r[i].dstlen);
			*fromlen = st->r[i].dstlen;
			break;
		}
	}
	al_unlock();
}

/**
 * give_addr() - Hand a received address to the caller, as the kernel would
 * @ss:		The address, complete
 * @sslen:	Its length
 * @to:		The caller's buffer
 * @tolen:	Its size in (@room), the address's full length out
 * @room:	Size of @to
 *
 * The address is truncated to @room; the length reported is the full one,
 * so the caller can tell (POSIX recvfrom()).
 */
static void give_addr(const struct sockaddr_storage *ss, socklen_t sslen,
		      void *to, socklen_t *tolen, socklen_t room)
{
	memcpy(to, ss, sslen < room ? sslen : room);
	*tolen = sslen;
}

/**
 * recvfrom() - Receive a datagram; answers of relays name their source
 * @fd:		Socket
 * @buf:	Buffer
 * @len:	Its size
 * @flags:	recv() flags
 * @from:	Receives the sender, may be NULL
 * @fromlen:	Size of @from in, length of the sender out
 *
 * The sender is received into a buffer of full size, replaced if it is a
 * relay, then truncated to the caller's @fromlen.
 *
 * Return: bytes received, or -1 with errno set
 */
ssize_t recvfrom(int fd, void *buf, size_t len, int flags,
		 struct sockaddr *from, socklen_t *fromlen)
{
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss), room;
	ssize_t n;

	al_ensure();
	if (!from || !fromlen || !al_active())
		return al_real_recvfrom(fd, buf, len, flags, from, fromlen);
	room = *fromlen;
	memset(&ss, 0, sizeof(ss));
	n = al_real_recvfrom(fd, buf, len, flags, (struct sockaddr *)&ss,
			     &sslen);
	if (n < 0)
		return n;
	if (sslen > sizeof(ss))
		sslen = sizeof(ss);
	unrelay(fd, &ss, &sslen);
	give_addr(&ss, sslen, from, fromlen, room);
	return n;
}

/**
 * recvmsg() - Receive a message; answers of relays name their source
 * @fd:		Socket
 * @msg:	Message; msg_name receives the sender
 * @flags:	recv() flags
 *
 * As recvfrom(): the sender goes through a buffer of full size.
 *
 * Return: bytes received, or -1 with errno set
 */
ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	struct sockaddr_storage ss;
	void *name;
	socklen_t room;
	ssize_t n;

	al_ensure();
	if (!msg || !msg->msg_name || !al_active())
		return al_real_recvmsg(fd, msg, flags);
	name = msg->msg_name;
	room = msg->msg_namelen;
	memset(&ss, 0, sizeof(ss));
	msg->msg_name = &ss;
	msg->msg_namelen = sizeof(ss);
	n = al_real_recvmsg(fd, msg, flags);
	msg->msg_name = name;
	if (n < 0) {
		msg->msg_namelen = room;
		return n;
	}
	if (msg->msg_namelen > sizeof(ss))
		msg->msg_namelen = sizeof(ss);
	unrelay(fd, &ss, &msg->msg_namelen);
	give_addr(&ss, msg->msg_namelen, name, &msg->msg_namelen, room);
	return n;
}

/**
 * close() - Close a file; a UDP socket's relays end with it
 * @fd:		File descriptor
 *
 * Return: as close(2)
 */
int close(int fd)
{
	al_ensure();
	if (!al_real_close)
		return (int)syscall(SYS_close, fd);
	al_forget(fd);
	return al_real_close(fd);
}

/**
 * __close() - glibc's exported alias of close()
 * @fd:		File descriptor
 *
 * Return: as close()
 */
int __close(int fd)
{
	return close(fd);
}
