"""Turn taking between engine processes sharing one GPU (no GPU: threads as children)."""

import threading
import time

from vlmcache_lab.turns import TurnServer, Turns


def _server(tmp_path, expected=2):
    return TurnServer(str(tmp_path / "t.sock"), expected)


def _run_children(child, names, server):
    """Each name's ``child`` on a thread of its own, to the end; then the server closes."""
    threads = [threading.Thread(target=child, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    server.close()


def test_turns_never_overlap_and_alternate_between_children(tmp_path, monkeypatch):
    monkeypatch.setattr("vlmcache_lab.turns.TURN_GAP_S", 0.0)
    monkeypatch.setattr("vlmcache_lab.turns.ROUND_GRACE_S", 5.0)  # a loaded CI machine
    server = _server(tmp_path)
    log, inside, overlaps = [], [0], []

    def child(name):
        turns = Turns(server_path, name, ["miss"])
        for _ in range(6):
            with turns.turn():
                inside[0] += 1
                if inside[0] > 1:
                    overlaps.append(name)
                log.append(name)
                time.sleep(0.005)
                inside[0] -= 1
        turns.close()

    server_path = str(tmp_path / "t.sock")
    _run_children(child, "ab", server)
    assert not overlaps
    assert sorted(log) == ["a"] * 6 + ["b"] * 6
    # while both want turns, each round gives each one turn (a child re-asks after its
    # turn; the other is already waiting)
    assert all(sorted(log[i:i + 2]) == ["a", "b"] for i in range(0, 12, 2)), log
    assert server.turns == 12


def test_rounds_come_in_blocks_where_each_child_takes_each_place_once(tmp_path, monkeypatch):
    monkeypatch.setattr("vlmcache_lab.turns.TURN_GAP_S", 0.0)
    monkeypatch.setattr("vlmcache_lab.turns.ROUND_GRACE_S", 5.0)  # a loaded CI machine
    server = TurnServer(str(tmp_path / "t.sock"), 3)
    log, lock = [], threading.Lock()

    def child(name):
        turns = Turns(str(tmp_path / "t.sock"), name, ["miss"])
        for _ in range(12):
            with turns.turn():
                with lock:
                    log.append((name, turns.place))
                time.sleep(0.005)
        turns.close()

    _run_children(child, "abc", server)
    rounds = [log[i:i + 3] for i in range(0, len(log), 3)]
    assert all(sorted(n for n, _ in r) == ["a", "b", "c"] for r in rounds), rounds
    # each turn was told its place in the round
    assert all([p for _, p in r] == [0, 1, 2] for r in rounds), rounds
    blocks = [rounds[i:i + 3] for i in range(0, len(rounds), 3)]
    for block in blocks:  # a Latin square: every child at every place once per block
        for place in range(3):
            assert sorted(r[place][0] for r in block) == ["a", "b", "c"], block
    # and not one fixed order repeated: the blocks' orders differ
    assert len({tuple(n for n, _ in b[0]) for b in blocks}) > 1, blocks


def test_a_phase_waits_for_the_other_child_to_reach_it(tmp_path):
    server = _server(tmp_path, expected=3)
    path = str(tmp_path / "t.sock")
    a = Turns(path, "a", ["miss", "cpu_hit"])
    b = Turns(path, "b", ["miss", "cpu_hit"])
    c = Turns(path, "c", ["restart_hit"])  # shares no phase: never waited for
    reached = []
    t = threading.Thread(target=lambda: (a.phase("cpu_hit"), reached.append("a")))
    t.start()
    time.sleep(0.2)
    assert reached == []  # b has a cpu_hit phase it has not reached
    b.phase("miss")
    time.sleep(0.1)
    assert reached == []
    b.phase("cpu_hit")
    t.join(timeout=10)
    assert reached == ["a"]
    c.phase("restart_hit")  # returns at once
    for x in (a, b, c):
        x.close()
    server.close()


def test_a_child_that_ends_releases_the_others(tmp_path):
    server = _server(tmp_path)
    path = str(tmp_path / "t.sock")
    a = Turns(path, "a", ["miss", "cpu_hit"])
    b = Turns(path, "b", ["miss", "cpu_hit"])
    done = []
    t = threading.Thread(target=lambda: (a.phase("cpu_hit"), done.append(1)))
    t.start()
    time.sleep(0.2)
    assert not done
    b.close()  # a crashed or finished mode
    t.join(timeout=10)
    assert done == [1]
    a.close()
    server.close()


def test_a_child_that_never_connects_holds_no_one_back_past_the_wait(tmp_path):
    server = TurnServer(str(tmp_path / "t.sock"), 2, wait_s=0.3)
    a = Turns(str(tmp_path / "t.sock"), "a", ["miss"])
    start = time.monotonic()
    with a.turn():
        pass
    assert 0.2 < time.monotonic() - start < 5
    a.close()
    server.close()


def test_without_a_server_turns_are_free():
    turns = Turns("", "solo", ["miss"])
    turns.phase("miss")
    with turns.turn():
        pass
    turns.close()
