"""An item of a pass as the message its client gets (docs/relay-protocol.md): a batch's header and the bytes of its
parts (inline, or its arrays in a payload file), an error's texts, an end."""

from __future__ import annotations

import logging
from typing import Any

from ferry.common.errors import RelayError
from ferry.consumer.relay.events import Item, SendItem
from ferry.consumer.relay.framing import encode, text_parts
from ferry.consumer.relay.leaves import ClientFormat, Leaf, inline_bytes, leaves_of
from ferry.consumer.relay.loading import report
from ferry.consumer.relay.payload import PayloadFiles

__all__ = ["item_message"]

log = logging.getLogger("ferry.relay")


def item_message(action: SendItem, payload: PayloadFiles | None) -> list[Any]:
    """The pieces of an item's message: its header, then the bytes of the parts on the stream. A batch a leaf of which
    cannot travel becomes an error item in its place (the client learns why)."""
    item: Item = action.item
    fields: dict[str, Any] = {"pass": item.pass_no, "item": item.number, "epoch": item.epoch}
    if item.kind == "end":
        return [encode("end", fields)]
    if item.kind == "batch":
        try:
            return _batch(action, fields, payload)
        except RelayError as exc:
            item = Item(item.pass_no, item.number, "error", item.epoch, item.index, item.state,
                        error=report(exc, consumed=True))
    error = item.error
    assert error is not None
    parts, data = text_parts({"message": error.message, "traceback": error.traceback})
    fields.update({"index": item.index, "class": error.cls, "classes": ",".join(error.classes),
                   "consumed": int(error.consumed)})
    return [encode("error", fields, parts), *data]


def _batch(action: SendItem, fields: dict[str, Any], payload: PayloadFiles | None) -> list[Any]:
    item = action.item
    leaves = leaves_of(item.tree, ClientFormat(action.order, action.dtypes))
    fields.update({"index": item.index, "order": action.order})
    on_stream: list[Leaf] = leaves
    arrays = [leaf for leaf in leaves if leaf.part.kind == "array"]
    if action.payload == "file" and payload is not None and arrays and item.slot >= 0:
        try:
            fields["file"] = payload.write(item.slot, arrays, action.order)
            on_stream = [leaf for leaf in leaves if leaf.part.kind != "array"]
        except OSError as exc:  # no room in the payload folder: this batch goes over the socket
            log.warning("ferry relay: cannot write batch %d into %s (%s): it goes inline", item.index, payload.folder,
                        exc)
    pieces: list[Any] = [encode("batch", fields, [leaf.part for leaf in leaves])]
    for leaf in on_stream:
        if leaf.part.kind == "array":
            pieces.append(inline_bytes(leaf, action.order))
        elif leaf.part.kind in ("text", "raw"):
            pieces.append(leaf.value)
    return pieces
