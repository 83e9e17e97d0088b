/* SPDX-License-Identifier: MIT */
/*
 * spank_airlock.c - Slurm SPANK plugin: run a job's tasks through Airlock.
 *
 * Theory of operation
 *
 * The plugin adds --airlock[=MODE] to sbatch, srun and salloc. When it is
 * given, or when plugstack.conf makes it the default for the job's
 * partition, every task of the job runs as `airlock run -- TASK ARGS...`:
 * inside Airlock's user+network namespace, with the job script unchanged.
 *
 * SPANK has no call to change what a task executes. slurmstepd forks a
 * task, resolves its program path, calls slurm_spank_task_init() in the
 * child (as the job's user), runs TaskProlog, sets TMPDIR and the
 * propagated resource limits, and finally calls execve(argv[0], argv,
 * env). The argv array that spank_get_item(S_JOB_ARGV) returns is the one
 * that execve receives (slurmstepd itself rewrites argv[0] in place when it
 * resolves the path), so in slurm_spank_task_init the plugin replaces
 * argv[0] with the Airlock task wrapper and puts the original program into
 * the task's environment (AIRLOCK_SLURM_PROGRAM). slurmstepd then runs
 * everything it normally runs and execs the wrapper, which execs
 * `airlock run [--mode MODE] -- PROGRAM ARGS...`. The task's process is
 * airlock itself, so scancel, time limits and job ends signal it and
 * Slurm's proctrack sees every process inside the namespace as the task's
 * descendants. Exit status passes through.
 *
 * Other ways were considered: execve()ing airlock from task_init skips
 * TaskProlog, TMPDIR and the propagated limits; joining namespaces that a
 * per-step airlock made (as pyxis joins a container's) shares one lease
 * between a step's tasks but needs a process outside the step's tasks to
 * keep the tunnel and a cleanup path of its own. See docs/slurm.md.
 *
 * The join settings (AIRLOCK_GATEWAY, AIRLOCK_PIN, AIRLOCK_TOKEN, ...)
 * come from the task's environment or, for the ones it lacks, from the
 * file named by the env= argument, read as root in
 * slurm_spank_task_init_privileged (so it may be readable by root only).
 * Whatever the file holds reaches the task's environment, where the job's
 * user can read it: with attest=munge it needs no token at all.
 *
 * With attest=munge (attested identity, docs/security.md), the plugin also
 * asks the node's munged, as root in slurm_spank_task_init_privileged, for
 * a credential that vouches for the job id, step, uid, gid and node
 * (munge_job.c), and hands it to airlock run in AIRLOCK_MUNGE_JOB; airlock
 * run binds it into its own join credential and the gateway then records
 * the job id as attested. munge_socket= names the munged to ask (a
 * dedicated node+gateway key has its own), and reaches airlock run as
 * AIRLOCK_MUNGE_SOCKET (for every task on the node) for its own credential.
 *
 * plugstack.conf arguments:
 *   airlock=PATH     the airlock binary (default /usr/bin/airlock)
 *   wrapper=PATH     the task wrapper (default
 *                    /usr/lib/airlock/airlock-slurm-task)
 *   env=PATH         KEY=VALUE file with AIRLOCK_* settings
 *   default=MODE     mode for jobs that do not give --airlock (default off)
 *   partitions=A,B   apply default= only to these partitions
 *   attest=munge     make root's job credential for each task (default off)
 *   munge_socket=P   munged's socket for attest=munge (default MUNGE's)
 *   munge_ttl=SECS   the job credential's lifetime (default 600: longer
 *                    than airlock run --join-timeout, 5 minutes)
 *
 * MODE is one of auto, netns, seccomp, preload, proxy (airlock run
 * --mode), off (do not wrap), or steps (auto, but leave the batch script
 * outside the namespace so that srun inside it reaches slurmd).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "munge_job.h"

/* The macro ends in a semicolon of its own. */
SPANK_PLUGIN(airlock, 1)

