#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prints the licence of every Go module linked into airlock (go list -deps
# of ./cmd/airlock, the standard library aside), each under a header with
# its path and version, from the module cache (go mod download fills it).
# scripts/dist.sh ships it as THIRD_PARTY_LICENSES; a module without a
# licence file fails the script, so none can be linked in unnoticed.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "Licences of the Go modules linked into airlock, as their authors ship them."
echo "Go itself (the standard library and runtime): BSD-3-Clause, https://go.dev/LICENSE"
go list -deps -f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}' ./cmd/airlock |
	sort -u | while read -r path ver dir; do
	lic=$(find "$dir" -maxdepth 1 -type f \( -iname 'LICEN[CS]E*' -o -iname 'COPYING*' \) | sort | head -1)
	if [ -z "$lic" ]; then
		echo "licenses.sh: module $path $ver has no licence file in $dir" >&2
		exit 1
	fi
	printf '\n================================================================================\n%s %s\n================================================================================\n\n' "$path" "$ver"
	cat "$lic"
	for extra in "$dir"/PATENTS "$dir"/NOTICE; do
		if [ -f "$extra" ]; then
			printf '\n--- %s ---\n' "$(basename "$extra")"
			cat "$extra"
		fi
	done
done
