"""A server benchcal did not start: ``benchcal bench --serve --endpoint http://HOST:PORT/v1``.

The endpoint is checked before anything is sent (:func:`parse_endpoint`): http or https, no credentials or query
in the URL, and plain HTTP only to a loopback host unless the user allows it. An API key comes from the environment
variable the user names (``--api-key-env``), is sent as ``Authorization: Bearer`` and nowhere else: every text a
record or an error carries passes :meth:`Endpoint.redact`, and the stored record is searched for the key before it
is written.

:func:`probe` asks the server what it is: ``/v1/models`` (the served model and who owns it: ``vllm``, ``llamacpp``
for llama-server, ``me`` for llama-cpp-python's server), ``/version`` (vLLM's), ``/props`` (llama-server's build) and
whether ``/metrics`` answers. That names the engine and the server; a server of another kind is refused (the serving
model knows these three). Prompts are built with the server's own tokenizer, as the harness builds them for the
servers it starts (:class:`ExternalServer`), so each request is exactly its length.
"""

from __future__ import annotations

import ipaddress
import json
import random
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from harness.engines.setup import ServerSetup, sized_text, token_windows
from predictor.errors import BenchcalError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# who /v1/models says owns the model -> the server benchcal drives and the engine it runs
KINDS = {"vllm": ("vllm", "vllm"), "llamacpp": ("llama-server", "llama.cpp"), "me": ("llama-cpp-python", "llama.cpp")}
EXTERNAL_NOTE = "an external server: benchcal launched no engine and measured no memory"
EXTERNAL_KEYS = ("endpoint", "api_key_env", "allow_insecure", "served_model")


