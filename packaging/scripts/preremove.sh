#!/bin/sh
# SPDX-License-Identifier: MIT
# Before the package is removed (not upgraded): stop the gateway if it runs.
# Debian passes "remove", RPM the number of versions left (0).
set -e
case "$1" in
remove | 0)
	if [ -d /run/systemd/system ]; then
		systemctl stop airlock-gateway.service >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
