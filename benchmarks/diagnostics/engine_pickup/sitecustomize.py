"""Engine-core side timing hooks (only when FRONTPROF_OUT is set). Profiling only."""
import os
_OUT = os.environ.get("FRONTPROF_OUT")
if _OUT:
    import sys, time, json, collections, threading

    def _install():
        try:
            from vllm.v1.engine import core as _core
            from vllm.v1.core.sched import scheduler as _sched
        except Exception as e:  # noqa
            return
        pc = time.perf_counter
        pre = {}
        steps = collections.deque(maxlen=64)
        fh = open(f"{_OUT}.{os.getpid()}", "a", buffering=1)

        orig_pre = _core.EngineCore.preprocess_add_request
        def preprocess_add_request(self, request):
            t0 = pc(); r = orig_pre(self, request); t1 = pc()
            pre[request.request_id] = (t0, t1)
            return r
        _core.EngineCore.preprocess_add_request = preprocess_add_request

        orig_step = _core.EngineCoreProc._process_engine_step
        def _process_engine_step(self):
            t0 = pc(); r = orig_step(self); t1 = pc()
            steps.append((t0, t1, bool(r)))
            if not r:
                try:
                    cs = self.scheduler.connector.connector_scheduler
                    m = cs.manager
                    inner = getattr(m, "_inner", m)
                    tiers = getattr(inner, "secondary_tiers", [])
                    fh.write(json.dumps({"idle_step": t1, "conn_jobs": len(cs._jobs),
                        "mgr_jobs": len(getattr(inner, "_jobs", {})),
                        "tier_pending": [t.has_pending_work() for t in tiers],
                        "unfinished": self.scheduler.has_unfinished_requests(),
                        "finished": self.scheduler.has_finished_requests()}) + "\n")
                except Exception as e:
                    fh.write(json.dumps({"err": repr(e)}) + "\n")
            return r
        _core.EngineCoreProc._process_engine_step = _process_engine_step

        orig_handle = _core.EngineCoreProc._handle_client_request
        def _handle_client_request(self, request_type, request):
            if request_type == _core.EngineCoreRequestType.ADD:
                req = request[0] if isinstance(request, tuple) else request
                rid = getattr(req, "request_id", None)
                t_pick = pc()
                r = orig_handle(self, request_type, request)
                t_done = pc()
                p0, p1 = pre.pop(rid, (0.0, 0.0))
                ov = [(a, b, m) for a, b, m in steps if b > p1 and a < t_pick]
                conn = self.scheduler.connector
                rec = {"rid": rid, "pre0": p0, "pre1": p1, "pick": t_pick, "done": t_done,
                       "steps_between": len(ov), "model_steps_between": sum(m for _, _, m in ov),
                       "has_connector": conn is not None}
                fh.write(json.dumps(rec) + "\n")
                return r
            return orig_handle(self, request_type, request)
        _core.EngineCoreProc._handle_client_request = _handle_client_request

        orig_add = _sched.Scheduler.add_request
        def add_request(self, request):
            conn = self.connector
            if conn is not None and not getattr(conn, "_fp_wrapped", False):
                o = conn.on_new_request
                def on_new_request(req, _o=o):
                    t0 = pc(); _o(req)
                    fh.write(json.dumps({"rid": req.request_id, "on_new_us": (pc() - t0) * 1e6}) + "\n")
                conn.on_new_request = on_new_request
                conn._fp_wrapped = True
            return orig_add(self, request)
        _sched.Scheduler.add_request = add_request

    # install only in the engine-core process: it is started by multiprocessing spawn
    # with vllm already importable; defer until vllm.v1.engine.core is imported.
    import importlib.abc, importlib.machinery
    class _Finder(importlib.abc.MetaPathFinder):
        done = False
        def find_spec(self, name, path, target=None):
            if name == "vllm.v1.engine.core" and not _Finder.done:
                _Finder.done = True
                threading.Timer(0, lambda: None)  # noop
                sys.meta_path.remove(self)
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is None: return None
                loader = spec.loader
                orig_exec = loader.exec_module
                def exec_module(module):
                    orig_exec(module)
                    try:
                        # scheduler import after core is loaded
                        _install()
                    except Exception as e:
                        print("frontprof hook failed", e, file=sys.stderr)
                loader.exec_module = exec_module
                return spec
            return None
    sys.meta_path.insert(0, _Finder())
