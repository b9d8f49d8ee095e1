from emitter import Emitter


def test_handlers_run_in_registration_order():
    em = Emitter()
    seen = []
    em.on("save", lambda doc: seen.append(("a", doc)))
    em.on("save", lambda doc: seen.append(("b", doc)))
    assert em.emit("save", "x") == 2
    assert seen == [("a", "x"), ("b", "x")]


def test_once_handler_runs_once():
    em = Emitter()
    seen = []
    em.once("ready", lambda: seen.append(1))
    em.emit("ready")
    em.emit("ready")
    assert seen == [1]
    assert em.listeners("ready") == []


def test_off_specific_and_all():
    em = Emitter()

    def a():
        pass

    def b():
        pass

    em.on("e", a)
    em.on("e", b)
    em.on("e", a)
    assert em.off("e", a) == 2
    assert em.listeners("e") == [b]
    assert em.off("e") == 1
    assert em.emit("e") == 0


def test_emit_unknown_event():
    assert Emitter().emit("nothing") == 0


def test_kwargs_are_forwarded():
    em = Emitter()
    got = {}
    em.on("cfg", lambda **kw: got.update(kw))
    em.emit("cfg", debug=True)
    assert got == {"debug": True}
