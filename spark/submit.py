"""The file to hand to `spark-submit` (a script, so it names the package absolutely):

    spark-submit --master yarn spark/submit.py /logs/mesh --out /results

The driver (and, for --py-files, the executors) need oncemesh installed; see docs/reconcile.md."""

import sys

from oncemesh.spark.job import main

sys.exit(main())
