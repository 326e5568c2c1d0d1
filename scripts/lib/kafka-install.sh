# shellcheck shell=bash
# Kafka install steps and CLI runner shared by scripts/kafka.sh and
# scripts/kafka-cluster.sh (sourced after lib/common.sh with SCRIPT_DIR set, not run).

KAFKA_VERSION="${BUS_KAFKA_VERSION:-4.4.0}"
KAFKA_HOST=127.0.0.1
KAFKA_POM="$SCRIPT_DIR/kafka/pom.xml"
KAFKA_LOG4J="$SCRIPT_DIR/kafka/log4j2.properties"
KAFKA_TOOLS_LOG4J="$SCRIPT_DIR/kafka/log4j2-tools.properties"
KAFKA_LIBS="$BUS_BROKER_HOME/kafka-libs-$KAFKA_VERSION"
KAFKA_MARKER="$KAFKA_LIBS/.complete"
# Small footprint: serial GC (2 cores), no JIT profiling tiers for the short-lived CLI JVMs.
BROKER_JVM_OPTS="-XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true ${BUS_KAFKA_JVM_OPTS:-}"
TOOLS_JVM_OPTS="-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true"


# ---------------------------------------------------------------- java / maven
java_bin() {
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then echo "$JAVA_HOME/bin/java"; return 0; fi
  command -v java 2>/dev/null
}

java_major() { # java_major JAVA: feature version (17, 21, ...)
  "$1" -XshowSettings:properties -version 2>&1 \
    | sed -n 's/^ *java\.specification\.version = //p' | head -n1 | sed 's/^1\.//; s/\..*//'
}

ensure_java() {
  local j m
  if j="$(java_bin)" && m="$(java_major "$j")" && [ "${m:-0}" -ge 17 ]; then return 0; fi
  log "Java 17+ not found (Kafka 4 needs it); installing a JRE"
  local pkg
  apt_update_once
  for pkg in openjdk-17-jre-headless openjdk-21-jre-headless default-jre-headless; do
    if apt-cache show "$pkg" >/dev/null 2>&1; then apt_install "$pkg"; break; fi
  done
  j="$(java_bin)" && m="$(java_major "$j")" && [ "${m:-0}" -ge 17 ] \
    || die "no Java 17+ after install (set JAVA_HOME to a JDK 17+)"
}

ensure_maven() {
  command -v mvn >/dev/null 2>&1 || apt_install maven
}

libs_complete() {
  [ -f "$KAFKA_MARKER" ] && [ -f "$KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar" ] \
    && [ -f "$KAFKA_LIBS/kafka-tools-$KAFKA_VERSION.jar" ]
}

cmd_install() {
  ensure_java
  if libs_complete; then
    log "already installed: $KAFKA_LIBS ($(ls "$KAFKA_LIBS"/*.jar | wc -l) jars)"
  else
    ensure_maven
    local tmp="$KAFKA_LIBS.tmp.$$" t0
    rm -rf "$tmp"; mkdir -p "$BUS_BROKER_HOME"
    t0="$(now_ms)"
    log "resolving org.apache.kafka:kafka_2.13:$KAFKA_VERSION + kafka-tools + log4j2 with Maven into $KAFKA_LIBS"
    # (Maven 3.8 with -q still prints bare ESC[0m resets: strip them; pipefail keeps its status)
    if ! mvn -B -q -f "$KAFKA_POM" -Dkafka.version="$KAFKA_VERSION" \
          dependency:copy-dependencies -DoutputDirectory="$tmp" </dev/null 2>&1 \
          | sed 's/\x1b\[[0-9;]*m//g' >&2; then
      rm -rf "$tmp"; die "mvn dependency:copy-dependencies failed"
    fi
    local need
    for need in "kafka_2.13-$KAFKA_VERSION.jar" "kafka-tools-$KAFKA_VERSION.jar" \
                "kafka-server-$KAFKA_VERSION.jar" "kafka-clients-$KAFKA_VERSION.jar"; do
      [ -f "$tmp/$need" ] || { rm -rf "$tmp"; die "resolved libs lack $need"; }
    done
    ls "$tmp"/log4j-core-*.jar "$tmp"/log4j-slf4j2-impl-*.jar "$tmp"/slf4j-api-2.*.jar >/dev/null 2>&1 \
      || { rm -rf "$tmp"; die "resolved libs lack the log4j2 / slf4j2 jars"; }
    echo "kafka_2.13 $KAFKA_VERSION $(ls "$tmp"/*.jar | wc -l) jars $(date -u +%FT%TZ)" >"$tmp/.complete"
    rm -rf "$KAFKA_LIBS"; mv "$tmp" "$KAFKA_LIBS"
    log "installed $(ls "$KAFKA_LIBS"/*.jar | wc -l) jars ($(du -sh "$KAFKA_LIBS" | cut -f1)) in $(( $(now_ms) - t0 )) ms"
  fi
  echo "kafka $KAFKA_VERSION ($(java_bin) $(java_major "$(java_bin)"))"
}

ensure_installed() { libs_complete && ensure_java || cmd_install >/dev/null; }

# tool MAINCLASS ARGS...: run a Kafka CLI class on the cached classpath.
tool() {
  local main="$1"; shift
  # shellcheck disable=SC2086
  "$(java_bin)" $TOOLS_JVM_OPTS -Dlog4j2.configurationFile="$KAFKA_TOOLS_LOG4J" \
    -cp "$KAFKA_LIBS/*" "$main" "$@"
}

# random_uuid: a Kafka cluster id (what `StorageTool random-uuid` prints: 16 random bytes,
# URL-safe base64 without padding, not starting with '-'), without starting a JVM.
random_uuid() {
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [ "${#id}" = 22 ] && [ "${id#-}" = "$id" ] && { echo "$id"; return 0; }
  done
}
