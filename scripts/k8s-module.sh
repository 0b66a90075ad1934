# Helpers for building Kubernetes components from the Go module proxy in a
# throwaway module outside podnet's go.mod (sourced by scripts/ensure-kapi.sh
# and scripts/k8s/ensure-k8s.sh).

# k8s_gomod MODULE VERSION: prints a go.mod for MODULE that requires
# k8s.io/kubernetes@VERSION and maps every ./staging replace of its go.mod
# to the published k8s.io/* v0.X module.
k8s_gomod() {
	local module=$1 version=$2 gomod
	gomod=$(cd / && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
	[ -n "$gomod" ] || { echo "k8s_gomod: cannot download k8s.io/kubernetes@$version" >&2; return 1; }
	printf 'module %s\n\ngo 1.24.0\n\ngodebug default=go1.24\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$module" "$version"
	sed -n '/^replace (/,/^)/p' "$gomod" | awk -v v="v0.${version#v1.}" '/=> \.\/staging/ {print "\t" $1 " => " $1 " " v}'
	printf ')\n'
}

# k8s_ldflags VERSION: the -ldflags that stamp VERSION into the binaries
# (what `kubectl version` and the API server's /version report).
k8s_ldflags() {
	local version=$1 minor
	minor=$(echo "$version" | cut -d. -f2)
	echo "-s -w \
-X k8s.io/component-base/version.gitVersion=$version \
-X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$minor \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
-X k8s.io/client-go/pkg/version.gitVersion=$version \
-X k8s.io/client-go/pkg/version.gitMajor=1 \
-X k8s.io/client-go/pkg/version.gitMinor=$minor"
}

# k8s_build_start OUT: creates the cache directory OUT and a scratch
# directory $work (removed when the script exits), and sets the build
# environment (static binaries, no VCS stamping).
k8s_build_start() {
	mkdir -p "$1"
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
}
