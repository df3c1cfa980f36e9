"""`SqlLedger`, the stores of `store/sql/` composed into one `Ledger`: every method of the
interface is there, as its store's own, taking what the interface says it takes."""

from __future__ import annotations

import inspect

from agent_rewind.store.ledger import Ledger


def _interface() -> dict[str, inspect.Signature]:
    methods = {}
    for part in Ledger.__mro__:
        for name, member in vars(part).items():
            if not name.startswith("_") and inspect.isfunction(member):
                methods.setdefault(name, inspect.signature(member))
    return methods


def _parameters(signature: inspect.Signature) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values() if p.name != "self"]


def test_the_interface_is_what_the_ledger_is_made_of() -> None:
    assert len(_interface()) > 50, "the protocols' methods are found"


async def test_every_method_of_the_interface_is_a_store_s_bound_method_with_its_parameters(
    ledger: Ledger,
) -> None:
    for name, signature in _interface().items():
        method = getattr(ledger, name)
        assert inspect.ismethod(method), name
        assert _parameters(inspect.signature(method)) == _parameters(signature), name
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(getattr(Ledger, name)), name
