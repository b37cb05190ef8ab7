"""The capture schema as Spark sees it: derived from :mod:`kproxy.capture.record_schema`, never restated."""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kproxy.capture.record_schema import COLUMNS, Column

_SPARK_SCALARS: dict[str, DataType] = {
    "bool": BooleanType(), "int16": ShortType(), "int32": IntegerType(), "int64": LongType(),
    "float64": DoubleType(), "string": StringType(), "binary": BinaryType(),
    "timestamp_us": TimestampType(),  # Parquet's UTC-adjusted microsecond timestamp, as pyarrow writes it
}


def _field(col: Column) -> StructField:
    if col.type == "list":
        return StructField(col.name, ArrayType(StructType([_field(c) for c in col.items])), col.nullable)
    return StructField(col.name, _SPARK_SCALARS[col.type], col.nullable)


def spark_schema() -> StructType:
    """The ``StructType`` of one capture record."""
    return StructType([_field(c) for c in COLUMNS])


def snake_api_name(column: str = "api_name") -> SparkColumn:
    """A capture's api name (Kafka's, ``GetTelemetrySubscriptions``) as the metrics, rules and logs
    spell it (``get_telemetry_subscriptions``): the rule of
    :func:`kproxy.protocol.codes.api_snake_name`, in Spark, so every output of ``analyze`` uses
    the one spelling whatever a capture holds."""
    return F.lower(F.regexp_replace(F.col(column), "(?<!^)(?=[A-Z])", "_"))
