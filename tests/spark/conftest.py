"""The one Spark session of the Spark tests: local[2], two shuffle partitions, a 2 GB heap (the
default 1 GB ran out: java.lang.OutOfMemoryError after the audit and the forged histories), quiet,
loopback only.

`oncemesh reconcile` run in-process (tests call `oncemesh.cli.main`) finds this session active and
uses it instead of starting its own, and leaves it running.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from oncemesh.spark.job import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session, created = spark_session("local[2]", driver_memory="2g", shuffle_partitions=2, app_name="oncemesh-tests")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        yield session
    finally:
        if created:
            session.stop()
