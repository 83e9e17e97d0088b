/* SPDX-License-Identifier: MIT
 *
 * airlock preload library: name resolution through the tunnel. glibc's
 * resolver cannot be redirected from outside (it calls internal
 * functions), so getaddrinfo(), gethostbyname*() and res_query() /
 * res_search() ask the tunnel's DNS server themselves, over TCP through
 * the local SOCKS proxy, for names /etc/hosts does not know. See preload.c
 * for the theory of operation.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <unistd.h>

#include "preload.h"

/* Most addresses one lookup returns. */
#define MAX_ADDRS 16

/**
 * in_hosts() - Whether /etc/hosts names a host
 * @name:	Host name
 *
 * Such names are left to the real resolver functions, which read
 * /etc/hosts before they would use DNS.
 *
 * Return: non-zero if a line of /etc/hosts lists @name
 */
static int in_hosts(const char *name)
{
	char line[1024], *tok, *save;
	FILE *f = fopen("/etc/hosts", "re");
	int found = 0;

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		char *hash = strchr(line, '#');

		if (hash)
			*hash = '\0';
		tok = strtok_r(line, " \t\r\n", &save); /* the address */
		while (tok && (tok = strtok_r(NULL, " \t\r\n", &save)))
			if (!strcasecmp(tok, name)) {
				found = 1;
				break;
			}
	}
	fclose(f);
	return found;
}

/**
 * numeric() - Whether a host string is an IP address literal
 * @name:	Host string
 *
 * Return: non-zero for IPv4 or IPv6 literals
 */
static int numeric(const char *name)
{
	unsigned char buf[16];

	return inet_pton(AF_INET, name, buf) == 1 ||
	       inet_pton(AF_INET6, name, buf) == 1;
}

/**
 * ours() - Whether this library resolves a name (else the real resolver)
 * @name:	Host name, may be NULL
 *
 * Return: non-zero if @name must be looked up through the tunnel
 */
static int ours(const char *name)
{
	al_ensure();
	return al_active() && name && *name && !numeric(name) &&
	       strcasecmp(name, "localhost") && !in_hosts(name);
}

/**
 * al_dns_query() - Ask the tunnel's DNS server one question over TCP
 * @name:	Domain name
 * @qtype:	Query type (ns_t_a, ns_t_aaaa, …); class IN
 * @ans:	Buffer for the raw answer
 * @anslen:	Its size
 *
 * Return: length of the answer, or -1 with errno set
 */
int al_dns_query(const char *name, int qtype, unsigned char *ans, int anslen)
{
	unsigned char q[NS_PACKETSZ + 2], lenbuf[2];
	const unsigned char *p;
	size_t nl = strlen(name), i, n = 2;
	uint16_t id;
	int fd, len;

	if (nl == 0 || nl > 253) {
		errno = EINVAL;
		return -1;
	}
	if (getrandom(&id, sizeof(id), 0) != sizeof(id))
		id = (uint16_t)getpid();
	q[n++] = id >> 8;
	q[n++] = id & 0xff;
	q[n++] = 0x01; /* RD */
	q[n++] = 0;
	q[n++] = 0; q[n++] = 1; /* QDCOUNT */
	memset(q + n, 0, 6);
	n += 6;
	p = (const unsigned char *)name;
	while (*p) {
		const unsigned char *dot = (const unsigned char *)strchr((const char *)p, '.');
		size_t l = dot ? (size_t)(dot - p) : strlen((const char *)p);

		if (l == 0 || l > 63) {
			errno = EINVAL;
			return -1;
		}
		q[n++] = (unsigned char)l;
		for (i = 0; i < l; i++)
			q[n++] = p[i];
		p += l;
		if (*p == '.')
			p++;
	}
	q[n++] = 0;
	q[n++] = (unsigned char)(qtype >> 8);
	q[n++] = (unsigned char)qtype;
	q[n++] = 0;
	q[n++] = 1; /* class IN */
	q[0] = (unsigned char)((n - 2) >> 8);
	q[1] = (unsigned char)(n - 2);

	fd = al_socks_ctl(AL_CMD_CONNECT, (const struct sockaddr *)al_dns_addr(),
			  NULL, NULL);
	if (fd < 0)
		return -1;
	if (send(fd, q, n, MSG_NOSIGNAL) != (ssize_t)n ||
	    recv(fd, lenbuf, 2, MSG_WAITALL) != 2) {
		al_real_close(fd);
		errno = EIO;
		return -1;
	}
	len = lenbuf[0] << 8 | lenbuf[1];
	if (len > anslen || len < NS_HFIXEDSZ ||
	    recv(fd, ans, (size_t)len, MSG_WAITALL) != len ||
	    ans[0] != (id >> 8) || ans[1] != (id & 0xff)) {
		al_real_close(fd);
		errno = EIO;
		return -1;
	}
	al_real_close(fd);
	al_debug("dns %s type %d: %d bytes", name, qtype, len);
	return len;
}

