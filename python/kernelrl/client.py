"""The HTTP client of `launch serve`: one candidate or many (in parallel, answers in order)."""
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

DEFAULT_URL = "http://127.0.0.1:8470"


class ServiceError(Exception):
    """The service could not be reached or did not answer (after the retries)."""


class RequestError(Exception):
    """The service refused a request (4xx): `status` and `reason` say why; retrying will not help."""

    def __init__(self, status, reason):
        super().__init__("%d: %s" % (status, reason))
        self.status = status
        self.reason = reason


class Client:
    """`url`: the service (default $KERNELRL_URL, else http://127.0.0.1:8470). `timeout`: seconds for one
    answer (a verdict takes as long as the evaluator's compile and timing). Only what cannot have been
    evaluated is retried, `retries` times with a growing pause: a refused connection and 503 (the service's
    queue is full, no evaluator has joined, or it is stopping). A timeout or a 5xx raises ServiceError (the
    candidate may have been evaluated: a retry would evaluate it again); 4xx raise RequestError."""

    def __init__(self, url=None, timeout=900.0, retries=5):
        self.url = (url or os.environ.get("KERNELRL_URL") or DEFAULT_URL).rstrip("/")
        self.timeout = timeout
        self.retries = retries

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        last = None
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return json.loads(r.read().decode())
            except urllib.error.HTTPError as e:
                text = e.read().decode(errors="replace")
                try:
                    reason = json.loads(text).get("error", text)
                except ValueError:
                    reason = text
                if e.code == 503:
                    last = "%d: %s" % (e.code, reason)
                    pause = float(e.headers.get("Retry-After") or 0.5 * (attempt + 1))
                elif e.code >= 500:
                    raise ServiceError("%s %s%s: %d: %s" % (method, self.url, path, e.code, reason)) from None
                else:
                    raise RequestError(e.code, reason) from None
            except urllib.error.URLError as e:
                if not isinstance(e.reason, ConnectionRefusedError):  # it may have been sent: not again
                    raise ServiceError("%s %s%s: %s" % (method, self.url, path, e.reason)) from None
                last = "%s: %s" % (self.url, e.reason)
                pause = 0.5 * (attempt + 1)
            except (ConnectionError, TimeoutError, OSError) as e:
                raise ServiceError("%s %s%s: %s" % (method, self.url, path, e)) from None
            if attempt < self.retries:
                time.sleep(pause)
        raise ServiceError("%s %s%s failed after %d attempts: %s" % (method, self.url, path, self.retries + 1, last))

    def health(self):
        """{"ok", "tasks", "evaluators", "pending", "action_space", "mode", ...}"""
        return self._call("GET", "/v1/health")

    def stats(self):
        """Request and verdict counters, and the dispatcher's queue."""
        return self._call("GET", "/v1/stats")

    def tasks(self):
        """The tasks the service evaluates: [{"id", "prompt"}], prompt being the task as a user message."""
        return self._call("GET", "/v1/tasks")["tasks"]

    def evaluate(self, task, action=None, code=None, id=None, prompt=None):
        """One candidate for `task`: `action` (the policy's raw text; the code is taken from its last fenced
        block) or `code`. The answer is the stored record: status, error, speedup, reward, correctness,
        runtime, assembled_code, compile_log, ... (as `launch export` prints it)."""
        body = {"task": task}
        if action is not None:
            body["action"] = action
        if code is not None:
            body["code"] = code
        if id is not None:
            body["id"] = id
        if prompt is not None:
            body["prompt"] = prompt
        return self._call("POST", "/v1/evaluate", body)

    def evaluate_many(self, requests, max_workers=16, raise_errors=False):
        """Many candidates at once (each a dict of evaluate()'s arguments), answered in order. A refused
        request (RequestError) gives {"status": "request_error", "http_status": CODE, "error": REASON} in its
        place unless `raise_errors`; a service that cannot be reached raises ServiceError either way (an outage
        is not a verdict)."""
        def one(r):
            try:
                return self.evaluate(**r)
            except RequestError as e:
                if raise_errors:
                    raise
                return {"status": "request_error", "http_status": e.status, "error": e.reason, "reward": None,
                        "speedup": 0.0}

        if not requests:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(requests)))) as pool:
            return list(pool.map(one, requests))
