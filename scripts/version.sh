#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prints what a build of this checkout is: `version.sh` the version (v0.3.0
# on a release tag; between releases a Go-style pseudo-version after the
# latest release, v0.3.1-0.20261125143023-e569141aef10, which sorts after
# v0.3.0 and before v0.3.1, with +dirty for uncommitted changes; the latest
# release is the newest v* tag, or CHANGELOG.md's first release heading
# where git knows no tag), `version.sh ldflags` the -X flags that put
# version, commit and date into internal/version, `version.sh epoch` the
# commit's time as a Unix time (SOURCE_DATE_EPOCH for reproducible builds).
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=github.com/airlock-vpn/airlock/internal/version
changelog=$(sed -n 's/^## \[\(v\?[0-9][0-9.]*[^]]*\)\].*/\1/p' CHANGELOG.md 2>/dev/null | grep -v -i unreleased | head -1 || true)
if git rev-parse --git-dir >/dev/null 2>&1; then
	commit=$(git rev-parse HEAD)
	[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit-dirty"
	epoch=$(git log -1 --format=%ct)
	version=$(git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null || true)
	if [ -z "$version" ]; then
		base=$(git describe --tags --abbrev=0 --match 'v[0-9]*' 2>/dev/null || echo "${changelog:-v0.0.0}")
		base=${base#v} base=${base%%[-+]*}
		IFS=. read -r major minor patch <<<"$base"
		version="v$major.$minor.$((patch + 1))-0.$(TZ=UTC git log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd)-$(git rev-parse --short=12 HEAD)"
	fi
	[[ $commit != *-dirty ]] || version="$version+dirty"
else
	# Not a git checkout (a copy of the tree): the next patch release of
	# CHANGELOG.md's latest, as a pre-release, and the newest file's time.
	base=${changelog:-v0.0.0} base=${base#v} base=${base%%[-+]*}
	IFS=. read -r major minor patch <<<"$base"
	version="v$major.$minor.$((patch + 1))-dev" commit=""
	epoch=${SOURCE_DATE_EPOCH:-$(find . -path ./dist -prune -o -path ./bin -prune -o -type f \( -name '*.go' -o -name '*.[ch]' \
		-o -name '*.md' -o -name '*.sh' -o -name 'go.*' -o -name Makefile \) -printf '%T@\n' | sort -n | tail -1 | cut -d. -f1)}
fi
[[ $version == v* ]] || version="v$version"
case "${1:-version}" in
version) echo "$version" ;;
epoch) echo "$epoch" ;;
ldflags)
	date=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
	echo "-X $pkg.version=$version -X $pkg.commit=$commit -X $pkg.date=$date"
	;;
*) echo "usage: $0 [version|ldflags|epoch]" >&2; exit 2 ;;
esac
