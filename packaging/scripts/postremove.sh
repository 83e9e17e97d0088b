#!/bin/sh
# SPDX-License-Identifier: MIT
# After the package is removed: let systemd forget the unit. The gateway's
# state directory (/var/lib/airlock: keys, tokens, lease history) and its
# user are kept, as for every system service: a reinstall finds the same
# identity, and attribution history is never deleted by a package tool.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
