/* SPDX-License-Identifier: MIT */
/*
 * munge_job.c - root's MUNGE credential for a Slurm job step.
 *
 * Theory of operation
 *
 * Airlock's gateway takes a job's batch job id as attested (not only
 * claimed) only from a MUNGE credential made by root on the node. The
 * SPANK plugin runs as root in slurmstepd's task child before the task's
 * program starts (slurm_spank_task_init_privileged), where Slurm's own
 * records are at hand: the job id, the step, the job's uid and gid, and
 * the node's name as slurmd knows it (SLURMD_NODENAME in slurmstepd's own
 * environment, which the job cannot change). It asks the node's munged
 * for a credential whose payload says so, in the format the gateway
 * parses (internal/attest/payload.go, JobMagic):
 *
 *   airlock-job/1
 *   batch=slurm
 *   job=JOBID
 *   step=STEP
 *   uid=UID
 *   gid=GID
 *   node=NODE
 *
 * munged adds root's uid (the credential's maker) and the node's address.
 * The plugin hands the credential to airlock run in the task's
 * environment; the gateway honours it only together with a join
 * credential of the same uid, made on the same node, that names it, and
 * only once.
 *
 * libmunge is loaded with dlopen() when a site turns attestation on, so
 * that the plugin needs neither libmunge's headers to build nor the
 * library on nodes that do not use it. The few declarations below are
 * libmunge.so.2's stable ABI (munge.h).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "munge_job.h"

/* From munge.h (libmunge.so.2). */
typedef struct munge_ctx *munge_ctx_t;
typedef int munge_err_t;
#define AIRLOCK_MUNGE_OPT_TTL 4
#define AIRLOCK_MUNGE_OPT_SOCKET 8

struct libmunge {
	munge_ctx_t (*ctx_create)(void);
	void (*ctx_destroy)(munge_ctx_t);
	munge_err_t (*ctx_set)(munge_ctx_t, int, ...);
	const char *(*ctx_strerror)(munge_ctx_t);
	munge_err_t (*encode)(char **, munge_ctx_t, const void *, int);
};

/**
 * load_libmunge() - dlopen libmunge.so.2 and find its functions.
 * @lm: filled in.
 * @err, @errlen: a message on failure.
 *
 * Return: 0, or -1 on failure. The library stays loaded.
 */
static int load_libmunge(struct libmunge *lm, char *err, size_t errlen)
{
	void *h = dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		snprintf(err, errlen, "cannot load libmunge.so.2 (install the munge library): %s", dlerror());
		return -1;
	}
	/* POSIX: a data pointer from dlsym converts to a function pointer. */
	*(void **)&lm->ctx_create = dlsym(h, "munge_ctx_create");
	*(void **)&lm->ctx_destroy = dlsym(h, "munge_ctx_destroy");
	*(void **)&lm->ctx_set = dlsym(h, "munge_ctx_set");
	*(void **)&lm->ctx_strerror = dlsym(h, "munge_ctx_strerror");
	*(void **)&lm->encode = dlsym(h, "munge_encode");
	if (!lm->ctx_create || !lm->ctx_destroy || !lm->ctx_set || !lm->ctx_strerror || !lm->encode) {
		snprintf(err, errlen, "libmunge.so.2 lacks munge_encode or its context functions");
		return -1;
	}
	return 0;
}

/**
 * safe_value() - whether @s may be a payload value: 1 to 256 printable
 * ASCII characters, no spaces.
 */
static int safe_value(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 256)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (s[i] <= ' ' || s[i] >= 0x7f)
			return 0;
	return 1;
}

/**
 * airlock_job_credential() - have munged make root's credential for a job.
 * @socket: munged's socket, NULL or "" for MUNGE's default.
 * @ttl: the credential's lifetime in seconds (munged caps it).
 * @job: the job id, @step the step ("0", "batch", ...; may be "").
 * @uid, @gid: the job's user and group.
 * @node: the node's name as slurmd knows it (may be NULL).
 * @cred: set to the credential (free() it) on success.
 * @err, @errlen: a message on failure.
 *
 * Must run as root: munged puts the caller's uid in the credential.
 *
 * Return: 0, or -1 on failure.
 */
int airlock_job_credential(const char *socket, int ttl, const char *job, const char *step,
			   uid_t uid, gid_t gid, const char *node, char **cred, char *err, size_t errlen)
{
	struct libmunge lm;
	munge_ctx_t ctx;
	munge_err_t e;
	char payload[1024];
	int n;

	if (!safe_value(job) || (step[0] && !safe_value(step))) {
		snprintf(err, errlen, "job id or step not printable");
		return -1;
	}
	n = snprintf(payload, sizeof(payload), "airlock-job/1\nbatch=slurm\njob=%s\n", job);
	if (step[0])
		n += snprintf(payload + n, sizeof(payload) - n, "step=%s\n", step);
	n += snprintf(payload + n, sizeof(payload) - n, "uid=%lu\ngid=%lu\n", (unsigned long)uid, (unsigned long)gid);
	if (node && safe_value(node))
		n += snprintf(payload + n, sizeof(payload) - n, "node=%s\n", node);
	if (n < 0 || (size_t)n >= sizeof(payload)) {
		snprintf(err, errlen, "payload too long");
		return -1;
	}
	if (load_libmunge(&lm, err, errlen) < 0)
		return -1;
	ctx = lm.ctx_create();
	if (!ctx) {
		snprintf(err, errlen, "munge_ctx_create failed");
		return -1;
	}
	e = lm.ctx_set(ctx, AIRLOCK_MUNGE_OPT_TTL, ttl);
	if (e == 0 && socket && socket[0])
		e = lm.ctx_set(ctx, AIRLOCK_MUNGE_OPT_SOCKET, socket);
	if (e == 0)
		e = lm.encode(cred, ctx, payload, n);
	if (e != 0) {
		const char *why = lm.ctx_strerror(ctx);
		snprintf(err, errlen, "munge_encode: %s (munged at %s)", why ? why : "failed",
			 socket && socket[0] ? socket : "the default socket");
		lm.ctx_destroy(ctx);
		return -1;
	}
	lm.ctx_destroy(ctx);
	return 0;
}
