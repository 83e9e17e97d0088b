/* SPDX-License-Identifier: MIT */
/*
 * A compile test only (make -C slurm check-prepend): the installed Slurm's
 * headers as a 23.11 release would show them, for the one difference the
 * plugin cares about, spank_prepend_task_argv(). It proves that the 23.11
 * path compiles and references the call, not that it runs under 23.11:
 * no Slurm 23.11 is installable here (Debian 12 ships 22.05).
 */
#ifndef AIRLOCK_TEST_SLURM_VERSION_H
#define AIRLOCK_TEST_SLURM_VERSION_H
#define SLURM_VERSION_NUM(a, b, c) (((a) << 16) + ((b) << 8) + (c))
#define SLURM_VERSION_MAJOR(a) (((a) >> 16) & 0xff)
#define SLURM_VERSION_MINOR(a) (((a) >> 8) & 0xff)
#define SLURM_VERSION_MICRO(a) ((a) & 0xff)
#define SLURM_VERSION_NUMBER SLURM_VERSION_NUM(23, 11, 0)
#define SLURM_VERSION_STRING "23.11.0"
#endif
