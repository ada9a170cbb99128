"""The FastAPI application: OpenAI's /v1/completions and /v1/chat/completions (SSE streaming),
/v1/models, /health and /metrics, over any ``ServeBackend``.

Every refusal is a 4xx with the OpenAI error envelope (``specc.serve.schemas.error_body``) and
costs no engine time: the body is parsed and validated here (any content type, since curl users
forget the header), the prompt is tokenized and checked against the model (``specc.serve.prompts``),
and only then is the request submitted. A generation that fails answers 500 for that request
only. A client that goes away cancels its request: while the server waits for tokens (a
watcher on the connection) and while it streams them (the response's task is cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from specc.serve.backend import GenerationError, GenerationRequest, ModelInfo, ServeBackend
from specc.serve.metrics import ServeMetrics
from specc.serve.prompts import RequestError, chat_prompt_ids, check_length, check_model, completion_prompt_ids
from specc.serve.schemas import ChatCompletionRequest, CompletionRequest, error_body, unsupported
from specc.serve.text import IncrementalText

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
CLIENT_GONE = 499  # nginx's convention: the client closed the connection before the answer


class _ClientGone(Exception):
    pass


def create_app(backend: ServeBackend, info: ModelInfo | None = None) -> FastAPI:
    """The application serving ``backend`` (``info``: defaults to ``backend.info``)."""
    from specc import __version__

    info = info or backend.info
    app = FastAPI(title="specc serve", version=__version__, docs_url=None, redoc_url=None)
    metrics = ServeMetrics(backend)
    app.state.backend, app.state.info, app.state.metrics = backend, info, metrics
    app.add_middleware(_CountRequests, metrics=metrics)
    created = int(time.time())

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError):
        return JSONResponse(error_body(exc.message, exc.type, exc.code, exc.param), status_code=exc.status)

    @app.exception_handler(_ClientGone)
    async def _gone(request: Request, exc: _ClientGone):  # nobody reads this; the request was cancelled
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return JSONResponse(error_body(f"{detail}: {request.method} {request.url.path}", code=_slug(detail)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):  # a bug: still JSON, and the server goes on
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error",
                                       "internal_error"), status_code=500)

    @app.get("/health")
    async def health():
        if not backend.alive():
            return JSONResponse({"status": "engine worker stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": info.name, "object": "model", "created": created,
                                            "owned_by": "specc", "max_model_len": info.max_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(request, CompletionRequest)
        _check_request(body, info)
        ids = completion_prompt_ids(body.prompt, info)
        check_length(len(ids), body.max_tokens, info)
        gen = _Generation(backend, info, metrics, ids, body.max_tokens, _stop(body, info), "cmpl", _sampling(body))
        echo = _prompt_text(body.prompt, ids, info) if body.echo else ""

        def choice(text: str, tokens: list[int], finish_reason, with_prompt: bool = True):
            out = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
            if body.return_token_ids:
                out.update(prompt_token_ids=ids, token_ids=tokens) if with_prompt else out.update(token_ids=tokens)
            return out

        if body.stream:
            sent = False

            def chunk(text, tokens, finish_reason):
                nonlocal sent
                if not text and finish_reason is None and not (body.return_token_ids and tokens):
                    return None
                first, sent = not sent, True  # the prompt's ids go with the first chunk only
                return {"id": gen.id, "object": "text_completion", "created": int(time.time()), "model": info.name,
                        "choices": [choice(text, tokens, finish_reason, with_prompt=first)]}

            return await _stream(request, gen, chunk, echo, body, object_="text_completion")
        await _unless_disconnected(request, gen.run())
        return {"id": gen.id, "object": "text_completion", "created": int(time.time()), "model": info.name,
                "choices": [choice(echo + gen.text.text, gen.tokens, gen.finish_reason)], "usage": gen.usage()}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _parse(request, ChatCompletionRequest)
        _check_request(body, info)
        ids = chat_prompt_ids(body.messages, info)
        asked = body.max_completion_tokens or body.max_tokens
        max_tokens = asked or info.max_len - len(ids)  # OpenAI: the rest of the context
        if max_tokens < 1:
            raise RequestError(f"the messages take {len(ids)} tokens, the server's whole maximum length "
                               f"({info.max_len})", code="context_length_exceeded", param="messages")
        check_length(len(ids), max_tokens, info,
                     "max_completion_tokens" if body.max_completion_tokens else "max_tokens")
        gen = _Generation(backend, info, metrics, ids, max_tokens, _stop(body, info), "chatcmpl", _sampling(body))

        if body.stream:
            started = False

            def chunk(text, tokens, finish_reason):
                nonlocal started
                delta = {"content": text} if text else {}
                if not started:  # the first event names the role
                    delta, started = {"role": "assistant", "content": text}, True
                elif not delta and finish_reason is None and not (body.return_token_ids and tokens):
                    return None
                c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
                if body.return_token_ids and tokens:
                    c["token_ids"] = tokens
                return {"id": gen.id, "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": info.name, "choices": [c]}

            return await _stream(request, gen, chunk, "", body, object_="chat.completion.chunk")
        await _unless_disconnected(request, gen.run())
        c = {"index": 0, "message": {"role": "assistant", "content": gen.text.text}, "logprobs": None,
             "finish_reason": gen.finish_reason}
        if body.return_token_ids:
            c.update(prompt_token_ids=ids, token_ids=gen.tokens)
        return {"id": gen.id, "object": "chat.completion", "created": int(time.time()), "model": info.name,
                "choices": [c], "usage": gen.usage()}

    return app


class _Generation:
    """One request on the backend: its tokens, its text (with stop strings), why it finished,
    and the metrics it feeds."""

    def __init__(self, backend, info: ModelInfo, metrics: ServeMetrics, prompt_ids: list[int], max_tokens: int,
                 stop: tuple[str, ...], prefix: str, sampling=None):
        self.backend, self.metrics, self.model = backend, metrics, info.name
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.prompt_ids = prompt_ids
        self.request = GenerationRequest(self.id, tuple(prompt_ids), int(max_tokens), sampling=sampling)
        self.text = IncrementalText(info.tokenizer, stop, info.eos_token_ids)
        self.tokens: list[int] = []
        self.finish_reason: str | None = None

    async def pieces(self):
        """Yields (new text, new token ids) per chunk; ``finish_reason`` is set before the last."""
        start = time.perf_counter()
        self.metrics.prompt_tokens.inc(len(self.prompt_ids))
        chunks = self.backend.submit(self.request)
        try:
            async for chunk in chunks:
                if not self.tokens and chunk.tokens:
                    self.metrics.time_to_first_token.observe(time.perf_counter() - start)
                self.tokens += chunk.tokens
                self.metrics.completion_tokens.inc(len(chunk.tokens))
                text = self.text.push(chunk.tokens)
                if chunk.finish_reason is not None and not self.text.stopped:
                    text += self.text.flush()
                if self.text.stopped:  # a stop string: done; closing `chunks` cancels the rest
                    self.finish_reason = "stop"
                elif chunk.finish_reason is not None:
                    self.finish_reason = chunk.finish_reason
                yield text, list(chunk.tokens)
                if self.finish_reason is not None:
                    self.metrics.duration.observe(time.perf_counter() - start)
                    return
        finally:
            await chunks.aclose()

    async def run(self) -> None:
        async for _ in self.pieces():
            pass

    def usage(self) -> dict:
        n, m = len(self.prompt_ids), len(self.tokens)
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}


async def _stream(request: Request, gen: _Generation, chunk, echo: str, body, object_: str):
    """Server-sent events: the first piece is awaited before answering (a generation that fails
    at once gets a 500 JSON error, not a broken stream), then one ``data:`` event per piece, a
    usage event if ``stream_options.include_usage``, and ``data: [DONE]``."""
    pieces = gen.pieces()
    try:
        first = await _unless_disconnected(request, anext(pieces))
    except BaseException:
        await pieces.aclose()
        raise

    async def events():
        try:
            item, prefix = first, echo
            while True:
                data = chunk(prefix + item[0], item[1], gen.finish_reason)
                prefix = ""
                if data is not None:
                    yield _sse(data)
                if gen.finish_reason is not None:
                    break
                item = await anext(pieces)
            if body.stream_options is not None and body.stream_options.include_usage:
                yield _sse({"id": gen.id, "object": object_, "created": int(time.time()), "model": gen.model,
                            "choices": [], "usage": gen.usage()})
        except GenerationError as exc:
            yield _sse(error_body(f"generation failed: {exc}", "server_error", "generation_failed"))
        finally:
            await pieces.aclose()
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _unless_disconnected(request: Request, awaitable):
    """Await ``awaitable`` unless the client disconnects first (then it is cancelled, which
    cancels its request on the backend, and the handler answers nothing: status 499)."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        raise _ClientGone()
    except GenerationError as exc:
        raise RequestError(f"generation failed: {exc}", 500, "generation_failed", type_="server_error") from exc
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(BaseException):
                await work


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _parse(request: Request, model):
    raw = await request.body()
    if not raw.strip():
        raise RequestError("the request body is empty: send a JSON object")
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise RequestError(f"the request body must be a JSON object, not {type(obj).__name__}")
    try:  # a field sent as null asks for nothing: the default (clients send e.g. "tools": null)
        return model.model_validate({k: v for k, v in obj.items() if v is not None})
    except ValidationError as exc:
        message, field = _validation_message(exc)
        raise RequestError(message, param=field) from None


