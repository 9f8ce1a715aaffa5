"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: Chromium
reads commands from fd 3 and writes replies to fd 4, NUL-separated JSON), so a test can click, type,
wait for the page and collect every console message and uncaught error without a websocket library.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import subprocess
import time
from pathlib import Path

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium with one page; `console` collects its console messages, errors and failed loads."""

    def __init__(self, chromium: str, profile: Path, width: int = 1400, height: int = 1000) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def give_fds() -> None:  # in the child: the pipe ends as fds 3 and 4, kept across exec
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            for target, fd in zip((3, 4), high):
                os.dup2(fd, target)
                os.set_inheritable(target, True)

        self.proc = subprocess.Popen(
            [chromium, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=give_fds,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )

    # ---- protocol ----
    def _read_message(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise BrowserError(f"no reply from Chromium within {timeout:.0f} s")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium exited (code {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(
        self, method: str, params: dict | None = None, session: bool = False, timeout: float = 60
    ) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    # ---- what the tests use ----
    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, session=True)

    def eval(self, expression: str, timeout: float = 60):
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=True,
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> object:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.05)
        raise BrowserError(f"timed out after {timeout} s waiting for {expression}")

    def wait_rendered(self, page: str, previous: int | None = None, timeout: float = 60) -> None:
        """Wait until the viewer says `page` rendered (after render number `previous`, if given)."""
        after = "" if previous is None else f" && window.rlpostRenders > {previous}"
        self.wait_for(
            f"document.body && document.body.dataset.rendered === {json.dumps(page)}{after}", timeout
        )

    @property
    def console(self) -> list[str]:
        """Console messages of any level, uncaught exceptions and failed loads, one line each."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled":
                out.append(
                    f"console.{p['type']}: "
                    + " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                )
            elif e.get("method") == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif e.get("method") == "Log.entryAdded":
                out.append(f"log.{p['entry']['level']}: {p['entry']['text']} {p['entry'].get('url', '')}")
            elif e.get("method") == "Network.loadingFailed":
                out.append(f"load failed: {p.get('errorText')}")
        return out

    def drain(self) -> None:
        """Let pending events arrive (a no-op round trip)."""
        self.eval("1")

    def screenshot(self, path: Path) -> Path:
        shot = self.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=True
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
