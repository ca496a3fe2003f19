"""The typed application context (daemon/context.py): its protocols say what the API needs of the store and of the
worker pool, so each must match the one implementation, method by method, signature by signature."""
from __future__ import annotations

import inspect

import pytest

from evenflow.daemon.api.http.workers import WorkerPool
from evenflow.daemon.api.models.store_adapter import StoreAdapter
from evenflow.daemon.settings import load_settings
from evenflow.daemon.context import AppContext, Store, Workers, context
from evenflow.daemon.server import create_app


def _members(protocol: type) -> list[str]:
    return [n for n, v in vars(protocol).items() if not n.startswith("_") and inspect.isfunction(v)]


@pytest.mark.parametrize("protocol, impl", [(Store, StoreAdapter), (Workers, WorkerPool)],
                         ids=["store", "workers"])
def test_each_protocol_matches_its_implementation(protocol, impl):
    names = _members(protocol)
    assert names, protocol  # a protocol with no methods would pass anything
    for name in names:
        want, have = getattr(protocol, name), getattr(impl, name, None)
        assert have is not None, f"{impl.__name__} lacks {name}"
        assert list(inspect.signature(want).parameters) == list(inspect.signature(have).parameters), name
        assert inspect.iscoroutinefunction(want) == inspect.iscoroutinefunction(have), name


def test_the_app_carries_a_typed_context(tmp_path):
    """create_app builds an AppContext whose store and workers are the real implementations."""
    app = create_app(load_settings({}, {"host": "127.0.0.1:0", "models": str(tmp_path / "models"), "no_demo": True}))

    class Conn:  # what context() reads of a request: its app
        pass

    conn = Conn()
    conn.app = app
    ctx = context(conn)  # type: ignore[arg-type]
    assert isinstance(ctx, AppContext) and isinstance(ctx.store, StoreAdapter) and isinstance(ctx.workers, WorkerPool)
    assert ctx.remote is None  # remote models' hub is made on first use
    ctx.workers.shutdown()
