"""The judge: PySpark jobs that read every settlement log of a mesh and classify every (message,
subscription) pair (`oncemesh reconcile`, `oncemesh audit`).

pyspark is an extra (`pip install 'oncemesh[spark]'`, and Java 17): a router host runs without it.
The commands that judge check for it first (`pyspark_missing`) and say how to install it."""

from __future__ import annotations

import importlib.util

SPARK_EXTRA = "pip install 'oncemesh[spark]'"


def pyspark_missing(what: str) -> str | None:
    """None when pyspark can be imported here; else a line for a person saying that `what` needs it
    and how to install it."""
    if importlib.util.find_spec("pyspark") is not None:
        return None
    return f"{what} needs pyspark (and Java 17), which is not installed here: {SPARK_EXTRA}"
