"""An OpenAI-compatible grading endpoint for the judge tests, standing in for a judge model that follows the default
rubric: it answers `Score: 10` when the response contains the reference answer and `Score: 0` otherwise (or the
fixed `answer`), and records what it was asked. It can be slow (`delay_s`), fail its first requests with 503
(`fail_first`) and require a bearer token. Run as a script it serves on loopback and prints its URL."""
import argparse
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

_GRADED = re.compile(r'Reference answer \(may be "\(none\)"\):\n(.*?)\n\nResponse:\n(.*?)\n\nRate', re.S)


class Grader:
    """What the endpoint does and what it has seen: `requests` (each body), and the most requests it held at once."""

    def __init__(self, token: Optional[str] = None, delay_s: float = 0.0, fail_first: int = 0,
                 answer: Optional[str] = None) -> None:
        self.token, self.delay_s, self.fail_first, self.answer = token, delay_s, fail_first, answer
        self.requests: List[Dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    def grade(self, rubric: str) -> str:
        if self.answer is not None:
            return self.answer
        match = _GRADED.search(rubric)
        return f"Score: {10 if match and match.group(1).strip() in match.group(2) else 0}"


def handler(grader: Grader) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if grader.token and self.headers.get("Authorization") != f"Bearer {grader.token}":
                return self._send(401, {"error": "token"})
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with grader.lock:
                grader.requests.append(body)
                grader.in_flight += 1
                grader.max_in_flight = max(grader.max_in_flight, grader.in_flight)
                failing = len(grader.requests) <= grader.fail_first
            time.sleep(grader.delay_s)
            with grader.lock:
                grader.in_flight -= 1
            if failing:
                return self._send(503, {"error": "busy"})
            if self.path.endswith("/chat/completions"):
                text = grader.grade(body["messages"][-1]["content"])
                return self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            choices = [{"index": i, "text": grader.grade(p)} for i, p in enumerate(prompts)]
            self._send(200, {"choices": list(reversed(choices))})   # order by `index`, as OpenAI's clients must

        def _send(self, status: int, body: Dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


def serve(grader: Grader, port: int = 0) -> Tuple[ThreadingHTTPServer, str]:
    """The endpoint on loopback in a daemon thread, and its API base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(grader))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests_log", required=True)
    args = parser.parse_args()
    grader = Grader(token=os.environ.get("COATI_JUDGE_TOKEN"))
    server, url = serve(grader)
    print(url, flush=True)
    while True:
        time.sleep(0.5)
        with grader.lock:
            snapshot = list(grader.requests)
        with open(args.requests_log, "w") as log:
            json.dump(snapshot, log)