/**
 * skip_name() - Skip a possibly compressed domain name in a message
 * @p:		Start of the name
 * @end:	End of the message
 *
 * Return: first byte after the name, or NULL if it runs past @end
 */
static const unsigned char *skip_name(const unsigned char *p,
				      const unsigned char *end)
{
	while (p < end) {
		if (*p == 0)
			return p + 1;
		if ((*p & 0xc0) == 0xc0)
			return p + 2 <= end ? p + 2 : NULL;
		p += *p + 1;
	}
	return NULL;
}

/**
 * lookup() - Resolve a name to addresses of one family through the tunnel
 * @name:	Host name
 * @family:	AF_INET or AF_INET6
 * @addrs:	Receives up to MAX_ADDRS addresses (4 or 16 bytes each)
 * @herr:	Receives an h_errno value on failure
 *
 * Return: number of addresses (>= 1), or 0 on failure
 */
static int lookup(const char *name, int family, unsigned char addrs[][16],
		  int *herr)
{
	unsigned char ans[8192];
	const unsigned char *p, *end;
	int qtype = family == AF_INET6 ? ns_t_aaaa : ns_t_a;
	int alen = family == AF_INET6 ? 16 : 4;
	int len, qd, an, n = 0;

	len = al_dns_query(name, qtype, ans, sizeof(ans));
	if (len < 0) {
		*herr = TRY_AGAIN;
		return 0;
	}
	if ((ans[3] & 0x0f) == ns_r_nxdomain) {
		*herr = HOST_NOT_FOUND;
		return 0;
	}
	if ((ans[3] & 0x0f) != ns_r_noerror) {
		*herr = TRY_AGAIN;
		return 0;
	}
	qd = ans[4] << 8 | ans[5];
	an = ans[6] << 8 | ans[7];
	p = ans + NS_HFIXEDSZ;
	end = ans + len;
	while (qd-- > 0 && p) {
		p = skip_name(p, end);
		if (p)
			p += 4;
	}
	while (an-- > 0 && p && p + 10 <= end && n < MAX_ADDRS) {
		int type, class, rdlen;

		p = skip_name(p, end);
		if (!p || p + 10 > end)
			break;
		type = p[0] << 8 | p[1];
		class = p[2] << 8 | p[3];
		rdlen = p[8] << 8 | p[9];
		p += 10;
		if (p + rdlen > end)
			break;
		if (type == qtype && class == ns_c_in && rdlen == alen)
			memcpy(addrs[n++], p, (size_t)alen);
		p += rdlen;
	}
	if (n == 0)
		*herr = NO_DATA;
	return n;
}

/**
 * getaddrinfo() - Resolve a host and service, hosts through the tunnel
 * @node:	Host name or address literal, may be NULL
 * @service:	Service name or port, may be NULL
 * @hints:	Wanted family, socket type, flags; may be NULL
 * @res:	Receives the list, to be freed with freeaddrinfo()
 *
 * The real getaddrinfo() builds the result from the address literals this
 * function resolves, so that services, socket types and flags behave
 * exactly as glibc's, and freeaddrinfo() frees it.
 *
 * Return: 0 or an EAI_* code
 */