#define MODE_LEN 16
#define PATH_LEN 4096

/* Plugin state: one copy per process that loads the plugin (srun, sbatch,
 * slurmstepd); set in slurm_spank_init and the option callback. */
static char opt_mode[MODE_LEN];   /* --airlock's MODE, "" if not given */
static int opt_given;             /* --airlock was given */
static char def_mode[MODE_LEN] = "off";
static char def_parts[1024];      /* comma-separated, "" means all */
static char airlock_path[PATH_LEN] = "/usr/bin/airlock";
static char wrapper_path[PATH_LEN] = "/usr/lib/airlock/airlock-slurm-task";
static char env_path[PATH_LEN];
static char attest_mode[MODE_LEN] = "off";
static char munge_socket[PATH_LEN];
static char munge_ttl[16] = "600";

/**
 * valid_mode() - whether @m is a MODE the plugin knows.
 * @m: mode name.
 *
 * Return: 1 if valid, 0 if not.
 */
static int valid_mode(const char *m)
{
	static const char *const modes[] = { "auto", "netns", "seccomp", "preload",
					     "proxy", "off", "steps", NULL };
	for (int i = 0; modes[i]; i++)
		if (strcmp(m, modes[i]) == 0)
			return 1;
	return 0;
}

static int opt_cb(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	/* An option given without a value reaches steps started inside an
	 * allocation (salloc, sbatch) through the environment as "(null)". */
	if (optarg == NULL || optarg[0] == '\0' || strcmp(optarg, "(null)") == 0)
		optarg = "auto";
	if (!valid_mode(optarg) || strlen(optarg) >= MODE_LEN) {
		slurm_error("airlock: --airlock=%s: want auto, netns, seccomp, preload, proxy, steps or off", optarg);
		return -1;
	}
	strcpy(opt_mode, optarg);
	opt_given = 1;
	return 0;
}

static struct spank_option airlock_opt = {
	"airlock", "[mode]",
	"Run the job's tasks inside Airlock's network namespace (airlock run); "
	"mode: auto (default), netns, seccomp, preload, proxy, steps (not the "
	"batch script), off",
	2, 0, opt_cb,
};

/**
 * copy_arg() - copy the value of plugstack.conf argument @arg into @dst if
 * it starts with @key.
 *
 * Return: 1 if @arg was @key's, 0 if not, -1 if the value is too long.
 */
static int copy_arg(const char *arg, const char *key, char *dst, size_t n)
{
	size_t k = strlen(key);
	if (strncmp(arg, key, k) != 0)
		return 0;
	if (strlen(arg + k) >= n)
		return -1;
	strcpy(dst, arg + k);
	return 1;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		int r = copy_arg(av[i], "airlock=", airlock_path, sizeof(airlock_path));
		if (!r)
			r = copy_arg(av[i], "wrapper=", wrapper_path, sizeof(wrapper_path));
		if (!r)
			r = copy_arg(av[i], "env=", env_path, sizeof(env_path));
		if (!r)
			r = copy_arg(av[i], "attest=", attest_mode, sizeof(attest_mode));
		if (!r)
			r = copy_arg(av[i], "munge_socket=", munge_socket, sizeof(munge_socket));
		if (!r)
			r = copy_arg(av[i], "munge_ttl=", munge_ttl, sizeof(munge_ttl));
		if (!r)
			r = copy_arg(av[i], "default=", def_mode, sizeof(def_mode));
		if (!r)
			r = copy_arg(av[i], "partitions=", def_parts, sizeof(def_parts));
		if (r <= 0) {
			slurm_error("airlock: plugstack.conf argument %s: %s", av[i],
				    r < 0 ? "value too long" : "unknown; want airlock=, wrapper=, env=, default=, partitions=, attest=, munge_socket=, munge_ttl=");
			return -1;
		}
	}
	if (strcmp(attest_mode, "munge") != 0 && strcmp(attest_mode, "off") != 0) {
		slurm_error("airlock: plugstack.conf attest=%s: want munge or off", attest_mode);
		return -1;
	}
	if (atoi(munge_ttl) < 1 || atoi(munge_ttl) > 3600) {
		slurm_error("airlock: plugstack.conf munge_ttl=%s: want 1 to 3600 seconds", munge_ttl);
		return -1;
	}
	if (!valid_mode(def_mode)) {
		slurm_error("airlock: plugstack.conf default=%s: want auto, netns, seccomp, preload, proxy, steps or off", def_mode);
		return -1;
	}
	/* Options exist for the commands (srun, sbatch, salloc) and for
	 * slurmstepd; slurmd and prolog/epilog scripts load the stack too. */
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_REMOTE:
	case S_CTX_ALLOCATOR:
		break;
	default:
		return 0;
	}
	if (spank_option_register(sp, &airlock_opt) != ESPANK_SUCCESS) {
		slurm_error("airlock: cannot register --airlock");
		return -1;
	}
	return 0;
}

