/* SPDX-License-Identifier: Apache-2.0
 *
 * fakeroot.c - LD_PRELOAD shim that lets ocserv run as "root" in a user
 * namespace, for the reference unprivileged server of the benchmark.
 *
 * Theory of operation
 * -------------------
 * The benchmark starts ocserv as an unprivileged user inside
 * `unshare -U -r -n`: a new user namespace in which only uid 0 and gid 0
 * exist (mapped to the real user), and a new network namespace whose only
 * link to the outside is slirp4netns.  In that namespace ocserv has
 * CAP_NET_ADMIN, so it can create its tun devices and configure them, but
 * it also drops privileges the way it would on a real host: it calls
 * setgroups()/initgroups() to clear supplementary groups (refused: unshare
 * -r writes "deny" to /proc/self/setgroups), setgid()/setuid() and friends
 * to become run-as-user (refused: no such uid in the namespace), and
 * chown()s its sockets to that user (refused for the same reason).  Each
 * of those failures is fatal to ocserv.
 *
 * The shim interposes exactly those calls and makes them succeed without
 * doing anything: the process keeps uid 0 of the namespace, which is the
 * unprivileged user outside it.  No privilege is gained; the calls simply
 * become no-ops.  Every other call goes to libc unchanged, and nothing is
 * interposed when the real call would have succeeded anyway (the shim
 * first tries the real function and only hides EPERM and EINVAL), so the
 * shim is harmless where it is not needed.
 *
 * Build: cc -shared -fPIC -Wall -Wextra -pedantic -O2 -o fakeroot.so
 *        fakeroot.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <grp.h>
#include <sys/types.h>
#include <unistd.h>

/**
 * hide() - turn a refused identity change into success
 * @ret: return value of the real call
 *
 * Return: 0 if the real call failed with EPERM or EINVAL (the errors of a
 * user namespace without that id), else @ret with errno unchanged.
 */
static int hide(int ret)
{
	if (ret < 0 && (errno == EPERM || errno == EINVAL)) {
		errno = 0;
		return 0;
	}
	return ret;
}

/* REAL() looks up the next definition of a libc function.  The cast from
 * void * to a function pointer is what dlsym(3) documents; -pedantic warns
 * about it (ISO C leaves it undefined), POSIX requires it to work. */
#define REAL(type, name) ((type)(unsigned long)dlsym(RTLD_NEXT, name))

int setuid(uid_t uid)
{
	return hide(REAL(int (*)(uid_t), "setuid")(uid));
}

int setgid(gid_t gid)
{
	return hide(REAL(int (*)(gid_t), "setgid")(gid));
}

int seteuid(uid_t uid)
{
	return hide(REAL(int (*)(uid_t), "seteuid")(uid));
}

int setegid(gid_t gid)
{
	return hide(REAL(int (*)(gid_t), "setegid")(gid));
}

int setreuid(uid_t r, uid_t e)
{
	return hide(REAL(int (*)(uid_t, uid_t), "setreuid")(r, e));
}

int setregid(gid_t r, gid_t e)
{
	return hide(REAL(int (*)(gid_t, gid_t), "setregid")(r, e));
}

int setresuid(uid_t r, uid_t e, uid_t s)
{
	return hide(REAL(int (*)(uid_t, uid_t, uid_t), "setresuid")(r, e, s));
}

int setresgid(gid_t r, gid_t e, gid_t s)
{
	return hide(REAL(int (*)(gid_t, gid_t, gid_t), "setresgid")(r, e, s));
}

int setgroups(size_t size, const gid_t *list)
{
	return hide(REAL(int (*)(size_t, const gid_t *), "setgroups")(size, list));
}

int initgroups(const char *user, gid_t group)
{
	return hide(REAL(int (*)(const char *, gid_t), "initgroups")(user, group));
}

int chown(const char *path, uid_t owner, gid_t group)
{
	return hide(REAL(int (*)(const char *, uid_t, gid_t), "chown")(path, owner, group));
}

int fchown(int fd, uid_t owner, gid_t group)
{
	return hide(REAL(int (*)(int, uid_t, gid_t), "fchown")(fd, owner, group));
}

int lchown(const char *path, uid_t owner, gid_t group)
{
	return hide(REAL(int (*)(const char *, uid_t, gid_t), "lchown")(path, owner, group));
}
