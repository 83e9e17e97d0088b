#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The airlock-slurm-MAJOR .deb (packaging/airlock-slurm.nfpm.yaml): the
# SPANK plugin built against the Slurm headers found (Debian:
# libslurm-dev), for that Slurm major release only. For another major,
# run it on a build host (or in a container) with that release's headers:
#   SLURM_INCLUDE=/opt/slurm-23.11/include scripts/dist-slurm.sh
# Output: $DIST (default dist)/airlock-slurm-MAJOR_VERSION-1_ARCH.deb
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(scripts/version.sh)
export SOURCE_DATE_EPOCH=$(scripts/version.sh epoch)
export TZ=UTC LC_ALL=C
out=${DIST:-dist}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
cp -r slurm "$work/src"
make -s -C "$work/src" clean spank_airlock.so ${SLURM_INCLUDE:+SLURM_INCLUDE=$SLURM_INCLUDE} >&2
slurm_version=$(make -s --no-print-directory -C "$work/src" slurm-version ${SLURM_INCLUDE:+SLURM_INCLUDE=$SLURM_INCLUDE})
IFS=. read -r maj min _ <<<"$slurm_version"
major=$(printf '%d.%02d' "$maj" "$min")
# Any later release (Slurm numbers majors YY.MM: 22.05, 23.02, 23.11, ...)
# is at least MAJOR.(MM+1) in Debian's version order.
next=$(printf '%d.%02d' "$maj" $((min + 1)))
debver=$(echo "${version#v}" | sed 's/-/~/')-1
install -D -m 0644 "$work/src/spank_airlock.so" "$work/stage/spank_airlock.so"
touch -d "@$SOURCE_DATE_EPOCH" "$work/stage/spank_airlock.so"
arch=$(go env GOARCH)
sed -e "s|\${SLURM_MAJOR}|$major|g; s|\${SLURM_NEXT}|$next|g; s|\${SLURM_VERSION}|$slurm_version|g" \
	-e "s|\${STAGE}|$work/stage|g; s|\${ARCH}|$arch|g; s|\${PKG_VERSION}|${version#v}|g; s|\${DEB_VERSION}|$debver|g; s|\${MTIME}|$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)|g" \
	packaging/airlock-slurm.nfpm.yaml >"$work/nfpm.yaml"
go tool -modfile=tools/go.mod nfpm package --config "$work/nfpm.yaml" --packager deb --target "$out/" >&2
ls "$out"/airlock-slurm-"$major"_*.deb