/**
 * in_list() - whether @name is one of the comma-separated @list.
 */
static int in_list(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && strncmp(p, name, n) == 0)
			return 1;
		if (!end)
			break;
		p = end + 1;
	}
	return 0;
}

/**
 * job_mode() - the mode for this job: --airlock's, else the partition's
 * default, else off.
 */
static const char *job_mode(spank_t sp)
{
	char part[256];

	if (opt_given)
		return opt_mode;
	if (def_parts[0] == '\0')
		return def_mode;
	if (spank_getenv(sp, "SLURM_JOB_PARTITION", part, sizeof(part)) != ESPANK_SUCCESS)
		return "off";
	return in_list(def_parts, part) ? def_mode : "off";
}

/**
 * wrapped() - whether this task is to run through airlock, and in which
 * airlock run mode (@mode, "" for airlock's own default).
 */
static int wrapped(spank_t sp, const char **mode)
{
	uint32_t step = 0;
	const char *m;

	if (!spank_remote(sp))
		return 0;
	m = job_mode(sp);
	if (strcmp(m, "off") == 0)
		return 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
		return 0;
	if (step == SLURM_EXTERN_CONT)
		return 0;
	if (step == SLURM_BATCH_SCRIPT && strcmp(m, "steps") == 0)
		return 0;
	*mode = strcmp(m, "steps") == 0 ? "" : m;
	return 1;
}

/**
 * load_env() - set the AIRLOCK_* variables of @path that the task's
 * environment lacks. Lines are KEY=VALUE; blank lines and # comments are
 * skipped; other keys are refused.
 */
static int load_env(spank_t sp, const char *path)
{
	char line[8192];
	int lineno = 0, rc = 0;
	FILE *f = fopen(path, "re");

	if (!f) {
		slurm_error("airlock: open %s: %s", path, strerror(errno));
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		char *eq, *nl;
		spank_err_t err;

		lineno++;
		nl = strchr(line, '\n');
		if (nl)
			*nl = '\0';
		if (line[0] == '\0' || line[0] == '#')
			continue;
		eq = strchr(line, '=');
		if (!eq || strncmp(line, "AIRLOCK_", 8) != 0) {
			slurm_error("airlock: %s:%d: want AIRLOCK_NAME=VALUE", path, lineno);
			rc = -1;
			break;
		}
		*eq = '\0';
		err = spank_setenv(sp, line, eq + 1, 0);
		if (err != ESPANK_SUCCESS && err != ESPANK_ENV_EXISTS) {
			slurm_error("airlock: cannot set %s", line);
			rc = -1;
			break;
		}
	}
	fclose(f);
	return rc;
}

/**
 * step_name() - the payload's name for step @step in @buf.
 */
