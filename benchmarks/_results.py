"""Everything one ``run.py`` run measured, in one place (the report and the
targets read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from _dask_row import DaskResult
from _defaults import DefaultsResult
from _devices_row import DevicesResult
from _jobs_sweep import JobsResult
from _synthetic import AnalysisResult, GraphResult
from _throughput_row import ThroughputResult
from _zoo import ZooResult
from _zoo_cache import ZooCacheResult
from process_actions import ProcessResult


@dataclass
class Results:
    """The results of each stage that ran; a stage that did not run leaves its
    field empty (its targets then read "not measured")."""

    mode: str
    runs: int
    graphs: list[GraphResult] = field(default_factory=list)
    jobs: list[JobsResult] = field(default_factory=list)
    throughput: ThroughputResult | None = None
    analysis: list[AnalysisResult] = field(default_factory=list)
    probe: list[tuple[str, str, str]] = field(default_factory=list)
    zoo: ZooResult | None = None
    process: ProcessResult | None = None
    cache: ZooCacheResult | None = None
    dask: DaskResult | None = None
    defaults: DefaultsResult | None = None  # issue 29: kiln's defaults, the cache on
    devices: DevicesResult | None = None  # issue 39: device placement, the zoo with a device
    errors: list[str] = field(default_factory=list)
    stage_s: dict[str, float] = field(default_factory=dict)  # how long each stage took
