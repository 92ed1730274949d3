"""Prometheus exposition of a server: vLLM's metric set under the ``vnpu:`` prefix (same types, labels
``model_name``/``engine`` and buckets, so vLLM dashboards work) and per-device gauges named as Ascend's
npu-exporter names them (``npu_chip_info_*``, labels ``id``, ``model_name`` (the chip), ``vdie_id``,
``pcie_bus_info``, ``container_name``, ``namespace``, ``pod_name``; HBM in MB).

Counters and histograms are fed by the engines' step stats (:class:`PrometheusStatLogger`); gauges are
read when scraped (:class:`EngineCollector`, :class:`NpuCollector`), so they never drift.  Each server
has its own :class:`prometheus_client.CollectorRegistry`.

Beyond vLLM's set: the fallback chain of every model (``vnpu:engine_placement`` = index of the chain entry in use,
``vnpu:engine_rebinds``), the scheduler mode's current batch limit (``vnpu:scheduler_max_num_seqs``), and
per-tenant series (:class:`TenantMetrics`: requests by status, tokens, quota refusals, requests in
flight), and memory (:class:`MemoryCollector`, label ``id``): the arena's fragmentation
(``vnpu:hbm_fragmentation`` = 1 - largest free range / free bytes, all clients of the device, as ``vnpu
smi`` shows it) and this server's caching pool per device (``vnpu:memory_pool_*``: reserved, allocated,
largest free block and fragmentation of the pool's own segments, alloc retries, OOMs, defragmentations
and bytes they moved -- ``Device.memory_stats()``).  Tenant labels are why ``/metrics`` needs an admin
key when tenants are configured.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .engine.stats import StepStats

P = "vnpu:"
LABELS = ("model_name", "engine")
TTFT_BUCKETS = (.001, .005, .01, .02, .04, .06, .08, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560)
ITL_BUCKETS = (.01, .025, .05, .075, .1, .15, .2, .3, .4, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
E2E_BUCKETS = (.3, .5, .8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680)
ITER_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
HEALTH = {"OK": 1, "Warning": 1, "Alarm": 0, "Critical": 0}      #: npu-exporter: 1 ok, 0 bad, -1 unknown


def _token_buckets(max_len: int) -> list[int]:
    """vLLM's 1-2-5 series up to ``max_model_len``."""
    out, m = [], 1
    while True:
        for k in (1, 2, 5):
            if k * m > max_len:
                return out
            out.append(k * m)
        m *= 10


class PrometheusStatLogger:
    """The vLLM counters and histograms, fed by :class:`StepStats` records."""

    def __init__(self, registry: CollectorRegistry, max_model_len: int = 8192):
        r, L = registry, LABELS
        self.prompt_tokens = Counter(P + "prompt_tokens", "Number of prefill tokens processed.", L, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Number of generation tokens processed.", L,
                                         registry=r)
        self.preemptions = Counter(P + "num_preemptions", "Cumulative number of preemptions from the engine.", L,
                                   registry=r)
        self.success = Counter(P + "request_success", "Count of successfully processed requests.",
                               L + ("finished_reason",), registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Histogram of time to first token in seconds.", L,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", L,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", L,
                             buckets=E2E_BUCKETS, registry=r)
        self.queue = Histogram(P + "request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", L, buckets=E2E_BUCKETS,
                               registry=r)
        tb = _token_buckets(max_model_len)
        self.req_prompt = Histogram(P + "request_prompt_tokens", "Number of prefill tokens processed.", L,
                                    buckets=tb, registry=r)
        self.req_gen = Histogram(P + "request_generation_tokens", "Number of generation tokens processed.", L,
                                 buckets=tb, registry=r)
        self.iteration = Histogram(P + "iteration_tokens_total", "Histogram of number of tokens per engine_step.", L,
                                   buckets=ITER_BUCKETS, registry=r)

    def record(self, model: str, s: StepStats) -> None:
        lb = (model, "0")
        if s.prompt_tokens:
            self.prompt_tokens.labels(*lb).inc(s.prompt_tokens)
        if s.generation_tokens:
            self.generation_tokens.labels(*lb).inc(s.generation_tokens)
        if s.num_preemptions:
            self.preemptions.labels(*lb).inc(s.num_preemptions)
        if s.batch_tokens:
            self.iteration.labels(*lb).observe(s.batch_tokens)
        for x in s.time_to_first_tokens:
            self.ttft.labels(*lb).observe(x)
        for x in s.inter_token_latencies:
            self.itl.labels(*lb).observe(x)
        for f in s.finished:
            self.success.labels(*lb, f.finish_reason).inc()
            self.e2e.labels(*lb).observe(f.e2e_s)
            self.queue.labels(*lb).observe(f.queue_s)
            self.req_prompt.labels(*lb).observe(f.prompt_tokens)
            self.req_gen.labels(*lb).observe(f.generation_tokens)