int getaddrinfo(const char *node, const char *service,
		const struct addrinfo *hints, struct addrinfo **res)
{
	unsigned char addrs[MAX_ADDRS][16];
	struct addrinfo h, *head = NULL, **tail = &head, *r;
	int family = hints ? hints->ai_family : AF_UNSPEC;
	int flags = hints ? hints->ai_flags : 0;
	int n = 0, total = 0, herr = 0, i, f, nfams = 0, rc = EAI_NONAME;
	int fams[2];
	char lit[INET6_ADDRSTRLEN];

	if (!ours(node) || (flags & AI_NUMERICHOST))
		return al_real_getaddrinfo(node, service, hints, res);
	/*
	 * The families to ask for, in order: what the tunnel carries. AF_INET6
	 * with AI_V4MAPPED takes A records (as mapped addresses) when there
	 * are no AAAA records, or always with AI_ALL.
	 */
	if (family == AF_INET6) {
		fams[nfams++] = AF_INET6;
		if (flags & AI_V4MAPPED)
			fams[nfams++] = AF_INET;
	} else if (family == AF_UNSPEC && al_ipv6()) {
		fams[nfams++] = AF_INET6;
		fams[nfams++] = AF_INET;
	} else {
		fams[nfams++] = AF_INET;
	}
	memset(&h, 0, sizeof(h));
	if (hints)
		h = *hints;
	h.ai_flags |= AI_NUMERICHOST;
	h.ai_flags &= ~(AI_CANONNAME | AI_ADDRCONFIG);
	for (f = 0; f < nfams; f++) {
		if (family == AF_INET6 && fams[f] == AF_INET && total > 0 &&
		    !(flags & AI_ALL))
			break;
		if (family == AF_INET6 && fams[f] == AF_INET6 && !al_ipv6() &&
		    (flags & AI_V4MAPPED))
			continue; /* IPv6 is unreachable: mapped IPv4 only */
		n = lookup(node, fams[f], addrs, &herr);
		if (n == 0 && herr == HOST_NOT_FOUND)
			break;
		for (i = 0; i < n; i++) {
			inet_ntop(fams[f], addrs[i], lit, sizeof(lit));
			rc = al_real_getaddrinfo(lit, service, &h, &r);
			if (rc != 0)
				continue;
			*tail = r;
			while (*tail)
				tail = &(*tail)->ai_next;
		}
		total += n;
	}
	if (!head) {
		if (total == 0)
			return herr == HOST_NOT_FOUND || herr == NO_DATA ? EAI_NONAME : EAI_AGAIN;
		return rc;
	}
	if (hints && (hints->ai_flags & AI_CANONNAME))
		head->ai_canonname = strdup(node);
	*res = head;
	al_debug("getaddrinfo %s: %d addresses", node, total);
	return 0;
}

/**
 * gethostbyname2_r() - Resolve a host of one family, reentrant
 * @name:	Host name
 * @af:		AF_INET or AF_INET6
 * @ret:	Result storage
 * @buf:	Buffer for the result's strings and addresses
 * @buflen:	Its size
 * @result:	Receives @ret on success, NULL on failure
 * @h_errnop:	Receives the h_errno value on failure
 *
 * Return: 0 on success or not found, ERANGE if @buf is too small
 */
int gethostbyname2_r(const char *name, int af, struct hostent *ret,
		     char *buf, size_t buflen, struct hostent **result,
		     int *h_errnop)
{
	unsigned char addrs[MAX_ADDRS][16];
	int n, i, herr = 0, alen = af == AF_INET6 ? 16 : 4;
	size_t need, nl;
	char **ptrs;
	char *p;

	if (!ours(name) || (af != AF_INET && af != AF_INET6))
		return al_real_gethostbyname2_r(name, af, ret, buf, buflen,
						result, h_errnop);
	*result = NULL;
	n = lookup(name, af, addrs, &herr);
	if (n == 0) {
		*h_errnop = herr;
		return herr == TRY_AGAIN ? EAGAIN : 0;
	}
	nl = strlen(name) + 1;
	/* aliases {NULL}, addr_list pointers, addresses, name */
	need = sizeof(char *) * (1 + (size_t)n + 1) + (size_t)(n * alen) + nl;
	if (buflen < need + sizeof(char *)) {
		*h_errnop = NETDB_INTERNAL;
		return ERANGE;
	}
	/* Align the pointer arrays. */
	p = buf + ((sizeof(char *) - ((uintptr_t)buf % sizeof(char *))) % sizeof(char *));
	ptrs = (char **)(void *)p;
	ptrs[0] = NULL; /* no aliases */
	p = (char *)(ptrs + 1 + n + 1);
	for (i = 0; i < n; i++) {
		memcpy(p, addrs[i], (size_t)alen);
		ptrs[1 + i] = p;
		p += alen;
	}
	ptrs[1 + n] = NULL;
	memcpy(p, name, nl);
	ret->h_name = p;
	ret->h_aliases = ptrs;
	ret->h_addrtype = af;
	ret->h_length = alen;
	ret->h_addr_list = ptrs + 1;
	*result = ret;
	return 0;
}

