/* SPDX-License-Identifier: MIT
 *
 * airlock preload library: declarations shared by its files.
 * See preload.c for the theory of operation.
 */
#ifndef AIRLOCK_PRELOAD_H
#define AIRLOCK_PRELOAD_H

#include <netdb.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <netinet/in.h>

/* Timeout of every exchange with the local proxy, in milliseconds. */
#define AL_TIMEOUT_MS 30000

/* Destinations one UDP socket may send to through relays. */
#define AL_UDP_DESTS 16

/* Highest fd number with per-socket state (UDP relays). */
#define AL_FD_MAX 65536

/**
 * struct al_relay - One UDP destination of a socket and its relay
 * @dst:	Real destination, as the program named it
 * @dstlen:	Length of @dst
 * @relay:	Loopback address of the relay that carries datagrams to @dst
 *		(127.0.0.1, or ::1 for a socket that cannot use IPv4-mapped
 *		addresses)
 * @ctl:	SOCKS control connection; the relay lives while it is open
 */
struct al_relay {
	struct sockaddr_storage dst;
	socklen_t dstlen;
	struct sockaddr_storage relay;
	int ctl;
};

/**
 * struct al_fdstate - UDP relays of one socket
 * @n:		Number of relays in use
 * @r:		The relays
 */
struct al_fdstate {
	int n;
	struct al_relay r[AL_UDP_DESTS];
};

/* The real functions, from the next object in the lookup order. */
extern int (*al_real_connect)(int, const struct sockaddr *, socklen_t);
extern ssize_t (*al_real_sendto)(int, const void *, size_t, int,
				 const struct sockaddr *, socklen_t);
extern ssize_t (*al_real_sendmsg)(int, const struct msghdr *, int);
extern ssize_t (*al_real_recvfrom)(int, void *, size_t, int,
				   struct sockaddr *, socklen_t *);
extern ssize_t (*al_real_recvmsg)(int, struct msghdr *, int);
extern int (*al_real_close)(int);
extern int (*al_real_getaddrinfo)(const char *, const char *,
				  const struct addrinfo *,
				  struct addrinfo **);
extern int (*al_real_gethostbyname2_r)(const char *, int, struct hostent *,
				       char *, size_t, struct hostent **,
				       int *);
extern int (*al_real_res_query)(const char *, int, int, unsigned char *,
				int);

/* Configuration from the environment (preload.c). */
void al_ensure(void);
int al_active(void);
int al_ipv6(void);
const struct sockaddr_in *al_proxy_addr(void);
const struct sockaddr_in6 *al_proxy6_addr(void);
const char *al_secret(void);
const struct sockaddr_in *al_dns_addr(void);
void al_debug(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));

/* Per-socket UDP relay state (preload.c). */
void al_lock(void);
void al_unlock(void);
struct al_fdstate *al_state(int fd, int create);
void al_forget(int fd);

/* SOCKS5 client (socks.c). */
int al_socks_open(int fd, int cmd, const struct sockaddr *dst,
		  const struct sockaddr *src, struct sockaddr_storage *bnd);
int al_socks_ctl(int cmd, const struct sockaddr *dst,
		 const struct sockaddr *src, struct sockaddr_storage *bnd);

/* Addresses (net.c). */
int al_intercepted(const struct sockaddr *sa, socklen_t len,
		   struct sockaddr_storage *out);
int al_v6_loopback(int fd);

/* DNS through the tunnel (dns.c). */
int al_dns_query(const char *name, int qtype, unsigned char *ans,
		 int anslen);

#define AL_CMD_CONNECT 1
#define AL_CMD_UDP_RELAY 0x83

#endif /* AIRLOCK_PRELOAD_H */
