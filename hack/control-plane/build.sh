#!/usr/bin/env bash
# Build (once) and cache the binaries of the test control plane: kube-apiserver, etcd and kwok,
# kube-scheduler and kube-controller-manager (the DRA tests: kube-scheduler allocates claims, the
# controller manager's resource claim controller makes a pod's claims from its templates), and
# the two test tools beside them: kubectl (the README's install steps are run with it) and
# promtool (checks the operator's and the agent's metrics endpoints). With --bench also the
# benchmark's toxiproxy (its network faults); `make test` never builds it.
#
#   hack/control-plane/build.sh              ensure the binaries exist; print the bin dir (last line)
#   hack/control-plane/build.sh --bench      the same, plus toxiproxy
#   hack/control-plane/build.sh --print-dir  print the bin dir only; build nothing
#   hack/control-plane/build.sh HARNESS      ensure a kubelet conformance harness exists; print
#                                            its path (last line). HARNESS is
#                                            deviceplugin-conformance (hack/deviceplugin-conformance:
#                                            kubelet's device manager at K8S_VERSION) or
#                                            dra-conformance (hack/dra-conformance: kubelet's DRA
#                                            manager and plugin watcher, and the CDI library)
#   hack/control-plane/build.sh --print-path HARNESS
#                                            print that path only; build nothing
#   hack/control-plane/build.sh observability
#                                            ensure the Prometheus server (same version as
#                                            promtool) and helm exist, linked into the bin dir
#                                            beside the others; print the bin dir (last line).
#                                            Only the dashboard and chart tests use them.
#   hack/control-plane/build.sh kueue
#                                            ensure Kueue's controller manager (KUEUE_VERSION)
#                                            exists with its CRDs and webhook configurations
#                                            beside it (crd/ and webhooks.yaml, copied from its
#                                            module's config/components), linked into the bin
#                                            dir as kueue, kueue-crd and kueue-webhooks.yaml;
#                                            print the bin dir (last line). Only the Kueue
#                                            tests use it.
#   hack/control-plane/build.sh karpenter
#                                            ensure Karpenter's controller with its KWOK cloud
#                                            provider (KARPENTER_VERSION) exists with its CRDs
#                                            beside it (crd/: NodePool, NodeClaim, NodeOverlay
#                                            and KWOKNodeClass, copied from its module's KWOK
#                                            chart), linked
#                                            into the bin dir as karpenter and karpenter-crd;
#                                            print the bin dir (last line). Only the autoscaling
#                                            tests use it.
#
# Each binary is cached outside the repository, per component and version:
#   ${VGPU_CACHE_DIR:-$HOME/.cache/vgpu-operator}/bin/<component>-<version>/<component>
# and a combined directory of symlinks to all five is what tests use (VGPU_CONTROL_PLANE_BIN_DIR).
# kubectl, kube-scheduler and kube-controller-manager are built from the kube-apiserver wrapper's
# go.mod/go.sum (same module versions, so they reuse most of Go's build cache). toxiproxy is
# linked into the combined directory under its own name.
# A conformance harness is our own source, so its cache key also carries a hash of that source:
#   .../bin/<harness>-<K8S_VERSION>-<hash>/<harness>
# Its go.mod has kube-apiserver's module versions, so after the control plane only its own
# few dozen packages (kubelet's, cadvisor's, the CDI library's) are compiled.
# A cached binary is trusted only if `<binary> --version` reports the expected version.
# If $KUBEBUILDER_ASSETS holds kube-apiserver and etcd, those are used instead of building them
# (kwok, kubectl and promtool are still built and cached).
#
# Progress goes to stderr; only the directory goes to stdout.
# Environment: VGPU_CACHE_DIR, KUBEBUILDER_ASSETS, GO (go command), GOMODCACHE/GOCACHE (Go's own).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
. "$HERE/versions.env"

CACHE_DIR=${VGPU_CACHE_DIR:-${HOME:?HOME is not set}/.cache/vgpu-operator}
BIN_ROOT="$CACHE_DIR/bin"

