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
# AppArmor: where unprivileged user namespaces need a profile (Ubuntu 24.04
# and later: kernel.apparmor_restrict_unprivileged_userns=1), the one that
# allows them to /usr/bin/airlock. It uses AppArmor 4's userns rule, which
# AppArmor 3 (Debian 12) cannot parse and would fail to load at boot, so it
# is installed only where this host's parser accepts it.
profile=/usr/share/airlock/apparmor/airlock
if [ -f "$profile" ] && command -v apparmor_parser >/dev/null 2>&1 &&
	[ -d /etc/apparmor.d ] && apparmor_parser -Q -K "$profile" >/dev/null 2>&1; then
	install -m 0644 "$profile" /etc/apparmor.d/airlock
	if aa-enabled --quiet 2>/dev/null; then
		apparmor_parser -r -T -W /etc/apparmor.d/airlock || true
	fi
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
	# An upgrade restarts a running gateway; its jobs keep their leases.
	if systemctl is-active --quiet airlock-gateway.service; then
		systemctl try-restart airlock-gateway.service || true
	fi
fi
exit 0
