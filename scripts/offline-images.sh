#!/usr/bin/env bash
# `make offline-images`: local stand-ins for every image that docker-compose.yml, the
# compose chaos override and the Dockerfile name, for a Docker engine that reaches no
# registry. Built only from what an air-gapped Debian machine has:
#   - Debian's packages, through debootstrap from the mirror this machine's apt uses;
#   - the local Go toolchain (`go env GOROOT`), for the build stage and for toxiproxy;
#   - this machine's CA bundle (module downloads inside the build may pass a proxy whose
#     CA only the host trusts).
#
# | official image (compose default)           | stand-in                                   |
# | golang:1.26-bookworm                       | fleetlimit-offline/golang:<go version>     |
# | gcr.io/distroless/static-debian12:nonroot  | fleetlimit-offline/static:nonroot          |
# | redis:7.0                                  | fleetlimit-offline/redis:bookworm          |
# | nginx:1.27-alpine                          | fleetlimit-offline/nginx:bookworm          |
# | ghcr.io/shopify/toxiproxy (chaos override) | fleetlimit-offline/toxiproxy:<version>     |
# | prom/prometheus:v2.53.5                    | fleetlimit-offline/prometheus:bookworm     |
#
# Each stand-in provides what the official image provides and our files rely on: redis
# runs as the `redis` user from /data with redis-server and redis-cli on PATH; nginx has
# the `nginx` user, /var/cache/nginx, wget and curl, `nginx -g 'daemon off;'`; the
# runtime image has the nonroot user 65532 and a CA bundle; golang has go on PATH;
# prometheus runs as nobody with its data in /prometheus (Debian's package, 2.42: older
# than the official image, and its web UI is the classic one, but the API, the rules and
# /-/ready are the same).
#
# The compose file and the Dockerfile are not changed: the image names reach them through
# compose's own `.env` file, which this script writes (REDIS_IMAGE=..., and so on). Delete
# `.env` to use the official images again. An `.env` this script did not write is left
# alone; the lines to add are printed instead.
#
# Cached: the Debian root is kept under $OFFLINE_CACHE (default ~/.cache/fleetlimit-offline)
# and every image carries a label with the hash of its inputs, so a second run only checks.
#   OFFLINE_REBUILD=1   build everything again
#   DEBIAN_MIRROR=URL   override the mirror read from apt
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

log() { echo "offline-images: $*"; }
die() {
    echo "offline-images: $*" >&2
    exit 1
}

command -v docker >/dev/null 2>&1 || die "docker not found"
docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed)"
go=$(command -v go || echo /usr/local/go/bin/go)
[[ -x $go ]] || die "go not found (the stand-in for golang is the local toolchain)"

cache=${OFFLINE_CACHE:-$HOME/.cache/fleetlimit-offline}
mkdir -p "$cache"
ca=/etc/ssl/certs/ca-certificates.crt
[[ -s $ca ]] || die "$ca missing (apt-get install ca-certificates)"