static void step_name(uint32_t step, char *buf, size_t n)
{
	switch (step) {
	case SLURM_BATCH_SCRIPT:
		snprintf(buf, n, "batch");
		break;
	case SLURM_EXTERN_CONT:
		snprintf(buf, n, "extern");
		break;
#ifdef SLURM_INTERACTIVE_STEP
	case SLURM_INTERACTIVE_STEP:
		snprintf(buf, n, "interactive");
		break;
#endif
	default:
		snprintf(buf, n, "%lu", (unsigned long)step);
	}
}

/**
 * attest_task() - put root's job credential (and the munged socket) into
 * the task's environment. Runs as root in the task child.
 *
 * A failure is logged and the task goes on: airlock run then joins with
 * the job id claimed only (or, if the gateway requires a credential and
 * munged is down, is refused with the reason).
 */
static void attest_task(spank_t sp)
{
	uint32_t job = 0, step = 0;
	uid_t uid;
	gid_t gid;
	char jobs[16], steps[16], err[512], host[256];
	const char *node = getenv("SLURMD_NODENAME"); /* slurmstepd's own, set from slurmd's conf */
	char *cred = NULL;

	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
		slurm_error("airlock: attest=munge: cannot read the job's id, step, uid or gid");
		return;
	}
	if (!node && gethostname(host, sizeof(host)) == 0) {
		host[sizeof(host) - 1] = '\0';
		node = host;
	}
	snprintf(jobs, sizeof(jobs), "%lu", (unsigned long)job);
	step_name(step, steps, sizeof(steps));
	if (airlock_job_credential(munge_socket, atoi(munge_ttl), jobs, steps, uid, gid, node, &cred, err, sizeof(err)) < 0) {
		slurm_error("airlock: attest=munge: no job credential for job %s: %s; the job's id will be only claimed", jobs, err);
		return;
	}
	if (spank_setenv(sp, "AIRLOCK_MUNGE_JOB", cred, 1) != ESPANK_SUCCESS)
		slurm_error("airlock: cannot set AIRLOCK_MUNGE_JOB");
	free(cred);
}

/**
 * export_socket() - name the site's munged (munge_socket=) to airlock run
 * in the task's environment, for every task on the node: a task whose job
 * credential could not be made and a job that runs airlock run itself
 * must make their join credentials with that munged too, never with the
 * one on MUNGE's default socket (on a real node, the cluster's own, with
 * another key than the gateway's).
 */
static void export_socket(spank_t sp)
{
	if (munge_socket[0] && spank_setenv(sp, "AIRLOCK_MUNGE_SOCKET", munge_socket, 1) != ESPANK_SUCCESS)
		slurm_error("airlock: cannot set AIRLOCK_MUNGE_SOCKET");
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	const char *mode;

	(void)ac;
	(void)av;
	if (strcmp(attest_mode, "munge") == 0)
		export_socket(sp);
	if (!wrapped(sp, &mode))
		return 0;
	if (strcmp(attest_mode, "munge") == 0)
		attest_task(sp);
	if (env_path[0] == '\0')
		return 0;
	return load_env(sp, env_path);
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	const char *mode;
	int argc = 0;
	char **argv = NULL;

	(void)ac;
	(void)av;
	if (!wrapped(sp, &mode))
		return 0;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 || !argv || !argv[0]) {
		slurm_error("airlock: cannot get the task's command");
		return -1;
	}
	if (spank_setenv(sp, "AIRLOCK_SLURM_PROGRAM", argv[0], 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, "AIRLOCK_SLURM_AIRLOCK", airlock_path, 1) != ESPANK_SUCCESS ||
	    (mode[0] && spank_setenv(sp, "AIRLOCK_MODE", mode, 1) != ESPANK_SUCCESS)) {
		slurm_error("airlock: cannot set the task's environment");
		return -1;
	}
	/* The array slurmstepd passes to execve; see the theory of operation. */
	argv[0] = wrapper_path;
	return 0;
}
