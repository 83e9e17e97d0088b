/* SPDX-License-Identifier: MIT */
/* See slurm_version.h here: the installed spank.h plus the 23.11 call. */
#ifndef AIRLOCK_TEST_SPANK_H
#define AIRLOCK_TEST_SPANK_H
/* #include_next is a GCC extension that -pedantic would warn about. */
#pragma GCC system_header
#include_next <slurm/spank.h>
/* Slurm 23.11: prepend argc strings of argv to the task's argv; valid in
 * slurm_spank_task_init_privileged and slurm_spank_task_init. */
extern spank_err_t spank_prepend_task_argv(spank_t spank, int argc, const char *argv[]);
#endif
