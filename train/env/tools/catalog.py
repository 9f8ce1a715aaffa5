"""A price catalog: the number a task needs but the model cannot know, so it must look it up first.

Stateless and deterministic: the price of an item is a function of its name (a hash), the same in every
process, so a data generator computes the gold answer with the same function (data_prep/tool_math.py's
chained task: look up a price, then multiply it with the calculator: two calls in sequence).
"""

from __future__ import annotations

import hashlib

from train.env.base import ToolError

ITEMS = (
    "blue widget", "red gear", "steel bolt", "brass hinge", "glass bead", "oak plank", "copper coil",
    "paper fan", "clay pot", "wool scarf", "silk ribbon", "tin cup",
)  # fmt: skip


def price_of(item: str) -> int:
    """The catalog's price of `item` in cents (101..999)."""
    digest = hashlib.sha256(item.strip().lower().encode()).digest()
    return 101 + int.from_bytes(digest[:4], "big") % 899


class Catalog:
    name = "catalog"

    def schema(self) -> dict:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": "Look up the price of an item in cents.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "item": {"type": "string", "description": "the item's name, e.g. blue widget"}
                    },
                    "required": ["item"],
                },
            },
        }

    def __call__(self, item: str = "") -> str:
        if not isinstance(item, str) or item.strip().lower() not in ITEMS:
            raise ToolError(f"no item {item!r} in the catalog (items: {', '.join(ITEMS)})")
        return str(price_of(item))