goroot=$("$go" env GOROOT)
gover=$("$go" env GOVERSION)
gover=${gover#go}
toxi_version=$(cd chaos && "$go" list -m -f '{{.Version}}' github.com/Shopify/toxiproxy/v2)
toxi_version=${toxi_version#v}

# ---- image names (also what .env gets) -------------------------------------------------
GO_IMAGE=fleetlimit-offline/golang:$gover
RUNTIME_IMAGE=fleetlimit-offline/static:nonroot
REDIS_IMAGE=fleetlimit-offline/redis:bookworm
NGINX_IMAGE=fleetlimit-offline/nginx:bookworm
TOXIPROXY_IMAGE=fleetlimit-offline/toxiproxy:$toxi_version
PROMETHEUS_IMAGE=fleetlimit-offline/prometheus:bookworm
BASE_IMAGE=fleetlimit-offline/debian:bookworm

# inputs_hash WORDS...: a short hash of strings and of the named files' contents.
inputs_hash() {
    local a
    for a in "$@"; do
        if [[ -f $a ]]; then sha256sum "$a"; else echo "$a"; fi
    done | sha256sum | cut -c1-16
}

# fresh IMAGE HASH: the image exists and carries that input hash.
fresh() {
    [[ -z ${OFFLINE_REBUILD:-} ]] || return 1
    local got
    got=$(docker image inspect -f '{{index .Config.Labels "fleetlimit.offline.inputs"}}' "$1" 2>/dev/null) || return 1
    [[ $got == "$2" ]]
}

# ---- 1. the Debian root (debootstrap) --------------------------------------------------
# shellcheck source=/dev/null
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
packages=redis-server,redis-tools,nginx-light,ca-certificates,curl,wget,procps,prometheus
if [[ -z ${DEBIAN_MIRROR:-} ]]; then
    # The first Debian main archive apt knows for this suite, e.g.
    # " 500 http://deb.debian.org/debian bookworm/main amd64 Packages".
    DEBIAN_MIRROR=$(apt-cache policy 2>/dev/null |
        awk -v s="$suite/main" '$3 == s && $2 ~ /^(https?|file):/ { print $2; exit }')
fi
base_hash=$(inputs_hash "$suite" "$packages" "$ca" v1)
if fresh "$BASE_IMAGE" "$base_hash"; then
    log "$BASE_IMAGE is current"
else
    [[ -n ${DEBIAN_MIRROR:-} ]] ||
        die "no Debian mirror for $suite/main in apt's sources (run apt-get update, or set DEBIAN_MIRROR)"
    if ! command -v debootstrap >/dev/null 2>&1; then
        if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
            die "debootstrap missing: apt-get install debootstrap"
        fi
        log "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    fi
    tarball=$cache/debian-$suite-$base_hash.tar
    if [[ ! -s $tarball || -n ${OFFLINE_REBUILD:-} ]]; then
        rootfs=$cache/rootfs-$suite
        rm -rf "$rootfs"
        log "debootstrap $suite from $DEBIAN_MIRROR (about a minute)"
        debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$DEBIAN_MIRROR" \
            >"$cache/debootstrap.log" 2>&1 || {
            tail -n 20 "$cache/debootstrap.log" >&2
            die "debootstrap failed (log: $cache/debootstrap.log)"
        }
        # The host's CA bundle, so TLS through an intercepting proxy verifies inside.
        cp "$ca" "$rootfs/etc/ssl/certs/ca-certificates.crt"
        # Small: no apt lists, caches or docs.
        rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
            "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/usr/share/doc/* \
            "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
        tar -C "$rootfs" -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
    fi
    log "importing $BASE_IMAGE"
    docker import --change "LABEL fleetlimit.offline.inputs=$base_hash" \
        --change 'CMD ["bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
fi

# build IMAGE HASH DOCKERFILE [CONTEXT]: docker build from a Dockerfile on stdin.
build() {
    local image=$1 hash=$2 dockerfile=$3 context=${4:-}
    if fresh "$image" "$hash"; then
        log "$image is current"
        return
    fi
    log "building $image"
    if [[ -z $context ]]; then
        context=$(mktemp -d)
        # shellcheck disable=SC2064 # expand now
        trap "rm -rf '$context'" RETURN
    fi
    printf '%s\nLABEL fleetlimit.offline.inputs=%s\n' "$dockerfile" "$hash" |
        DOCKER_BUILDKIT=0 docker build -q -t "$image" -f - "$context" >/dev/null
}

# ---- 2. redis (official: redis:7.0) ----------------------------------------------------
# The official entrypoint chowns /data and drops to the redis user when the command is
# redis-server; this one does the same with setpriv (util-linux, in every Debian root).
build "$REDIS_IMAGE" "$(inputs_hash "$base_hash" redis-v1)" "
FROM $BASE_IMAGE
RUN mkdir -p /data /usr/local/etc/redis && chown redis:redis /data && \\
    printf '%s\n' '#!/bin/sh' 'set -e' \\
      'if [ \"\${1#-}\" != \"\$1\" ] || [ \"\${1%.conf}\" != \"\$1\" ]; then set -- redis-server \"\$@\"; fi' \\
      'if [ \"\$1\" = redis-server ] && [ \"\$(id -u)\" = 0 ]; then' \\
      '  find . \\! -user redis -exec chown redis \"{}\" + 2>/dev/null || true' \\
      '  exec setpriv --reuid=redis --regid=redis --init-groups \"\$@\"' \\
      'fi' 'exec \"\$@\"' >/usr/local/bin/docker-entrypoint.sh && \\
    chmod 755 /usr/local/bin/docker-entrypoint.sh
VOLUME /data
WORKDIR /data
EXPOSE 6379
ENTRYPOINT [\"docker-entrypoint.sh\"]
CMD [\"redis-server\"]
"

# ---- 3. nginx (official: nginx:1.27-alpine) --------------------------------------------
build "$NGINX_IMAGE" "$(inputs_hash "$base_hash" nginx-v1)" "
FROM $BASE_IMAGE
RUN groupadd --system nginx && \\
    useradd --system --gid nginx --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nginx && \\
    mkdir -p /var/cache/nginx /var/log/nginx && \\
    ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD [\"nginx\", \"-g\", \"daemon off;\"]
"

# ---- 4. golang (official: golang:1.26-bookworm) ----------------------------------------
go_hash=$(inputs_hash "$base_hash" "$gover" golang-v1)
if ! fresh "$GO_IMAGE" "$go_hash"; then
    # The toolchain as an image layer of its own (docker import of a tar stream), copied
    # into the Debian root by the build.
    log "importing the local Go toolchain ($goroot, go $gover)"
    tar -C "$goroot/.." -cf - --transform "s,^$(basename "$goroot"),usr/local/go," "$(basename "$goroot")" |
        docker import - fleetlimit-offline/go-toolchain:"$gover" >/dev/null
fi
build "$GO_IMAGE" "$go_hash" "
FROM fleetlimit-offline/go-toolchain:$gover AS toolchain
FROM $BASE_IMAGE
COPY --from=toolchain /usr/local/go /usr/local/go
ENV GOPATH=/go PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN mkdir -p /go/bin /go/src && go version
WORKDIR /go
"
docker image rm fleetlimit-offline/go-toolchain:"$gover" >/dev/null 2>&1 || true

# ---- 5. the runtime (official: gcr.io/distroless/static-debian12:nonroot) ---------------
# distroless static: passwd and group with root, nobody and nonroot (65532), a CA bundle,
# /tmp, the nonroot home; no shell. Made from a tar, not from Debian.
static_hash=$(inputs_hash "$ca" static-v1)
if fresh "$RUNTIME_IMAGE" "$static_hash"; then
    log "$RUNTIME_IMAGE is current"
else
    log "building $RUNTIME_IMAGE"
    d=$(mktemp -d)
    mkdir -p "$d/etc/ssl/certs" "$d/tmp" "$d/home/nonroot"
    chmod 1777 "$d/tmp"
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
        'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
        'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$d/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' >"$d/etc/group"
    printf 'hosts: files dns\n' >"$d/etc/nsswitch.conf"
    cp "$ca" "$d/etc/ssl/certs/ca-certificates.crt"
    tar -C "$d" --numeric-owner --owner=0 --group=0 --exclude=./home/nonroot -cf "$d.tar" .
    # the home belongs to nonroot
    tar -C "$d" --numeric-owner --owner=65532 --group=65532 --no-recursion -rf "$d.tar" ./home/nonroot
    docker import --change "LABEL fleetlimit.offline.inputs=$static_hash" \
        --change 'USER 65532:65532' --change 'WORKDIR /home/nonroot' \
        --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
        "$d.tar" "$RUNTIME_IMAGE" >/dev/null
    rm -rf "$d" "$d.tar"
fi

# ---- 6. toxiproxy (official: ghcr.io/shopify/toxiproxy; the compose chaos override) -----
# The server built from its Go module (the version chaos/go.mod requires as a tool), static,
# at /toxiproxy as in the official image.
toxi_hash=$(inputs_hash "$toxi_version" "$gover" toxiproxy-v1)
if fresh "$TOXIPROXY_IMAGE" "$toxi_hash"; then
    log "$TOXIPROXY_IMAGE is current"
else
    log "building $TOXIPROXY_IMAGE (toxiproxy v$toxi_version from the module proxy)"
    d=$(mktemp -d)
    (cd chaos && CGO_ENABLED=0 "$go" build -trimpath -o "$d/toxiproxy" github.com/Shopify/toxiproxy/v2/cmd/server)
    tar -C "$d" --numeric-owner --owner=0 --group=0 -cf "$d.tar" toxiproxy
    docker import --change "LABEL fleetlimit.offline.inputs=$toxi_hash" \
        --change 'ENTRYPOINT ["/toxiproxy"]' --change 'CMD ["-host=0.0.0.0"]' \
        --change 'EXPOSE 8474' "$d.tar" "$TOXIPROXY_IMAGE" >/dev/null
    rm -rf "$d" "$d.tar"
fi

# ---- 7. prometheus (official: prom/prometheus:v2.53.5) ---------------------------------
# Debian's package, from the Debian root, run as the official image runs it: as nobody,
# from /prometheus. docker-compose.yml gives the whole command line.
build "$PROMETHEUS_IMAGE" "$(inputs_hash "$base_hash" prometheus-v1)" "
FROM $BASE_IMAGE
RUN mkdir -p /prometheus && chown nobody:nogroup /prometheus && prometheus --version
USER nobody
WORKDIR /prometheus
VOLUME /prometheus
EXPOSE 9090
ENTRYPOINT [\"/usr/bin/prometheus\"]
CMD [\"--config.file=/etc/prometheus/prometheus.yml\", \"--storage.tsdb.path=/prometheus\"]
"

# ---- 8. .env: the names, for compose -------------------------------------------------
marker="# written by make offline-images (scripts/offline-images.sh); delete to use the official images"
env_lines=(
    "GO_IMAGE=$GO_IMAGE"
    "RUNTIME_IMAGE=$RUNTIME_IMAGE"
    "REDIS_IMAGE=$REDIS_IMAGE"
    "NGINX_IMAGE=$NGINX_IMAGE"
    "TOXIPROXY_IMAGE=$TOXIPROXY_IMAGE"
    "PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE"
)
if [[ -f .env ]] && [[ $(head -n 1 .env) != "$marker" ]]; then
    log ".env exists and was not written by this script: add these lines to it yourself:"
    printf '  %s\n' "${env_lines[@]}"
else
    printf '%s\n' "$marker" "${env_lines[@]}" >.env
    log "wrote $root/.env (compose reads it): ${env_lines[*]}"
fi
log "done: make up (or docker compose up) now builds and runs without a registry"
