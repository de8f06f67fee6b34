"""JSON over HTTP on the standard library, with the access rules every coati server keeps (the reward server, the
LLM judge): loopback unless told otherwise, a bearer token compared in constant time, and no listening beyond
loopback without one unless the user says so (an open scorer on every interface is OpenRLHF #1317)."""
import hmac
import ipaddress
import json
import os
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, Optional


def is_loopback(host: str) -> bool:
    """Whether `host` (an address, or `localhost`) is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def server_token(token: Optional[str], env: str, host: str, allow_unauthenticated: bool) -> Optional[str]:
    """The token requests must carry (`token`, else the environment variable `env`), or None; raises ValueError (one
    line) for an empty `token`, and for listening beyond loopback without one unless `allow_unauthenticated`."""
    if token is not None and not token.strip():
        raise ValueError("--token is empty")
    token = (token or os.environ.get(env) or "").strip() or None
    if token is None and not is_loopback(host) and not allow_unauthenticated:
        raise ValueError(f"--host {host} listens beyond loopback without a token: give one (--token, or {env}), or "
                         "pass --allow_unauthenticated")
    return token


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler whose subclasses set `token` (None: no token asked) and answer with `answer`; `authorized()`
    answers 401 itself when the request lacks the token, `read_json()` raises ValueError on a malformed body."""

    token: Optional[str] = None

    def authorized(self) -> bool:
        if self.token is None:
            return True
        given = self.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, f"Bearer {self.token}".encode()):
            return True
        self.answer(401, {"error": "this server requires its bearer token (Authorization: Bearer ...)"})
        return False

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def answer(self, status: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:   # one line per request would drown the ready line
        pass
