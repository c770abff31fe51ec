"""Example Spark jobs over lakelog topics (run them with ``python -m spark.examples.NAME``)."""
