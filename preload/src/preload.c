/* SPDX-License-Identifier: MIT
 *
 * airlock preload library: send a job's connections through airlock's
 * tunnel when airlock run cannot give the job a network namespace.
 *
 * Theory of operation
 * ===================
 *
 * airlock run --mode preload starts the job with
 *
 *   LD_PRELOAD=.../libairlock-preload.so
 *   AIRLOCK_SOCKS=127.0.0.1:PORT[,[::1]:PORT]  local SOCKS5 proxy of airlock
 *                                       run, on IPv4 loopback and, if listed,
 *                                       on IPv6 loopback
 *   AIRLOCK_SOCKS_SECRET=HEX            its per-job password
 *   AIRLOCK_DNS=A.B.C.D                 the tunnel's DNS server
 *   AIRLOCK_IPV6=1                      the tunnel carries IPv6 (optional)
 *   AIRLOCK_SOCKS6=[::1]:PORT           deprecated alias of the IPv6 entry
 *
 * The proxy dials through a user-space TCP/IP stack on the job's WireGuard
 * device, so what reaches it leaves through the gateway like traffic of a
 * netns job. This library makes unmodified, dynamically linked programs use
 * it by defining, ahead of libc, the functions below. Each one falls
 * through to the real function (dlsym(RTLD_NEXT)) for everything it does
 * not handle: non-IP sockets, loopback, and everything when the variables
 * above are missing.
 *
 * TCP (net.c: connect): the program's own socket is connected to the
 * proxy instead, and the SOCKS5 handshake (username/password, CONNECT to
 * the real destination) runs on it, blocking, before connect() returns 0.
 * The program then owns an ordinary kernel socket; its data is not touched
 * again. A failed CONNECT becomes the errno a kernel would give
 * (ECONNREFUSED, ENETUNREACH, EHOSTUNREACH, ETIMEDOUT).
 *
 * UDP (net.c: connect, sendto, sendmsg, recvfrom, recvmsg): for each
 * destination a socket sends to, the library opens a SOCKS control
 * connection with Airlock's CmdUDPRelay (0x83): the proxy opens a loopback
 * UDP relay connected to this socket's address and carrying plain
 * datagrams to and from the destination. connect() on a UDP socket connects
 * it to the relay, so send/recv/read/write need no wrapping; sendto() and
 * sendmsg() rewrite the destination to the relay; recvfrom() and recvmsg()
 * rewrite the relay's address back to the destination's. Relays end when
 * their control connection closes: at close() of the socket (wrapped) or
 * at the end of the process.
 *
 * DNS (dns.c): glibc's resolver calls its internal __connect and
 * __sendmmsg, which no preload library can replace, and the host's
 * resolvers are unreachable from the compute node. getaddrinfo(),
 * gethostbyname*() and res_query()/res_search() therefore resolve names that
 * /etc/hosts does not know themselves: DNS over TCP, through a SOCKS CONNECT
 * to AIRLOCK_DNS port 53. Connections to port 53 of any address (programs
 * with their own resolver, like dig) are redirected to AIRLOCK_DNS too.
 * getaddrinfo() asks for AAAA records before A records (AF_UNSPEC) when
 * AIRLOCK_IPV6=1, for A records only otherwise: the tunnel decides which
 * families are reachable, not the node's own interfaces (AI_ADDRCONFIG is
 * not applied to these names).
 *
 * IPv6: a connect() or sendto() to an IPv6 destination goes to the proxy
 * with the address as SOCKS ATYP 4; the program's AF_INET6 socket reaches
 * the IPv4 loopback proxy and relays through IPv4-mapped addresses. So an
 * IPv6 socket that cannot use IPv4-mapped addresses (IPV6_V6ONLY set, or
 * bound to an IPv6 address) uses the proxy's IPv6 loopback listener
 * (the IPv6 entry of AIRLOCK_SOCKS) and relays on ::1 instead; without it its
 * connect() fails with ENETUNREACH.
 *
 * Children: fork() keeps the library and its state; execve() keeps it as
 * long as the environment keeps LD_PRELOAD and the AIRLOCK_* variables
 * (shells and most programs do). glibc's exported aliases that other
 * libraries call (__connect, __close, __res_query, __res_search) are
 * covered.
 *
 * Not covered, and said so by airlock run: statically linked programs
 * (no dynamic linker, nothing to preload), programs that clear LD_PRELOAD
 * or the environment, raw sockets and ICMP, sendmmsg(), and system calls
 * made without libc.
 *
 * Thread safety: the per-socket UDP state is guarded by one mutex; it is
 * never held across a blocking call.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "preload.h"

int (*al_real_connect)(int, const struct sockaddr *, socklen_t);
ssize_t (*al_real_sendto)(int, const void *, size_t, int,
			  const struct sockaddr *, socklen_t);
ssize_t (*al_real_sendmsg)(int, const struct msghdr *, int);
ssize_t (*al_real_recvfrom)(int, void *, size_t, int, struct sockaddr *,
			    socklen_t *);
ssize_t (*al_real_recvmsg)(int, struct msghdr *, int);
int (*al_real_close)(int);
int (*al_real_getaddrinfo)(const char *, const char *,
			   const struct addrinfo *, struct addrinfo **);
int (*al_real_gethostbyname2_r)(const char *, int, struct hostent *, char *,
				size_t, struct hostent **, int *);
int (*al_real_res_query)(const char *, int, int, unsigned char *, int);

static struct sockaddr_in proxy_addr;
static struct sockaddr_in6 proxy6_addr;
static int have_proxy6;
static struct sockaddr_in dns_addr;
static char secret[256];
static int active;
static int ipv6;
static int debug;

static pthread_mutex_t state_mu = PTHREAD_MUTEX_INITIALIZER;
static struct al_fdstate *states[AL_FD_MAX];

/**
 * next() - Look up the real definition of a symbol
 * @name:	Symbol name
 *
 * Return: the next definition after this library, or NULL
 */
