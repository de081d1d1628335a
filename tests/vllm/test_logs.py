import logging

from vlmcache.vllm.logs import LOGGER, attach_to_vllm_logging, vllm_logging_config


def test_logging_config_adds_vlmcache_on_vllms_handler():
    cfg = vllm_logging_config()
    assert cfg["loggers"][LOGGER]["handlers"] == cfg["loggers"]["vllm"]["handlers"]
    assert cfg["loggers"][LOGGER]["level"] == "INFO"
    assert set(cfg["loggers"][LOGGER]["handlers"]) <= set(cfg["handlers"])


def _isolated(test):
    """Run ``test(vllm_logger, ours)`` with the vlmcache and root loggers' state restored
    afterwards (other tests read vlmcache's records through the root logger: caplog)."""
    vllm_logger, ours, root = (logging.getLogger("vllm"), logging.getLogger(LOGGER),
                               logging.getLogger())
    saved = (list(ours.handlers), ours.level, ours.propagate, list(root.handlers))
    for h in saved[0]:
        ours.removeHandler(h)
    handler = logging.StreamHandler()
    vllm_logger.addHandler(handler)
    try:
        test(vllm_logger, ours, handler)
    finally:
        for h in list(ours.handlers):
            ours.removeHandler(h)
        for h in saved[0]:
            ours.addHandler(h)
        ours.setLevel(saved[1])
        ours.propagate = saved[2]
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[3]:
            root.addHandler(h)
        vllm_logger.removeHandler(handler)


def test_attach_copies_vllms_handlers_once_and_stops_propagation():
    def check(vllm_logger, ours, handler):
        root = logging.getLogger()
        for h in list(root.handlers):  # a vLLM process: nothing on the root logger
            root.removeHandler(h)
        attach_to_vllm_logging()
        attach_to_vllm_logging()
        assert ours.handlers == vllm_logger.handlers and handler in ours.handlers
        assert ours.level == logging.INFO
        # a root handler added later (a library's basicConfig) must not print them again
        assert not ours.propagate

    _isolated(check)


def test_attach_leaves_configured_logging_alone():
    def check(vllm_logger, ours, handler):
        root = logging.getLogger()
        root.addHandler(logging.NullHandler())  # an application configured logging
        attach_to_vllm_logging()
        assert not ours.handlers and ours.propagate

    _isolated(check)
