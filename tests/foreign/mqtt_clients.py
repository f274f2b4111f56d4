"""Foreign MQTT clients for the tests: installed and built once per machine, run as processes.

Four client families, none written against oncemesh: paho-mqtt for Python (a test dependency
already), Debian's mosquitto-clients (mosquitto_pub and mosquitto_sub, libmosquitto), MQTT.js
(npm) and Eclipse Paho Java (Maven Central; MQTT 3.1.1 only: the MQTT 5 client is not served
here). For each, a publisher and a subscriber of our own (tests/foreign/mqtt/<family>/; for
mosquitto a Python driver around the programs) with one command line and one JSON-lines report
(tests/foreign/mqtt/common.py):

    publisher  --url HOST:PORT[,HOST:PORT...] --topic T --client-id C --count N --report F
               [--qos 2] [--mqtt 5|3.1.1] [--rate MSG/S] [--size BYTES] [--persistent] [--expiry SECONDS]
    subscriber --url HOST:PORT[,HOST:PORT...] --topic FILTER --client-id C --report F
               [--qos 2] [--mqtt 5|3.1.1] [--persistent] [--expiry SECONDS]

--url with several addresses is a failover list: on a lost connection the client goes on at the
next address of the list, with the same client id, clean start 0 / clean session 0 with
--persistent (and the session expiry --expiry, MQTT 5), and its own session state (the QoS 2
packet ids in flight) kept in the same process, as MQTT asks. Each family by its own means where
it has them: MQTT.js `servers`, Paho Java's server URIs with its automatic reconnect; paho-mqtt
has none, so its programs go through the list themselves (paho's own reconnect off: see
paho_py/publisher.py for the paho-mqtt 2.2.0 fault this avoids); mosquitto_pub and mosquitto_sub
take one address, so their drivers relay their connections to the list (mosquitto/relay.py says
why not a new process per address). With one address each program behaves as it always did.

Report lines: connected {present, url}, subscribed, sent {k}, acked {k, rc}, msg {k, topic, dup, mid},
relayed {url} (mosquitto with a list), recovered {mid} (mosquitto_pub: a PUBCOMP 0x92 after a
reconnect, see mosquitto/publisher.py), held_twice {mid} (mosquitto_sub: libmosquitto queued a
resent QoS 2 PUBLISH as a second copy, see mosquitto/subscriber.py), conn_error (MQTT.js: the
connection broke; it reconnects), stopping, stop_unclean {waiting}, disconnected, done, error.
`present` is null where the client does not show it (mosquitto; Paho Java on its automatic
reconnects). Each subscriber stops gracefully on
SIGTERM (each file says how: every one of these libraries hands a QoS 2 message over on the PUBREL
and keeps it in memory between PUBREC and PUBREL, except Paho Java with its file persistence), so
that a test may stop it and start it again with the same client id on a persistent session.

Installation is as for the AMQP families (tests/foreign/clients.py, whose helpers this uses):
loud, cached under ONCEMESH_FOREIGN_CACHE, and ONCEMESH_FOREIGN_SKIP=all (or a comma list of
mosquitto, mqttjs, paho_java) skips those families.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from tests.foreign.clients import HERE, SKIP_ENV, InstallFailed, apt_install, cached_build, run, skipped

MQTT = HERE / "mqtt"
MOSQUITTO_PACKAGE = "mosquitto-clients"
MQTTJS_VERSION = "5.16.0"  # (pinned in mqtt/js/package.json and mqtt/js/package-lock.json)
PAHO_JAVA_VERSION = "1.2.5"  # (pinned in mqtt/java/pom.xml)


@dataclass(frozen=True)
class MqttFamily:
    """One MQTT client family, ready to run."""

    name: str
    version: str
    publisher: tuple[str, ...]  # command prefix; the options follow
    subscriber: tuple[str, ...]
    levels: tuple[str, ...]  # the protocol levels it speaks: "5", "3.1.1"
    present_known: bool = True  # its subscriber reports CONNACK's session present (mosquitto_sub: no)
    resubscribes: bool = False  # its subscriber subscribes again on a resumed session (mosquitto_sub)
    stop_signal: int = signal.SIGTERM  # what stops its subscriber gracefully
    setup_seconds: float = 0.0  # what installing and building took in this run (0: cached)

    def command(self, role: str, **options: Any) -> list[str]:
        cmd = list(self.publisher if role == "publisher" else self.subscriber)
        for k, v in options.items():
            if v is None or v is False:
                continue
            cmd.append(f"--{k.replace('_', '-')}")
            if v is not True:
                cmd.append(str(v))
        return cmd


# ---------------------------------------------------------------------- paho-mqtt (Python)
def paho_python() -> MqttFamily:
    import paho.mqtt

    src = MQTT / "paho_py"
    return MqttFamily("paho-mqtt", paho.mqtt.__version__, (sys.executable, str(src / "publisher.py")),
                      (sys.executable, str(src / "subscriber.py")), levels=("5", "3.1.1"))


# ---------------------------------------------------------------------- mosquitto-clients
def ensure_mosquitto() -> float:
    """mosquitto-clients from Debian (seconds spent installing it)."""
    return apt_install(MOSQUITTO_PACKAGE, lambda: bool(shutil.which("mosquitto_sub") and shutil.which("mosquitto_pub")),
                       "mosquitto")


def build_mosquitto() -> MqttFamily:
    spent = ensure_mosquitto()
    if not shutil.which("stdbuf"):  # (coreutils: the drivers read mosquitto's output line by line)
        raise InstallFailed("stdbuf (coreutils) is missing")
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", MOSQUITTO_PACKAGE], capture_output=True, text=True)
    src = MQTT / "mosquitto"
    return MqttFamily("mosquitto", out.stdout.strip() or "?", (sys.executable, str(src / "publisher.py")),
                      (sys.executable, str(src / "subscriber.py")), levels=("5", "3.1.1"),
                      present_known=False, resubscribes=True, setup_seconds=spent)


# ---------------------------------------------------------------------- MQTT.js
def build_mqttjs() -> MqttFamily:
    src = MQTT / "js"
    sources = sorted(src.glob("*.js")) + [src / "package.json", src / "package-lock.json"]

    def build(tmp: Any) -> None:
        for f in sources:
            shutil.copy(f, tmp / f.name)
        run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=tmp)

    out, built = cached_build("mqttjs", sources, build)
    version = json.loads((out / "node_modules" / "mqtt" / "package.json").read_text())["version"]
    return MqttFamily("MQTT.js", version, ("node", str(out / "publisher.js")), ("node", str(out / "subscriber.js")),
                      levels=("5", "3.1.1"), setup_seconds=built)


# ---------------------------------------------------------------------- Eclipse Paho Java
def build_paho_java() -> MqttFamily:
    src = MQTT / "java"
    sources = sorted(src.glob("*.java")) + [src / "pom.xml"]

    def build(tmp: Any) -> None:
        shutil.copy(src / "pom.xml", tmp / "pom.xml")
        run(["mvn", "-B", "-q", "dependency:copy-dependencies", "-DoutputDirectory=lib"], cwd=tmp)
        run(["javac", "-d", str(tmp / "classes"), "-cp", str(tmp / "lib" / "*"),
             *(str(f) for f in src.glob("*.java"))], cwd=tmp)

    out, built = cached_build("paho_java", sources, build)
    cp = f"{out / 'classes'}:{out / 'lib' / '*'}"
    java = ("java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-cp", cp)
    return MqttFamily("Paho Java", PAHO_JAVA_VERSION, (*java, "Publisher"), (*java, "Subscriber"),
                      levels=("3.1.1",), setup_seconds=built)


BUILDERS = {"paho_py": paho_python, "mosquitto": build_mosquitto, "mqttjs": build_mqttjs,
            "paho_java": build_paho_java}


def mqtt_family(name: str) -> MqttFamily:
    """The family ready to run; skips (explicitly asked for) or fails with the installation's
    command and output."""
    if name != "paho_py" and skipped(name):
        pytest.skip(f"{name} client skipped by {SKIP_ENV}={os.environ.get(SKIP_ENV)}")
    try:
        return BUILDERS[name]()
    except InstallFailed as e:
        pytest.fail(f"installing the {name} client failed (set {SKIP_ENV}={name} to skip it on a machine "
                    f"that cannot reach the registries):\n{e}", pytrace=False)