static void *next(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

/*
 * ISO C has no conversion between object and function pointers; POSIX
 * guarantees dlsym()'s result can be used as one. Copying the bytes says so
 * without a -Wpedantic exception.
 */
#define NEXT(fp, name)                              \
	do {                                        \
		void *p_ = next(name);              \
		memcpy(&(fp), &p_, sizeof(fp));     \
	} while (0)

/**
 * parse_hostport() - Parse "A.B.C.D:PORT" into an IPv4 socket address
 * @s:		Text, may be NULL
 * @out:	Result
 *
 * Return: 0 on success, -1 if @s is missing or malformed
 */
static int parse_hostport(const char *s, struct sockaddr_in *out)
{
	char host[64];
	const char *colon;
	long port;
	char *end;

	if (!s || !(colon = strrchr(s, ':')) || colon - s >= (long)sizeof(host))
		return -1;
	memcpy(host, s, colon - s);
	host[colon - s] = '\0';
	port = strtol(colon + 1, &end, 10);
	if (*end || port <= 0 || port > 65535)
		return -1;
	memset(out, 0, sizeof(*out));
	out->sin_family = AF_INET;
	out->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &out->sin_addr) == 1 ? 0 : -1;
}

/**
 * parse_hostport6() - Parse "[IPV6]:PORT" into an IPv6 socket address
 * @s:		Text, may be NULL
 * @out:	Result
 *
 * Return: 0 on success, -1 if @s is missing or malformed
 */
static int parse_hostport6(const char *s, struct sockaddr_in6 *out)
{
	char host[64];
	const char *end;
	long port;
	char *pend;

	if (!s || s[0] != '[' || !(end = strchr(s, ']')) || end[1] != ':' ||
	    end - s - 1 >= (long)sizeof(host))
		return -1;
	memcpy(host, s + 1, end - s - 1);
	host[end - s - 1] = '\0';
	port = strtol(end + 2, &pend, 10);
	if (*pend || port <= 0 || port > 65535)
		return -1;
	memset(out, 0, sizeof(*out));
	out->sin6_family = AF_INET6;
	out->sin6_port = htons((uint16_t)port);
	return inet_pton(AF_INET6, host, &out->sin6_addr) == 1 ? 0 : -1;
}

/**
 * parse_proxies() - Parse AIRLOCK_SOCKS, the proxy's addresses
 * @s:		Text, may be NULL: "A.B.C.D:PORT[,[IPV6]:PORT]", entries of
 *		either family in any order
 *
 * Sets proxy_addr from the IPv4 entry and, from an IPv6 entry,
 * proxy6_addr and have_proxy6.
 *
 * Return: 0 if @s has a valid IPv4 entry and no malformed one, else -1
 */
static int parse_proxies(const char *s)
{
	char entry[80];
	const char *end;
	size_t n;
	int have4 = 0;

	if (!s)
		return -1;
	for (; *s; s = *end ? end + 1 : end) {
		end = strchr(s, ',');
		if (!end)
			end = s + strlen(s);
		n = (size_t)(end - s);
		if (n == 0 || n >= sizeof(entry))
			return -1;
		memcpy(entry, s, n);
		entry[n] = '\0';
		if (entry[0] == '[') {
			if (parse_hostport6(entry, &proxy6_addr) < 0)
				return -1;
			have_proxy6 = 1;
		} else {
			if (parse_hostport(entry, &proxy_addr) < 0)
				return -1;
			have4 = 1;
		}
	}
	return have4 ? 0 : -1;
}

/**
 * al_init() - Resolve the real functions and read the configuration
 *
 * Runs once, through al_ensure(): from the library's constructor, or
 * earlier if another library's constructor calls a wrapper first.
 */
