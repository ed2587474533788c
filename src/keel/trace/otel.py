"""OpenTelemetry export of trace records: spans and metrics over OTLP/HTTP (docs/traces.md).

This module owns turning the tracer's records (trace format v1), as they are written, into
spans and metrics that follow the OpenTelemetry GenAI semantic conventions
(open-telemetry/semantic-conventions-genai; the names are those of opentelemetry-semantic-
conventions 0.66b, `gen_ai_attributes` and `gen_ai_metrics`):

- one `invoke_agent keel` span per prompt (INTERNAL), and one `invoke_agent LABEL` span per
  subagent, a child of the `task` tool span that started it;
- one `chat MODEL` span per model request (CLIENT), a child of its agent's span, with
  `gen_ai.operation.name`, `gen_ai.provider.name` (and the older `gen_ai.system`),
  `gen_ai.request.model`, `gen_ai.request.max_tokens`, `gen_ai.response.model`,
  `gen_ai.response.finish_reasons`, `gen_ai.usage.input_tokens` (all input, cached included),
  `gen_ai.usage.output_tokens`, `gen_ai.usage.cache_read.input_tokens`,
  `gen_ai.usage.cache_creation.input_tokens`, `gen_ai.response.time_to_first_chunk`;
- one `execute_tool NAME` span per tool call (INTERNAL), with `gen_ai.tool.name`,
  `gen_ai.tool.call.id`, `gen_ai.tool.type`; permission answers, hooks, notices, compactions
  and errors are span events;
- metrics `gen_ai.client.token.usage` ({token}, by `gen_ai.token.type`),
  `gen_ai.client.operation.duration` (s), `gen_ai.client.operation.time_to_first_chunk` (s),
  `gen_ai.execute_tool.duration` (s) and `keel.journal.append.duration` (s, fed by
  `journal_append`).

Content (the system prompt, messages, tool arguments and results, hook commands, permission
reasons) is exported only with `capture_content`: the attributes `gen_ai.system_instructions`,
`gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.tool.call.arguments`,
`gen_ai.tool.call.result`. Without it a span carries names, ids, models, counts and timings.

Off by default. On with the `otel` setting (`{"endpoint": URL, "capture_content": false,
"headers": {...}}`, honoured from your own settings files only) or with `KEEL_OTEL=1` and
`OTEL_EXPORTER_OTLP_ENDPOINT`. The `opentelemetry` packages are imported only when it is on
(`sink_from`); importing this module costs nothing. It must never raise into the tracer: an
export failure is the SDK's to log, and a record it cannot place is dropped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from keel.frozen import frozen

if TYPE_CHECKING:
    from keel.config.settings import Settings
    from keel.session.backend import AppendLog as Journal
    from keel.session.records import Payload, Record

__all__ = [
    "OtelConfig",
    "OtelExporter",
    "config_from",
    "observe_journal",
    "provider_name",
    "shutdown",
    "sink_from",
]

#: keel provider name → `gen_ai.provider.name` well-known value (others pass through as named).
PROVIDER_NAMES = {
    "anthropic": "anthropic",
    "openai": "openai",
    "gemini": "gcp.gemini",
    "vertex": "gcp.vertex_ai",
    "bedrock": "aws.bedrock",
    "azure": "azure.ai.openai",
    "xai": "x_ai",
    "deepseek": "deepseek",
    "groq": "groq",
    "mistral": "mistral_ai",
    "perplexity": "perplexity",
    "cohere": "cohere",
}

#: Semantic-convention advisory bucket boundaries.
TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304]
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92]  # fmt: skip


DEFAULT_TIMEOUT_S = 2.0


@frozen
class OtelConfig:
    #: The OTLP/HTTP base URL (`/v1/traces` and `/v1/metrics` are appended).
    endpoint: str
    capture_content: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    #: How long one export (retries included) and each final flush may take: a collector that
    #: is down must not hold keel's exit for long (`KEEL_OTEL_TIMEOUT`, seconds).
    timeout_s: float = 2.0  # DEFAULT_TIMEOUT_S


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def config_from(settings: Settings | None, env: Mapping[str, str]) -> OtelConfig | None:
    """The export configuration, or None when export is off: the `otel` setting wins; else
    `KEEL_OTEL=1` with `OTEL_EXPORTER_OTLP_ENDPOINT` (and `OTEL_EXPORTER_OTLP_HEADERS`,
    `KEEL_OTEL_CAPTURE_CONTENT=1` or OpenTelemetry's
    `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`)."""
    configured = getattr(settings, "otel", None) if settings is not None else None
    timeout = _seconds(env.get("KEEL_OTEL_TIMEOUT"), DEFAULT_TIMEOUT_S)
    if configured is not None:
        return OtelConfig(
            configured.endpoint, configured.capture_content, tuple(configured.headers), timeout
        )
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not (_truthy(env.get("KEEL_OTEL")) and endpoint):
        return None
    capture = _truthy(env.get("KEEL_OTEL_CAPTURE_CONTENT")) or _truthy(
        env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    )
    headers = _parse_headers(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    return OtelConfig(endpoint, capture, headers, timeout)


def _seconds(text: str | None, default: float) -> float:
    try:
        value = float(text or "")
    except ValueError:
        return default
    return value if 0 < value <= 60 else default


def _parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """`k1=v1,k2=v2` (values URL-encoded, as OpenTelemetry's environment variable has them)."""
    from urllib.parse import unquote

    out = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out.append((unquote(key.strip()), unquote(value.strip())))
    return tuple(out)


_ACTIVE: list[OtelExporter] = []
#: What the SDK logged about failed exports (it logs to the `opentelemetry` logger, which would
#: otherwise print over the TUI): reported once, by `shutdown`.
_FAILURES: list[str] = []


class _Failures(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if len(_FAILURES) < 20:
            message = record.getMessage().strip()
            _FAILURES.append(message.splitlines()[0][:300] if message else record.levelname)


def _capture_sdk_logs() -> None:
    logger = logging.getLogger("opentelemetry")
    if not any(isinstance(h, _Failures) for h in logger.handlers):
        logger.addHandler(_Failures(logging.WARNING))
        logger.propagate = False


def sink_from(
    settings: Settings | None, env: Mapping[str, str] | None = None
) -> Callable[[dict[str, Any]], None] | None:
    """A record sink for `Tracer.add_sink` when export is on (None when off). It imports the
    OpenTelemetry SDK; `shutdown()` flushes and stops every sink made."""
    config = config_from(settings, os.environ if env is None else env)
    if config is None:
        return None
    exporter = OtelExporter(config)
    _ACTIVE.append(exporter)
    return exporter


def observe_journal(journal: Journal) -> bool:
    """Time `journal`'s appends (the write, and the fsync when durable) into
    `keel.journal.append.duration` of every active exporter. The journal has no observer hook
    of its own yet, so this wraps the instance's `append`; False (and nothing done) when no
    export is on."""
    if not _ACTIVE:
        return False
    exporters = list(_ACTIVE)
    append = journal.append

    def timed(payload: Payload, *, durable: bool = True) -> Record:
        start = time.perf_counter()
        try:
            return append(payload, durable=durable)
        finally:
            seconds = time.perf_counter() - start
            for exporter in exporters:
                exporter.journal_append(seconds, durable=durable)

    journal.append = timed  # type: ignore[method-assign]
    return True


def shutdown() -> list[str]:
    """End the spans still open, export everything buffered (within each exporter's timeout),
    stop the exporters. Returns one line per endpoint that failed, for the caller to show as a
    warning (empty when all went well)."""
    endpoints = []
    while _ACTIVE:
        exporter = _ACTIVE.pop()
        exporter.shutdown()
        endpoints.append(exporter.config.endpoint)
    failures, _FAILURES[:] = list(_FAILURES), []
    if not failures:
        return []
    first = failures[0] if len(failures[0]) <= 160 else failures[0][:157] + "..."
    return [
        f"OpenTelemetry export to {endpoint} failed: {first} ({len(failures)} problem(s))"
        for endpoint in endpoints
    ]


def provider_name(model: str, default: str = "") -> tuple[str, str]:
    """(`gen_ai.provider.name`, bare model id) of a `provider/model` spec or a bare model id."""
    provider, sep, bare = model.partition("/")
    if model.startswith("scripted:"):
        return "scripted", model.removeprefix("scripted:")
    if not sep:
        provider, bare = default, model
    return PROVIDER_NAMES.get(provider, provider or "unknown"), bare


def _ns(t: float) -> int:
    return int(t * 1_000_000_000)


def _parts(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """keel's stored message JSON → the semantic conventions' message parts."""
    parts: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
        elif kind == "thinking" and block.get("text"):
            parts.append({"type": "reasoning", "content": block.get("text", "")})
        elif kind == "tool_use":
            parts.append(
                {
                    "type": "tool_call",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": block.get("input"),
                }
            )
        elif kind == "tool_result":
            from keel.trace.stats import block_text

            response = block_text(block)
            parts.append(
                {"type": "tool_call_response", "id": block.get("tool_use_id"), "response": response}
            )
    return parts


def _messages(messages: list[dict[str, Any]]) -> str:
    return json.dumps(
        [{"role": m.get("role", "user"), "parts": _parts(m)} for m in messages],
        ensure_ascii=False,
    )


class OtelExporter:
    """Consumes records one at a time (a `Tracer` sink) and exports spans and metrics."""

    def __init__(self, config: OtelConfig, *, export_interval_s: float = 60.0) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from keel import __version__

        _capture_sdk_logs()
        self.config = config
        base = config.endpoint.rstrip("/")
        timeout = config.timeout_s
        headers = dict(config.headers)
        resource = Resource.create({"service.name": "keel", "service.version": __version__})
        self._tracer_provider = TracerProvider(resource=resource)
        self._tracer_provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"{base}/v1/traces", headers=headers, timeout=timeout)
            )
        )
        self._reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics", headers=headers, timeout=timeout),
            export_interval_millis=export_interval_s * 1000,
        )
        self._meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader])
        self._tracer = self._tracer_provider.get_tracer("keel", __version__)
        meter = self._meter_provider.get_meter("keel", __version__)
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._first_chunk = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to receive the first chunk of a streamed response.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._tool_duration = meter.create_histogram(
            "gen_ai.execute_tool.duration",
            unit="s",
            description="Duration of a tool execution.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._journal = meter.create_histogram(
            "keel.journal.append.duration",
            unit="s",
            description="Time to append one record to the session journal (fsync included "
            "when durable).",
            explicit_bucket_boundaries_advisory=[0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1],
        )
        self._lock = threading.Lock()
        self._session_id = ""
        self._default_provider = ""
        self._turn: Any = None  # the main agent's invoke_agent span of the current prompt
        # (label, the task call that started it) → the subagent's invoke_agent span: two
        # subagents may share a label.
        self._subagents: dict[tuple[str, str], Any] = {}
        self._chats: dict[int, tuple[Any, dict[str, Any]]] = {}  # req → (span, metric attrs)
        self._tools: dict[str, Any] = {}  # tool-use id → execute_tool span
        self._tree: Any = None
        if config.capture_content:
            from keel.trace.stats import Tree

            self._tree = Tree()
        self._closed = False

    # -- the sink ------------------------------------------------------------------------------

    def __call__(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return
            handler = getattr(self, f"_on_{record.get('kind')}", None)
            if handler is None:
                return
            data = record.get("data")
            try:
                handler(record, data if isinstance(data, dict) else {})
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                # A record of a shape this exporter does not know: dropped, said at shutdown
                # (raising would make the tracer remove the sink).
                if len(_FAILURES) < 20:
                    _FAILURES.append(f"a {record.get('kind')} record was not exported ({exc!r})")

    def journal_append(self, seconds: float, *, durable: bool) -> None:
        """Record one journal append's latency (the journal's observer calls this)."""
        with self._lock:
            if not self._closed:
                self._journal.record(seconds, {"keel.journal.durable": durable})

    # -- spans ---------------------------------------------------------------------------------

    def _context(self, span: Any) -> Any:
        from opentelemetry import trace

        return None if span is None else trace.set_span_in_context(span)

    def _agent_span(self, record: Mapping[str, Any]) -> Any:
        """The invoke_agent span a record of `record["agent"]` belongs under (made for a
        subagent on its first record, under the `task` call that started it)."""
        label = str(record.get("agent") or "")
        if not label:
            return self._turn
        parent_call = str(record.get("parent") or "")
        span = self._subagents.get((label, parent_call))
        if span is None:
            from opentelemetry.trace import SpanKind

            parent = self._tools.get(parent_call, self._turn)
            span = self._tracer.start_span(
                f"invoke_agent {label}",
                context=self._context(parent),
                kind=SpanKind.INTERNAL,
                start_time=_ns(float(record.get("t") or time.time())),
                attributes=self._common("invoke_agent") | {"gen_ai.agent.name": label},
            )
            self._subagents[(label, parent_call)] = span
        return span

    def _common(self, operation: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {"gen_ai.operation.name": operation}
        if self._session_id:
            attrs["gen_ai.conversation.id"] = self._session_id
        return attrs

    def _on_session(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        self._session_id = str(data.get("session_id") or self._session_id)
        self._default_provider = provider_name(str(data.get("model") or ""))[0]

    def _on_turn_start(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        if record.get("agent"):
            self._agent_span(record)
            return
        from opentelemetry.trace import SpanKind

        if self._turn is not None:
            self._turn.end(end_time=_ns(float(record.get("t") or time.time())))
        attrs = self._common("invoke_agent") | {"gen_ai.agent.name": "keel"}
        if self._default_provider:
            attrs["gen_ai.provider.name"] = self._default_provider
        if data.get("resumed"):
            attrs["keel.resumed"] = True
        if self.config.capture_content:
            sent = str(data.get("sent") or data.get("prompt") or "")
            attrs["gen_ai.input.messages"] = json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": sent}]}],
                ensure_ascii=False,
            )
        self._turn = self._tracer.start_span(
            "invoke_agent keel",
            kind=SpanKind.INTERNAL,
            start_time=_ns(float(record.get("t") or time.time())),
            attributes=attrs,
        )

    def _on_turn_end(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        if record.get("agent"):  # a subagent's prompt is done (a background one outlives its call)
            key = (str(record["agent"]), str(record.get("parent") or ""))
            sub = self._subagents.pop(key, None)
            if sub is not None:
                if data.get("error"):
                    self._fail(sub, "agent_error", str(data["error"]))
                sub.end(end_time=_ns(float(record.get("t") or time.time())))
            return
        span = self._turn
        if span is None:
            return
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
        if usage:
            span.set_attribute(
                "gen_ai.usage.input_tokens",
                sum(int(usage.get(k) or 0) for k in ("input", "cache_read", "cache_write")),
            )
            span.set_attribute("gen_ai.usage.output_tokens", int(usage.get("output") or 0))
        if data.get("stop_reason"):
            span.set_attribute("keel.stop_reason", str(data["stop_reason"]))
        if data.get("error"):
            self._fail(span, "agent_error", str(data["error"]))
        span.end(end_time=_ns(float(record.get("t") or time.time())))
        self._turn = None

    def _on_request(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        from opentelemetry.trace import SpanKind

        provider, model = provider_name(str(data.get("model") or ""), self._default_provider)
        operation = "chat"
        attrs = self._common(operation) | {
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
            "gen_ai.request.model": model,
            "keel.request.purpose": str(data.get("purpose") or "turn"),
        }
        if record.get("agent"):
            attrs["gen_ai.agent.name"] = str(record["agent"])
        if isinstance(data.get("max_tokens"), int):
            attrs["gen_ai.request.max_tokens"] = data["max_tokens"]
        if isinstance(data.get("temperature"), int | float):
            attrs["gen_ai.request.temperature"] = float(data["temperature"])
        if self._tree is not None:
            rebuilt = self._tree.add(record)
            if rebuilt.system:
                attrs["gen_ai.system_instructions"] = json.dumps(
                    [{"type": "text", "content": rebuilt.system}], ensure_ascii=False
                )
            attrs["gen_ai.input.messages"] = _messages(rebuilt.messages)
        span = self._tracer.start_span(
            f"{operation} {model}",
            context=self._context(self._agent_span(record)),
            kind=SpanKind.CLIENT,
            start_time=_ns(float(record.get("t") or time.time())),
            attributes=attrs,
        )
        metric_attrs = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
        }
        self._chats[int(record.get("req") or 0)] = (span, metric_attrs)

    def _on_response(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        entry = self._chats.pop(int(record.get("req") or 0), None)
        if entry is None:
            return
        span, metric_attrs = entry
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        assert isinstance(usage, dict)
        inp, out = int(usage.get("input") or 0), int(usage.get("output") or 0)
        read, write = int(usage.get("cache_read") or 0), int(usage.get("cache_write") or 0)
        message = data.get("message") if isinstance(data.get("message"), dict) else {}
        assert isinstance(message, dict)
        attrs: dict[str, Any] = {
            "gen_ai.usage.input_tokens": inp + read + write,
            "gen_ai.usage.output_tokens": out,
            "gen_ai.usage.cache_read.input_tokens": read,
            "gen_ai.usage.cache_creation.input_tokens": write,
            "keel.cost_usd": float(data.get("cost") or 0.0),
            "keel.attempts": int(data.get("attempts") or 1),
        }
        if message.get("model"):
            attrs["gen_ai.response.model"] = str(message["model"])
            metric_attrs["gen_ai.response.model"] = str(message["model"])
        if data.get("stop_reason"):
            attrs["gen_ai.response.finish_reasons"] = [str(data["stop_reason"])]
        if isinstance(data.get("ttft_ms"), int | float):
            attrs["gen_ai.response.time_to_first_chunk"] = data["ttft_ms"] / 1000
            self._first_chunk.record(data["ttft_ms"] / 1000, metric_attrs)
        if self.config.capture_content and message:
            reply = {
                "role": "assistant",
                "parts": _parts(message),
                "finish_reason": str(data.get("stop_reason") or ""),
            }
            attrs["gen_ai.output.messages"] = json.dumps([reply], ensure_ascii=False)
        span.set_attributes(attrs)
        for notice in data.get("notices") or ():
            text = {"message": str(notice)} if self.config.capture_content else {}
            span.add_event("keel.notice", text)
        self._tokens.record(inp + read + write, metric_attrs | {"gen_ai.token.type": "input"})
        self._tokens.record(out, metric_attrs | {"gen_ai.token.type": "output"})
        if isinstance(data.get("duration_ms"), int | float):
            self._duration.record(data["duration_ms"] / 1000, metric_attrs)
        span.end(end_time=_ns(float(record.get("t") or time.time())))

    def _on_http(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        entry = self._chats.get(int(record.get("req") or 0))
        if entry is None:
            return
        span = entry[0]
        attrs: dict[str, Any] = {"http.request.method": str(data.get("method") or "POST")}
        if isinstance(data.get("status"), int):
            attrs["http.response.status_code"] = data["status"]
        if data.get("error"):  # "ReadTimeout: …": the class; the text may quote the server
            attrs["error.type"] = str(data["error"]).split(":", 1)[0][:100]
            if self.config.capture_content:
                attrs["keel.http.error"] = str(data["error"])[:500]
        span.add_event("keel.http", attrs, timestamp=_ns(float(record.get("t") or time.time())))

    def _on_tool_start(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        from opentelemetry.trace import SpanKind

        name = str(data.get("name") or "?")
        call_id = str(data.get("id") or "")
        attrs = self._common("execute_tool") | {
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
        }
        if record.get("agent"):
            attrs["gen_ai.agent.name"] = str(record["agent"])
        if self.config.capture_content and "input" in data:
            attrs["gen_ai.tool.call.arguments"] = json.dumps(data.get("input"), ensure_ascii=False)
        started = data.get("started_at")  # on a tool_end standing in for a missing start
        start = started if isinstance(started, int | float) else record.get("t") or time.time()
        self._tools[call_id] = self._tracer.start_span(
            f"execute_tool {name}",
            context=self._context(self._agent_span(record)),
            kind=SpanKind.INTERNAL,
            start_time=_ns(float(start)),
            attributes=attrs,
        )

    def _on_tool_end(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        call_id = str(data.get("id") or "")
        span = self._tools.pop(call_id, None)
        t = float(record.get("t") or time.time())
        for key in [k for k in self._subagents if k[1] == call_id]:
            self._subagents.pop(key).end(end_time=_ns(t))  # its task call is over
        if span is None:  # refused before it ran: no tool_start, a span of no length
            self._on_tool_start(record, data)
            span = self._tools.pop(call_id)
        seconds = float(data.get("seconds") or 0.0)
        started = data.get("started_at")
        end = float(started) + seconds if isinstance(started, int | float) else t
        attrs: dict[str, Any] = {"gen_ai.tool.name": str(data.get("name") or "?")}
        if data.get("is_error"):
            attrs["error.type"] = "tool_error"
            self._fail(span, "tool_error", "the tool returned an error")
        if self.config.capture_content:
            span.set_attribute("gen_ai.tool.call.result", str(data.get("output") or ""))
        self._tool_duration.record(seconds, attrs)
        span.end(end_time=_ns(end))

    def _event(self, record: Mapping[str, Any], name: str, attrs: Mapping[str, Any]) -> None:
        span = self._agent_span(record)
        if span is not None:
            clean = {k: v for k, v in attrs.items() if v is not None}
            span.add_event(name, clean, timestamp=_ns(float(record.get("t") or time.time())))

    def _on_permission(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        attrs: dict[str, Any] = {
            "gen_ai.tool.name": str(data.get("tool") or ""),
            "gen_ai.tool.call.id": str(data.get("tool_use_id") or ""),
            "keel.permission.allow": bool(data.get("allow")),
            "keel.permission.by": str(data.get("by") or ""),
            "keel.permission.scope": str(data.get("scope") or ""),
            "keel.permission.waited_ms": float(data.get("waited_ms") or 0.0),
        }
        if self.config.capture_content and data.get("reason"):
            attrs["keel.permission.reason"] = str(data["reason"])
        span = self._tools.get(str(data.get("tool_use_id") or "")) or self._agent_span(record)
        if span is not None:
            span.add_event(
                "keel.permission", attrs, timestamp=_ns(float(record.get("t") or time.time()))
            )

    def _on_hook(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        attrs = {
            "keel.hook.event": str(data.get("event") or ""),
            "keel.hook.target": str(data.get("target") or ""),
            "keel.hook.duration_ms": float(data.get("duration_ms") or 0.0),
            "keel.hook.exit_code": data.get("exit_code")
            if isinstance(data.get("exit_code"), int)
            else None,
            "keel.hook.blocked": bool(data.get("blocked")),
            "keel.hook.halted": bool(data.get("halted")),
        }
        if self.config.capture_content:
            attrs["keel.hook.command"] = str(data.get("command") or "")
        self._event(record, "keel.hook", attrs)

    def _on_compaction(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        self._event(
            record,
            "keel.compaction",
            {
                "keel.compaction.trigger": str(data.get("trigger") or ""),
                "keel.compaction.tokens_before": data.get("tokens_before"),
                "keel.compaction.tokens_after": data.get("tokens_after"),
            },
        )

    def _on_notice(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        attrs = {"level": str(data.get("level") or "")}
        if self.config.capture_content:
            attrs["message"] = str(data.get("message") or "")
        self._event(record, "keel.notice", attrs)

    def _on_error(self, record: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        span = self._agent_span(record)
        if span is not None:
            self._fail(span, "keel_error", str(data.get("message") or "error"))

    def _fail(self, span: Any, kind: str, message: str) -> None:
        """Mark `span` failed; the message (it may quote a command or a path) only with
        capture_content."""
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", kind)
        text = message[:500] if self.config.capture_content else kind
        span.set_status(Status(StatusCode.ERROR, text))

    # -- the end -------------------------------------------------------------------------------

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            end = _ns(time.time())
            for span, _ in self._chats.values():
                span.end(end_time=end)
            for span in self._tools.values():
                span.end(end_time=end)
            for span in self._subagents.values():
                span.end(end_time=end)
            if self._turn is not None:
                self._turn.end(end_time=end)
            self._chats.clear()
            self._tools.clear()
            self._subagents.clear()
            self._turn = None
        millis = int(self.config.timeout_s * 1000)
        self._tracer_provider.force_flush(timeout_millis=millis)
        self._tracer_provider.shutdown()
        self._meter_provider.force_flush(timeout_millis=millis)
        self._meter_provider.shutdown(timeout_millis=millis)