/**
 * gethostbyname_r() - Resolve an IPv4 host, reentrant
 * @name:	Host name
 * @ret:	Result storage
 * @buf:	Buffer for the result's strings and addresses
 * @buflen:	Its size
 * @result:	Receives @ret on success, NULL on failure
 * @h_errnop:	Receives the h_errno value on failure
 *
 * Return: as gethostbyname2_r()
 */
int gethostbyname_r(const char *name, struct hostent *ret, char *buf,
		    size_t buflen, struct hostent **result, int *h_errnop)
{
	return gethostbyname2_r(name, AF_INET, ret, buf, buflen, result,
				h_errnop);
}

static __thread struct hostent static_host;
static __thread char static_buf[2048];

/**
 * gethostbyname2() - Resolve a host of one family
 * @name:	Host name
 * @af:		AF_INET or AF_INET6
 *
 * Return: a result in thread-local storage, or NULL with h_errno set
 */
struct hostent *gethostbyname2(const char *name, int af)
{
	struct hostent *r = NULL;
	int herr = 0;

	if (gethostbyname2_r(name, af, &static_host, static_buf,
			     sizeof(static_buf), &r, &herr) != 0 || !r) {
		h_errno = herr ? herr : HOST_NOT_FOUND;
		return NULL;
	}
	return r;
}

/**
 * gethostbyname() - Resolve an IPv4 host
 * @name:	Host name
 *
 * Return: a result in thread-local storage, or NULL with h_errno set
 */
struct hostent *gethostbyname(const char *name)
{
	return gethostbyname2(name, AF_INET);
}

/**
 * res_query() - Ask a DNS question, through the tunnel
 * @dname:	Domain name
 * @class:	Class; only C_IN goes through the tunnel
 * @type:	Query type
 * @answer:	Buffer for the raw answer
 * @anslen:	Its size
 *
 * Return: length of the answer, or -1 with h_errno set
 */
int res_query(const char *dname, int class, int type, unsigned char *answer,
	      int anslen);
int res_search(const char *dname, int class, int type, unsigned char *answer,
	       int anslen);

int res_query(const char *dname, int class, int type, unsigned char *answer,
	      int anslen)
{
	int len;

	al_ensure();
	if (!al_active() || class != ns_c_in)
		return al_real_res_query ?
			       al_real_res_query(dname, class, type, answer, anslen) :
			       -1;
	len = al_dns_query(dname, type, answer, anslen);
	if (len < 0) {
		h_errno = TRY_AGAIN;
		return -1;
	}
	switch (answer[3] & 0x0f) {
	case ns_r_noerror:
		if ((answer[6] | answer[7]) == 0) {
			h_errno = NO_DATA;
			return -1;
		}
		return len;
	case ns_r_nxdomain:
		h_errno = HOST_NOT_FOUND;
		return -1;
	default:
		h_errno = TRY_AGAIN;
		return -1;
	}
}

/**
 * res_search() - Ask a DNS question, through the tunnel, without search list
 * @dname:	Domain name (the search list of resolv.conf is not applied)
 * @class:	Class
 * @type:	Query type
 * @answer:	Buffer for the raw answer
 * @anslen:	Its size
 *
 * Return: as res_query()
 */
int res_search(const char *dname, int class, int type, unsigned char *answer,
	       int anslen)
{
	return res_query(dname, class, type, answer, anslen);
}

/* Programs built against glibc < 2.34 link against the __res_ names. */
int __res_query(const char *dname, int class, int type, unsigned char *answer,
		int anslen);
int __res_search(const char *dname, int class, int type,
		 unsigned char *answer, int anslen);

/**
 * __res_query() - Old name of res_query()
 * @dname:	Domain name
 * @class:	Class
 * @type:	Query type
 * @answer:	Buffer for the raw answer
 * @anslen:	Its size
 *
 * Return: as res_query()
 */
int __res_query(const char *dname, int class, int type, unsigned char *answer,
		int anslen)
{
	return res_query(dname, class, type, answer, anslen);
}

/**
 * __res_search() - Old name of res_search()
 * @dname:	Domain name
 * @class:	Class
 * @type:	Query type
 * @answer:	Buffer for the raw answer
 * @anslen:	Its size
 *
 * Return: as res_query()
 */
int __res_search(const char *dname, int class, int type,
		 unsigned char *answer, int anslen)
{
	return res_query(dname, class, type, answer, anslen);
}
