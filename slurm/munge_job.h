/* SPDX-License-Identifier: MIT */
/*
 * munge_job.h - root's MUNGE credential for a job step (munge_job.c).
 */
#ifndef AIRLOCK_MUNGE_JOB_H
#define AIRLOCK_MUNGE_JOB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

int airlock_job_credential(const char *socket, int ttl, const char *job, const char *step,
			   uid_t uid, gid_t gid, const char *node, char **cred, char *err, size_t errlen);

#endif
