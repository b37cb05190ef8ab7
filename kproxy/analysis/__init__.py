"""``kproxy analyze``: the Spark (PySpark) job over capture files.

Imports only :mod:`kproxy.capture.record_schema` of kproxy, and pyspark (the
``analysis`` extra); nothing in the proxy imports it (the CLI reaches it
lazily, inside ``kproxy analyze``), so the proxy and its image never carry Spark.
"""
