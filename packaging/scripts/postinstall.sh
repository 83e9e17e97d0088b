#!/bin/sh
# SPDX-License-Identifier: MIT
# After the package is installed or upgraded: create the gateway's system
# user and its directories (systemd-sysusers and systemd-tmpfiles read the
# package's snippets), and let systemd see the unit. Nothing is enabled
# or started: the site configures the gateway first (docs/install.md).
set -e
if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers airlock.conf
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
	systemd-tmpfiles --create airlock.conf
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
	# An upgrade restarts a running gateway; its jobs keep their leases.
	if systemctl is-active --quiet airlock-gateway.service; then
		systemctl try-restart airlock-gateway.service || true
	fi
fi
exit 0
