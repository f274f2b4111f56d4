"""The file to hand to `spark-submit` for the live audit (a script, so it names the package absolutely):

    spark-submit --master yarn "$(python -c 'import oncemesh.spark.submit_audit as s; print(s.__file__)')" \
        hdfs:///oncemesh/logs --out hdfs:///oncemesh/audit

Only the driver runs Python code: oncemesh must be installed where the driver runs (docs/reconcile.md,
"Live audit").
"""

import sys

from oncemesh.spark.audit import main

if __name__ == "__main__":
    sys.exit(main())
