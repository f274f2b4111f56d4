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

from oncemesh.spark.job import PLANNED, SHORT_RUN
from tests.helpers import local_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    with local_spark("oncemesh-tests") as session:
        session.conf.set("spark.sql.shuffle.partitions", "2")
        # the tests' logs are all small: their queries run as a short reconcile's do (job.PLANNED,
        # job.SHORT_RUN), which the tests that call the reconciliation's functions directly would
        # otherwise not get (planning and compiling the wide plans is where their time goes)
        for k, v in {**PLANNED, **SHORT_RUN}.items():
            session.conf.set(k, v)
        yield session


@pytest.fixture(scope="module", autouse=True)
def fresh_cache(spark: SparkSession) -> Iterator[None]:
    """After each module, free what its fixtures kept: cached frames (every query of the session is
    planned against every cached plan) and the blocks of `reconcile(..., persist=True)`'s local
    checkpoints (`reconcile.keep`), which a module's fixtures do not release; left behind, they
    slowed and filled up the modules after it (the forged histories of test_router_view ran out of
    driver memory behind them)."""
    yield
    spark.catalog.clearCache()
    for rdd in spark.sparkContext._jsc.getPersistentRDDs().values():
        rdd.unpersist(False)
