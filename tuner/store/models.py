"""The schema. Timestamps are integer milliseconds since the epoch (as Prometheus keeps them).

Counters and gauges are rows of ``samples``; a histogram scrape is one row of ``hist_samples`` holding
its cumulative bucket counts (bounds live on the series; the column's format is tuner/store/counts.py), so a quantile over any window needs only
the rows inside it. Migrations for this schema live in ``migrations/``: change both together.
"""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "Base",
    "TargetRow",
    "SeriesRow",
    "SampleRow",
    "HistSampleRow",
    "ScrapeRow",
    "TargetHealthRow",
    "EngineConfigRow",
    "GpuSampleRow",
    "GpuProcessRow",
    "GaugeRollupRow",
    "MetaRow",
]


class Base(DeclarativeBase):
    pass


class TargetRow(Base):
    __tablename__ = "targets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    backend: Mapped[str] = mapped_column(String(16))
    url: Mapped[str] = mapped_column(Text)
    labels: Mapped[str] = mapped_column(Text, default="{}")  # JSON object


class SeriesRow(Base):
    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("target_id", "engine", "model_name", "metric", "labels", "bounds"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    engine: Mapped[str] = mapped_column(String(32))
    model_name: Mapped[str] = mapped_column(Text)
    metric: Mapped[str] = mapped_column(Text)  # canonical catalogue name
    labels: Mapped[str] = mapped_column(Text)  # JSON list of [name, value] pairs beyond engine/model
    kind: Mapped[str] = mapped_column(String(16))  # counter | gauge | histogram
    bounds: Mapped[str] = mapped_column(Text, default="")  # JSON list of bucket upper bounds ("" if none)


# Samples are kept in (target, time, series) order: a scrape's rows are neighbours, so a write touches one or two
# pages where (series, time) order touched one per series, and a target's window is one range of the key
# (bench/store_growth.py; migrations/versions/0007_samples_by_target.py). series_id is not a foreign key: one would
# need an index by series (random writes again) for its checks; the target's cascade removes a target's rows.
class SampleRow(Base):
    __tablename__ = "samples"
    __table_args__ = ({"sqlite_with_rowid": False},)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    ts_ms: Mapped[int] = mapped_column(Integer, primary_key=True)
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    keep: Mapped[int] = mapped_column(Integer, server_default="0")  # retention keeps it (tuner/store/retention.py)


class HistSampleRow(Base):
    __tablename__ = "hist_samples"
    __table_args__ = ({"sqlite_with_rowid": False},)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    ts_ms: Mapped[int] = mapped_column(Integer, primary_key=True)
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    count: Mapped[float] = mapped_column(Float)
    sum: Mapped[float] = mapped_column(Float)
    counts: Mapped[str] = mapped_column(Text)  # cumulative counts, aligned with bounds: see tuner/store/counts.py
    keep: Mapped[int] = mapped_column(Integer, server_default="0")  # retention keeps it (tuner/store/retention.py)


class ScrapeRow(Base):
    """Every scrape, successful or not: a failure is recorded, never fatal."""

    __tablename__ = "scrapes"
    __table_args__ = (Index("ix_scrapes_target_ts", "target_id", "ts_ms"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    ts_ms: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float] = mapped_column(Float)
    health: Mapped[str] = mapped_column(String(16))  # up | degraded | down
    error: Mapped[str] = mapped_column(Text, default="")
    body_bytes: Mapped[int] = mapped_column(Integer, default=0)
    samples: Mapped[int] = mapped_column(Integer, default=0)


class TargetHealthRow(Base):
    __tablename__ = "target_health"
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    health: Mapped[str] = mapped_column(String(16))
    last_error: Mapped[str] = mapped_column(Text, default="")
    last_scrape_ms: Mapped[int] = mapped_column(Integer)
    last_success_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_duration_s: Mapped[float] = mapped_column(Float)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    server_healthy: Mapped[int | None] = mapped_column(Integer, nullable=True)  # /health was 200


class EngineConfigRow(Base):
    """Live engine config (vllm:cache_config_info labels); a new row each time it changes."""

    __tablename__ = "engine_configs"
    __table_args__ = (Index("ix_engine_configs_target", "target_id", "engine", "model_name", "last_seen_ms"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    engine: Mapped[str] = mapped_column(String(32))
    model_name: Mapped[str] = mapped_column(Text)
    first_seen_ms: Mapped[int] = mapped_column(Integer)
    last_seen_ms: Mapped[int] = mapped_column(Integer)
    config: Mapped[str] = mapped_column(Text)  # JSON object


class GpuSampleRow(Base):
    __tablename__ = "gpu_samples"
    __table_args__ = (Index("ix_gpu_samples_ts", "ts_ms"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts_ms: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(8))
    gpu_index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    utilization: Mapped[float | None] = mapped_column(Float, nullable=True)  # fraction 0-1
    memory_used_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    memory_total_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    temperature_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)


class GpuProcessRow(Base):
    __tablename__ = "gpu_processes"
    __table_args__ = (Index("ix_gpu_processes_ts", "ts_ms"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts_ms: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(Text)
    used_memory_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)


class GaugeRollupRow(Base):
    """Gauge min/max/mean per rollup step, written when raw samples are thinned."""

    __tablename__ = "gauge_rollups"
    __table_args__ = ({"sqlite_with_rowid": False},)
    series_id: Mapped[int] = mapped_column(ForeignKey("series.id", ondelete="CASCADE"), primary_key=True)
    bucket_ms: Mapped[int] = mapped_column(Integer, primary_key=True)
    min: Mapped[float] = mapped_column(Float)
    max: Mapped[float] = mapped_column(Float)
    sum: Mapped[float] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer)


class MetaRow(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
