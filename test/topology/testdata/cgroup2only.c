// SPDX-License-Identifier: MIT
/*
 * cgroup2only.so - show a process only its cgroup v2 line of
 * /proc/self/cgroup.
 *
 * Theory of operation: Slurm's cgroup/v2 plugin (22.05) finds the cgroup
 * it lives in by reading /proc/self/cgroup and refuses to start ("Hybrid
 * mode is not supported") unless the file's first line is the unified
 * hierarchy's "0::PATH". On a host that still has cgroup v1 hierarchies
 * in use (the test machine: its init keeps every command in a v1 memory
 * cgroup), every process's file lists those first, whatever its mount
 * namespace, so the plugin cannot run there at all. The test harness
 * (test/topology/cgroup.go) preloads this library into slurmd, and so
 * into the slurmstepd processes slurmd starts, on such hosts only: an
 * open(2) of exactly "/proc/self/cgroup" returns a memfd holding the
 * file's "0::" line and nothing else. Every other path, and every other
 * way of reading the file, is untouched; the cgroup v2 tree Slurm then
 * creates, moves tasks into, signals and removes is the real one.
 *
 * Jobs do not inherit it: slurmstepd builds a task's environment from the
 * job's, not from its own (the test checks).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static const char self_cgroup[] = "/proc/self/cgroup";

/**
 * unified_only() - a memfd with the "0::" lines of /proc/self/cgroup
 * @flags: the caller's open flags (only O_CLOEXEC is honoured)
 *
 * Return: the file descriptor, positioned at its start, or -1 with errno
 * set.
 */
static int unified_only(int flags)
{
	char buf[16384], *line, *save = NULL;
	ssize_t n, len = 0;
	int in, out;

	in = (int)syscall(SYS_openat, AT_FDCWD, self_cgroup, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -1;
	while (len < (ssize_t)sizeof(buf) - 1 &&
	       (n = read(in, buf + len, sizeof(buf) - 1 - (size_t)len)) > 0)
		len += n;
	close(in);
	buf[len] = '\0';
	out = memfd_create("cgroup", (flags & O_CLOEXEC) ? MFD_CLOEXEC : 0);
	if (out < 0)
		return -1;
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "0::", 3) != 0)
			continue;
		if (write(out, line, strlen(line)) < 0 || write(out, "\n", 1) < 0) {
			close(out);
			return -1;
		}
	}
	if (lseek(out, 0, SEEK_SET) < 0) {
		close(out);
		return -1;
	}
	return out;
}

/**
 * open_path() - open(2) as libc does it, except for /proc/self/cgroup
 * @path: the file
 * @flags: open flags
 * @mode: the mode, meaningful with O_CREAT or O_TMPFILE only
 */
static int open_path(const char *path, int flags, mode_t mode)
{
	if (strcmp(path, self_cgroup) == 0)
		return unified_only(flags);
	return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	va_list ap;

	if (flags & (O_CREAT | O_TMPFILE)) {
		va_start(ap, flags);
		mode = va_arg(ap, mode_t);
		va_end(ap);
	}
	return open_path(path, flags, mode);
}

/* The same entry point under its large-file name (one function on 64-bit
 * glibc, two symbols). */
int open64(const char *path, int flags, ...) __attribute__((alias("open")));
