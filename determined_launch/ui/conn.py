"""Connections: what a client that connects and says nothing (or little) costs.

``ThreadingHTTPServer`` gives each connection a thread at once, and waits
for its request forever: 2,000 idle connections were 2,000 threads, and at
the descriptor limit its accept loop spun. Here (before any token is
checked, on loopback or not):

* a new connection waits in one *gate* thread (a selector), costing a
  descriptor, not a thread, until it sends its first byte; it is closed
  after ``IDLE_S`` seconds of silence, and the oldest waiting one is closed
  when ``max_waiting`` wait (a quarter of the descriptor limit, at most 512);
* at most ``MAX_THREADS`` connections are served at once; the others wait in
  the gate, new ones in the listen backlog (``BACKLOG``), which absorbs a
  burst;
* a request's line and headers must arrive within ``HEADER_S`` seconds of
  when the server starts waiting for them (one deadline for the whole
  header, not per ``recv``: a byte every few seconds does not keep a thread),
  and a kept-alive connection waiting for its next request is under the
  same deadline; when most threads are busy, responses close the connection;
* at the descriptor limit the accept loop waits a little before trying
  again instead of spinning.
"""

from __future__ import annotations

import errno
import io
import resource
import selectors
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

IDLE_S = 10.0
HEADER_S = 10.0
#: seconds to write one response (a reader that stops reading is dropped)
WRITE_S = 60.0
MAX_THREADS = 32
BACKLOG = 1024


class BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], handler: Any, idle_s: float = IDLE_S,
                 header_s: float = HEADER_S, max_threads: int = MAX_THREADS) -> None:
        self.idle_s, self.header_s, self.max_threads = idle_s, header_s, max_threads
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = soft if soft != resource.RLIM_INFINITY and soft > 0 else 4096
        self.max_waiting = max(8, min(512, limit // 4))
        self._slots = threading.BoundedSemaphore(max_threads)
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._gate = _Gate(self)
        super().__init__(address, handler)
        self._gate.start()

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(0.1)  # out of descriptors: the listen backlog waits, we do not spin
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        self._gate.add(request, client_address)

    def start_worker(self, request: Any, client_address: Any) -> bool:
        """A thread for a connection that sent something, if one is free."""
        if not self._slots.acquire(blocking=False):
            return False
        with self._busy_lock:
            self._busy += 1
        threading.Thread(target=self._work, args=(request, client_address), daemon=True,
                         name="ui-request").start()
        return True

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._busy_lock:
                self._busy -= 1
            self._slots.release()
            self._gate.wake()

    def crowded(self) -> bool:
        """Most threads busy: close connections after their response."""
        return self._busy * 4 >= self.max_threads * 3

    def server_close(self) -> None:
        self._gate.stop()
        super().server_close()


class _Gate(threading.Thread):
    """Connections that have not sent a byte yet (or wait for a free thread)."""

    def __init__(self, server: BoundedServer) -> None:
        super().__init__(daemon=True, name="ui-gate")
        self.server = server
        self._new: list[tuple[Any, Any, float]] = []
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._waiting: dict[Any, tuple[Any, float]] = {}  # socket -> (address, since)
        self._ready: list[Any] = []  # sent something, no thread free yet (oldest first)
        self._stopped = False

    def add(self, request: Any, address: Any) -> None:
        with self._lock:
            self._new.append((request, address, time.monotonic()))
        self.wake()

    def wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # the wake-up pipe is full: the gate is awake anyway

    def stop(self) -> None:
        self._stopped = True
        self.wake()

    def run(self) -> None:
        while not self._stopped:
            for key, _ in self._selector.select(timeout=0.5):
                if key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                    continue
                self._selector.unregister(key.fileobj)
                self._ready.append(key.fileobj)
            with self._lock:
                new, self._new = self._new, []
            for request, address, since in new:
                self._waiting[request] = (address, since)
                self._selector.register(request, selectors.EVENT_READ, None)
            self._dispatch()
            self._expire()
        for sock in [*self._waiting]:
            self._close(sock)

    def _dispatch(self) -> None:
        while self._ready:
            sock = self._ready[0]
            if not self.server.start_worker(sock, self._waiting[sock][0]):
                return
            self._ready.pop(0)
            del self._waiting[sock]

    def _expire(self) -> None:
        now = time.monotonic()
        old = [s for s, (_, since) in self._waiting.items() if now - since > self.server.idle_s]
        over = len(self._waiting) - len(old) - self.server.max_waiting
        if over > 0:  # too many waiting: the oldest go (dicts keep arrival order)
            gone = set(old)
            old += [s for s in self._waiting if s not in gone][:over]
        for sock in old:
            self._close(sock)

    def _close(self, sock: Any) -> None:
        self._waiting.pop(sock, None)
        if sock in self._ready:
            self._ready.remove(sock)
        else:
            try:
                self._selector.unregister(sock)
            except (KeyError, ValueError):
                pass
        self.server.shutdown_request(sock)


class _DeadlineIO(io.RawIOBase):
    """A socket's reads under the handler's deadline for the whole request header."""

    def __init__(self, raw: Any, handler: DeadlineHandler) -> None:
        super().__init__()
        self._raw, self._handler = raw, handler

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> Any:
        left = self._handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request header deadline")
        self._handler.connection.settimeout(left)
        return self._raw.readinto(b)

    def close(self) -> None:
        self._raw.close()
        super().close()


class DeadlineHandler(BaseHTTPRequestHandler):
    server: BoundedServer
    deadline = 0.0

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_DeadlineIO(self.rfile.detach(), self))

    def handle_one_request(self) -> None:
        self.deadline = time.monotonic() + self.server.header_s
        super().handle_one_request()
        if self.server.crowded():
            self.close_connection = True

    def end_headers(self) -> None:
        self.connection.settimeout(WRITE_S)  # the header deadline was for reading
        if self.server.crowded():
            self.send_header("Connection", "close")
        super().end_headers()
