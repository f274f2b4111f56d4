"""The file to hand to `spark-submit` (a script, so it names the package absolutely):

    spark-submit --master yarn "$(python -c 'import oncemesh.spark.submit as s; print(s.__file__)')" \
        hdfs:///logs/mesh --out hdfs:///results

Only the driver runs Python code: oncemesh must be installed where the driver runs (docs/reconcile.md).
"""

import sys

from oncemesh.spark.job import main

if __name__ == "__main__":
    sys.exit(main())
