#!/bin/bash
# The official image's kafka-topics.sh, enough for the compose health check.
exec java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2-tools.properties \
  -cp '/opt/kafka/libs/*' org.apache.kafka.tools.TopicCommand "$@"
