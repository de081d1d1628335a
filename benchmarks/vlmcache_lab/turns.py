"""Engines measured in the same minutes: several modes' processes run at once on one GPU and
take turns, one request at a time, so a comparison is never between two stretches of time.

Run one after the other, modes on a lent H100 differed more than the targets allow: the
same vLLM GPU prefix hit (LLaVA-1.5-7B shape, the connector idle) took 18.8, 20.1 and
22.8 ms in three engine processes on one machine, one after the other. Interleaved, drift in
the machine (clocks, neighbours, the host) falls on every mode alike.

A :class:`TurnServer` (in the benchmark's parent) grants one turn at a time over a Unix
socket; a child holds its turn for each engine call (start-up included: engines start one
after the other, each sizing its KV cache on a quiet GPU) plus a short gap for its
asynchronous copies to land. Turns go in rounds, every child once a round: in a fixed order
the modes' GPU hits (same engine, same requests) rose with their place in it, 9.3 / 9.3 /
10.4 / 10.4 / 12.0 ms on an H200 (LLaVA-1.5-7B shape, 2026-11-26), and the last place was
always vlmcache's. An order shuffled each round is uneven over a phase: of 64 rounds of three
children, one child typically takes the first or the last place ~6 times more than its
share, and with a fixed seed the same child in every run. Rounds therefore come in blocks of
as many rounds as there are children, each block the rotations of one shuffled order (a
Latin square): in every block each child takes each place once. Each ``go`` names the place
it grants; the benchmark records it per request. A child also waits at each timed phase
until every other live child that has a phase of that name has reached it, so ``miss`` is
timed against ``miss``. Protocol, one line each way: ``hello NAME PHASES`` / ``phase NAME``
-> ``ok``; ``want`` -> ``go PLACE``; ``done``.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

#: seconds the server waits for every child's hello before it starts granting anyway
HELLO_WAIT_S = 600.0
#: seconds a child keeps its turn after an engine call, for the copies that call started
#: (a capture's stores) to finish before another engine's timed request
TURN_GAP_S = 0.05
#: seconds a round waits for the child whose turn it is to ask (it is between two requests)
#: before the next one in the round's order goes first
ROUND_GRACE_S = 0.05


@dataclass
class _Child:
    name: str
    plan: tuple[str, ...]
    conn: socket.socket
    reached: set[str] = field(default_factory=set)
    at_phase: str | None = None
    wants: bool = False
    last_turn: float = 0.0
    live: bool = True


class TurnServer:
    """Grants turns and releases phase barriers for the children connected to ``path``."""

    def __init__(self, path: str, expected: int, wait_s: float = HELLO_WAIT_S) -> None:
        self._expected = expected
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen()
        self._lock = threading.Lock()
        self._children: list[_Child] = []
        self._holder: _Child | None = None
        self._round: list[_Child] = []  # this round's children yet to have their turn
        self._block: list[list[_Child]] = []  # the block's rounds yet to start
        self._place = 0  # turns granted in this round so far
        self._round_since = 0.0  # when the round's next child became next
        self._rng = random.Random(0)  # the same orders in every run
        self.turns = 0
        threading.Thread(target=self._accept, name="turns-accept", daemon=True).start()
        timer = threading.Timer(wait_s, self._give_up_waiting)
        timer.daemon = True
        timer.start()

    def ended(self, name: str) -> None:
        """The process of child ``name`` has exited; one that never said hello (it failed
        at start-up) is no longer waited for."""
        with self._lock:
            if all(c.name != name for c in self._children):
                self._expected -= 1
                self._dispatch()

    def _give_up_waiting(self) -> None:
        """A child that never connected (it failed at start-up) holds no one back."""
        with self._lock:
            self._expected = 0
            self._dispatch()

    def close(self) -> None:
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        lines = conn.makefile("r")
        hello = lines.readline().split(" ", 2)
        if len(hello) != 3 or hello[0] != "hello":
            conn.close()
            return
        child = _Child(hello[1], tuple(json.loads(hello[2])), conn)
        with self._lock:
            self._children.append(child)
        for line in lines:
            self._on_line(child, line.strip())
        with self._lock:
            child.live = False
            if self._holder is child:
                self._holder = None
            self._dispatch()

    def _on_line(self, child: _Child, line: str) -> None:
        op, _, arg = line.partition(" ")
        with self._lock:
            if op == "phase":  # the phases before it in its plan are behind it too
                child.at_phase = arg
                plan = child.plan
                child.reached.update(plan[:plan.index(arg) + 1] if arg in plan else (arg,))
            elif op == "want":
                child.wants = True
            elif op == "done" and self._holder is child:
                self._holder = None
            self._dispatch()

    def _dispatch(self) -> None:
        """Release the phase barriers that can go, then grant a turn if none is held;
        nothing before every expected child has said hello."""
        if len(self._children) < self._expected:
            return
        for c in self._children:
            if c.live and c.at_phase is not None and self._aligned(c, c.at_phase):
                c.at_phase = None
                self._send(c, "ok")
        if self._holder is not None or not any(c.live and c.wants for c in self._children):
            return
        c = self._next_in_round()
        if c is None:
            return
        self._round.remove(c)
        c.wants, c.last_turn, self._holder = False, time.monotonic(), c
        self._round_since = c.last_turn
        self.turns += 1
        self._send(c, f"go {self._place}")
        self._place += 1

    def _next_in_round(self) -> _Child | None:
        """The first child of the round's order that wants a turn; the round waits up to
        ``ROUND_GRACE_S`` for an earlier child that is between requests (not at a phase
        barrier), so that no mode's place is fixed by how fast it asks again."""
        self._round = [c for c in self._round if c.live]
        if not any(c.wants for c in self._round):
            self._round, self._place = self._next_order(), 0
            self._round_since = time.monotonic()
        late = time.monotonic() - self._round_since
        for c in self._round:
            if c.wants:
                return c
            if c.at_phase is None and late < ROUND_GRACE_S:
                timer = threading.Timer(ROUND_GRACE_S - late + 0.001, self._redispatch)
                timer.daemon = True
                timer.start()
                return None
        return None

    def _next_order(self) -> list[_Child]:
        """The next round's order: the next rotation of the block's shuffled order, a new
        block once it is used up or a child has gone."""
        live = [c for c in self._children if c.live]
        names = sorted(c.name for c in live)
        if not self._block or any(sorted(c.name for c in r) != names for r in self._block):
            self._rng.shuffle(live)
            self._block = [live[i:] + live[:i] for i in range(len(live))]
        return self._block.pop(0)

    def _redispatch(self) -> None:
        with self._lock:
            self._dispatch()

    def _aligned(self, child: _Child, phase: str) -> bool:
        return all(not o.live or phase not in o.plan or phase in o.reached
                   for o in self._children if o is not child)

    def _send(self, child: _Child, word: str) -> None:
        try:
            child.conn.sendall(f"{word}\n".encode())
        except OSError:
            child.live = False


