"""``vnpu serve``: the OpenAI-compatible inference server (see :mod:`runtime.serve`).

    vnpu serve --model smollm2 --model minilm-l6 --port 8000
    vnpu serve --model smollm2@0-2 --tp 3 --config serve.yaml
    vnpu serve --config serve.yaml --replicas 2          # two Ray Serve replicas behind the same routes
    vnpu serve --model smollm2 --model resnet.om --grpc-port 0                   # a compiled model beside it
    vnpu serve --model-repository models/ --grpc-port 8001     # Triton's layout, Open Inference Protocol

Compiled models (``vnpu atc`` ``.om`` files: ``--model path/x.om``, or every model of ``--model-repository
DIR`` in Triton's layout with its ``config.yaml``) are served over the Open Inference Protocol (``/v2`` on
the same port; gRPC on ``--grpc-port``, 0 = any free port, printed as ``vnpu serve: gRPC on HOST:PORT``),
with dynamic batching, their instances placed on the devices the other models leave free.  A path that
does not hold a servable model, or a model of the repository with no version to serve: exit 2, one line,
before anything starts.

Devices: the running cluster, or an embedded one with as many devices as the models need
(``VNPU_BACKEND=local``: in-process devices).  An embedded cluster's device actors are restarted by Ray
(``--device-restarts``; default: always when ``self_healing`` has a ``restart_device`` trigger) so that
the action can take a killed device back; on a running cluster that takes ``vnpu up --device-restarts N``.

The log (stdout, ``--log-level``): ``vnpu serve: listening on URL`` once bound (port 0 picks a free port), the
startup stages (:mod:`runtime.cli.stages`: live on a terminal, a plain line each otherwise), the start
summary once the engines are loaded (:mod:`runtime.serve.summary`) and ``vnpu serve: ready``; then an access
line per request (:mod:`runtime.serve.access_log`; ``--no-access-log``) and a stats line every
``--stats-interval`` seconds (:mod:`runtime.serve.stats_log`).  SIGTERM/SIGINT drains (no new
requests, running ones finish) and exits 0.  Bad flags or config: one line on stderr, exit 2 -- among them
an open server (no tenants with API keys) on a non-loopback ``--host`` without ``--allow-unauthenticated``.

State: the server samples its metrics every second into ``$VNPU_HOME/serve/history.sqlite`` (kept across
restarts) and writes ``$VNPU_HOME/serve/server.json`` (URL, pid, History; mode 0600; removed on a clean
stop) so that ``vnpu monitor`` / ``diagnose`` / ``serve reconfigure`` find it.  The config's
``self_healing`` section runs a policy engine on those samples (:mod:`runtime.serve.heal`).

    vnpu serve config --print --config runtime_config.yaml     # the canonical form of a file (either dialect)
    vnpu serve reconfigure --set models.smollm2.scheduler.mode=adaptive --set slo.target_p99_ms=500
    vnpu serve reconfigure -f new-serve.yaml --url http://127.0.0.1:8000      # admin key: VNPU_API_KEY

``reconfigure`` exits 0 when applied, 1 when the new config failed its health check and was rolled back,
2 when refused (invalid, or a key that needs a restart: one line on stderr).

``--replicas R`` (or ``server.replicas``) > 1 runs the engines as R Ray Serve replicas on the cluster (each
claims its devices as the Ray resource ``NPU``), behind this process's HTTP routes; the default (1) serves
in this process with no Ray Serve hop.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path

from runtime.cli.console import LOG_LEVELS
from runtime.cliargs import bind_host, boolean, int_in, nonneg_float, positive_int, text_file


def register(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible server: /v1/completions, /v1/chat/completions, "
                                     "/v1/embeddings, /metrics",
                       example=("vnpu serve --config serve.yaml", "vnpu serve --model smollm2@0-2 --port 8000",
                                "vnpu serve reconfigure --set slo.target_p99_ms=500"))
    s.add_argument("--model", action="append", default=[], metavar="NAME[@DEVICES]|PATH.om",
                   help="a model to serve, e.g. smollm2@0-2, minilm-l6 or a compiled model resnet.om (repeatable; "
                        "default: the config's)")
    s.add_argument("--model-repository", default=None, metavar="DIR",
                   help="serve every compiled model of DIR (Triton's layout: DIR/<name>/<version>/model.om, "
                        "DIR/<name>/config.yaml)")
    s.add_argument("--grpc-port", type=int_in(0, 65535), default=None, metavar="PORT",
                   help="also serve the Open Inference Protocol over gRPC on PORT (0 = any free port)")
    s.add_argument("--tp", type=positive_int, default=None, help="tensor parallel degree of the generation model")
    s.add_argument("-q", "--quantization", choices=("none", "gguf"), default=None,   # runtime.models.weights.QUANTIZATIONS
                   help="how the generation model's GGUF weights sit in HBM: none = dequantised to float32 at "
                        "load (default), gguf = the file's Q8_0/Q4_1/Q4_K blocks as they are (serve.yaml: "
                        "engine.quantization)")
    s.add_argument("--config", type=text_file, help="serve.yaml (models, placement, engine limits, batching)")
    s.add_argument("--host", type=bind_host, default=None, help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int_in(0, 65535), default=None, help="port (default 8000; 0 = any free port)")
    s.add_argument("--devices", type=positive_int, default=None, help="devices of an embedded cluster (default: "
                                                                          "what the models need)")
    s.add_argument("--device-restarts", type=int_in(-1, 1_000_000), default=None, metavar="N",
                   help="an embedded cluster's device actors are restarted by Ray up to N times (-1: always); "
                        "default: always when self_healing has a restart_device trigger, else never (a running "
                        "cluster keeps what `vnpu up --device-restarts` gave it)")
    s.add_argument("--replicas", type=positive_int, default=None,
                   help="Ray Serve replicas of the engines (default 1: in this process, no Ray Serve)")
    s.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve without API keys on a non-loopback --host (refused otherwise)")
    s.add_argument("--log-level", choices=tuple(LOG_LEVELS), default="info",
                   help="the server's log on stdout: debug adds probes, scrapes and idle stats lines (default info)")
    s.add_argument("--no-access-log", action="store_true", help="no access line per request")
    s.add_argument("--stats-interval", type=nonneg_float, default=10.0, metavar="SECONDS",
                   help="a stats line (throughput, running/waiting, KV cache use) every SECONDS, on the metrics "
                        "sampler's 1 s ticks (default 10; 0: none)")
    from runtime.cliargs import boolean, duration, size
    from runtime.serve.memory_pool import STRATEGIES
    s.add_argument("--memory-strategy", choices=list(STRATEGIES), default=None,
                   help="the device pools' strategy (memory.strategy)")
    s.add_argument("--enable-memory-pool", type=boolean, default=None, metavar="true|false",
                   help="manage the device pools as memory: says (default true; false: leave them as "
                        "VNPU_ALLOC_CONF makes them)")
    s.add_argument("--pool-size", type=size, default=None, metavar="SIZE",
                   help="each device pool's size, pre-warmed at start (memory.pool_size, e.g. 3GB)")
    s.add_argument("--defrag-interval", type=duration, default=None, metavar="DURATION",
                   help="live defragmentation every DURATION (memory.defrag_interval, e.g. 3m)")
    s.add_argument("--overflow-protection", type=boolean, default=None, metavar="true|false",
                   help="free the cache and degrade batch and queue before the pool overflows "
                        "(memory.overflow_protection)")
    s.add_argument("--guardian-mode", type=boolean, default=False, metavar="true|false",
                   help="self-healing with no manual step: the policy on, a lost device restarted and the engines "
                        "moved back to it once it passes the deep check (runtime.serve.heal.guardian)")
    s.add_argument("--alert-channel", action="append", default=[], metavar="slack:#CHAN|webhook:URL|file:PATH|log",
                   help="one more alert sink (repeatable); a Slack channel posts {\"text\": ...} to its webhook URL")
    s.add_argument("--alert-webhook-url", default=None, metavar="URL",
                   help="the Slack incoming-webhook URL of --alert-channel slack:#CHAN (default: "
                        "$VNPU_SLACK_WEBHOOK_URL, or the url of a slack sink in self_healing.alerts)")
    s.set_defaults(fn=_cmd_serve)
    ops = s.add_subparsers(dest="serve_cmd", metavar="{reconfigure,config}")
    c = ops.add_parser("config", help="check a serve.yaml (vnpu's names or the CANN runtime article's) and print "
                                      "its canonical vnpu form",
                       example=("vnpu serve config --print --config runtime_config.yaml",))
    c.add_argument("--print", dest="print_", action="store_true",
                   help="print the canonical form (default: only check; exit 0 when it loads)")
    c.add_argument("--config", dest="config_flag", type=text_file, default=None, help="the serve.yaml to load")
    c.add_argument("config_file", nargs="?", type=text_file, default=None, metavar="FILE",
                   help="the file (or --config FILE)")
    c.set_defaults(fn=_cmd_config)
    r = ops.add_parser("reconfigure", help="change a running server's scheduler, engine limits, batching, "
                                           "tenants, slo, memory and self-healing without a restart (validated, "
                                           "health-checked, rolled back on failure)",
                       example=("vnpu serve reconfigure --set models.smollm2.scheduler.mode=adaptive",
                                "vnpu serve reconfigure -f new-serve.yaml --url http://127.0.0.1:8000",
                                "vnpu serve reconfigure --memory-pool-size 4GB"))
    _reconfigure_flags(r, "vnpu serve reconfigure")
    top = sub.add_parser("reconfigure", help="vnpu serve reconfigure (the seed's `runtime reconfigure`)",
                         example=("vnpu reconfigure --memory-pool-size 4GB",
                                  "vnpu reconfigure --set slo.target_p99_ms=500"))
    _reconfigure_flags(top, "vnpu reconfigure")


def _reconfigure_flags(r, prog: str) -> None:
    what = r.add_mutually_exclusive_group(required=True)
    what.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                      help="a setting over the running config, e.g. models.smollm2.scheduler.mode=latency "
                           "(repeatable)")
    what.add_argument("-f", "--file", type=text_file, default=None, help="a whole new serve.yaml")
    from runtime.cliargs import size as _size
    what.add_argument("--memory-pool-size", type=_size, default=None, metavar="SIZE",
                      help="grow or shrink the device pools to SIZE (e.g. 4GB; memory.pool_size), live")
    r.add_argument("--url", default=None, help="the server (default: the one in $VNPU_HOME/serve/server.json)")
    r.add_argument("--api-key", default=None, help="an admin key (default: $VNPU_API_KEY)")
    r.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    r.set_defaults(fn=_cmd_reconfigure, reconfigure_prog=prog)


def _fail(msg: str) -> int:
    print(f"vnpu serve: error: {msg}", file=sys.stderr)
    return 2


def compiled_models(a) -> tuple:
    """The compiled models of the flags: the ``--model-repository`` (every model must have a version to
    serve) and each ``--model PATH.om`` as a one-model repository.  ConfigError (one line) otherwise."""
    from runtime.serve.modelrepo import ModelConfigError, scan_repository, single_model
    repos = [scan_repository(a.model_repository)] if a.model_repository else []
    repos += [single_model(text) for text in a.model if is_compiled(text)]
    for m in (m for r in repos for m in r.models):
        if m.latest is None:                    # the versions' own reasons first (a missing or corrupt file)
            why = "; ".join(f"version {v.version}: {v.reason}" for v in m.versions if v.reason) or m.error
            raise ModelConfigError(f"model {m.name}: nothing to serve: {why}")
    return tuple(repos)


def is_compiled(text: str) -> bool:
    """Whether a ``--model`` names a compiled model file (``.om``) rather than a built-in model."""
    return str(text).lower().endswith(".om")


def resolve(a, served: tuple[str, ...] = ()):
    """The ServeConfig of the flags over the config file; ``served``: the compiled models' names (tenants
    may name them)."""
    from runtime.serve.config import ServeConfig, load_config, model_spec, parse_model_spec
    cfg = load_config(a.config, served) if a.config else ServeConfig()
    models = list(cfg.models)
    for text in (t for t in a.model if not is_compiled(t)):
        name, devs = parse_model_spec(text, "--model: ")
        base = next((m for m in models if m.name == name), None)
        tp = a.tp if (a.tp and model_spec(name, None, None).kind == "generate") else None
        spec = model_spec(name, devs if devs is not None else (base.devices if base else None),
                          tp if tp is not None else (base.tp if base and devs is None else None),
                          base.engine if base else None, base.batching if base else None, f"--model {text}: ")
        models = [m for m in models if m.name != name] + [spec]
    if a.tp and not a.model:
        models = [model_spec(m.name, m.devices, a.tp, m.engine, m.batching, "--tp: ", m.fallback) if m.kind == "generate" else m
                  for m in models]
    if not models and not served:
        models = [model_spec("smollm2", None, a.tp, where="--tp: " if a.tp else "")]
    q = getattr(a, "quantization", None)
    if q is not None:
        models = [dataclasses.replace(m, engine=dataclasses.replace(m.engine, quantization=q)) if m.kind == "generate"
                  else m for m in models]
    port = cfg.port if a.port is None else a.port
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port} is outside [0, 65535]")
    replicas = cfg.replicas if a.replicas is None else a.replicas
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}")
    out = dataclasses.replace(cfg, host=a.host or cfg.host, port=port, models=tuple(models), replicas=replicas,
                              allow_unauthenticated=cfg.allow_unauthenticated or a.allow_unauthenticated,
                              memory=_memory_flags(a, cfg.memory),
                              self_healing=healing_of(a, cfg.self_healing))
    from runtime.serve.tenants import check_bind
    check_bind(out.host, out.registry(), out.allow_unauthenticated)
    return out


def _memory_flags(a, mem):
    """``memory:`` with the command line's --memory-strategy / --pool-size / --defrag-interval /
    --overflow-protection over it."""
    from runtime.serve.config import MemorySpec
    over = {k: v for k, v in (("strategy", getattr(a, "memory_strategy", None)),
                              ("pool_bytes", getattr(a, "pool_size", None)),
                              ("defrag_interval_s", getattr(a, "defrag_interval", None)),
                              ("overflow_protection", getattr(a, "overflow_protection", None))) if v is not None}
    return dataclasses.replace(mem, **over) if over else (mem if mem is not None else MemorySpec())


def healing_of(a, spec):
    """The config's ``self_healing`` with ``--alert-channel`` sinks and ``--guardian-mode``
    (:mod:`runtime.serve.heal.guardian`); SpecError (one line) for a channel it cannot deliver to."""
    from runtime.serve.heal.guardian import SLACK_URL_ENV, guardian, with_channels
    spec = with_channels(spec, list(getattr(a, "alert_channel", []) or []),
                         getattr(a, "alert_webhook_url", None) or os.environ.get(SLACK_URL_ENV))
    return guardian(spec) if getattr(a, "guardian_mode", False) else spec


def _cmd_serve(a) -> int:
    from devices.errors import AclError
    try:
        repos = compiled_models(a)
        cfg = resolve(a, tuple(m.name for r in repos for m in r.models))
    except (AclError, ValueError) as e:
        return _fail(getattr(e, "detail", str(e)))
    from runtime.serve.config import devices_needed
    from runtime.serve.omserve import compiled_needs
    if cfg.replicas > 1 and os.environ.get("VNPU_BACKEND", "") == "local":
        return _fail("--replicas > 1 runs Ray Serve replicas on the cluster; unset VNPU_BACKEND=local")
    from runtime.serve.config import MemorySpec
    if cfg.replicas > 1 and cfg.memory != MemorySpec():
        return _fail("memory (--pool-size, --defrag-interval ...) manages in-process engines' pools; serve with "
                     "one replica")
    if cfg.replicas > 1 and repos:
        return _fail("--replicas > 1 serves generation and embedding models; serve compiled models with one replica")
    named, auto = compiled_needs(m for r in repos for m in r.models)
    need = a.devices or devices_needed(cfg.models, named, auto) * cfg.replicas
    from runtime.cli.preflight import check_compiled_placement, check_port_free, check_serve_placement
    check_serve_placement(cfg.models, need, cfg.replicas, "vnpu serve")    # before a cluster starts or weights load
    check_compiled_placement(repos, cfg.models, need, "vnpu serve")
    check_port_free(cfg.host, cfg.port, "vnpu serve")
    if a.grpc_port:
        check_port_free(cfg.host, a.grpc_port, "vnpu serve", "--grpc-port")
    restarts = a.device_restarts if a.device_restarts is not None else device_restarts_for(cfg)
    log, progress, handler = _log_setup(a.log_level)
    try:
        return _serve(a, cfg, repos, need, restarts, log, progress)
    finally:
        _stop_stages(progress)
        from runtime.cli.console import unlog
        unlog(handler)


def _serve(a, cfg, repos, need: int, restarts: int, log, progress) -> int:
    """Serve ``cfg`` on ``need`` devices until drained (the flags and config are checked)."""
    from devices.errors import AclError
    t_start = time.monotonic()
    from runtime.cli.run import job_runtime
    from runtime.cluster.discovery import state_dir
    from runtime.observe.metrics_store import History, HistoryError, default_path
    from runtime.observe import serverfile
    from runtime.serve.metrics_sampler import Sampler
    from runtime.serve.server import Server, Service
    try:
        history = History(default_path(state_dir()))
    except (HistoryError, OSError) as e:
        return _fail(f"cannot open the metrics history: {e}")
    try:
        with job_runtime(need, device_restarts=restarts) as rt:
            if cfg.replicas > 1:
                from runtime.serve.replicas import ReplicaService
                svc = ReplicaService(cfg.models, cfg.replicas, cfg.tenants)
                svc.set_tags(cfg.tags)
            else:
                svc = Service(rt, cfg.models, cfg.tenants, tags=cfg.tags, repositories=repos)
                svc.manage_memory(cfg.memory, enabled=a.enable_memory_pool is not False)
            sampler = Sampler(svc, history, rt)
            if a.stats_interval > 0 and cfg.replicas > 1:      # the replicas' engines report in their processes
                log.info("no stats line with %d Ray Serve replicas (their engines count in their own processes)",
                         cfg.replicas)
            elif a.stats_interval > 0:
                from runtime.serve.stats_log import StatsLog
                stats = StatsLog(a.stats_interval, sampler.clock)
                svc.stat_loggers.append(stats)                   # engines built from now on report to it
                sampler.listen(stats.on_tick)
            from runtime.serve.heal import SelfHealing
            from runtime.serve.reconfigure import Reconfigurer
            healing = SelfHealing(svc, cfg.self_healing, history, sampler, rt, adjust=lambda s: healing_of(a, s))
            Reconfigurer(svc, cfg, Path(a.config).read_text() if a.config else "", healing, history)
            srv = Server(svc, cfg.host, cfg.port, cfg.allow_unauthenticated, cfg.http, grpc_port=a.grpc_port,
                         access_log=not a.no_access_log)
            loader = threading.Thread(target=_load, args=(svc, srv, progress, t_start, history), name="vnpu-serve-load",
                                      daemon=True)

            def bound(s):
                log.info("listening on %s", s.url)
                if s.grpc_url is not None:
                    log.info("gRPC on %s", s.grpc_url)
                serverfile.write(state_dir(), s.url, history.path)
                history.record_event("lifecycle", source="server", diagnosis=f"server started on {s.url}",
                                     detail={"pid": os.getpid(), "url": s.url, "slo": dataclasses.asdict(cfg.slo)})
                sampler.start()
                loader.start()

            try:
                srv.serve_forever(on_bound=bound)
            finally:
                if loader.is_alive() or loader.ident is not None:
                    loader.join()
                serverfile.remove(state_dir())
                sampler.stop()
                healing.close()
                svc.close()
            if svc.error is not None:
                history.record_event("lifecycle", source="server", diagnosis=f"server failed: {svc.error}",
                                     result=f"failed: {svc.error}")
                return _fail(svc.error)
            history.record_event("lifecycle", source="server", diagnosis="server stopped (drained)", result="ok")
    except AclError as e:
        return _fail(f"{e.code} {e.name}: {e.detail}")
    finally:
        history.close()
    log.info("drained, bye")
    return 0


def _log_setup(level: str):
    """The server's log on stdout at ``level`` (:func:`runtime.cli.console.log_to`) and its startup stages
    (through the log when stdout is not a terminal); returns (the ``vnpu.serve`` logger, the stage sink, the
    log handler -- :func:`runtime.cli.console.unlog` it when the command ends)."""
    import logging

    from runtime import stages
    from runtime.cli.console import log_to, stdout_console
    from runtime.cli.stages import StageProgress
    console = stdout_console()
    handler = log_to(console, level)
    log = logging.getLogger("vnpu.serve")
    progress = StageProgress("vnpu serve", console, plain=lambda text: log.info("%s", text))
    stages.set_sink(progress)
    return log, progress, handler


def _stop_stages(progress) -> None:
    """Startup is over (served, or failed): stop showing stages."""
    from runtime import stages
    stages.set_sink(None)
    progress.close()


def device_restarts_for(cfg) -> int:
    """Ray's ``max_restarts`` for the device actors of an embedded cluster: -1 (always) when the enabled
    self-healing policy has a ``restart_device`` trigger -- the action takes a killed device back once Ray
    has started its actor again -- else 0 (a killed device stays lost; the engines' fallback chain serves)."""
    sh = cfg.self_healing
    return -1 if sh.enabled and any(t.action == "restart_device" for t in sh.triggers) else 0


def _load(svc, srv, progress, t_start: float, history=None) -> None:
    """Load the engines (their stages shown), then log the start summary and ``ready``."""
    import logging

    from runtime.serve.summary import start_summary
    try:
        svc.load()
    except Exception:  # noqa: BLE001 - reported by the exit line
        srv.uv.should_exit = True
        return
    finally:
        _stop_stages(progress)
    log = logging.getLogger("vnpu.serve")
    if history is not None and hasattr(svc, "pick_auto_slo"):   # Ray Serve replicas pick in their processes
        for name, t in svc.pick_auto_slo(history).items():
            log.info("%s: scheduler mode auto, target p99 %g ms (from the history)", name, t)
    for line in start_summary(svc, srv.url, time.monotonic() - t_start, srv.grpc_url):
        log.info("%s", line)
    log.info("ready")


def _cmd_config(a) -> int:
    """Load a serve.yaml (either dialect): exit 0 and, with --print, its canonical form on stdout (what is
    accepted but not acted on as trailing comments); exit 2 with one line naming the file, line and key."""
    from devices.errors import AclError
    from runtime.serve.canonical import render
    from runtime.serve.config import load_config
    path = a.config_file or a.config_flag or a.config
    if path is None:
        print("vnpu serve config: error: which file? (vnpu serve config --print FILE, or --config FILE)",
              file=sys.stderr)
        return 2
    try:
        cfg = load_config(path)
    except AclError as e:
        print(f"vnpu serve config: error: {getattr(e, 'detail', e)}", file=sys.stderr)
        return 2
    if a.print_:
        sys.stdout.write(render(cfg))
    else:
        print(f"vnpu serve config: {path}: ok ({len(cfg.not_acted_on)} setting(s) accepted, not acted on)")
    return 0


def _cmd_reconfigure(a) -> int:
    return run_reconfigure(a)


def run_reconfigure(a) -> int:
    """POST /admin/reconfigure to the running server: exit 0 applied, 1 rolled back, 2 refused (``a``: the
    reconfigure flags' namespace: url, api_key, set, file, memory_pool_size, json, reconfigure_prog)."""
    import urllib.error
    import urllib.request

    from runtime.cluster.discovery import state_dir
    from runtime.observe import serverfile
    prog = getattr(a, "reconfigure_prog", "vnpu serve reconfigure")
    url = a.url
    if url is None:
        info = serverfile.read(state_dir())
        if info is None:
            print(f"{prog}: error: no running server in {state_dir()} (start vnpu serve, or give --url)",
                  file=sys.stderr)
            return 2
        url = info["url"]
    key = a.api_key or os.environ.get("VNPU_API_KEY")
    if not key:
        print(f"{prog}: error: an admin key is needed (--api-key or VNPU_API_KEY)", file=sys.stderr)
        return 2
    sets = list(a.set or [])
    if a.memory_pool_size is not None:
        sets.append(f"memory.pool_size={a.memory_pool_size}")
    body = {"config": Path(a.file).read_text() if a.file else None, "set": sets}
    req = urllib.request.Request(url.rstrip("/") + "/admin/reconfigure", data=json.dumps(body).encode(),
                                 method="POST", headers={"Authorization": f"Bearer {key}",
                                                         "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = f"HTTP {e.code}"
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2
    except (urllib.error.URLError, OSError) as e:
        print(f"{prog}: error: cannot reach {url}: {getattr(e, 'reason', e)}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{prog}: {out['result']}: {'; '.join(out['changes']) or 'no change'} "
              f"({out['health_check']}; event {out['event_id']})")
    return 0 if out["result"] == "ok" else 1
