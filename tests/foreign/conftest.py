"""Fixtures of the foreign-client tests: each client family installed and built once per test run
(cached across runs, tests/foreign/clients.py), and one Spark session for the routers' verdict.

    ONCEMESH_FOREIGN_SKIP=all | cpp,rhea,jms,mosquitto,mqttjs,paho_java   skip those families
    ONCEMESH_FOREIGN_CACHE=DIR    where builds are cached (~/.cache/oncemesh/foreign)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.foreign.clients import Family, family
from tests.foreign.mqtt_clients import MqttFamily, mqtt_family
from tests.helpers import local_spark
from tests.workers import FOREIGN_SETUP


def _family(name: str, request: pytest.FixtureRequest) -> Family:
    fam = family(name)
    # the set-up time is part of the module's budget: the summary says what it was (tests/conftest.py)
    request.config.stash.setdefault(FOREIGN_SETUP, {})[fam.name] = (fam.version, fam.setup_seconds)
    return fam


def _mqtt(name: str, request: pytest.FixtureRequest) -> MqttFamily:
    fam = mqtt_family(name)
    request.config.stash.setdefault(FOREIGN_SETUP, {})[fam.name] = (fam.version, fam.setup_seconds)
    return fam


@pytest.fixture(scope="session")
def cpp(request: pytest.FixtureRequest) -> Family:
    return _family("cpp", request)


@pytest.fixture(scope="session")
def rhea(request: pytest.FixtureRequest) -> Family:
    return _family("rhea", request)


@pytest.fixture(scope="session")
def jms(request: pytest.FixtureRequest) -> Family:
    return _family("jms", request)


@pytest.fixture(scope="session")
def proton_py(request: pytest.FixtureRequest) -> Family:
    return _family("proton_py", request)


# the MQTT client families (tests/foreign/mqtt_clients.py): test_mqtt_foreign.py, test_mqtt_crash.py
@pytest.fixture(scope="session")
def paho_py(request: pytest.FixtureRequest) -> MqttFamily:
    return _mqtt("paho_py", request)


@pytest.fixture(scope="session")
def mosquitto(request: pytest.FixtureRequest) -> MqttFamily:
    return _mqtt("mosquitto", request)


@pytest.fixture(scope="session")
def mqttjs(request: pytest.FixtureRequest) -> MqttFamily:
    return _mqtt("mqttjs", request)


@pytest.fixture(scope="session")
def paho_java(request: pytest.FixtureRequest) -> MqttFamily:
    return _mqtt("paho_java", request)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark session for every reconcile of this run (`oncemesh reconcile` in-process
    finds it active and uses it)."""
    with local_spark("oncemesh-foreign-tests") as session:
        yield session