class Turns:
    """A child's side: ``with turns.turn():`` around each engine call; ``phase(name)``
    before each timed phase. Without a server (``path`` empty) both return at once."""

    def __init__(self, path: str, name: str, plan: Sequence[str]) -> None:
        self._conn: socket.socket | None = None
        self.held_s = 0.0  # time spent holding turns
        self.place: int | None = None  # the last turn's place in its round
        if path:
            self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._conn.connect(path)
            self._lines = self._conn.makefile("r")
            self._send(f"hello {name} {json.dumps(list(plan))}")

    def phase(self, name: str) -> None:
        if self._conn is not None:
            self._send(f"phase {name}")
            self._expect("ok")

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        if self._conn is None:
            yield
            return
        self._send("want")
        self.place = int(self._expect("go") or 0)
        start = time.monotonic()
        try:
            yield
            time.sleep(TURN_GAP_S)
        finally:
            self.held_s += time.monotonic() - start
            self._send("done")

    def close(self) -> None:
        if self._conn is not None:
            self._lines.close()  # the socket's descriptor stays open while its file does
            self._conn.close()
            self._conn = None

    def _send(self, line: str) -> None:
        assert self._conn is not None
        self._conn.sendall(f"{line}\n".encode())

    def _expect(self, word: str) -> str:
        """The rest of the server's next line, which must start with ``word``."""
        got = self._lines.readline().strip()
        head, _, rest = got.partition(" ")
        if head != word:
            raise RuntimeError(f"turn server: expected {word!r}, got {got!r}")
        return rest