class EngineCollector:
    """``vnpu:num_requests_running``/``_waiting``, ``vnpu:kv_cache_usage_perc`` and the prefix cache's
    ``vnpu:prefix_cache_queries``/``_hits`` (tokens), read at scrape."""

    def __init__(self, engines: dict):
        self.engines = engines

    def collect(self):
        run = GaugeMetricFamily(P + "num_requests_running", "Number of requests in model execution batches.",
                                labels=LABELS)
        wait = GaugeMetricFamily(P + "num_requests_waiting", "Number of requests waiting to be processed.",
                                 labels=LABELS)
        kv = GaugeMetricFamily(P + "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                               labels=LABELS)
        place = GaugeMetricFamily(P + "engine_placement", "Index of the fallback-chain entry the engine runs on "
                                  "(0 = first placement).", labels=LABELS + ("placement",))
        rebinds = CounterMetricFamily(P + "engine_rebinds", "Re-binds of the engine to another placement "
                                      "(fallback or restore).", labels=LABELS)
        seqs = GaugeMetricFamily(P + "scheduler_max_num_seqs", "Batch limit the scheduler mode chose for the last "
                                 "step.", labels=LABELS + ("mode",))
        pq = CounterMetricFamily(P + "prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
                                 "tokens.", labels=LABELS)
        ph = CounterMetricFamily(P + "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                                 labels=LABELS)
        cache = GaugeMetricFamily(P + "cache_config_info", "Information of the LLMEngine CacheConfig (the KV blocks "
                                  "the engine allocated).", labels=LABELS + ("block_size", "num_gpu_blocks"))
        for name, e in list(self.engines.items()):
            if e.kind == "embed" and hasattr(e, "chain"):              # an in-process encoder: its chain
                wait.add_metric([name, "0"], e.waiting)
                place.add_metric([name, "0", str(e.placement)], e.index)
                rebinds.add_metric([name, "0"], e.rebinds)
                continue
            if e.kind != "generate" or not hasattr(e, "snapshot"):     # Ray Serve replicas report their own
                continue
            s = e.snapshot()
            run.add_metric([name, "0"], s.running)
            wait.add_metric([name, "0"], s.waiting)
            kv.add_metric([name, "0"], s.kv_usage)
            place.add_metric([name, "0", str(e.placement)], s.placement)
            rebinds.add_metric([name, "0"], s.rebinds)
            lim = s.limits.max_num_seqs if s.limits is not None else e.config.max_num_seqs
            seqs.add_metric([name, "0", e.config.mode.mode], lim)
            cache.add_metric([name, "0", str(e.config.block_size), str(s.num_blocks)], 1)
            pq.add_metric([name, "0"], s.prefix_cache_queries)
            ph.add_metric([name, "0"], s.prefix_cache_hits)
        yield run
        yield wait
        yield kv
        yield place
        yield rebinds
        yield pq
        yield ph
        yield seqs
        yield cache


class NpuCollector:
    """npu-exporter's chip gauges for every device of the runtime, read at scrape."""

    NAMES = (("health_status", "Health status of the chip: 1 healthy, 0 unhealthy, -1 unknown"),
             ("hbm_used_memory", "Used HBM of the chip (MB)"), ("hbm_total_memory", "Total HBM of the chip (MB)"),
             ("utilization", "AI Core utilization of the chip (%)"), ("temperature", "Temperature of the chip (C)"),
             ("power", "Power of the chip (W)"))
    LABELS = ("id", "model_name", "vdie_id", "pcie_bus_info", "container_name", "namespace", "pod_name")

    def __init__(self, rt):
        self.rt = rt

    def collect(self):
        fams = {k: GaugeMetricFamily(f"npu_chip_info_{k}", doc, labels=self.LABELS) for k, doc in self.NAMES}
        for i in range(self.rt.device_count()):
            dev = self.rt.device(i)
            try:
                t = dev.telemetry()
                info = dev.info()
                health = HEALTH.get(dev.handle.health()[0], -1)
            except Exception:  # noqa: BLE001 - an unreachable device reads as unknown, not a failed scrape
                fams["health_status"].add_metric([str(i), "", "", "", "", "", ""], -1)
                continue
            lb = [str(i), info.chip, f"vnpu-{dev.physical_id}", info.bus_id, "", "", ""]
            fams["health_status"].add_metric(lb, health)
            fams["hbm_used_memory"].add_metric(lb, t["hbm_used"] / 2 ** 20)
            fams["hbm_total_memory"].add_metric(lb, t["hbm_total"] / 2 ** 20)
            fams["utilization"].add_metric(lb, t["aicore_util_avg"])
            fams["temperature"].add_metric(lb, t["temperature_c"])
            fams["power"].add_metric(lb, t["power_w"])
        yield from fams.values()


class MemoryCollector:
    """Fragmentation of each device's arena and the server's caching pool on it, read at scrape (the
    self-healing policy's ``defragment`` trigger watches these).  A device without a pool yet reports
    zeros for the pool; an unreachable one is left out of the arena gauge."""

    #: (metric suffix, ``memory_stats()`` key, help): gauges
    POOL_GAUGES = (("reserved_bytes", "reserved_bytes.all.current", "Bytes the caching pool holds from the driver."),
                   ("allocated_bytes", "allocated_bytes.all.current", "Bytes of live tensors in the caching pool."),
                   ("inactive_split_bytes", "inactive_split_bytes.all.current",
                    "Free bytes inside split segments of the caching pool."),
                   ("largest_free_block_bytes", "largest_free_block",
                    "Largest free block inside the caching pool's segments."),
                   ("fragmentation", "fragmentation",
                    "1 - largest free block / free bytes inside the caching pool's segments."))
    #: (metric name without _total, ``memory_stats()`` key, help): counters
    POOL_COUNTERS = (("alloc_retries", "num_alloc_retries", "Allocations that freed the cache and retried."),
                     ("ooms", "num_ooms", "Allocations that failed with out of memory after the retry."),
                     ("defragmentations", "num_defragmentations", "Live defragmentations that ran."),
                     ("defrag_moved_bytes", "defrag_bytes_moved", "Bytes live defragmentations moved."))

    def __init__(self, rt):
        self.rt = rt

    def collect(self):
        hbm = GaugeMetricFamily(P + "hbm_fragmentation", "1 - largest free HBM range / free HBM of the device "
                                "(all clients).", labels=("id",))
        gauges = [(GaugeMetricFamily(P + "memory_pool_" + n, doc, labels=("id",)), key)
                  for n, key, doc in self.POOL_GAUGES]
        counters = [(CounterMetricFamily(P + "memory_pool_" + n, doc, labels=("id",)), key)
                    for n, key, doc in self.POOL_COUNTERS]
        for i in range(self.rt.device_count()):
            dev = self.rt.device(i)
            try:
                hbm.add_metric([str(i)], dev.telemetry()["fragmentation"])
            except Exception:  # noqa: BLE001 - an unreachable device is left out, not a failed scrape
                pass
            try:
                st = dev.memory_stats()
            except Exception:  # noqa: BLE001 - e.g. a bad VNPU_ALLOC_CONF: the pool has no stats to give
                continue
            for fam, key in gauges + counters:
                fam.add_metric([str(i)], st[key])
        yield hbm
        for fam, _ in gauges + counters:
            yield fam


class TenantMetrics:
    """Per-tenant counters (fed by the HTTP layer) and the in-flight gauge (read from the quotas)."""

    def __init__(self, registry: CollectorRegistry, quotas=None, tenants=()):
        r = registry
        self.requests = Counter(P + "tenant_requests", "HTTP requests by tenant and status code.",
                                ("tenant", "status"), registry=r)
        self.tokens = Counter(P + "tenant_tokens", "Tokens used by tenant (prompt / generation).",
                              ("tenant", "model_name", "kind"), registry=r)
        self.rate_limited = Counter(P + "tenant_rate_limited", "Requests refused over a tenant quota.",
                                    ("tenant", "limit"), registry=r)
        if quotas is not None:
            r.register(_InFlight(quotas, tenants))


class _InFlight:
    def __init__(self, quotas, tenants):
        self.quotas, self.tenants = quotas, tenants

    def collect(self):
        g = GaugeMetricFamily(P + "tenant_requests_in_flight", "Requests of the tenant in flight.", labels=("tenant",))
        for t in self.tenants:
            g.add_metric([t.name], self.quotas.in_flight(t.name))
        yield g


#: the forecast gauge's horizons: label -> seconds ahead
FORECAST_HORIZONS: dict[str, float] = {"15m": 900.0, "30m": 1800.0, "1h": 3600.0}


class ForecastCollector:
    """``vnpu:forecast_requests_per_second{model_name,horizon}``: the forecast request rate (seasonal-naive +
    EWMA level, :mod:`runtime.observe.forecast`) of each model with history (``model_name="*"``: the
    server) at 15 min, 30 min and 1 h ahead, and ``vnpu:forecast_peak_requests_per_second{model_name}``: the
    highest within the hour.  Read at scrape from the History (one aggregate query per scope and bin)."""

    def __init__(self, forecaster, clock):
        self.forecaster, self.clock = forecaster, clock

    def collect(self):
        at = GaugeMetricFamily(P + "forecast_requests_per_second", "Forecast requests per second of the model "
                               "(* = the server) this far ahead.", labels=("model_name", "horizon"))
        peak = GaugeMetricFamily(P + "forecast_peak_requests_per_second", "Highest forecast requests per second "
                                 "within the next hour.", labels=("model_name",))
        for f in self.forecaster.all(self.clock()):
            for label, ahead in FORECAST_HORIZONS.items():
                at.add_metric([f.model, label], f.at(ahead))
            peak.add_metric([f.model], f.peak())
        yield at
        yield peak


def make_registry(rt, engines: dict, max_model_len: int = 8192, quotas=None,
                  tenants=()) -> tuple[CollectorRegistry, PrometheusStatLogger, TenantMetrics]:
    reg = CollectorRegistry()
    logger = PrometheusStatLogger(reg, max_model_len)
    reg.register(EngineCollector(engines))
    if rt is not None:
        reg.register(NpuCollector(rt))
        reg.register(MemoryCollector(rt))
    return reg, logger, TenantMetrics(reg, quotas, tenants)