log() { printf '[control-plane] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

use_kubebuilder_assets() {
    [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" ]]
}

if use_kubebuilder_assets; then
    COMBINED="$BIN_ROOT/control-plane-kubebuilder-assets-kwok-$KWOK_VERSION"
else
    COMBINED="$BIN_ROOT/control-plane-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
fi

# --- the kubelet conformance harnesses (our source: keyed by version and a source hash) -------------
HARNESSES=(deviceplugin-conformance dra-conformance)
is_harness() { [[ " ${HARNESSES[*]} " == *" $1 "* ]]; }
harness_src() { printf '%s' "$HERE/../$1"; }
harness_hash() { # <harness>
    (cd "$(harness_src "$1")" && cat go.mod go.sum ./*.go) | sha256sum | cut -c1-12
}
harness_path() { # <harness>
    printf '%s' "$BIN_ROOT/$1-$K8S_VERSION-$(harness_hash "$1")/$1"
}

if [[ "${1:-}" == "--print-dir" ]]; then
    printf '%s\n' "$COMBINED"
    exit 0
fi
if [[ "${1:-}" == "--print-path" && $# -eq 2 ]] && is_harness "$2"; then
    harness_path "$2"; printf '\n'
    exit 0
fi
BENCH=0 ONLY_HARNESS="" ONLY_OBSERVABILITY=0 ONLY_KUEUE=0 ONLY_KARPENTER=0
if [[ "${1:-}" == "--bench" ]]; then
    BENCH=1
    shift
elif [[ $# -gt 0 ]] && is_harness "$1"; then
    ONLY_HARNESS=$1
    shift
elif [[ "${1:-}" == "observability" ]]; then
    ONLY_OBSERVABILITY=1
    shift
elif [[ "${1:-}" == "kueue" ]]; then
    ONLY_KUEUE=1
    shift
elif [[ "${1:-}" == "karpenter" ]]; then
    ONLY_KARPENTER=1
    shift
fi
[[ $# -eq 0 ]] || die "usage: $0 [--bench | --print-dir | HARNESS | --print-path HARNESS | observability | kueue | karpenter] (HARNESS: ${HARNESSES[*]})"

# --- Go environment -------------------------------------------------------------------------------
GO=${GO:-}
if [[ -z "$GO" ]]; then
    if command -v go >/dev/null 2>&1; then GO=go
    elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
    fi
fi
export GOTOOLCHAIN=local   # never fetch another toolchain
export GOWORK=off          # the wrappers are stand-alone modules
export CGO_ENABLED=0       # static binaries, no C compiler needed
# -mod=mod: resolve from the wrapper's go.mod/go.sum (never a vendor dir); go.sum pins checksums.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod -buildvcs=false"
JOBS=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)

# expected version substring printed by `<bin> --version` (`kubectl version --client`)
expected_version() {
    if is_harness "$1"; then
        printf '%s kubelet %s source %s' "$1" "$K8S_VERSION" "$(harness_hash "$1")"
        return
    fi
    case "$1" in
        kube-apiserver | kube-scheduler | kube-controller-manager) printf 'Kubernetes %s' "$K8S_VERSION" ;;
        toxiproxy) printf 'toxiproxy-server version %s' "${TOXIPROXY_VERSION#v}" ;;
        kubectl) printf 'Client Version: %s' "$K8S_VERSION" ;;
        etcd) printf 'etcd Version: %s' "${ETCD_VERSION#v}" ;;
        kwok) printf 'kwok version %s' "$KWOK_VERSION" ;;
        promtool) printf 'promtool, version %s ' "${PROMTOOL_VERSION#v}" ;;
        prometheus) printf 'prometheus, version %s ' "${PROMTOOL_VERSION#v}" ;;
        helm) printf 'Version:"%s"' "$HELM_VERSION" ;;
        kueue) printf 'kueue %s' "$KUEUE_VERSION" ;;
        karpenter) printf 'karpenter %s' "$KARPENTER_VERSION" ;;
    esac
}

version_output() { # <path> <component>
    if is_harness "$2"; then "$1" -version 2>&1; return; fi
    case "$2" in
        kubectl) "$1" version --client 2>&1 ;;
        toxiproxy) "$1" -version 2>&1 ;;
        helm) "$1" version 2>&1 ;;
        # Kueue's manager has no version flag (it logs its version when it starts): the build
        # writes a stamp beside it, and the CRDs copied from the same module must be there too.
        kueue) [[ -s "$(dirname "$1")/crd/kueue.x-k8s.io_workloads.yaml" && -s "$(dirname "$1")/webhooks.yaml" ]] \
            && cat "$1.version" 2>&1 ;;
        # Neither has Karpenter (its version is only logged): a stamp, and its CRDs beside it.
        karpenter) [[ -s "$(dirname "$1")/crd/karpenter.sh_nodeclaims.yaml" \
            && -s "$(dirname "$1")/crd/karpenter.kwok.sh_kwoknodeclasses.yaml" ]] \
            && cat "$1.version" 2>&1 ;;
        *) "$1" --version 2>&1 ;;
    esac
}

binary_ok() { # <path> <component>
    local out
    [[ -x "$1" ]] || return 1
    out=$(version_output "$1" "$2") || return 1
    [[ "$out" == *"$(expected_version "$2")"* ]]
}

check_go() {
    [[ -n "$GO" ]] || die "go not found: install Go >= 1.26 or set GO=/path/to/go"
    local v
    v=$("$GO" env GOVERSION) || die "'$GO env GOVERSION' failed"
    v=${v#go}
    local major=${v%%.*} rest=${v#*.}
    local minor=${rest%%[^0-9]*}
    if (( major < 1 || (major == 1 && minor < 26) )); then
        die "Go >= 1.26 is needed (kwok $KWOK_VERSION requires it); $GO is go$v"
    fi
}

component_version() {
    if is_harness "$1"; then printf '%s-%s' "$K8S_VERSION" "$(harness_hash "$1")"; return; fi
    case "$1" in
        kube-apiserver | kubectl | kube-scheduler | kube-controller-manager) printf '%s' "$K8S_VERSION" ;;
        toxiproxy) printf '%s' "$TOXIPROXY_VERSION" ;;
        etcd) printf '%s' "$ETCD_VERSION" ;;
        kwok) printf '%s' "$KWOK_VERSION" ;;
        promtool) printf '%s' "$PROMTOOL_VERSION" ;;
        prometheus) printf '%s' "$PROMTOOL_VERSION" ;;
        helm) printf '%s' "$HELM_VERSION" ;;
        kueue) printf '%s' "$KUEUE_VERSION" ;;
        karpenter) printf '%s' "$KARPENTER_VERSION" ;;
    esac
}

# the wrapper module a component is built from (kubectl, kube-scheduler and kube-controller-manager
# share kube-apiserver's)
wrapper_dir() {
    if is_harness "$1"; then harness_src "$1"; return; fi
    case "$1" in
        kubectl | kube-scheduler | kube-controller-manager) printf '%s' "$HERE/kube-apiserver" ;;
        *) printf '%s' "$HERE/$1" ;;
    esac
}

check_wrapper_version() { # <component> <module path> <version>
    local mod
    mod="$(wrapper_dir "$1")/go.mod"
    grep -Eq "^[[:space:]]*(require[[:space:]]+)?$2 $3( |\$)" "$mod" \
        || die "$mod does not require $2 $3 (versions.env and go.mod disagree)"
}

go_build() { # <component> <workdir> <package> <output> <ldflags> [tags]
    local component=$1 work=$2 pkg=$3 out=$4 ldflags=$5 tags=${6:-}
    local blog="$work/build.log" start=$SECONDS
    log "$component: step 1/2: downloading modules (go mod download)"
    if ! (cd "$work" && "$GO" mod download) >"$blog" 2>&1; then
        tail -n 40 "$blog" >&2; die "$component: go mod download failed"
    fi
    log "$component: modules ready after $((SECONDS - start))s"
    log "$component: step 2/2: compiling $pkg (-p $JOBS; progress every 100 packages)"
    local -a args=(build -v -p "$JOBS" -trimpath -ldflags "$ldflags" -o "$out")
    [[ -n "$tags" ]] && args+=(-tags "$tags")
    if ! (cd "$work" && "$GO" "${args[@]}" "$pkg") 2>&1 | tee -a "$blog" \
        | awk -v c="$component" 'NR % 100 == 0 { printf "[control-plane] %s: %d packages compiled\n", c, NR > "/dev/stderr"; fflush("/dev/stderr") }'; then
        tail -n 40 "$blog" >&2; die "$component: go build failed (full log: $blog)"
    fi
    log "$component: built in $((SECONDS - start))s"
}

build_component() { # <component>
    local c=$1 version dest dir work ldflags tags="" pkg
    version=$(component_version "$c")
    dir="$BIN_ROOT/$c-$version"
    dest="$dir/$c"
    if binary_ok "$dest" "$c"; then
        log "$c $version: cached at $dest"
        return 0
    fi
    check_go
    log "$c $version: not cached; building with $("$GO" version) (this is slow the first time)"
    mkdir -p "$BIN_ROOT"
    work=$(mktemp -d "$BIN_ROOT/.build-$c.XXXXXX")
    # Build in a copy so the repository's go.mod/go.sum are never modified.
    cp "$(wrapper_dir "$c")/go.mod" "$(wrapper_dir "$c")/go.sum" "$work/"
    case "$c" in
        deviceplugin-conformance | dra-conformance)
            # Our own source too; the same tags as kube-apiserver so Go's build cache is shared.
            cp "$(harness_src "$c")"/*.go "$work/"
            check_wrapper_version "$c" k8s.io/kubernetes "$K8S_VERSION"
            ldflags="-s -w -X main.kubernetesVersion=$K8S_VERSION -X main.sourceHash=$(harness_hash "$c")"
            tags="selinux,notest,grpcnotrace"
            pkg=.
            ;;
        kube-apiserver | kubectl | kube-scheduler | kube-controller-manager)
            check_wrapper_version "$c" k8s.io/kubernetes "$K8S_VERSION"
            local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
            local date p
            date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
            ldflags="-s -w"
            for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
                ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
                ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
            done
            tags="selinux,notest,grpcnotrace"
            pkg=k8s.io/kubernetes/cmd/$c
            ;;
        etcd)
            check_wrapper_version "$c" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
            ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION"
            pkg=go.etcd.io/etcd/server/v3
            ;;
        kwok)
            check_wrapper_version "$c" sigs.k8s.io/kwok "$KWOK_VERSION"
            ldflags="-s -w"
            pkg=sigs.k8s.io/kwok/cmd/kwok
            ;;
        toxiproxy)
            check_wrapper_version "$c" github.com/Shopify/toxiproxy/v2 "$TOXIPROXY_VERSION"
            ldflags="-s -w -X github.com/Shopify/toxiproxy/v2.Version=${TOXIPROXY_VERSION#v}"
            pkg=github.com/Shopify/toxiproxy/v2/cmd/server
            ;;
        promtool)
            # Prometheus v3.<minor>.<patch> is Go module v0.<minor, 3 digits>.<patch>.
            local v=${PROMTOOL_VERSION#v3.} minor patch
            minor=${v%%.*}; patch=${v#*.}
            check_wrapper_version "$c" github.com/prometheus/prometheus "$(printf 'v0.%d%02d.%s' 3 "$minor" "$patch")"
            ldflags="-s -w -X github.com/prometheus/common/version.Version=${PROMTOOL_VERSION#v}"
            ldflags+=" -X github.com/prometheus/common/version.Revision=module-$PROMTOOL_VERSION"
            # remove_all_sd: leave out the service-discovery plugins (cloud SDKs) the checks never use
            tags="remove_all_sd"
            pkg=github.com/prometheus/prometheus/cmd/promtool
            ;;
        prometheus)
            # The server, from the same Prometheus release as promtool (PROMTOOL_VERSION).
            local v=${PROMTOOL_VERSION#v3.} minor patch
            minor=${v%%.*}; patch=${v#*.}
            check_wrapper_version "$c" github.com/prometheus/prometheus "$(printf 'v0.%d%02d.%s' 3 "$minor" "$patch")"
            ldflags="-s -w -X github.com/prometheus/common/version.Version=${PROMTOOL_VERSION#v}"
            ldflags+=" -X github.com/prometheus/common/version.Revision=module-$PROMTOOL_VERSION"
            # remove_all_sd: no cloud service discovery (the test scrapes static targets);
            # without builtinassets the web UI is not embedded (the API is all the test uses)
            tags="remove_all_sd"
            pkg=github.com/prometheus/prometheus/cmd/prometheus
            ;;
        helm)
            check_wrapper_version "$c" helm.sh/helm/v3 "$HELM_VERSION"
            local k8s_minor
            k8s_minor=$(sed -nE 's/^[[:space:]]*k8s\.io\/client-go v0\.([0-9]+)\..*/\1/p' "$(wrapper_dir "$c")/go.mod")
            [[ -n "$k8s_minor" ]] || die "helm: no k8s.io/client-go in $(wrapper_dir "$c")/go.mod"
            ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
            # What `helm lint` and `helm template` take as the cluster's version, as helm's
            # own Makefile sets it: the Kubernetes modules it is built with.
            local p
            for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
                ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$k8s_minor"
            done
            pkg=helm.sh/helm/v3/cmd/helm
            ;;
        kueue)
            check_wrapper_version "$c" sigs.k8s.io/kueue "$KUEUE_VERSION"
            ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
            ldflags+=" -X sigs.k8s.io/kueue/pkg/version.GitCommit=module-$KUEUE_VERSION"
            pkg=sigs.k8s.io/kueue/cmd/kueue
            ;;
        karpenter)
            check_wrapper_version "$c" sigs.k8s.io/karpenter "$KARPENTER_VERSION"
            ldflags="-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version=$KARPENTER_VERSION"
            pkg=sigs.k8s.io/karpenter/kwok
            ;;
        *) die "unknown component $c" ;;
    esac
    go_build "$c" "$work" "$pkg" "$work/$c" "$ldflags" "$tags"
    if [[ "$c" == kueue ]]; then
        # Its CRDs, from the module just built (the same version), and the version stamp.
        local moddir
        moddir=$(cd "$work" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kueue) \
            || die "kueue: module directory not found"
        mkdir -p "$work/crd"
        cp "$moddir"/config/components/crd/bases/*.yaml "$work/crd/"
        cp "$moddir"/config/components/webhook/manifests.yaml "$work/webhooks.yaml"
        chmod u+w "$work"/crd/*.yaml "$work/webhooks.yaml"
        expected_version kueue >"$work/$c.version"
    fi
    if [[ "$c" == karpenter ]]; then
        # NodePool, NodeClaim and NodeOverlay as the KWOK provider's chart installs them
        # (the core's, with the provider's label rules) and its KWOKNodeClass: from the
        # module just built (the same version), and the version stamp.
        local moddir
        moddir=$(cd "$work" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/karpenter) \
            || die "karpenter: module directory not found"
        mkdir -p "$work/crd"
        cp "$moddir"/kwok/charts/crds/*.yaml "$moddir"/kwok/apis/crds/*.yaml "$work/crd/"
        chmod u+w "$work"/crd/*.yaml
        expected_version karpenter >"$work/$c.version"
    fi
    binary_ok "$work/$c" "$c" || die "$c: built binary does not report '$(expected_version "$c")': $(version_output "$work/$c" "$c" | head -n 3)"
    mkdir -p "$dir"
    if [[ "$c" == kueue ]]; then
        rm -rf "$dir/crd" && mv "$work/crd" "$dir/crd"
        mv -f "$work/webhooks.yaml" "$dir/webhooks.yaml"
        mv -f "$work/$c.version" "$dest.version"
    fi
    if [[ "$c" == karpenter ]]; then
        rm -rf "$dir/crd" && mv "$work/crd" "$dir/crd"
        mv -f "$work/$c.version" "$dest.version"
    fi
    mv -f "$work/$c" "$dest.tmp.$$" && mv -f "$dest.tmp.$$" "$dest"
    rm -rf "$work"
    log "$c $version: installed $dest"
}

link_into_combined() { # <component> <source binary>
    ln -sfn "$2" "$COMBINED/$1"
}

lock() {
    mkdir -p "$BIN_ROOT"
    # Serialise concurrent runs (two make invocations, CI matrix jobs sharing a cache).
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$BIN_ROOT/.lock"
        flock 9
    fi
}

build_harness() { # <harness>
    lock
    build_component "$1"
    harness_path "$1"; printf '\n'
}

main() {
    lock
    local total=$SECONDS
    local -a components=(kwok kubectl promtool)
    if use_kubebuilder_assets; then
        log "using kube-apiserver and etcd from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
    else
        components=(etcd kwok kube-apiserver kubectl promtool)
    fi
    components+=(kube-scheduler kube-controller-manager)
    (( BENCH )) && components+=(toxiproxy)
    local c
    for c in "${components[@]}"; do
        build_component "$c"
    done
    mkdir -p "$COMBINED"
    if use_kubebuilder_assets; then
        link_into_combined kube-apiserver "$KUBEBUILDER_ASSETS/kube-apiserver"
        link_into_combined etcd "$KUBEBUILDER_ASSETS/etcd"
    else
        link_into_combined kube-apiserver "$BIN_ROOT/kube-apiserver-$K8S_VERSION/kube-apiserver"
        link_into_combined etcd "$BIN_ROOT/etcd-$ETCD_VERSION/etcd"
    fi
    link_into_combined kwok "$BIN_ROOT/kwok-$KWOK_VERSION/kwok"
    link_into_combined kubectl "$BIN_ROOT/kubectl-$K8S_VERSION/kubectl"
    link_into_combined promtool "$BIN_ROOT/promtool-$PROMTOOL_VERSION/promtool"
    link_into_combined kube-scheduler "$BIN_ROOT/kube-scheduler-$K8S_VERSION/kube-scheduler"
    link_into_combined kube-controller-manager \
        "$BIN_ROOT/kube-controller-manager-$K8S_VERSION/kube-controller-manager"
    if (( BENCH )); then
        link_into_combined toxiproxy "$BIN_ROOT/toxiproxy-$TOXIPROXY_VERSION/toxiproxy"
    fi
    log "all binaries ready in $COMBINED ($((SECONDS - total))s)"
    printf '%s\n' "$COMBINED"
}

# The dashboard's Prometheus and the chart's helm, for their tests only (`make test`), linked
# into the combined directory beside the others.
build_observability() {
    lock
    local total=$SECONDS c
    for c in prometheus helm; do
        build_component "$c"
    done
    mkdir -p "$COMBINED"
    link_into_combined prometheus "$BIN_ROOT/prometheus-$PROMTOOL_VERSION/prometheus"
    link_into_combined helm "$BIN_ROOT/helm-$HELM_VERSION/helm"
    log "prometheus and helm ready in $COMBINED ($((SECONDS - total))s)"
    printf '%s\n' "$COMBINED"
}

# Kueue's controller manager and its CRDs, for the Kueue tests only (`make kueue`, which
# `make test` runs), linked into the combined directory as kueue and kueue-crd.
build_kueue() {
    lock
    local total=$SECONDS dir="$BIN_ROOT/kueue-$KUEUE_VERSION"
    build_component kueue
    mkdir -p "$COMBINED"
    link_into_combined kueue "$dir/kueue"
    link_into_combined kueue-crd "$dir/crd"
    link_into_combined kueue-webhooks.yaml "$dir/webhooks.yaml"
    log "kueue ready in $COMBINED ($((SECONDS - total))s)"
    printf '%s\n' "$COMBINED"
}

# Karpenter's controller (its KWOK provider) and its CRDs, for the autoscaling tests only
# (`make karpenter`, which `make test` runs), linked into the combined directory as
# karpenter and karpenter-crd.
build_karpenter() {
    lock
    local total=$SECONDS dir="$BIN_ROOT/karpenter-$KARPENTER_VERSION"
    build_component karpenter
    mkdir -p "$COMBINED"
    link_into_combined karpenter "$dir/karpenter"
    link_into_combined karpenter-crd "$dir/crd"
    log "karpenter ready in $COMBINED ($((SECONDS - total))s)"
    printf '%s\n' "$COMBINED"
}

if [[ -n "$ONLY_HARNESS" ]]; then build_harness "$ONLY_HARNESS"; exit; fi
if (( ONLY_KUEUE )); then build_kueue; exit; fi
if (( ONLY_KARPENTER )); then build_karpenter; exit; fi
if (( ONLY_OBSERVABILITY )); then build_observability; exit; fi
main "$@"; exit