static void al_init(void)
{
	const char *s;

	NEXT(al_real_connect, "connect");
	NEXT(al_real_sendto, "sendto");
	NEXT(al_real_sendmsg, "sendmsg");
	NEXT(al_real_recvfrom, "recvfrom");
	NEXT(al_real_recvmsg, "recvmsg");
	NEXT(al_real_close, "close");
	NEXT(al_real_getaddrinfo, "getaddrinfo");
	NEXT(al_real_gethostbyname2_r, "gethostbyname2_r");
	NEXT(al_real_res_query, "res_query");

	debug = getenv("AIRLOCK_PRELOAD_DEBUG") != NULL;
	s = getenv("AIRLOCK_IPV6");
	ipv6 = s && !strcmp(s, "1");
	/* AIRLOCK_SOCKS6: the deprecated alias of AIRLOCK_SOCKS's IPv6 entry. */
	have_proxy6 = parse_hostport6(getenv("AIRLOCK_SOCKS6"), &proxy6_addr) == 0;
	if (parse_proxies(getenv("AIRLOCK_SOCKS")) < 0)
		return;
	s = getenv("AIRLOCK_SOCKS_SECRET");
	if (!s || strlen(s) >= sizeof(secret))
		return;
	strcpy(secret, s);
	memset(&dns_addr, 0, sizeof(dns_addr));
	dns_addr.sin_family = AF_INET;
	dns_addr.sin_port = htons(53);
	s = getenv("AIRLOCK_DNS");
	if (!s || inet_pton(AF_INET, s, &dns_addr.sin_addr) != 1)
		return;
	active = al_real_connect && al_real_sendto && al_real_sendmsg &&
		 al_real_recvfrom && al_real_recvmsg && al_real_close &&
		 al_real_getaddrinfo && al_real_gethostbyname2_r;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/**
 * al_ensure() - Initialise the library if it has not been yet
 */
void al_ensure(void)
{
	pthread_once(&init_once, al_init);
}

/**
 * al_constructor() - Initialise the library when it is loaded
 */
__attribute__((constructor)) static void al_constructor(void)
{
	al_ensure();
}

/**
 * al_active() - Whether interception is configured
 *
 * Return: non-zero if the AIRLOCK_* variables were valid at load time
 */
int al_active(void)
{
	return active;
}

/**
 * al_ipv6() - Whether the tunnel carries IPv6 (AIRLOCK_IPV6=1)
 *
 * Return: non-zero if the job has an IPv6 tunnel address
 */
int al_ipv6(void)
{
	return ipv6;
}

/**
 * al_proxy_addr() - Address of airlock run's SOCKS5 proxy
 *
 * Return: the address, valid when al_active()
 */
const struct sockaddr_in *al_proxy_addr(void)
{
	return &proxy_addr;
}

/**
 * al_proxy6_addr() - Address of the proxy's IPv6 loopback listener
 *
 * Return: the address, or NULL without AIRLOCK_SOCKS6
 */
const struct sockaddr_in6 *al_proxy6_addr(void)
{
	return have_proxy6 ? &proxy6_addr : NULL;
}

/**
 * al_secret() - The job's proxy password
 *
 * Return: the secret, valid when al_active()
 */
const char *al_secret(void)
{
	return secret;
}

/**
 * al_dns_addr() - The tunnel's DNS server, port 53
 *
 * Return: the address, valid when al_active()
 */
const struct sockaddr_in *al_dns_addr(void)
{
	return &dns_addr;
}

/**
 * al_debug() - Log an interception on stderr if AIRLOCK_PRELOAD_DEBUG is set
 * @fmt:	printf format
 */
void al_debug(const char *fmt, ...)
{
	va_list ap;

	if (!debug)
		return;
	va_start(ap, fmt);
	fputs("airlock-preload: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/**
 * al_lock() - Take the lock of the per-socket state
 */
void al_lock(void)
{
	pthread_mutex_lock(&state_mu);
}

/**
 * al_unlock() - Release the lock of the per-socket state
 */
void al_unlock(void)
{
	pthread_mutex_unlock(&state_mu);
}

/**
 * al_state() - UDP relay state of a socket; call with the lock held
 * @fd:		Socket
 * @create:	Allocate the state if there is none
 *
 * Return: the state, or NULL if there is none (or @fd is out of range, or
 * allocation failed)
 */
struct al_fdstate *al_state(int fd, int create)
{
	if (fd < 0 || fd >= AL_FD_MAX)
		return NULL;
	if (!states[fd] && create)
		states[fd] = calloc(1, sizeof(struct al_fdstate));
	return states[fd];
}

/**
 * al_forget() - Drop a socket's relays, closing their control connections
 * @fd:		Socket being closed
 */
void al_forget(int fd)
{
	struct al_fdstate *st;
	int i;

	if (fd < 0 || fd >= AL_FD_MAX)
		return;
	al_lock();
	st = states[fd];
	states[fd] = NULL;
	al_unlock();
	if (!st)
		return;
	for (i = 0; i < st->n; i++)
		al_real_close(st->r[i].ctl);
	free(st);
}