def normalize_external(table: Any) -> dict[str, Any]:
    """``serve.external``: ``endpoint`` (required), ``api_key_env`` (the name of the variable, never a key),
    ``allow_insecure`` and ``served_model``, checked as :func:`parse_endpoint` checks them (the key itself is read
    when the run starts); BenchcalError naming the first problem."""
    if not isinstance(table, Mapping):
        raise BenchcalError(f"serve.external must be a table (endpoint = \"http://HOST:PORT/v1\"), got {table!r}")
    unknown = sorted(set(table) - set(EXTERNAL_KEYS))
    if unknown:
        raise BenchcalError(f"serve.external has no option {unknown[0]!r} (options: {', '.join(EXTERNAL_KEYS)})")
    for name in ("api_key_env", "served_model"):
        if table.get(name) is not None and not isinstance(table[name], str):
            raise BenchcalError(f"serve.external.{name} must be a string, got {table[name]!r}")
    if not isinstance(table.get("allow_insecure", False), bool):
        raise BenchcalError(f"serve.external.allow_insecure must be true or false, got {table['allow_insecure']!r}")
    endpoint = parse_endpoint(table.get("endpoint"), api_key_env=table.get("api_key_env"),
                              allow_insecure=bool(table.get("allow_insecure")), read_key=False)
    return {"endpoint": endpoint.url, "api_key_env": table.get("api_key_env"),
            "allow_insecure": bool(table.get("allow_insecure")), "served_model": table.get("served_model")}


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server's address: ``root`` (scheme://host:port, where vLLM's ``/version`` and
    ``/metrics`` are) and ``api`` (``root`` + the path given, ending in ``/v1``)."""

    url: str
    root: str
    api: str
    host: str
    secure: bool
    loopback: bool
    api_key_env: str | None = None
    key: str | None = field(default=None, repr=False, compare=False)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def redact(self, text: Any) -> Any:
        """``text`` with the API key replaced by the name of its variable (other values unchanged)."""
        if self.key and isinstance(text, str):
            return text.replace(self.key, f"<${self.api_key_env}>")
        return text

    def redact_all(self, value: Any) -> Any:
        """:meth:`redact` through a JSON-like value."""
        if isinstance(value, Mapping):
            return {self.redact(k): self.redact_all(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact_all(v) for v in value]
        return self.redact(value)

    def describe(self) -> dict[str, Any]:
        """What a record keeps of the endpoint: never the key, only the variable that held it."""
        return {"url": self.url, "api_key_env": self.api_key_env, "tls": self.secure, "loopback": self.loopback}


def parse_endpoint(url: str, *, api_key_env: str | None = None, allow_insecure: bool = False,
                   environ: Mapping[str, str] | None = None, read_key: bool = True) -> Endpoint:
    """The endpoint ``url`` names, checked; BenchcalError (one line, no key in it) for what cannot be used.
    ``read_key``: read the key from ``api_key_env`` now (refused where unset); else only its name is checked."""
    import os

    text = str(url or "").strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise BenchcalError(f"--endpoint {text!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchcalError(f"--endpoint takes http://HOST:PORT/v1 or https://HOST/v1, got {text!r}")
    if parts.username or parts.password:
        raise BenchcalError("--endpoint must not hold credentials: put the API key in an environment variable and "
                            "name it with --api-key-env")
    if parts.query or parts.fragment:
        raise BenchcalError(f"--endpoint takes no query or fragment, got {parts.scheme}://{parts.hostname}...")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        raise BenchcalError(f"--endpoint is the server's OpenAI API base, ending in /v1 (http://HOST:PORT/v1), "
                            f"got path {parts.path or '/'!r}")
    host = parts.hostname
    loopback = _loopback(host)
    secure = parts.scheme == "https"
    if not secure and not loopback and not allow_insecure:
        raise BenchcalError(f"--endpoint {parts.scheme}://{host}: plain HTTP to a host other than loopback sends the "
                            "prompts (and any API key) unencrypted; use https://, or pass --allow-insecure")
    key = None
    if api_key_env is not None:
        if not ENV_NAME.match(api_key_env):
            raise BenchcalError(f"--api-key-env takes the name of an environment variable, got {api_key_env!r}")
        key = (os.environ if environ is None else environ).get(api_key_env) if read_key else None
        if read_key and not key:
            raise BenchcalError(f"--api-key-env {api_key_env}: that environment variable is not set or is empty")
    netloc = f"[{host}]" if ":" in host else host
    root = f"{parts.scheme}://{netloc}{f':{port}' if port else ''}"
    return Endpoint(url=f"{root}{path}", root=root, api=f"{root}{path}", host=host, secure=secure,
                    loopback=loopback, api_key_env=api_key_env, key=key)


def _request(endpoint: Endpoint, url: str, body: Mapping[str, Any] | None = None,
             timeout: float = 10.0) -> tuple[int | None, bytes, str | None]:
    """(status, body, error) of a GET (or a JSON POST with ``body``); never raises, the error redacted."""
    headers = {**endpoint.headers(), **({"Content-Type": "application/json"} if body is not None else {})}
    data = json.dumps(dict(body)).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read(), None
    except urllib.error.HTTPError as exc:
        return int(exc.code), b"", endpoint.redact(f"HTTP {exc.code}")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, b"", endpoint.redact(f"{type(exc).__name__}: {reason}")


def _json(endpoint: Endpoint, url: str, body: Mapping[str, Any] | None = None) -> Any:
    status, raw, _error = _request(endpoint, url, body)
    if status != 200:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def probe(endpoint: Endpoint, served_model: str | None = None) -> dict[str, Any]:
    """What the server says of itself, before any load: its models, the one to drive, who owns it (and so the
    server and engine), its version where it reports one and whether it has Prometheus metrics. BenchcalError where
    it does not answer, refuses the key, serves no model or several without ``served_model``, or is of a kind the
    serving model does not know."""
    status, raw, error = _request(endpoint, endpoint.api + "/models")
    if status is None:
        raise BenchcalError(f"nothing answers at {endpoint.url}: {error}")
    if status in (401, 403):
        how = (f"the key in ${endpoint.api_key_env}" if endpoint.key else "no API key (--api-key-env NAME sends one)")
        raise BenchcalError(f"{endpoint.url} refused the request (HTTP {status}) with {how}")
    try:
        models = json.loads(raw)["data"] if status == 200 else None
        ids = [str(m["id"]) for m in models]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise BenchcalError(f"{endpoint.url}/models did not answer as an OpenAI-compatible server "
                            f"(HTTP {status})") from None
    if not ids:
        raise BenchcalError(f"{endpoint.url} serves no model")
    if served_model is None and len(ids) > 1:
        raise BenchcalError(f"{endpoint.url} serves {len(ids)} models ({', '.join(ids)}): name one with --served-model")
    served = served_model if served_model is not None else ids[0]
    if served not in ids:
        raise BenchcalError(f"--served-model {served}: {endpoint.url} serves {', '.join(ids)}")
    owned_by = str(next(m for m in models if str(m["id"]) == served).get("owned_by") or "")
    if owned_by not in KINDS:
        raise BenchcalError(f"{endpoint.url} says its model is owned by {owned_by or 'nobody'!r}: benchcal drives "
                            "vLLM's server (owned by 'vllm'), llama-server ('llamacpp') and llama-cpp-python's "
                            "('me'), whose prompts it can size with their tokenizers")
    server, engine = KINDS[owned_by]
    version = _json(endpoint, endpoint.root + "/version") if server == "vllm" else None
    props = _json(endpoint, endpoint.root + "/props") if server == "llama-server" else None
    metrics_status, _raw, _err = _request(endpoint, endpoint.root + "/metrics")
    return {"endpoint": endpoint.describe(), "models": endpoint.redact_all(models), "served_model": served,
            "owned_by": owned_by, "server": server, "engine": engine,
            "version": endpoint.redact_all(version) if isinstance(version, dict) else None,
            "build_info": endpoint.redact(props.get("build_info")) if isinstance(props, dict) else None,
            "metrics": metrics_status == 200}


def reported_version(info: Mapping[str, Any]) -> dict[str, Any]:
    """``engine_version`` / ``engine_build`` / ``engine_commit`` as the server reports them (vLLM's ``/version``,
    llama-server's ``build_info`` ``b7216-a1b2c3d``); {} for a server that reports none (llama-cpp-python's)."""
    if info.get("version") and info["version"].get("version"):
        return {"engine_version": str(info["version"]["version"])}
    match = re.match(r"^b(\d+)-([0-9a-f]{6,40})", str(info.get("build_info") or ""))
    if match:
        return {"engine_build": int(match.group(1)), "engine_commit": match.group(2)}
    return {}


def served_quant(info: Mapping[str, Any], asked: str | None) -> str:
    """The weights format of the served model: ``asked`` (``--quant``), else the one format of the engine whose
    name its model id holds as a word (``...-Q4_K_M.gguf``, ``Qwen2.5-7B-Instruct-AWQ``); BenchcalError where
    neither says."""
    from predictor.quants import quant_ids, resolve_quant

    if asked:
        return resolve_quant(asked, info["engine"]).id
    served = str(info["served_model"])
    found = [q for q in quant_ids(info["engine"])
             if re.search(rf"(?<![A-Za-z0-9]){re.escape(q)}(?![A-Za-z0-9])", served, re.IGNORECASE)]
    longest = max(found, key=len) if found else None  # Q4_K_M over Q4_K
    if longest is None:
        raise BenchcalError(f"name the weights format the server serves with --quant: its model id {served!r} "
                            "does not say")
    return longest


class ExternalServer(ServerSetup):
    """The serving harness's view of a server it did not start: the same prompts (sized by the server's own
    tokenizer) and requests as for the server of that kind it starts itself, naming the served model."""

    ready_path = "/v1/models"

    def __init__(self, endpoint: Endpoint, info: Mapping[str, Any]) -> None:
        self.endpoint, self.info = endpoint, dict(info)
        self.metrics_path = "/metrics" if info.get("metrics") else None

    def prompts(self, cfg: Mapping[str, Any], weights_path: str | None, base_url: str, lengths: list[int],
                seed: int) -> list[Any]:
        rng = random.Random(seed)
        if self.info["server"] == "llama-cpp-python":  # text prompts only: grown or cut to the count
            return [sized_text(lambda text: len(self._tokenize(text)), n, rng) for n in lengths]
        if self.info["server"] == "vllm" and not self._has_tokenizer():
            # a vLLM server started without a tokenizer (--skip-tokenizer-init) takes token ids and counts them:
            # ordinary ids of the model's vocabulary, as for the vLLM server benchcal starts
            from harness.engines import engine_setup
            from harness.engines.base import random_token_ids
            from harness.engines.vllm.options import special_token_ids
            from harness.synthetic_hf import catalogue_config

            vocab = int(engine_setup(str(cfg["engine"])).arch(cfg).vocab_size)
            specials = sorted(special_token_ids(catalogue_config(str(cfg["model"])) or {}))
            self.info["prompts"] = "random token ids of the model's vocabulary (the server has no tokenizer)"
            return [random_token_ids(n, vocab, rng, specials) for n in lengths]
        self.info["prompts"] = "windows of the server's own tokenization of random words"
        return token_windows(self._tokenize, lengths, rng)

    def _has_tokenizer(self) -> bool:
        ep = self.endpoint
        found = _json(ep, ep.root + "/tokenize", {"model": self.info["served_model"], "prompt": "a b",
                                                  "add_special_tokens": False})
        return isinstance(found, dict) and isinstance(found.get("tokens"), list)

    def _tokenize(self, text: str) -> list[int]:
        ep, server = self.endpoint, self.info["server"]
        if server == "vllm":
            found = _json(ep, ep.root + "/tokenize", {"model": self.info["served_model"], "prompt": text,
                                                      "add_special_tokens": False})
        elif server == "llama-server":
            found = _json(ep, ep.root + "/tokenize", {"content": text})
        else:
            found = _json(ep, ep.root + "/extras/tokenize", {"input": text})
        if not isinstance(found, dict) or not isinstance(found.get("tokens"), list):
            raise BenchcalError(f"{ep.url}: the server's tokenizer endpoint did not answer; prompts of exact "
                                "lengths cannot be built")
        return [int(t) for t in found["tokens"]]

    def payload(self, prompt: Any, output_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.info["served_model"], "prompt": prompt, "max_tokens": output_tokens,
                                "min_tokens": output_tokens, "stream": True, "temperature": 0.0}
        if self.info["server"] != "llama-cpp-python":
            body.update({"ignore_eos": True, "stream_options": {"include_usage": True}})
        if self.info["server"] == "llama-server":
            body["cache_prompt"] = False
        return body

    def version(self) -> dict[str, Any]:
        return reported_version(self.info)
