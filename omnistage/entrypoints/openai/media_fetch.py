"""Fetching media a request names by URL (`image_url`, `input_audio`, video references), safely.

A server that fetches any URL a client names is a proxy into its own network (SSRF). So
fetching is off unless `--allowed-media-domains` lists hosts, and then:

- `https` only, unless an entry names `http://` for its host (`http://10.0.0.5:8080`);
- only hosts the list matches: `example.com`, `*.example.com` (its subdomains), or `*`;
- a host name is resolved once, every address it resolves to must be public (no
  loopback, private, link-local, multicast or reserved address), and the connection goes
  to the checked address (the name stays in `Host` and TLS SNI), so DNS rebinding cannot
  swap in an internal address between the check and the connection. An IP address
  written in the list itself (`127.0.0.1`) is the operator's explicit choice and allowed;
- redirects are followed only to the same host (and scheme), at most `MAX_REDIRECTS`;
- the body is read up to `max_bytes` (then refused), within `timeout_s` in all;
- `file://` paths only under `--allowed-local-media-path`, resolved (symlinks and `..`)
  before the check.

Every refusal is a `MediaFetchError` (a ValueError naming the field): a 400 at the edge.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import httpx

MAX_REDIRECTS = 3
Resolver = Callable[[str, int], list[str]]


class MediaFetchError(ValueError):
    """A media URL that the server refuses to fetch, or whose fetch failed."""


def resolve_host(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (the system resolver)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


@dataclass(frozen=True)
class _Rule:
    pattern: str  # "example.com", "*.example.com", "*", or an IP address
    allow_http: bool

    def matches(self, host: str) -> bool:
        if self.pattern == "*":
            return True
        if self.pattern.startswith("*."):
            return host.endswith(self.pattern[1:])
        return host == self.pattern


def _parse_rule(entry: str) -> _Rule:
    entry = entry.strip().lower()
    allow_http = entry.startswith("http://")
    host = entry.split("://", 1)[-1].rstrip("/")
    if host.startswith("["):  # an IPv6 literal, as URLs write it: compared without brackets
        address, _, port = host[1:].partition("]")
        host = address + port
    if not host or "/" in host:
        raise ValueError(f"allowed media domain {entry!r}: give a host such as 'example.com', '*.example.com' "
                         f"or 'http://10.0.0.5:8080'")
    return _Rule(host, allow_http)


_EMBEDS_IPV4 = (ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96"),
                ipaddress.ip_network("64:ff9b:1::/48"))
"""IPv6 ranges whose last 32 bits are an IPv4 address a packet may end up at: IPv4-compatible
(`::127.0.0.1`), NAT64 (RFC 6052's well-known prefix and RFC 8215's local one)."""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in net for net in _EMBEDS_IPV4):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _is_public(address: str) -> bool:
    """Global unicast, and so is any IPv4 address the IPv6 form carries (a private IPv4 address
    written as IPv6 reaches the private host through a mapping or translation)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    inner = _embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    if inner is not None and int(inner) != 0:
        ip = inner
    return ip.is_global and not ip.is_multicast


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class MediaFetcher:
    def __init__(self, allowed_domains: Sequence[str] = (), allowed_local_path: str | None = None, *,
                 max_bytes: int = 64 * 1024 * 1024, timeout_s: float = 10.0, resolver: Resolver = resolve_host):
        self.rules = [_parse_rule(entry) for entry in allowed_domains if entry.strip()]
        self.local_root = None if allowed_local_path is None else Path(allowed_local_path).resolve()
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.resolver = resolver

    @staticmethod
    def is_url(ref: str) -> bool:
        return ref.split(":", 1)[0].lower() in ("http", "https", "file") and "://" in ref[:10]

    def fetch(self, url: str, field: str) -> bytes:
        """The bytes `url` names, or a MediaFetchError naming `field`."""
        scheme = urlsplit(url).scheme.lower()
        if scheme == "file":
            return self._read_local(url, field)
        if not self.rules:
            raise MediaFetchError(f"{field}: this server fetches no media URLs; send the media as a base64 data "
                                  f"URL (an operator can allow hosts with --allowed-media-domains)")
        deadline = time.monotonic() + self.timeout_s
        with httpx.Client(timeout=self.timeout_s, follow_redirects=False, trust_env=False) as client:
            for _ in range(MAX_REDIRECTS + 1):
                status, location, body = self._get_once(client, url, field, deadline)
                if location is None:
                    if status != 200:
                        raise MediaFetchError(f"{field}: fetching {url} answered HTTP {status}")
                    return body
                target = urljoin(url, location)
                if (urlsplit(target).hostname, urlsplit(target).scheme) != (urlsplit(url).hostname, scheme):
                    raise MediaFetchError(f"{field}: {url} redirects to another host or scheme ({target}); "
                                          "the server follows redirects on the same host only")
                url = target
        raise MediaFetchError(f"{field}: more than {MAX_REDIRECTS} redirects")

    # --- one HTTP GET, to a checked address ---------------------------------------------------

    def _get_once(self, client: httpx.Client, url: str, field: str,
                  deadline: float) -> tuple[int, str | None, bytes]:
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
        rule = next((r for r in self.rules if r.matches(host) or r.matches(f"{host}:{parts.port}")), None)
        if rule is None:
            raise MediaFetchError(f"{field}: the host {host or '(none)'!r} is not in the server's allowed media "
                                  f"domains")
        if scheme not in ("https", "http") or (scheme == "http" and not rule.allow_http):
            raise MediaFetchError(f"{field}: only https media URLs are fetched (got {scheme}://)")
        port = parts.port or (443 if scheme == "https" else 80)
        address = self._checked_address(host, port, rule, field)
        netloc = f"[{address}]" if ":" in address else address
        target = parts._replace(netloc=f"{netloc}:{port}").geturl()
        headers = {"host": parts.netloc.rsplit("@", 1)[-1], "accept": "image/*, audio/*, video/*, */*"}
        extensions = {"sni_hostname": host} if scheme == "https" and not _is_ip(host) else {}
        try:
            with client.stream("GET", target, headers=headers, extensions=extensions) as response:
                if response.is_redirect:
                    return response.status_code, response.headers.get("location"), b""
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                    raise MediaFetchError(f"{field}: {url} is {declared} bytes, over the limit of {self.max_bytes}")
                chunks, size = [], 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise MediaFetchError(f"{field}: {url} is over the limit of {self.max_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise MediaFetchError(f"{field}: fetching {url} took over {self.timeout_s:g} s")
                    chunks.append(chunk)
                return response.status_code, None, b"".join(chunks)
        except httpx.HTTPError as e:
            raise MediaFetchError(f"{field}: fetching {url} failed ({type(e).__name__}: {e})") from None

    def _checked_address(self, host: str, port: int, rule: _Rule, field: str) -> str:
        if _is_ip(host):
            if rule.pattern in (host, f"{host}:{port}") or _is_public(host):
                return host
            raise MediaFetchError(f"{field}: {host} is not a public address")
        try:
            addresses = self.resolver(host, port)
        except OSError as e:
            raise MediaFetchError(f"{field}: cannot resolve {host!r} ({e})") from None
        private = [a for a in addresses if not _is_public(a)]
        if not addresses or private:
            raise MediaFetchError(f"{field}: {host!r} resolves to a non-public address ({', '.join(private)}); "
                                  "the server fetches public addresses only")
        return addresses[0]

    # --- file:// -------------------------------------------------------------------------------

    def _read_local(self, url: str, field: str) -> bytes:
        if self.local_root is None:
            raise MediaFetchError(f"{field}: file:// URLs are off (an operator can allow a folder with "
                                  f"--allowed-local-media-path)")
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise MediaFetchError(f"{field}: file:// URLs name a local path, not a host ({parts.netloc!r})")
        path = Path(unquote(parts.path)).resolve()
        if not path.is_relative_to(self.local_root):
            raise MediaFetchError(f"{field}: {url} is outside the allowed local media folder")
        if not path.is_file():
            raise MediaFetchError(f"{field}: no file {url}")
        if path.stat().st_size > self.max_bytes:
            raise MediaFetchError(f"{field}: {url} is over the limit of {self.max_bytes} bytes")
        return path.read_bytes()
