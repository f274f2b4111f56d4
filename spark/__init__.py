"""The judge: PySpark jobs that read every settlement log of a mesh and classify every (message,
subscription) pair (`oncemesh reconcile`)."""
