"""One long-lived HTTP session per API client, with nothing looked up per request.

The generated client's session is created with ``trust_env=True``, so aiohttp reads the
proxy variables and, in a thread of the default executor, ``~/.netrc`` for every
request: a thread hop and a file read per Binding, a fifth of the operator's time in a
burst of thousands of pods. The API server's address and credentials do not change while
the process runs, so ``tune`` replaces that session with one that resolved the proxy
once (at start, from the same variables) and never reads netrc (the API server is
authenticated by token or client certificate, never by netrc).

Concurrency is bounded by the connector (``MAX_CONNECTIONS``) beside the worker's own
bound on Bindings in flight; each request holds one keep-alive connection.
"""

from __future__ import annotations

import ssl
from typing import Final

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client
from yarl import URL

#: Connections to the API server kept open at most: the Bindings in flight (64 by
#: default), the watches (one each, for as long as they run), Events, status patches.
MAX_CONNECTIONS: Final = 96
#: How long an idle connection is kept. A burst opens one connection per Binding in
#: flight, each with a TLS handshake that costs both sides milliseconds of CPU; kept a
#: minute (aiohttp's default is 15 s), they serve the next burst too. The API server
#: closes idle connections after 90 s, so ours are closed first.
KEEPALIVE_S: Final = 60.0


def ssl_context(configuration: client.Configuration) -> ssl.SSLContext:
    """The TLS settings the generated client derives from its configuration."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


def env_proxy(host: str) -> str | None:
    """The proxy the environment names for ``host`` (``HTTPS_PROXY``, ``NO_PROXY``...),
    looked up once."""
    try:
        proxy, _auth = get_env_proxy_for_url(URL(host))
    except LookupError:
        return None
    return str(proxy)


async def tune(api: client.ApiClient) -> None:
    """Give ``api`` a session that does no per-request environment lookups (see the
    module docstring). Call once, right after creating the client."""
    configuration = api.configuration
    rest = api.rest_client
    if configuration.proxy is None:
        proxy = env_proxy(str(configuration.host))
        if proxy is not None:
            configuration.proxy = rest.proxy = proxy
    connector = aiohttp.TCPConnector(
        limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S, ssl=ssl_context(configuration)
    )
    previous = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=connector, trust_env=False, read_bufsize=2**21
    )
    await previous.close()


def session_of(api: client.ApiClient) -> aiohttp.ClientSession:
    """The client's HTTP session (after ``tune``, the long-lived one)."""
    session: aiohttp.ClientSession = api.rest_client.pool_manager
    return session