_TYPE_TAG = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|[A-Z]\w*)$")  # union members in a loc


def _validation_message(exc: ValidationError) -> tuple[str, str]:
    """One line for pydantic's first error: which field, and what is wrong with it."""
    e = exc.errors(include_url=False)[0]
    parts = [str(p) for p in e["loc"] if not _TYPE_TAG.match(str(p))]
    field = ".".join(parts) or "body"
    if e["type"] == "extra_forbidden":
        return f"unknown field {field!r} (this server does not support it)", field
    if e["type"] == "missing":
        return f"{field!r} is required", field
    if e["type"] == "value_error":  # our validators' own messages
        return f"{field}: {e['msg'].removeprefix('Value error, ')}", field
    return f"{field}: {e['msg']} (got {json.dumps(e.get('input'), default=str)[:80]})", field


def _check_request(body, info: ModelInfo) -> None:
    check_model(body.model, info)
    refused = unsupported(body)
    if refused:
        raise RequestError(refused[0], param=refused[1], code="unsupported")


def _sampling(body):
    """The request's SamplingParams (None: greedy); a value SamplingParams refuses is a 400."""
    try:
        return body.sampling_params()
    except ValueError as exc:
        field = str(exc).split()[0]
        raise RequestError(str(exc), param=field) from None


def _stop(body, info: ModelInfo) -> tuple[str, ...]:
    stop = body.stop_strings()
    if stop and info.tokenizer is None:
        raise RequestError("stop strings need a tokenizer; this model ships none", param="stop")
    return stop


def _prompt_text(prompt, ids: list[int], info: ModelInfo) -> str:
    if isinstance(prompt, str):
        return prompt
    t = IncrementalText(info.tokenizer)
    return t.push(ids) + t.flush()


def _slug(text: str) -> str:
    return re.sub(r"\W+", "_", text.strip().lower()).strip("_") or "error"


class _CountRequests:
    """ASGI middleware: counts answered requests by endpoint and status (streaming included)."""

    def __init__(self, app, metrics: ServeMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        endpoint = scope.get("path") if scope.get("path") in ENDPOINTS else "other"
        status = {"code": CLIENT_GONE}

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(endpoint, str(status["code"])).inc()
