#!/bin/sh
# SPDX-License-Identifier: MIT
# After the package is removed: let systemd forget the unit. The gateway's
# state directory (/var/lib/airlock: keys, tokens, lease history) and its
# user are kept, as for every system service: a reinstall finds the same
# identity, and attribution history is never deleted by a package tool.
set -e
# The AppArmor profile the postinst installed (Debian: remove and purge;
# RPM: the number of versions left, 0), unloaded first.
case "$1" in
remove | purge | 0)
	if [ -f /etc/apparmor.d/airlock ]; then
		if command -v apparmor_parser >/dev/null 2>&1 && aa-enabled --quiet 2>/dev/null; then
			apparmor_parser -R /etc/apparmor.d/airlock >/dev/null 2>&1 || true
		fi
		rm -f /etc/apparmor.d/airlock
	fi
	;;
esac
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
