#!/usr/bin/env bash
# Builds the test control plane from Go modules: kube-apiserver, kube-controller-manager,
# kubectl (one wrapper module pinning k8s.io/kubernetes and its staging modules) and etcd.
# Cached under ~/.cache/kthena-testbin/<key>, key = Kubernetes version, etcd version, Go
# version and this script's hash; returns at once when the binaries are there.
# Prints the directory of the binaries as the last line of stdout.
#
# Why a wrapper module: kubernetes' go.mod requires its staging modules at v0.0.0 and
# replaces them with ./staging paths, which a dependent module ignores; so each staging
# module is replaced here by its published v0.<minor>.<patch> tag (volcano's go.mod does
# the same).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.34.2}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
BINS=(kube-apiserver kube-controller-manager kubectl etcd)

command -v go >/dev/null || { echo "k8s-testbin: go is not installed (needed to build the test control plane)" >&2; exit 1; }
script_hash=$(sha256sum "$0" | cut -c1-12)
go_version=$(go env GOVERSION)
key="k8s${K8S_VERSION}-etcd${ETCD_VERSION}-${go_version}-${script_hash}"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/kthena-testbin"
out="$cache_root/$key"

have_all() {
  for b in "${BINS[@]}"; do [[ -x "$out/bin/$b" ]] || return 1; done
}
if have_all; then
  echo "$out/bin"
  exit 0
fi

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9  # one build at a time (parallel test sessions wait for the first)
if have_all; then
  echo "$out/bin"
  exit 0
fi
# older keys are stale builds of another version or script: drop them
find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +

work="$out/src"
rm -rf "$work"
mkdir -p "$work/k8s" "$work/etcd" "$out/bin"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
t0=$(date +%s)

# --- Kubernetes: wrapper module ---------------------------------------------------------
minor=${K8S_VERSION#*.}; minor=${minor%%.*}
patch=${K8S_VERSION##*.}
staging_tag="v0.${minor}.${patch}"
cd "$work/k8s"
go mod init kthena.local/k8s-testbin >/dev/null 2>&1
k8s_gomod=$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[[ -f "$k8s_gomod" ]] || { echo "k8s-testbin: cannot download k8s.io/kubernetes@v${K8S_VERSION}" >&2; exit 1; }
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#\1#p' "$k8s_gomod")
[[ ${#staging[@]} -gt 10 ]] || { echo "k8s-testbin: no staging replaces found in $k8s_gomod" >&2; exit 1; }
args=()
for m in "${staging[@]}"; do args+=("-replace=$m=$m@$staging_tag"); done
go mod edit "${args[@]}" "-require=k8s.io/kubernetes@v${K8S_VERSION}"
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubectl/pkg/cmd"
)
GO
go mod tidy >/dev/null
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
for cmd in kube-apiserver kube-controller-manager; do
  go build -trimpath -ldflags "$ldflags" -o "$out/bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
  mv "$out/bin/$cmd.tmp" "$out/bin/$cmd"
done
go build -trimpath -ldflags "$ldflags" -o "$out/bin/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl
mv "$out/bin/kubectl.tmp" "$out/bin/kubectl"

# --- etcd: a main calling etcdmain.Main ---------------------------------------------------
cd "$work/etcd"
go mod init kthena.local/etcd-testbin >/dev/null 2>&1
cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >/dev/null 2>&1
go mod tidy >/dev/null
go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd.tmp" .
mv "$out/bin/etcd.tmp" "$out/bin/etcd"

rm -rf "$work"
echo "k8s-testbin: built ${BINS[*]} in $(( $(date +%s) - t0 ))s into $out/bin" >&2
echo "$out/bin"
