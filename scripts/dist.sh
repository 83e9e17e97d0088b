#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make dist: release artefacts in dist/, reproducible from the commit alone
# (the same commit gives the same bytes: every timestamp is the commit's,
# paths are trimmed, archives are sorted and owned by root):
#   airlock-VERSION-linux-ARCH.tar.gz   bin/airlock (static), lib/airlock/
#                                       (preload library, SPANK plugin,
#                                       wrappers), share/ (man pages, shell
#                                       completion, systemd, docs, licences)
#   airlock_VERSION-1_ARCH.deb, airlock-VERSION-1.ARCH.rpm   (nfpm)
#   SHA256SUMS
# ARCH is the host's: the preload library and the SPANK plugin are C, built
# with the host's compiler. The Slurm plugin is built against the Slurm
# headers found (libslurm-dev); docs/install.md says how to build it for
# other Slurm releases.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(scripts/version.sh)
export SOURCE_DATE_EPOCH=$(scripts/version.sh epoch)
export TZ=UTC LC_ALL=C
goarch=$(go env GOARCH)
out=${DIST:-dist}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
name=airlock-${version#v}-linux-$goarch
stage=$work/$name
usr=$work/pkgroot/usr
mkdir -p "$out" "$stage"
rm -f "$out"/airlock[-_]* "$out/SHA256SUMS"

echo "dist: $version linux/$goarch, SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"
# The binary: static, no build id, no paths, no VCS stamp (the version is in
# the linker flags).
CGO_ENABLED=0 go build -trimpath -buildvcs=false \
	-ldflags "-s -w -buildid= $(scripts/version.sh ldflags)" -o "$work/airlock" ./cmd/airlock
# The C parts, with the build directory kept out of their debug info, then
# stripped as packages want them.
cflags="-O2 -g -ffile-prefix-map=$PWD=."
make -s -C preload clean >/dev/null
CFLAGS="$cflags" make -s -C preload
make -s -C slurm clean >/dev/null
CFLAGS="$cflags" make -s -C slurm
slurm_version=$(make -s -C slurm slurm-version)

# One tree for the tarball (relative) and the packages (/usr).
install -D -m 0755 "$work/airlock" "$usr/bin/airlock"
install -D -m 0644 preload/libairlock-preload.so "$usr/lib/airlock/libairlock-preload.so"
install -D -m 0644 slurm/spank_airlock.so "$usr/lib/airlock/spank_airlock.so"
strip --strip-unneeded "$usr/lib/airlock/libairlock-preload.so" "$usr/lib/airlock/spank_airlock.so"
install -D -m 0755 slurm/airlock-slurm-task "$usr/lib/airlock/airlock-slurm-task"
install -D -m 0755 htcondor/airlock-condor-wrapper "$usr/lib/airlock/airlock-condor-wrapper"
install -D -m 0644 packaging/airlock-gateway.service "$usr/lib/systemd/system/airlock-gateway.service"
install -D -m 0644 packaging/airlock.sysusers.conf "$usr/lib/sysusers.d/airlock.conf"
install -D -m 0644 packaging/airlock.tmpfiles.conf "$usr/lib/tmpfiles.d/airlock.conf"
share=$usr/share/airlock
# Optional, so not in /usr/lib/sysctl.d: it would change every host that
# installs the package, compute nodes included (docs/install.md).
install -D -m 0644 packaging/airlock-gateway.sysctl.conf "$share/sysctl/60-airlock-gateway.conf"
# The AppArmor profile that allows /usr/bin/airlock user namespaces where
# they are restricted (Ubuntu 24.04); the .deb's postinst puts it into
# /etc/apparmor.d where the host's AppArmor can parse it.
install -D -m 0644 packaging/apparmor/airlock "$share/apparmor/airlock"
install -D -m 0644 slurm/spank_airlock.c "$share/slurm/spank_airlock.c"
install -D -m 0644 slurm/munge_job.c "$share/slurm/munge_job.c"
install -D -m 0644 slurm/munge_job.h "$share/slurm/munge_job.h"
install -D -m 0644 slurm/Makefile "$share/slurm/Makefile"
install -D -m 0755 slurm/airlock-slurm-task "$share/slurm/airlock-slurm-task"
echo "$slurm_version" >"$share/slurm/built-for-slurm"
# Man pages by section: commands (1), the gateway (8), its config file (5).
for p in docs/man/*.[158]; do
	sec=${p##*.}
	install -D -m 0644 "$p" "$usr/share/man/man$sec/$(basename "$p")"
	gzip -9n "$usr/share/man/man$sec/$(basename "$p")"
done
"$work/airlock" completion bash >"$work/bash" && install -D -m 0644 "$work/bash" "$usr/share/bash-completion/completions/airlock"
"$work/airlock" completion zsh >"$work/zsh" && install -D -m 0644 "$work/zsh" "$usr/share/zsh/vendor-completions/_airlock"
"$work/airlock" completion fish >"$work/fish" && install -D -m 0644 "$work/fish" "$usr/share/fish/vendor_completions.d/airlock.fish"
doc=$usr/share/doc/airlock
install -D -m 0644 README.md "$doc/README.md"
install -D -m 0644 LICENSE "$doc/LICENSE"
gzip -9nc CHANGELOG.md >"$doc/changelog.gz" && chmod 0644 "$doc/changelog.gz"
cp -r docs/. "$doc/"
rm -rf "$doc/man" "$doc"/*.png
find "$doc" -type d -exec chmod 0755 {} + && find "$doc" -type f -exec chmod 0644 {} +
# The licences: ours, and every Go module linked into the binary.
scripts/licenses.sh >"$doc/THIRD_PARTY_LICENSES"
# Debian's machine-readable copyright file.
{
	printf 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nUpstream-Name: airlock\nSource: https://github.com/airlock-vpn/airlock\nComment: The airlock binary links Go modules under their own licences,\n all listed with their texts in /usr/share/doc/airlock/THIRD_PARTY_LICENSES.\n\nFiles: *\nCopyright: 2026 The Airlock Authors\nLicense: MIT\n'
	sed -n '/^Permission/,$p' LICENSE | sed 's/^$/./; s/^/ /'
} >"$doc/copyright"
find "$work/pkgroot" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

# The tarball: the same files under airlock-VERSION-linux-ARCH/.
cp -a "$usr/." "$stage/"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
	--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
	-C "$work" -cf - "$name" | gzip -9n >"$out/$name.tar.gz"

# The packages. Their own files: the gateway's conffile where each family
# looks for it (Debian /etc/default, EL /etc/sysconfig, each naming its own
# path), and zsh completion where each family's zsh searches.
conf=$work/conf
mkdir -p "$conf"
install -m 0644 packaging/airlock-gateway.default "$conf/default"
sed 's|/etc/default/airlock-gateway|/etc/sysconfig/airlock-gateway|g' packaging/airlock-gateway.default >"$conf/sysconfig"
mv "$usr/share/zsh/vendor-completions/_airlock" "$conf/_airlock"
rm -r "$usr/share/zsh"
touch -d "@$SOURCE_DATE_EPOCH" "$conf"/*
arch=$goarch
pkgver=${version#v}
mtime=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
# The packages' changelog entries point at the project's changelog: the
# .deb's changelog.Debian.gz, the .rpm's %changelog (in RPM's spelling of
# the version, so that rpmlint finds it coherent).
note="Release $version; see changelog.gz"
debver=$(echo "$pkgver" | sed 's/-/~/')
printf 'airlock (%s-1) unstable; urgency=medium\n\n  * %s\n\n -- %s  %s\n' "$debver" "$note" \
	"The Airlock Authors <airlock-maintainers@lists.airlock-vpn.org>" "$(date -R -d "@$SOURCE_DATE_EPOCH")" |
	gzip -9n >"$doc/changelog.Debian.gz"
rpmver=$(echo "$pkgver" | sed 's/-/~/; s/-/_/g')-1
printf -- '- semver: %s\n  date: %s\n  packager: The Airlock Authors <airlock-maintainers@lists.airlock-vpn.org>\n  changes:\n    - note: "%s"\n' \
	"$rpmver" "$mtime" "$note" >"$work/changelog.yml"
# nfpm expands the environment in some fields only: fill in the config, and
# list the docs and man pages one by one, as documentation in the .rpm
# (%doc; nfpm leaves such entries out of a .deb, which gets them plain).
docs=$work/docs
mkdir -p "$docs/share/doc"
mv "$doc" "$docs/share/doc/"
mv "$usr/share/man" "$docs/share/"
find "$work/pkgroot" "$docs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
for fmt in deb rpm; do
	sed -e "s|\${ARCH}|$arch|g; s|\${PKG_VERSION}|$pkgver|g; s|\${MTIME}|$mtime|g" \
		-e "s|\${STAGE}|$work/pkgroot|g; s|\${CONF}|$conf|g; s|\${SLURM_VERSION}|$slurm_version|g; s|\${CHANGELOG}|$work/changelog.yml|g" \
		packaging/nfpm.yaml >"$work/nfpm-$fmt.yaml"
	if [ "$fmt" = deb ]; then
		sed -i '/^changelog:/d' "$work/nfpm-$fmt.yaml"
		type=""
	else
		rm -f "$docs/share/doc/airlock/changelog.Debian.gz"
		type="    type: doc\n"
	fi
	(cd "$docs" && find . -type f | sort) | while read -r f; do
		printf "  - src: %s\n    dst: /usr/%s\n${type}    file_info:\n      mode: 0644\n      mtime: %s\n" "$docs/${f#./}" "${f#./}" "$mtime"
	done >>"$work/nfpm-$fmt.yaml"
	go tool -modfile=tools/go.mod nfpm package --config "$work/nfpm-$fmt.yaml" --packager "$fmt" --target "$out/" >/dev/null
done
(cd "$out" && rm -f SHA256SUMS && sha256sum -- *.tar.gz *.deb *.rpm >SHA256SUMS)
echo "dist: wrote $out/:" && (cd "$out" && ls -1 && cat SHA256SUMS)
