"""Triton's inference metrics for the models of a :class:`~.repository.ModelRepositoryView`, in the
server's ``/metrics``, read from the view's statistics at each scrape (so they never drift from
``GET /v2/models/stats``).  Labels ``model`` and ``version``, as Triton's:

=========================================== ============================================================
``nv_inference_request_success``            requests that got their outputs
``nv_inference_request_failure``            requests that failed (refused by a full queue, timed out in
                                            the queue, a failed execution)
``nv_inference_count``                      samples inferred (a request of batch 4 counts 4)
``nv_inference_exec_count``                 executions (batches run)
``nv_inference_request_duration_us``        cumulative time of the successful requests, admission to result
``nv_inference_queue_duration_us``          cumulative time requests waited in the queue
``nv_inference_compute_input_duration_us``  cumulative time of input preparation (stacking, padding)
``nv_inference_compute_infer_duration_us``  cumulative execution time
``nv_inference_compute_output_duration_us`` cumulative output time (slicing each request's rows)
``vnpu:inference_batch_size``               histogram of the rows of each execution (without padding)
=========================================== ============================================================

The ``nv_`` series are exposed untyped under Triton's exact names (a typed counter would be renamed
``..._total`` by the exposition library); their values only grow, as Triton's counters.  Host-only.
"""
from __future__ import annotations

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from .repository import ModelStats

LABELS = ("model", "version")
#: (name, help, value of a ModelStats)
SERIES = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", lambda s: s.fail.count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     lambda s: s.compute_output.ns // 1000),
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def batch_buckets(s: ModelStats) -> tuple[list[tuple[str, float]], float]:
    """The cumulative buckets and sum of the executions' batch sizes."""
    sizes = [(b.batch_size, b.compute_infer.count) for b in s.batch_stats]
    out = [(floatToGoString(le), float(sum(n for size, n in sizes if size <= le))) for le in BATCH_BUCKETS]
    out.append(("+Inf", float(sum(n for _, n in sizes))))
    return out, float(sum(size * n for size, n in sizes))


class TritonCollector:
    """The metrics of the table above for ``view`` (a ModelRepositoryView), read when scraped."""

    def __init__(self, view):
        self.view = view

    def collect(self):
        stats = self.view.stats(None, None)
        for name, doc, value in SERIES:
            m = Metric(name, doc, "unknown")
            for s in stats:
                m.add_sample(name, {"model": s.name, "version": s.version}, value(s))
            yield m
        hist = HistogramMetricFamily("vnpu:inference_batch_size", "Rows per model execution (dynamic batching; "
                                     "padding to the compiled batch gear not counted).", labels=LABELS)
        for s in stats:
            buckets, total = batch_buckets(s)
            hist.add_metric([s.name, s.version], buckets, total)
        yield hist


__all__ = ["BATCH_BUCKETS", "SERIES", "TritonCollector", "batch_buckets"]
