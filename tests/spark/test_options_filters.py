"""Option parsing, filter pushdown translation and the Arrow schema Spark checks batches against."""

from __future__ import annotations

import datetime

import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)
from pyspark.sql.pandas.types import to_arrow_schema

from tieredstore.errors import ConfigError, InvalidTopicError
from tieredstore.scan import ARROW_SCHEMA, OnCorrupt, ScanOptions
from tieredstore.spark import push_filters, spark_schema

UTC = datetime.UTC


def test_arrow_schema_is_the_one_spark_expects() -> None:
    assert ARROW_SCHEMA.equals(to_arrow_schema(spark_schema(), timezone="UTC"))
    assert [field.name for field in spark_schema().fields] == [
        "topic",
        "queue_id",
        "queue_offset",
        "commitlog_offset",
        "store_timestamp",
        "born_timestamp",
        "keys",
        "tags",
        "properties",
        "msg_id",
        "body",
        "body_crc",
        "reconsume_times",
        "sysflag",
    ]


def test_options_parse_and_hide_secrets() -> None:
    options = ScanOptions.parse(
        {
            "path": "orders, payments,orders",
            "cold_url": "s3://bucket/prefix",
            "metadata_url": "postgresql+psycopg://reader:dbpass@db.example/ts",
            "Endpoint_URL": "http://127.0.0.1:9000",
            "access_key_id": "AKIDEXAMPLE",
            "secret_access_key": "very-secret",
            "max_attempts": "3",
            "max_partition_bytes": "1048576",
            "on_corrupt": "SKIP",
        }
    )
    assert options.topics == ("orders", "payments")
    assert options.provider_options == {
        "endpoint_url": "http://127.0.0.1:9000",
        "access_key_id": "AKIDEXAMPLE",
        "secret_access_key": "very-secret",
        "max_attempts": 3,
    }
    assert (options.max_partition_bytes, options.on_corrupt, options.broker) == (1 << 20, OnCorrupt.SKIP, "broker-a")
    shown = repr(options) + str(options)
    assert "very-secret" not in shown and "dbpass" not in shown and "AKIDEXAMPLE" not in shown


@pytest.mark.parametrize(
    ("given", "complaint"),
    [
        ({"cold_url": "/x", "metadata": "none"}, "name the topics"),
        ({"path": "t", "metadata": "none"}, "cold_url is required"),
        ({"path": "t", "cold_url": "/x"}, "metadata=none"),
        ({"path": "t", "cold_url": "/x", "metadata": "none", "metadata_url": "sqlite://"}, "not both"),
        ({"path": "t", "cold_url": "/x", "metadata": "none", "cold_uri": "/y"}, "unknown tieredstore option"),
        ({"path": "t", "cold_url": "/x", "metadata": "none", "on_corrupt": "ignore"}, "fail or skip"),
        ({"path": "t", "cold_url": "/x", "metadata": "none", "max_partition_bytes": "0"}, "must be positive"),
        ({"path": "t", "cold_url": "/x", "metadata": "none", "region": "eu-west-1"}, "is not s3://"),
        ({"path": "t", "cold_url": "s3://b/p", "metadata": "none", "max_attempts": "many"}, "must be a number"),
    ],
)
def test_bad_options_are_config_errors(given: dict[str, str], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        ScanOptions.parse(given)


def test_a_topic_name_that_rocketmq_forbids_is_refused() -> None:
    with pytest.raises(InvalidTopicError):
        ScanOptions.parse({"path": "../etc", "cold_url": "/x", "metadata": "none"})


def test_supported_filters_narrow_the_scan_and_the_rest_go_back() -> None:
    moment = datetime.datetime(2026, 11, 1, 0, 0, 0, 500, tzinfo=UTC)  # 500 µs past a whole millisecond
    micros = int(moment.timestamp()) * 1_000_000 + 500
    tags = EqualTo(("tags",), "a")
    negated = Not(EqualTo(("queue_id",), 1))
    prefix = StringStartsWith(("topic",), "or")
    nested = EqualTo(("properties", "k"), "v")
    unsupported = [tags, negated, prefix, nested, IsNotNull(("tags",)), In(("queue_offset",), [1, 2])]
    scan, rest = push_filters(
        [
            EqualTo(("topic",), "orders"),
            In(("queue_id",), [1, 2, 3]),
            LessThan(("queue_id",), 3),
            GreaterThanOrEqual(("queue_offset",), 10),
            LessThanOrEqual(("queue_offset",), 20),
            GreaterThan(("store_timestamp",), moment),
            IsNotNull(("body",)),
            *unsupported,
        ]
    )
    assert all(a is b for a, b in zip(rest, unsupported, strict=True))
    assert scan.topics == frozenset({"orders"})
    assert [q for q in range(6) if scan.allows_queue(q)] == [1, 2]
    assert (scan.queue_offset_start, scan.queue_offset_end) == (10, 21)
    assert scan.timestamp_start_us == micros + 1
    # Store times are whole milliseconds: the first that can match is the next one.
    assert scan.time_start_ms == micros // 1000 + 1
    assert not scan.matches_row(15, micros // 1000)
    assert scan.matches_row(15, micros // 1000 + 1)
    assert not scan.matches_row(21, micros // 1000 + 1)


def test_contradictions_leave_nothing() -> None:
    scan, rest = push_filters([EqualTo(("topic",), "a"), EqualTo(("topic",), "b"), GreaterThan(("queue_id",), 5)])
    assert rest == []
    assert not scan.allows_topic("a") and not scan.allows_topic("b")
    assert not scan.allows_queue(5) and scan.allows_queue(6)
    naive = EqualTo(("store_timestamp",), datetime.datetime(2026, 1, 1))
    _, rest = push_filters([naive])
    assert rest == [naive]
