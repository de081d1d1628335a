import subprocess
import sys
import time

from vlmcache_lab.proc_stats import (
    busiest,
    engine_core_cpu,
    minor_faults,
    session_cpu_s,
    thread_cpu_s,
)


def _spin(seconds: float) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass


def test_session_cpu_counts_this_process():
    before = session_cpu_s()
    _spin(0.3)
    assert session_cpu_s() - before >= 0.2


def test_the_busiest_thread_is_the_one_that_spun():
    import threading

    spun, done, tid = threading.Event(), threading.Event(), []

    def spinner() -> None:
        tid.append(threading.get_native_id())
        _spin(0.3)
        spun.set()
        done.wait()  # alive (in /proc) when the second snapshot is taken

    before = thread_cpu_s()
    t = threading.Thread(target=spinner, name="spinner")
    t.start()
    spun.wait()
    top = busiest(before, thread_cpu_s(), top=10_000)
    done.set()
    t.join()
    import os

    # other processes of the session (engines of earlier tests) may have been busier
    mine = [(k, v) for k, v in top if f":{os.getpid()}/" in k]
    assert mine and mine[0][0].endswith(f"/{tid[0]}") and mine[0][1] >= 0.2
    assert not any(k.startswith("kworker") for k, _ in top)  # kernel threads are not ours


def test_the_engine_core_childs_core_is_found_by_its_name():
    from vlmcache_lab.proc_stats import _session_procs

    # the test session's own engines (session-scoped fixtures of tests/vllm) may still run
    if not any(name.startswith("VLLM::EngineCor") for _, name, _ in _session_procs()):
        assert engine_core_cpu() is None  # no engine here
    # a child named like vLLM's EngineCore process (vLLM sets it with prctl)
    child = subprocess.Popen([sys.executable, "-c",
                              "import ctypes, time; ctypes.CDLL(None).prctl("
                              "15, b'VLLM::EngineCore', 0, 0, 0); print('named', flush=True);"
                              " time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "named"
        import os

        assert engine_core_cpu() in range(os.cpu_count() or 1)
    finally:
        child.kill()
        child.wait()


def test_touching_fresh_memory_counts_minor_faults_of_this_process():
    import mmap
    import os

    before = minor_faults()
    region = mmap.mmap(-1, 64 * mmap.PAGESIZE)
    for page in range(64):
        region[page * mmap.PAGESIZE] = 1
    region.close()
    me = [(k, v) for k, v in busiest(before, minor_faults()) if k.endswith(f":{os.getpid()}")]
    assert me and me[0][1] >= 64
